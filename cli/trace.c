/*
 * trace.c — the RMM allocation-log CSV reader (format in trace.h).
 *
 * One pass over the file in memory: each line is split at commas by hand (no sscanf), numbers are
 * parsed with overflow checks, and live trace pointers are kept in an open-addressing hash table
 * (linear probing, backward-shift deletion) from pointer to allocation slot. Invariant after every
 * line: the table holds exactly the pointers allocated and not yet freed, and
 *     live bytes == sum of slot_size over the slots in the table.
 */
#define _POSIX_C_SOURCE 200809L
#include "trace.h"

#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

static const char header_text[] = "Thread,Time,Action,Pointer,Size,Stream";

/* ---- messages --------------------------------------------------------------------------------- */

static int fail(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static int fail(char *err, size_t errlen, const char *fmt, ...)
{
    if (err != NULL && errlen > 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return -1;
}

/* A field as a printable, bounded string for messages. */
static const char *field_text(const char *s, size_t n, char *buf, size_t buflen)
{
    size_t max = buflen - 4;
    size_t k = 0;
    for (size_t i = 0; i < n && k < max; i++)
        buf[k++] = (s[i] >= 32 && s[i] < 127) ? s[i] : '?';
    if (n > max) {
        buf[k++] = '.';
        buf[k++] = '.';
        buf[k++] = '.';
    }
    buf[k] = '\0';
    return buf;
}

/* ---- numbers ---------------------------------------------------------------------------------- */

/* Parses all of [s, s+n) as decimal into *out; false on an empty field, a non-digit or overflow. */
static bool parse_dec(const char *s, size_t n, uint64_t *out)
{
    if (n == 0)
        return false;
    uint64_t v = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned d = (unsigned)(unsigned char)s[i] - '0';
        if (d > 9)
            return false;
        if (v > (UINT64_MAX - d) / 10u)
            return false;
        v = v * 10u + d;
    }
    *out = v;
    return true;
}

static int hex_digit(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/* Parses [s, s+n) as hex with an optional 0x/0X prefix; "(nil)" (glibc's %p of NULL) is 0. */
static bool parse_hex(const char *s, size_t n, uint64_t *out)
{
    if (n == 5 && memcmp(s, "(nil)", 5) == 0) {
        *out = 0;
        return true;
    }
    if (n >= 2 && s[0] == '0' && (s[1] == 'x' || s[1] == 'X')) {
        s += 2;
        n -= 2;
    }
    if (n == 0 || n > 16)
        return false;
    uint64_t v = 0;
    for (size_t i = 0; i < n; i++) {
        int d = hex_digit(s[i]);
        if (d < 0)
            return false;
        v = (v << 4) | (uint64_t)d;
    }
    *out = v;
    return true;
}

/* Thread: decimal, or hex with 0x. */
static bool parse_thread(const char *s, size_t n, uint64_t *out)
{
    if (n >= 2 && s[0] == '0' && (s[1] == 'x' || s[1] == 'X'))
        return parse_hex(s, n, out);
    return parse_dec(s, n, out);
}

/* Fraction digits [s, s+n) as microseconds (".5" is 500000; digits past the sixth are dropped). */
static bool parse_fraction_us(const char *s, size_t n, uint64_t *out)
{
    if (n == 0)
        return false;
    uint64_t v = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned d = (unsigned)(unsigned char)s[i] - '0';
        if (d > 9)
            return false;
        if (i < 6)
            v = v * 10u + d;
    }
    for (size_t i = n; i < 6; i++)
        v *= 10u;
    *out = v;
    return true;
}

/* Time: HH:MM:SS:micro, HH:MM:SS.micro, or plain microseconds (optionally with a fraction, dropped). */
static bool parse_time(const char *s, size_t n, uint64_t *out)
{
    const char *colon = memchr(s, ':', n);
    if (colon == NULL) {
        const char *dot = memchr(s, '.', n);
        uint64_t us, frac;
        if (dot == NULL)
            return parse_dec(s, n, out);
        if (!parse_dec(s, (size_t)(dot - s), &us) ||
            !parse_fraction_us(dot + 1, n - (size_t)(dot - s) - 1, &frac))
            return false;
        *out = us;
        return true;
    }
    /* HH:MM:SS then ':' or '.' then the microseconds */
    const char *end = s + n;
    const char *p = s;
    uint64_t part[3];
    for (int k = 0; k < 3; k++) {
        const char *q = p;
        while (q < end && *q >= '0' && *q <= '9')
            q++;
        if (q == p || !parse_dec(p, (size_t)(q - p), &part[k]))
            return false;
        if (k < 2) {
            if (q == end || *q != ':')
                return false;
            p = q + 1;
        } else {
            p = q;
        }
    }
    if (part[1] > 59 || part[2] > 60 || part[0] > UINT64_MAX / 3600000000u - 1)
        return false;
    uint64_t us = ((part[0] * 60u + part[1]) * 60u + part[2]) * 1000000u;
    if (p < end) {
        uint64_t frac;
        if ((*p != ':' && *p != '.') || !parse_fraction_us(p + 1, (size_t)(end - p - 1), &frac))
            return false;
        us += frac;
    }
    *out = us;
    return true;
}

/* ---- the pointer table ------------------------------------------------------------------------ */

typedef struct ptr_table {
    uint64_t *keys; /* 0 = empty (pointer 0 is never entered) */
    uint32_t *slots;
    size_t mask;    /* capacity - 1, capacity a power of two */
    size_t count;
} ptr_table;

static size_t ptr_hash(uint64_t key, size_t mask)
{
    key ^= key >> 29;
    key *= 0x9E3779B97F4A7C15ull;
    return (size_t)(key >> 32) & mask;
}

static bool table_init(ptr_table *t, size_t capacity)
{
    t->keys = calloc(capacity, sizeof *t->keys);
    t->slots = malloc(capacity * sizeof *t->slots);
    t->mask = capacity - 1;
    t->count = 0;
    return t->keys != NULL && t->slots != NULL;
}

static void table_destroy(ptr_table *t)
{
    free(t->keys);
    free(t->slots);
}

/* Index of key, or of the empty cell where it would go. */
static size_t table_find(const ptr_table *t, uint64_t key)
{
    size_t i = ptr_hash(key, t->mask);
    while (t->keys[i] != 0 && t->keys[i] != key)
        i = (i + 1) & t->mask;
    return i;
}

static bool table_grow(ptr_table *t)
{
    ptr_table bigger;
    if (!table_init(&bigger, (t->mask + 1) * 2)) {
        table_destroy(&bigger);
        return false;
    }
    for (size_t i = 0; i <= t->mask; i++) {
        if (t->keys[i] != 0) {
            size_t j = table_find(&bigger, t->keys[i]);
            bigger.keys[j] = t->keys[i];
            bigger.slots[j] = t->slots[i];
        }
    }
    bigger.count = t->count;
    table_destroy(t);
    *t = bigger;
    return true;
}

/* Removes the entry at index i, shifting later entries of the probe run back (no tombstones). */
static void table_remove_at(ptr_table *t, size_t i)
{
    size_t j = i;
    for (;;) {
        j = (j + 1) & t->mask;
        if (t->keys[j] == 0)
            break;
        size_t home = ptr_hash(t->keys[j], t->mask);
        /* move j into the hole at i unless its home lies cyclically in (i, j] */
        bool home_between = (i <= j) ? (i < home && home <= j) : (i < home || home <= j);
        if (!home_between) {
            t->keys[i] = t->keys[j];
            t->slots[i] = t->slots[j];
            i = j;
        }
    }
    t->keys[i] = 0;
    t->count--;
}

/* ---- growing arrays --------------------------------------------------------------------------- */

static bool grow(void **array, size_t *capacity, size_t need, size_t elem)
{
    if (need <= *capacity)
        return true;
    size_t cap = *capacity ? *capacity : 1024;
    while (cap < need)
        cap *= 2;
    void *p = realloc(*array, cap * elem);
    if (p == NULL)
        return false;
    *array = p;
    *capacity = cap;
    return true;
}

/* ---- the parser ------------------------------------------------------------------------------- */

static bool is_space(char c)
{
    return c == ' ' || c == '\t' || c == '\r';
}

/* Trims spaces, tabs and CR at both ends of [*s, *s+*n). */
static void trim(const char **s, size_t *n)
{
    while (*n > 0 && is_space((*s)[0])) {
        (*s)++;
        (*n)--;
    }
    while (*n > 0 && is_space((*s)[*n - 1]))
        (*n)--;
}

static bool header_matches(const char *s, size_t n)
{
    /* compare ignoring spaces, so that "Thread, Time, ..." is accepted too */
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (is_space(s[i]))
            continue;
        if (header_text[k] == '\0' || s[i] != header_text[k])
            return false;
        k++;
    }
    return header_text[k] == '\0';
}

