/*
 * gpu_smoke.c — gpupool's public API on a real GPU, through the "cuda" and "vmm" backends.
 *
 * The test suites run on the simulated GPU; this program runs the same kinds of checks where the
 * device is real, with CUDA streams created by the program's own CUDA runtime (as PyTorch's are):
 *
 *   streams  thousands of allocations of mixed sizes on three streams; every block is filled with its
 *            own byte by cudaMemsetAsync on its stream, some are also used on a second stream
 *            (gp_record_stream), and before each free its first and last bytes are read back: another
 *            stream's work landing in a block that was handed out too early shows as a wrong byte;
 *   tenants  a tenant with a max is refused with GP_ERR_QUOTA past it, and the others are not;
 *   pause    (vmm) a tenant's blocks are filled, the tenant is paused keeping contents and resumed,
 *            and the contents are read back;
 *   end      gp_check, gp_trim to zero, and gp_pool_destroy without leaks.
 *
 * Usage: gpu_smoke [BACKEND...]   (default: cuda vmm). Exit 0 when every backend passed, 77 when no
 * CUDA device is usable (nothing ran), 1 otherwise. Built by bench/gpu/run.sh with the CUDA runtime.
 */
#include <cuda_runtime_api.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpupool.h"

#define MiB ((size_t)1 << 20)
#define LIVE_MAX 96
#define STREAMS 3

static int failures;

#define CHECK(cond, ...)                                                                                \
    do {                                                                                                \
        if (!(cond)) {                                                                                  \
            failures++;                                                                                 \
            printf("  FAIL %s:%d: ", __FILE__, __LINE__);                                               \
            printf(__VA_ARGS__);                                                                        \
            printf("\n");                                                                               \
        }                                                                                               \
    } while (0)

