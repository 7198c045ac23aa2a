/*
 * pool_ledger.c — one pool's side of the per-GPU ledger (ledger.h): attaching at create (config key
 * `ledger`), writing the budget.NAME.* limits, mapping the pool's tenants to the ledger's names, the
 * charge made before every device allocation and the credit after every device free, answering
 * other processes' requests to trim (pressure), publishing the figures `gpupool top` shows, and the
 * check that the ledger agrees with the pool.
 *
 * Where the charges are made (every one under the pool lock):
 *     segment.c grow          device + tenant bytes before mem_alloc; credited if mem_alloc fails
 *     segment.c release       credited after mem_free; a segment stolen across tenants moves its
 *                             tenant bytes (refused when the taker's GPU-wide max would be passed)
 *     vmm.c grow              tenant bytes of the pages about to be mapped, before any is mapped;
 *                             what was not mapped is credited back
 *     pages.c get/release     device bytes before phys_create, credited after phys_release
 *     pages.c unmap, vmm.c pause/resume   tenant bytes credited when pages leave a tenant, charged
 *                             again before a paused range's pages come back
 * so that for this pool:  ledger device_held == reserved,  ledger held[tenant] == tenant->held.
 *
 * A charge that takes a tenant above its GPU-wide high goes through, and the tenant's cache is given
 * back here and asked back from the other processes. A refused charge first gives back this pool's own cache (the tenant's for a max, any for the
 * device) and, when other processes hold cache that would do, asks them (pressure) and waits at
 * most ledger_wait, retrying every millisecond. Holders answer on their next slow path or
 * gp_maintain (gp_pool_ledger_service, called by gp_maintain_locked).
 */
#define _POSIX_C_SOURCE 200809L
#include <assert.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/error.h"
#include "provider/ledger.h"
#include "provider/pending.h"
#include "provider/thread_cache.h"
#include "provider/pool_ledger.h"
#include "provider/provider.h"

typedef struct gp_pool_ledger {
    gp_ledger *ledger;
    unsigned slot;
    unsigned tenant_index[GP_MAX_TENANTS]; /* local tenant index -> ledger index + 1; 0 = not yet */
    uint64_t last_publish_ns, last_reclaim_ns;
} gp_pool_ledger;

static uint64_t monotonic_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* The ledger index of local tenant t (pool lock held). A graph pool's tenant is charged under the name
 * of the tenant it is charged to (ds/tenant.h: charge_to, set before its first charge): a model's
 * GPU-wide budget counts its CUDA graphs' memory, as its budget in its own pool does. */
static int ledger_tenant(gp_pool_ledger *pl, const gp_tenant *t, unsigned *out)
{
    assert(t->index < GP_MAX_TENANTS);
    if (pl->tenant_index[t->index] == 0) {
        unsigned idx;
        int rc = gp_ledger_tenant(pl->ledger, t->charge_to != NULL ? t->charge_to->name : t->name, &idx);
        if (rc != GP_OK)
            return rc;
        pl->tenant_index[t->index] = idx + 1;
    }
    *out = pl->tenant_index[t->index] - 1;
    return GP_OK;
}

int gp_pool_ledger_name(const gp_config *cfg, const gp_backend_ops *ops, void *ctx, int device,
                        char out[GP_LEDGER_NAME_MAX])
{
    if (strcmp(cfg->ledger, "on") != 0 || ops == NULL || ops->device_uuid == NULL)
        return gp_ledger_shm_name(cfg->ledger, device, NULL, out);
    void *own = NULL;
    int rc = ctx != NULL ? GP_OK : ops->open(cfg, device, &own);
    unsigned char uuid[16];
    if (rc == GP_OK)
        rc = ops->device_uuid(ctx != NULL ? ctx : own, uuid);
    if (own != NULL)
        ops->close(own);
    if (rc != GP_OK) {
        gp_error_append(" (ledger:on names device %d's ledger by its UUID; name it instead, ledger:NAME, the same "
                        "in every process that shares the GPU)", device);
        return rc;
    }
    return gp_ledger_shm_name(cfg->ledger, device, uuid, out);
}

