/*
 * test_vmm_backend.c — unit tests of the "vmm" backend (pool/backend/backend_vmm.c): the CUDA driver's virtual
 * memory API reached through the runtime.
 *
 * Without a driver (CI) open() must fail cleanly with GP_ERR_BACKEND and say why; the GPU round trip
 * then skips. On a machine with a GPU the round trip runs: it maps one physical handle at two
 * addresses and proves the aliasing with cudaMemset through one and cudaMemcpy back through the other.
 * Without GPUPOOL_WITH_CUDA only the registry's answer is checked.
 */
#include <criterion/criterion.h>

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "base/config.h"
#include "gpupool.h"

#ifdef GPUPOOL_WITH_CUDA

/* The runtime calls of the round trip. The unit tests are not given CUDA's include directory by
 * tests/CMakeLists.txt; declare the few calls used (cudaError_t is an enum, int-sized) when the
 * header cannot be found. The library links the runtime statically, so the symbols are there. */
#if defined(__has_include)
#if __has_include(<cuda_runtime_api.h>)
#include <cuda_runtime_api.h>
#define GP_TEST_HAVE_CUDA_HEADER 1
#endif
#endif
#ifndef GP_TEST_HAVE_CUDA_HEADER
typedef int cudaError_t;
enum { cudaSuccess = 0, cudaMemcpyDeviceToHost = 2 };
extern cudaError_t cudaMemset(void *dev, int value, size_t count);
extern cudaError_t cudaMemcpy(void *dst, const void *src, size_t count, int kind);
extern cudaError_t cudaDeviceSynchronize(void);
extern const char *cudaGetErrorString(cudaError_t err);
#endif

static const gp_backend_ops *vmm(void)
{
    const gp_backend_ops *ops = gp_backend_find("vmm");
    cr_assert_not_null(ops, "%s", gp_last_error());
    return ops;
}

static gp_config vmm_config(void)
{
    gp_config cfg;
    memset(&cfg, 0, sizeof cfg);
    strcpy(cfg.backend, "vmm");
    return cfg;
}

Test(vmm_backend, registered_with_the_vmm_operations)
{
    const gp_backend_ops *ops = vmm();
    cr_expect_eq(ops, &gp_backend_vmm);
    cr_expect_str_eq(ops->name, "vmm");
    cr_expect(gp_backend_has_vmm(ops));
    cr_expect(ops->vm_granularity && ops->va_reserve && ops->va_release && ops->phys_create &&
              ops->phys_release && ops->map && ops->unmap);
    /* the "cuda" backend's operations for everything else */
    cr_expect_eq(ops->mem_alloc, gp_backend_cuda.mem_alloc);
    cr_expect_eq(ops->event_record, gp_backend_cuda.event_record);
    cr_expect_eq(ops->stream_wait_event, gp_backend_cuda.stream_wait_event);
    cr_expect(!gp_backend_has_vmm(&gp_backend_cuda));
}

Test(vmm_backend, open_without_a_driver_fails_cleanly)
{
    const gp_backend_ops *ops = vmm();
    gp_config cfg = vmm_config();
    void *sentinel = (void *)(uintptr_t)0x5e7;
    void *ctx = sentinel;
    int rc = ops->open(&cfg, 0, &ctx);
    if (rc == GP_OK) {
        ops->close(ctx);
        cr_skip_test("a CUDA driver and device are present: the round trip covers open");
    }
    cr_expect_eq(rc, GP_ERR_BACKEND, "%s", gp_last_error());
    cr_expect_eq(ctx, sentinel, "out-parameter written on failure");
    const char *message = gp_last_error();
    cr_expect(strstr(message, "vmm backend unavailable") != NULL, "%s", message);
    cr_expect(strstr(message, "driver") != NULL || strstr(message, "Driver") != NULL, "mentions the driver: %s",
              message);

    /* the failure is remembered (resolution runs once per process) and said again */
    char first[1024];
    strncpy(first, message, sizeof first - 1);
    first[sizeof first - 1] = '\0';
    ctx = sentinel;
    cr_expect_eq(ops->open(&cfg, 0, &ctx), GP_ERR_BACKEND);
    cr_expect_str_eq(gp_last_error(), first);
    cr_expect_eq(ctx, sentinel);
}

/* ---- on a GPU --------------------------------------------------------------------------------- */

static void expect_bytes(const unsigned char *bytes, size_t n, unsigned char value, const char *what)
{
    size_t bad = 0;
    while (bad < n && bytes[bad] == value)
        bad++;
    cr_expect_eq(bad, n, "%s: byte %zu is 0x%02x, expected 0x%02x", what, bad, bad < n ? bytes[bad] : 0, value);
}

