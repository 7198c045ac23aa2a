/*
 * trace.h — reading an allocation trace (RMM's allocation-log CSV) into memory.
 *
 * Format, one header line then one event per line:
 *
 *     Thread,Time,Action,Pointer,Size,Stream
 *     0,00:01:02:000123,allocate,0x7f0000000000,4096,0x0
 *     0,62000123,free,0x7f0000000000,4096,0x0
 *
 * Thread: decimal (or 0x hex); Time: RMM's HH:MM:SS:microseconds (also HH:MM:SS.microseconds) or
 * plain microseconds; Action: `allocate`, `free` or `allocate failure`; Pointer and Stream: hex, with
 * or without 0x; Size: decimal bytes. Blank lines are skipped, CRLF line ends accepted.
 *
 * The whole file is parsed up front so that a replay times the pool, not the parser. Pointers are
 * resolved while parsing: every allocation gets a slot (its index among the trace's allocations) and
 * every free names the slot of the allocation it frees, so a replay keeps pool pointers in a plain
 * array. A malformed line stops the read with "FILE:LINE: what is wrong"; a free of a pointer that is
 * not live in the trace (never allocated, or already freed) is counted, not fatal, and not replayed.
 */
#ifndef GP_CLI_TRACE_H
#define GP_CLI_TRACE_H

#include <stddef.h>
#include <stdint.h>

enum gp_trace_kind {
    GP_EV_ALLOC = 0,        /* `allocate` */
    GP_EV_FREE = 1,         /* `free` of a live allocation */
    GP_EV_ALLOC_FAILURE = 2 /* `allocate failure`: the traced program's allocation failed */
};

#define GP_TRACE_NO_SLOT UINT32_MAX
#define GP_TRACE_MAX_STREAMS 4096u /* distinct Stream values one trace may use */
#define GP_TRACE_MAX_THREADS 1024u

typedef struct gp_trace_event {
    uint64_t ptr;     /* the pointer as traced */
    uint64_t size;    /* allocate: bytes requested; free: the bytes of the allocation it frees */
    uint64_t time_us; /* microseconds, as traced */
    uint32_t slot;    /* allocate/free: slot of the allocation; GP_TRACE_NO_SLOT otherwise */
    uint16_t stream;  /* index into gp_trace.streams */
    uint8_t kind;     /* enum gp_trace_kind */
    uint8_t reserved;
} gp_trace_event;

typedef struct gp_trace {
    char *path;
    gp_trace_event *events;
    size_t num_events;         /* replayable events: allocates, frees of live pointers, failures */
    size_t num_allocs;         /* == number of slots */
    size_t num_frees;          /* frees of live allocations */
    size_t num_alloc_failures; /* `allocate failure` lines */
    size_t num_lines;          /* lines read, header included */

    uint64_t *streams;         /* distinct Stream values, in order of first appearance */
    size_t num_streams;
    uint16_t *slot_stream;     /* per slot: the stream index of its allocation */
    uint64_t *slot_size;       /* per slot: its requested size */

    size_t unknown_frees;      /* frees of a pointer that was not live in the trace */
    size_t first_unknown_free_line;
    size_t double_allocs;      /* allocates of a pointer already live (the older one stays live) */
    size_t first_double_alloc_line;
    size_t size_mismatches;    /* frees whose Size differs from the allocation's */
    size_t num_threads;        /* distinct Thread values (counted up to GP_TRACE_MAX_THREADS) */
    uint64_t peak_live_bytes;  /* largest sum of requested sizes live at once, as traced */
    uint64_t end_live_bytes;   /* requested bytes still live after the last event */
} gp_trace;

/* Reads the trace at `path` into *trace: a CSV, gzip-compressed or not (told by its content, not its
 * name), or standard input for "-" (named "<stdin>" in messages). Returns 0, or -1 with a message in
 * err ("PATH:LINE: ..." for a malformed line, "PATH: ..." for I/O or a damaged gzip stream). *trace is
 * valid only on success. */
int gp_trace_read(gp_trace *trace, const char *path, char *err, size_t errlen);

/* Parses a trace already in memory; `name` is used in messages. Same contract as gp_trace_read. */
int gp_trace_parse(gp_trace *trace, const char *name, const char *text, size_t len, char *err,
                   size_t errlen);

void gp_trace_free(gp_trace *trace);

#endif /* GP_CLI_TRACE_H */