#define CUDA_OK(call)                                                                                   \
    do {                                                                                                \
        cudaError_t err_ = (call);                                                                      \
        CHECK(err_ == cudaSuccess, "%s: %s", #call, cudaGetErrorString(err_));                          \
    } while (0)

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint64_t rnd(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

static size_t random_size(void)
{
    switch (rnd() % 8) {
    case 0: return 1 + rnd() % 4096;                /* small */
    case 1: case 2: return 4096 + rnd() % MiB;      /* up to small_size */
    case 3: case 4: return MiB + rnd() % (9 * MiB); /* large segments */
    case 5: return 10 * MiB + rnd() % (54 * MiB);   /* huge: own segment */
    default: return 256 + rnd() % (256 * 1024);
    }
}

typedef struct live {
    void *ptr;
    size_t size;
    cudaStream_t stream;
    unsigned char byte;
} live;

/* Reads back the first and last bytes of a block (ordered after its stream's work) and checks them. */
static void verify(const live *b)
{
    unsigned char head[256], tail[256];
    size_t n = b->size < sizeof head ? b->size : sizeof head;
    CUDA_OK(cudaMemcpyAsync(head, b->ptr, n, cudaMemcpyDeviceToHost, b->stream));
    CUDA_OK(cudaMemcpyAsync(tail, (char *)b->ptr + b->size - n, n, cudaMemcpyDeviceToHost, b->stream));
    CUDA_OK(cudaStreamSynchronize(b->stream));
    for (size_t i = 0; i < n; i++) {
        if (head[i] != b->byte || tail[i] != b->byte) {
            CHECK(0, "block %p (%zu bytes) holds 0x%02x/0x%02x at %zu, expected 0x%02x: another stream wrote it",
                  b->ptr, b->size, head[i], tail[i], i, b->byte);
            return;
        }
    }
}

static void streams_check(gp_pool *pool, cudaStream_t *streams, int rounds)
{
    live blocks[LIVE_MAX];
    int count = 0;
    unsigned char next_byte = 1;
    int quota_or_oom = 0;
    for (int i = 0; i < rounds; i++) {
        if (count == LIVE_MAX || (count > 0 && rnd() % 3 == 0)) {
            int k = (int)(rnd() % (uint64_t)count);
            live *b = &blocks[k];
            if (rnd() % 4 == 0)
                verify(b);
            int rc = gp_free(pool, b->ptr, b->stream);
            CHECK(rc == GP_OK, "gp_free: %s", gp_last_error());
            blocks[k] = blocks[--count];
            continue;
        }
        int si = (int)(rnd() % STREAMS);
        live b = {NULL, random_size(), streams[si], next_byte};
        next_byte = (unsigned char)(next_byte % 250 + 1);
        int rc = gp_alloc(pool, &b.ptr, b.size, b.stream);
        if (rc == GP_ERR_OOM) {
            quota_or_oom++;
            continue;
        }
        CHECK(rc == GP_OK && b.ptr != NULL, "gp_alloc(%zu): %s", b.size, gp_last_error());
        if (rc != GP_OK)
            continue;
        CHECK(((uintptr_t)b.ptr & 511) == 0, "%p is not 512-byte aligned", b.ptr);
        CUDA_OK(cudaMemsetAsync(b.ptr, b.byte, b.size, b.stream));
        if (rnd() % 5 == 0) { /* also read on another stream, after the fill */
            cudaStream_t other = streams[(si + 1 + (int)(rnd() % (STREAMS - 1))) % STREAMS];
            {
                cudaEvent_t filled;
                CUDA_OK(cudaEventCreateWithFlags(&filled, cudaEventDisableTiming));
                CUDA_OK(cudaEventRecord(filled, b.stream));
                CUDA_OK(cudaStreamWaitEvent(other, filled, 0));
                static char sink[4096];
                CUDA_OK(cudaMemcpyAsync(sink, b.ptr, b.size < sizeof sink ? b.size : sizeof sink,
                                        cudaMemcpyDeviceToHost, other));
                CUDA_OK(cudaEventDestroy(filled));
                rc = gp_record_stream(pool, b.ptr, other);
                CHECK(rc == GP_OK, "gp_record_stream: %s", gp_last_error());
            }
        }
        blocks[count++] = b;
    }
    while (count > 0) {
        live *b = &blocks[--count];
        verify(b);
        CHECK(gp_free(pool, b->ptr, b->stream) == GP_OK, "gp_free: %s", gp_last_error());
    }
    printf("  streams: %d rounds on %d streams%s\n", rounds, STREAMS, quota_or_oom ? " (some OOM)" : "");
}

static void tenants_check(gp_pool *pool, cudaStream_t stream)
{
    gp_tenant_limits lim = {.max = 256 * MiB, .high = 0, .min = 0};
    CHECK(gp_tenant_create(pool, "capped", &lim) == GP_OK, "gp_tenant_create: %s", gp_last_error());
    CHECK(gp_tenant_push(pool, "capped") == GP_OK, "gp_tenant_push: %s", gp_last_error());
    void *ptrs[64];
    int n = 0, rc = GP_OK;
    while (n < 64 && (rc = gp_alloc(pool, &ptrs[n], 32 * MiB, stream)) == GP_OK)
        n++;
    CHECK(rc == GP_ERR_QUOTA, "expected GP_ERR_QUOTA past max, got %d (%s) after %d blocks", rc, gp_last_error(), n);
    CHECK(n >= 6 && n <= 8, "%d blocks of 32 MiB under a 256 MiB max", n);
    CHECK(strstr(gp_last_error(), "capped") != NULL, "the message names the tenant: %s", gp_last_error());
    CHECK(gp_tenant_pop(pool) == GP_OK, "gp_tenant_pop: %s", gp_last_error());
    void *other = NULL;
    CHECK(gp_alloc(pool, &other, 512 * MiB, stream) == GP_OK, "the default tenant is not capped: %s",
          gp_last_error());
    gp_tenant_stats ts = {.size = sizeof ts, .version = GP_TENANT_STATS_VERSION};
    CHECK(gp_tenant_get_stats(pool, "capped", &ts) == GP_OK, "gp_tenant_get_stats: %s", gp_last_error());
    CHECK(ts.held_bytes <= 256 * MiB && ts.refusals == 1, "capped holds %llu, %llu refusals",
          (unsigned long long)ts.held_bytes, (unsigned long long)ts.refusals);
    for (int i = 0; i < n; i++)
        CHECK(gp_free(pool, ptrs[i], stream) == GP_OK, "gp_free: %s", gp_last_error());
    CHECK(gp_free(pool, other, stream) == GP_OK, "gp_free: %s", gp_last_error());
    printf("  tenants: %d x 32 MiB under max 256 MiB, then GP_ERR_QUOTA; default unaffected\n", n);
}

static void pause_check(gp_pool *pool, cudaStream_t stream)
{
    CHECK(gp_tenant_create(pool, "napper", NULL) == GP_OK, "gp_tenant_create: %s", gp_last_error());
    CHECK(gp_tenant_push(pool, "napper") == GP_OK, "gp_tenant_push: %s", gp_last_error());
    live b[4];
    for (int i = 0; i < 4; i++) {
        b[i] = (live){NULL, (size_t)(i + 1) * 24 * MiB + 4096 * (size_t)i, stream, (unsigned char)(0xa0 + i)};
        CHECK(gp_alloc(pool, &b[i].ptr, b[i].size, stream) == GP_OK, "gp_alloc: %s", gp_last_error());
        CUDA_OK(cudaMemsetAsync(b[i].ptr, b[i].byte, b[i].size, stream));
    }
    CHECK(gp_tenant_pop(pool) == GP_OK, "gp_tenant_pop: %s", gp_last_error());
    CUDA_OK(cudaStreamSynchronize(stream));
    gp_tenant_stats before = {.size = sizeof before, .version = GP_TENANT_STATS_VERSION};
    gp_tenant_get_stats(pool, "napper", &before);
    int rc = gp_tenant_pause(pool, "napper", GP_PAUSE_KEEP_CONTENTS);
    CHECK(rc == GP_OK, "gp_tenant_pause: %s", gp_last_error());
    if (rc == GP_OK) {
        gp_tenant_stats paused = {.size = sizeof paused, .version = GP_TENANT_STATS_VERSION};
        gp_tenant_get_stats(pool, "napper", &paused);
        CHECK(paused.paused && paused.held_bytes < before.held_bytes, "paused %d, holds %llu (was %llu)",
              paused.paused, (unsigned long long)paused.held_bytes, (unsigned long long)before.held_bytes);
        CHECK(gp_tenant_push(pool, "napper") == GP_OK, "push");
        void *p = NULL;
        CHECK(gp_alloc(pool, &p, MiB, stream) == GP_ERR_PAUSED, "allocating in a paused tenant");
        CHECK(gp_tenant_pop(pool) == GP_OK, "pop");
        CHECK(gp_tenant_resume(pool, "napper") == GP_OK, "gp_tenant_resume: %s", gp_last_error());
    }
    for (int i = 0; i < 4; i++) {
        verify(&b[i]);
        CHECK(gp_free(pool, b[i].ptr, stream) == GP_OK, "gp_free: %s", gp_last_error());
    }
    printf("  pause: 4 blocks paused with their contents, resumed and read back\n");
}

static int run_backend(const char *backend)
{
    int before = failures;
    printf("backend %s:\n", backend);
    gp_pool *pool = NULL;
    int rc = gp_pool_create(&pool, 0, backend, NULL);
    if (rc != GP_OK) {
        CHECK(0, "gp_pool_create(%s): %s", backend, gp_last_error());
        return 1;
    }
    cudaStream_t streams[STREAMS];
    for (int i = 0; i < STREAMS; i++)
        CUDA_OK(cudaStreamCreateWithFlags(&streams[i], cudaStreamNonBlocking));
    streams_check(pool, streams, 4000);
    tenants_check(pool, streams[0]);
    if (strcmp(backend, "vmm") == 0)
        pause_check(pool, streams[1]);
    CUDA_OK(cudaDeviceSynchronize());
    CHECK(gp_check(pool) == GP_OK, "gp_check: %s", gp_last_error());
    gp_stats s = {.size = sizeof s, .version = GP_STATS_VERSION};
    CHECK(gp_get_stats(pool, &s) == GP_OK, "gp_get_stats: %s", gp_last_error());
    CHECK(s.allocated_bytes == 0, "%llu bytes still allocated", (unsigned long long)s.allocated_bytes);
    printf("  stats: %llu allocs, %llu device allocs, reserved peak %.1f MiB, %llu steals, %llu stream waits\n",
           (unsigned long long)s.num_allocs, (unsigned long long)s.num_device_allocs,
           (double)s.reserved_bytes_peak / (double)MiB, (unsigned long long)s.num_stream_steals,
           (unsigned long long)s.num_stream_waits);
    size_t released = 0;
    CHECK(gp_trim(pool, 0, &released) == GP_OK, "gp_trim: %s", gp_last_error());
    gp_leak_report leaks = {0, 0};
    CHECK(gp_pool_destroy(pool, &leaks) == GP_OK, "gp_pool_destroy: %s", gp_last_error());
    CHECK(leaks.live_blocks == 0, "%zu blocks leaked", leaks.live_blocks);
    for (int i = 0; i < STREAMS; i++)
        CUDA_OK(cudaStreamDestroy(streams[i]));
    int ok = failures == before;
    printf("SMOKE backend=%s: %s\n", backend, ok ? "passed" : "FAILED");
    return ok ? 0 : 1;
}

int main(int argc, char **argv)
{
    int devices = 0;
    cudaError_t err = cudaGetDeviceCount(&devices);
    if (err != cudaSuccess || devices == 0) {
        printf("SMOKE skipped: no CUDA device (%s)\n", err != cudaSuccess ? cudaGetErrorString(err) : "0 devices");
        return 77;
    }
    CUDA_OK(cudaSetDevice(0));
    const char *defaults[] = {"cuda", "vmm"};
    const char **backends = argc > 1 ? (const char **)(argv + 1) : defaults;
    int n = argc > 1 ? argc - 1 : 2;
    int bad = 0;
    for (int i = 0; i < n; i++)
        bad += run_backend(backends[i]);
    printf("SMOKE %d passed, %d failed\n", n - bad, bad);
    return bad ? 1 : 0;
}
