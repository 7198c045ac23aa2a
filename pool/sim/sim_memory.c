/*
 * sim_memory.c — the simulated device's memory.
 *
 * One host mapping of `span` bytes, 2 MiB aligned, mapped PROT_NONE with MAP_NORESERVE: the host
 * can never touch it, so a pool that dereferences a device pointer crashes at once. Only simulated
 * kernels open a (page-rounded) range PROT_READ|PROT_WRITE while their effect is applied.
 *
 * The span is GPSIM_SPAN_FACTOR times the capacity, as on a real GPU, where cudaMalloc maps physical
 * pages into a virtual address space far larger than the memory: an allocation fails only when the
 * capacity is used up, not because free memory is scattered (no contiguous range is needed in
 * physical memory). Allocation is first fit over a bitmap of the span's 2 MiB pages (sim_bitmap.c).
 * The ledger lists the live allocations sorted by address; frees are checked against it. A free drops
 * the contents (MADV_DONTNEED), so memory read after free-and-reallocate reads zeros, not stale data.
 *
 * The kernel effects at the end (patterns, reads) serve "sim-vmm" too, whose memory is sim_vmm.c's.
 *
 * Patterns: WRITE stores, at byte offset o from the start of its range, byte (o % 8) of the 64-bit word
 * pattern_word(seed, o / 8); CHECK recomputes it. A CHECK must therefore use the WRITE's range start.
 */
#define _GNU_SOURCE
#include "sim/sim_internal.h"

#include <assert.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "base/error.h"
#include "base/format.h"

static size_t round_up(size_t value, size_t granule)
{
    return (value + granule - 1) / granule * granule;
}

/* ---- mapping ---------------------------------------------------------------------------------- */

