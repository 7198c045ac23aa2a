/*
 * test_peak.c — what reserved memory was made of at its peak (peak_composition:on,
 * gp_get_peak_composition): the parts add up to the peak, the unit is a segment on sim and a page on
 * sim-vmm, a layout with known holes gives its exact parts, recording changes no decision of the pool,
 * it is off by default, it restarts with gp_reset_peaks, a resume that raises the peak records it, and
 * bad arguments change nothing.
 */
#include <criterion/criterion.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpupool.h"
#include "gpupool_sim.h"

#define KIB ((size_t)1 << 10)
#define MIB ((size_t)1 << 20)

static gp_pool *open_pool(const char *backend, const char *conf)
{
    unsetenv("GPUPOOL_CONF");
    gp_pool *pool = NULL;
    cr_assert_eq(gp_pool_create(&pool, 0, backend, conf), GP_OK, "%s", gp_last_error());
    return pool;
}

static gp_peak_composition composition(gp_pool *pool)
{
    gp_peak_composition c = {.size = sizeof c, .version = GP_PEAK_COMPOSITION_VERSION};
    cr_assert_eq(gp_get_peak_composition(pool, &c), GP_OK, "%s", gp_last_error());
    return c;
}

static uint64_t part_sum(const gp_peak_part *k)
{
    return k->allocated_bytes + k->pending_bytes + k->free_in_used_bytes + k->free_whole_bytes;
}

/* The parts add up to the reserved bytes recorded, and those are the pool's peak. */
static void assert_adds_up(gp_pool *pool, const gp_peak_composition *c)
{
    gp_stats s = {.size = sizeof s, .version = GP_STATS_VERSION};
    cr_assert_eq(gp_get_stats(pool, &s), GP_OK);
    cr_assert_eq(c->recorded, 1u);
    cr_assert_eq(part_sum(&c->small) + part_sum(&c->large) + c->unmapped_cached_bytes + c->parked_bytes,
                 c->reserved_bytes, "the parts add up to what was reserved");
    cr_assert_eq(c->reserved_bytes, s.reserved_bytes_peak, "recorded at the last raise of the peak");
}

Test(peak, off_by_default_and_nothing_in_the_json)
{
    gp_pool *pool = open_pool("sim", "device_memory:1GiB");
    void *p;
    cr_assert_eq(gp_alloc(pool, &p, 3 * MIB, NULL), GP_OK);
    gp_peak_composition c = composition(pool);
    cr_assert_eq(c.recorded, 0u);
    cr_assert_eq(c.reserved_bytes, 0u);
    char json[16384];
    cr_assert_eq(gp_stats_json(pool, json, sizeof json, NULL), GP_OK);
    cr_assert_null(strstr(json, "peak_composition"));
    cr_assert_eq(gp_free(pool, p, NULL), GP_OK);
    gp_pool_destroy(pool, NULL);
}

Test(peak, segments_live_beside_free_and_wholly_free)
{
    gp_pool *pool = open_pool("sim", "device_memory:1GiB,peak_composition:on");
    void *a, *b, *c;
    cr_assert_eq(gp_alloc(pool, &a, 1 * MIB, NULL), GP_OK); /* a 20 MiB segment */
    gp_peak_composition k = composition(pool);
    assert_adds_up(pool, &k);
    cr_assert_eq(k.unit_is_page, 0u);
    cr_assert_eq(k.reserved_bytes, 20 * MIB);
    cr_assert_eq(k.request_bytes, 1 * MIB);
    cr_assert_eq(k.num_allocs, 1u, "the first allocation set it");
    cr_assert_eq(k.large.allocated_bytes, 1 * MIB);
    cr_assert_eq(k.large.free_in_used_bytes, 19 * MIB, "free beside a live block in its segment");
    cr_assert_eq(k.large.free_whole_bytes, 0u);

    cr_assert_eq(gp_alloc(pool, &b, 4 * KIB, NULL), GP_OK); /* a 2 MiB small segment */
    k = composition(pool);
    assert_adds_up(pool, &k);
    cr_assert_eq(k.num_allocs, 2u);
    cr_assert_eq(k.small.allocated_bytes, 4 * KIB);
    cr_assert_eq(k.small.free_in_used_bytes, 2 * MIB - 4 * KIB);

    cr_assert_eq(gp_free(pool, a, NULL), GP_OK);
    cr_assert_eq(gp_alloc(pool, &c, 30 * MIB, NULL), GP_OK); /* a segment of its own; a's is wholly free */
    k = composition(pool);
    assert_adds_up(pool, &k);
    cr_assert_eq(k.reserved_bytes, 52 * MIB);
    cr_assert_eq(k.large.allocated_bytes, 30 * MIB);
    cr_assert_eq(k.large.free_whole_bytes, 20 * MIB, "the segment a was freed from holds nothing");
    cr_assert_eq(k.large.free_in_used_bytes, 0u);

    /* no growth, no new record */
    cr_assert_eq(gp_free(pool, c, NULL), GP_OK);
    cr_assert_eq(gp_alloc(pool, &c, 30 * MIB, NULL), GP_OK);
    cr_assert_eq(composition(pool).num_allocs, 3u);
    cr_assert_eq(gp_free(pool, b, NULL), GP_OK);
    cr_assert_eq(gp_free(pool, c, NULL), GP_OK);
    gp_pool_destroy(pool, NULL);
}

