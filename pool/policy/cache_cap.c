/*
 * cache_cap.c — the cache cap (cache_cap.h).
 */
#include "policy/cache_cap.h"

#include <stdint.h>

size_t gp_cache_cap(const gp_config *cfg, size_t allocated, size_t peak, size_t rsize)
{
    if (cfg->cache_slack < 0)
        return SIZE_MAX;
    size_t live = allocated + rsize;
    double cap = (double)(live > peak ? live : peak) * (1.0 + cfg->cache_slack);
    double floor = (double)cfg->large_segment * GP_CAP_FLOOR_SEGMENTS;
    if (cap < floor)
        cap = floor;
    return cap >= (double)SIZE_MAX ? SIZE_MAX : (size_t)cap;
}
