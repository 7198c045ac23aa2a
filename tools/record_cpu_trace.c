/*
 * record_cpu_trace.c — an LD_PRELOAD interposer that writes a program's tensor allocations as an RMM
 * allocation-log CSV (Thread,Time,Action,Pointer,Size,Stream), the format `gpupool replay` and
 * `gpupool plan` read. Built and run by tools/record_cpu_trace.py; not part of the library.
 *
 * What it records: every posix_memalign with a 64-byte alignment and a non-zero size, and the free of
 * each such pointer. That is c10's CPU allocator (PyTorch's alloc_cpu: posix_memalign(&p, 64, nbytes),
 * released with free), so a model run on a CPU yields the same tensors, in the same order and with the
 * sizes asked, as its CUDA caching allocator would see on a GPU; kernel workspaces differ (oneDNN's
 * here, cuBLAS/cuDNN's there). ../shared/traces/models/ was recorded the same way. Everything is
 * written as one stream (0x0) and one thread (0); Time is microseconds since the interposer loaded.
 *
 * Rules it keeps:
 *   - It never changes what the program gets: the real posix_memalign and free run first/always.
 *   - Only the process that loaded it with GP_TRACE_OUT set records. The variable is removed from the
 *     environment at load, so programs it starts do not truncate the file; a forked child (same image,
 *     e.g. a data loader's worker) records nothing (pthread_atfork).
 *   - A free is written only for a pointer it recorded (the table below), with that allocation's size.
 *   - Its own bookkeeping (the file's buffer, the table) never reaches the log: a thread-local flag
 *     marks the hook's own calls.
 * Rows are buffered (1 MiB, the hook's own buffer and write(2), not stdio, whose buffer a forked child
 * would flush again at its exit) and written as it fills and at exit: a program killed, or ending by
 * _exit, leaves its last buffer's rows out (tools/record_cpu_trace.py then finds frees missing or a
 * row cut, and says so).
 * Live allocations are kept in an open-addressing table (linear probing, deletion by backward shift,
 * so it holds exactly the live ones). Past GP_TRACE_MAX_LIVE of them recording stops, and the exit
 * message says the trace is incomplete; no model comes near (a few hundred thousand at most).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define GP_TRACE_SLOTS (1u << 22) /* a power of two */
#define GP_TRACE_MAX_LIVE (GP_TRACE_SLOTS / 2)

extern void __libc_free(void *ptr); /* glibc's own free: the hook's fallthrough */

typedef struct {
    uintptr_t ptr; /* 0: empty */
    size_t size;
} live_slot;

static int (*real_posix_memalign)(void **, size_t, size_t);
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int out = -1;        /* the trace's file descriptor; -1: not recording (no GP_TRACE_OUT, or done) */
static char buffer[1 << 20]; /* rows not yet written (own buffer, not stdio: a forked child drops it) */
static size_t buffered;
static bool forked;         /* in a child forked from the recording process: record nothing */
static uint64_t start_us;
static live_slot *slots;    /* GP_TRACE_SLOTS of them */
static size_t live_count;
static bool overflowed, write_failed;
static unsigned long long allocations, frees;
static _Thread_local bool in_hook;

static uint64_t now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

static size_t slot_of(uintptr_t ptr)
{
    return (size_t)(((uint64_t)ptr >> 6) * 0x9E3779B97F4A7C15ull >> 32) & (GP_TRACE_SLOTS - 1);
}

/* Lock held. */
static void remember(uintptr_t ptr, size_t size)
{
    size_t i = slot_of(ptr);
    while (slots[i].ptr != 0 && slots[i].ptr != ptr)
        i = (i + 1) & (GP_TRACE_SLOTS - 1);
    if (slots[i].ptr == 0)
        live_count++;
    slots[i].ptr = ptr;
    slots[i].size = size;
}

/* Lock held. Removes ptr; its recorded size in *size. False when it was not recorded. */
static bool forget(uintptr_t ptr, size_t *size)
{
    size_t i = slot_of(ptr);
    while (slots[i].ptr != ptr) {
        if (slots[i].ptr == 0)
            return false;
        i = (i + 1) & (GP_TRACE_SLOTS - 1);
    }
    *size = slots[i].size;
    live_count--;
    /* Backward shift: move later entries of the probe run into the hole where their home allows. */
    for (size_t j = (i + 1) & (GP_TRACE_SLOTS - 1);; j = (j + 1) & (GP_TRACE_SLOTS - 1)) {
        if (slots[j].ptr == 0)
            break;
        size_t home = slot_of(slots[j].ptr);
        bool movable = i <= j ? (home <= i || home > j) : (home <= i && home > j);
        if (movable) {
            slots[i] = slots[j];
            i = j;
        }
    }
    slots[i].ptr = 0;
    return true;
}

