/*
 * admission.h — may a tenant grow? A verdict from its limits (max, high, min) and what every tenant
 * holds; the decision only, with no side effect: the caller (provider/provider.c, gp_provider_admit)
 * carries out what the verdict asks — gives back the tenant's own cache, then asks again — and turns
 * refusals into errors.
 *
 * The order of the questions is the policy:
 *   1. a paused tenant does not grow;
 *   2. growth past `high` first gives back that much of the tenant's own cache (once; growth goes on
 *      whatever it freed);
 *   3. growth past `max` first gives back that much (once), and is refused if still past it;
 *   4. growth that would leave other tenants' unmet minimum (min - held, summed) unavailable on the
 *      device is refused.
 */
#ifndef GP_ADMISSION_H
#define GP_ADMISSION_H

#include <stddef.h>

#include "ds/tenant.h"

typedef enum gp_verdict {
    GP_ADMIT = 0,
    GP_TRIM_FOR_HIGH,    /* give back `trim` bytes of the tenant's cache, then ask again */
    GP_TRIM_FOR_MAX,     /* the same, for max */
    GP_REFUSE_PAUSED,
    GP_REFUSE_QUOTA,     /* over max even after trimming */
    GP_REFUSE_GUARANTEE, /* would eat into another tenant's min */
} gp_verdict;

/* Trims already made for this request (the `trimmed` argument): each is asked for once. */
#define GP_TRIMMED_HIGH 1u
#define GP_TRIMMED_MAX 2u

typedef struct gp_admission {
    gp_verdict verdict;
    size_t trim;              /* GP_TRIM_FOR_*: bytes to give back */
    size_t owed;              /* GP_REFUSE_GUARANTEE: other tenants' unmet minimum */
    const gp_tenant *owed_to; /* GP_REFUSE_GUARANTEE: one of those tenants */
} gp_admission;

/* The verdict on tenant t growing by `bytes` on a device of `device_total` bytes. Pool lock held. */
gp_admission gp_admission_judge(const gp_tenant_registry *reg, const gp_tenant *t, size_t bytes, size_t device_total,
                                unsigned trimmed);

#endif /* GP_ADMISSION_H */