int gp_pool_ledger_attach(gp_pool_state *p)
{
    p->ledger = NULL;
    if (strcmp(p->cfg.ledger, "off") == 0)
        return GP_OK;
    char name[GP_LEDGER_NAME_MAX];
    int rc = gp_pool_ledger_name(&p->cfg, p->ops, p->ctx, p->device, name);
    if (rc != GP_OK)
        return rc;
    gp_pool_ledger *pl = calloc(1, sizeof *pl);
    if (pl == NULL)
        return gp_error_set(GP_ERR_INVALID, "gp_pool_create: out of host memory for the ledger");
    rc = gp_ledger_open(&pl->ledger, name, p->device_total);
    if (rc == GP_OK) {
        rc = gp_ledger_register(pl->ledger, p->device, &pl->slot);
        if (rc != GP_OK)
            gp_ledger_close(pl->ledger);
    }
    if (rc != GP_OK) {
        free(pl);
        gp_error_append(" (gp_pool_create: ledger:%s)", p->cfg.ledger);
        return rc;
    }
    for (unsigned i = 0; i < p->cfg.num_budgets && rc == GP_OK; i++) {
        const gp_config_budget *b = &p->cfg.budgets[i];
        rc = gp_ledger_set_budget(pl->ledger, b->name, b->max, b->high, b->min, b->set);
    }
    if (rc != GP_OK) {
        gp_ledger_unregister(pl->ledger, pl->slot);
        gp_ledger_close(pl->ledger);
        free(pl);
        return rc;
    }
    p->ledger = pl;
    return GP_OK;
}

void gp_pool_ledger_detach(gp_pool_state *p)
{
    gp_pool_ledger *pl = p->ledger;
    if (pl == NULL)
        return;
    gp_ledger_unregister(pl->ledger, pl->slot);
    gp_ledger_close(pl->ledger);
    free(pl);
    p->ledger = NULL;
}

/* Gives back up to `want` bytes of this pool's cache: tenant t's, or any (t == NULL). Pool lock held,
 * no stream lock. */
static size_t trim_own(gp_pool_state *p, gp_tenant *t, size_t want)
{
    if (t != NULL)
        return gp_provider_trim_tenant(p, t, want);
    int failed = GP_OK;
    gp_collect_all_pending(p);
    gp_flush_all(p);
    size_t cached = atomic_load(&p->reserved) - gp_allocated_estimate(p);
    return p->provider->release(p, cached > want ? cached - want : 0, UINT64_MAX, &failed);
}

static int charge(gp_pool_state *p, gp_tenant *t, size_t device_bytes, size_t tenant_bytes, bool may_wait);

int gp_pool_ledger_charge(gp_pool_state *p, gp_tenant *t, size_t device_bytes, size_t tenant_bytes, bool may_wait)
{
    int rc = charge(p, t, device_bytes, tenant_bytes, may_wait);
    /* The ledger's own "out of memory" (the device's capacity or another tenant's min, across
     * processes) keeps its message: the slow paths treat it as they treat a local min guarantee. */
    return rc == GP_ERR_OOM ? GP_ERR_MIN_GUARANTEE : rc;
}

static int charge(gp_pool_state *p, gp_tenant *t, size_t device_bytes, size_t tenant_bytes, bool may_wait)
{
    gp_pool_ledger *pl = p->ledger;
    if (pl == NULL)
        return GP_OK;
    unsigned idx;
    int rc = ledger_tenant(pl, t, &idx);
    if (rc != GP_OK)
        return rc;
    gp_ledger_shortfall why;
    rc = gp_ledger_charge(pl->ledger, pl->slot, idx, device_bytes, tenant_bytes, &why);
    if (rc == GP_OK && why.over_high > 0) {
        /* Above the tenant's GPU-wide high: its cache is given back, here and (asked) elsewhere, but
         * the growth is not refused. */
        if (may_wait)
            trim_own(p, t, why.over_high);
        gp_ledger_ask(pl->ledger, pl->slot, (int)idx, why.over_high);
    }
    if (rc == GP_OK || !may_wait)
        return rc;
    /* 1. Our own cache. */
    if (trim_own(p, rc == GP_ERR_QUOTA ? t : NULL, why.need) > 0) {
        rc = gp_ledger_charge(pl->ledger, pl->slot, idx, device_bytes, tenant_bytes, &why);
        if (rc == GP_OK)
            return rc;
    }
    /* 2. Other processes' cache: ask, and wait a bounded time for them to give it back. */
    double wait = p->cfg.ledger_wait > 0 ? p->cfg.ledger_wait : 0;
    uint64_t start = monotonic_ns(), deadline = start + (uint64_t)(wait * 1e9), next_ask = start;
    while (why.cached_elsewhere > 0 && monotonic_ns() < deadline) {
        if (monotonic_ns() >= next_ask) {
            gp_ledger_ask(pl->ledger, pl->slot, rc == GP_ERR_QUOTA ? (int)idx : -1, why.need);
            next_ask = monotonic_ns() + 20 * 1000000u;
        }
        nanosleep(&(struct timespec){0, 1000000}, NULL);
        rc = gp_ledger_charge(pl->ledger, pl->slot, idx, device_bytes, tenant_bytes, &why);
        if (rc == GP_OK)
            return rc;
    }
    return rc;
}

