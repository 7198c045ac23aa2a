/*
 * admission.c — the verdict on a tenant's growth (admission.h states the policy).
 */
#include "policy/admission.h"

gp_admission gp_admission_judge(const gp_tenant_registry *reg, const gp_tenant *t, size_t bytes, size_t device_total,
                                unsigned trimmed)
{
    gp_admission a = {GP_ADMIT, 0, 0, NULL};
    /* the gate, not `paused`: a graph pool asks for its parent's tenant without the parent's lock, and
     * the gate follows `paused` wherever it changes (api/pause.c) */
    if (atomic_load(&t->gate) == GP_ERR_PAUSED) {
        a.verdict = GP_REFUSE_PAUSED;
        return a;
    }
    size_t held = gp_tenant_charged(t);
    size_t high = atomic_load(&t->high);
    if (!(trimmed & GP_TRIMMED_HIGH) && high != 0 && held + bytes > high) {
        a.verdict = GP_TRIM_FOR_HIGH;
        a.trim = held + bytes - high;
        return a;
    }
    size_t max = atomic_load(&t->max);
    if (max != 0 && held + bytes > max) {
        a.verdict = (trimmed & GP_TRIMMED_MAX) ? GP_REFUSE_QUOTA : GP_TRIM_FOR_MAX;
        a.trim = held + bytes - max;
        return a;
    }
    /* Others' unmet guarantees: memory this growth may not take. */
    unsigned count = atomic_load(&reg->count);
    size_t held_all = 0;
    for (unsigned i = 0; i < count; i++) {
        const gp_tenant *v = reg->tenants[i];
        size_t v_held = gp_tenant_charged(v), min = atomic_load(&v->min);
        held_all += v_held;
        if (v != t && min > v_held) {
            a.owed += min - v_held;
            a.owed_to = v;
        }
    }
    /* owed <= the sum of mins <= device_total (gp_tenant_create and set_limits refuse more); held_all and
     * bytes are device memory: compared by subtraction, so nothing can wrap */
    if (a.owed > 0 && (bytes > device_total || a.owed > device_total - bytes ||
                       held_all > device_total - bytes - a.owed))
        a.verdict = GP_REFUSE_GUARANTEE;
    return a;
}
