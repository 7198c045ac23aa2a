/*
 * alias.c — stitching by aliasing: stitched ranges whose pages are free pages of ordinary ranges
 * mapped a second time (the stream's own, and with loans:on other idle streams' of its tenant);
 * handing them out and back by swapping which address is in use (SHADOW blocks), lending, parking and
 * reclaiming other streams' pages, making and repairing stitched ranges, and undoing them (alias.h
 * says why and states the invariants). The small heap's stitched ranges are alias_small.c's; what
 * the two share is alias_internal.h.
 */
#include <assert.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "provider/alias_internal.h"
#include "provider/provider.h"

/* ---- swapping the address in use --------------------------------------------------------------- */

/* Cuts the page at va out of its FREE block in home range seg (its owner locked) into a SHADOW block
 * of its own, using up to two structs from spare[] (*nspare counts down). */
void gp_alias_shadow_home(gp_pool_state *p, gp_segment *seg, uintptr_t va, gp_block **spare, size_t *nspare)
{
    gp_block *b = gp_pages_block_at(seg, va);
    assert(b->state == GP_BLOCK_FREE && b->addr <= va && va + p->page <= b->addr + b->size);
    gp_heap *heap = gp_heap_of(seg->owner, false);
    gp_heap_remove(heap, b);
    gp_pages_carve(heap, b, va, p->page, spare, nspare)->state = GP_BLOCK_SHADOW;
}

/* The SHADOW home page at va (its owner locked) becomes FREE again, coalesced with its free neighbours. */
static void unshadow_home(gp_pool_state *p, gp_segment *seg, uintptr_t va, uint64_t now)
{
    gp_stream_state *owner = seg->owner;
    gp_block *b = gp_pages_block_at(seg, va);
    assert(b->state == GP_BLOCK_SHADOW && b->addr == va && b->size == p->page);
    (void)p;
    b->free_seq = gp_heap_free_stamp(gp_heap_of(owner, false)); /* used at its alias until now */
    gp_heap_release(gp_heap_of(owner, false), &owner->blocks, b)->free_since = now;
}

/* `want` block structs from st's cache (st locked) in a new array; NULL when host memory is out
 * (nothing taken). */
static gp_block **take_spares(gp_stream_state *st, size_t want)
{
    gp_block **spare = malloc((want ? want : 1) * sizeof *spare);
    size_t have = 0;
    while (spare != NULL && have < want && (spare[have] = gp_block_new(&st->blocks)) != NULL)
        have++;
    if (spare != NULL && have < want) {
        while (have > 0)
            gp_block_recycle(&st->blocks, spare[--have]);
        free(spare);
        spare = NULL;
    }
    return spare;
}

static void give_spares(gp_stream_state *st, gp_block **spare, size_t have)
{
    while (have > 0)
        gp_block_recycle(&st->blocks, spare[--have]);
    free(spare);
}

/* What activate changed for one foreign page, so that it can be undone. */
typedef struct lent_page {
    size_t j;               /* page index in the stitched range */
    gp_stream_state *from;  /* the holder it was parked with, or NULL: it was FREE at home */
    uint64_t parked_seq;    /* from's: the loan's parked_seq */
} lent_page;

/* Undoes lend_homes: a page taken FREE is FREE at home again, one taken from a holder is parked
 * there again; neither was used meanwhile. Pool lock held, no stream lock. */
static void unlend(gp_pool_state *p, gp_segment *r, const lent_page *lent, size_t count)
{
    uint64_t now = atomic_load_explicit(&p->coarse_now, memory_order_relaxed);
    for (size_t k = 0; k < count; k++) {
        gp_alias_home h = r->homes[lent[k].j];
        gp_alias_loan *l = loan_of(h);
        gp_stream_state *lock = lent[k].from != NULL ? lent[k].from : h.seg->owner;
        gp_stream_lock(lock);
        if (lent[k].from != NULL) {
            *l = (gp_alias_loan){lent[k].from, false, lent[k].parked_seq};
            lent[k].from->parked_bytes += p->page;
        } else {
            unshadow_home(p, h.seg, home_va(p, h), now);
            *l = (gp_alias_loan){NULL, false, 0};
            h.seg->loans_held--;
        }
        gp_stream_unlock(lock);
    }
}

/*
 * Lends st the foreign homes of r's pages [first, first + n) that st does not hold yet, one stream
 * locked at a time: a home FREE in its owner's heap, once the owner's work on it is done (its fence
 * covers the page's block: gp_stream_done_upto; nothing it queued before freeing the page can still
 * use it), becomes SHADOW there; a home parked with another holder passes to st once that holder's
 * fence covers the page's parking. Either way st holds it, in use
 * (active). Their indices go to lent[] (*count). false, with nothing lent, when a home is in use, a
 * stream is busy, or host memory is out. Pool lock held, no stream lock.
 */
static bool lend_homes(gp_pool_state *p, gp_stream_state *st, gp_segment *r, size_t first, size_t n,
                       lent_page *lent, size_t *count)
{
    *count = 0;
    bool ok = true;
    for (size_t j = first; ok && j < first + n; j++) {
        gp_alias_home h = r->homes[j];
        if (!foreign_home(r, h) || loan_of(h)->holder == st)
            continue;
        gp_stream_state *from = loan_of(h)->holder; /* parked with another stream, or NULL: FREE */
        gp_stream_state *o = from != NULL ? from : h.seg->owner;
        /* every page of this block that the same stream gives, at once */
        gp_stream_lock(o);
        size_t mine = 0;
        uint64_t need = 0; /* o's free clock that its fence must have passed */
        for (size_t k = j; ok && k < first + n; k++) {
            gp_alias_home hk = r->homes[k];
            if (!foreign_home(r, hk) || loan_of(hk)->holder != from || (from == NULL && hk.seg->owner != o))
                continue;
            ok = from != NULL ? !loan_of(hk)->active : !hk.seg->paused && page_is_free(p, hk.seg, home_va(p, hk));
            uint64_t seq = !ok              ? 0
                           : from != NULL ? loan_of(hk)->parked_seq
                                          : gp_pages_block_at(hk.seg, home_va(p, hk))->free_seq;
            need = seq > need ? seq : need;
            mine++;
        }
        ok = ok && gp_stream_done_upto(p, o, need);
        gp_block **spare = ok && from == NULL ? take_spares(o, 2 * mine) : NULL;
        ok = ok && (from != NULL || spare != NULL);
        size_t left = from == NULL ? 2 * mine : 0;
        for (size_t k = j; ok && k < first + n; k++) {
            gp_alias_home hk = r->homes[k];
            if (!foreign_home(r, hk) || loan_of(hk)->holder != from || (from == NULL && hk.seg->owner != o))
                continue;
            uint64_t parked_seq = loan_of(hk)->parked_seq;
            if (from == NULL) {
                gp_alias_shadow_home(p, hk.seg, home_va(p, hk), spare, &left);
                hk.seg->loans_held++;
            } else {
                from->parked_bytes -= p->page;
            }
            *loan_of(hk) = (gp_alias_loan){st, true, 0};
            lent[(*count)++] = (lent_page){k, from, parked_seq};
        }
        if (spare != NULL)
            give_spares(o, spare, left);
        gp_stream_unlock(o);
    }
    if (!ok) {
        unlend(p, r, lent, *count);
        *count = 0;
    }
    return ok;
}

