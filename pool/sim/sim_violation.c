/*
 * sim_violation.c — what the sim found wrong, as text: the first violation (a race, a pattern
 * mismatch, a bad call; later ones are only counted) and the names of kernel operations in messages.
 * A leaf: every other file of the sim calls it, it calls none of them.
 */
#include <stdarg.h>
#include <stdio.h>

#include "sim/sim_internal.h"

const char *gpsim_kernel_op_name(int kernel_op)
{
    switch (kernel_op) {
    case GP_SIM_READ: return "READ";
    case GP_SIM_WRITE: return "WRITE";
    case GP_SIM_CHECK: return "CHECK";
    case GP_SIM_USE: return "USE";
    default: return "?";
    }
}

void gpsim_violation(gp_sim *sim, const char *fmt, ...)
{
    if (sim->first_violation[0] != '\0')
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(sim->first_violation, sizeof sim->first_violation, fmt, ap);
    va_end(ap);
}