static bool recording(void)
{
    return out >= 0 && !in_hook && !forked;
}

/* Lock held. Writes the buffered rows; a failed write stops recording (said at exit). */
static void flush_rows(void)
{
    size_t done = 0;
    while (done < buffered) {
        ssize_t n = write(out, buffer + done, buffered - done);
        if (n <= 0) {
            write_failed = true;
            break;
        }
        done += (size_t)n;
    }
    buffered = 0;
}

/* Lock held. Appends one row. */
static void row(const char *action, uintptr_t ptr, size_t size)
{
    if (sizeof buffer - buffered < 96)
        flush_rows();
    int n = snprintf(buffer + buffered, sizeof buffer - buffered, "0,%llu,%s,0x%llx,%zu,0x0\n",
                     (unsigned long long)(now_us() - start_us), action, (unsigned long long)ptr, size);
    if (n > 0)
        buffered += (size_t)n;
}

/* In a child forked from the recording process: the parent's rows stay the parent's to write. */
static void in_child(void)
{
    forked = true;
    buffered = 0;
}

__attribute__((constructor)) static void trace_open(void)
{
    in_hook = true;
    real_posix_memalign = (int (*)(void **, size_t, size_t))dlsym(RTLD_NEXT, "posix_memalign");
    const char *path = getenv("GP_TRACE_OUT");
    if (path != NULL && path[0] != '\0') {
        slots = calloc(GP_TRACE_SLOTS, sizeof *slots);
        out = slots != NULL ? open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644) : -1;
        if (out < 0) {
            fprintf(stderr, "record_cpu_trace: cannot write %s: recording nothing\n", path);
        } else {
            /* written at once: a program that ends by _exit still leaves a well-formed trace */
            static const char header[] = "Thread,Time,Action,Pointer,Size,Stream\n";
            memcpy(buffer, header, sizeof header - 1);
            buffered = sizeof header - 1;
            flush_rows();
            pthread_atfork(NULL, NULL, in_child);
            start_us = now_us();
        }
        unsetenv("GP_TRACE_OUT"); /* programs this one starts do not record (nor truncate the file) */
    }
    in_hook = false;
}

__attribute__((destructor)) static void trace_close(void)
{
    in_hook = true;
    pthread_mutex_lock(&lock);
    if (out >= 0 && !forked) {
        flush_rows();
        close(out);
        out = -1;
        if (write_failed)
            fprintf(stderr, "record_cpu_trace: writing the trace failed (disk full?): it is incomplete\n");
        if (overflowed)
            fprintf(stderr, "record_cpu_trace: more than %u allocations live at once: the trace stops there "
                    "and is incomplete\n", GP_TRACE_MAX_LIVE);
        fprintf(stderr, "record_cpu_trace: %llu allocations, %llu frees recorded\n", allocations, frees);
    }
    pthread_mutex_unlock(&lock);
    in_hook = false;
}

int posix_memalign(void **memptr, size_t alignment, size_t size)
{
    if (real_posix_memalign == NULL)
        real_posix_memalign = (int (*)(void **, size_t, size_t))dlsym(RTLD_NEXT, "posix_memalign");
    int rc = real_posix_memalign(memptr, alignment, size);
    if (rc != 0 || alignment != 64 || size == 0 || !recording())
        return rc;
    in_hook = true;
    pthread_mutex_lock(&lock);
    if (out >= 0 && !overflowed) {
        if (live_count >= GP_TRACE_MAX_LIVE) {
            overflowed = true;
        } else {
            remember((uintptr_t)*memptr, size);
            allocations++;
            row("allocate", (uintptr_t)*memptr, size);
        }
    }
    pthread_mutex_unlock(&lock);
    in_hook = false;
    return rc;
}

void free(void *ptr)
{
    if (ptr != NULL && recording()) {
        in_hook = true;
        pthread_mutex_lock(&lock);
        size_t size = 0;
        if (out >= 0 && !overflowed && forget((uintptr_t)ptr, &size)) {
            frees++;
            row("free", (uintptr_t)ptr, size);
        }
        pthread_mutex_unlock(&lock);
        in_hook = false;
    }
    __libc_free(ptr);
}