/*
 * Hands out the n pages from va of st's stitched range r, which lie in one SHADOW block, for a request
 * of `size` (rounded `rsize`, more than n - 1 pages) on st: foreign homes not held by st are lent first
 * (lend_homes), then, under st's lock, st's own homes (which must be free) become SHADOW, the foreign
 * ones parked with st active, and the pages in use: the request's rsize bytes LIVE, and the rest of the
 * last page a FREE block of st's large heap (alias.h: the last page's tail). NULL, with nothing
 * changed, when a home is in use, a stream is busy, or host memory is out. Pool lock held, st not
 * locked.
 */
static gp_block *activate(gp_pool_state *p, gp_stream_state *st, gp_segment *r, uintptr_t va, size_t n, size_t rsize,
                          size_t size)
{
    assert(rsize > (n - 1) * p->page && rsize <= n * p->page);
    size_t first = gp_page_index(p, r, va), count = 0;
    lent_page *lent = malloc(n * sizeof *lent);
    if (lent == NULL || !lend_homes(p, st, r, first, n, lent, &count)) {
        free(lent);
        return NULL;
    }
    gp_stream_lock(st);
    /* The block may have merged with neighbours freed meanwhile (gp_alias_release): found again. */
    gp_block *s = gp_pages_block_at(r, va), *out = NULL;
    size_t own = 0, parked = 0, in_use = 0;
    bool ok = s->state == GP_BLOCK_SHADOW && va + n * p->page <= s->addr + s->size;
    for (size_t j = first; ok && j < first + n; j++) {
        gp_alias_home h = r->homes[j];
        if (!foreign_home(r, h)) {
            ok = !h.seg->paused && holder_of(h) == NULL && page_is_free(p, h.seg, home_va(p, h));
            own++;
        } else {
            ok = loan_of(h)->holder == st;
            parked += !loan_of(h)->active;
            in_use += loan_of(h)->active;
        }
    }
    /* the foreign pages in use are the ones lent just now; one more is in use at another slot of st */
    ok = ok && in_use == count;
    size_t left = 2 * own + 3; /* two a home, two to carve the pages, one for the tail */
    gp_block **spare = ok && gp_block_map_reserve(&st->live) ? take_spares(st, left) : NULL;
    if (spare != NULL) {
        for (size_t j = first; j < first + n; j++) {
            gp_alias_home h = r->homes[j];
            if (!foreign_home(r, h))
                gp_alias_shadow_home(p, h.seg, home_va(p, h), spare, &left);
            else
                loan_of(h)->active = true;
        }
        st->parked_bytes -= parked * p->page;
        out = gp_pages_carve(NULL, s, va, n * p->page, spare, &left);
        if (out->size > rsize) {
            gp_block *tail = gp_pages_split(out, rsize, spare[--left]);
            tail->state = GP_BLOCK_FREE;
            /* its homes' earlier uses on st (or lent: over) are covered by st's fence from now on */
            tail->free_seq = gp_heap_free_stamp(gp_heap_of(st, false));
            tail->free_since = atomic_load_explicit(&p->coarse_now, memory_order_relaxed);
            gp_heap_insert(gp_heap_of(st, false), tail);
        }
        gp_hand_out(p, st, out, size);
        r->last_used = ++p->alias_clock;
        give_spares(st, spare, left);
    }
    gp_stream_unlock(st);
    if (out == NULL)
        unlend(p, r, lent, count);
    free(lent);
    return out;
}

/* Page j of owner's (locked) stitched range r, in use at r until now and no longer: own homes are FREE
 * again at once (one stream's order covers both addresses); a foreign home stays SHADOW, parked with
 * owner, until it uses the page again, or another stream takes it once owner's work is done
 * (lend_homes, gp_alias_reclaim): other streams' blocks are not touched on the free path. */
void gp_alias_swap_home_back(gp_pool_state *p, gp_stream_state *owner, gp_segment *r, size_t j, uint64_t now)
{
    gp_alias_home h = r->homes[j];
    if (!foreign_home(r, h)) {
        unshadow_home(p, h.seg, home_va(p, h), now);
        return;
    }
    gp_alias_loan *l = loan_of(h);
    assert(l->holder == owner && l->active);
    l->active = false;
    l->parked_seq = gp_heap_free_stamp(gp_heap_of(owner, false)); /* freed on owner, as a block is */
    owner->parked_bytes += p->page; /* cached memory: in use nowhere now */
}

bool gp_alias_release(gp_pool_state *p, gp_stream_state *owner, gp_block *b)
{
    gp_segment *r = b->segment;
    assert(r->stitched && r->owner == owner);
    if ((b->addr - r->addr) % p->page != 0 || b->size % p->page != 0 || r->aliased == 0)
        return false;
    size_t first = gp_page_index(p, r, b->addr), n = b->size / p->page;
    for (size_t j = 0; j < n; j++)
        if (r->homes[first + j].seg == NULL)
            return false; /* a page of its own (a pause made it so): an ordinary free */
    uint64_t now = atomic_load_explicit(&p->coarse_now, memory_order_relaxed);
    for (size_t j = 0; j < n; j++)
        gp_alias_swap_home_back(p, owner, r, first + j, now);
    b->state = GP_BLOCK_SHADOW;
    b->requested = 0;
    gp_block_drop_uses(b);
    gp_pages_merge(&owner->blocks, b);
    return true;
}

/* ---- taking and making stitched ranges --------------------------------------------------------- */

/* An idle stitched block of st that may serve a request: where, how large, and how many of its foreign
 * homes other streams must give (not parked with st). */
typedef struct idle_block {
    gp_segment *range;
    uintptr_t va;
    size_t size, unheld;
} idle_block;

static int fewer_checks_first(const void *a, const void *b)
{
    const idle_block *x = a, *y = b;
    if ((x->unheld > 0) != (y->unheld > 0))
        return x->unheld > 0 ? 1 : -1;
    if (x->size != y->size)
        return x->size < y->size ? -1 : 1;
    if (x->range != y->range)
        return x->range->serial < y->range->serial ? -1 : 1;
    return x->va < y->va ? -1 : (x->va > y->va);
}

