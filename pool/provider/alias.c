/*
 * alias.c — stitching by aliasing: stitched ranges whose pages are free pages of the same stream's
 * ordinary ranges mapped a second time; handing them out and back by swapping which address is in use
 * (SHADOW blocks), making them, and undoing them (alias.h says why and states the invariants).
 */
#include <assert.h>
#include <stdlib.h>

#include "base/error.h"
#include "provider/alias.h"
#include "provider/pages.h"

/* ---- finding pages ---------------------------------------------------------------------------- */

/* The block of seg that holds va (its owner locked). Sizes only are read on the way: a block lent to
 * a thread cache has its state written without the stream's lock, never its size. */
static gp_block *block_at(const gp_segment *seg, uintptr_t va)
{
    gp_block *b = seg->first;
    while (b->addr + b->size <= va)
        b = b->next;
    return b;
}

static uintptr_t home_va(const gp_pool_state *p, gp_alias_home h)
{
    return h.seg->addr + h.index * p->page;
}

/* True when the page at va lies wholly inside a FREE block of seg (the size first: see block_at). */
static bool page_is_free(const gp_pool_state *p, const gp_segment *seg, uintptr_t va)
{
    const gp_block *b = block_at(seg, va);
    return b->size >= p->page && b->state == GP_BLOCK_FREE && b->addr <= va && va + p->page <= b->addr + b->size;
}

/* An ordinary range of st's large heap whose free pages may serve as homes. */
static bool home_range(const gp_segment *seg, const gp_stream_state *st)
{
    return seg->owner == st && !seg->small && !seg->stitched && !seg->paused && seg->pages != NULL;
}

/* True when the n pages of stitched range r from va all have a home that is free now. */
static bool homes_free(const gp_pool_state *p, const gp_segment *r, uintptr_t va, size_t n)
{
    size_t first = gp_page_index(p, r, va);
    for (size_t j = 0; j < n; j++) {
        gp_alias_home h = r->homes[first + j];
        if (h.seg == NULL || h.seg->paused || !page_is_free(p, h.seg, home_va(p, h)))
            return false;
    }
    return true;
}

/* ---- swapping the address in use (owner locked) ------------------------------------------------ */

/* Cuts the page at va out of its FREE block in home range seg into a SHADOW block of its own, using
 * up to two structs from spare[] (*nspare counts down). */
static void shadow_home(gp_pool_state *p, gp_stream_state *owner, gp_segment *seg, uintptr_t va, gp_block **spare,
                        size_t *nspare)
{
    gp_block *b = block_at(seg, va);
    assert(b->state == GP_BLOCK_FREE && b->addr <= va && va + p->page <= b->addr + b->size);
    gp_heap *heap = gp_heap_of(owner, false);
    gp_heap_remove(heap, b);
    gp_pages_carve(heap, b, va, p->page, spare, nspare)->state = GP_BLOCK_SHADOW;
}

/* The SHADOW home page at va becomes FREE again, coalesced with its free neighbours. */
static void unshadow_home(gp_pool_state *p, gp_stream_state *owner, gp_segment *seg, uintptr_t va, uint64_t now)
{
    gp_block *b = block_at(seg, va);
    assert(b->state == GP_BLOCK_SHADOW && b->addr == va && b->size == p->page);
    (void)p;
    gp_heap_release(gp_heap_of(owner, false), &owner->blocks, b)->free_since = now;
}

/*
 * Hands out the first n pages of the SHADOW block s of stitched range r (whose homes are free) for a
 * request of `size` on st (locked): the homes become SHADOW, the pages LIVE. NULL, with nothing
 * changed, when host memory is out.
 */
