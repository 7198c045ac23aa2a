/*
 * test_trace.c — the trace CSV reader (cli/trace.c) and the allocation-log writer (pool/base/trace_log.c):
 * both time formats, malformed lines reported as FILE:LINE, frees of unknown pointers counted, and
 * logs written by gp_trace_log read back unchanged (also from several threads at once).
 */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "trace.h"
#include "base/trace_log.h"

static int parse(gp_trace *t, const char *text, char *err, size_t errlen)
{
    return gp_trace_parse(t, "mem.csv", text, strlen(text), err, errlen);
}

Test(trace, plain_microseconds)
{
    gp_trace t;
    char err[256] = "";
    int rc = parse(&t,
                   "Thread,Time,Action,Pointer,Size,Stream\n"
                   "0,0,allocate,0x7f0000000000,4096,0x0\n"
                   "0,17,allocate,0x7f0000001000,100,0x0\n"
                   "0,25,free,0x7f0000000000,4096,0x0\n",
                   err, sizeof err);
    cr_assert_eq(rc, 0, "%s", err);
    cr_assert_eq(t.num_events, 3);
    cr_assert_eq(t.num_allocs, 2);
    cr_assert_eq(t.num_frees, 1);
    cr_assert_eq(t.events[1].time_us, 17);
    cr_assert_eq(t.events[2].time_us, 25);
    cr_assert_eq(t.events[0].ptr, 0x7f0000000000ull);
    cr_assert_eq(t.events[2].kind, GP_EV_FREE);
    cr_assert_eq(t.events[2].slot, t.events[0].slot, "the free names its allocation's slot");
    cr_assert_eq(t.peak_live_bytes, 4196);
    cr_assert_eq(t.end_live_bytes, 100);
    cr_assert_eq(t.unknown_frees, 0);
    gp_trace_free(&t);
}

Test(trace, rmm_clock_time)
{
    gp_trace t;
    char err[256] = "";
    int rc = parse(&t,
                   "Thread,Time,Action,Pointer,Size,Stream\n"
                   "140001,01:02:03:000004,allocate,0x7f0000000000,512,0x0\n"
                   "140001,01:02:03.500000,allocate,0x7f0000000200,512,0x0\n"
                   "140002,00:00:01:5,free,0x7f0000000000,512,0x0\n",
                   err, sizeof err);
    cr_assert_eq(rc, 0, "%s", err);
    cr_assert_eq(t.events[0].time_us, ((1ull * 60 + 2) * 60 + 3) * 1000000ull + 4);
    cr_assert_eq(t.events[1].time_us, ((1ull * 60 + 2) * 60 + 3) * 1000000ull + 500000);
    cr_assert_eq(t.events[2].time_us, 1000000ull + 500000, "a short fraction is a decimal fraction");
    cr_assert_eq(t.num_threads, 2);
    gp_trace_free(&t);
}

Test(trace, streams_failures_crlf_and_blank_lines)
{
    gp_trace t;
    char err[256] = "";
    int rc = parse(&t,
                   "Thread,Time,Action,Pointer,Size,Stream\r\n"
                   "\r\n"
                   "0,1,allocate,7f0000000000,1024,0x0\r\n"
                   "0,2,allocate,0x7f0000010000,2048,0xABC0\r\n"
                   "0,3,allocate failure,0x0,1099511627776,0xabc0\r\n"
                   "0,4,free,0x7f0000010000,2048,0xabc0\r\n"
                   "\n",
                   err, sizeof err);
    cr_assert_eq(rc, 0, "%s", err);
    cr_assert_eq(t.num_events, 4);
    cr_assert_eq(t.num_streams, 2);
    cr_assert_eq(t.streams[0], 0);
    cr_assert_eq(t.streams[1], 0xabc0);
    cr_assert_eq(t.events[1].stream, 1);
    cr_assert_eq(t.events[2].kind, GP_EV_ALLOC_FAILURE);
    cr_assert_eq(t.events[2].size, 1099511627776ull);
    cr_assert_eq(t.num_alloc_failures, 1);
    cr_assert_eq(t.slot_stream[t.events[1].slot], 1);
    gp_trace_free(&t);
}

