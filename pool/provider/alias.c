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
#include "provider/provider.h"

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
        if (!r->stitched || r->small || r->owner != st || r->paused || r->aliased < n)
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
 * no device call (gp_alias_small_settle): the alias becomes an idle SHADOW slot, which is on no free
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
 * (gp_alias_small_recall, from steal_range in provider/vmm.c).
 *
 * Bounds. A stream's small alias slots never exceed the mapped pages of its ordinary large ranges (as
 * for stitched ranges: each slot is a page-table entry and host metadata); past that the small heap
 * grows as before.
 */

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
        shadow_home(p, st, h.seg, home_va(p, h), spare, &have);
        gp_block *slot = gp_pages_carve(NULL, block_at(r, va), va, p->page, spare, &have);
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
                if (homes_free(p, r, va, 1))
                    return lend_slot(p, st, r, va);
        }
    }
    return false;
}

/* The last page of the smallest FREE block of st's ordinary large ranges that ends where the range's
 * mapped memory does (an UNMAPPED block follows it), when it is a whole page that may take one more
 * alias; false when no range has one. st locked. */
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
            if ((last - seg->addr) % p->page == 0 && (seg->alias_count == NULL || seg->alias_count[i] < UINT16_MAX)) {
                *out = (candidate){seg, i, b->size};
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
    if (c.seg->alias_count == NULL && (c.seg->alias_count = calloc(c.seg->size / p->page, sizeof *c.seg->alias_count)) == NULL)
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
    pthread_mutex_lock(&st->lock);
    bool lent = reuse_slot(p, st);
    if (!lent) {
        size_t slots = 0, pages = 0;
        for (gp_segment *seg = p->segments_head; seg != NULL; seg = seg->next) {
            if (home_range(seg, st))
                pages += seg->mapped_bytes / p->page;
            else if (small_alias_range(seg, st))
                slots += seg->aliased;
        }
        candidate c = {NULL, 0, 0};
        lent = slots < pages && frontier_page(p, st, &c) && new_slot(p, st, c);
    }
    pthread_mutex_unlock(&st->lock);
    return lent ? gp_provider_take(p, st, NULL, true, rsize, size) : NULL;
}

bool gp_alias_small_settle(gp_pool_state *p, gp_stream_state *owner, gp_block *m)
{
    gp_segment *r = m->segment;
    assert(r->stitched && r->small && m->state == GP_BLOCK_FREE);
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
        if (spare[0] != NULL && spare[1] != NULL) { /* else the pages stay lent: correct, only held */
            gp_heap *heap = gp_heap_of(owner, true);
            gp_heap_remove(heap, m);
            gp_block *mid = gp_pages_carve(heap, m, va, n * p->page, spare, &left);
            uint64_t now = atomic_load_explicit(&p->coarse_now, memory_order_relaxed);
            for (size_t k = 0; k < n; k++) {
                gp_alias_home h = r->homes[j + k];
                unshadow_home(p, owner, h.seg, home_va(p, h), now);
            }
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
        m = block_at(r, va);
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
                    again = gp_alias_small_settle(p, st, b);
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
    pthread_mutex_lock(&st->lock);
    for (gp_segment *r = p->segments_head; r != NULL; r = r->next) {
        if (!small_alias_range(r, st) || r->aliased == 0)
            continue;
        for (size_t j = 0; j < r->size / p->page && r->aliased > 0; j++) {
            gp_alias_home h = r->homes[j];
            if (h.seg == NULL || block_at(r, r->addr + j * p->page)->state == GP_BLOCK_SHADOW)
                continue;
            /* the home's other alias slots are idle (it is in use here): unmapped first, so that the
             * page keeps one address once its home is unmapped */
            bool dropped = true;
            for (gp_segment *o = p->segments_head; o != NULL && dropped && h.seg->alias_count[h.index] > 1; o = o->next) {
                if (!o->stitched || o->owner != st || o->aliased == 0)
                    continue;
                for (size_t k = 0; k < o->size / p->page && dropped; k++)
                    if ((o != r || k != j) && o->homes[k].seg == h.seg && o->homes[k].index == h.index)
                        dropped = drop_slots(p, o, k, 1) == GP_OK;
            }
            if (dropped && h.seg->alias_count[h.index] == 1)
                (void)own_page(p, r, j); /* a failure leaves it lent: nothing lost */
        }
    }
    pthread_mutex_unlock(&st->lock);
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
                bool idle = block_at(r, r->addr + j * p->page)->state == GP_BLOCK_SHADOW;
                if (idle && !in_use && drop_slots(p, r, j, 1) != GP_OK)
                    return false;
                if (!idle && in_use && (h.seg->alias_count[h.index] != 1 || own_page(p, r, j) != GP_OK))
                    return false;
            }
        }
    }
    return seg->aliased == 0;
}
