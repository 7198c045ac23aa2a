/*
 * fuzz_config.c — libFuzzer target: the configuration parser (pool/config.c) on any string, and a pool
 * of the simulated GPU created with every string the parser accepts.
 *
 * The input is the text of a "key:value,..." string (cut at its first NUL). Rules checked (abort()
 * when one breaks, so libFuzzer keeps the input):
 *   - gp_config_apply either succeeds or fails with GP_ERR_CONFIG and a message, leaving the
 *     configuration byte for byte as it was (parsing is all-or-nothing);
 *   - applying the same string twice gives the same configuration (no hidden state), and no fraction
 *     or duration is NaN;
 *   - gp_parse_size of the whole text agrees with itself and never gives a size from a text that
 *     has no digit;
 *   - a string that parses and validates, with a simulated device of at most 256 MiB, creates a pool
 *     (backend "sim" or "sim-vmm"; a failure must be GP_ERR_CONFIG or GP_ERR_BACKEND with a message)
 *     that allocates, frees, maintains, passes gp_check and is destroyed with nothing left in the
 *     sim's ledger; gp_pool_create with the string must agree with gp_config_apply + validate.
 *
 * Not done on purpose: no pool with the `log` key (it would create files named by the input), nor
 * with `ledger:on` (it would attach to this machine's device ledger, shared with every gpupool process
 * on it; a named ledger goes through the same attach path). A named ledger is unlinked before and
 * after its pool, so no input sees one an earlier input left (a ledger remembers the device it was
 * made for, and refuses a pool of another size: state across inputs, found by CI's fuzz run).
 */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/config.h"
#include "base/error.h"
#include "provider/ledger.h"
#include "gpupool.h"
#include "gpupool_sim.h"

#define MIB ((size_t)1 << 20)

static void fail(const char *what, const char *detail)
{
    fprintf(stderr, "fuzz_config: %s%s%s\n", what, detail != NULL ? ": " : "", detail != NULL ? detail : "");
    abort();
}