gp_block *gp_alias_take(gp_pool_state *p, gp_stream_state *st, size_t rsize, size_t size)
{
    size_t n = gp_div_up(rsize, p->page), count = 0, cap = 0;
    idle_block *c = NULL;
    bool room = true;
    gp_stream_lock(st);
    for (gp_segment *r = p->segments_head; r != NULL && room; r = r->next) {
        if (!r->stitched || r->small || r->owner != st || r->paused || r->aliased < n)
            continue;
        for (gp_block *b = r->first; b != NULL; b = b->next) {
            if (b->state != GP_BLOCK_SHADOW || b->size < n * p->page)
                continue;
            /* st's own homes and what st holds are read here (st locked); the rest when lent */
            size_t first = gp_page_index(p, r, b->addr), unheld = 0;
            bool ok = true;
            for (size_t j = first; ok && j < first + n; j++) {
                gp_alias_home h = r->homes[j];
                if (h.seg == NULL || h.seg->paused)
                    ok = false;
                else if (!foreign_home(r, h))
                    ok = holder_of(h) == NULL && page_is_free(p, h.seg, home_va(p, h));
                else if (loan_of(h)->holder == st)
                    ok = !loan_of(h)->active;
                else
                    unheld++;
            }
            if (!ok)
                continue;
            if (count == cap) {
                size_t more = cap ? 2 * cap : 8;
                idle_block *grown = realloc(c, more * sizeof *c);
                if (grown == NULL) { /* host memory is out: the candidates found so far */
                    room = false;
                    break;
                }
                c = grown;
                cap = more;
            }
            c[count++] = (idle_block){r, b->addr, b->size, unheld};
        }
    }
    gp_stream_unlock(st);
    /* What st holds first (no other stream is touched), then the smallest block. */
    if (c != NULL && count > 1)
        qsort(c, count, sizeof *c, fewer_checks_first);
    gp_block *out = NULL;
    for (size_t k = 0; k < count && out == NULL; k++)
        out = activate(p, st, c[k].range, c[k].va, n, rsize, size);
    free(c);
    return out;
}

/* Unmaps the SHADOW pages of stitched range r in `runs` runs, run k the len[k] pages from page index
 * first[k] (owner locked; runs that do not overlap, each within one SHADOW block), after one wait for
 * the owner's queued uses of them (gp_pages_unmap_list): they become UNMAPPED and their homes lose an
 * alias. A foreign home is not parked with r's owner (the caller makes it FREE first: a parked page
 * must not lose its last way back). Returns GP_OK, or the failure: the pages unmapped before it are
 * dropped, the rest stay as they were. */
static int drop_slot_runs(gp_pool_state *p, gp_segment *r, const size_t *first, const size_t *len, size_t runs)
{
    gp_stream_state *owner = r->owner;
    size_t total = 0, done = 0;
    for (size_t k = 0; k < runs; k++)
        total += len[k];
    uintptr_t *vas = malloc((total ? total : 1) * sizeof *vas);
    gp_block **spare = malloc(2 * (runs ? runs : 1) * sizeof *spare);
    size_t left = 0;
    while (spare != NULL && left < 2 * runs && (spare[left] = gp_block_new(&owner->blocks)) != NULL)
        left++;
    int rc = GP_OK;
    if (vas == NULL || spare == NULL || left < 2 * runs) {
        rc = gp_error_set(GP_ERR_OOM, "out of host memory for block metadata");
    } else {
        for (size_t k = 0, at = 0; k < runs; k++)
            for (size_t j = first[k]; j < first[k] + len[k]; j++)
                vas[at++] = r->addr + j * p->page;
        /* A SHADOW slot's memory is in use at its home, and no work of r's uses it here: the slot became
         * SHADOW when r's owner freed the block there (other streams' uses were over by then, their
         * events: api/free.c), stamped with that free, or was never used at r (stamp 0). So the owner's
         * fence at the latest stamp of the slots' blocks covers every use of these addresses: no other
         * stream's work, and none of the owner's queued since, need be waited for (the owner's latest
         * free stamp would wait for its kernel in flight, a whole step of a busy model). */
        uint64_t seq = 0;
        for (size_t k = 0; k < runs; k++) {
            const gp_block *b = gp_pages_block_at(r, r->addr + first[k] * p->page);
            seq = b->free_seq > seq ? b->free_seq : seq;
        }
        rc = gp_pages_unmap_list(p, owner, seq, vas, total, &done);
    }
    atomic_fetch_add(&p->num_unmaps, done);
    for (size_t k = 0; k < runs && done > 0; k++) {
        size_t n = len[k] < done ? len[k] : done;
        uintptr_t va = r->addr + first[k] * p->page;
        gp_block *b = gp_pages_block_at(r, va);
        assert(b->state == GP_BLOCK_SHADOW && va + len[k] * p->page <= b->addr + b->size);
        gp_block *mid = gp_pages_carve(NULL, b, va, n * p->page, spare, &left);
        mid->state = GP_BLOCK_UNMAPPED;
        gp_pages_merge(&owner->blocks, mid);
        for (size_t j = first[k]; j < first[k] + n; j++) {
            gp_alias_home *h = &r->homes[j];
            assert(!foreign_home(r, *h) || holder_of(*h) != owner || loan_of(*h)->active);
            h->seg->alias_count[h->index]--;
            h->seg->aliased--;
            r->aliased--;
            r->pages[j] = GP_PHYS_NONE;
            h->seg = NULL;
        }
        done -= n;
    }
    if (spare != NULL)
        while (left > 0)
            gp_block_recycle(&owner->blocks, spare[--left]);
    free(spare);
    free(vas);
    return rc;
}

/* drop_slot_runs for one run: the n SHADOW pages of r from page index i. */
int gp_alias_drop_slots(gp_pool_state *p, gp_segment *r, size_t i, size_t n)
{
    return drop_slot_runs(p, r, &i, &n, 1);
}

/* Unmaps every idle alias slot of stitched range r (owner locked; with pages parked with it, their
 * homes' owners too: gp_alias_dissolve, which holds every stream of r's tenant), after one wait for the
 * slots' latest stamp (drop_slot_runs): GP_OK or the first failure. */
