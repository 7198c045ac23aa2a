/*
 * sim_report.c — the sim's ledger as the tests read it: gp_sim_get_report (races, mismatches, bad
 * calls, what is allocated, mapped, reserved, and what leaked at close) and gp_sim_first_violation.
 */
#include <pthread.h>
#include <string.h>

#include "sim/sim_internal.h"

size_t gpsim_allocated_bytes(const gp_sim *sim)
{
    return sim->vmm != NULL ? sim->vmm->allocated_bytes : sim->memory.allocated_bytes;
}

GP_API void gp_sim_get_report(gp_sim *sim, gp_sim_report *out)
{
    if (out == NULL)
        return;
    memset(out, 0, sizeof *out);
    if (sim == NULL)
        return;
    pthread_mutex_lock(&sim->lock);
    out->races = sim->races;
    out->pattern_mismatches = sim->pattern_mismatches;
    out->bad_calls = sim->bad_calls;
    out->allocated_bytes = gpsim_allocated_bytes(sim);
    out->allocated_peak = sim->vmm != NULL ? sim->vmm->allocated_peak : sim->memory.allocated_peak;
    out->allocations = sim->vmm != NULL ? sim->vmm->allocations.count : sim->memory.ledger_count;
    out->events = gpsim_event_count(sim);
    out->leaked_bytes_at_close = sim->leaked_bytes_at_close;
    out->leaked_events_at_close = sim->leaked_events_at_close;
    out->closed = sim->closed;
    if (sim->vmm != NULL) {
        out->handles = sim->vmm->handle_count;
        out->mappings = sim->vmm->mappings.count;
        out->reservations = sim->vmm->reservations.count;
        out->mapped_bytes = sim->vmm->mapped_bytes;
        out->reserved_bytes = sim->vmm->reserved_bytes;
    }
    out->deepest_queue = sim->deepest_queue;
    out->leaked_handles_at_close = sim->leaked_handles_at_close;
    out->leaked_mappings_at_close = sim->leaked_mappings_at_close;
    out->leaked_reservations_at_close = sim->leaked_reservations_at_close;
    pthread_mutex_unlock(&sim->lock);
}

GP_API const char *gp_sim_first_violation(gp_sim *sim)
{
    if (sim == NULL)
        return "";
    pthread_mutex_lock(&sim->lock);
    const char *text = sim->first_violation; /* written once, then stable until the last release */
    pthread_mutex_unlock(&sim->lock);
    return text;
}
