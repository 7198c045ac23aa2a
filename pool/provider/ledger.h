/*
 * ledger.h — the per-GPU ledger: one POSIX shared-memory object that every gpupool pool on a GPU, in
 * any process, charges before it asks the device for memory and credits after it gave memory back, so
 * that budgets by tenant name hold across processes (GPU-wide max/high/min), a dead process's memory
 * is found and its charges reclaimed, and `gpupool top` / `gpupool exporter` can show who holds what
 * without touching the processes. Includes only pool/base headers (error, format).
 *
 * Layout (version GP_LEDGER_VERSION): a fixed header (magic, version, header size, total size, the
 * device capacity the budgets are held against), a robust process-shared mutex, a table of tenants by
 * name with their GPU-wide limits, and a table of pools (one per registered gp_pool: pid, process
 * start time from /proc/PID/stat, command, and per tenant its charged bytes). Attaching checks the
 * magic, the version and the size and refuses a ledger that differs (GP_ERR_CONFIG, saying which).
 *
 * Invariants (under the ledger lock):
 *     a tenant's GPU-wide held   == sum over registered pools of charges[tenant].held  <= its max
 *     the device's charged bytes == sum over registered pools of device_held            <= capacity
 *     for one pool: sum over tenants of held <= device_held (the rest is its page pool)
 * and, checked by gp_check in each process: its pool's device_held == its reserved bytes and every
 * tenant's held == that tenant's held bytes in the pool. No total is stored apart from the per-pool
 * figures, so a process that dies in the middle of an update leaves nothing inconsistent behind but
 * its own entry, which the next process that takes the lock (EOWNERDEAD) or looks (a refusal, an
 * attach, a maintenance pass) reclaims once its pid and start time say it is gone.
 *
 * Every figure is an atomic, so a read-only mapping (gpupool top, the exporter) may read it at any
 * time without the lock; such a view is not one instant. gp_ledger_view with `locked` is.
 */
#ifndef GP_LEDGER_H
#define GP_LEDGER_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define GP_LEDGER_VERSION 1u
#define GP_LEDGER_POOLS 64     /* pools registered at once, all processes together */
#define GP_LEDGER_TENANTS 64   /* tenant names known to the ledger */
#define GP_LEDGER_NAME_MAX 64  /* tenant names and shm names, with their NUL */
#define GP_LEDGER_COMMAND_MAX 32

typedef struct gp_ledger gp_ledger;

/* The shm name for a `ledger` configuration value: "on" -> the device's own ledger, named by its UUID
 * when `uuid` is given ("/gpupool.GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx", nvidia-smi's spelling: the
 * same GPU in every process whatever its index there), else by its index ("/gpupool.dev<device>": a
 * simulated GPU, which has no UUID); any other value (letters, digits, '.', '_', '-') ->
 * "/gpupool.<value>". GP_ERR_CONFIG for a bad name. */
int gp_ledger_shm_name(const char *value, int device, const unsigned char *uuid, char out[GP_LEDGER_NAME_MAX]);

/*
 * Opens the ledger `shm_name` read-write, creating it for a device of `capacity` bytes when it does
 * not exist (capacity 0: attach only). Refuses a ledger of another layout version or size, or (when
 * capacity != 0) one made for a device of another capacity. A ledger left half-made by a creator that
 * died is made again. Dead pools in it are reclaimed.
 */
int gp_ledger_open(gp_ledger **out, const char *shm_name, uint64_t capacity);
/* Opens an existing ledger read-only (top, exporter): no lock is ever taken, nothing is written. */
int gp_ledger_open_readonly(gp_ledger **out, const char *shm_name);
void gp_ledger_close(gp_ledger *l);
/* Removes the shared-memory object (pools attached keep their mapping). */
int gp_ledger_unlink(const char *shm_name);
const char *gp_ledger_name(const gp_ledger *l);
uint64_t gp_ledger_capacity(const gp_ledger *l);

/* Registers a pool of this process on `device`; *slot identifies it in later calls. */
int gp_ledger_register(gp_ledger *l, int device, unsigned *slot);
/* Takes the pool out, crediting everything it still holds. */
void gp_ledger_unregister(gp_ledger *l, unsigned slot);
/* The ledger's index of tenant `name`, adding the name when it is new. */
int gp_ledger_tenant(gp_ledger *l, const char *name, unsigned *index);

enum { GP_LEDGER_SET_MAX = 1, GP_LEDGER_SET_HIGH = 2, GP_LEDGER_SET_MIN = 4 };
/* Sets the GPU-wide limits of tenant `name` (0 = none) named in `which`; GP_ERR_INVALID when min or
 * high would be above max. */
int gp_ledger_set_budget(gp_ledger *l, const char *name, uint64_t max, uint64_t high, uint64_t min, unsigned which);

