/*
 * alias_small.c — a stream's small heap grown by aliasing free pages of its large ranges (small
 * stitched ranges): which page is lent, idle slots reused, pages going home when their small blocks
 * are all freed (gp_alias_settle), kept by the small heap when the large heap must grow, and recalled
 * before another stream takes the range. The why is below; alias.h states the invariants, which hold
 * for these ranges as for any stitched range.
 */
#include <assert.h>
#include <stdlib.h>

#include "base/error.h"
#include "provider/alias_internal.h"
#include "provider/provider.h"

/* ---- small ranges grown by aliasing ----------------------------------------------------------- */

/*
 * Why. Requests up to small_size go to a stream's small heap, whose ranges grow a page at a time. A
 * training or serving step asks for small buffers (statistics, scalars, index tensors) while its large
 * buffers come and go, and so the small heap often needs its next page at a moment when the large
 * heap holds whole free pages between its peaks. A new page there raises reserved memory by a page
 * that the pool already has, idle. Serving small requests from the large heap's blocks pins the
 * large heap's fragments for as long as the small blocks live, and moving a free page from the large
 * heap to the small one takes it away for good, although the large heap needs it again at its peak.
 *
 * How. The small heap grows by an ALIAS of such a page instead: the page is mapped a second time, in
 * a small stitched range of the same stream (small and stitched), and its home goes SHADOW while the
 * small heap uses the alias, exactly as for a stitched block (alias.h). When every small block in that
 * page has been freed and coalesced (one FREE block covers the page: nothing in it is live, pending,
 * quick-listed or lent to a thread cache, as those are blocks of their own), the roles swap back with
 * no device call (gp_alias_settle): the alias becomes an idle SHADOW slot, which is on no free
 * list, and the home is FREE in the large heap again, for its peak. The small heap's next growth first
 * looks for an idle slot whose home is free (no map call), and aliases a new page only when none is.
 * Memory is counted once, at home, so reserved memory does not rise.
 *
 * Which page. The last page of a free block that ends where its large range's mapped memory ends (an
 * UNMAPPED block follows it: the range's growth frontier), the smallest such block first. The lent
 * page then costs the large range nothing it would not have had to grow anyway: if the small page is
 * wholly free again before the large heap needs the page, it goes home and the pool saved a page; if
 * it is still in use when the large heap must make memory (a miss after its own heap, stitched ranges,
 * stealing and borrowing), the page becomes the small range's own (gp_alias_small_keep: its home is
 * unmapped, leaving an UNMAPPED block that merges with the frontier), and the large range grows in
 * place exactly as if the small heap had grown by a new page of its own: the pool ends where it would
 * have without aliasing. A page from a hole in the middle of a large range has no such exit: unmapped
 * at home, it leaves a hole that growth in place rarely fits, and while lent it splits the free memory
 * around it (measured: resnet18_train_b8 1.035 -> 1.040-1.052 with pages of the smallest holes).
 *
 * Streams. Loans are made only while the pool serves one stream. Where several streams share it,
 * memory moves between them (a stream takes another's unused range, borrows its idle blocks, and the
 * cache cap moves free pages to where the demand is), and a range tied to its owner's small heap by a
 * loan cannot move while the loan lasts (homes and aliases share one stream, alias.h); measured on the
 * multistream workloads, loans made there cost more than they saved (a held-out serving mix 1.053 ->
 * 1.074). Loans made before a second stream came end when another stream would take the range
 * (gp_alias_small_recall, from gp_vmm_steal_range in provider/vmm_streams.c).
 *
 * Bounds. A stream's small alias slots never exceed the mapped pages of its ordinary large ranges (as
 * for stitched ranges: each slot is a page-table entry and host metadata); past that the small heap
 * grows as before.
 */

/* True when home h (of a small stitched range: st's own) is free now and held for no other stream. */
static bool home_is_free(const gp_pool_state *p, gp_alias_home h)
{
    return h.seg != NULL && !h.seg->paused && holder_of(h) == NULL && page_is_free(p, h.seg, home_va(p, h));
}

/* True for a small stitched range of st that the small heap may use. */
static bool small_alias_range(const gp_segment *seg, const gp_stream_state *st)
{
    return seg->owner == st && seg->small && seg->stitched && !seg->paused && seg->pages != NULL;
}

/* The idle alias slot at va of small stitched range r (SHADOW, its home free) becomes FREE memory of
 * st's small heap (st locked); its home goes SHADOW. False, with nothing changed, when host memory is
 * out. */
