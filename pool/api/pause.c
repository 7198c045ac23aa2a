/*
 * pause.c — pausing a tenant: its physical memory goes back to the device while its virtual addresses,
 * blocks and pointers stay; resuming maps fresh pages at the same addresses (the idea of
 * torch_memory_saver's pause/resume in vLLM and SGLang). With GP_PAUSE_KEEP_CONTENTS the live blocks
 * are copied to pinned host staging memory first (provider/staging.c) and back on resume.
 *
 * Virtual memory backends only. While paused, a tenant's ranges are marked `paused`: nothing maps,
 * unmaps or stitches them; its blocks keep their states (a free while paused is allowed and touches no
 * device memory), and p->paused_bytes carries their size so that the accounting still adds up.
 *
 * Staging is keyed by block (gp_staging_stage): resume copies back exactly the blocks that are still
 * live, each from its own offset, so a block freed while paused shifts nothing.
 *
 * The private pools of CUDA graphs captured in the tenant's name (api/capture.c) pause and resume with
 * it (the end of this file), so that its graphs replay after the resume.
 *
 * What a pause waits for: the work queued on the tenant's own streams and on streams its blocks were
 * recorded for (drain), never the whole device, so that pausing an idle model does not stall the
 * models still serving; the staging copies run on the backend's own copy stream (backend.h).
 *
 * A pause is done in two phases, so that a failure at any page loses nothing:
 *   1. unmap every in-use page of the tenant's ranges, keeping each page's physical handle aside
 *      (gp_vmm_pause_range);
 *   2. only once every unmap has succeeded, give the handles back to the device.
 * A failure in phase 1 maps the very same handles back where they were: the physical memory never left,
 * so the contents are intact with or without GP_PAUSE_KEEP_CONTENTS, and the failed pause changes
 * nothing the user can see ("rolled back"). Only if mapping a handle back fails too (a second fault)
 * is the tenant left paused: those pages are then given back, the error says so, and resume maps fresh
 * pages (and restores the staged contents; without GP_PAUSE_KEEP_CONTENTS the message says that the
 * contents of those pages are lost).
 *
 * Resume maps pages from the page pool, then the device; when the device is full it first turns free
 * cached pages of other tenants (down to their min) into pooled pages, and tries again. It too commits
 * only at the end: the tenant's ranges stay `paused` while it maps and restores, so that nothing else
 * (that step included) takes a page from a range it has already mapped, and it writes down every page
 * it maps. A failure unmaps exactly those pages again and gives them back, so the failed resume changes
 * nothing the user can see: the tenant stays paused, paused bytes and its staged contents as they were.
 * (Before, a range counted as resumed once whole, and at device OOM its free pages, those of a block
 * freed while paused, could be moved into another range of the tenant; the undo then missed them and
 * the paused bytes shrank without any error saying so.) Only when an unmap of that undo fails (a
 * second fault) do pages stay mapped, in ranges still paused and accounted to them; the error then
 * says "undoing it failed too", and a later resume maps only the pages that still have no memory.
 */
#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/api.h"
#include "base/error.h"
#include "provider/alias.h"
#include "provider/capture_window.h"
#include "provider/pages.h"
#include "provider/pending.h"
#include "provider/pool_ledger.h"
#include "provider/provider.h"
#include "provider/staging.h"
#include "provider/vmm.h"

static bool tenant_range(const gp_segment *seg, const gp_tenant *t)
{
    return seg->owner->tenant == t && seg->pages != NULL;
}

/*
 * Waits for the work that may still use t's memory, and for no other model's: the work queued so far
 * on the streams of `set` (gp_lock_tenant_streams: t's own, and those its blocks were recorded for,
 * as Tensor.record_stream; other tenants' streams included). That is what stream-ordered reuse
 * already relies on: memory used on a stream the pool was never told of is the caller's to order,
 * here as for reuse. Each stream's fence is recorded and synchronized (gp_stream_drain), so after this
 * every wait before an unmap of t's pages (dissolving its stitched ranges, the pause's own unmaps) is
 * over at once. The set locked; nothing changes on failure but the fences' bookkeeping.
 */