#define FIELD_COUNT 6
static const char *const field_names[FIELD_COUNT] = {"Thread", "Time", "Action", "Pointer", "Size",
                                                     "Stream"};

int gp_trace_parse(gp_trace *trace, const char *name, const char *text, size_t len, char *err,
                   size_t errlen)
{
    memset(trace, 0, sizeof *trace);
    size_t name_len = strlen(name);
    trace->path = malloc(name_len + 1);
    if (trace->path == NULL)
        return fail(err, errlen, "%s: out of host memory", name);
    memcpy(trace->path, name, name_len + 1);

    size_t ev_cap = 0, slot_cap = 0, slot_size_cap = 0, stream_cap = 0;
    ptr_table table;
    if (!table_init(&table, 4096)) {
        table_destroy(&table);
        gp_trace_free(trace);
        return fail(err, errlen, "%s: out of host memory", name);
    }
    uint64_t threads[GP_TRACE_MAX_THREADS];
    size_t last_stream = 0;
    uint64_t last_stream_value = 0;
    bool have_last_stream = false;
    uint64_t last_thread = 0;
    bool have_last_thread = false;
    uint64_t live = 0;
    char shown[64];

    const char *p = text;
    const char *end = text + len;
    size_t line_no = 0;
    bool header_seen = false;
    int rc = 0;
    /* a UTF-8 byte order mark before the header */
    if (len >= 3 && (unsigned char)p[0] == 0xEF && (unsigned char)p[1] == 0xBB && (unsigned char)p[2] == 0xBF)
        p += 3;

    while (p < end) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        const char *line_end = nl ? nl : end;
        const char *line = p;
        size_t line_len = (size_t)(line_end - line);
        p = nl ? nl + 1 : end;
        line_no++;
        trim(&line, &line_len);
        if (line_len == 0)
            continue;
        if (!header_seen) {
            if (!header_matches(line, line_len)) {
                rc = fail(err, errlen, "%s:%zu: expected the header %s, found \"%s\"", name, line_no,
                          header_text, field_text(line, line_len, shown, sizeof shown));
                goto out;
            }
            header_seen = true;
            continue;
        }

        /* split into exactly six fields */
        const char *f[FIELD_COUNT];
        size_t fl[FIELD_COUNT];
        size_t nf = 0;
        const char *q = line;
        const char *line_stop = line + line_len;
        for (;;) {
            const char *comma = memchr(q, ',', (size_t)(line_stop - q));
            const char *fe = comma ? comma : line_stop;
            if (nf == FIELD_COUNT) {
                nf++;
                break;
            }
            f[nf] = q;
            fl[nf] = (size_t)(fe - q);
            trim(&f[nf], &fl[nf]);
            nf++;
            if (comma == NULL)
                break;
            q = comma + 1;
        }
        if (nf != FIELD_COUNT) {
            rc = fail(err, errlen, "%s:%zu: expected 6 comma-separated fields (%s), found %s: \"%s\"",
                      name, line_no, header_text, nf > FIELD_COUNT ? "more" : "fewer",
                      field_text(line, line_len, shown, sizeof shown));
            goto out;
        }

        uint64_t thread, time_us, ptr, size, stream;
        int bad = -1;
        const char *expect = "";
        if (!parse_thread(f[0], fl[0], &thread)) {
            bad = 0;
            expect = "a decimal thread id";
        } else if (!parse_time(f[1], fl[1], &time_us)) {
            bad = 1;
            expect = "HH:MM:SS:microseconds or plain microseconds";
        } else if (!parse_hex(f[3], fl[3], &ptr)) {
            bad = 3;
            expect = "a hex pointer";
        } else if (!parse_dec(f[4], fl[4], &size)) {
            bad = 4;
            expect = "a decimal size in bytes";
        } else if (!parse_hex(f[5], fl[5], &stream)) {
            bad = 5;
            expect = "a hex stream handle";
        }
        int kind = -1;
        if (bad < 0) {
            if (fl[2] == 8 && memcmp(f[2], "allocate", 8) == 0)
                kind = GP_EV_ALLOC;
            else if (fl[2] == 4 && memcmp(f[2], "free", 4) == 0)
                kind = GP_EV_FREE;
            else if (fl[2] == 16 && memcmp(f[2], "allocate failure", 16) == 0)
                kind = GP_EV_ALLOC_FAILURE;
            else {
                bad = 2;
                expect = "allocate, free or allocate failure";
            }
        }
        if (bad >= 0) {
            rc = fail(err, errlen, "%s:%zu: bad %s \"%s\": expected %s", name, line_no, field_names[bad],
                      field_text(f[bad], fl[bad], shown, sizeof shown), expect);
            goto out;
        }

        /* threads (counted only) */
        if (!have_last_thread || thread != last_thread) {
            size_t k = 0;
            size_t known = trace->num_threads < GP_TRACE_MAX_THREADS ? trace->num_threads : GP_TRACE_MAX_THREADS;
            while (k < known && threads[k] != thread)
                k++;
            if (k == known && trace->num_threads < GP_TRACE_MAX_THREADS)
                threads[trace->num_threads++] = thread;
            last_thread = thread;
            have_last_thread = true;
        }

        /* stream index */
        size_t si;
        if (have_last_stream && stream == last_stream_value) {
            si = last_stream;
        } else {
            si = 0;
            while (si < trace->num_streams && trace->streams[si] != stream)
                si++;
            if (si == trace->num_streams) {
                if (trace->num_streams == GP_TRACE_MAX_STREAMS) {
                    rc = fail(err, errlen, "%s:%zu: more than %u distinct streams", name, line_no,
                              GP_TRACE_MAX_STREAMS);
                    goto out;
                }
                if (!grow((void **)&trace->streams, &stream_cap, trace->num_streams + 1, sizeof *trace->streams)) {
                    rc = fail(err, errlen, "%s: out of host memory", name);
                    goto out;
                }
                trace->streams[trace->num_streams++] = stream;
            }
            last_stream = si;
            last_stream_value = stream;
            have_last_stream = true;
        }

        gp_trace_event ev = {.ptr = ptr, .size = size, .time_us = time_us, .slot = GP_TRACE_NO_SLOT,
                             .stream = (uint16_t)si, .kind = (uint8_t)kind, .reserved = 0};
        if (kind == GP_EV_ALLOC) {
            if (trace->num_allocs >= GP_TRACE_NO_SLOT) {
                rc = fail(err, errlen, "%s:%zu: more than %u allocations", name, line_no, GP_TRACE_NO_SLOT - 1u);
                goto out;
            }
            size_t slot = trace->num_allocs;
            if (!grow((void **)&trace->slot_stream, &slot_cap, slot + 1, sizeof *trace->slot_stream) ||
                !grow((void **)&trace->slot_size, &slot_size_cap, slot + 1, sizeof *trace->slot_size)) {
                rc = fail(err, errlen, "%s: out of host memory", name);
                goto out;
            }
            trace->slot_stream[slot] = (uint16_t)si;
            trace->slot_size[slot] = size;
            trace->num_allocs++;
            ev.slot = (uint32_t)slot;
            if (ptr != 0) {
                if ((table.count + 1) * 2 > table.mask + 1 && !table_grow(&table)) {
                    rc = fail(err, errlen, "%s: out of host memory", name);
                    goto out;
                }
                size_t i = table_find(&table, ptr);
                if (table.keys[i] == ptr) {
                    /* allocated again without a free: the older allocation stays live */
                    if (trace->double_allocs++ == 0)
                        trace->first_double_alloc_line = line_no;
                } else {
                    table.keys[i] = ptr;
                    table.count++;
                }
                table.slots[i] = (uint32_t)slot;
            }
            live += size;
            if (live > trace->peak_live_bytes)
                trace->peak_live_bytes = live;
        } else if (kind == GP_EV_FREE) {
            size_t i = ptr != 0 ? table_find(&table, ptr) : 0;
            if (ptr == 0 || table.keys[i] != ptr) {
                if (trace->unknown_frees++ == 0)
                    trace->first_unknown_free_line = line_no;
                continue; /* counted, not replayed */
            }
            uint32_t slot = table.slots[i];
            table_remove_at(&table, i);
            if (size != trace->slot_size[slot])
                trace->size_mismatches++;
            ev.slot = slot;
            ev.size = trace->slot_size[slot];
            live -= ev.size;
            trace->num_frees++;
        } else {
            trace->num_alloc_failures++;
        }

        if (!grow((void **)&trace->events, &ev_cap, trace->num_events + 1, sizeof *trace->events)) {
            rc = fail(err, errlen, "%s: out of host memory", name);
            goto out;
        }
        trace->events[trace->num_events++] = ev;
    }
    trace->num_lines = line_no;
    if (!header_seen) {
        rc = fail(err, errlen, "%s:1: empty trace: expected the header %s", name, header_text);
        goto out;
    }
    trace->end_live_bytes = live;