static int drop_idle_slots(gp_pool_state *p, gp_segment *r)
{
    uint64_t now = atomic_load_explicit(&p->coarse_now, memory_order_relaxed);
    size_t pages = r->size / p->page, runs = 0;
    size_t *first = malloc(pages * sizeof *first), *len = malloc(pages * sizeof *len);
    if (first == NULL || len == NULL) {
        free(first);
        free(len);
        return gp_error_set(GP_ERR_OOM, "out of host memory for a stitched range's %zu slots", pages);
    }
    for (gp_block *b = r->first; b != NULL; b = b->next) {
        if (b->state != GP_BLOCK_SHADOW)
            continue;
        size_t i = gp_page_index(p, r, b->addr), n = b->size / p->page;
        for (size_t j = i; j < i + n; j++) { /* a page parked with r's owner is FREE at home first */
            gp_alias_home h = r->homes[j];
            gp_stream_state *holder = foreign_home(r, h) ? holder_of(h) : NULL;
            if (holder != NULL && holder == r->owner && !loan_of(h)->active) {
                unshadow_home(p, h.seg, home_va(p, h), now);
                *loan_of(h) = (gp_alias_loan){NULL, false, 0};
                h.seg->loans_held--;
                holder->parked_bytes -= p->page;
            }
        }
        first[runs] = i;
        len[runs++] = n;
    }
    int rc = runs > 0 ? drop_slot_runs(p, r, first, len, runs) : GP_OK;
    free(first);
    free(len);
    return rc;
}

/* True when every mapped page of stitched range r is idle (SHADOW): no block of it is in use. */
static bool wholly_idle(const gp_segment *r)
{
    for (const gp_block *b = r->first; b != NULL; b = b->next)
        if (b->state != GP_BLOCK_SHADOW && b->state != GP_BLOCK_UNMAPPED)
            return false;
    return true;
}

/* True when a page of stitched range r is parked with its owner. */
static bool holds_parked(const gp_pool_state *p, const gp_segment *r)
{
    for (size_t j = 0; j < r->size / p->page; j++) {
        gp_alias_home h = r->homes[j];
        if (h.seg != NULL && foreign_home(r, h) && holder_of(h) == r->owner && !loan_of(h)->active)
            return true;
    }
    return false;
}

/*
 * Keeps st's alias slots within the pages they may map once `more` are added: the slots of st's own
 * pages within the pages of its ordinary ranges, the slots of other streams' pages (loans) within the
 * pages of theirs. Aliases cost no device memory, but each is a device page-table entry and host
 * metadata, and so they stay in proportion to what the pool holds; past the bound the idle stitched
 * ranges of st least recently handed out are unmapped until they fit (or none is left). A range with
 * pages parked with st is left alone (their owners would have to be locked). st locked.
 */
static void bound_aliases(gp_pool_state *p, gp_stream_state *st, size_t more, size_t more_foreign)
{
    for (;;) {
        size_t own_slots = more, foreign_slots = more_foreign, own_pages = 0, other_pages = 0;
        gp_segment *oldest = NULL;
        for (gp_segment *seg = p->segments_head; seg != NULL; seg = seg->next) {
            if (seg->owner->tenant != st->tenant || seg->small || seg->pages == NULL)
                continue;
            if (!seg->stitched) {
                *(seg->owner == st ? &own_pages : &other_pages) += seg->mapped_bytes / p->page;
                continue;
            }
            if (seg->owner != st)
                continue;
            for (size_t j = 0; j < seg->size / p->page; j++)
                if (seg->homes[j].seg != NULL)
                    *(foreign_home(seg, seg->homes[j]) ? &foreign_slots : &own_slots) += 1;
            if (seg->aliased > 0 && (oldest == NULL || seg->last_used < oldest->last_used) && wholly_idle(seg) &&
                !holds_parked(p, seg))
                oldest = seg;
        }
        bool over = own_slots > own_pages || foreign_slots > other_pages;
        if (!over || oldest == NULL || drop_idle_slots(p, oldest) != GP_OK)
            return;
    }
}

/* A whole free page of an ordinary range that may become an alias's home. */
static int own_then_smaller_block_first(const void *a, const void *b)
{
    const candidate *x = a, *y = b;
    if (x->foreign != y->foreign)
        return x->foreign ? 1 : -1;
    if (x->block_size != y->block_size)
        return x->block_size < y->block_size ? -1 : 1;
    if (x->seg != y->seg)
        return x->seg->serial < y->seg->serial ? -1 : 1;
    return x->index < y->index ? -1 : (x->index > y->index);
}

/* Appends every whole free page of o's ordinary large ranges (o locked) as a home for st's new stitched
 * range. false when host memory is out. */
static bool free_pages(gp_pool_state *p, gp_stream_state *o, gp_stream_state *st, uint64_t upto, candidate **c,
                       size_t *n, size_t *cap)
{
    for (gp_segment *seg = p->segments_head; seg != NULL; seg = seg->next) {
        if (!home_range(seg, o))
            continue;
        for (const gp_block *b = seg->first; b != NULL; b = b->next) {
            if (b->size < p->page || b->state != GP_BLOCK_FREE || b->free_seq > upto)
                continue;
            uintptr_t va = seg->addr + gp_div_up(b->addr - seg->addr, p->page) * p->page;
            for (; va + p->page <= b->addr + b->size; va += p->page) {
                size_t i = gp_page_index(p, seg, va);
                if (seg->alias_count != NULL && seg->alias_count[i] == UINT16_MAX)
                    continue;
                if (*n == *cap) {
                    size_t more = *cap ? *cap * 2 : 64;
                    candidate *grown = realloc(*c, more * sizeof **c);
                    if (grown == NULL)
                        return false;
                    *c = grown;
                    *cap = more;
                }
                (*c)[(*n)++] = (candidate){seg, i, b->size, o != st};
            }
        }
    }
    return true;
}

/*
 * Maps the homes of chosen[0..n) at a new stitched range of st (locked) and returns it with the pages
 * mapped as one idle (SHADOW) block, the rest UNMAPPED; *mapped says how many (all, unless a map
 * failed: *rc). NULL when nothing was mapped (*rc); a reservation that the device would not take back
 * is kept as an empty range, which release_empty_ranges (provider/vmm.c) gives back later.
 */