static bool lend_slot(gp_pool_state *p, gp_stream_state *st, gp_segment *r, uintptr_t va)
{
    gp_block *spare[4];
    size_t have = 0;
    while (have < 4 && (spare[have] = gp_block_new(&st->blocks)) != NULL)
        have++;
    bool ok = have == 4;
    if (ok) {
        gp_alias_home h = r->homes[gp_page_index(p, r, va)];
        gp_alias_shadow_home(p, h.seg, home_va(p, h), spare, &have);
        gp_block *slot = gp_pages_carve(NULL, gp_pages_block_at(r, va), va, p->page, spare, &have);
        slot->free_seq = gp_heap_free_stamp(gp_heap_of(st, true));
        gp_heap_release(gp_heap_of(st, true), &st->blocks, slot)->free_since =
            atomic_load_explicit(&p->coarse_now, memory_order_relaxed);
        r->last_used = ++p->alias_clock;
    }
    while (have > 0)
        gp_block_recycle(&st->blocks, spare[--have]);
    return ok;
}

/* An idle slot of st's small stitched ranges whose home is free, lent to the small heap; st locked. */
static bool reuse_slot(gp_pool_state *p, gp_stream_state *st)
{
    for (gp_segment *r = p->segments_head; r != NULL; r = r->next) {
        if (!small_alias_range(r, st) || r->aliased == 0)
            continue;
        for (gp_block *b = r->first; b != NULL; b = b->next) {
            if (b->state != GP_BLOCK_SHADOW)
                continue;
            for (uintptr_t va = b->addr; va < b->addr + b->size; va += p->page)
                if (home_is_free(p, r->homes[gp_page_index(p, r, va)]))
                    return lend_slot(p, st, r, va);
        }
    }
    return false;
}

/* The last page of the smallest FREE block of st's ordinary large ranges that ends where the range's
 * mapped memory does (an UNMAPPED block follows it), when it is a whole page with no alias; false when
 * no range has one. st locked. */
static bool frontier_page(const gp_pool_state *p, const gp_stream_state *st, candidate *out)
{
    bool found = false;
    for (gp_segment *seg = p->segments_head; seg != NULL; seg = seg->next) {
        if (!home_range(seg, st))
            continue;
        for (const gp_block *b = seg->first; b != NULL; b = b->next) {
            if (b->size < p->page || b->state != GP_BLOCK_FREE || b->next == NULL ||
                b->next->state != GP_BLOCK_UNMAPPED || (found && b->size >= out->block_size))
                continue;
            uintptr_t last = b->addr + b->size - p->page; /* the UNMAPPED block after b starts on a page */
            size_t i = gp_page_index(p, seg, last);
            /* a page with no alias yet: one already aliased by the small heap is reused (reuse_slot), and
             * one of a stitched range or another stream's loan keeps the one alias it has */
            if ((last - seg->addr) % p->page == 0 && (seg->alias_count == NULL || seg->alias_count[i] == 0)) {
                *out = (candidate){seg, i, b->size, false};
                found = true;
            }
        }
    }
    return found;
}

/* A small stitched range of st with an UNMAPPED block, preferably one right after a FREE block (the new
 * slot then extends it); a new one is reserved when none has room. NULL on failure. st locked. */
static gp_block *slot_spot(gp_pool_state *p, gp_stream_state *st)
{
    gp_block *spot = NULL;
    for (gp_segment *r = p->segments_head; r != NULL; r = r->next) {
        if (!small_alias_range(r, st))
            continue;
        for (gp_block *b = r->first; b != NULL; b = b->next)
            if (b->state == GP_BLOCK_UNMAPPED &&
                (spot == NULL || (b->prev != NULL && b->prev->state == GP_BLOCK_FREE)))
                spot = b;
    }
    if (spot != NULL)
        return spot;
    size_t want = p->cfg.vmm_reserve != 0 ? p->cfg.vmm_reserve : p->device_total;
    want = gp_round_up(want, p->page);
    gp_segment *r = gp_segment_new();
    if (r == NULL)
        return NULL;
    r->pages = calloc(want / p->page, sizeof *r->pages);
    r->homes = calloc(want / p->page, sizeof *r->homes);
    gp_devptr va = 0;
    if (r->pages == NULL || r->homes == NULL || p->ops->va_reserve(p->ctx, want, &va) != GP_OK) {
        free(r->pages);
        free(r->homes);
        gp_segment_discard(r);
        return NULL;
    }
    gp_segment_place(p, r, st, va, want, true, 0, GP_BLOCK_UNMAPPED);
    r->stitched = true;
    return r->first;
}