/* On virtual memory the unit is a page: free bytes in a page a live block shares are fragmentation,
 * a page with nothing live in it is free whole (it could move). */
Test(peak, pages_partly_used_and_whole)
{
    gp_pool *pool = open_pool("sim-vmm", "device_memory:1GiB,peak_composition:on");
    void *a, *b, *c;
    cr_assert_eq(gp_alloc(pool, &a, 3 * MIB, NULL), GP_OK); /* pages 0-1: a, and 1 MiB free in page 1 */
    gp_peak_composition k = composition(pool);
    assert_adds_up(pool, &k);
    cr_assert_eq(k.unit_is_page, 1u);
    cr_assert_eq(k.unit_bytes, 2 * MIB);
    cr_assert_eq(k.reserved_bytes, 4 * MIB);
    cr_assert_eq(k.large.allocated_bytes, 3 * MIB);
    cr_assert_eq(k.large.free_in_used_bytes, 1 * MIB);
    cr_assert_eq(k.large.free_whole_bytes, 0u);

    cr_assert_eq(gp_alloc(pool, &b, 4 * MIB, NULL), GP_OK); /* extends that free MiB: b at 3-7 MiB */
    cr_assert_eq(gp_free(pool, a, NULL), GP_OK);             /* page 0 wholly free, page 1 shared with b */
    cr_assert_eq(gp_alloc(pool, &c, 6 * MIB, NULL), GP_OK);  /* grows at the end */
    k = composition(pool);
    assert_adds_up(pool, &k);
    cr_assert_eq(k.large.allocated_bytes, 10 * MIB);
    cr_assert_geq(k.large.free_whole_bytes, 2 * MIB, "page 0 holds nothing live");
    cr_assert_eq(k.large.free_whole_bytes % (2 * MIB), 0u, "whole free memory comes in pages");
    cr_assert_geq(k.large.free_in_used_bytes, 1 * MIB, "the free MiB of page 1, beside b");
    cr_assert_eq(gp_free(pool, b, NULL), GP_OK);
    cr_assert_eq(gp_free(pool, c, NULL), GP_OK);
    gp_pool_destroy(pool, NULL);
}

/* Recording walks the pool under its locks and changes nothing it decides: the same calls give the
 * same addresses, peaks and device calls with it on and off. */
static void neutral_on(const char *backend)
{
    enum { SLOTS = 64, STEPS = 6000 };
    char conf[2][64];
    snprintf(conf[0], sizeof conf[0], "device_memory:2GiB");
    snprintf(conf[1], sizeof conf[1], "device_memory:2GiB,peak_composition:on");
    uintptr_t trail[2][STEPS];
    gp_stats end[2];
    uint64_t calls[2];
    for (int run = 0; run < 2; run++) {
        gp_pool *pool = open_pool(backend, conf[run]);
        gp_sim *sim = gp_sim_of(pool);
        gp_stream s[2] = {NULL, gp_sim_stream_create(sim)};
        void *live[SLOTS] = {0};
        int on[SLOTS] = {0};
        unsigned seed = 12345;
        for (int i = 0; i < STEPS; i++) {
            seed = seed * 1103515245u + 12345u;
            unsigned slot = (seed >> 8) % SLOTS;
            if (live[slot] != NULL) {
                cr_assert_eq(gp_free(pool, live[slot], s[on[slot]]), GP_OK, "%s", gp_last_error());
                live[slot] = NULL;
                trail[run][i] = 0;
            } else {
                size_t sizes[] = {700, 6 * KIB, 300 * KIB, 3 * MIB, 9 * MIB, 25 * MIB};
                size_t size = sizes[(seed >> 20) % 6] + (seed >> 12) % 4096;
                on[slot] = (int)((seed >> 28) & 1);
                cr_assert_eq(gp_alloc(pool, &live[slot], size, s[on[slot]]), GP_OK, "%s", gp_last_error());
                trail[run][i] = (uintptr_t)live[slot];
            }
        }
        for (int k = 0; k < SLOTS; k++)
            if (live[k] != NULL)
                cr_assert_eq(gp_free(pool, live[k], s[on[k]]), GP_OK);
        end[run] = (gp_stats){.size = sizeof end[run], .version = GP_STATS_VERSION};
        cr_assert_eq(gp_get_stats(pool, &end[run]), GP_OK);
        calls[run] = gp_sim_calls(sim, GP_SIM_CALL_ALL);
        if (run == 1) {
            gp_peak_composition k = composition(pool);
            assert_adds_up(pool, &k);
        }
        gp_pool_destroy(pool, NULL);
    }
    cr_assert_arr_eq(trail[0], trail[1], sizeof trail[0], "%s: the same blocks with recording on", backend);
    cr_assert_eq(end[0].reserved_bytes_peak, end[1].reserved_bytes_peak);
    cr_assert_eq(end[0].num_device_allocs, end[1].num_device_allocs);
    cr_assert_eq(calls[0], calls[1]);
}

