/*
 * pair_count.c — a fixed number of cached allocate+free pairs of one size on one stream, gpupool's and
 * jemalloc's (mallocx/dallocx), each in a function of its own, for counting instructions: a figure
 * that the machine's load does not change (bench_alloc's times do). Usage:
 *
 *     valgrind --tool=callgrind --callgrind-out-file=/dev/null --toggle-collect=gpupool_pairs \
 *         build/bench/pair_count SIZE PAIRS      # "Collected" / PAIRS = instructions per pair
 *     valgrind ... --toggle-collect=jemalloc_pairs build/bench/pair_count SIZE PAIRS
 *
 * Both run warm (1000 pairs first, outside the counted functions). The pool is a 1 GiB simulated
 * device: valgrind cannot reserve the 80 GiB of bench_alloc's.
 */
#include <jemalloc/jemalloc.h>
#include <stdio.h>
#include <stdlib.h>

#include "gpupool.h"
#include "gpupool_sim.h"

static gp_pool *pool;
static gp_stream stream;

static void gpupool_loop(size_t size, long n)
{
    for (long i = 0; i < n; i++) {
        void *p;
        if (gp_alloc(pool, &p, size, stream) != GP_OK || gp_free(pool, p, stream) != GP_OK) {
            fprintf(stderr, "pair_count: %s\n", gp_last_error());
            exit(1);
        }
    }
}

static void jemalloc_loop(size_t size, long n)
{
    for (long i = 0; i < n; i++) {
        void *p = mallocx(size, 0);
        if (p == NULL)
            exit(1);
        __asm__ volatile("" : : "r"(p) : "memory");
        dallocx(p, 0);
    }
}

__attribute__((noinline)) void gpupool_pairs(size_t size, long n)
{
    gpupool_loop(size, n);
}

__attribute__((noinline)) void jemalloc_pairs(size_t size, long n)
{
    jemalloc_loop(size, n);
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: pair_count SIZE PAIRS\n");
        return 2;
    }
    size_t size = strtoull(argv[1], NULL, 10);
    long n = atol(argv[2]);
    if (gp_pool_create(&pool, 0, "sim", "device_memory:1GiB") != GP_OK) {
        fprintf(stderr, "pair_count: %s\n", gp_last_error());
        return 1;
    }
    stream = gp_sim_stream_create(gp_sim_of(pool));
    gpupool_loop(size, 1000);
    jemalloc_loop(size, 1000);
    gpupool_pairs(size, n);
    jemalloc_pairs(size, n);
    gp_pool_destroy(pool, NULL);
    return 0;
}