static gp_block *activate(gp_pool_state *p, gp_stream_state *st, gp_segment *r, gp_block *s, size_t n, size_t size)
{
    assert(s->state == GP_BLOCK_SHADOW && homes_free(p, r, s->addr, n));
    size_t want = 2 * n + 1, have = 0;
    gp_block **spare = malloc(want * sizeof *spare);
    if (spare == NULL || !gp_block_map_reserve(&st->live)) {
        free(spare);
        return NULL;
    }
    while (have < want && (spare[have] = gp_block_new(&st->blocks)) != NULL)
        have++;
    gp_block *out = NULL;
    if (have == want) {
        size_t first = gp_page_index(p, r, s->addr);
        for (size_t j = 0; j < n; j++) {
            gp_alias_home h = r->homes[first + j];
            shadow_home(p, st, h.seg, home_va(p, h), spare, &have);
        }
        if (s->size > n * p->page)
            gp_pages_split(s, n * p->page, spare[--have]);
        gp_hand_out(p, st, s, size);
        r->last_used = ++p->alias_clock;
        out = s;
    }
    while (have > 0)
        gp_block_recycle(&st->blocks, spare[--have]);
    free(spare);
    return out;
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
    for (size_t j = 0; j < n; j++) {
        gp_alias_home h = r->homes[first + j];
        unshadow_home(p, owner, h.seg, home_va(p, h), now);
    }
    b->state = GP_BLOCK_SHADOW;
    b->requested = 0;
    gp_block_drop_uses(b);
    gp_pages_merge(&owner->blocks, b);
    return true;
}

/* ---- taking and making stitched ranges --------------------------------------------------------- */

gp_block *gp_alias_take(gp_pool_state *p, gp_stream_state *st, size_t rsize, size_t size)
{
    size_t n = gp_div_up(rsize, p->page);
    pthread_mutex_lock(&st->lock);
    gp_block *best = NULL;
    gp_segment *best_range = NULL;
    for (gp_segment *r = p->segments_head; r != NULL; r = r->next) {
        if (!r->stitched || r->owner != st || r->paused || r->aliased < n)
            continue;
        for (gp_block *b = r->first; b != NULL; b = b->next)
            if (b->state == GP_BLOCK_SHADOW && b->size >= n * p->page && (best == NULL || b->size < best->size) &&
                homes_free(p, r, b->addr, n)) {
                best = b;
                best_range = r;
            }
    }
    gp_block *out = best != NULL ? activate(p, st, best_range, best, n, size) : NULL;
    pthread_mutex_unlock(&st->lock);
    return out;
}

/* Unmaps the n SHADOW pages of stitched range r from page index i (owner locked): they become
 * UNMAPPED and their homes lose an alias. Returns GP_OK, or the failure (nothing changed). */
static int drop_slots(gp_pool_state *p, gp_segment *r, size_t i, size_t n)
{
    gp_stream_state *owner = r->owner;
    uintptr_t va = r->addr + i * p->page;
    gp_block *b = block_at(r, va);
    assert(b->state == GP_BLOCK_SHADOW && va + n * p->page <= b->addr + b->size);
    gp_block *spare[2] = {gp_block_new(&owner->blocks), gp_block_new(&owner->blocks)};
    size_t left = 2, done = 0;
    int rc = GP_OK;
    if (spare[0] == NULL || spare[1] == NULL)
        rc = gp_error_set(GP_ERR_OOM, "out of host memory for block metadata");
    else
        rc = gp_pages_unmap_run(p, va, n, &done); /* after one device synchronize */
    atomic_fetch_add(&p->num_unmaps, done);
    if (done > 0) {
        gp_block *mid = gp_pages_carve(NULL, b, va, done * p->page, spare, &left);
        mid->state = GP_BLOCK_UNMAPPED;
        gp_pages_merge(&owner->blocks, mid);
        for (size_t j = i; j < i + done; j++) {
            gp_alias_home *h = &r->homes[j];
            h->seg->alias_count[h->index]--;
            h->seg->aliased--;
            r->aliased--;
            r->pages[j] = GP_PHYS_NONE;
            h->seg = NULL;
        }
    }
    while (left > 0)
        if (spare[--left] != NULL)
            gp_block_recycle(&owner->blocks, spare[left]);
    return rc;
}

/* Unmaps every idle alias slot of stitched range r (owner locked): GP_OK or the first failure. */
static int drop_idle_slots(gp_pool_state *p, gp_segment *r)
{
    for (gp_block *b = r->first; b != NULL;) {
        if (b->state != GP_BLOCK_SHADOW) {
            b = b->next;
            continue;
        }
        uintptr_t end = b->addr + b->size;
        int rc = drop_slots(p, r, gp_page_index(p, r, b->addr), b->size / p->page);
        if (rc != GP_OK)
            return rc;
        b = block_at(r, end - 1)->next; /* the blocks around were merged: go on after what was dropped */
    }
    return GP_OK;
}

