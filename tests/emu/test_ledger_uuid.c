/*
 * test_ledger_uuid.c — ledger:on names a GPU's ledger by the device's UUID, not its index: pools on
 * two devices get two ledgers, the cuda and vmm backends agree on a device's ledger, the CLI's
 * question (gp_pool_ledger_name with no open instance) gives the pools' name, and a UUID that cannot
 * be read is an error that says to name the ledger. And a CUDA graph's private pool is in its parent's
 * ledger, charged to the model that captured it, whatever named the ledger. On the CUDA emulation,
 * whose devices have fixed UUIDs (cudaGetDeviceProperties).
 */
#include <stdio.h>
#include <string.h>
#include <stdint.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cuda_runtime_api.h>

#include "backend/backend.h"
#include "base/config.h"
#include "base/error.h"
#include "cuda_emu/cuda_emu.h"
#include "emu_test.h"
#include "gpupool.h"
#include "provider/ledger.h"
#include "provider/pool_ledger.h"

#define MIB ((size_t)1 << 20)

/* The name nvidia-smi would spell for device d's UUID, from the runtime itself. */
static void expected_name(int d, char out[GP_LEDGER_NAME_MAX])
{
    struct cudaDeviceProp prop;
    CHECK(cudaGetDeviceProperties(&prop, d) == cudaSuccess, "cudaGetDeviceProperties(%d)", d);
    const unsigned char *u = (const unsigned char *)prop.uuid.bytes;
    snprintf(out, GP_LEDGER_NAME_MAX,
             "/gpupool.GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", u[0], u[1], u[2],
             u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13], u[14], u[15]);
}

static bool shm_exists(const char *name)
{
    char path[128];
    snprintf(path, sizeof path, "/dev/shm%s", name);
    struct stat st;
    return stat(path, &st) == 0;
}

static void pools_on_two_devices_get_two_ledgers_named_by_uuid(void)
{
    CHECK(gpemu_init(2, 64 * MIB) == 0, "gpemu_init");
    char want0[GP_LEDGER_NAME_MAX], want1[GP_LEDGER_NAME_MAX];
    expected_name(0, want0);
    expected_name(1, want1);
    CHECK(strcmp(want0, want1) != 0, "the two devices have one UUID");
    (void)gp_ledger_unlink(want0);
    (void)gp_ledger_unlink(want1);
    gp_pool *a = NULL, *b = NULL, *c = NULL;
    CHECK(gp_pool_create(&a, 0, "cuda", "ledger:on") == GP_OK, "pool on device 0: %s", gp_last_error());
    CHECK(gp_pool_create(&b, 1, "cuda", "ledger:on") == GP_OK, "pool on device 1: %s", gp_last_error());
    CHECK(gp_pool_create(&c, 1, "vmm", "ledger:on") == GP_OK, "vmm pool on device 1: %s", gp_last_error());
    CHECK(shm_exists(want0) && shm_exists(want1), "ledgers %s and %s", want0, want1);

    /* what `gpupool top --device N` asks: the backend opened for the question alone */
    gp_config cfg;
    gp_config_defaults(&cfg);
    strcpy(cfg.ledger, "on");
    char asked[GP_LEDGER_NAME_MAX] = "";
    CHECK(gp_pool_ledger_name(&cfg, gp_backend_find("cuda"), NULL, 1, asked) == GP_OK && strcmp(asked, want1) == 0,
          "the CLI's name for device 1: '%s', the pools': '%s' (%s)", asked, want1, gp_last_error());
    CHECK(gp_pool_ledger_name(&cfg, gp_backend_find("sim"), NULL, 1, asked) == GP_OK &&
              strcmp(asked, "/gpupool.dev1") == 0,
          "a simulated GPU has no UUID: its index names it: '%s'", asked);
    int rc = gp_pool_ledger_name(&cfg, gp_backend_find("cuda"), NULL, 7, asked);
    CHECK(rc != GP_OK && strstr(gp_last_error(), "ledger:NAME") != NULL,
          "no device 7: an error that says to name the ledger: %d %s", rc, gp_last_error());
    strcpy(cfg.ledger, "mine");
    CHECK(gp_pool_ledger_name(&cfg, gp_backend_find("cuda"), NULL, 7, asked) == GP_OK &&
              strcmp(asked, "/gpupool.mine") == 0,
          "a named ledger asks no device: '%s'", asked);

    void *p = NULL;
    CHECK(gp_alloc(a, &p, 4 * MIB, NULL) == GP_OK && gp_free(a, p, NULL) == GP_OK, "a pool with its ledger serves");
    CHECK(gp_pool_destroy(c, NULL) == GP_OK && gp_pool_destroy(b, NULL) == GP_OK && gp_pool_destroy(a, NULL) == GP_OK,
          "destroy: %s", gp_last_error());
    CHECK(gp_ledger_unlink(want0) == GP_OK && gp_ledger_unlink(want1) == GP_OK, "unlink");
    CHECK(gpemu_violations() == 0, "the emulation saw a broken rule: %s", gpemu_first_violation());
    CHECK(gpemu_shutdown() == 0, "leaks at shutdown");
}

