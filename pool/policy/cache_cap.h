/*
 * cache_cap.h — the cache cap: how much device memory the pool means to hold (policy: a number from
 * the configuration and the live bytes; no state, no device call). The providers act on it: the
 * segment provider steals or gives back free segments above it, the vmm provider stitches pages.
 */
#ifndef GP_CACHE_CAP_H
#define GP_CACHE_CAP_H

#include <stddef.h>

#include "base/config.h"

#define GP_CAP_FLOOR_SEGMENTS 4

/*
 * The most device memory the pool means to hold once it serves a request of `rsize`, with `allocated`
 * bytes live now and `peak` the peak of live bytes:
 *     (1 + cache_slack) x max(peak, allocated + rsize),
 * and at least GP_CAP_FLOOR_SEGMENTS large segments (so that small workloads on several streams simply
 * grow); SIZE_MAX when cache_slack is off. Below the cap a stream that misses grows; above it, it
 * first takes another stream's free segment or gives unfit free segments back.
 */
size_t gp_cache_cap(const gp_config *cfg, size_t allocated, size_t peak, size_t rsize);

#endif /* GP_CACHE_CAP_H */