/* True when every mapped page of stitched range r is idle (SHADOW): no block of it is in use. */
static bool wholly_idle(const gp_segment *r)
{
    for (const gp_block *b = r->first; b != NULL; b = b->next)
        if (b->state != GP_BLOCK_SHADOW && b->state != GP_BLOCK_UNMAPPED)
            return false;
    return true;
}

/*
 * Keeps st's alias slots within the pages of its ordinary ranges once `more` are added: unmaps the
 * idle stitched ranges of st least recently handed out until they fit (or none is left). st locked.
 */
static void bound_aliases(gp_pool_state *p, gp_stream_state *st, size_t more)
{
    for (;;) {
        size_t slots = more, pages = 0;
        gp_segment *oldest = NULL;
        for (gp_segment *seg = p->segments_head; seg != NULL; seg = seg->next) {
            if (seg->owner != st || seg->small || seg->pages == NULL)
                continue;
            if (!seg->stitched) {
                pages += seg->mapped_bytes / p->page;
                continue;
            }
            slots += seg->aliased;
            if (seg->aliased > 0 && wholly_idle(seg) && (oldest == NULL || seg->last_used < oldest->last_used))
                oldest = seg;
        }
        if (slots <= pages || oldest == NULL || drop_idle_slots(p, oldest) != GP_OK)
            return;
    }
}

/* A whole free page of st's ordinary ranges that may become an alias's home. */
typedef struct candidate {
    gp_segment *seg;
    size_t index;
    size_t block_size; /* of the FREE block it lies in */
} candidate;

static int smaller_block_first(const void *a, const void *b)
{
    const candidate *x = a, *y = b;
    if (x->block_size != y->block_size)
        return x->block_size < y->block_size ? -1 : 1;
    if (x->seg != y->seg)
        return x->seg->serial < y->seg->serial ? -1 : 1;
    return x->index < y->index ? -1 : (x->index > y->index);
}

/* Every whole free page of st's ordinary large ranges (st locked), or NULL with *count 0 when host
 * memory is out; the caller frees the array. */
