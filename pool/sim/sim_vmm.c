/*
 * sim_vmm.c — the device memory of "sim-vmm": CUDA's virtual memory management, simulated on host
 * memory so that mapping really moves pages and contents can be checked.
 *
 * Physical memory is one memfd of `capacity` bytes (device_memory rounded up to 2 MiB), cut into
 * 2 MiB pages. A physical handle (phys_create) takes the lowest free pages, not necessarily
 * contiguous — as on a GPU, where the MMU stitches pages, a handle never fails for fragmentation,
 * only when fewer pages than it needs are free. Releasing a handle punches its pages out of the
 * memfd (fallocate PUNCH_HOLE), so its contents are gone. Both page sets, physical and virtual, are
 * sim_bitmap.c's first-fit bitmaps.
 *
 * Virtual addresses come from one PROT_NONE, MAP_NORESERVE anonymous region, 2 MiB aligned, of room
 * for GPSIM_VA_RANGES reservations of the whole device (capped at GPSIM_VA_MAX, and halved down to 4
 * such reservations while the host refuses that much); a reservation is a first-fit run of its pages.
 * A GPU's address space is that of the process (47 bits on x86-64: 128 TiB), so hundreds of ranges of
 * its whole memory fit, as PyTorch's expandable segments and the pool's ranges reserve; a sim with
 * room for only a few would make a pool on it fall back to ranges that cannot grow where a GPU would
 * not. map() puts the handle's pages at the
 * address with one mmap(MAP_SHARED | MAP_FIXED, PROT_NONE) per run of consecutive memfd pages, so a
 * page mapped at two addresses is one page of memory seen twice; unmap() puts fresh PROT_NONE
 * anonymous memory back. The host can touch none of it: kernels open their range while they run
 * (sim_memory.c's effects), exactly as with "sim".
 *
 * mem_alloc on "sim-vmm" draws from the same physical memory: an allocation is a reservation, a
 * handle and a mapping made in one go, kept apart (allocations[]) from the pool's own ones.
 *
 * Kernels are translated to physical pieces at launch (gpsim_vmm_translate), and the race checker
 * compares those, not addresses. Everything here runs under the sim's lock.
 */
#define _GNU_SOURCE
#include "sim/sim_internal.h"

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "base/error.h"
#include "base/format.h"

#define GPSIM_VA_EXTRA ((size_t)64 << 30)    /* address space beyond the ranges' room */
#define GPSIM_VA_RANGES 64                   /* reservations of the whole device the address space holds */
#define GPSIM_VA_MIN_RANGES 4                /* the least, where the host gives no more */
#define GPSIM_VA_MAX ((size_t)16 << 40)      /* 16 TiB: an eighth of a 47-bit address space */
#define GPSIM_CAPACITY_MAX ((size_t)1 << 44) /* 16 TiB, as "sim" */
#define GPSIM_HANDLE_BASE ((gp_phys)0x7a0000000000ull) /* handle ids: BASE + n, n = 1, 2, ... */

static size_t round_up(size_t value, size_t granule)
{
    return (value + granule - 1) / granule * granule;
}

static int host_oom(const char *what)
{
    return gp_error_set(GP_ERR_DEVICE, "sim: host out of memory for %s", what);
}

/* Host calls that undo or clear state cannot be rolled back: if they fail the sim is broken. */
static void fatal(const char *what, gp_devptr va, size_t size)
{
    fprintf(stderr, "gpupool sim: %s at 0x%" PRIxPTR " (+%zu) failed: %s\n", what, va, size, strerror(errno));
    abort();
}

/* ---- range lists ------------------------------------------------------------------------------ */

/* Index of the last range whose va <= va, or l->count when there is none. */
static size_t list_at_or_below(const gpsim_range_list *l, gp_devptr va)
{
    size_t lo = 0, hi = l->count;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (l->items[mid].va <= va)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo == 0 ? l->count : lo - 1;
}

/* The range that contains address va, or NULL. */
static const gpsim_vmm_range *list_containing(const gpsim_range_list *l, gp_devptr va)
{
    size_t i = list_at_or_below(l, va);
    if (i == l->count || va - l->items[i].va >= l->items[i].size)
        return NULL;
    return &l->items[i];
}