/* The ledger's GPU-wide figures of tenant `name` (held: every pool's charges together). */
static gp_ledger_view_tenant ledger_tenant_now(const char *shm, const char *name)
{
    static gp_ledger_view v; /* large: not on the stack */
    gp_ledger_view_tenant none = {.held = UINT64_MAX};
    gp_ledger *l = NULL;
    CHECK(gp_ledger_open_readonly(&l, shm) == GP_OK, "open %s: %s", shm, gp_last_error());
    if (l == NULL)
        return none;
    CHECK(gp_ledger_view_read(l, &v, false) == GP_OK, "view: %s", gp_last_error());
    gp_ledger_close(l);
    for (unsigned i = 0; i < v.num_tenants; i++)
        if (strcmp(v.tenants[i].name, name) == 0)
            return v.tenants[i];
    return none;
}

static void a_graph_pool_is_charged_in_the_ledger_to_its_model(void)
{
    CHECK(gpemu_init(1, 64 * MIB) == 0, "gpemu_init");
    char cfg[64], shm[GP_LEDGER_NAME_MAX];
    snprintf(cfg, sizeof cfg, "ledger:emu-graph-%d", (int)getpid()); /* the configuration string, not GPUPOOL_CONF */
    CHECK(gp_ledger_shm_name(cfg + strlen("ledger:"), 0, NULL, shm) == GP_OK, "name");
    gp_pool *pool = NULL;
    CHECK(gp_pool_create(&pool, 0, "cuda", cfg) == GP_OK, "pool: %s", gp_last_error());
    cudaStream_t s = NULL;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess, "stream");
    CHECK(gp_tenant_create(pool, "m", NULL) == GP_OK && gp_tenant_push(pool, "m") == GP_OK, "tenant m");
    void *own = NULL, *g = NULL;
    CHECK(gp_alloc(pool, &own, 4 * MIB, s) == GP_OK, "alloc: %s", gp_last_error());
    CHECK(gp_graph_pool_begin(pool, 5) == GP_OK, "begin: %s", gp_last_error());
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal) == cudaSuccess, "capture");
    CHECK(gp_alloc(pool, &g, 6 * MIB, s) == GP_OK, "alloc in capture: %s", gp_last_error());
    cudaGraph_t graph = NULL;
    CHECK(cudaStreamEndCapture(s, &graph) == cudaSuccess && graph != NULL, "a valid graph");
    CHECK(gp_graph_pool_end(pool, 5) == GP_OK, "end: %s", gp_last_error());
    gp_tenant_stats t = {.size = sizeof t, .version = GP_TENANT_STATS_VERSION};
    CHECK(gp_tenant_get_stats(pool, "m", &t) == GP_OK && t.graph_held_bytes > 0, "m's graph_held");
    gp_ledger_view_tenant in = ledger_tenant_now(shm, "m");
    CHECK(in.held == t.held_bytes + t.graph_held_bytes, "the ledger's m holds %llu, the pool's m %llu + %llu of graphs",
          (unsigned long long)in.held, (unsigned long long)t.held_bytes, (unsigned long long)t.graph_held_bytes);
    CHECK(ledger_tenant_now(shm, "default").held == 0 || ledger_tenant_now(shm, "default").held == UINT64_MAX,
          "nothing charged to 'default'");
    CHECK(cudaGraphDestroy(graph) == cudaSuccess, "graph gone");
    CHECK(gp_free(pool, g, s) == GP_OK && gp_graph_pool_release(pool, 5) == GP_OK, "release: %s", gp_last_error());
    CHECK(gp_free(pool, own, s) == GP_OK && gp_tenant_pop(pool) == GP_OK, "free");
    CHECK(gp_pool_destroy(pool, NULL) == GP_OK, "destroy: %s", gp_last_error());
    CHECK(cudaStreamDestroy(s) == cudaSuccess, "stream destroyed");
    CHECK(gp_ledger_unlink(shm) == GP_OK, "unlink");
    CHECK(gpemu_violations() == 0, "the emulation saw a broken rule: %s", gpemu_first_violation());
    CHECK(gpemu_shutdown() == 0, "leaks at shutdown");
}

int main(void)
{
    RUN(pools_on_two_devices_get_two_ledgers_named_by_uuid);
    RUN(a_graph_pool_is_charged_in_the_ledger_to_its_model);
    printf("%s: %d failure(s)\n", test_failures ? "FAILED" : "passed", test_failures);
    return test_failures != 0;
}