#define CUDA_OK(call)                                                                  \
    do {                                                                               \
        cudaError_t err_ = (call);                                                     \
        cr_assert_eq(err_, cudaSuccess, "%s: %s", #call, cudaGetErrorString(err_));    \
    } while (0)

Test(vmm_backend, round_trip_on_a_gpu)
{
    const gp_backend_ops *ops = vmm();
    gp_config cfg = vmm_config();
    void *ctx = NULL;
    if (ops->open(&cfg, 0, &ctx) != GP_OK)
        cr_skip_test("no usable GPU: %s", gp_last_error());

    size_t g = 0;
    cr_assert_eq(ops->vm_granularity(ctx, &g), GP_OK, "%s", gp_last_error());
    cr_assert(g > 0 && (g & (g - 1)) == 0, "granularity %zu", g);
    /* 8 MiB and two 2 MiB handles on current GPUs (granularity 2 MiB) */
    size_t reserve = 4 * g, page = g;

    gp_devptr va = 0;
    cr_assert_eq(ops->va_reserve(ctx, reserve, &va), GP_OK, "%s", gp_last_error());
    cr_expect_eq(va % g, 0, "aligned to the granularity");
    gp_phys h1 = 0, h2 = 0;
    cr_assert_eq(ops->phys_create(ctx, page, &h1), GP_OK, "%s", gp_last_error());
    cr_assert_eq(ops->phys_create(ctx, page, &h2), GP_OK, "%s", gp_last_error());
    gp_devptr a = va, b = va + page, alias = va + 2 * page; /* a and alias: h1; b: h2 */
    cr_assert_eq(ops->map(ctx, a, page, h1), GP_OK, "%s", gp_last_error());
    cr_assert_eq(ops->map(ctx, b, page, h2), GP_OK, "%s", gp_last_error());
    cr_assert_eq(ops->map(ctx, alias, page, h1), GP_OK, "the same handle at a second address: %s",
                 gp_last_error());

    unsigned char *host = malloc(page);
    cr_assert_not_null(host);
    CUDA_OK(cudaMemset((void *)a, 0xab, page));
    CUDA_OK(cudaMemset((void *)b, 0xcd, page));
    CUDA_OK(cudaDeviceSynchronize());
    CUDA_OK(cudaMemcpy(host, (const void *)alias, page, cudaMemcpyDeviceToHost));
    expect_bytes(host, page, 0xab, "written through the first address, read through the second");
    CUDA_OK(cudaMemcpy(host, (const void *)b, page, cudaMemcpyDeviceToHost));
    expect_bytes(host, page, 0xcd, "the other handle");
    CUDA_OK(cudaMemset((void *)alias, 0x11, page));
    CUDA_OK(cudaMemcpy(host, (const void *)a, page, cudaMemcpyDeviceToHost));
    expect_bytes(host, page, 0x11, "and the other way round");
    /* one copy across the two adjacent mappings of different handles */
    unsigned char *two = malloc(2 * page);
    cr_assert_not_null(two);
    CUDA_OK(cudaMemcpy(two, (const void *)a, 2 * page, cudaMemcpyDeviceToHost));
    expect_bytes(two, page, 0x11, "first mapping");
    expect_bytes(two + page, page, 0xcd, "second mapping");
    free(two);
    free(host);

    /* the shared "cuda" operations work on the vmm context */
    gp_event ev = NULL;
    cr_assert_eq(ops->event_create(ctx, &ev), GP_OK, "%s", gp_last_error());
    cr_assert_eq(ops->event_record(ctx, ev, NULL), GP_OK, "%s", gp_last_error());
    cr_assert_eq(ops->event_synchronize(ctx, ev), GP_OK, "%s", gp_last_error());
    cr_expect_eq(ops->event_query(ctx, ev), GP_OK);
    cr_assert_eq(ops->event_destroy(ctx, ev), GP_OK, "%s", gp_last_error());
    size_t free_bytes = 0, total = 0;
    cr_assert_eq(ops->mem_info(ctx, &free_bytes, &total), GP_OK, "%s", gp_last_error());
    cr_expect(total > 0 && free_bytes <= total);

    /* more physical memory than the device has: GP_ERR_OOM, with the call in the message */
    gp_phys too_big = 0;
    size_t beyond = (total / g + 1) * g;
    cr_expect_eq(ops->phys_create(ctx, beyond, &too_big), GP_ERR_OOM, "%s", gp_last_error());
    cr_expect(strstr(gp_last_error(), "cuMemCreate(size=") != NULL, "%s", gp_last_error());

    cr_assert_eq(ops->unmap(ctx, a, page), GP_OK, "%s", gp_last_error());
    cr_assert_eq(ops->unmap(ctx, b, page), GP_OK, "%s", gp_last_error());
    cr_assert_eq(ops->unmap(ctx, alias, page), GP_OK, "%s", gp_last_error());
    cr_assert_eq(ops->phys_release(ctx, h1), GP_OK, "%s", gp_last_error());
    cr_assert_eq(ops->phys_release(ctx, h2), GP_OK, "%s", gp_last_error());
    cr_assert_eq(ops->va_release(ctx, va, reserve), GP_OK, "%s", gp_last_error());

    /* a driver error is reported with the call and the driver's name for it */
    cr_expect_eq(ops->unmap(ctx, va, page), GP_ERR_DEVICE, "nothing mapped there any more");
    cr_expect(strstr(gp_last_error(), "cuMemUnmap(ptr=") != NULL && strstr(gp_last_error(), "CUDA_ERROR_") != NULL,
              "%s", gp_last_error());
    ops->close(ctx);
}

#else /* !GPUPOOL_WITH_CUDA */

Test(vmm_backend, not_built_without_cuda)
{
    cr_expect_null(gp_backend_find("vmm"));
    cr_expect(strstr(gp_last_error(), "built without CUDA") != NULL, "%s", gp_last_error());
    cr_expect_not_null(gp_backend_find("sim-vmm"), "the simulated one is always built");
}

#endif /* GPUPOOL_WITH_CUDA */