static candidate *free_pages(gp_pool_state *p, gp_stream_state *st, size_t *count)
{
    size_t n = 0, cap = 0;
    candidate *c = NULL;
    for (gp_segment *seg = p->segments_head; seg != NULL; seg = seg->next) {
        if (!home_range(seg, st))
            continue;
        for (const gp_block *b = seg->first; b != NULL; b = b->next) {
            if (b->size < p->page || b->state != GP_BLOCK_FREE)
                continue;
            uintptr_t va = seg->addr + gp_div_up(b->addr - seg->addr, p->page) * p->page;
            for (; va + p->page <= b->addr + b->size; va += p->page) {
                size_t i = gp_page_index(p, seg, va);
                if (seg->alias_count != NULL && seg->alias_count[i] == UINT16_MAX)
                    continue;
                if (n == cap) {
                    cap = cap ? cap * 2 : 64;
                    candidate *grown = realloc(c, cap * sizeof *c);
                    if (grown == NULL) {
                        free(c);
                        *count = 0;
                        return NULL;
                    }
                    c = grown;
                }
                c[n++] = (candidate){seg, i, b->size};
            }
        }
    }
    *count = n;
    return c;
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
        if (h->alias_count == NULL && (h->alias_count = calloc(h->size / p->page, sizeof *h->alias_count)) == NULL) {
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

size_t gp_alias_free_pages(gp_pool_state *p, gp_stream_state *st)
{
    pthread_mutex_lock(&st->lock);
    size_t count = 0;
    free(free_pages(p, st, &count)); /* NULL with count 0 when host memory is out: nothing to stitch */
    pthread_mutex_unlock(&st->lock);
    return count;
}

gp_block *gp_alias_stitch(gp_pool_state *p, gp_stream_state *st, size_t rsize, size_t size)
{
    size_t n = gp_div_up(rsize, p->page);
    if (n < 2) /* a request of one page that missed finds no whole free page */
        return NULL;
    pthread_mutex_lock(&st->lock);
    size_t count = 0;
    candidate *c = free_pages(p, st, &count);
    gp_block *out = NULL;
    if (count >= n) {
        /* The pages of the smallest free blocks first: those are the fragments that no request of this
         * size fits; larger free blocks stay whole for the requests they do fit. */
        qsort(c, count, sizeof *c, smaller_block_first);
        bound_aliases(p, st, n);
        size_t mapped = 0;
        int rc = GP_OK;
        gp_segment *r = new_stitched_range(p, st, c, n, &mapped, &rc);
        if (r != NULL && mapped == n) {
            out = activate(p, st, r, r->first, n, size);
            atomic_fetch_add(&p->num_stitches, 1);
        }
    }
    free(c);
    pthread_mutex_unlock(&st->lock);
    return out;
}

/* ---- undoing aliases ---------------------------------------------------------------------------- */

size_t gp_alias_unshare(gp_pool_state *p, gp_segment *seg, uintptr_t first, size_t n, int *rc)
{
    assert(!seg->stitched);
    if (seg->aliased == 0)
        return n;
    size_t i0 = gp_page_index(p, seg, first);
    for (size_t k = 0; k < n; k++) {
        size_t i = i0 + k;
        for (gp_segment *r = p->segments_head; r != NULL && seg->alias_count[i] > 0; r = r->next) {
            if (!r->stitched || r->owner != seg->owner || r->aliased == 0)
                continue;
            for (size_t j = 0; j < r->size / p->page && seg->alias_count[i] > 0; j++) {
                if (r->homes[j].seg != seg || r->homes[j].index != i)
                    continue;
                int one = drop_slots(p, r, j, 1); /* SHADOW: its home is free, so in use there */
                if (one != GP_OK) {
                    if (*rc == GP_OK)
                        *rc = one;
                    return k;
                }
            }
        }
    }
    return n;
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

/* The page j of stitched range r, in use there, becomes r's own: its SHADOW home is unmapped. */
static int own_page(gp_pool_state *p, gp_segment *r, size_t j)
{
    gp_alias_home *h = &r->homes[j];
    gp_stream_state *owner = r->owner;
    uintptr_t va = home_va(p, *h);
    gp_block *b = block_at(h->seg, va);
    assert(b->state == GP_BLOCK_SHADOW && b->addr == va && b->size == p->page);
    size_t done = 0;
    int rc = gp_pages_unmap_run(p, va, 1, &done);
    atomic_fetch_add(&p->num_unmaps, done);
    if (done == 0)
        return rc;
    b->state = GP_BLOCK_UNMAPPED;
    gp_pages_merge(&owner->blocks, b);
    h->seg->pages[h->index] = GP_PHYS_NONE;
    h->seg->mapped_bytes -= p->page; /* the page is counted where it is now (same tenant: held unchanged) */
    r->mapped_bytes += p->page;
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
            int rc = own_page(p, r, j);
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
        for (size_t i = 0; seg->alias_count != NULL && i < pages; i++)
            sum += seg->alias_count[i];
        return sum == seg->aliased ? NULL : "a range's aliased count disagrees with its pages' alias counts";
    }
    size_t own = 0, aliased = 0;
    for (size_t j = 0; j < pages; j++) {
        uintptr_t va = seg->addr + j * p->page;
        const gp_block *b = block_at(seg, va);
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
        if (h.seg->stitched || h.seg->owner != seg->owner || h.seg->alias_count == NULL ||
            h.seg->alias_count[h.index] == 0 || h.seg->pages[h.index] != seg->pages[j])
            return "a stitched page's home is not a page of its owner's ranges that counts it";
        const gp_block *hb = block_at(h.seg, home_va(p, h));
        if (hb->state == GP_BLOCK_UNMAPPED)
            return "a stitched page's home is unmapped";
        if (b->state != GP_BLOCK_SHADOW && hb->state != GP_BLOCK_SHADOW)
            return "a page is in use at two addresses (a stitched page and its home)";
    }
    if (aliased != seg->aliased)
        return "a stitched range's aliased count disagrees with its homes";
    return own == seg->mapped_bytes ? NULL : "a stitched range's mapped_bytes disagrees with the pages it owns";
}