/* Maps the free page c of st's large ranges at a new alias slot of st's small stitched ranges and
 * lends it to the small heap; false with nothing lost when a map or host allocation fails (the slot's
 * range stays, empty, for the next time or release_empty_ranges). st locked. */
static bool new_slot(gp_pool_state *p, gp_stream_state *st, candidate c)
{
    if (c.seg->alias_count == NULL &&
        (c.seg->alias_count = calloc(c.seg->size / p->page, sizeof *c.seg->alias_count)) == NULL)
        return false;
    gp_block *u = slot_spot(p, st);
    gp_block *rest = gp_block_new(&st->blocks);
    if (u == NULL || rest == NULL) {
        if (rest != NULL)
            gp_block_recycle(&st->blocks, rest);
        return false;
    }
    gp_segment *r = u->segment;
    gp_phys handle = c.seg->pages[c.index];
    size_t mapped = 0;
    (void)gp_pages_map_run(p, u->addr, &handle, 1, &mapped); /* a failure: nothing mapped, nothing lost */
    atomic_fetch_add(&p->num_maps, mapped);
    if (mapped == 0) {
        gp_block_recycle(&st->blocks, rest);
        return false;
    }
    if (u->size > p->page)
        gp_pages_split(u, p->page, rest);
    else
        gp_block_recycle(&st->blocks, rest);
    u->state = GP_BLOCK_SHADOW;
    u->free_seq = 0; /* a slot no work has used here since it was mapped */
    size_t j = gp_page_index(p, r, u->addr);
    r->pages[j] = handle;
    r->homes[j] = (gp_alias_home){c.seg, c.index};
    c.seg->alias_count[c.index]++;
    c.seg->aliased++;
    r->aliased++;
    return lend_slot(p, st, r, u->addr);
}

gp_block *gp_alias_small_grow(gp_pool_state *p, gp_stream_state *st, size_t rsize, size_t size)
{
    if (atomic_load(&p->streams.count) > 1) /* loans tie ranges to one stream: see Streams above */
        return NULL;
    gp_stream_lock(st);
    bool lent = reuse_slot(p, st);
    if (!lent) {
        size_t slots = 0, pages = 0;
        for (gp_segment *seg = p->segments_head; seg != NULL; seg = seg->next) {
            if (home_range(seg, st))
                pages += seg->mapped_bytes / p->page;
            else if (small_alias_range(seg, st))
                slots += seg->aliased;
        }
        candidate c = {NULL, 0, 0, false};
        lent = slots < pages && frontier_page(p, st, &c) && new_slot(p, st, c);
    }
    gp_stream_unlock(st);
    return lent ? gp_provider_take(p, st, NULL, true, rsize, size) : NULL;
}

bool gp_alias_settle(gp_pool_state *p, gp_stream_state *owner, gp_block *m)
{
    gp_segment *r = m->segment;
    assert(r->stitched && r->owner == owner && m->state == GP_BLOCK_FREE);
    if (r->aliased == 0)
        return false;
    bool changed = false;
    uintptr_t end = r->addr + (m->addr + m->size - r->addr) / p->page * p->page;
    for (uintptr_t va = r->addr + gp_div_up(m->addr - r->addr, p->page) * p->page; va < end;) {
        size_t j = gp_page_index(p, r, va);
        if (r->homes[j].seg == NULL) {
            va += p->page;
            continue;
        }
        size_t n = 1;
        while (va + n * p->page < end && r->homes[j + n].seg != NULL)
            n++;
        gp_block *spare[2] = {gp_block_new(&owner->blocks), gp_block_new(&owner->blocks)};
        size_t left = 2;
        if (spare[0] != NULL && spare[1] != NULL) { /* else the pages stay in use here: correct, only held */
            gp_heap *heap = gp_heap_of(owner, r->small);
            gp_heap_remove(heap, m);
            gp_block *mid = gp_pages_carve(heap, m, va, n * p->page, spare, &left);
            uint64_t now = atomic_load_explicit(&p->coarse_now, memory_order_relaxed);
            for (size_t k = 0; k < n; k++)
                gp_alias_swap_home_back(p, owner, r, j + k, now);
            mid->state = GP_BLOCK_SHADOW;
            gp_pages_merge(&owner->blocks, mid);
            changed = true;
        }
        while (left > 0)
            if (spare[--left] != NULL)
                gp_block_recycle(&owner->blocks, spare[left]);
        va += n * p->page;
        if (va >= end)
            break;
        m = gp_pages_block_at(r, va);
        if (m->state != GP_BLOCK_FREE)
            break;
    }
    return changed;
}

