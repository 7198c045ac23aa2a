/*
 * segment_size.h — how large a device allocation the segment provider asks for (policy: a decision
 * from the configuration, no state, no device call).
 */
#ifndef GP_SEGMENT_SIZE_H
#define GP_SEGMENT_SIZE_H

#include <stdbool.h>
#include <stddef.h>

#include "base/config.h"

/*
 * The device allocation that will hold a request of `rsize` bytes (rounded): small_segment for the
 * small heap; for the large heap large_segment, or the request rounded up to whole device pages when
 * it is huge (huge_size and more) or does not fit a large segment.
 */
size_t gp_segment_size_for(const gp_config *cfg, size_t rsize, bool small);

#endif /* GP_SEGMENT_SIZE_H */
