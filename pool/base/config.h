/*
 * config.h — the pool's configuration: defaults, parsing of "key:value,key:value" strings (from the
 * GPUPOOL_CONF environment variable, then the string given to gp_pool_create), and the key table.
 */
#ifndef GP_CONFIG_H
#define GP_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define GP_CONFIG_NAME_MAX 32
#define GP_CONFIG_BUDGETS 16 /* budget.NAME.* entries one configuration can set */

/* budget.NAME.max / .high / .min: GPU-wide limits of tenant NAME, written to the ledger on attach. */
typedef struct gp_config_budget {
    char name[64];
    size_t max, high, min;
    unsigned set; /* 1 = max, 2 = high, 4 = min (as GP_LEDGER_SET_*) */
} gp_config_budget;

typedef struct gp_config {
    char backend[GP_CONFIG_NAME_MAX]; /* "cuda" or "sim" */
    size_t device_memory;   /* sim: capacity of the simulated device */
    size_t small_size;      /* requests up to this size are packed into small segments */
    size_t small_segment;   /* size of a small segment */
    size_t large_segment;   /* segment size for large requests below huge_size */
    size_t huge_size;       /* requests of this size or more get a segment of their own */
    unsigned max_streams;   /* streams one pool can track */
    unsigned pending_scan;  /* pending frees whose events are queried per allocation */
    bool steal_wait;        /* take busy free segments of other streams by waiting: at device OOM, and past the
                             * cache cap within a tenant (provider/segment.c: steal_segment) */
    bool borrow;            /* vmm: a missing stream borrows idle free blocks of other streams (provider/vmm.c) */
    bool reuse_wait;        /* on: a stream takes its tenant's other streams' free memory before their work is
                             * done by waiting on their fence (gp_stream_reusable) */
    bool tenant_best_fit;   /* vmm, borrow: a loose fit borrows a tighter idle block (provider.h: tenant_best_fit) */
    bool thread_cache;      /* small blocks freed on their own stream go to the freeing thread's cache */
    double cache_slack;     /* growth past (1 + this) x peak allocated first gives back free segments; < 0 = off */
    bool defrag;            /* vmm: stitch cached free pages into new ranges before creating memory */
    bool alias;             /* vmm, defrag: stitch by aliasing free pages (provider/alias.h), not only by moving them */
    bool loans;             /* vmm, alias: stitch other idle streams' free pages too (provider/alias.h: loans) */
    size_t vmm_reserve;     /* vmm: virtual bytes reserved per growing range; 0 = the device's memory */
    size_t release_threshold; /* cached bytes kept when maintenance runs; SIZE_MAX = keep all */
    double idle_release;    /* seconds after which idle cached memory is given back; < 0 = never */
    char log_path[1024];    /* "" or a file to which every allocate/free is logged as RMM CSV */
    char ledger[64];        /* "off", "on" (the device's ledger) or a ledger name (provider/ledger.h) */
    double ledger_wait;     /* seconds a refused charge waits for other processes to trim their cache */
    gp_config_budget budgets[GP_CONFIG_BUDGETS];
    unsigned num_budgets;
    char empty_cache[GP_CONFIG_NAME_MAX]; /* torch.cuda.empty_cache(): "working-set", "trim" or "off" */
    bool peak_composition;  /* record what reserved memory is made of at each raise of its peak (api/peak.c) */
} gp_config;

/* Fills cfg with the built-in defaults. */
void gp_config_defaults(gp_config *cfg);

/*
 * Applies "key:value,key:value" to cfg. On error returns GP_ERR_CONFIG, sets the thread's message
 * (naming the key, the value and why) and leaves cfg unchanged. `origin` names the source in messages
 * ("GPUPOOL_CONF" or "config"). NULL or "" is a no-op.
 */
int gp_config_apply(gp_config *cfg, const char *text, const char *origin);

/* Checks relations between keys (e.g. small_size <= small_segment); GP_ERR_CONFIG on failure. */
int gp_config_validate(const gp_config *cfg);

/* The longest ledger name (`ledger:NAME`): the shm name "/gpupool.NAME" must fit the ledger's 64 bytes. */
#define GP_CONFIG_LEDGER_NAME_LEN 54

/* GP_OK when `name` can name a ledger: 1 to GP_CONFIG_LEDGER_NAME_LEN letters, digits, '.', '_' or '-'
 * (a POSIX shm name, without '/'); else GP_ERR_CONFIG with a message that names the first bad byte by
 * position and value, never echoing it. Checked by gp_config_validate and again by the ledger. */
int gp_config_check_ledger_name(const char *name);

/* Parses a size such as "512", "4KiB", "1.5GiB", "2M"; returns false on a bad value. */
bool gp_parse_size(const char *text, size_t *out);

/* One line per key: name, default, meaning. */
const char *gp_config_help_text(void);

#endif /* GP_CONFIG_H */
