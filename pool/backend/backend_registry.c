/*
 * backend_registry.c — the table of backends built into this library, and lookup by name.
 *
 * "sim" and "sim-vmm" are always built; "cuda" and "vmm" only with GPUPOOL_WITH_CUDA (the CMake option
 * of that name). A new backend is one more entry in `builtin`.
 */
#include <stddef.h>
#include <string.h>

#include "backend/backend.h"
#include "base/error.h"

static const gp_backend_ops *const builtin[] = {
    &gp_backend_sim,
    &gp_backend_sim_vmm,
#ifdef GPUPOOL_WITH_CUDA
    &gp_backend_cuda,
    &gp_backend_vmm,
#endif
};

#define BUILTIN_COUNT (sizeof builtin / sizeof builtin[0])

/* Writes "sim, sim-vmm, cuda, vmm" (the names in `builtin`) into buf. */
static const char *builtin_names(char *buf, size_t len)
{
    size_t used = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < BUILTIN_COUNT && used + 1 < len; i++) {
        const char *sep = i == 0 ? "" : ", ";
        size_t need = strlen(sep) + strlen(builtin[i]->name);
        if (used + need >= len)
            break;
        memcpy(buf + used, sep, strlen(sep));
        memcpy(buf + used + strlen(sep), builtin[i]->name, strlen(builtin[i]->name) + 1);
        used += need;
    }
    return buf;
}

const gp_backend_ops *gp_backend_find(const char *name)
{
    char names[128];
    if (name == NULL) {
        gp_error_set(GP_ERR_BACKEND, "no backend name given (built in: %s)",
                     builtin_names(names, sizeof names));
        return NULL;
    }
    for (size_t i = 0; i < BUILTIN_COUNT; i++) {
        if (strcmp(builtin[i]->name, name) == 0)
            return builtin[i];
    }
    gp_error_set(GP_ERR_BACKEND, "no backend named '%s' (built in: %s)", name,
                 builtin_names(names, sizeof names));
#ifndef GPUPOOL_WITH_CUDA
    if (strcmp(name, "cuda") == 0 || strcmp(name, "vmm") == 0)
        gp_error_append("; this library was built without CUDA (GPUPOOL_WITH_CUDA=OFF)");
#endif
    return NULL;
}