Test(trace, unknown_pointer_free_is_counted_not_fatal)
{
    gp_trace t;
    char err[256] = "";
    int rc = parse(&t,
                   "Thread,Time,Action,Pointer,Size,Stream\n"
                   "0,1,allocate,0x1000,512,0x0\n"
                   "0,2,free,0x2000,512,0x0\n"   /* never allocated: line 3 */
                   "0,3,free,0x1000,512,0x0\n"
                   "0,4,free,0x1000,512,0x0\n",  /* already freed */
                   err, sizeof err);
    cr_assert_eq(rc, 0, "%s", err);
    cr_assert_eq(t.unknown_frees, 2);
    cr_assert_eq(t.first_unknown_free_line, 3);
    cr_assert_eq(t.num_events, 2, "unknown frees are not replayed");
    cr_assert_eq(t.num_frees, 1);
    gp_trace_free(&t);
}

Test(trace, free_size_is_the_allocation_size)
{
    gp_trace t;
    char err[256] = "";
    int rc = parse(&t,
                   "Thread,Time,Action,Pointer,Size,Stream\n"
                   "0,1,allocate,0x1000,700,0x0\n"
                   "0,2,free,0x1000,0,0x0\n",
                   err, sizeof err);
    cr_assert_eq(rc, 0, "%s", err);
    cr_assert_eq(t.events[1].size, 700);
    cr_assert_eq(t.size_mismatches, 1);
    cr_assert_eq(t.end_live_bytes, 0);
    gp_trace_free(&t);
}

Test(trace, many_pointers_resolve_through_the_table)
{
    /* enough live pointers to grow the table several times, freed in a scrambled order */
    enum { N = 20000 };
    size_t cap = 64 + (size_t)N * 2 * 48;
    char *text = malloc(cap);
    cr_assert_not_null(text);
    size_t len = (size_t)snprintf(text, cap, "Thread,Time,Action,Pointer,Size,Stream\n");
    for (unsigned i = 0; i < N; i++)
        len += (size_t)snprintf(text + len, cap - len, "0,%u,allocate,0x%x,%u,0x0\n", i, (i + 1) * 512u, i + 1);
    for (unsigned k = 0; k < N; k++) {
        unsigned i = (k * 7919u) % N; /* 7919 is prime and does not divide N: a permutation */
        len += (size_t)snprintf(text + len, cap - len, "0,%u,free,0x%x,%u,0x0\n", N + k, (i + 1) * 512u, i + 1);
    }
    gp_trace t;
    char err[256] = "";
    cr_assert_eq(gp_trace_parse(&t, "big.csv", text, len, err, sizeof err), 0, "%s", err);
    free(text);
    cr_assert_eq(t.num_frees, N);
    cr_assert_eq(t.unknown_frees, 0);
    cr_assert_eq(t.end_live_bytes, 0);
    for (unsigned k = 0; k < N; k++) {
        const gp_trace_event *ev = &t.events[N + k];
        unsigned i = (k * 7919u) % N;
        cr_assert_eq(ev->slot, i, "free %u resolves to slot %u, not %u", k, i, ev->slot);
        cr_assert_eq(ev->size, i + 1);
    }
    gp_trace_free(&t);
}

static void expect_error(const char *text, const char *fragment)
{
    gp_trace t;
    char err[256] = "";
    int rc = parse(&t, text, err, sizeof err);
    cr_assert_neq(rc, 0, "accepted a malformed trace; expected \"%s\"", fragment);
    cr_assert(strstr(err, fragment) != NULL, "message \"%s\" lacks \"%s\"", err, fragment);
}

Test(trace, malformed_lines_are_reported_with_file_and_line)
{
    const char *h = "Thread,Time,Action,Pointer,Size,Stream\n";
    char buf[512];
    snprintf(buf, sizeof buf, "%s0,1,allocate,0x1000,512,0x0\n0,2,allocate,0x2000,12x,0x0\n", h);
    expect_error(buf, "mem.csv:3: bad Size \"12x\"");
    snprintf(buf, sizeof buf, "%s0,1,alloc,0x1000,512,0x0\n", h);
    expect_error(buf, "mem.csv:2: bad Action \"alloc\"");
    snprintf(buf, sizeof buf, "%s0,1,allocate,0xZZ,512,0x0\n", h);
    expect_error(buf, "mem.csv:2: bad Pointer");
    snprintf(buf, sizeof buf, "%s0,1,allocate,0x1000,512\n", h);
    expect_error(buf, "mem.csv:2: expected 6 comma-separated fields");
    snprintf(buf, sizeof buf, "%s0,1,allocate,0x1000,512,0x0,extra\n", h);
    expect_error(buf, "mem.csv:2: expected 6 comma-separated fields");
    snprintf(buf, sizeof buf, "%s0,12:61:00:0,allocate,0x1000,512,0x0\n", h);
    expect_error(buf, "mem.csv:2: bad Time");
    snprintf(buf, sizeof buf, "%s0,1,allocate,0x1000,99999999999999999999999,0x0\n", h);
    expect_error(buf, "mem.csv:2: bad Size");
    snprintf(buf, sizeof buf, "%s0,1,allocate,0x1000,512,stream\n", h);
    expect_error(buf, "mem.csv:2: bad Stream");
    expect_error("Time,Thread,Action,Pointer,Size,Stream\n", "mem.csv:1: expected the header");
    expect_error("", "mem.csv:1: empty trace");
}