static gp_segment *new_stitched_range(gp_pool_state *p, gp_stream_state *st, const candidate *chosen, size_t n,
                                      size_t *mapped, int *rc)
{
    *mapped = 0;
    for (size_t j = 0; j < n; j++) {
        gp_segment *h = chosen[j].seg;
        size_t pages = h->size / p->page;
        if ((h->alias_count == NULL && (h->alias_count = calloc(pages, sizeof *h->alias_count)) == NULL) ||
            (chosen[j].foreign && h->loans == NULL && (h->loans = calloc(pages, sizeof *h->loans)) == NULL)) {
            *rc = gp_error_set(GP_ERR_OOM, "out of host memory for alias counts");
            return NULL;
        }
    }
    gp_segment *r = gp_segment_new();
    gp_phys *handles = malloc(n * sizeof *handles);
    gp_block *rest = gp_block_new(&st->blocks);
    if (r != NULL) {
        r->pages = calloc(n, sizeof *r->pages);
        r->homes = calloc(n, sizeof *r->homes);
    }
    gp_devptr va = 0;
    if (r == NULL || handles == NULL || rest == NULL || r->pages == NULL || r->homes == NULL) {
        *rc = gp_error_set(GP_ERR_OOM, "out of host memory for a stitched range of %zu pages", n);
    } else if ((*rc = p->ops->va_reserve(p->ctx, n * p->page, &va)) == GP_OK) {
        for (size_t j = 0; j < n; j++)
            handles[j] = chosen[j].seg->pages[chosen[j].index];
        *rc = gp_pages_map_run(p, va, handles, n, mapped);
        atomic_fetch_add(&p->num_maps, *mapped);
        if (*mapped == 0 && p->ops->va_release(p->ctx, va, n * p->page) == GP_OK)
            va = 0;
    }
    free(handles);
    if (va == 0) {
        if (rest != NULL)
            gp_block_recycle(&st->blocks, rest);
        if (r != NULL) {
            free(r->pages);
            free(r->homes);
            gp_segment_discard(r);
        }
        return NULL;
    }
    gp_segment_place(p, r, st, va, n * p->page, false, 0, *mapped > 0 ? GP_BLOCK_SHADOW : GP_BLOCK_UNMAPPED);
    r->stitched = true;
    if (*mapped > 0 && *mapped < n) {
        gp_pages_split(r->first, *mapped * p->page, rest)->state = GP_BLOCK_UNMAPPED;
        rest = NULL;
    }
    if (rest != NULL)
        gp_block_recycle(&st->blocks, rest);
    for (size_t j = 0; j < *mapped; j++) {
        r->pages[j] = chosen[j].seg->pages[chosen[j].index];
        r->homes[j] = (gp_alias_home){chosen[j].seg, chosen[j].index};
        chosen[j].seg->alias_count[chosen[j].index]++;
        chosen[j].seg->aliased++;
        r->aliased++;
    }
    return *mapped > 0 ? r : NULL;
}

static int by_home(const void *a, const void *b)
{
    const candidate *x = a, *y = b;
    if (x->seg != y->seg)
        return x->seg->serial < y->seg->serial ? -1 : 1;
    return x->index < y->index ? -1 : (x->index > y->index);
}

/* True when home h is among the n candidates sorted by_home. */
static bool listed(const candidate *sorted, size_t n, gp_alias_home h)
{
    candidate key = {.seg = h.seg, .index = h.index};
    return bsearch(&key, sorted, n, sizeof key, by_home) != NULL;
}

/* Maps the homes of cs[0..m) at the m UNMAPPED pages of st's stitched range r from page j (st locked)
 * as idle alias slots (SHADOW, merged with their neighbours), with one access call for the run
 * (gp_pages_map_run). GP_OK, or the failure: the pages mapped before it are slots, the rest stay
 * UNMAPPED (with the backend's map_run, nothing of the run is mapped). */
static int fill_slots(gp_pool_state *p, gp_segment *r, size_t j, size_t m, const candidate *const *cs)
{
    gp_stream_state *st = r->owner;
    uintptr_t va = r->addr + j * p->page;
    gp_block *u = gp_pages_block_at(r, va);
    assert(m > 0 && u->state == GP_BLOCK_UNMAPPED && va + m * p->page <= u->addr + u->size);
    gp_phys *handles = malloc(m * sizeof *handles);
    if (handles == NULL)
        return gp_error_set(GP_ERR_OOM, "out of host memory for a run of %zu alias slots", m);
    for (size_t k = 0; k < m; k++) {
        const candidate *c = cs[k];
        size_t pages = c->seg->size / p->page;
        assert(r->homes[j + k].seg == NULL);
        if ((c->seg->alias_count == NULL &&
             (c->seg->alias_count = calloc(pages, sizeof *c->seg->alias_count)) == NULL) ||
            (c->foreign && c->seg->loans == NULL && (c->seg->loans = calloc(pages, sizeof *c->seg->loans)) == NULL)) {
            free(handles);
            return gp_error_set(GP_ERR_OOM, "out of host memory for alias counts");
        }
        handles[k] = c->seg->pages[c->index];
    }
    gp_block *spare[2] = {gp_block_new(&st->blocks), gp_block_new(&st->blocks)};
    size_t left = 2, mapped = 0;
    int rc = spare[0] == NULL || spare[1] == NULL ? gp_error_set(GP_ERR_OOM, "out of host memory for block metadata")
                                                  : gp_pages_map_run(p, va, handles, m, &mapped);
    atomic_fetch_add(&p->num_maps, mapped);
    if (mapped > 0) {
        gp_block *mid = gp_pages_carve(NULL, u, va, mapped * p->page, spare, &left);
        mid->state = GP_BLOCK_SHADOW;
        mid->free_seq = 0; /* slots no work has used here since they were mapped */
        gp_pages_merge(&st->blocks, mid);
        for (size_t k = 0; k < mapped; k++) {
            const candidate *c = cs[k];
            r->pages[j + k] = handles[k];
            r->homes[j + k] = (gp_alias_home){c->seg, c->index};
            c->seg->alias_count[c->index]++;
            c->seg->aliased++;
            r->aliased++;
        }
    }
    while (left > 0)
        if (spare[--left] != NULL)
            gp_block_recycle(&st->blocks, spare[left]);
    free(handles);
    return rc;
}

/* Whether the slot of st's stitched range r whose home is h can serve there now: a page of another
 * stream parked with st, or else a page free at home (among the candidates, `sorted` by_home) that no
 * other stream holds. */
static bool slot_fits(const gp_stream_state *st, const gp_segment *r, gp_alias_home h, const candidate *sorted,
                      size_t count)
{
    if (h.seg->paused)
        return false;
    if (foreign_home(r, h) && holder_of(h) == st)
        return !loan_of(h)->active;
    return holder_of(h) == NULL && listed(sorted, count, h);
}

/*
 * Repairs the idle stitched block of st that the fewest of its pages keep from serving n pages: each
 * page whose home is in use now (by its owner, or at another stream's alias) is unmapped from the
 * slot, and a free page among the candidates c[0..count) (sorted, best first) that the range does not
 * map yet is mapped there instead; then the block is handed out. In a loop that repeats its step, a
 * layout so repaired keeps the pages that were free when it was needed, and needs no more repair once
 * they are free then again in every step: the layout settles where the other streams leave it room,
 * for two calls per page that did not fit (an unmap and a map; one device synchronize for all the
 * unmaps, one access call per run of consecutive pages), where a new stitched range would take a call
 * per page and make one more layout to keep. NULL when no idle block is within reach (as many pages to
 * replace as it has, or too few candidates), or a call fails (what was repaired stays, idle).
 * Pool lock held, st not locked.
 */
