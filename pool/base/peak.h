/*
 * peak.h — high-water marks kept in atomics (the pool's and each tenant's peaks).
 */
#ifndef GP_PEAK_H
#define GP_PEAK_H

#include <stdatomic.h>
#include <stddef.h>

/* Raises *peak to at least value (relaxed: peaks order nothing). */
static inline void gp_raise_peak(atomic_size_t *peak, size_t value)
{
    size_t seen = atomic_load_explicit(peak, memory_order_relaxed);
    while (seen < value && !atomic_compare_exchange_weak_explicit(peak, &seen, value, memory_order_relaxed,
                                                                  memory_order_relaxed)) {
    }
}

#endif /* GP_PEAK_H */