static int drain(gp_pool_state *p, const gp_stream_set *set)
{
    int rc = GP_OK;
    for (unsigned i = 0; i < set->count && rc == GP_OK; i++) {
        gp_stream_state *st = p->streams.by_index[i];
        if (set->member != NULL && !set->member[i])
            continue; /* NULL: every stream is locked, and waited for */
        /* A stream the application had the pool forget (before destroying it) and has not used with the
         * pool since: its work was waited for then, and its handle may be dead (gp_stream_forget). */
        bool recorded = set->recorded != NULL && set->recorded[i];
        if (!recorded && gp_stream_unused_since_forget(st))
            continue;
        rc = gp_stream_drain(p, st);
    }
    return rc;
}

/* Undoes phase 1 (t's streams locked): maps every held handle back where it was. Returns the pages that
 * could not be mapped back; their handles go back to the device and their ranges stay paused. */
static size_t roll_back(gp_pool_state *p, gp_held_page *held, size_t nheld)
{
    size_t lost = 0;
    for (size_t k = nheld; k-- > 0;) {
        if (gp_vmm_map_back(p, &held[k]) != GP_OK) {
            assert(held != NULL && held[k].seg != NULL && held[k].seg->owner != NULL); /* pages held of owned ranges */
            gp_pool_ledger_credit(p, held[k].seg->owner->tenant, 0, p->page);
            gp_page_release(p, held[k].handle);
            lost++;
        }
    }
    return lost;
}

/* Pauses t's own memory in p (the two phases above). */
static int pause_own(gp_pool_state *p, gp_tenant *t, const char *name, unsigned flags)
{
    int rc = GP_OK;
    gp_pool_lock(p);
    if (t->paused) {
        gp_pool_unlock(p);
        return gp_error_set(GP_ERR_INVALID, "gp_tenant_pause: tenant '%s' is paused already", name);
    }
    gp_collect_all_pending(p);
    t->paused = true; /* closes the gate first: no allocation may start in it from here */
    gp_tenant_update_gate(t);
    int trimmed; /* its cache goes back first, so that resume maps only what live blocks need */
    p->provider->release_tenant(p, t, SIZE_MAX, &trimmed);
    gp_stream_set set;
    gp_lock_tenant_streams(p, t, &set);
    rc = drain(p, &set);
    if (rc == GP_OK)
        rc = gp_alias_dissolve(p, t); /* one address per page, so that a page is unmapped once */
    size_t capacity = 0;
    for (gp_segment *seg = p->segments_head; seg != NULL; seg = seg->next)
        if (tenant_range(seg, t))
            capacity += seg->mapped_bytes / p->page;
    gp_held_page *held = capacity > 0 ? malloc(capacity * sizeof *held) : NULL;
    size_t nheld = 0;
    if (capacity > 0 && held == NULL)
        rc = gp_error_set(GP_ERR_OOM, "gp_tenant_pause: out of host memory for %zu page handles", capacity);
    if (rc == GP_OK && (flags & GP_PAUSE_KEEP_CONTENTS))
        rc = gp_staging_stage(p, t);
    for (gp_segment *seg = p->segments_head; seg != NULL && rc == GP_OK; seg = seg->next)
        if (tenant_range(seg, t))
            rc = gp_vmm_pause_range(p, seg, held, &nheld);
    if (rc == GP_OK) { /* phase 2: commit (a handle the device refuses stays in the page pool) */
        for (size_t k = 0; k < nheld; k++) {
            assert(held != NULL && held[k].seg != NULL && held[k].seg->owner != NULL); /* pages held of owned ranges */
            gp_pool_ledger_credit(p, held[k].seg->owner->tenant, 0, p->page); /* GPU-wide: no longer held */
            gp_page_release(p, held[k].handle);
        }
        atomic_fetch_add(&t->pauses, 1);
    } else {
        size_t lost = roll_back(p, held, nheld);
        if (lost == 0) {
            /* Every page is mapped again. A range that gave up no page (nothing in use in it, or its
             * first unmap failed) held nothing back for gp_vmm_map_back to unpause it: every range of
             * t is unpaused here (a paused range is skipped by trims, steals, stitching and the
             * statistics' walks; gp_check: only a paused tenant's range is paused). */
            for (gp_segment *seg = p->segments_head; seg != NULL; seg = seg->next)
                if (tenant_range(seg, t) && seg->paused)
                    gp_vmm_unpause_range(p, seg);
            gp_staging_drop(p, t);
            t->paused = false;
            gp_tenant_update_gate(t);
            gp_error_append(" (gp_tenant_pause of '%s' rolled back: its memory and contents are as they were)", name);
        } else {
            atomic_fetch_add(&t->pauses, 1);
            gp_error_append(" (gp_tenant_pause of '%s' could not be rolled back: %zu pages could not be mapped again; "
                            "it stays paused, %s)", name, lost,
                            t->staged != NULL ? "resume restores its staged contents"
                                              : "the contents of those pages are lost");
        }
    }
    free(held);
    gp_unlock_stream_set(p, &set);
    gp_pool_unlock(p);
    return rc;
}