void gp_alias_small_reclaim(gp_pool_state *p, gp_stream_state *st)
{
    for (gp_segment *r = p->segments_head; r != NULL; r = r->next) {
        if (!small_alias_range(r, st) || r->aliased == 0)
            continue;
        for (bool again = true; again;) {
            again = false;
            for (gp_block *b = r->first; b != NULL && !again; b = b->next)
                if (b->size >= p->page && b->state == GP_BLOCK_FREE)
                    again = gp_alias_settle(p, st, b);
        }
    }
}

bool gp_alias_small_lent(const gp_pool_state *p, const gp_stream_state *st)
{
    for (const gp_segment *r = p->segments_head; r != NULL; r = r->next)
        if (small_alias_range(r, st) && r->aliased > 0)
            return true;
    return false;
}

void gp_alias_small_keep(gp_pool_state *p, gp_stream_state *st)
{
    gp_stream_lock(st);
    for (gp_segment *r = p->segments_head; r != NULL; r = r->next) {
        if (!small_alias_range(r, st) || r->aliased == 0)
            continue;
        for (size_t j = 0; j < r->size / p->page && r->aliased > 0; j++) {
            gp_alias_home h = r->homes[j];
            if (h.seg == NULL || gp_pages_block_at(r, r->addr + j * p->page)->state == GP_BLOCK_SHADOW)
                continue;
            /* the home's other alias slots are idle (it is in use here): unmapped first, so that the
             * page keeps one address once its home is unmapped */
            bool dropped = true;
            for (gp_segment *o = p->segments_head; o != NULL && dropped && h.seg->alias_count[h.index] > 1;
                 o = o->next) {
                if (!o->stitched || o->owner != st || o->aliased == 0)
                    continue;
                for (size_t k = 0; k < o->size / p->page && dropped; k++)
                    if ((o != r || k != j) && o->homes[k].seg == h.seg && o->homes[k].index == h.index)
                        dropped = gp_alias_drop_slots(p, o, k, 1) == GP_OK;
            }
            if (dropped && h.seg->alias_count[h.index] == 1)
                (void)gp_alias_own_page(p, r, j, st); /* a failure leaves it lent: nothing lost */
        }
    }
    gp_stream_unlock(st);
}

/* How many of the alias slots of the ordinary range seg lie in small stitched ranges. */
static size_t small_slots_of(const gp_pool_state *p, const gp_segment *seg)
{
    size_t n = 0;
    for (const gp_segment *r = p->segments_head; r != NULL; r = r->next) {
        if (!r->stitched || !r->small || r->owner != seg->owner || r->aliased == 0)
            continue;
        for (size_t j = 0; j < r->size / p->page; j++)
            n += r->homes[j].seg == seg;
    }
    return n;
}

bool gp_alias_small_only_loans(const gp_pool_state *p, const gp_segment *seg)
{
    if (seg->aliased != small_slots_of(p, seg))
        return false;
    for (const gp_block *b = seg->first; b != NULL; b = b->next)
        if (b->state != GP_BLOCK_FREE && b->state != GP_BLOCK_UNMAPPED && b->state != GP_BLOCK_SHADOW)
            return false;
    return true;
}

bool gp_alias_small_recall(gp_pool_state *p, gp_segment *seg)
{
    if (seg->aliased == 0)
        return true;
    if (seg->aliased != small_slots_of(p, seg))
        return false;
    /* idle slots first, so that a page in use at its slot has no other alias when it is owned there */
    for (int in_use = 0; in_use < 2; in_use++) {
        for (gp_segment *r = p->segments_head; r != NULL && seg->aliased > 0; r = r->next) {
            if (!r->stitched || !r->small || r->owner != seg->owner || r->aliased == 0)
                continue;
            for (size_t j = 0; j < r->size / p->page; j++) {
                gp_alias_home h = r->homes[j];
                if (h.seg != seg)
                    continue;
                bool idle = gp_pages_block_at(r, r->addr + j * p->page)->state == GP_BLOCK_SHADOW;
                if (idle && !in_use && gp_alias_drop_slots(p, r, j, 1) != GP_OK)
                    return false;
                /* r's owner is seg's, whose lock the caller holds: gp_alias_own_page waits for its fence */
                if (!idle && in_use &&
                    (h.seg->alias_count[h.index] != 1 || gp_alias_own_page(p, r, j, seg->owner) != GP_OK))
                    return false;
            }
        }
    }
    return seg->aliased == 0;
}
