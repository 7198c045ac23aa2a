/*
 * history.c — the ring of recent allocation events (see history.h).
 */
#include "ds/history.h"

#include <assert.h>
#include <stdlib.h>
#include <string.h>

gp_history *gp_history_create(size_t capacity)
{
    if (capacity == 0 || capacity > SIZE_MAX / sizeof(gp_history_entry))
        return NULL;
    gp_history *h = calloc(1, sizeof *h);
    if (h == NULL)
        return NULL;
    h->ring = malloc(capacity * sizeof *h->ring);
    if (h->ring == NULL) {
        free(h);
        return NULL;
    }
    h->capacity = capacity;
    pthread_mutex_init(&h->lock, NULL);
    return h;
}

void gp_history_destroy(gp_history *h)
{
    if (h == NULL)
        return;
    pthread_mutex_destroy(&h->lock);
    free(h->ring);
    free(h);
}

int gp_history_resize(gp_history *h, size_t capacity)
{
    gp_history_entry *ring = NULL;
    if (capacity > 0 && capacity != h->capacity) {
        if (capacity > SIZE_MAX / sizeof *ring || (ring = malloc(capacity * sizeof *ring)) == NULL)
            return -1;
    }
    pthread_mutex_lock(&h->lock);
    if (ring != NULL) {
        free(h->ring);
        h->ring = ring;
        h->capacity = capacity;
    }
    h->count = h->next = 0;
    h->dropped = 0;
    pthread_mutex_unlock(&h->lock);
    return 0;
}

void gp_history_add(gp_history *h, const gp_history_entry *e)
{
    pthread_mutex_lock(&h->lock);
    h->ring[h->next] = *e;
    h->next = (h->next + 1) % h->capacity;
    if (h->count < h->capacity)
        h->count++;
    else
        h->dropped++;
    assert(h->count <= h->capacity);
    pthread_mutex_unlock(&h->lock);
}

size_t gp_history_copy(gp_history *h, gp_history_entry **out)
{
    pthread_mutex_lock(&h->lock);
    size_t n = h->count;
    gp_history_entry *copy = malloc((n ? n : 1) * sizeof *copy);
    if (copy == NULL) {
        pthread_mutex_unlock(&h->lock);
        return SIZE_MAX;
    }
    size_t first = (h->next + h->capacity - n) % h->capacity;
    for (size_t i = 0; i < n; i++)
        copy[i] = h->ring[(first + i) % h->capacity];
    pthread_mutex_unlock(&h->lock);
    *out = copy;
    return n;
}

const char *gp_history_action_name(unsigned action)
{
    static const char *const names[] = {
        [GP_HIST_ALLOC] = "alloc",
        [GP_HIST_FREE_REQUESTED] = "free_requested",
        [GP_HIST_FREE_COMPLETED] = "free_completed",
        [GP_HIST_SEGMENT_ALLOC] = "segment_alloc",
        [GP_HIST_SEGMENT_FREE] = "segment_free",
        [GP_HIST_SEGMENT_MAP] = "segment_map",
        [GP_HIST_SEGMENT_UNMAP] = "segment_unmap",
        [GP_HIST_OOM] = "oom",
    };
    return action < sizeof names / sizeof names[0] ? names[action] : "unknown";
}
