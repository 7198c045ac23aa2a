/*
 * trace_log.h — the allocation log the pool writes when configured with log:PATH.
 *
 * The log is RMM's allocation-log CSV, the format `gpupool replay` reads back:
 *
 *     Thread,Time,Action,Pointer,Size,Stream
 *     0,1234,allocate,0x7f0000000000,4096,0x0
 *
 * Thread is a small per-thread id (0, 1, 2, ... in the order threads first log), Time is plain
 * microseconds since gp_trace_log_open (CLOCK_MONOTONIC), Action is `allocate`, `free` or
 * `allocate failure`, Pointer and Stream are hex, Size is the size the caller asked for.
 * A run on a real GPU therefore yields a trace that replays on the simulated one.
 */
#ifndef GP_TRACE_LOG_H
#define GP_TRACE_LOG_H

#include <stddef.h>
#include <stdint.h>

#include "gpupool.h"

typedef struct gp_trace_log gp_trace_log;

enum gp_trace_action { GP_TRACE_ALLOCATE, GP_TRACE_FREE, GP_TRACE_ALLOCATE_FAILURE };

/* Creates (truncates) the file at `path` and writes the header line.
 * GP_OK, or GP_ERR_CONFIG with a message naming the path and strerror(errno); GP_ERR_INVALID for
 * NULL arguments. */
int gp_trace_log_open(gp_trace_log **out, const char *path);

/* Appends one line. Thread-safe (one mutex per log); buffered in memory, written in large pieces.
 * A write error is remembered and reported on stderr once, at close; logging never fails a call. */
void gp_trace_log_event(gp_trace_log *log, enum gp_trace_action action, uintptr_t ptr, size_t size,
                        gp_stream stream);

/* Flushes the buffer, closes the file and frees the log. NULL is a no-op. */
void gp_trace_log_close(gp_trace_log *log);

#endif /* GP_TRACE_LOG_H */