/* Maps fresh pages into every paused range of t, appending each to mapped[] (room entries). Pool lock
 * held, no stream lock. The ranges stay paused until the resume commits. */
static int remap_tenant(gp_pool_state *p, gp_tenant *t, gp_held_page *mapped, size_t *nmapped, size_t room)
{
    int rc = GP_OK;
    gp_stream_set set;
    gp_lock_tenant_streams(p, t, &set);
    for (gp_segment *seg = p->segments_head; seg != NULL && rc == GP_OK; seg = seg->next)
        if (tenant_range(seg, t) && seg->paused)
            rc = gp_vmm_resume_range(p, seg, mapped, nmapped, room);
    gp_unlock_stream_set(p, &set);
    return rc;
}

/* The in-use pages without memory of t's paused ranges. t's streams locked. */
static size_t paused_pages(gp_pool_state *p, const gp_tenant *t)
{
    size_t need = 0;
    for (gp_segment *seg = p->segments_head; seg != NULL; seg = seg->next)
        if (tenant_range(seg, t) && seg->paused)
            need += gp_vmm_paused_pages(p, seg);
    return need;
}

/* Resumes t's own memory in p. */
static int resume_own(gp_pool_state *p, gp_tenant *t, const char *name)
{
    int rc = GP_OK;
    gp_pool_lock(p);
    if (!t->paused) {
        gp_pool_unlock(p);
        return gp_error_set(GP_ERR_INVALID, "gp_tenant_resume: tenant '%s' is not paused", name);
    }
    /* Every page this attempt maps is written down, so that a failure unmaps exactly those: not the
     * pages an earlier resume whose undo failed left mapped, nor ranges of t that are not paused. */
    gp_stream_set set;
    gp_lock_tenant_streams(p, t, &set);
    size_t room = paused_pages(p, t), nmapped = 0;
    gp_unlock_stream_set(p, &set);
    gp_held_page *mapped = room > 0 ? malloc(room * sizeof *mapped) : NULL;
    if (room > 0 && mapped == NULL) {
        gp_pool_unlock(p);
        return gp_error_set(GP_ERR_OOM, "gp_tenant_resume: '%s': out of host memory for %zu page handles "
                            "(it stays paused)", name, room);
    }
    size_t peak_before = atomic_load(&p->reserved_peak);
    rc = remap_tenant(p, t, mapped, &nmapped, room);
    if (rc == GP_ERR_OOM) { /* the device is full: cached free pages elsewhere serve first */
        int failed = GP_OK;
        gp_lock_tenant_streams(p, t, &set);
        size_t need = paused_pages(p, t);
        gp_unlock_stream_set(p, &set);
        gp_collect_all_pending(p); /* quick-listed and completed pending blocks hide whole free pages */
        /* t's ranges are still paused, so this takes no page of t's that this attempt mapped */
        if (gp_vmm_unmap_free_pages(p, need, NULL, false, UINT64_MAX, false, &failed, NULL, t) > 0)
            rc = remap_tenant(p, t, mapped, &nmapped, room);
    }
    gp_lock_tenant_streams(p, t, &set);
    if (rc == GP_OK && t->staged != NULL)
        rc = gp_staging_restore(p, t);
    if (rc == GP_OK) {
        /* Commit. Blocks freed while paused may sit in pages no live block shares: they are cache again. */
        for (gp_segment *seg = p->segments_head; seg != NULL; seg = seg->next)
            if (tenant_range(seg, t) && seg->paused)
                gp_vmm_unpause_range(p, seg);
        gp_staging_drop(p, t);
        t->paused = false;
        gp_tenant_update_gate(t);
    } else {
        /* A failed resume changes nothing: the pages this attempt mapped go back, its ranges stay paused
         * (they held device memory for a tenant still paused, out of every other tenant's reach). */
        char why[512];
        snprintf(why, sizeof why, "%s", gp_last_error());
        size_t undone = 0;
        int undo = gp_vmm_unmap_resumed(p, mapped, nmapped, &undone);
        for (size_t k = 0; mapped != NULL && k < undone; k++) { /* none mapped when none was paused */
            assert(mapped[k].seg->owner != NULL && mapped[k].seg->owner->tenant == t); /* t's own pages */
            gp_pool_ledger_credit(p, t, 0, p->page);
            gp_page_release(p, mapped[k].handle);
        }
        if (undo != GP_OK) { /* a second fault: what stays mapped stays the paused tenant's, accounted, not lost */
            char undo_why[512]; /* copied: gp_error_set writes the buffer gp_last_error() points to */
            snprintf(undo_why, sizeof undo_why, "%s", gp_last_error());
            gp_error_set(rc, "%s; undoing it failed too (%s), so %zu of the %zu pages it mapped stay mapped", why,
                         undo_why, nmapped - undone, nmapped);
        }
        gp_error_append(" (gp_tenant_resume of '%s': it stays paused; resume again once memory is free)", name);
    }
    free(mapped);
    gp_unlock_stream_set(p, &set);
    if (rc == GP_OK) /* the pages mapped back may raise the peak, as growth does */
        gp_peak_note(p, peak_before, 0);
    gp_pool_unlock(p);
    return rc;
}

