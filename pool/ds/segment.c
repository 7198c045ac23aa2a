/*
 * segment.c — the metadata of segments and their blocks: making and freeing it, and checking that a
 * segment's blocks tile it (block.h states the invariants). No device calls: the providers get and
 * give back the memory (provider/segment.c, provider/vmm.c).
 */
#include <stdio.h>
#include <stdlib.h>

#include "ds/block.h"
#include "ds/size_class.h"
#include "ds/stream.h"

gp_segment *gp_segment_new(void)
{
    gp_segment *seg = calloc(1, sizeof *seg);
    gp_block *b = calloc(1, sizeof *b);
    if (seg == NULL || b == NULL) {
        free(seg);
        free(b);
        return NULL;
    }
    seg->first = b;
    b->segment = seg;
    return seg;
}

void gp_segment_discard(gp_segment *seg)
{
    free(seg->first);
    free(seg);
}

void gp_segment_free(gp_segment *seg)
{
    free(seg->pages);
    free(seg->homes);
    free(seg->alias_count);
    free(seg->loans);
    for (gp_block *b = seg->first; b != NULL;) {
        gp_block *bn = b->next;
        free(b->uses);
        free(b->events);
        free(b);
        b = bn;
    }
    free(seg);
}

#define CHECK(cond, ...)                                                                                       \
    do {                                                                                                       \
        if (!(cond)) {                                                                                         \
            snprintf(why, len, __VA_ARGS__);                                                                   \
            return false;                                                                                      \
        }                                                                                                      \
    } while (0)

bool gp_segment_check(const gp_segment *seg, gp_segment_tally *tally, char *why, size_t len)
{
    CHECK(seg->size % GP_DEVICE_PAGE == 0, "segment %p size %zu is not whole device pages", (void *)seg->addr, seg->size);
    CHECK(seg->first != NULL && seg->first->prev == NULL && seg->first->addr == seg->addr,
          "segment %p does not start with its first block", (void *)seg->addr);
    size_t covered = 0;
    for (gp_block *b = seg->first; b != NULL; b = b->next) {
        CHECK(b->segment == seg, "block %p points to another segment", (void *)b->addr);
        CHECK(b->addr == seg->addr + covered, "block %p leaves a gap or overlap in segment %p", (void *)b->addr,
              (void *)seg->addr);
        CHECK(b->size > 0 && b->size % GP_GRANULE == 0, "block %p size %zu is not whole granules", (void *)b->addr,
              b->size);
        CHECK(b->next == NULL || b->next->prev == b, "block %p: next->prev is not itself", (void *)b->addr);
        CHECK(b->state == GP_BLOCK_LIVE || b->state == GP_BLOCK_PENDING || (b->uses == NULL && b->events == NULL),
              "block %p is neither live nor pending but still owns use arrays", (void *)b->addr);
        CHECK(!(b->state == GP_BLOCK_FREE && b->next != NULL && b->next->state == GP_BLOCK_FREE),
              "free blocks %p and %p were not coalesced", (void *)b->addr, (void *)b->next->addr);
        covered += b->size;
        if (b->state == GP_BLOCK_LIVE) {
            tally->allocated += b->size;
            tally->live_blocks++;
            CHECK(gp_block_map_find(&seg->owner->live, b->addr) == b, "live block %p is missing from its stream's map",
                  (void *)b->addr);
        } else if (b->state == GP_BLOCK_FREE || b->state == GP_BLOCK_QUICK) {
            tally->free_bytes += b->size;
        } else if (b->state == GP_BLOCK_PENDING) {
            tally->pending += b->size;
        }
    }
    CHECK(covered == seg->size, "blocks of segment %p cover %zu of its %zu bytes", (void *)seg->addr, covered,
          seg->size);
    return true;
}