static gp_block *repair(gp_pool_state *p, gp_stream_state *st, const candidate *c, size_t count, size_t n,
                        size_t rsize, size_t size)
{
    assert(count > 0);
    candidate *sorted = malloc(count * sizeof *sorted);
    if (sorted == NULL)
        return NULL;
    memcpy(sorted, c, count * sizeof *c);
    qsort(sorted, count, sizeof *sorted, by_home);
    gp_stream_lock(st);
    gp_segment *best = NULL;
    uintptr_t best_va = 0;
    size_t best_misfits = n, best_size = SIZE_MAX;
    for (gp_segment *r = p->segments_head; r != NULL; r = r->next) {
        if (!r->stitched || r->owner != st || r->paused)
            continue;
        for (gp_block *b = r->first; b != NULL; b = b->next) {
            if (b->state != GP_BLOCK_SHADOW || b->size < n * p->page)
                continue;
            size_t first = gp_page_index(p, r, b->addr), misfits = 0;
            for (size_t j = first; j < first + n && misfits < best_misfits; j++)
                misfits += !slot_fits(st, r, r->homes[j], sorted, count);
            if (misfits < best_misfits || (misfits == best_misfits && best != NULL && b->size < best_size)) {
                best = r;
                best_va = b->addr;
                best_misfits = misfits;
                best_size = b->size;
            }
        }
    }
    gp_block *out = NULL;
    bool ready = best != NULL && best_misfits < n;
    if (ready && best_misfits > 0) {
        /* the replacements: candidates the range maps nowhere yet, best first */
        gp_alias_home *mapped_here = malloc(best->size / p->page * sizeof *mapped_here);
        size_t nm = 0;
        for (size_t j = 0; mapped_here != NULL && j < best->size / p->page; j++)
            if (best->homes[j].seg != NULL)
                mapped_here[nm++] = best->homes[j];
        candidate *here = malloc((nm ? nm : 1) * sizeof *here);
        for (size_t k = 0; here != NULL && mapped_here != NULL && k < nm; k++)
            here[k] = (candidate){.seg = mapped_here[k].seg, .index = mapped_here[k].index};
        if (here != NULL && mapped_here != NULL)
            qsort(here, nm, sizeof *here, by_home);
        /* The slots that do not fit, in runs of consecutive ones, each slot given the next candidate:
         * all of them unmapped after one device synchronize (drop_slot_runs), each run mapped with one
         * access call (fill_slots), rather than a synchronize and an access call per slot. */
        const candidate **picks = malloc(n * sizeof *picks);
        size_t *starts = malloc(n * sizeof *starts), *lens = malloc(n * sizeof *lens), runs = 0, picked = 0;
        ready = here != NULL && mapped_here != NULL && picks != NULL && starts != NULL && lens != NULL;
        bool short_of_pages = false;
        size_t next = 0, first = gp_page_index(p, best, best_va);
        for (size_t j = first; ready && !short_of_pages && j < first + n;) {
            if (slot_fits(st, best, best->homes[j], sorted, count)) {
                j++;
                continue;
            }
            size_t m = 0;
            while (j + m < first + n && !slot_fits(st, best, best->homes[j + m], sorted, count)) {
                while (next < count && listed(here, nm, (gp_alias_home){c[next].seg, c[next].index}))
                    next++;
                if (next == count) {
                    short_of_pages = true;
                    break;
                }
                picks[picked + m++] = &c[next++];
            }
            if (m > 0) {
                starts[runs] = j;
                lens[runs++] = m;
                picked += m;
            }
            j += m;
        }
        ready = ready && runs > 0 && drop_slot_runs(p, best, starts, lens, runs) == GP_OK;
        for (size_t k = 0, at = 0; ready && k < runs; at += lens[k++])
            ready = fill_slots(p, best, starts[k], lens[k], picks + at) == GP_OK;
        ready = ready && !short_of_pages;
        free(starts);
        free(lens);
        free(picks);
        free(here);
        free(mapped_here);
    }
    gp_stream_unlock(st);
    free(sorted);
    if (ready)
        out = activate(p, st, best, best_va, n, rsize, size);
    return out;
}

size_t gp_alias_free_pages(gp_pool_state *p, gp_stream_state *st)
{
    size_t count = 0, cap = 0;
    candidate *c = NULL;
    gp_stream_lock(st);
    if (!free_pages(p, st, st, UINT64_MAX, &c, &count, &cap))
        count = 0; /* host memory is out: nothing to stitch */
    gp_stream_unlock(st);
    free(c);
    return count;
}

gp_block *gp_alias_stitch(gp_pool_state *p, gp_stream_state *st, size_t rsize, size_t size, bool lend)
{
    size_t n = gp_div_up(rsize, p->page);
    if (n < 2) /* a request of one page that missed finds no whole free page */
        return NULL;
    size_t count = 0, cap = 0;
    candidate *c = NULL;
    gp_stream_lock(st);
    bool ok = free_pages(p, st, st, UINT64_MAX, &c, &count, &cap);
    gp_stream_unlock(st);
    /* With loans, other streams' free pages too (for a new range where the stream's own do not
     * suffice, and to tell which homes of an idle block are free for its repair): only those their
     * stream's fence says are unused (freed before it: provider.h), as a borrowed block's are, each
     * stream locked alone. */
    unsigned streams = atomic_load(&p->streams.count);
    for (unsigned i = 0; ok && lend && i < streams; i++) {
        gp_stream_state *o = p->streams.by_index[i];
        if (o == st || o->tenant != st->tenant)
            continue;
        gp_stream_lock(o);
        ok = free_pages(p, o, st, gp_stream_done(p, o), &c, &count, &cap);
        gp_stream_unlock(o);
    }
    gp_block *out = NULL;
    /* The stream's own pages first (nothing to lend), then the pages of the smallest free blocks:
     * those are the fragments that no request of this size fits; larger free blocks stay whole for
     * the requests they do fit. */
    ok = ok && c != NULL;
    if (ok && count > 1)
        qsort(c, count, sizeof *c, own_then_smaller_block_first);
    if (ok && lend)
        out = repair(p, st, c, count, n, rsize, size);
    if (out == NULL && ok && count >= n) {
        size_t mapped = 0;
        int rc = GP_OK;
        gp_stream_lock(st);
        size_t foreign = 0;
        for (size_t k = 0; k < n; k++)
            foreign += c[k].foreign;
        bound_aliases(p, st, n - foreign, foreign);
        gp_segment *r = new_stitched_range(p, st, c, n, &mapped, &rc);
        gp_stream_unlock(st);
        if (r != NULL && mapped == n && (out = activate(p, st, r, r->addr, n, rsize, size)) != NULL)
            atomic_fetch_add(&p->num_stitches, 1);
    }
    free(c);
    return out;
}

/*
 * Gives the pages of st's ranges (every stream's: NULL) parked with other streams whose work on them is
 * done (the holder's fence covers the parking) back to their owner's heap (FREE), `limit` of them at
 * most; with `wait`, a holder whose fence does not cover the parking yet is waited for (its fence, one
 * stream's work: gp_stream_wait_upto). Pool lock held, no stream lock. Returns the pages reclaimed.
 */