/* ---- the graph pools of a tenant ------------------------------------------------------------------
 * A CUDA graph's private pool charged to t (api/capture.c) pauses and resumes with t: its pages go back
 * to the device and come back at the same addresses, so that the graph, whose kernels name those
 * addresses, replays after the resume (what torch_memory_saver keeps CUDA graphs valid for). Its
 * contents are staged with GP_PAUSE_KEEP_CONTENTS as t's are. The graph pool's own pause waits for its
 * own streams (the capturing ones); t's pause, done first, waited for t's streams, where the graph is
 * replayed when it is replayed on the model's stream; a replay on a stream the pool never saw is the
 * caller's to finish first, as for any work on t's memory. */

typedef struct graph_step {
    const gp_tenant *t;
    bool pause;          /* pause (else resume) the graph pools charged to t that are not (are) paused */
    unsigned flags;
    int rc;              /* the first failure */
    char why[512];       /* its message */
    size_t done, failed; /* graph pools changed, and those that failed */
} graph_step;

static bool graph_pool_paused(gp_pool *graph)
{
    gp_pool_state *g = graph->state;
    gp_pool_lock(g);
    bool paused = gp_graph_pool_tenant(graph)->paused;
    gp_pool_unlock(g);
    return paused;
}

/* One graph pool of step's walk over the pool's graph pools (gp_capture_each: the caller holds none of
 * the parent's locks). */