out:
    table_destroy(&table);
    if (rc != 0)
        gp_trace_free(trace);
    return rc;
}

/* zlib's gzerror text without the "PATH: " it puts in front (messages name the file once). */
static const char *gz_why(gzFile f, int *code)
{
    const char *why = gzerror(f, code);
    const char *sep = strstr(why, ": ");
    return sep != NULL ? sep + 2 : why;
}

/*
 * Reads the whole file through zlib's gz* functions, which inflate a gzip stream and pass anything
 * else through unchanged: a .csv.gz is read as its CSV (whatever its name), a plain CSV as itself.
 * "-" is standard input (named "<stdin>" in messages).
 */
int gp_trace_read(gp_trace *trace, const char *path, char *err, size_t errlen)
{
    memset(trace, 0, sizeof *trace);
    bool is_stdin = strcmp(path, "-") == 0;
    const char *name = is_stdin ? "<stdin>" : path;
    gzFile f = NULL;
    if (is_stdin) {
        int fd = dup(STDIN_FILENO);
        if (fd < 0)
            return fail(err, errlen, "%s: cannot read: %s", name, strerror(errno));
        f = gzdopen(fd, "rb");
        if (f == NULL)
            close(fd);
    } else {
        f = gzopen(path, "rb");
    }
    if (f == NULL)
        return fail(err, errlen, "%s: cannot open: %s", name, errno ? strerror(errno) : "out of host memory");
    char *text = NULL;
    size_t len = 0, cap = 0;
    for (;;) {
        if (!grow((void **)&text, &cap, len + 65536, 1)) {
            gzclose(f);
            free(text);
            return fail(err, errlen, "%s: out of host memory", name);
        }
        size_t want = cap - len > (1u << 30) ? (1u << 30) : cap - len;
        int got = gzread(f, text + len, (unsigned)want);
        if (got < 0) {
            int code = 0;
            const char *why = gz_why(f, &code);
            char msg[256];
            snprintf(msg, sizeof msg, "%s", code == Z_ERRNO ? strerror(errno) : why);
            gzclose(f);
            free(text);
            return fail(err, errlen, "%s: %s: %s", name,
                        code == Z_ERRNO ? "read error" : "not a readable gzip stream", msg);
        }
        /* A trace is text: a NUL byte means binary data (and /dev/zero would be read without end). */
        const char *nul = got > 0 ? memchr(text + len, '\0', (size_t)got) : NULL;
        if (nul != NULL) {
            size_t at = (size_t)(nul - text);
            gzclose(f);
            free(text);
            return fail(err, errlen, "%s: a NUL byte at offset %zu: not a text trace (expected CSV lines)", name, at);
        }
        len += (size_t)got;
        if (got == 0) {
            /* a gzip stream cut short reads as a clean end without Z_BUF_ERROR from gzread */
            int code = 0;
            const char *why = gz_why(f, &code);
            if (code != Z_OK && code != Z_STREAM_END) {
                char msg[256];
                snprintf(msg, sizeof msg, "%s", why);
                gzclose(f);
                free(text);
                return fail(err, errlen, "%s: not a readable gzip stream: %s", name, msg);
            }
            break;
        }
    }
    int closed = gzclose(f);
    if (closed != Z_OK) {
        free(text);
        return fail(err, errlen, "%s: %s", name,
                    closed == Z_BUF_ERROR ? "the gzip stream is cut short (truncated file)" : "read error at close");
    }
    int rc = gp_trace_parse(trace, name, text, len, err, errlen);
    free(text);
    return rc;
}

void gp_trace_free(gp_trace *trace)
{
    if (trace == NULL)
        return;
    free(trace->path);
    free(trace->events);
    free(trace->streams);
    free(trace->slot_stream);
    free(trace->slot_size);
    memset(trace, 0, sizeof *trace);
}