static size_t reclaim(gp_pool_state *p, gp_stream_state *st, size_t limit, bool wait)
{
    size_t got = 0;
    uint64_t now = atomic_load_explicit(&p->coarse_now, memory_order_relaxed);
    gp_stream_state *asked = NULL; /* the holder last asked, and its fence's answer (one poll each) */
    uint64_t asked_done = 0;
    for (gp_segment *seg = p->segments_head; seg != NULL && got < limit; seg = seg->next) {
        if (seg->loans_held == 0 || (st != NULL && seg->owner != st) || seg->paused)
            continue;
        size_t pages = seg->size / p->page;
        for (size_t i = 0; i < pages && seg->loans_held > 0 && got < limit; i++) {
            gp_alias_loan *l = &seg->loans[i];
            gp_stream_state *holder = l->holder;
            if (holder == NULL)
                continue;
            /* parked, and its holder's work done: read under the holder's lock; nothing can hand the
             * page out meanwhile (that takes the pool lock) */
            gp_stream_lock(holder);
            bool idle = !l->active;
            if (idle && asked != holder) {
                asked = holder;
                asked_done = gp_stream_done(p, holder);
            }
            if (idle && l->parked_seq > asked_done && wait &&
                gp_stream_wait_upto(p, holder, l->parked_seq) == GP_OK)
                asked_done = holder->done_seq;
            idle = idle && l->parked_seq <= asked_done;
            if (idle) {
                holder->parked_bytes -= p->page;
                *l = (gp_alias_loan){NULL, false, 0};
            }
            gp_stream_unlock(holder);
            if (!idle)
                continue;
            gp_stream_lock(seg->owner);
            unshadow_home(p, seg, seg->addr + i * p->page, now);
            gp_stream_unlock(seg->owner);
            seg->loans_held--;
            got++;
        }
    }
    return got;
}

size_t gp_alias_reclaim(gp_pool_state *p, gp_stream_state *st)
{
    return reclaim(p, st, SIZE_MAX, false);
}

size_t gp_alias_reclaim_waiting(gp_pool_state *p, size_t limit)
{
    return reclaim(p, NULL, limit, true);
}

/* ---- undoing aliases ---------------------------------------------------------------------------- */

/* The alias slots the pages [i0, i0 + n) of the ordinary range seg still have. */
static size_t slots_left(const gp_segment *seg, size_t i0, size_t n)
{
    size_t left = 0;
    for (size_t k = 0; k < n; k++)
        left += seg->alias_count[i0 + k];
    return left;
}

/* True when stitched range r has a slot of one of the pages [i0, i0 + n) of seg (its homes only: they
 * change under the pool lock, its blocks under its owner's). */
static bool has_slot_of(const gp_pool_state *p, const gp_segment *r, const gp_segment *seg, size_t i0, size_t n)
{
    for (size_t j = 0; j < r->size / p->page; j++)
        if (r->homes[j].seg == seg && r->homes[j].index >= i0 && r->homes[j].index < i0 + n)
            return true;
    return false;
}

/* The runs of idle slots of stitched range r whose homes are pages [i0, i0 + n) of seg, each run within
 * one SHADOW block (r's blocks in address order): *runs of them in first[], len[] (room for n each). */
static size_t slots_of_homes(const gp_pool_state *p, const gp_segment *r, const gp_segment *seg, size_t i0,
                             size_t n, size_t *first, size_t *len)
{
    size_t runs = 0;
    for (const gp_block *b = r->first; b != NULL; b = b->next) {
        if (b->state != GP_BLOCK_SHADOW)
            continue;
        bool open = false;
        for (size_t j = gp_page_index(p, r, b->addr); j < gp_page_index(p, r, b->addr + b->size); j++) {
            gp_alias_home h = r->homes[j];
            bool mine = h.seg == seg && h.index >= i0 && h.index < i0 + n;
            if (mine && open)
                len[runs - 1]++;
            else if (mine) {
                assert(runs < n); /* a home has one slot in a range at most: n runs at most */
                first[runs] = j;
                len[runs++] = 1;
            }
            open = mine;
        }
    }
    return runs;
}

size_t gp_alias_unshare(gp_pool_state *p, gp_segment *seg, uintptr_t first, size_t n, int *rc)
{
    assert(!seg->stitched);
    if (seg->aliased == 0)
        return n;
    gp_stream_state *owner = seg->owner;
    size_t i0 = gp_page_index(p, seg, first);
    for (size_t k = 0; k < n; k++)
        assert(seg->loans == NULL || seg->loans[i0 + k].holder == NULL); /* FREE here: held by nobody */
    /* A page of seg has at most one slot in a stitched range (new_stitched_range and the repair map a
     * home once per range), so each range has at most n of them: its slots of these pages are unmapped
     * together, after one device synchronize. */
    size_t *starts = malloc(n * sizeof *starts), *lens = malloc(n * sizeof *lens);
    if (starts == NULL || lens == NULL) {
        free(starts);
        free(lens);
        if (*rc == GP_OK)
            *rc = gp_error_set(GP_ERR_OOM, "out of host memory to unshare %zu pages", n);
        return 0;
    }
    for (gp_segment *r = p->segments_head; r != NULL && slots_left(seg, i0, n) > 0; r = r->next) {
        if (!r->stitched || r->owner->tenant != owner->tenant || r->aliased == 0 || !has_slot_of(p, r, seg, i0, n))
            continue;
        /* Another stream's slots are unmapped under its lock too, taken in the lock order or not at
         * all (then the pages stay, with their slots). */
        gp_stream_state *holder = r->owner;
        if (holder != owner && holder->index > owner->index)
            gp_stream_lock(holder);
        else if (holder != owner && !gp_stream_trylock(holder))
            break;
        size_t runs = slots_of_homes(p, r, seg, i0, n, starts, lens);
        int one = runs > 0 ? drop_slot_runs(p, r, starts, lens, runs) : GP_OK; /* SHADOW: the homes are free */
        if (holder != owner)
            gp_stream_unlock(holder);
        if (one != GP_OK) {
            if (*rc == GP_OK)
                *rc = one;
            break;
        }
    }
    free(starts);
    free(lens);
    size_t k = 0; /* the pages from `first` with no slot left */
    while (k < n && seg->alias_count[i0 + k] == 0)
        k++;
    return k;
}

size_t gp_alias_unshared_run(const gp_pool_state *p, const gp_segment *seg, uintptr_t *first, size_t n)
{
    size_t i0 = gp_page_index(p, seg, *first), k = 0;
    while (k < n && seg->alias_count[i0 + k] > 0)
        k++;
    size_t len = 0;
    while (k + len < n && seg->alias_count[i0 + k + len] == 0)
        len++;
    *first += k * p->page;
    return len;
}