Test(trace, read_reports_the_path)
{
    char path[] = "/tmp/gpupool_test_trace_XXXXXX";
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    const char text[] = "Thread,Time,Action,Pointer,Size,Stream\n0,1,allocate,0x1000,512,0x0\n\n0,x,free,0x1000,512,0x0\n";
    cr_assert_eq(write(fd, text, sizeof text - 1), (ssize_t)(sizeof text - 1));
    close(fd);
    gp_trace t;
    char err[512] = "", want[600];
    cr_assert_neq(gp_trace_read(&t, path, err, sizeof err), 0);
    snprintf(want, sizeof want, "%s:4: bad Time", path);
    cr_assert(strstr(err, want) != NULL, "message \"%s\" lacks \"%s\"", err, want);
    unlink(path);
    cr_assert_neq(gp_trace_read(&t, "/nonexistent/dir/x.csv", err, sizeof err), 0);
    cr_assert(strstr(err, "/nonexistent/dir/x.csv") != NULL, "%s", err);
}

/* ---- the log writer --------------------------------------------------------------------------- */

Test(trace_log, round_trip)
{
    char path[] = "/tmp/gpupool_test_log_XXXXXX";
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    close(fd);
    gp_trace_log *log;
    cr_assert_eq(gp_trace_log_open(&log, path), GP_OK, "%s", gp_last_error());
    gp_trace_log_event(log, GP_TRACE_ALLOCATE, 0x7f0000000000u, 4096, NULL);
    gp_trace_log_event(log, GP_TRACE_ALLOCATE, 0x7f0000001000u, 123, (gp_stream)(uintptr_t)0x5a5a0);
    gp_trace_log_event(log, GP_TRACE_ALLOCATE_FAILURE, 0, (size_t)1 << 40, NULL);
    gp_trace_log_event(log, GP_TRACE_FREE, 0x7f0000000000u, 4096, NULL);
    gp_trace_log_close(log);

    gp_trace t;
    char err[512] = "";
    cr_assert_eq(gp_trace_read(&t, path, err, sizeof err), 0, "%s", err);
    cr_assert_eq(t.num_events, 4);
    cr_assert_eq(t.events[0].kind, GP_EV_ALLOC);
    cr_assert_eq(t.events[0].ptr, 0x7f0000000000u);
    cr_assert_eq(t.events[0].size, 4096);
    cr_assert_eq(t.events[1].size, 123);
    cr_assert_eq(t.streams[t.events[1].stream], 0x5a5a0);
    cr_assert_eq(t.events[2].kind, GP_EV_ALLOC_FAILURE);
    cr_assert_eq(t.events[2].size, (uint64_t)1 << 40);
    cr_assert_eq(t.events[3].kind, GP_EV_FREE);
    cr_assert_eq(t.events[3].slot, t.events[0].slot);
    for (size_t i = 1; i < t.num_events; i++)
        cr_assert_geq(t.events[i].time_us, t.events[i - 1].time_us, "times never go back");
    cr_assert_eq(t.num_threads, 1);
    gp_trace_free(&t);
    unlink(path);
}

Test(trace_log, empty_log_is_a_valid_trace)
{
    char path[] = "/tmp/gpupool_test_log_XXXXXX";
    int fd = mkstemp(path);
    close(fd);
    gp_trace_log *log;
    cr_assert_eq(gp_trace_log_open(&log, path), GP_OK, "%s", gp_last_error());
    gp_trace_log_close(log);
    gp_trace t;
    char err[512] = "";
    cr_assert_eq(gp_trace_read(&t, path, err, sizeof err), 0, "%s", err);
    cr_assert_eq(t.num_events, 0);
    gp_trace_free(&t);
    unlink(path);
}

