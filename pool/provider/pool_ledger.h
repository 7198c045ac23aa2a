/*
 * pool_ledger.h — one pool's side of the per-GPU ledger (provider/ledger.h): attach at create, the
 * charge before every device allocation and the credit after every device free, answering other
 * processes' requests to trim, and the check that the ledger agrees with the pool (pool_ledger.c).
 * Every call is a no-op when the pool has no ledger (ledger:off).
 */
#ifndef GP_POOL_LEDGER_H
#define GP_POOL_LEDGER_H

#include <stdbool.h>
#include <stddef.h>

#include "provider/ledger.h"
#include "provider/pool_state.h"

/*
 * The shm name of the ledger that cfg->ledger means for `device` of backend `ops` (gp_ledger_shm_name).
 * "on" names the device's own ledger by its UUID where the backend has one, asked through `ctx` (an
 * open instance; NULL: one is opened for the question and closed): processes pinned to different GPUs
 * all see theirs as device 0 (CUDA_VISIBLE_DEVICES), and one GPU may be device 0 in one process and 1
 * in another, so an index would join different GPUs' budgets and split one GPU's. GP_ERR_DEVICE or
 * GP_ERR_BACKEND, saying to name the ledger instead, when the UUID cannot be read.
 */
int gp_pool_ledger_name(const struct gp_config *cfg, const gp_backend_ops *ops, void *ctx, int device,
                        char out[GP_LEDGER_NAME_MAX]);

/* Attaches to the ledger named by cfg.ledger and registers the pool (create, after device_total). */
int gp_pool_ledger_attach(gp_pool_state *p);
void gp_pool_ledger_detach(gp_pool_state *p);
/* Charges device_bytes and tenant_bytes (to t) before a device call; GP_ERR_QUOTA, or
 * GP_ERR_MIN_GUARANTEE (the device or another tenant's min; returned as GP_ERR_OOM with its message).
 * `may_wait` (pool lock, no stream lock): trims this pool's cache and waits up to ledger_wait for other
 * processes' first. */
int gp_pool_ledger_charge(gp_pool_state *p, gp_tenant *t, size_t device_bytes, size_t tenant_bytes, bool may_wait);
/* Credits after memory went back (t may be NULL when tenant_bytes is 0). */
void gp_pool_ledger_credit(gp_pool_state *p, gp_tenant *t, size_t device_bytes, size_t tenant_bytes);
/* Moves tenant bytes from one tenant to another (a segment stolen across tenants); may refuse. */
int gp_pool_ledger_move(gp_pool_state *p, gp_tenant *from, gp_tenant *to, size_t bytes);
/* Waits (bounded) until the ledger has device_bytes of room for t, asking others to trim. */
int gp_pool_ledger_make_room(gp_pool_state *p, gp_tenant *t, size_t device_bytes);
/* Answers other processes' pressure and publishes figures. Pool lock held, no stream lock. */
void gp_pool_ledger_service(gp_pool_state *p, bool force_publish);
/* NULL, or which ledger figure disagrees with the pool (pool lock held). */
const char *gp_pool_ledger_check(gp_pool_state *p);

#endif /* GP_POOL_LEDGER_H */
