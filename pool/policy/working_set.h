/*
 * working_set.h — the decision behind empty_cache:working-set (torch.cuda.empty_cache() without
 * churn): which cached memory no one in the pool is likely to use again.
 *
 * People call empty_cache() once per step of a loop. Memory the loop uses again in its next steps is
 * memory it will ask the device for again if it is given back now (PyTorch's empty_cache gives every
 * free segment back, so every step pays for device calls again). Within one pool, other tenants reuse
 * a tenant's cache without a device call, so emptying to the device helps nobody there. What is
 * worth giving back is cached memory that was not used during the last GP_WORKING_SET_CALLS intervals
 * between calls: the loop's steps no longer need it (a phase that shrank, a one-off spike). Memory
 * freed again in any of those intervals is the loop's working set and stays.
 *
 * Two backends, two measures of "used". With cudaMalloc segments a segment is reusable only whole and
 * only by requests that fit its free blocks, so what matters is which segments were used: a segment
 * that no free touched during the window goes back (by age, the stamps below). On virtual memory
 * backends free pages are fungible (any of them can be mapped, or stitched, where a request needs
 * it), and freed neighbours coalesce into blocks that look freshly freed, so what matters is how many
 * bytes the window needed: the highest allocated bytes of the window times what the workload has
 * shown it needs per allocated byte (the reserved over allocated bytes of the last interval in which
 * the pool had to grow: its heaps' layout, not a constant; at least 1 + cache_slack). Cached pages
 * beyond that go back (by size). A steady loop keeps exactly what it grew to; a loop that shrinks
 * gives back in proportion; one that then needs more grows once and its new ratio is kept.
 *
 * GP_WORKING_SET_CALLS is a design constant, not a fitted one: it lets a loop cycle through up to
 * that many kinds of step between calls (train, eval, checkpoint, ...) without churn, and bounds how
 * many calls it takes for memory a loop stopped using to go back.
 *
 * Time is the pool's clock (ns). Frees stamp blocks with the pool's coarse clock, which each call
 * advances (strictly), so a block freed in interval j carries a stamp >= the time of call j.
 * Invariant: count <= GP_WORKING_SET_CALLS; calls[] holds the last `count` call times, increasing.
 */
#ifndef GP_POLICY_WORKING_SET_H
#define GP_POLICY_WORKING_SET_H

#include <stddef.h>
#include <stdint.h>

#define GP_WORKING_SET_CALLS 8u

typedef struct gp_working_set {
    uint64_t calls[GP_WORKING_SET_CALLS]; /* ring of call times */
    size_t peaks[GP_WORKING_SET_CALLS];   /* allocated peak of the interval each call ended */
    unsigned count, next;
    double need_ratio;                    /* reserved / allocated peak of the last interval that grew */
    uint64_t growth_seen;                 /* the pool's growth counter at the last call */
} gp_working_set;

/*
 * Records a call at time `now` (> every earlier call's). Returns the stamp below which cached memory
 * was not freed during the last GP_WORKING_SET_CALLS intervals (memory freed before the oldest of the
 * calls that began them): what may go back. 0 (nothing) until that many intervals have been seen.
 */
uint64_t gp_working_set_call(gp_working_set *ws, uint64_t now, size_t interval_peak);

/* Tells the window what the interval just ended cost: the pool's growth counter (maps, device
 * allocations) and its reserved bytes now; an interval that grew sets need_ratio. */
void gp_working_set_note_growth(gp_working_set *ws, uint64_t growth, size_t reserved, size_t interval_peak);

/* The highest allocated bytes of the intervals in the window (the interval just recorded included). */
size_t gp_working_set_bytes(const gp_working_set *ws);

/* Cached bytes to keep on a virtual memory backend: max(1 + slack, need_ratio) x the window's bytes,
 * less what is allocated now (slack < 0, "off", counts as 0); SIZE_MAX (keep all) until the window is
 * full. */
size_t gp_working_set_keep(const gp_working_set *ws, double slack, size_t allocated);

#endif /* GP_POLICY_WORKING_SET_H */
