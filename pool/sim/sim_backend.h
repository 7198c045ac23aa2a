/*
 * sim_backend.h — the sim's side of the backend interface, for the backend tests: the gp_sim behind a
 * "sim" or "sim-vmm" context (what gp_backend_ops.instance returns for them).
 */
#ifndef GP_SIM_BACKEND_H
#define GP_SIM_BACKEND_H

#include "gpupool_sim.h"

gp_sim *gp_backend_sim_instance(void *ctx);

#endif /* GP_SIM_BACKEND_H */