#define CHECK(cond, detail)                                                                                    \
    do {                                                                                                       \
        if (!(cond))                                                                                           \
            fail("check failed: " #cond, (detail));                                                           \
    } while (0)

/* Field by field (a struct's padding bytes are not part of its value). */
static bool same_config(const gp_config *a, const gp_config *b)
{
    return strcmp(a->backend, b->backend) == 0 && a->device_memory == b->device_memory &&
           a->small_size == b->small_size && a->small_segment == b->small_segment &&
           a->large_segment == b->large_segment && a->huge_size == b->huge_size &&
           a->max_streams == b->max_streams && a->pending_scan == b->pending_scan &&
           a->steal_wait == b->steal_wait && a->cache_slack == b->cache_slack &&
           a->defrag == b->defrag && a->vmm_reserve == b->vmm_reserve && a->thread_cache == b->thread_cache &&
           a->borrow == b->borrow && a->alias == b->alias && a->loans == b->loans &&
           a->peak_composition == b->peak_composition && strcmp(a->empty_cache, b->empty_cache) == 0 &&
           a->release_threshold == b->release_threshold &&
           a->idle_release == b->idle_release && strcmp(a->log_path, b->log_path) == 0;
}

/* A pool made from the string: create, allocate, free, maintain, trim, check, destroy, no leak. */
static void pool_round_trip(const char *text, const gp_config *cfg, bool vmm)
{
    gp_pool *pool = NULL;
    int rc = gp_pool_create(&pool, 0, vmm ? "sim-vmm" : "sim", text);
    if (rc != GP_OK) {
        /* The string parsed and validated: only the backend may refuse it (a device it cannot make). */
        CHECK(rc == GP_ERR_BACKEND || rc == GP_ERR_OOM || rc == GP_ERR_DEVICE, gp_last_error());
        CHECK(gp_last_error()[0] != '\0', "gp_pool_create failed without a message");
        CHECK(pool == NULL, "a failed gp_pool_create left *out set");
        return;
    }
    gp_sim *sim = gp_sim_of(pool);
    CHECK(sim != NULL, "no sim behind a sim pool");
    gp_sim_retain(sim);
    gp_stream s = gp_sim_stream_create(sim);
    void *p[4] = {NULL, NULL, NULL, NULL};
    const size_t sizes[4] = {512, 100000, 3 * MIB, cfg->device_memory / 2};
    for (int i = 0; i < 4; i++) {
        rc = gp_alloc(pool, &p[i], sizes[i], i & 1 ? s : NULL);
        CHECK(rc == GP_OK || rc == GP_ERR_OOM || rc == GP_ERR_INVALID, gp_last_error());
        CHECK(gp_check(pool) == GP_OK, gp_last_error());
    }
    for (int i = 0; i < 4; i++)
        CHECK(gp_free(pool, p[i], i & 1 ? s : NULL) == GP_OK, gp_last_error());
    gp_sim_advance(sim, 1000000000ull);
    size_t released = 0;
    CHECK(gp_maintain(pool, &released) == GP_OK, gp_last_error());
    CHECK(gp_trim(pool, 0, NULL) == GP_OK, gp_last_error());
    CHECK(gp_check(pool) == GP_OK, gp_last_error());
    char json[8192];
    CHECK(gp_stats_json(pool, json, sizeof json, NULL) == GP_OK, gp_last_error());
    gp_leak_report leaks;
    CHECK(gp_pool_destroy(pool, &leaks) == GP_OK, gp_last_error());
    CHECK(leaks.live_blocks == 0, "destroy found live blocks after every free");
    gp_sim_report r;
    gp_sim_get_report(sim, &r);
    CHECK(r.leaked_bytes_at_close == 0 && r.leaked_events_at_close == 0 && r.leaked_handles_at_close == 0 &&
              r.leaked_mappings_at_close == 0 && r.leaked_reservations_at_close == 0 && r.bad_calls == 0 &&
              r.races == 0,
          gp_sim_first_violation(sim));
    gp_sim_release(sim);
}

/* pool_round_trip on a ledger no earlier input left behind (see the header). A named ledger is renamed
 * this process's own (",ledger:fuzz-PID" appended, where the string still parses so): two campaigns at
 * once on one machine (two clones' test runs) would otherwise unlink and attach each other's ledgers.
 * The input's own name was validated above, and every name takes the same attach path. */
static void try_pool(const char *text, const gp_config *cfg, bool vmm)
{
    char shm[GP_LEDGER_NAME_MAX] = "", own[4096 + 64];
    const char *use = text, *name = cfg->ledger;
    gp_config renamed;
    if (strcmp(cfg->ledger, "off") != 0) {
        snprintf(own, sizeof own, "%s,ledger:fuzz-%ld", text, (long)getpid());
        gp_config_defaults(&renamed);
        if (gp_config_apply(&renamed, own, "fuzz") == GP_OK && gp_config_validate(&renamed) == GP_OK &&
            strncmp(renamed.ledger, "fuzz-", 5) == 0) {
            use = own;
            name = renamed.ledger;
        }
        CHECK(gp_ledger_shm_name(name, 0, NULL, shm) == GP_OK, "a validated ledger name has no shm name");
        gp_ledger_unlink(shm);
    }
    pool_round_trip(use, cfg, vmm);
    if (shm[0] != '\0')
        gp_ledger_unlink(shm);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > 4096)
        return 0;
    char text[4097];
    memcpy(text, data, size);
    text[size] = '\0';
    unsetenv("GPUPOOL_CONF");

    gp_config cfg, before, again;
    gp_config_defaults(&cfg);
    before = cfg;
    int rc = gp_config_apply(&cfg, text, "fuzz");
    if (rc != GP_OK) {
        CHECK(rc == GP_ERR_CONFIG, "gp_config_apply failed with a code other than GP_ERR_CONFIG");
        CHECK(gp_last_error()[0] != '\0', "gp_config_apply failed without a message");
        CHECK(same_config(&cfg, &before), "a failed gp_config_apply changed the configuration");
    } else {
        gp_config_defaults(&again);
        CHECK(gp_config_apply(&again, text, "fuzz") == GP_OK, "the same string failed the second time");
        CHECK(!isnan(cfg.cache_slack) && !isnan(cfg.idle_release), "the parser accepted a NaN");
        CHECK(same_config(&cfg, &again), "the same string gave two configurations");
    }

    size_t a = 0, b = 0;
    bool ok_a = gp_parse_size(text, &a), ok_b = gp_parse_size(text, &b);
    CHECK(ok_a == ok_b && (!ok_a || a == b), "gp_parse_size is not deterministic");
    if (ok_a)
        CHECK(strpbrk(text, "0123456789") != NULL, "gp_parse_size accepted a text without a digit");

    if (rc != GP_OK || gp_config_validate(&cfg) != GP_OK)
        return 0;
    /* Any idle_release the parser accepts, 1e308 s included: maintain.c saturates its conversion to
     * nanoseconds (issue 9, finding 7). */
    if (cfg.log_path[0] != '\0' || cfg.device_memory > 256 * MIB || strcmp(cfg.ledger, "on") == 0)
        return 0;
    try_pool(text, &cfg, (size & 1) != 0);
    return 0;
}
