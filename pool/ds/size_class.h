/*
 * size_class.h — rounding of requests and the size classes that index the free lists.
 *
 * Every request is rounded up to the 512-byte granule (cudaMalloc's and PyTorch's alignment) and a
 * block consumes exactly that: a block is split whenever the rest is at least one granule, so the
 * internal waste of a block is under 512 bytes whatever its size class.
 *
 * Size classes only index free lists (segregated fit, as in TLSF). Measured in granules g = size/512:
 *   - g < 16: one class per granule count (class g), so sizes up to 8 KiB have exact lists;
 *   - g >= 16: with k = floor(log2 g), 8 classes per doubling:
 *         class = 16 + 8 * (k - 4) + ((g >> (k - 3)) & 7)
 *     i.e. class c covers [2^k + n * 2^(k-3), 2^k + (n+1) * 2^(k-3)) granules, a spread of at most
 *     12.5% between the smallest and largest block in one list.
 * An allocation first looks for the best fit in its own class (blocks there may be too small), then
 * takes the smallest block of the first non-empty larger class, found through a bitmap in O(1): every
 * block there fits. Because blocks are split to the rounded request, the class spread never becomes
 * internal waste; it only bounds how far from the best fit the chosen block can be (12.5%), and the
 * rest returns to the free lists.
 */
#ifndef GP_SIZE_CLASS_H
#define GP_SIZE_CLASS_H

#include <stddef.h>
#include <stdint.h>

#define GP_GRANULE ((size_t)512)
#define GP_DEVICE_PAGE ((size_t)2 << 20) /* device allocation granularity of current GPUs */
#define GP_CLASS_LINEAR 16               /* granule counts with a class of their own */
#define GP_CLASS_SUB_LOG2 3              /* 8 classes per doubling above that */
/* granule counts stay below 2^55 (sizes below 2^64), so k <= 54 and the last class is 16 + 50 * 8 + 7 */
#define GP_CLASS_COUNT (GP_CLASS_LINEAR + (55 - 4) * (1 << GP_CLASS_SUB_LOG2))
#define GP_CLASS_WORDS ((GP_CLASS_COUNT + 63) / 64)

/* size rounded up to the granule; 0 when that overflows (callers reject it). */
static inline size_t gp_round_granule(size_t size)
{
    if (size > SIZE_MAX - (GP_GRANULE - 1))
        return 0;
    return (size + GP_GRANULE - 1) & ~(GP_GRANULE - 1);
}

/* size rounded up to `unit` (a power of two); 0 on overflow. */
static inline size_t gp_round_up(size_t size, size_t unit)
{
    if (size > SIZE_MAX - (unit - 1))
        return 0;
    return (size + unit - 1) & ~(unit - 1);
}

/* The free-list class of a block of `size` bytes (a positive multiple of the granule). */
static inline unsigned gp_size_class(size_t size)
{
    size_t g = size / GP_GRANULE;
    if (g < GP_CLASS_LINEAR)
        return (unsigned)g;
    unsigned k = 63u - (unsigned)__builtin_clzll((unsigned long long)g);
    unsigned sub = (unsigned)(g >> (k - GP_CLASS_SUB_LOG2)) & ((1u << GP_CLASS_SUB_LOG2) - 1);
    return GP_CLASS_LINEAR + ((k - 4) << GP_CLASS_SUB_LOG2) + sub;
}

/* The smallest size (bytes) in class c. */
size_t gp_size_class_base(unsigned c);

/* The power-of-two stats bucket of a request: bucket k counts sizes in [256 << k, 512 << k). */
static inline unsigned gp_stats_bucket(size_t size)
{
    if (size < 512)
        return 0;
    unsigned k = 63u - (unsigned)__builtin_clzll((unsigned long long)size) - 8u;
    return k < 64 ? k : 63;
}

#endif /* GP_SIZE_CLASS_H */