Test(peak, recording_changes_no_decision_sim)
{
    neutral_on("sim");
}

Test(peak, recording_changes_no_decision_sim_vmm)
{
    neutral_on("sim-vmm");
}

Test(peak, reset_peaks_forgets_it_and_the_next_raise_records)
{
    gp_pool *pool = open_pool("sim", "device_memory:1GiB,peak_composition:on");
    void *a, *b;
    cr_assert_eq(gp_alloc(pool, &a, 30 * MIB, NULL), GP_OK);
    cr_assert_eq(composition(pool).recorded, 1u);
    cr_assert_eq(gp_reset_peaks(pool), GP_OK);
    cr_assert_eq(composition(pool).recorded, 0u);
    cr_assert_eq(gp_alloc(pool, &b, 40 * MIB, NULL), GP_OK);
    gp_peak_composition k = composition(pool);
    assert_adds_up(pool, &k);
    cr_assert_eq(k.request_bytes, 40 * MIB);
    char json[16384];
    cr_assert_eq(gp_stats_json(pool, json, sizeof json, NULL), GP_OK);
    cr_assert_not_null(strstr(json, "\"peak_composition\":{\"recorded\":true,\"unit\":\"segment\""), "%s", json);
    cr_assert_eq(gp_free(pool, a, NULL), GP_OK);
    cr_assert_eq(gp_free(pool, b, NULL), GP_OK);
    gp_pool_destroy(pool, NULL);
}

/* A resume maps a paused tenant's pages back: when that raises the peak, it is recorded (request 0). */
Test(peak, a_resume_that_raises_the_peak_is_recorded)
{
    gp_pool *pool = open_pool("sim-vmm", "device_memory:1GiB,peak_composition:on");
    cr_assert_eq(gp_tenant_create(pool, "m", NULL), GP_OK, "%s", gp_last_error());
    cr_assert_eq(gp_tenant_push(pool, "m"), GP_OK);
    void *a;
    cr_assert_eq(gp_alloc(pool, &a, 40 * MIB, NULL), GP_OK);
    cr_assert_eq(gp_tenant_pop(pool), GP_OK);
    cr_assert_eq(gp_tenant_pause(pool, "m", 0), GP_OK, "%s", gp_last_error());
    cr_assert_eq(gp_reset_peaks(pool), GP_OK); /* the peak is now what a paused pool holds */
    cr_assert_eq(gp_tenant_resume(pool, "m"), GP_OK, "%s", gp_last_error());
    gp_peak_composition k = composition(pool);
    assert_adds_up(pool, &k);
    cr_assert_eq(k.request_bytes, 0u);
    cr_assert_eq(k.large.allocated_bytes, 40 * MIB);
    cr_assert_eq(gp_free(pool, a, NULL), GP_OK);
    gp_pool_destroy(pool, NULL);
}

Test(peak, bad_arguments_are_refused)
{
    gp_pool *pool = open_pool("sim", "device_memory:1GiB,peak_composition:on");
    cr_assert_eq(gp_get_peak_composition(pool, NULL), GP_ERR_INVALID);
    gp_peak_composition c = {.size = sizeof c, .version = GP_PEAK_COMPOSITION_VERSION + 1};
    cr_assert_eq(gp_get_peak_composition(pool, &c), GP_ERR_INVALID);
    cr_assert_not_null(strstr(gp_last_error(), "version"), "%s", gp_last_error());
    c = (gp_peak_composition){.size = sizeof c - 8, .version = GP_PEAK_COMPOSITION_VERSION};
    cr_assert_eq(gp_get_peak_composition(pool, &c), GP_ERR_INVALID);
    cr_assert_eq(gp_get_peak_composition(NULL, &c), GP_ERR_INVALID);
    gp_pool_destroy(pool, NULL);
    c = (gp_peak_composition){.size = sizeof c, .version = GP_PEAK_COMPOSITION_VERSION};
    cr_assert_eq(gp_get_peak_composition(pool, &c), GP_ERR_DESTROYED);
}
