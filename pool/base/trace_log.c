/*
 * trace_log.c — writes the pool's allocation log as RMM CSV (see trace_log.h for the format).
 *
 * Lines are formatted by hand into a 64 KiB buffer under the log's mutex and written with fwrite when
 * the buffer is nearly full and at close, so that a logged allocation costs a few tens of nanoseconds
 * more than an unlogged one rather than a stdio call per field.
 */
#define _POSIX_C_SOURCE 200809L
#include "base/trace_log.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/error.h"

#define GP_TRACE_LOG_BUFFER (64u * 1024u)
#define GP_TRACE_LOG_LINE_MAX 128u /* longest line: 4 numbers of at most 20 digits + action + commas */
#define GP_TRACE_LOG_PATH_MAX 1024u

struct gp_trace_log {
    pthread_mutex_t lock;
    FILE *file;
    uint64_t start_ns;    /* CLOCK_MONOTONIC at open */
    size_t used;          /* bytes in buffer */
    int write_errno;      /* first write error, 0 if none */
    char path[GP_TRACE_LOG_PATH_MAX];
    char buffer[GP_TRACE_LOG_BUFFER];
};

/* Thread ids: 1 + the order in which threads first logged (0 in the TLS slot means unassigned). */
static atomic_uint next_thread_id;
static _Thread_local unsigned thread_id_plus_one;

static unsigned current_thread_id(void)
{
    if (thread_id_plus_one == 0)
        thread_id_plus_one = atomic_fetch_add_explicit(&next_thread_id, 1u, memory_order_relaxed) + 1u;
    return thread_id_plus_one - 1u;
}

static uint64_t monotonic_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Appends v in decimal; returns the new end. */
static char *put_dec(char *p, uint64_t v)
{
    char tmp[20];
    int n = 0;
    do {
        tmp[n++] = (char)('0' + v % 10u);
        v /= 10u;
    } while (v != 0);
    while (n > 0)
        *p++ = tmp[--n];
    return p;
}

/* Appends v as 0x-prefixed lowercase hex; returns the new end. */
static char *put_hex(char *p, uint64_t v)
{
    static const char digits[] = "0123456789abcdef";
    char tmp[16];
    int n = 0;
    do {
        tmp[n++] = digits[v & 15u];
        v >>= 4;
    } while (v != 0);
    *p++ = '0';
    *p++ = 'x';
    while (n > 0)
        *p++ = tmp[--n];
    return p;
}

static char *put_str(char *p, const char *s)
{
    size_t n = strlen(s);
    memcpy(p, s, n);
    return p + n;
}

/* pre: lock held (or the log not yet shared). */
static void flush_locked(gp_trace_log *log)
{
    if (log->used == 0)
        return;
    if (log->write_errno == 0 && fwrite(log->buffer, 1, log->used, log->file) != log->used)
        log->write_errno = errno != 0 ? errno : EIO;
    log->used = 0;
}

int gp_trace_log_open(gp_trace_log **out, const char *path)
{
    if (out == NULL || path == NULL || path[0] == '\0')
        return gp_error_set(GP_ERR_INVALID, "trace log: no path given");
    *out = NULL;
    if (strlen(path) >= GP_TRACE_LOG_PATH_MAX)
        return gp_error_set(GP_ERR_CONFIG, "log: path of %zu characters is too long (at most %u)",
                            strlen(path), GP_TRACE_LOG_PATH_MAX - 1u);
    gp_trace_log *log = malloc(sizeof *log);
    if (log == NULL)
        return gp_error_set(GP_ERR_CONFIG, "log: %s: no host memory for the log buffer", path);
    FILE *file = fopen(path, "w");
    if (file == NULL) {
        int err = errno;
        free(log);
        return gp_error_set(GP_ERR_CONFIG, "log: cannot open %s for writing: %s", path, strerror(err));
    }
    if (pthread_mutex_init(&log->lock, NULL) != 0) {
        fclose(file);
        free(log);
        return gp_error_set(GP_ERR_CONFIG, "log: %s: cannot create its mutex", path);
    }
    log->file = file;
    log->used = 0;
    log->write_errno = 0;
    memcpy(log->path, path, strlen(path) + 1);
    static const char header[] = "Thread,Time,Action,Pointer,Size,Stream\n";
    memcpy(log->buffer, header, sizeof header - 1);
    log->used = sizeof header - 1;
    flush_locked(log); /* so that an empty run still leaves a valid trace, and write errors show now */
    if (log->write_errno != 0 || fflush(file) != 0) {
        int err = log->write_errno != 0 ? log->write_errno : errno;
        pthread_mutex_destroy(&log->lock);
        fclose(file);
        free(log);
        return gp_error_set(GP_ERR_CONFIG, "log: cannot write to %s: %s", path, strerror(err));
    }
    log->start_ns = monotonic_ns();
    *out = log;
    return GP_OK;
}

void gp_trace_log_event(gp_trace_log *log, enum gp_trace_action action, uintptr_t ptr, size_t size,
                        gp_stream stream)
{
    if (log == NULL)
        return;
    const char *name = action == GP_TRACE_ALLOCATE  ? "allocate"
                       : action == GP_TRACE_FREE    ? "free"
                                                    : "allocate failure";
    unsigned thread = current_thread_id();
    char line[GP_TRACE_LOG_LINE_MAX];
    char *p = line;
    p = put_dec(p, thread);
    *p++ = ',';
    char *time_at = p; /* the time is taken under the lock so that lines are in time order */
    pthread_mutex_lock(&log->lock);
    uint64_t now = monotonic_ns();
    uint64_t us = now > log->start_ns ? (now - log->start_ns) / 1000u : 0;
    p = put_dec(time_at, us);
    *p++ = ',';
    p = put_str(p, name);
    *p++ = ',';
    p = put_hex(p, (uint64_t)ptr);
    *p++ = ',';
    p = put_dec(p, (uint64_t)size);
    *p++ = ',';
    p = put_hex(p, (uint64_t)(uintptr_t)stream);
    *p++ = '\n';
    size_t n = (size_t)(p - line);
    if (log->used + n > sizeof log->buffer)
        flush_locked(log);
    memcpy(log->buffer + log->used, line, n);
    log->used += n;
    pthread_mutex_unlock(&log->lock);
}

void gp_trace_log_close(gp_trace_log *log)
{
    if (log == NULL)
        return;
    pthread_mutex_lock(&log->lock);
    flush_locked(log);
    pthread_mutex_unlock(&log->lock);
    if (fclose(log->file) != 0 && log->write_errno == 0)
        log->write_errno = errno != 0 ? errno : EIO;
    if (log->write_errno != 0)
        fprintf(stderr, "gpupool: allocation log %s is incomplete: write failed: %s\n", log->path,
                strerror(log->write_errno));
    pthread_mutex_destroy(&log->lock);
    free(log);
}