static void step_graph_pool(gp_pool *graph, void *arg)
{
    graph_step *s = arg;
    gp_tenant *own = gp_graph_pool_tenant(graph);
    if (own->charge_to != s->t || (s->pause && s->rc != GP_OK) || graph_pool_paused(graph) == s->pause)
        return;
    /* named in messages after the model (its own name is "default") */
    char label[GP_TENANT_NAME_MAX + 32];
    snprintf(label, sizeof label, "%s (a CUDA graph's pool)", s->t->name);
    int rc = s->pause ? pause_own(graph->state, own, label, s->flags) : resume_own(graph->state, own, label);
    if (rc == GP_OK) {
        s->done++;
        return;
    }
    s->failed++;
    if (s->rc == GP_OK) {
        s->rc = rc;
        snprintf(s->why, sizeof s->why, "%s", gp_last_error());
    }
}

GP_API int gp_tenant_pause(gp_pool *pool, const char *name, unsigned flags)
{
    gp_pool_state *p = NULL;
    int rc = gp_pool_enter(pool, "gp_tenant_pause", &p);
    if (rc != GP_OK)
        return rc;
    gp_tenant *t = NULL;
    if ((rc = gp_tenant_find(p, name, "gp_tenant_pause", &t)) != GP_OK)
        return rc;
    if (!p->provider->pages)
        return gp_error_set(GP_ERR_INVALID, "gp_tenant_pause: '%s': pausing needs a virtual memory backend (vmm or "
                            "sim-vmm), not '%s'", name, p->ops->name);
    if (flags & ~GP_PAUSE_KEEP_CONTENTS)
        return gp_error_set(GP_ERR_INVALID, "gp_tenant_pause: unknown flags 0x%x", flags);
    if (gp_capture_underway()) /* waiting for a stream's work is illegal while a graph is captured */
        return gp_error_set(GP_ERR_INVALID, "gp_tenant_pause: '%s': a CUDA graph is being captured in this process "
                            "(a gp_graph_pool_begin window is open): pause once it has ended", name);
    if ((rc = pause_own(p, t, name, flags)) != GP_OK)
        return rc;
    graph_step step = {.t = t, .pause = true, .flags = flags};
    (void)gp_capture_each(p, step_graph_pool, &step);
    if (step.rc == GP_OK)
        return GP_OK;
    /* A graph pool that failed rolled itself back (or stays paused, saying so); the others and t come
     * back, so that the failed pause changes nothing */
    graph_step undo = {.t = t, .pause = false};
    (void)gp_capture_each(p, step_graph_pool, &undo);
    int back = resume_own(p, t, name);
    gp_error_set(step.rc, "%s (gp_tenant_pause of '%s': one of its CUDA graph pools could not be paused, so the "
                 "pause was undone%s)", step.why, name,
                 undo.rc != GP_OK || back != GP_OK ? "; undoing it failed too: resume it again" : "");
    return step.rc;
}

GP_API int gp_tenant_resume(gp_pool *pool, const char *name)
{
    gp_pool_state *p = NULL;
    int rc = gp_pool_enter(pool, "gp_tenant_resume", &p);
    if (rc != GP_OK)
        return rc;
    gp_tenant *t = NULL;
    if ((rc = gp_tenant_find(p, name, "gp_tenant_resume", &t)) != GP_OK)
        return rc;
    gp_pool_lock(p);
    bool paused = t->paused;
    gp_pool_unlock(p);
    /* t itself first; then its graph pools, which a resume that failed for one of them left paused (a
     * second resume of t picks them up: t is then not paused itself) */
    if (paused && (rc = resume_own(p, t, name)) != GP_OK)
        return rc;
    graph_step step = {.t = t, .pause = false};
    (void)gp_capture_each(p, step_graph_pool, &step);
    if (!paused && step.done == 0 && step.failed == 0)
        return gp_error_set(GP_ERR_INVALID, "gp_tenant_resume: tenant '%s' is not paused", name);
    if (step.rc != GP_OK)
        return gp_error_set(step.rc, "%s (gp_tenant_resume of '%s': it is resumed, but %zu of its CUDA graph pools "
                            "stay paused; resume it again once memory is free)", step.why, name, step.failed);
    return GP_OK;
}