bool gp_alias_has_homes(const gp_pool_state *p, const gp_segment *seg, uintptr_t first, size_t n)
{
    assert(seg->stitched);
    size_t i0 = gp_page_index(p, seg, first);
    for (size_t k = 0; k < n; k++)
        if (seg->homes[i0 + k].seg != NULL)
            return true;
    return false;
}

/* The page j of stitched range r, in use there, becomes r's own: its SHADOW home is unmapped. `locked`:
 * the stream whose lock the caller holds (NULL: none, or not the home's owner). */
int gp_alias_own_page(gp_pool_state *p, gp_segment *r, size_t j, gp_stream_state *locked)
{
    gp_alias_home *h = &r->homes[j];
    gp_stream_state *owner = h->seg->owner;
    uintptr_t va = home_va(p, *h);
    gp_block *b = gp_pages_block_at(h->seg, va);
    assert(b->state == GP_BLOCK_SHADOW && b->addr == va && b->size == p->page);
    size_t done = 0;
    /* Nothing has used the home address since the page went SHADOW there; its last uses at home were
     * the owner's, up to the stamp of the free block it was cut from (other streams' were over before
     * that block was FREE), so the owner's fence at that stamp covers them. Without the owner's lock
     * the device is synchronized instead. */
    int rc = locked == owner ? gp_pages_unmap_run(p, owner, b->free_seq, va, 1, &done)
                             : gp_pages_unmap_run(p, NULL, 0, va, 1, &done);
    atomic_fetch_add(&p->num_unmaps, done);
    if (done == 0)
        return rc;
    b->state = GP_BLOCK_UNMAPPED;
    gp_pages_merge(&owner->blocks, b);
    h->seg->pages[h->index] = GP_PHYS_NONE;
    h->seg->mapped_bytes -= p->page; /* the page is counted where it is now (same tenant: held unchanged) */
    r->mapped_bytes += p->page;
    if (foreign_home(r, *h)) { /* the loan ends: the page is the holder's now */
        assert(holder_of(*h) == r->owner && loan_of(*h)->active);
        *loan_of(*h) = (gp_alias_loan){NULL, false, 0};
        h->seg->loans_held--;
    }
    h->seg->alias_count[h->index]--;
    h->seg->aliased--;
    r->aliased--;
    h->seg = NULL;
    return GP_OK;
}

int gp_alias_dissolve(gp_pool_state *p, const gp_tenant *only)
{
    /* Idle slots first, so that a page in use at an alias has no other alias left when it is owned. */
    for (gp_segment *r = p->segments_head; r != NULL; r = r->next) {
        if (!r->stitched || r->aliased == 0 || (only != NULL && r->owner->tenant != only))
            continue;
        int rc = drop_idle_slots(p, r);
        if (rc != GP_OK)
            return rc;
    }
    for (gp_segment *r = p->segments_head; r != NULL; r = r->next) {
        if (!r->stitched || r->aliased == 0 || (only != NULL && r->owner->tenant != only))
            continue;
        for (size_t j = 0; j < r->size / p->page; j++) {
            if (r->homes[j].seg == NULL)
                continue;
            int rc = gp_alias_own_page(p, r, j, r->homes[j].seg->owner); /* the home's owner, r's tenant's, is locked */
            if (rc != GP_OK)
                return rc;
        }
    }
    return GP_OK;
}

/* ---- checking ----------------------------------------------------------------------------------- */

const char *gp_alias_check(const gp_pool_state *p, const gp_segment *seg)
{
    size_t pages = seg->size / p->page;
    if (!seg->stitched) {
        size_t sum = 0;
        for (const gp_block *b = seg->first; b != NULL; b = b->next)
            if (b->state == GP_BLOCK_SHADOW &&
                ((b->addr - seg->addr) % p->page != 0 || b->size != p->page || seg->alias_count == NULL ||
                 seg->alias_count[gp_page_index(p, seg, b->addr)] == 0))
                return "a SHADOW block of an ordinary range is not one aliased page";
        size_t held = 0;
        for (size_t i = 0; seg->alias_count != NULL && i < pages; i++) {
            sum += seg->alias_count[i];
            if (seg->loans == NULL || seg->loans[i].holder == NULL)
                continue;
            const gp_stream_state *holder = seg->loans[i].holder;
            if (seg->alias_count[i] == 0 || holder == seg->owner || holder->tenant != seg->owner->tenant ||
                gp_pages_block_at(seg, seg->addr + i * p->page)->state != GP_BLOCK_SHADOW)
                return "a lent page is not a SHADOW page with an alias, held by another stream of its tenant";
            held++;
        }
        if (held != seg->loans_held)
            return "a range's loans_held disagrees with its loans";
        return sum == seg->aliased ? NULL : "a range's aliased count disagrees with its pages' alias counts";
    }
    size_t own = 0, aliased = 0;
    for (size_t j = 0; j < pages; j++) {
        uintptr_t va = seg->addr + j * p->page;
        const gp_block *b = gp_pages_block_at(seg, va);
        gp_alias_home h = seg->homes[j];
        if (h.seg == NULL) {
            if (b->state == GP_BLOCK_SHADOW)
                return "a SHADOW page of a stitched range has no home";
            /* a paused range's in-use pages may have no memory (api/pause.c) */
            own += b->state != GP_BLOCK_UNMAPPED && seg->pages[j] != GP_PHYS_NONE ? p->page : 0;
            continue;
        }
        aliased++;
        if (b->state == GP_BLOCK_UNMAPPED)
            return "an aliased page of a stitched range is unmapped";
        if (h.seg->stitched || h.seg->owner->tenant != seg->owner->tenant || h.seg->alias_count == NULL ||
            h.seg->alias_count[h.index] == 0 || h.seg->pages[h.index] != seg->pages[j])
            return "a stitched page's home is not a page of its tenant's ranges that counts it";
        const gp_block *hb = gp_pages_block_at(h.seg, home_va(p, h));
        if (b->state != GP_BLOCK_SHADOW && foreign_home(seg, h) &&
            (holder_of(h) != seg->owner || !loan_of(h)->active))
            return "a page in use at another stream's alias is not held by it, active";
        if (b->state != GP_BLOCK_SHADOW && !foreign_home(seg, h) && holder_of(h) != NULL)
            return "a page in use at its owner's alias is held by another stream";
        if (hb->state == GP_BLOCK_UNMAPPED)
            return "a stitched page's home is unmapped";
        if (b->state != GP_BLOCK_SHADOW && hb->state != GP_BLOCK_SHADOW)
            return "a page is in use at two addresses (a stitched page and its home)";
    }
    if (aliased != seg->aliased)
        return "a stitched range's aliased count disagrees with its homes";

    return own == seg->mapped_bytes ? NULL : "a stitched range's mapped_bytes disagrees with the pages it owns";
}
