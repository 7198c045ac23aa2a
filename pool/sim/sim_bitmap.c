/*
 * sim_bitmap.c — the first-fit bitmap behind the simulated GPU's page allocation (see sim_bitmap.h):
 * "sim"'s span pages, "sim-vmm"'s physical pages and address space pages.
 *
 * Invariants: used == number of set bits; no clear bit below hint. Searches start at the word of
 * hint and skip full words, so first fit costs about (bits above hint) / 64 word reads when the low
 * part of the map is full.
 */
#include "sim/sim_bitmap.h"

#include <assert.h>
#include <stdlib.h>

bool gpsim_bitmap_init(gpsim_bitmap *b, size_t bits)
{
    b->words = calloc((bits + 63) / 64, sizeof *b->words);
    b->bits = bits;
    b->used = 0;
    b->hint = 0;
    return b->words != NULL;
}

void gpsim_bitmap_destroy(gpsim_bitmap *b)
{
    free(b->words);
    *b = (gpsim_bitmap){0};
}

static bool bit_get(const gpsim_bitmap *b, size_t i)
{
    return (b->words[i / 64] >> (i % 64)) & 1u;
}

static void bit_put(gpsim_bitmap *b, size_t i, bool used)
{
    assert(i < b->bits && bit_get(b, i) != used);
    if (used) {
        b->words[i / 64] |= (uint64_t)1 << (i % 64);
        b->used++;
    } else {
        b->words[i / 64] &= ~((uint64_t)1 << (i % 64));
        b->used--;
        if (i < b->hint)
            b->hint = i;
    }
}

bool gpsim_bitmap_find_run(const gpsim_bitmap *b, size_t count, size_t *first)
{
    assert(count > 0);
    size_t run_start = 0, run_len = 0;
    size_t i = b->hint & ~(size_t)63;
    while (i < b->bits) {
        if (i % 64 == 0 && b->words[i / 64] == UINT64_MAX) { /* skip full words */
            run_len = 0;
            i += 64;
            continue;
        }
        if (bit_get(b, i)) {
            run_len = 0;
        } else {
            if (run_len == 0)
                run_start = i;
            if (++run_len == count) {
                *first = run_start;
                return true;
            }
        }
        i++;
    }
    return false;
}

void gpsim_bitmap_set_run(gpsim_bitmap *b, size_t first, size_t count)
{
    for (size_t i = first; i < first + count; i++)
        bit_put(b, i, true);
    if (first <= b->hint)
        b->hint = first + count; /* no clear bit below hint, so [hint, first) was set too */
}

void gpsim_bitmap_clear_run(gpsim_bitmap *b, size_t first, size_t count)
{
    for (size_t i = first; i < first + count; i++)
        bit_put(b, i, false); /* lowers hint to first */
}

void gpsim_bitmap_take(gpsim_bitmap *b, size_t count, size_t *out)
{
    assert(count > 0 && b->bits - b->used >= count);
    size_t taken = 0;
    for (size_t i = b->hint; taken < count; i++) {
        assert(i < b->bits);
        if (i % 64 == 0 && b->words[i / 64] == UINT64_MAX) {
            i += 63;
            continue;
        }
        if (!bit_get(b, i)) {
            bit_put(b, i, true);
            out[taken++] = i;
        }
    }
    b->hint = out[count - 1] + 1; /* everything below the last one taken is set */
}

void gpsim_bitmap_assert_invariants(const gpsim_bitmap *b)
{
#ifndef NDEBUG
    assert(b->used <= b->bits && b->hint <= b->bits);
    size_t set = 0;
    for (size_t w = 0; w < (b->bits + 63) / 64; w++)
        set += (size_t)__builtin_popcountll(b->words[w]);
    assert(set == b->used);
    for (size_t w = 0; w < b->hint / 64; w++)
        assert(b->words[w] == UINT64_MAX);
    for (size_t i = b->hint / 64 * 64; i < b->hint; i++)
        assert(bit_get(b, i));
#else
    (void)b;
#endif
}