Test(trace_log, open_failure_names_the_path)
{
    gp_trace_log *log = (gp_trace_log *)1;
    int rc = gp_trace_log_open(&log, "/nonexistent/dir/log.csv");
    cr_assert_eq(rc, GP_ERR_CONFIG);
    cr_assert_null(log);
    cr_assert(strstr(gp_last_error(), "/nonexistent/dir/log.csv") != NULL, "%s", gp_last_error());
    cr_assert(strstr(gp_last_error(), "No such file") != NULL, "%s", gp_last_error());
}

#define LOG_THREADS 4
#define LOG_PER_THREAD 5000

typedef struct log_job {
    gp_trace_log *log;
    unsigned index;
} log_job;

static void *log_worker(void *arg)
{
    log_job *job = arg;
    uintptr_t base = ((uintptr_t)job->index + 1) << 32;
    for (unsigned i = 0; i < LOG_PER_THREAD; i++) {
        gp_trace_log_event(job->log, GP_TRACE_ALLOCATE, base + (uintptr_t)i * 512u, i + 1, NULL);
        gp_trace_log_event(job->log, GP_TRACE_FREE, base + (uintptr_t)i * 512u, i + 1, NULL);
    }
    return NULL;
}

Test(trace_log, threads_write_whole_lines)
{
    char path[] = "/tmp/gpupool_test_log_XXXXXX";
    int fd = mkstemp(path);
    close(fd);
    gp_trace_log *log;
    cr_assert_eq(gp_trace_log_open(&log, path), GP_OK, "%s", gp_last_error());
    pthread_t th[LOG_THREADS];
    log_job jobs[LOG_THREADS];
    for (unsigned i = 0; i < LOG_THREADS; i++) {
        jobs[i] = (log_job){log, i};
        cr_assert_eq(pthread_create(&th[i], NULL, log_worker, &jobs[i]), 0);
    }
    for (unsigned i = 0; i < LOG_THREADS; i++)
        pthread_join(th[i], NULL);
    gp_trace_log_close(log);
    gp_trace t;
    char err[512] = "";
    cr_assert_eq(gp_trace_read(&t, path, err, sizeof err), 0, "%s", err);
    cr_assert_eq(t.num_allocs, LOG_THREADS * LOG_PER_THREAD);
    cr_assert_eq(t.num_frees, LOG_THREADS * LOG_PER_THREAD);
    cr_assert_eq(t.unknown_frees, 0);
    cr_assert_eq(t.end_live_bytes, 0);
    cr_assert_eq(t.num_threads, LOG_THREADS, "one small id per thread");
    for (size_t i = 1; i < t.num_events; i++)
        cr_assert_geq(t.events[i].time_us, t.events[i - 1].time_us, "times are taken in line order");
    gp_trace_free(&t);
    unlink(path);
}

/* ---- compressed traces and standard input (cli/trace.c reads through zlib) ---- */

#include <fcntl.h>
#include <zlib.h>

static const char small_trace[] = "Thread,Time,Action,Pointer,Size,Stream\n"
                                  "0,1,allocate,0x7f0000000000,4096,0x0\n"
                                  "0,2,allocate,0x7f0000001000,100,0x0\n"
                                  "0,3,free,0x7f0000000000,4096,0x0\n";

static void write_gz(const char *path, const char *text, size_t len)
{
    gzFile f = gzopen(path, "wb");
    cr_assert_not_null(f);
    cr_assert_eq(gzwrite(f, text, (unsigned)len), (int)len);
    cr_assert_eq(gzclose(f), Z_OK);
}