void gp_pool_ledger_credit(gp_pool_state *p, gp_tenant *t, size_t device_bytes, size_t tenant_bytes)
{
    gp_pool_ledger *pl = p->ledger;
    if (pl == NULL || (device_bytes == 0 && tenant_bytes == 0))
        return;
    unsigned idx = 0;
    if (tenant_bytes != 0) {
        assert(pl->tenant_index[t->index] != 0); /* it was charged, so it is mapped */
        idx = pl->tenant_index[t->index] - 1;
    }
    gp_ledger_credit(pl->ledger, pl->slot, idx, device_bytes, tenant_bytes);
}

int gp_pool_ledger_move(gp_pool_state *p, gp_tenant *from, gp_tenant *to, size_t bytes)
{
    if (p->ledger == NULL || from == to)
        return GP_OK;
    int rc = gp_pool_ledger_charge(p, to, 0, bytes, false);
    if (rc == GP_OK)
        gp_pool_ledger_credit(p, from, 0, bytes);
    return rc;
}

int gp_pool_ledger_make_room(gp_pool_state *p, gp_tenant *t, size_t device_bytes)
{
    if (p->ledger == NULL)
        return GP_OK;
    int rc = charge(p, t, device_bytes, 0, true);
    if (rc == GP_OK) /* there is room now: the pages' own charges follow */
        gp_pool_ledger_credit(p, t, device_bytes, 0);
    return rc;
}

/* Publishes this pool's figures (pool lock held, no stream lock). */
static void publish(gp_pool_state *p, gp_pool_ledger *pl)
{
    gp_ledger_figures f;
    memset(&f, 0, sizeof f);
    unsigned tenants = atomic_load(&p->tenants.count);
    for (unsigned i = 0; i < tenants; i++) {
        gp_tenant *t = p->tenants.tenants[i];
        unsigned idx;
        if (ledger_tenant(pl, t, &idx) == GP_OK)
            f.refusals[idx] += atomic_load(&t->refusals);
    }
    unsigned count = atomic_load(&p->streams.count);
    for (unsigned i = 0; i < count; i++) {
        gp_stream_state *st = p->streams.by_index[i];
        gp_stream_lock(st);
        if (st->lenders != NULL) /* the thread caches' allocations and frees too */
            gp_thread_cache_return(p, st);
        size_t live = st->allocated_bytes;
        gp_stream_unlock(st);
        unsigned local = st->tenant->index;
        if (pl->tenant_index[local] != 0)
            f.live[pl->tenant_index[local] - 1] += live;
    }
    f.ooms = atomic_load(&p->num_ooms);
    f.device_allocs = atomic_load(&p->num_device_allocs);
    f.device_frees = atomic_load(&p->num_device_frees);
    gp_ledger_publish(pl->ledger, pl->slot, &f);
}

void gp_pool_ledger_service(gp_pool_state *p, bool force_publish)
{
    gp_pool_ledger *pl = p->ledger;
    if (pl == NULL)
        return;
    uint64_t now = monotonic_ns();
    int tenant = -1;
    uint64_t bytes = 0;
    bool asked = gp_ledger_take_pressure(pl->ledger, pl->slot, &tenant, &bytes);
    if (asked) {
        gp_tenant *t = NULL;
        unsigned count = atomic_load(&p->tenants.count);
        for (unsigned i = 0; i < count && tenant >= 0; i++)
            if (pl->tenant_index[i] == (unsigned)tenant + 1)
                t = p->tenants.tenants[i];
        if (tenant < 0 || t != NULL) {
            /* A tenant's own min still holds: its memory goes only down to it. */
            size_t want = (size_t)bytes;
            if (t != NULL) {
                size_t held = gp_tenant_charged(t), min = atomic_load(&t->min); /* its graphs' pools count */
                want = held > min ? (want < held - min ? want : held - min) : 0;
            }
            if (want > 0)
                trim_own(p, t, want);
        }
    }
    if (now - pl->last_reclaim_ns >= 1000000000u) {
        gp_ledger_reclaim_dead(pl->ledger);
        pl->last_reclaim_ns = now;
    }
    if (asked || force_publish || now - pl->last_publish_ns >= 10000000u) {
        publish(p, pl);
        pl->last_publish_ns = now;
    }
}

const char *gp_pool_ledger_check(gp_pool_state *p)
{
    gp_pool_ledger *pl = p->ledger;
    if (pl == NULL)
        return NULL;
    if (gp_ledger_slot_device(pl->ledger, pl->slot) != atomic_load(&p->reserved))
        return "the ledger's device bytes for this pool differ from its reserved bytes";
    unsigned count = atomic_load(&p->tenants.count);
    for (unsigned i = 0; i < count; i++) {
        gp_tenant *t = p->tenants.tenants[i];
        uint64_t charged = pl->tenant_index[i] != 0 ? gp_ledger_slot_held(pl->ledger, pl->slot, pl->tenant_index[i] - 1) : 0;
        if (charged != atomic_load(&t->held))
            return "the ledger's bytes for a tenant of this pool differ from the tenant's held bytes";
    }
    return NULL;
}