int gpsim_memory_map(gpsim_memory *mem, size_t requested_capacity)
{
    memset(mem, 0, sizeof *mem);
    if (requested_capacity == 0)
        return gp_error_set(GP_ERR_BACKEND, "sim: device_memory is 0; the simulated device needs a capacity");
    if (requested_capacity > ((size_t)1 << 44)) /* 16 TiB: the span must fit the address space */
        return gp_error_set(GP_ERR_BACKEND, "sim: device_memory %zu is too large", requested_capacity);

    size_t capacity = round_up(requested_capacity, GPSIM_PAGE_SIZE);
    size_t span = capacity * GPSIM_SPAN_FACTOR;
    size_t mapped = span + GPSIM_PAGE_SIZE; /* over-map, then trim to a 2 MiB aligned range */
    void *raw = mmap(NULL, mapped, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (raw == MAP_FAILED) {
        char text[GP_SIZE_TEXT_MAX];
        return gp_error_set(GP_ERR_BACKEND, "sim: cannot map %s of simulated device memory: %s",
                            gp_format_size(capacity, text), strerror(errno));
    }
    uintptr_t start = (uintptr_t)raw;
    uintptr_t aligned = round_up(start, GPSIM_PAGE_SIZE);
    size_t head = aligned - start;
    size_t tail = mapped - head - span;
    if (head > 0)
        munmap(raw, head);
    if (tail > 0)
        munmap((void *)(aligned + span), tail);

    gpsim_bitmap pages;
    if (!gpsim_bitmap_init(&pages, span / GPSIM_PAGE_SIZE)) {
        munmap((void *)aligned, span);
        return gp_error_set(GP_ERR_BACKEND, "sim: host out of memory for the page bitmap");
    }
    long host_page = sysconf(_SC_PAGESIZE);

    mem->base = (unsigned char *)aligned;
    mem->capacity = capacity;
    mem->span = span;
    mem->pages = pages;
    mem->host_page_size = host_page > 0 ? (size_t)host_page : 4096;
    return GP_OK;
}

void gpsim_memory_unmap(gpsim_memory *mem)
{
    if (mem->base != NULL)
        munmap(mem->base, mem->span);
    gpsim_bitmap_destroy(&mem->pages);
    free(mem->ledger);
    memset(mem, 0, sizeof *mem);
}

/* ---- ledger ----------------------------------------------------------------------------------- */

/* Index of the last allocation whose addr <= addr, or ledger_count when there is none. */
static size_t ledger_at_or_below(const gpsim_memory *mem, gp_devptr addr)
{
    size_t lo = 0, hi = mem->ledger_count; /* answer in [lo, hi) is the first with addr > addr */
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (mem->ledger[mid].addr <= addr)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo == 0 ? mem->ledger_count : lo - 1;
}

int gpsim_memory_alloc(gpsim_memory *mem, size_t size, gp_devptr *out)
{
    assert(size > 0 && size % GPSIM_PAGE_SIZE == 0);
    size_t pages = size / GPSIM_PAGE_SIZE;
    size_t first = 0;
    if (size > mem->capacity - mem->allocated_bytes || !gpsim_bitmap_find_run(&mem->pages, pages, &first)) {
        char want[GP_SIZE_TEXT_MAX], avail[GP_SIZE_TEXT_MAX], total[GP_SIZE_TEXT_MAX];
        size_t free_bytes = mem->capacity - mem->allocated_bytes;
        return gp_error_set(GP_ERR_OOM, "sim: out of device memory: requested %s, %s free of %s%s",
                            gp_format_size(size, want), gp_format_size(free_bytes, avail),
                            gp_format_size(mem->capacity, total),
                            free_bytes >= size ? " (no contiguous range)" : "");
    }
    if (mem->ledger_count == mem->ledger_capacity) {
        size_t capacity = mem->ledger_capacity ? mem->ledger_capacity * 2 : 64;
        gpsim_allocation *grown = realloc(mem->ledger, capacity * sizeof *grown);
        if (grown == NULL)
            return gp_error_set(GP_ERR_DEVICE, "sim: host out of memory for the allocation ledger");
        mem->ledger = grown;
        mem->ledger_capacity = capacity;
    }
    gp_devptr addr = (gp_devptr)(mem->base + first * GPSIM_PAGE_SIZE);
    size_t below = ledger_at_or_below(mem, addr);
    size_t slot = below == mem->ledger_count ? 0 : below + 1;
    memmove(&mem->ledger[slot + 1], &mem->ledger[slot], (mem->ledger_count - slot) * sizeof mem->ledger[0]);
    mem->ledger[slot] = (gpsim_allocation){.addr = addr, .size = size};
    mem->ledger_count++;
    gpsim_bitmap_set_run(&mem->pages, first, pages);
    mem->allocated_bytes += size;
    if (mem->allocated_bytes > mem->allocated_peak)
        mem->allocated_peak = mem->allocated_bytes;
    *out = addr;
    gpsim_memory_assert_invariants(mem);
    return GP_OK;
}

bool gpsim_memory_is_allocation(const gpsim_memory *mem, gp_devptr addr, size_t size)
{
    size_t i = ledger_at_or_below(mem, addr);
    return i < mem->ledger_count && mem->ledger[i].addr == addr && mem->ledger[i].size == size;
}

void gpsim_memory_free(gpsim_memory *mem, gp_devptr addr, size_t size)
{
    assert(gpsim_memory_is_allocation(mem, addr, size));
    size_t i = ledger_at_or_below(mem, addr);
    if (madvise((void *)addr, size, MADV_DONTNEED) != 0) {
        fprintf(stderr, "gpupool sim: madvise(DONTNEED) failed: %s\n", strerror(errno));
        abort();
    }
    size_t first_page = (size_t)((unsigned char *)addr - mem->base) / GPSIM_PAGE_SIZE;
    gpsim_bitmap_clear_run(&mem->pages, first_page, size / GPSIM_PAGE_SIZE);
    memmove(&mem->ledger[i], &mem->ledger[i + 1], (mem->ledger_count - i - 1) * sizeof mem->ledger[0]);
    mem->ledger_count--;
    mem->allocated_bytes -= size;
    gpsim_memory_assert_invariants(mem);
}

bool gpsim_memory_contains(const gpsim_memory *mem, gp_devptr addr, size_t len)
{
    size_t i = ledger_at_or_below(mem, addr);
    if (i == mem->ledger_count || len == 0)
        return false;
    const gpsim_allocation *a = &mem->ledger[i];
    return addr - a->addr < a->size && len <= a->size - (addr - a->addr);
}

void gpsim_memory_assert_invariants(const gpsim_memory *mem)
{
#ifndef NDEBUG
    size_t ledger_bytes = 0;
    for (size_t i = 0; i < mem->ledger_count; i++) {
        const gpsim_allocation *a = &mem->ledger[i];
        assert(a->size > 0 && a->size % GPSIM_PAGE_SIZE == 0);
        assert(a->addr >= (gp_devptr)mem->base && a->addr + a->size <= (gp_devptr)mem->base + mem->span);
        assert(i == 0 || mem->ledger[i - 1].addr + mem->ledger[i - 1].size <= a->addr);
        ledger_bytes += a->size;
    }
    gpsim_bitmap_assert_invariants(&mem->pages);
    assert(ledger_bytes == mem->allocated_bytes);
    assert(mem->pages.used * GPSIM_PAGE_SIZE == mem->allocated_bytes);
    assert(mem->allocated_bytes <= mem->allocated_peak && mem->allocated_peak <= mem->capacity);
#else
    (void)mem;
#endif
}

/* ---- kernel effects --------------------------------------------------------------------------- */

static uint64_t splitmix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static uint64_t pattern_word(uint64_t seed, uint64_t word_index)
{
    return splitmix64(splitmix64(seed) ^ word_index);
}

/* Opens [addr, addr+len) (rounded out to host pages, which stay inside the 2 MiB granule) with `prot`. */
static void protect(size_t host_page_size, gp_devptr addr, size_t len, int prot)
{
    uintptr_t first = addr / host_page_size * host_page_size;
    uintptr_t end = round_up(addr + len, host_page_size);
    if (mprotect((void *)first, end - first, prot) != 0) {
        fprintf(stderr, "gpupool sim: mprotect of simulated device memory failed: %s\n", strerror(errno));
        abort();
    }
}

void gpsim_copy(size_t host_page_size, gp_devptr dev, void *host, size_t len, bool to_device)
{
    protect(host_page_size, dev, len, to_device ? PROT_READ | PROT_WRITE : PROT_READ);
    if (to_device)
        memcpy((void *)dev, host, len);
    else
        memcpy(host, (const void *)dev, len);
    protect(host_page_size, dev, len, PROT_NONE);
}

void gpsim_write_pattern(size_t host_page_size, gp_devptr addr, size_t len, uint64_t seed)
{
    protect(host_page_size, addr, len, PROT_READ | PROT_WRITE);
    unsigned char *bytes = (unsigned char *)addr;
    size_t words = len / 8;
    for (size_t w = 0; w < words; w++) {
        uint64_t value = pattern_word(seed, w);
        memcpy(bytes + w * 8, &value, 8);
    }
    if (len % 8 != 0) {
        uint64_t value = pattern_word(seed, words);
        memcpy(bytes + words * 8, &value, len % 8);
    }
    protect(host_page_size, addr, len, PROT_NONE);
}

bool gpsim_check_pattern(size_t host_page_size, gp_devptr addr, size_t len, uint64_t seed,
                         size_t *first_bad)
{
    protect(host_page_size, addr, len, PROT_READ);
    const unsigned char *bytes = (const unsigned char *)addr;
    bool ok = true;
    for (size_t w = 0; w * 8 < len && ok; w++) {
        uint64_t value = pattern_word(seed, w);
        size_t n = len - w * 8 < 8 ? len - w * 8 : 8;
        uint64_t found = value;
        memcpy(&found, bytes + w * 8, n); /* a whole word compares in one go; memcmp per word was slow */
        if (found != value) {
            const unsigned char *expected = (const unsigned char *)&value;
            size_t b = 0;
            while (bytes[w * 8 + b] == expected[b])
                b++;
            *first_bad = w * 8 + b;
            ok = false;
        }
    }
    protect(host_page_size, addr, len, PROT_NONE);
    return ok;
}

void gpsim_read(size_t host_page_size, gp_devptr addr, size_t len)
{
    protect(host_page_size, addr, len, PROT_READ);
    /* Touch the first byte and one byte per host page: enough to fault on memory that is not open. */
    const volatile unsigned char *bytes = (const volatile unsigned char *)addr;
    unsigned char sink = bytes[0];
    for (size_t off = host_page_size - addr % host_page_size; off < len; off += host_page_size)
        sink ^= bytes[off];
    sink ^= bytes[len - 1];
    (void)sink;
    protect(host_page_size, addr, len, PROT_NONE);
}