Test(trace_gz, gzip_reads_as_its_csv_whatever_the_name)
{
    char dir[] = "/tmp/gp_trace_gz_XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    char gz[256], renamed[256];
    snprintf(gz, sizeof gz, "%s/t.csv.gz", dir);
    snprintf(renamed, sizeof renamed, "%s/t.csv", dir); /* compressed, but named .csv */
    write_gz(gz, small_trace, strlen(small_trace));
    write_gz(renamed, small_trace, strlen(small_trace));
    gp_trace plain, a, b;
    char err[512] = "";
    cr_assert_eq(parse(&plain, small_trace, err, sizeof err), 0, "%s", err);
    cr_assert_eq(gp_trace_read(&a, gz, err, sizeof err), 0, "%s", err);
    cr_assert_eq(gp_trace_read(&b, renamed, err, sizeof err), 0, "%s", err);
    cr_assert_eq(a.num_events, plain.num_events);
    cr_assert_eq(b.num_events, plain.num_events);
    cr_assert_eq(memcmp(a.events, plain.events, plain.num_events * sizeof *plain.events), 0);
    cr_assert_eq(a.peak_live_bytes, 4196);
    gp_trace_free(&plain);
    gp_trace_free(&a);
    gp_trace_free(&b);
    unlink(gz);
    unlink(renamed);
    rmdir(dir);
}

Test(trace_gz, truncated_or_damaged_gzip_is_an_error_naming_the_file)
{
    char dir[] = "/tmp/gp_trace_gz_XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    char gz[256], cut[256];
    snprintf(gz, sizeof gz, "%s/t.csv.gz", dir);
    snprintf(cut, sizeof cut, "%s/cut.csv.gz", dir);
    write_gz(gz, small_trace, strlen(small_trace));
    FILE *in = fopen(gz, "rb");
    unsigned char bytes[4096];
    size_t n = fread(bytes, 1, sizeof bytes, in);
    fclose(in);
    cr_assert_gt(n, 30);
    FILE *out = fopen(cut, "wb");
    fwrite(bytes, 1, n - 12, out); /* drop the end of the stream and its trailer */
    fclose(out);
    gp_trace t;
    char err[512] = "";
    cr_assert_eq(gp_trace_read(&t, cut, err, sizeof err), -1, "a truncated gzip stream must not read as a trace");
    cr_assert(strstr(err, cut) == err, "the message starts with the file: %s", err);
    cr_assert(strstr(err, "gzip") != NULL, "the message says what is wrong: %s", err);
    cr_assert(strstr(err + strlen(cut), cut) == NULL, "the file is named once: %s", err);

    out = fopen(cut, "wb");
    fwrite("\x1f\x8b\x08\x00garbage", 1, 11, out);
    fclose(out);
    cr_assert_eq(gp_trace_read(&t, cut, err, sizeof err), -1);
    cr_assert(strstr(err, "gzip") != NULL, "%s", err);
    unlink(gz);
    unlink(cut);
    rmdir(dir);
}

static void read_from_stdin(const char *path, gp_trace *t, char *err, size_t errlen, int *rc)
{
    int saved = dup(STDIN_FILENO);
    int fd = open(path, O_RDONLY);
    cr_assert_geq(fd, 0);
    dup2(fd, STDIN_FILENO);
    close(fd);
    *rc = gp_trace_read(t, "-", err, errlen);
    dup2(saved, STDIN_FILENO);
    close(saved);
}

Test(trace_gz, dash_reads_standard_input_plain_or_gzip)
{
    char dir[] = "/tmp/gp_trace_gz_XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    char gz[256], csv[256];
    snprintf(gz, sizeof gz, "%s/t.csv.gz", dir);
    snprintf(csv, sizeof csv, "%s/plain.csv", dir);
    write_gz(gz, small_trace, strlen(small_trace));
    FILE *f = fopen(csv, "wb");
    fputs(small_trace, f);
    fclose(f);
    gp_trace t;
    char err[512] = "";
    int rc;
    read_from_stdin(csv, &t, err, sizeof err, &rc);
    cr_assert_eq(rc, 0, "%s", err);
    cr_assert_eq(t.num_events, 3);
    cr_assert_str_eq(t.path, "<stdin>");
    gp_trace_free(&t);
    read_from_stdin(gz, &t, err, sizeof err, &rc);
    cr_assert_eq(rc, 0, "%s", err);
    cr_assert_eq(t.num_events, 3);
    gp_trace_free(&t);

    f = fopen(csv, "wb");
    fputs("Thread,Time,Action,Pointer,Size,Stream\n0,1,allocate,zz,1,0x0\n", f);
    fclose(f);
    read_from_stdin(csv, &t, err, sizeof err, &rc);
    cr_assert_eq(rc, -1);
    cr_assert(strncmp(err, "<stdin>:2:", 10) == 0, "a bad line on stdin is <stdin>:LINE: %s", err);
    unlink(gz);
    unlink(csv);
    rmdir(dir);
}
