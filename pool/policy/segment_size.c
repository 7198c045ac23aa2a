/*
 * segment_size.c — the size of a new device allocation (segment_size.h).
 */
#include "policy/segment_size.h"

#include "ds/size_class.h"

size_t gp_segment_size_for(const gp_config *cfg, size_t rsize, bool small)
{
    if (small)
        return cfg->small_segment;
    size_t pages = gp_round_up(rsize, GP_DEVICE_PAGE);
    if (rsize >= cfg->huge_size || pages >= cfg->large_segment)
        return pages;
    return cfg->large_segment;
}