/* Why a charge was refused, for the caller's next step (trim, ask others, give up). */
typedef struct gp_ledger_shortfall {
    uint64_t need;             /* bytes that would have to be given back for the charge to fit */
    uint64_t cached_elsewhere; /* bytes other pools hold only as cache, as they last published */
    uint64_t over_high;        /* the charge went through but the tenant is this far above its high */
} gp_ledger_shortfall;

/*
 * Charges `device_bytes` of new device memory and `tenant_bytes` of it to `tenant` for pool `slot`,
 * before the device call. GP_ERR_QUOTA when the tenant's GPU-wide max would be passed (the message
 * names the tenant, its max, the pools that hold it and how much), GP_ERR_OOM when the device's
 * capacity or another tenant's unmet min would be (GP_ERR_OOM's message says which). Dead pools are
 * reclaimed before refusing. Nothing is charged on failure; *why (optional) says what is missing.
 */
int gp_ledger_charge(gp_ledger *l, unsigned slot, unsigned tenant, uint64_t device_bytes, uint64_t tenant_bytes,
                     gp_ledger_shortfall *why);
/* Credits what gp_ledger_charge charged, after the device took the memory back (or refused it). */
void gp_ledger_credit(gp_ledger *l, unsigned slot, unsigned tenant, uint64_t device_bytes, uint64_t tenant_bytes);

/* Asks every other pool that holds cache (of `tenant`, or any with tenant < 0) to give back `bytes`:
 * sets its pressure flag, which it answers on its next slow path or gp_maintain. */
void gp_ledger_ask(gp_ledger *l, unsigned slot, int tenant, uint64_t bytes);
/* A request for pool `slot` not yet answered: true with its tenant (-1 = any) and bytes, and marks it
 * answered. */
bool gp_ledger_take_pressure(gp_ledger *l, unsigned slot, int *tenant, uint64_t *bytes);

/* What a pool publishes about itself (its slow paths and maintenance), for views and for pressure. */
typedef struct gp_ledger_figures {
    uint64_t live[GP_LEDGER_TENANTS];     /* by ledger tenant index: bytes handed out */
    uint64_t refusals[GP_LEDGER_TENANTS]; /* allocations refused as over budget */
    uint64_t ooms, device_allocs, device_frees;
} gp_ledger_figures;
void gp_ledger_publish(gp_ledger *l, unsigned slot, const gp_ledger_figures *f);

/* What pool `slot` has charged: in all (device) and to `tenant` (for gp_check). */
uint64_t gp_ledger_slot_device(const gp_ledger *l, unsigned slot);
uint64_t gp_ledger_slot_held(const gp_ledger *l, unsigned slot, unsigned tenant);

/* Reclaims the charges of pools whose process is gone; returns the bytes reclaimed. */
uint64_t gp_ledger_reclaim_dead(gp_ledger *l);

/* ---- views ---- */
typedef struct gp_ledger_view_tenant {
    char name[GP_LEDGER_NAME_MAX];
    uint64_t max, high, min;
    uint64_t held, live, refusals; /* all pools together */
    uint64_t peak; /* the highest GPU-wide held */
} gp_ledger_view_tenant;

typedef struct gp_ledger_view_charge {
    uint64_t held, live, peak, refusals;
} gp_ledger_view_charge;

typedef struct gp_ledger_view_pool {
    unsigned slot;
    int pid, device;
    uint64_t start_time, serial;
    char command[GP_LEDGER_COMMAND_MAX];
    bool alive;
    uint64_t device_held, device_peak, device_allocs, device_frees, ooms;
    uint64_t published_ns;  /* CLOCK_REALTIME of its last publish */
    bool pressure_pending;
    gp_ledger_view_charge charges[GP_LEDGER_TENANTS];
} gp_ledger_view_pool;

typedef struct gp_ledger_view {
    char name[GP_LEDGER_NAME_MAX];
    uint32_t version;
    uint64_t capacity, device_held;
    uint64_t reclaimed_bytes, reclaimed_pools, lock_recoveries, charges, refusals, pressure_asks;
    unsigned num_tenants, num_pools;
    gp_ledger_view_tenant tenants[GP_LEDGER_TENANTS]; /* index = ledger tenant index */
    gp_ledger_view_pool pools[GP_LEDGER_POOLS];       /* registered pools, in slot order */
} gp_ledger_view;

/* Fills *out. `locked` (read-write handles only): under the ledger lock, one instant. Liveness of each
 * pool's process is checked (kill(pid, 0) and its start time). */
int gp_ledger_view_read(gp_ledger *l, gp_ledger_view *out, bool locked);

/* ---- for tests ---- */
/* The size in bytes of a ledger of this layout version. */
size_t gp_ledger_layout_size(void);
/* Takes the ledger lock and never gives it back (a test then kills the process to check recovery). */
void gp_ledger_test_hold_lock(gp_ledger *l);
/* This process's start time as /proc/self/stat gives it (clock ticks since boot), 0 if unknown. */
uint64_t gp_ledger_process_start(int pid);

#endif /* GP_LEDGER_H */