static size_t list_find_exact(const gpsim_range_list *l, gp_devptr va, size_t size)
{
    size_t i = list_at_or_below(l, va);
    if (i < l->count && l->items[i].va == va && l->items[i].size == size)
        return i;
    return l->count;
}

/* Room for one more range; false on host out-of-memory (list unchanged). */
static bool list_reserve(gpsim_range_list *l)
{
    if (l->count < l->capacity)
        return true;
    size_t capacity = l->capacity ? l->capacity * 2 : 32;
    gpsim_vmm_range *grown = realloc(l->items, capacity * sizeof *grown);
    if (grown == NULL)
        return false;
    l->items = grown;
    l->capacity = capacity;
    return true;
}

/* pre: list_reserve(l) succeeded and r overlaps no range of l. */
static void list_insert(gpsim_range_list *l, gpsim_vmm_range r)
{
    assert(l->count < l->capacity);
    size_t below = list_at_or_below(l, r.va);
    size_t slot = below == l->count ? 0 : below + 1;
    memmove(&l->items[slot + 1], &l->items[slot], (l->count - slot) * sizeof l->items[0]);
    l->items[slot] = r;
    l->count++;
}

static void list_remove_at(gpsim_range_list *l, size_t i)
{
    assert(i < l->count);
    memmove(&l->items[i], &l->items[i + 1], (l->count - i - 1) * sizeof l->items[0]);
    l->count--;
}

/* ---- host mappings ---------------------------------------------------------------------------- */

