/*
 * sim_bitmap.h — a bitmap with first-fit search, the page allocator of the simulated GPU: "sim"'s
 * 2 MiB pages of its span (sim_memory.c), "sim-vmm"'s memfd pages and address space pages (sim_vmm.c).
 *
 * A set bit is in use. Invariants (checked by gpsim_bitmap_assert_invariants):
 *   used == number of set bits
 *   no clear bit below hint (every search starts at hint: the lowest bit that may be clear)
 * Not thread safe; the sim's lock covers it.
 */
#ifndef GP_SIM_BITMAP_H
#define GP_SIM_BITMAP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct gpsim_bitmap {
    uint64_t *words;
    size_t bits;  /* one per 2 MiB page */
    size_t used;  /* set bits */
    size_t hint;  /* no clear bit below this one: first-fit scans start here */
} gpsim_bitmap;

/* `bits` bits, all clear. false on host out-of-memory (words NULL; gpsim_bitmap_destroy is safe). */
bool gpsim_bitmap_init(gpsim_bitmap *b, size_t bits);
void gpsim_bitmap_destroy(gpsim_bitmap *b);
/* First fit: the lowest run of `count` clear bits (count > 0). false when none is long enough. */
bool gpsim_bitmap_find_run(const gpsim_bitmap *b, size_t count, size_t *first);
/* pre: [first, first+count) clear. Sets it. */
void gpsim_bitmap_set_run(gpsim_bitmap *b, size_t first, size_t count);
/* pre: [first, first+count) set. Clears it. */
void gpsim_bitmap_clear_run(gpsim_bitmap *b, size_t first, size_t count);
/* The lowest `count` clear bits (count > 0), not necessarily consecutive: set, and written to out[]
 * in increasing order. pre: bits - used >= count. */
void gpsim_bitmap_take(gpsim_bitmap *b, size_t count, size_t *out);
void gpsim_bitmap_assert_invariants(const gpsim_bitmap *b);

#endif /* GP_SIM_BITMAP_H */
