/*
 * working_set.c — the ring of recent empty_cache call times (see working_set.h).
 */
#include "policy/working_set.h"

#include <assert.h>
#include <stddef.h>

uint64_t gp_working_set_call(gp_working_set *ws, uint64_t now, size_t interval_peak)
{
    assert(ws->count == 0 || now > ws->calls[(ws->next + GP_WORKING_SET_CALLS - 1) % GP_WORKING_SET_CALLS]);
    /* The oldest of the last GP_WORKING_SET_CALLS calls began the oldest interval that still counts:
     * memory stamped before it was not freed in any of them. */
    uint64_t oldest = ws->count == GP_WORKING_SET_CALLS ? ws->calls[ws->next] : 0;
    ws->calls[ws->next] = now;
    ws->peaks[ws->next] = interval_peak;
    ws->next = (ws->next + 1) % GP_WORKING_SET_CALLS;
    if (ws->count < GP_WORKING_SET_CALLS)
        ws->count++;
    assert(ws->count <= GP_WORKING_SET_CALLS);
    return oldest;
}

size_t gp_working_set_bytes(const gp_working_set *ws)
{
    size_t most = 0;
    for (unsigned i = 0; i < ws->count; i++)
        if (ws->peaks[i] > most)
            most = ws->peaks[i];
    return most;
}

size_t gp_working_set_keep(const gp_working_set *ws, double slack, size_t allocated)
{
    if (ws->count < GP_WORKING_SET_CALLS)
        return SIZE_MAX;
    double ratio = 1.0 + (slack > 0 ? slack : 0.0);
    if (ws->need_ratio > ratio)
        ratio = ws->need_ratio;
    double want = (double)gp_working_set_bytes(ws) * ratio;
    if (want <= (double)allocated)
        return 0;
    return want - (double)allocated >= (double)SIZE_MAX ? SIZE_MAX : (size_t)(want - (double)allocated);
}

void gp_working_set_note_growth(gp_working_set *ws, uint64_t growth, size_t reserved, size_t interval_peak)
{
    if (growth != ws->growth_seen && interval_peak > 0)
        ws->need_ratio = (double)reserved / (double)interval_peak;
    ws->growth_seen = growth;
}
