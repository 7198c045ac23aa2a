/*
 * lock_order.c — the run-time check of the lock order (lock_order.h), in builds with assertions.
 *
 * Each thread keeps the ranked locks it holds in a fixed array, in the order taken. Invariant: every
 * entry is a lock this thread holds, and each was taken, blocking, only after the ones of a lower rank
 * (or lower stream index) before it, or by trylock. A thread holds at most every stream lock of a pool
 * at once (gp_lock_all_streams: up to max_streams, 65536): past the array's room, locks are counted,
 * not recorded, and the check then sees only the first GP_ORDER_ROOM.
 */
#include "base/lock_order.h"

#ifndef NDEBUG
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define GP_ORDER_ROOM 512

typedef struct {
    unsigned rank, sub;
} held_lock;

static _Thread_local held_lock held[GP_ORDER_ROOM];
static _Thread_local unsigned held_count, held_unrecorded;

bool gp_order_on;

/* At load, before any pool exists, so before any lock is held: turning the record on later could see
 * a release of a lock taken unrecorded. */
__attribute__((constructor)) static void read_switch(void)
{
    const char *v = getenv("GPUPOOL_CHECK_LOCK_ORDER");
    gp_order_on = v != NULL && strcmp(v, "1") == 0;
}

/* The lock's name as the README's lock order says it ("the lock of stream 3"), in `buf`. */
static const char *lock_name(char *buf, size_t len, unsigned rank, unsigned sub)
{
    if (rank == GP_RANK_STREAM)
        snprintf(buf, len, "the lock of stream %u", sub);
    else
        snprintf(buf, len, "%s",
                 rank == GP_RANK_POOL           ? "the pool lock"
                 : rank == GP_RANK_THREAD_CACHE ? "a thread cache's lock"
                 : rank == GP_RANK_EVENT_POOL   ? "the event pool's lock"
                                                : "an unknown lock");
    return buf;
}

void gp_order_record(gp_lock_rank rank, unsigned sub)
{
    if (held_count == GP_ORDER_ROOM) {
        held_unrecorded++;
        return;
    }
    held[held_count++] = (held_lock){(unsigned)rank, sub};
}

void gp_order_check_and_record(gp_lock_rank rank, unsigned sub)
{
    for (unsigned i = 0; i < held_count; i++) {
        const held_lock *h = &held[i];
        if (h->rank < (unsigned)rank || (rank == GP_RANK_STREAM && h->rank == GP_RANK_STREAM && h->sub < sub))
            continue;
        char taking[40], holding[40];
        fprintf(stderr,
                "gpupool: lock order broken: taking %s while holding %s (pool/README.md, \"Lock order\": the "
                "pool lock, stream locks by ascending index, a thread cache's, the event pool's)\n",
                lock_name(taking, sizeof taking, rank, sub), lock_name(holding, sizeof holding, h->rank, h->sub));
        abort();
    }
    gp_order_record(rank, sub);
}

void gp_order_forget(gp_lock_rank rank, unsigned sub)
{
    for (unsigned i = held_count; i-- > 0;) {
        if (held[i].rank != (unsigned)rank || held[i].sub != sub)
            continue;
        for (unsigned j = i + 1; j < held_count; j++)
            held[j - 1] = held[j];
        held_count--;
        return;
    }
    if (held_unrecorded > 0) {
        held_unrecorded--;
        return;
    }
    char name[40];
    fprintf(stderr, "gpupool: releasing %s, which this thread does not hold\n",
            lock_name(name, sizeof name, rank, sub));
    abort();
}

unsigned gp_order_held(void)
{
    return held_count + held_unrecorded;
}
#endif