/* Puts fresh PROT_NONE anonymous memory over [va, va+size): nothing mapped there any more. */
static void restore_reserved(gp_devptr va, size_t size)
{
    void *at = mmap((void *)va, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
    if (at == MAP_FAILED)
        fatal("mmap(MAP_FIXED, PROT_NONE) to unmap simulated device memory", va, size);
}

/* Maps h's pages at va, one mmap per run of consecutive memfd pages. On failure nothing stays mapped
 * (GP_ERR_DEVICE, message set). */
static int map_pages(const gpsim_vmm *vmm, gp_devptr va, const gpsim_phys_handle *h)
{
    size_t pages = h->size / GPSIM_PAGE_SIZE;
    for (size_t i = 0; i < pages;) {
        size_t run = 1;
        while (i + run < pages && h->pages[i + run] == h->pages[i] + run)
            run++;
        gp_devptr at = va + i * GPSIM_PAGE_SIZE;
        void *got = mmap((void *)at, run * GPSIM_PAGE_SIZE, PROT_NONE, MAP_SHARED | MAP_FIXED, vmm->memfd,
                         (off_t)(h->pages[i] * GPSIM_PAGE_SIZE));
        if (got == MAP_FAILED) {
            int err = errno;
            if (i > 0)
                restore_reserved(va, i * GPSIM_PAGE_SIZE);
            return gp_error_set(GP_ERR_DEVICE,
                                "sim: mmap of physical page %zu at 0x%" PRIxPTR " for a mapping of %zu bytes "
                                "at 0x%" PRIxPTR " failed: %s",
                                h->pages[i], at, h->size, va, strerror(err));
        }
        i += run;
    }
    return GP_OK;
}

/* ---- handles ---------------------------------------------------------------------------------- */

static size_t free_physical(const gpsim_vmm *vmm)
{
    return vmm->capacity - vmm->allocated_bytes;
}

static int physical_oom(const gpsim_vmm *vmm, size_t size)
{
    char want[GP_SIZE_TEXT_MAX], avail[GP_SIZE_TEXT_MAX], total[GP_SIZE_TEXT_MAX];
    return gp_error_set(GP_ERR_OOM, "sim: out of device memory: requested %s, %s free of %s",
                        gp_format_size(size, want), gp_format_size(free_physical(vmm), avail),
                        gp_format_size(vmm->capacity, total));
}

/* A handle of `size` bytes of the lowest free pages. GP_ERR_OOM / GP_ERR_DEVICE, nothing changed. */
static int handle_new(gpsim_vmm *vmm, size_t size, gpsim_phys_handle **out)
{
    assert(size > 0 && size % GPSIM_PAGE_SIZE == 0);
    if (size > free_physical(vmm))
        return physical_oom(vmm, size);
    gpsim_phys_handle *h = calloc(1, sizeof *h);
    size_t *pages = malloc(size / GPSIM_PAGE_SIZE * sizeof *pages);
    if (h == NULL || pages == NULL) {
        free(h);
        free(pages);
        return host_oom("a physical handle");
    }
    gpsim_bitmap_take(&vmm->phys, size / GPSIM_PAGE_SIZE, pages);
    h->size = size;
    h->pages = pages;
    vmm->allocated_bytes += size;
    if (vmm->allocated_bytes > vmm->allocated_peak)
        vmm->allocated_peak = vmm->allocated_bytes;
    *out = h;
    return GP_OK;
}

/* Returns the pages, emptied, and frees h. pre: mapped nowhere. */
static void handle_delete(gpsim_vmm *vmm, gpsim_phys_handle *h)
{
    assert(h->map_count == 0);
    size_t pages = h->size / GPSIM_PAGE_SIZE;
    for (size_t i = 0; i < pages;) {
        size_t run = 1;
        while (i + run < pages && h->pages[i + run] == h->pages[i] + run)
            run++;
        if (fallocate(vmm->memfd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                      (off_t)(h->pages[i] * GPSIM_PAGE_SIZE), (off_t)(run * GPSIM_PAGE_SIZE)) != 0)
            fatal("fallocate(PUNCH_HOLE) to clear released physical memory", h->pages[i] * GPSIM_PAGE_SIZE,
                  run * GPSIM_PAGE_SIZE);
        i += run;
    }
    for (size_t i = 0; i < pages; i++)
        gpsim_bitmap_clear_run(&vmm->phys, h->pages[i], 1);
    vmm->allocated_bytes -= h->size;
    free(h->pages);
    free(h);
}

/* Index in handles[] of id, or handle_count. */
static size_t handle_index(const gpsim_vmm *vmm, gp_phys id)
{
    size_t lo = 0, hi = vmm->handle_count;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (vmm->handles[mid]->id < id)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < vmm->handle_count && vmm->handles[lo]->id == id ? lo : vmm->handle_count;
}

gpsim_phys_handle *gpsim_vmm_handle_find(const gpsim_vmm *vmm, gp_phys id)
{
    size_t i = handle_index(vmm, id);
    return i == vmm->handle_count ? NULL : vmm->handles[i];
}

/* ---- open and close --------------------------------------------------------------------------- */

int gpsim_vmm_open(gpsim_vmm *vmm, size_t requested_capacity)
{
    memset(vmm, 0, sizeof *vmm);
    vmm->memfd = -1;
    if (requested_capacity == 0)
        return gp_error_set(GP_ERR_BACKEND, "sim: device_memory is 0; the simulated device needs a capacity");
    if (requested_capacity > GPSIM_CAPACITY_MAX)
        return gp_error_set(GP_ERR_BACKEND, "sim: device_memory %zu is too large", requested_capacity);

    size_t capacity = round_up(requested_capacity, GPSIM_PAGE_SIZE);
    char text[GP_SIZE_TEXT_MAX];
    int fd = memfd_create("gpupool-sim-vmm", MFD_CLOEXEC);
    if (fd < 0)
        return gp_error_set(GP_ERR_BACKEND, "sim-vmm: memfd_create for %s of physical memory: %s",
                            gp_format_size(capacity, text), strerror(errno));
    if (ftruncate(fd, (off_t)capacity) != 0) {
        int err = errno;
        close(fd);
        return gp_error_set(GP_ERR_BACKEND, "sim-vmm: ftruncate of the physical memory memfd to %s: %s",
                            gp_format_size(capacity, text), strerror(err));
    }

    size_t ranges = GPSIM_VA_RANGES, span, mapped;
    void *raw;
    for (;;) {
        span = capacity * ranges + GPSIM_VA_EXTRA;
        if (span > GPSIM_VA_MAX && ranges > GPSIM_VA_MIN_RANGES) {
            ranges /= 2;
            continue;
        }
        mapped = span + GPSIM_PAGE_SIZE; /* over-map, then trim to a 2 MiB aligned range */
        raw = mmap(NULL, mapped, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (raw != MAP_FAILED || ranges <= GPSIM_VA_MIN_RANGES)
            break;
        ranges /= 2;
    }
    if (raw == MAP_FAILED) {
        int err = errno;
        close(fd);
        return gp_error_set(GP_ERR_BACKEND, "sim-vmm: cannot map %s of virtual address space: %s",
                            gp_format_size(span, text), strerror(err));
    }
    uintptr_t start = (uintptr_t)raw;
    uintptr_t aligned = round_up(start, GPSIM_PAGE_SIZE);
    size_t head = aligned - start;
    size_t tail = mapped - head - span;
    if (head > 0)
        munmap(raw, head);
    if (tail > 0)
        munmap((void *)(aligned + span), tail);

    vmm->memfd = fd;
    vmm->capacity = capacity;
    vmm->va_base = (unsigned char *)aligned;
    vmm->va_span = span;
    long host_page = sysconf(_SC_PAGESIZE);
    vmm->host_page_size = host_page > 0 ? (size_t)host_page : 4096;
    if (!gpsim_bitmap_init(&vmm->phys, capacity / GPSIM_PAGE_SIZE) ||
        !gpsim_bitmap_init(&vmm->va, span / GPSIM_PAGE_SIZE)) {
        gpsim_vmm_close(vmm);
        return gp_error_set(GP_ERR_BACKEND, "sim-vmm: host out of memory for the page bitmaps");
    }
    return GP_OK;
}

void gpsim_vmm_close(gpsim_vmm *vmm)
{
    if (vmm->phys.words != NULL && vmm->va.words != NULL) /* opened: in full, whenever check_after last did */
        gpsim_vmm_assert_invariants(vmm);
    for (size_t i = 0; i < vmm->handle_count; i++) {
        free(vmm->handles[i]->pages);
        free(vmm->handles[i]);
    }
    for (size_t i = 0; i < vmm->allocations.count; i++) {
        free(vmm->allocations.items[i].handle->pages);
        free(vmm->allocations.items[i].handle);
    }
    free(vmm->handles);
    free(vmm->reservations.items);
    free(vmm->mappings.items);
    free(vmm->allocations.items);
    gpsim_bitmap_destroy(&vmm->phys);
    gpsim_bitmap_destroy(&vmm->va);
    if (vmm->va_base != NULL)
        munmap(vmm->va_base, vmm->va_span);
    if (vmm->memfd >= 0)
        close(vmm->memfd);
    memset(vmm, 0, sizeof *vmm);
    vmm->memfd = -1;
}

/*
 * The invariants after an operation, at a cost the operations pay for. The full check
 * (gpsim_vmm_assert_invariants) walks both page bitmaps (the address space's has a bit per 2 MiB of up
 * to 16 TiB: 128 Ki words) and every handle, reservation and mapping. After every operation, a replay
 * that maps tens of thousands of pages became quadratic: a 52 GiB trace's first pass took 1.8 ms of host
 * time per event, nearly all of it here, and several models on a 320 GiB device 0.6 ms per event. So
 * the check runs once the operations since the last one have paid for it at GPSIM_CHECK_SHARE words
 * each: a sim small enough that a check costs at most that (every test device of a few GiB) is still
 * checked after every operation, a large one every cost / GPSIM_CHECK_SHARE operations. What a caller
 * asks of each operation (its preconditions, the pool's violations) is still checked on every call
 * (backend_sim.c); and the whole state once more at close.
 */
#define GPSIM_CHECK_SHARE 2048

static void check_after(gpsim_vmm *vmm)
{
#ifndef NDEBUG
    size_t cost = (vmm->phys.bits + vmm->va.bits) / 64 + vmm->handle_count + vmm->reservations.count +
                  vmm->mappings.count + vmm->allocations.count;
    if (++vmm->unchecked_ops * GPSIM_CHECK_SHARE < cost)
        return;
    vmm->unchecked_ops = 0;
    gpsim_vmm_assert_invariants(vmm);
#else
    (void)vmm;
#endif
}

/* ---- queries ---------------------------------------------------------------------------------- */

static bool in_span(const gpsim_vmm *vmm, gp_devptr va, size_t size)
{
    gp_devptr base = (gp_devptr)vmm->va_base;
    return va >= base && va - base <= vmm->va_span && size <= vmm->va_span - (va - base);
}

bool gpsim_vmm_is_reservation(const gpsim_vmm *vmm, gp_devptr va, size_t size)
{
    return list_find_exact(&vmm->reservations, va, size) < vmm->reservations.count;
}

bool gpsim_vmm_is_reserved(const gpsim_vmm *vmm, gp_devptr va, size_t size)
{
    const gpsim_vmm_range *r = list_containing(&vmm->reservations, va);
    return r != NULL && size > 0 && size <= r->size - (va - r->va);
}

size_t gpsim_vmm_mappings_in(const gpsim_vmm *vmm, gp_devptr va, size_t size)
{
    const gpsim_range_list *l = &vmm->mappings;
    size_t i = list_at_or_below(l, va);
    if (i == l->count)
        i = 0;
    else if (va - l->items[i].va >= l->items[i].size)
        i++; /* the one below ends before va */
    size_t n = 0;
    for (; i < l->count; i++) {
        const gpsim_vmm_range *m = &l->items[i];
        if (m->va >= va && m->va - va >= size)
            break; /* starts at or after the end */
        n++;
    }
    return n;
}

bool gpsim_vmm_is_mapping(const gpsim_vmm *vmm, gp_devptr va, size_t size)
{
    return list_find_exact(&vmm->mappings, va, size) < vmm->mappings.count;
}

bool gpsim_vmm_is_allocation(const gpsim_vmm *vmm, gp_devptr va, size_t size)
{
    return list_find_exact(&vmm->allocations, va, size) < vmm->allocations.count;
}

/* ---- reservations ----------------------------------------------------------------------------- */

static int va_take(gpsim_vmm *vmm, size_t size, gp_devptr *out)
{
    size_t first = 0;
    if (size > vmm->va_span || !gpsim_bitmap_find_run(&vmm->va, size / GPSIM_PAGE_SIZE, &first)) {
        char want[GP_SIZE_TEXT_MAX], used[GP_SIZE_TEXT_MAX], span[GP_SIZE_TEXT_MAX];
        return gp_error_set(GP_ERR_OOM,
                            "sim: out of virtual address space: cannot reserve %s (%s of %s reserved or "
                            "allocated%s)",
                            gp_format_size(size, want), gp_format_size(vmm->va.used * GPSIM_PAGE_SIZE, used),
                            gp_format_size(vmm->va_span, span),
                            (vmm->va.bits - vmm->va.used) * GPSIM_PAGE_SIZE >= size ? ", no contiguous range" : "");
    }
    gpsim_bitmap_set_run(&vmm->va, first, size / GPSIM_PAGE_SIZE);
    *out = (gp_devptr)(vmm->va_base + first * GPSIM_PAGE_SIZE);
    return GP_OK;
}

static void va_give_back(gpsim_vmm *vmm, gp_devptr va, size_t size)
{
    size_t first = (size_t)(va - (gp_devptr)vmm->va_base) / GPSIM_PAGE_SIZE;
    gpsim_bitmap_clear_run(&vmm->va, first, size / GPSIM_PAGE_SIZE);
}

int gpsim_vmm_va_reserve(gpsim_vmm *vmm, size_t size, gp_devptr *out)
{
    assert(size > 0 && size % GPSIM_PAGE_SIZE == 0);
    if (!list_reserve(&vmm->reservations))
        return host_oom("a reservation");
    gp_devptr va = 0;
    int rc = va_take(vmm, size, &va);
    if (rc != GP_OK)
        return rc;
    list_insert(&vmm->reservations, (gpsim_vmm_range){.va = va, .size = size});
    vmm->reserved_bytes += size;
    *out = va;
    check_after(vmm);
    return GP_OK;
}

void gpsim_vmm_va_release(gpsim_vmm *vmm, gp_devptr va, size_t size)
{
    size_t i = list_find_exact(&vmm->reservations, va, size);
    assert(i < vmm->reservations.count && gpsim_vmm_mappings_in(vmm, va, size) == 0);
    list_remove_at(&vmm->reservations, i);
    va_give_back(vmm, va, size);
    vmm->reserved_bytes -= size;
    check_after(vmm);
}

/* ---- physical memory -------------------------------------------------------------------------- */

int gpsim_vmm_phys_create(gpsim_vmm *vmm, size_t size, gp_phys *out)
{
    if (vmm->handle_count == vmm->handle_capacity) {
        size_t capacity = vmm->handle_capacity ? vmm->handle_capacity * 2 : 32;
        gpsim_phys_handle **grown = realloc(vmm->handles, capacity * sizeof *grown);
        if (grown == NULL)
            return host_oom("the handle table");
        vmm->handles = grown;
        vmm->handle_capacity = capacity;
    }
    gpsim_phys_handle *h = NULL;
    int rc = handle_new(vmm, size, &h);
    if (rc != GP_OK)
        return rc;
    h->id = GPSIM_HANDLE_BASE + ++vmm->handles_created;
    vmm->handles[vmm->handle_count++] = h; /* ids only grow: the table stays sorted */
    *out = h->id;
    check_after(vmm);
    return GP_OK;
}

void gpsim_vmm_phys_release(gpsim_vmm *vmm, gpsim_phys_handle *h)
{
    size_t i = handle_index(vmm, h->id);
    assert(i < vmm->handle_count && vmm->handles[i] == h);
    memmove(&vmm->handles[i], &vmm->handles[i + 1], (vmm->handle_count - i - 1) * sizeof vmm->handles[0]);
    vmm->handle_count--;
    handle_delete(vmm, h);
    check_after(vmm);
}

/* ---- mappings --------------------------------------------------------------------------------- */

int gpsim_vmm_map(gpsim_vmm *vmm, gp_devptr va, gpsim_phys_handle *h)
{
    assert(va % GPSIM_PAGE_SIZE == 0 && gpsim_vmm_is_reserved(vmm, va, h->size));
    assert(gpsim_vmm_mappings_in(vmm, va, h->size) == 0);
    if (!list_reserve(&vmm->mappings))
        return host_oom("a mapping");
    int rc = map_pages(vmm, va, h);
    if (rc != GP_OK)
        return rc;
    list_insert(&vmm->mappings, (gpsim_vmm_range){.va = va, .size = h->size, .handle = h});
    h->map_count++;
    vmm->mapped_bytes += h->size;
    check_after(vmm);
    return GP_OK;
}

void gpsim_vmm_unmap(gpsim_vmm *vmm, gp_devptr va, size_t size)
{
    size_t i = list_find_exact(&vmm->mappings, va, size);
    assert(i < vmm->mappings.count);
    gpsim_phys_handle *h = vmm->mappings.items[i].handle;
    restore_reserved(va, size);
    list_remove_at(&vmm->mappings, i);
    assert(h->map_count > 0);
    h->map_count--;
    vmm->mapped_bytes -= size;
    check_after(vmm);
}

/* ---- mem_alloc / mem_free --------------------------------------------------------------------- */

int gpsim_vmm_alloc(gpsim_vmm *vmm, size_t size, gp_devptr *out)
{
    assert(size > 0 && size % GPSIM_PAGE_SIZE == 0);
    if (size > free_physical(vmm))
        return physical_oom(vmm, size); /* before the address space: OOM means the memory */
    if (!list_reserve(&vmm->allocations))
        return host_oom("the allocation ledger");
    gp_devptr va = 0;
    int rc = va_take(vmm, size, &va);
    if (rc != GP_OK)
        return rc;
    gpsim_phys_handle *h = NULL;
    rc = handle_new(vmm, size, &h);
    if (rc == GP_OK && (rc = map_pages(vmm, va, h)) != GP_OK)
        handle_delete(vmm, h);
    if (rc != GP_OK) {
        va_give_back(vmm, va, size);
        return rc;
    }
    h->map_count = 1;
    list_insert(&vmm->allocations, (gpsim_vmm_range){.va = va, .size = size, .handle = h});
    *out = va;
    check_after(vmm);
    return GP_OK;
}

void gpsim_vmm_free(gpsim_vmm *vmm, gp_devptr va, size_t size)
{
    size_t i = list_find_exact(&vmm->allocations, va, size);
    assert(i < vmm->allocations.count);
    gpsim_phys_handle *h = vmm->allocations.items[i].handle;
    restore_reserved(va, size);
    list_remove_at(&vmm->allocations, i);
    h->map_count = 0;
    handle_delete(vmm, h);
    va_give_back(vmm, va, size);
    check_after(vmm);
}

/* ---- translation ------------------------------------------------------------------------------ */

static int piece_order(const void *a, const void *b)
{
    uint64_t x = ((const gpsim_piece *)a)->offset, y = ((const gpsim_piece *)b)->offset;
    return x < y ? -1 : x > y;
}

/* Appends the physical memory behind [va, va+len) of range r (which contains it) to pieces. */
static size_t translate_range(const gpsim_vmm_range *r, gp_devptr va, size_t len, gpsim_piece *pieces, size_t n)
{
    while (len > 0) {
        size_t offset = (size_t)(va - r->va);
        size_t in_page = offset % GPSIM_PAGE_SIZE;
        size_t take = GPSIM_PAGE_SIZE - in_page < len ? GPSIM_PAGE_SIZE - in_page : len;
        pieces[n++] = (gpsim_piece){
            .offset = (uint64_t)r->handle->pages[offset / GPSIM_PAGE_SIZE] * GPSIM_PAGE_SIZE + in_page,
            .len = take};
        va += take;
        len -= take;
    }
    return n;
}

int gpsim_vmm_translate(const gpsim_vmm *vmm, gp_devptr va, size_t len, gpsim_piece **out, size_t *count)
{
    assert(len > 0);
    if (!in_span(vmm, va, len))
        return GP_ERR_INVALID;
    /* one piece per 2 MiB page touched at most, before merging */
    size_t pages = (size_t)((va + len - 1) / GPSIM_PAGE_SIZE - va / GPSIM_PAGE_SIZE) + 1;
    gpsim_piece *pieces = malloc(pages * sizeof *pieces);
    if (pieces == NULL)
        return host_oom("a kernel's translation");

    size_t n = 0;
    const gpsim_vmm_range *a = list_containing(&vmm->allocations, va);
    if (a != NULL) {
        if (len > a->size - (va - a->va)) {
            free(pieces);
            return GP_ERR_INVALID; /* a kernel stays inside one mem_alloc allocation */
        }
        n = translate_range(a, va, len, pieces, n);
    } else {
        /* consecutive mappings, each starting where the one before ends */
        const gpsim_range_list *l = &vmm->mappings;
        size_t i = list_at_or_below(l, va);
        gp_devptr at = va, end = va + len;
        while (at < end) {
            if (i >= l->count || l->items[i].va > at || at - l->items[i].va >= l->items[i].size) {
                free(pieces);
                return GP_ERR_INVALID;
            }
            const gpsim_vmm_range *m = &l->items[i];
            size_t take = m->size - (size_t)(at - m->va) < end - at ? m->size - (size_t)(at - m->va) : end - at;
            n = translate_range(m, at, take, pieces, n);
            at += take;
            i++;
        }
    }
    assert(n <= pages);

    /* sort by physical offset and merge what overlaps or touches (a page seen through two mappings) */
    qsort(pieces, n, sizeof *pieces, piece_order);
    size_t merged = 0;
    for (size_t k = 0; k < n; k++) {
        if (merged > 0 && pieces[k].offset <= pieces[merged - 1].offset + pieces[merged - 1].len) {
            uint64_t end = pieces[k].offset + pieces[k].len;
            uint64_t last_end = pieces[merged - 1].offset + pieces[merged - 1].len;
            if (end > last_end)
                pieces[merged - 1].len = (size_t)(end - pieces[merged - 1].offset);
        } else {
            pieces[merged++] = pieces[k];
        }
    }
    *out = pieces;
    *count = merged;
    return GP_OK;
}

bool gpsim_pieces_overlap(const gpsim_piece *a, size_t a_count, const gpsim_piece *b, size_t b_count,
                          uint64_t *offset)
{
    size_t i = 0, j = 0;
    while (i < a_count && j < b_count) {
        uint64_t a_end = a[i].offset + a[i].len, b_end = b[j].offset + b[j].len;
        if (a[i].offset < b_end && b[j].offset < a_end) {
            *offset = a[i].offset > b[j].offset ? a[i].offset : b[j].offset;
            return true;
        }
        if (a_end <= b_end)
            i++;
        else
            j++;
    }
    return false;
}

/* ---- invariants ------------------------------------------------------------------------------- */

void gpsim_vmm_assert_invariants(const gpsim_vmm *vmm)
{
#ifndef NDEBUG
    size_t handle_bytes = 0, map_counts = 0;
    for (size_t i = 0; i < vmm->handle_count; i++) {
        const gpsim_phys_handle *h = vmm->handles[i];
        assert(h->size > 0 && h->size % GPSIM_PAGE_SIZE == 0);
        assert(i == 0 || vmm->handles[i - 1]->id < h->id);
        handle_bytes += h->size;
        map_counts += h->map_count;
    }
    size_t allocation_bytes = 0;
    for (size_t i = 0; i < vmm->allocations.count; i++) {
        const gpsim_vmm_range *r = &vmm->allocations.items[i];
        assert(r->handle != NULL && r->handle->size == r->size && r->handle->map_count == 1);
        assert(i == 0 || vmm->allocations.items[i - 1].va + vmm->allocations.items[i - 1].size <= r->va);
        allocation_bytes += r->size;
    }
    size_t reserved = 0;
    for (size_t i = 0; i < vmm->reservations.count; i++) {
        const gpsim_vmm_range *r = &vmm->reservations.items[i];
        assert(r->size > 0 && r->size % GPSIM_PAGE_SIZE == 0 && in_span(vmm, r->va, r->size));
        assert(i == 0 || vmm->reservations.items[i - 1].va + vmm->reservations.items[i - 1].size <= r->va);
        reserved += r->size;
    }
    size_t mapped = 0;
    /* both lists are sorted by address: one sweep finds each mapping's reservation */
    const gpsim_range_list *res = &vmm->reservations;
    size_t j = 0;
    for (size_t i = 0; i < vmm->mappings.count; i++) {
        const gpsim_vmm_range *m = &vmm->mappings.items[i];
        assert(m->handle != NULL && m->handle->size == m->size && m->handle->id != 0);
        while (j < res->count && res->items[j].va + res->items[j].size <= m->va)
            j++;
        /* inside one reservation: it starts at or below the mapping and ends at or past its end */
        assert(j < res->count && res->items[j].va <= m->va &&
               m->size <= res->items[j].size - (m->va - res->items[j].va));
        assert(i == 0 || vmm->mappings.items[i - 1].va + vmm->mappings.items[i - 1].size <= m->va);
        mapped += m->size;
    }
    gpsim_bitmap_assert_invariants(&vmm->phys);
    gpsim_bitmap_assert_invariants(&vmm->va);
    assert(vmm->allocated_bytes == vmm->phys.used * GPSIM_PAGE_SIZE);
    assert(vmm->allocated_bytes == handle_bytes + allocation_bytes);
    assert(vmm->allocated_bytes <= vmm->allocated_peak && vmm->allocated_peak <= vmm->capacity);
    assert(vmm->va.used * GPSIM_PAGE_SIZE == reserved + allocation_bytes);
    assert(reserved == vmm->reserved_bytes && mapped == vmm->mapped_bytes);
    assert(map_counts == vmm->mappings.count);
#else
    (void)vmm;
#endif
}
