/*
 * ledger.c — the per-GPU ledger in POSIX shared memory (see ledger.h): its layout, creation and the
 * checks on attach, registration of pools, charges and credits under a robust process-shared mutex,
 * detection of dead processes and reclaim of their charges, pressure flags, and read-only views.
 *
 * Creation is serialised by flock() on the shm object: the creator holds the file lock while it
 * sizes and initialises the ledger and writes the magic last; an attacher takes the same lock before
 * it looks, so it sees either nothing, or a whole ledger, or (the creator died half-way: flock is
 * released by the kernel when a process dies) a ledger without its magic, which it makes again.
 *
 * A process is the same process when its pid exists and its start time (field 22 of /proc/PID/stat,
 * clock ticks since boot) is the one it registered with; a reused pid has another start time.
 */
#define _GNU_SOURCE /* flock, pthread_mutex_consistent */
#include "provider/ledger.h"

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/config.h"
#include "base/error.h"
#include "base/format.h"

#define LEDGER_MAGIC 0x72656764656c7067ull /* "gpledger" */

enum { SLOT_FREE = 0, SLOT_ACTIVE = 1 };

typedef struct ledger_budget {
    atomic_uint used; /* 1 once name is written (the name never changes afterwards) */
    char name[GP_LEDGER_NAME_MAX];
    _Atomic uint64_t max, high, min;
    _Atomic uint64_t peak; /* highest GPU-wide held */
} ledger_budget;

typedef struct ledger_charge {
    _Atomic uint64_t held; /* charged before the device call, credited after memory went back */
    _Atomic uint64_t live; /* published */
    _Atomic uint64_t peak; /* highest held */
    _Atomic uint64_t refusals;
} ledger_charge;

typedef struct ledger_slot {
    atomic_uint state;          /* SLOT_FREE or SLOT_ACTIVE (written last when registering) */
    atomic_int pid, device;
    _Atomic uint64_t start_time, serial;
    char command[GP_LEDGER_COMMAND_MAX];
    _Atomic uint64_t device_held, device_peak;
    _Atomic uint64_t device_allocs, device_frees, ooms, published_ns;
    _Atomic uint64_t pressure_seq, pressure_answered, pressure_bytes;
    atomic_int pressure_tenant;
    ledger_charge charges[GP_LEDGER_TENANTS];
} ledger_slot;

typedef struct ledger_shm {
    /* The fixed header: never moves between versions. */
    _Atomic uint64_t magic;
    uint32_t version, header_size;
    uint64_t total_size;
    uint64_t capacity;
    /* Version 1. */
    pthread_mutex_t lock;
    _Atomic uint64_t next_serial, reclaimed_bytes, reclaimed_pools, lock_recoveries, charges, refusals,
        pressure_asks;
    ledger_budget tenants[GP_LEDGER_TENANTS];
    ledger_slot slots[GP_LEDGER_POOLS];
} ledger_shm;

#define HEADER_SIZE ((uint32_t)offsetof(ledger_shm, lock))

struct gp_ledger {
    ledger_shm *shm;
    bool writable;
    char name[GP_LEDGER_NAME_MAX];
};

#define R(x) atomic_load_explicit(&(x), memory_order_relaxed)
#define W(x, v) atomic_store_explicit(&(x), (v), memory_order_relaxed)

/* ---- processes ---------------------------------------------------------------------------------- */

/* /proc/PID/stat read into buf, and the part after the LAST ')' (comm may hold spaces and ')'), which
 * begins with the space before field 3 (state); NULL when it cannot be read. */
static char *read_stat_after_comm(int pid, char *buf, size_t size)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return NULL;
    ssize_t n = read(fd, buf, size - 1);
    close(fd);
    if (n <= 0)
        return NULL;
    buf[n] = '\0';
    char *p = strrchr(buf, ')');
    return p != NULL ? p + 1 : NULL;
}

uint64_t gp_ledger_process_start(int pid)
{
    char buf[1024];
    char *p = read_stat_after_comm(pid, buf, sizeof buf);
    /* p is at the space before field 3 (state); each step moves it to the space before the next field,
     * so 19 steps reach the space before field 22 (starttime). (It took 20, and read field 23, the
     * virtual size: that changes as the process maps memory, and is 0 for a zombie, which read as
     * "not readable, assume alive".) */
    for (int field = 3; field < 22 && p != NULL; field++)
        p = strchr(p + 1, ' ');
    return p != NULL ? strtoull(p + 1, NULL, 10) : 0;
}

static uint64_t self_start(void)
{
    static _Atomic uint64_t cached;
    static atomic_int cached_pid;
    int pid = (int)getpid();
    if (atomic_load(&cached_pid) != pid) { /* a forked child is another process */
        atomic_store(&cached, gp_ledger_process_start(pid));
        atomic_store(&cached_pid, pid);
    }
    return atomic_load(&cached);
}

/* The state letter of /proc/PID/stat (R, S, D, Z, X, ...), or 0 when it cannot be read. */
static char process_state(int pid)
{
    char buf[1024];
    const char *p = read_stat_after_comm(pid, buf, sizeof buf);
    return p != NULL && p[0] == ' ' ? p[1] : 0;
}

/* The `Threads:` count of /proc/PID/status, or 0 when it cannot be read. */
static long process_threads(int pid)
{
    char path[64], buf[4096];
    snprintf(path, sizeof path, "/proc/%d/status", pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
        return 0;
    buf[n] = '\0';
    const char *t = strstr(buf, "\nThreads:");
    return t != NULL ? strtol(t + 9, NULL, 10) : 0;
}

/* Is the process that registered (pid, start) still there?
 * A process that was killed but not yet collected by its parent (a zombie, state Z, or X while it is
 * being torn down) still answers kill(pid, 0) and keeps its start time, yet it will never run again:
 * it is dead, and its charges must not wait for its parent to call wait(). One exception: when only
 * the thread-group leader has exited (pthread_exit in main), /proc shows the leader as a zombie while
 * the process's other threads still run and hold the pool; `Threads:` > 1 in /proc/PID/status says so. */
static bool process_alive(int pid, uint64_t start)
{
    if (pid <= 0)
        return false;
    if (kill(pid, 0) != 0 && errno == ESRCH)
        return false;
    uint64_t now = gp_ledger_process_start(pid);
    if (now == 0)
        return true; /* not readable here (another pid namespace): assume alive */
    if (now != start)
        return false; /* the pid was reused */
    char state = process_state(pid);
    if (state == 'Z' || state == 'X')
        return process_threads(pid) > 1;
    return true;
}

static uint64_t realtime_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* ---- names ---------------------------------------------------------------------------------------- */

int gp_ledger_shm_name(const char *value, int device, const unsigned char *uuid, char out[GP_LEDGER_NAME_MAX])
{
    if (value == NULL || value[0] == '\0')
        return gp_error_set(GP_ERR_CONFIG, "ledger: empty name (use on, off or a name)");
    if (strcmp(value, "on") == 0) {
        const unsigned char *u = uuid;
        if (u != NULL)
            snprintf(out, GP_LEDGER_NAME_MAX,
                     "/gpupool.GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", u[0], u[1],
                     u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13], u[14], u[15]);
        else
            snprintf(out, GP_LEDGER_NAME_MAX, "/gpupool.dev%d", device);
        return GP_OK;
    }
    _Static_assert(GP_CONFIG_LEDGER_NAME_LEN + sizeof "/gpupool." <= GP_LEDGER_NAME_MAX, "ledger names fit");
    int rc = gp_config_check_ledger_name(value);
    if (rc != GP_OK)
        return rc;
    snprintf(out, GP_LEDGER_NAME_MAX, "/gpupool.%s", value);
    return GP_OK;
}

/* ---- the lock ------------------------------------------------------------------------------------- */

static void reclaim_dead_locked(gp_ledger *l);

static void ledger_lock(gp_ledger *l)
{
    assert(l->writable);
    int rc = pthread_mutex_lock(&l->shm->lock);
    if (rc == EOWNERDEAD) {
        /* Its holder died; what it was changing is in its own slot, which reclaim clears. */
        atomic_fetch_add(&l->shm->lock_recoveries, 1);
        reclaim_dead_locked(l);
        pthread_mutex_consistent(&l->shm->lock);
    } else {
        assert(rc == 0);
    }
}

static void ledger_unlock(gp_ledger *l)
{
    pthread_mutex_unlock(&l->shm->lock);
}

size_t gp_ledger_layout_size(void)
{
    return sizeof(ledger_shm);
}

void gp_ledger_test_hold_lock(gp_ledger *l)
{
    ledger_lock(l);
}

/* ---- create, attach ------------------------------------------------------------------------------- */

static int init_shm(ledger_shm *s, uint64_t capacity)
{
    memset((void *)s, 0, sizeof *s);
    s->version = GP_LEDGER_VERSION;
    s->header_size = HEADER_SIZE;
    s->total_size = sizeof *s;
    s->capacity = capacity;
    pthread_mutexattr_t attr;
    pthread_mutexattr_init(&attr);
    pthread_mutexattr_setpshared(&attr, PTHREAD_PROCESS_SHARED);
    pthread_mutexattr_setrobust(&attr, PTHREAD_MUTEX_ROBUST);
    int rc = pthread_mutex_init(&s->lock, &attr);
    pthread_mutexattr_destroy(&attr);
    if (rc != 0)
        return gp_error_set(GP_ERR_INVALID, "ledger: cannot make its process-shared mutex (%s)", strerror(rc));
    atomic_store_explicit(&s->magic, LEDGER_MAGIC, memory_order_release);
    return GP_OK;
}

/* Checks the header of a mapped ledger of `size` bytes. */
static int check_header(const char *name, const ledger_shm *s, size_t size, uint64_t capacity)
{
    if (size < HEADER_SIZE || atomic_load_explicit(&s->magic, memory_order_acquire) != LEDGER_MAGIC)
        return gp_error_set(GP_ERR_CONFIG, "ledger %s: not a gpupool ledger (no magic; %zu bytes)", name, size);
    if (s->version != GP_LEDGER_VERSION)
        return gp_error_set(GP_ERR_CONFIG,
                            "ledger %s: layout version %u, this gpupool uses version %u: stop the processes that "
                            "use it and remove it (gpupool ledger --remove), or name another ledger",
                            name, s->version, GP_LEDGER_VERSION);
    if (s->header_size != HEADER_SIZE || s->total_size != sizeof *s || size != sizeof *s)
        return gp_error_set(GP_ERR_CONFIG,
                            "ledger %s: size %zu bytes (header %u, says %llu), this gpupool's version %u ledger is "
                            "%zu bytes (header %u): built differently; remove it or name another ledger",
                            name, size, s->header_size, (unsigned long long)s->total_size, GP_LEDGER_VERSION,
                            sizeof *s, HEADER_SIZE);
    if (capacity != 0 && s->capacity != capacity) {
        char a[GP_SIZE_TEXT_MAX], b[GP_SIZE_TEXT_MAX];
        return gp_error_set(GP_ERR_CONFIG,
                            "ledger %s: made for a device of %s, this pool's device has %s: one ledger per GPU",
                            name, gp_format_size((size_t)s->capacity, a), gp_format_size((size_t)capacity, b));
    }
    return GP_OK;
}

int gp_ledger_open(gp_ledger **out, const char *shm_name, uint64_t capacity)
{
    *out = NULL;
    gp_ledger *l = calloc(1, sizeof *l);
    if (l == NULL)
        return gp_error_set(GP_ERR_INVALID, "ledger: out of host memory");
    snprintf(l->name, sizeof l->name, "%s", shm_name);
    int fd = shm_open(shm_name, O_RDWR | (capacity != 0 ? O_CREAT : 0) | O_CLOEXEC, 0600);
    if (fd < 0) {
        int e = errno;
        free(l);
        return gp_error_set(GP_ERR_CONFIG, "ledger %s: %s", shm_name,
                            e == ENOENT ? "does not exist (no pool has made it yet)" : strerror(e));
    }
    flock(fd, LOCK_EX); /* released when this process dies */
    struct stat st;
    int rc = GP_OK;
    if (fstat(fd, &st) != 0) {
        rc = gp_error_set(GP_ERR_CONFIG, "ledger %s: fstat failed: %s", shm_name, strerror(errno));
    } else if (st.st_size == 0) { /* new (or its creator died before sizing it) */
        if (capacity == 0)
            rc = gp_error_set(GP_ERR_CONFIG, "ledger %s does not exist (no pool has made it yet)", shm_name);
        else if (ftruncate(fd, (off_t)sizeof(ledger_shm)) != 0)
            rc = gp_error_set(GP_ERR_CONFIG, "ledger %s: cannot size it: %s", shm_name, strerror(errno));
        else
            st.st_size = (off_t)sizeof(ledger_shm);
    }
    void *map = MAP_FAILED;
    if (rc == GP_OK) {
        map = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (map == MAP_FAILED)
            rc = gp_error_set(GP_ERR_CONFIG, "ledger %s: mmap failed: %s", shm_name, strerror(errno));
    }
    if (rc == GP_OK) {
        ledger_shm *s = map;
        if ((size_t)st.st_size == sizeof *s && atomic_load_explicit(&s->magic, memory_order_acquire) == 0 &&
            capacity != 0) {
            /* Sized but never finished: its creator died under the file lock. Make it again. */
            rc = init_shm(s, capacity);
        }
        if (rc == GP_OK)
            rc = check_header(shm_name, s, (size_t)st.st_size, capacity);
    }
    flock(fd, LOCK_UN);
    close(fd);
    if (rc != GP_OK) {
        if (map != MAP_FAILED)
            munmap(map, (size_t)st.st_size);
        free(l);
        return rc;
    }
    l->shm = map;
    l->writable = true;
    gp_ledger_reclaim_dead(l); /* a stale ledger from a crashed run comes back clean */
    *out = l;
    return GP_OK;
}

int gp_ledger_open_readonly(gp_ledger **out, const char *shm_name)
{
    *out = NULL;
    int fd = shm_open(shm_name, O_RDONLY | O_CLOEXEC, 0);
    if (fd < 0)
        return gp_error_set(GP_ERR_CONFIG, "ledger %s: %s", shm_name,
                            errno == ENOENT ? "does not exist (no pool has made it yet)" : strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || st.st_size == 0) {
        close(fd);
        return gp_error_set(GP_ERR_CONFIG, "ledger %s is empty (being made, or its maker died)", shm_name);
    }
    void *map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (map == MAP_FAILED)
        return gp_error_set(GP_ERR_CONFIG, "ledger %s: mmap failed: %s", shm_name, strerror(errno));
    int rc = check_header(shm_name, map, (size_t)st.st_size, 0);
    gp_ledger *l = rc == GP_OK ? calloc(1, sizeof *l) : NULL;
    if (l == NULL) {
        munmap(map, (size_t)st.st_size);
        return rc != GP_OK ? rc : gp_error_set(GP_ERR_INVALID, "ledger: out of host memory");
    }
    l->shm = map;
    snprintf(l->name, sizeof l->name, "%s", shm_name);
    *out = l;
    return GP_OK;
}

void gp_ledger_close(gp_ledger *l)
{
    if (l == NULL)
        return;
    munmap(l->shm, sizeof *l->shm);
    free(l);
}

int gp_ledger_unlink(const char *shm_name)
{
    if (shm_unlink(shm_name) != 0 && errno != ENOENT)
        return gp_error_set(GP_ERR_CONFIG, "ledger %s: cannot remove it: %s", shm_name, strerror(errno));
    return GP_OK;
}

const char *gp_ledger_name(const gp_ledger *l)
{
    return l->name;
}

uint64_t gp_ledger_capacity(const gp_ledger *l)
{
    return l->shm->capacity;
}

/* ---- pools and tenants ---------------------------------------------------------------------------- */

static void clear_slot(ledger_slot *s)
{
    W(s->device_held, 0);
    W(s->device_peak, 0);
    W(s->device_allocs, 0);
    W(s->device_frees, 0);
    W(s->ooms, 0);
    W(s->published_ns, 0);
    W(s->pressure_seq, 0);
    W(s->pressure_answered, 0);
    W(s->pressure_bytes, 0);
    W(s->pressure_tenant, -1);
    for (unsigned t = 0; t < GP_LEDGER_TENANTS; t++) {
        W(s->charges[t].held, 0);
        W(s->charges[t].live, 0);
        W(s->charges[t].peak, 0);
        W(s->charges[t].refusals, 0);
    }
}

static void command_of(char out[GP_LEDGER_COMMAND_MAX])
{
    out[0] = '\0';
    int fd = open("/proc/self/comm", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return;
    ssize_t n = read(fd, out, GP_LEDGER_COMMAND_MAX - 1);
    close(fd);
    n = n < 0 ? 0 : n;
    out[n] = '\0';
    char *nl = strchr(out, '\n');
    if (nl != NULL)
        *nl = '\0';
}

int gp_ledger_register(gp_ledger *l, int device, unsigned *slot)
{
    ledger_lock(l);
    int found = -1;
    for (unsigned i = 0; i < GP_LEDGER_POOLS && found < 0; i++)
        if (R(l->shm->slots[i].state) == SLOT_FREE)
            found = (int)i;
    if (found < 0) {
        reclaim_dead_locked(l);
        for (unsigned i = 0; i < GP_LEDGER_POOLS && found < 0; i++)
            if (R(l->shm->slots[i].state) == SLOT_FREE)
                found = (int)i;
    }
    if (found < 0) {
        ledger_unlock(l);
        return gp_error_set(GP_ERR_CONFIG, "ledger %s: all %d pool entries are taken by live processes", l->name,
                            GP_LEDGER_POOLS);
    }
    ledger_slot *s = &l->shm->slots[found];
    clear_slot(s);
    W(s->pid, (int)getpid());
    W(s->device, device);
    W(s->start_time, self_start());
    W(s->serial, atomic_fetch_add(&l->shm->next_serial, 1) + 1);
    command_of(s->command);
    W(s->published_ns, realtime_ns());
    atomic_store_explicit(&s->state, SLOT_ACTIVE, memory_order_release);
    ledger_unlock(l);
    *slot = (unsigned)found;
    return GP_OK;
}

void gp_ledger_unregister(gp_ledger *l, unsigned slot)
{
    ledger_lock(l);
    clear_slot(&l->shm->slots[slot]);
    atomic_store_explicit(&l->shm->slots[slot].state, SLOT_FREE, memory_order_release);
    ledger_unlock(l);
}

int gp_ledger_tenant(gp_ledger *l, const char *name, unsigned *index)
{
    if (name == NULL || name[0] == '\0' || strlen(name) >= GP_LEDGER_NAME_MAX)
        return gp_error_set(GP_ERR_INVALID, "ledger: a tenant name is 1 to %d bytes long", GP_LEDGER_NAME_MAX - 1);
    ledger_lock(l);
    int free_at = -1;
    for (unsigned i = 0; i < GP_LEDGER_TENANTS; i++) {
        ledger_budget *b = &l->shm->tenants[i];
        if (R(b->used) && strcmp(b->name, name) == 0) {
            ledger_unlock(l);
            *index = i;
            return GP_OK;
        }
        if (!R(b->used) && free_at < 0)
            free_at = (int)i;
    }
    if (free_at < 0) {
        ledger_unlock(l);
        return gp_error_set(GP_ERR_CONFIG, "ledger %s: all %d tenant names are taken", l->name, GP_LEDGER_TENANTS);
    }
    ledger_budget *b = &l->shm->tenants[free_at];
    snprintf(b->name, sizeof b->name, "%s", name);
    W(b->max, 0);
    W(b->high, 0);
    W(b->min, 0);
    W(b->peak, 0);
    atomic_store_explicit(&b->used, 1, memory_order_release);
    ledger_unlock(l);
    *index = (unsigned)free_at;
    return GP_OK;
}

int gp_ledger_set_budget(gp_ledger *l, const char *name, uint64_t max, uint64_t high, uint64_t min, unsigned which)
{
    unsigned t;
    int rc = gp_ledger_tenant(l, name, &t);
    if (rc != GP_OK)
        return rc;
    ledger_lock(l);
    ledger_budget *b = &l->shm->tenants[t];
    uint64_t nmax = which & GP_LEDGER_SET_MAX ? max : R(b->max);
    uint64_t nhigh = which & GP_LEDGER_SET_HIGH ? high : R(b->high);
    uint64_t nmin = which & GP_LEDGER_SET_MIN ? min : R(b->min);
    if (nmax != 0 && (nmin > nmax || nhigh > nmax)) {
        ledger_unlock(l);
        return gp_error_set(GP_ERR_INVALID, "ledger %s: tenant '%s': min %llu and high %llu must not be above max %llu",
                            l->name, name, (unsigned long long)nmin, (unsigned long long)nhigh,
                            (unsigned long long)nmax);
    }
    if (nmin > l->shm->capacity) {
        ledger_unlock(l);
        return gp_error_set(GP_ERR_INVALID, "ledger %s: tenant '%s': min %llu is above the device's %llu bytes",
                            l->name, name, (unsigned long long)nmin, (unsigned long long)l->shm->capacity);
    }
    W(b->max, nmax);
    W(b->high, nhigh);
    W(b->min, nmin);
    ledger_unlock(l);
    return GP_OK;
}

/* ---- dead processes -------------------------------------------------------------------------------- */

static void reclaim_dead_locked(gp_ledger *l)
{
    int self = (int)getpid();
    for (unsigned i = 0; i < GP_LEDGER_POOLS; i++) {
        ledger_slot *s = &l->shm->slots[i];
        if (R(s->state) != SLOT_ACTIVE)
            continue;
        int pid = R(s->pid);
        if (pid == self && R(s->start_time) == self_start())
            continue;
        if (process_alive(pid, R(s->start_time)))
            continue;
        atomic_fetch_add(&l->shm->reclaimed_bytes, R(s->device_held));
        atomic_fetch_add(&l->shm->reclaimed_pools, 1);
        clear_slot(s);
        atomic_store_explicit(&s->state, SLOT_FREE, memory_order_release);
    }
}

uint64_t gp_ledger_reclaim_dead(gp_ledger *l)
{
    ledger_lock(l);
    uint64_t before = R(l->shm->reclaimed_bytes);
    reclaim_dead_locked(l);
    uint64_t after = R(l->shm->reclaimed_bytes);
    ledger_unlock(l);
    return after - before;
}

/* ---- charges ---------------------------------------------------------------------------------------- */

static uint64_t sat_sub(uint64_t a, uint64_t b)
{
    return a > b ? a - b : 0;
}

static uint64_t tenant_held_locked(const ledger_shm *s, unsigned t)
{
    uint64_t held = 0;
    for (unsigned i = 0; i < GP_LEDGER_POOLS; i++)
        if (R(s->slots[i].state) == SLOT_ACTIVE)
            held += R(s->slots[i].charges[t].held);
    return held;
}

/* Cache of pools other than `self`: of tenant t, or (t < 0) all of it, page pools included. */
static uint64_t cached_elsewhere_locked(const ledger_shm *s, unsigned self, int t)
{
    uint64_t cached = 0;
    for (unsigned i = 0; i < GP_LEDGER_POOLS; i++) {
        const ledger_slot *sl = &s->slots[i];
        if (i == self || R(sl->state) != SLOT_ACTIVE)
            continue;
        if (t >= 0) {
            cached += sat_sub(R(sl->charges[t].held), R(sl->charges[t].live));
            continue;
        }
        uint64_t live = 0;
        for (unsigned u = 0; u < GP_LEDGER_TENANTS; u++)
            live += R(sl->charges[u].live);
        cached += sat_sub(R(sl->device_held), live);
    }
    return cached;
}

/* Decides a charge; GP_OK or the refusal's code with the message set. Lock held. */
static int decide_locked(gp_ledger *l, unsigned slot, unsigned tenant, uint64_t device_bytes, uint64_t tenant_bytes,
                         gp_ledger_shortfall *why)
{
    ledger_shm *s = l->shm;
    const ledger_budget *b = &s->tenants[tenant];
    uint64_t max = R(b->max);
    uint64_t held = tenant_held_locked(s, tenant);
    char t1[GP_SIZE_TEXT_MAX], t2[GP_SIZE_TEXT_MAX], t3[GP_SIZE_TEXT_MAX];
    if (tenant_bytes != 0 && max != 0 && held + tenant_bytes > max) {
        why->need = held + tenant_bytes - max;
        why->cached_elsewhere = cached_elsewhere_locked(s, slot, (int)tenant);
        char holders[512];
        size_t used = 0;
        holders[0] = '\0';
        for (unsigned i = 0; i < GP_LEDGER_POOLS && used < sizeof holders - 48; i++) {
            const ledger_slot *sl = &s->slots[i];
            uint64_t h = R(sl->state) == SLOT_ACTIVE ? R(sl->charges[tenant].held) : 0;
            if (h == 0)
                continue;
            used += (size_t)snprintf(holders + used, sizeof holders - used, "%spid %d%s: %s", used ? ", " : "",
                                     R(sl->pid), i == slot ? " (this one)" : "", gp_format_size((size_t)h, t1));
        }
        return gp_error_set(GP_ERR_QUOTA,
                            "tenant '%s' over its GPU-wide budget (ledger %s): max %s, held %s (%s), request %s",
                            b->name, l->name, gp_format_size((size_t)max, t2), gp_format_size((size_t)held, t3),
                            used ? holders : "by nobody", gp_format_size((size_t)tenant_bytes, (char[GP_SIZE_TEXT_MAX]){0}));
    }
    if (device_bytes == 0)
        return GP_OK;
    uint64_t device_held = 0;
    for (unsigned i = 0; i < GP_LEDGER_POOLS; i++)
        if (R(s->slots[i].state) == SLOT_ACTIVE)
            device_held += R(s->slots[i].device_held);
    /* Other tenants' unmet guarantees: memory this growth may not take. */
    uint64_t owed = 0;
    int owed_to = -1;
    for (unsigned u = 0; u < GP_LEDGER_TENANTS; u++) {
        if (u == tenant || !R(s->tenants[u].used) || R(s->tenants[u].min) == 0)
            continue;
        uint64_t short_by = sat_sub(R(s->tenants[u].min), tenant_held_locked(s, u));
        if (short_by > 0) {
            owed += short_by;
            owed_to = (int)u;
        }
    }
    if (device_held + device_bytes + owed <= s->capacity)
        return GP_OK;
    why->need = device_held + device_bytes + owed - s->capacity;
    why->cached_elsewhere = cached_elsewhere_locked(s, slot, -1);
    if (device_held + device_bytes <= s->capacity && owed_to >= 0)
        return gp_error_set(GP_ERR_OOM,
                            "out of device memory for tenant '%s' (ledger %s): %s more would leave %s of other "
                            "tenants' GPU-wide minimum unavailable (e.g. tenant '%s', min %s)",
                            b->name, l->name, gp_format_size((size_t)device_bytes, t1), gp_format_size((size_t)owed, t2),
                            s->tenants[owed_to].name, gp_format_size((size_t)R(s->tenants[owed_to].min), t3));
    return gp_error_set(GP_ERR_OOM,
                        "out of device memory (ledger %s): %s charged on a device of %s, request %s for tenant '%s' "
                        "(%s of it cached by other processes)",
                        l->name, gp_format_size((size_t)device_held, t1), gp_format_size((size_t)s->capacity, t2),
                        gp_format_size((size_t)device_bytes, t3), b->name,
                        gp_format_size((size_t)why->cached_elsewhere, (char[GP_SIZE_TEXT_MAX]){0}));
}

static void raise_peak(_Atomic uint64_t *peak, uint64_t value)
{
    if (R(*peak) < value)
        W(*peak, value); /* lock held: no other writer */
}

int gp_ledger_charge(gp_ledger *l, unsigned slot, unsigned tenant, uint64_t device_bytes, uint64_t tenant_bytes,
                     gp_ledger_shortfall *why)
{
    assert(slot < GP_LEDGER_POOLS && tenant < GP_LEDGER_TENANTS);
    gp_ledger_shortfall none;
    if (why == NULL)
        why = &none;
    memset(why, 0, sizeof *why);
    ledger_lock(l);
    int rc = decide_locked(l, slot, tenant, device_bytes, tenant_bytes, why);
    if (rc != GP_OK) { /* memory of dead processes may be all that is missing */
        uint64_t before = R(l->shm->reclaimed_pools);
        reclaim_dead_locked(l);
        if (R(l->shm->reclaimed_pools) != before) {
            memset(why, 0, sizeof *why);
            rc = decide_locked(l, slot, tenant, device_bytes, tenant_bytes, why);
        }
    }
    if (rc == GP_OK) {
        ledger_slot *s = &l->shm->slots[slot];
        W(s->device_held, R(s->device_held) + device_bytes);
        raise_peak(&s->device_peak, R(s->device_held));
        ledger_charge *c = &s->charges[tenant];
        W(c->held, R(c->held) + tenant_bytes);
        raise_peak(&c->peak, R(c->held));
        ledger_budget *b = &l->shm->tenants[tenant];
        uint64_t total = tenant_held_locked(l->shm, tenant);
        raise_peak(&b->peak, total);
        why->over_high = R(b->high) != 0 && total > R(b->high) ? total - R(b->high) : 0;
        atomic_fetch_add_explicit(&l->shm->charges, 1, memory_order_relaxed);
    } else {
        atomic_fetch_add_explicit(&l->shm->refusals, 1, memory_order_relaxed);
    }
    ledger_unlock(l);
    return rc;
}

void gp_ledger_credit(gp_ledger *l, unsigned slot, unsigned tenant, uint64_t device_bytes, uint64_t tenant_bytes)
{
    assert(slot < GP_LEDGER_POOLS && tenant < GP_LEDGER_TENANTS);
    ledger_lock(l);
    ledger_slot *s = &l->shm->slots[slot];
    assert(R(s->device_held) >= device_bytes && R(s->charges[tenant].held) >= tenant_bytes);
    W(s->device_held, sat_sub(R(s->device_held), device_bytes));
    W(s->charges[tenant].held, sat_sub(R(s->charges[tenant].held), tenant_bytes));
    ledger_unlock(l);
}

uint64_t gp_ledger_slot_device(const gp_ledger *l, unsigned slot)
{
    return R(l->shm->slots[slot].device_held);
}

uint64_t gp_ledger_slot_held(const gp_ledger *l, unsigned slot, unsigned tenant)
{
    return R(l->shm->slots[slot].charges[tenant].held);
}

/* ---- pressure ---------------------------------------------------------------------------------------- */

void gp_ledger_ask(gp_ledger *l, unsigned slot, int tenant, uint64_t bytes)
{
    ledger_lock(l);
    for (unsigned i = 0; i < GP_LEDGER_POOLS; i++) {
        ledger_slot *s = &l->shm->slots[i];
        if (i == slot || R(s->state) != SLOT_ACTIVE)
            continue;
        uint64_t cached;
        if (tenant >= 0) {
            cached = sat_sub(R(s->charges[tenant].held), R(s->charges[tenant].live));
        } else {
            uint64_t live = 0;
            for (unsigned u = 0; u < GP_LEDGER_TENANTS; u++)
                live += R(s->charges[u].live);
            cached = sat_sub(R(s->device_held), live);
        }
        if (cached == 0)
            continue;
        W(s->pressure_tenant, tenant);
        W(s->pressure_bytes, bytes);
        atomic_fetch_add_explicit(&s->pressure_seq, 1, memory_order_release);
        atomic_fetch_add_explicit(&l->shm->pressure_asks, 1, memory_order_relaxed);
    }
    ledger_unlock(l);
}

bool gp_ledger_take_pressure(gp_ledger *l, unsigned slot, int *tenant, uint64_t *bytes)
{
    ledger_slot *s = &l->shm->slots[slot];
    uint64_t seq = atomic_load_explicit(&s->pressure_seq, memory_order_acquire);
    if (seq == R(s->pressure_answered)) /* the fast answer: nobody asked (no lock) */
        return false;
    ledger_lock(l);
    seq = R(s->pressure_seq);
    bool asked = seq != R(s->pressure_answered);
    if (asked) {
        *tenant = R(s->pressure_tenant);
        *bytes = R(s->pressure_bytes);
        W(s->pressure_answered, seq);
    }
    ledger_unlock(l);
    return asked;
}

void gp_ledger_publish(gp_ledger *l, unsigned slot, const gp_ledger_figures *f)
{
    ledger_slot *s = &l->shm->slots[slot];
    for (unsigned t = 0; t < GP_LEDGER_TENANTS; t++) {
        W(s->charges[t].live, f->live[t]);
        W(s->charges[t].refusals, f->refusals[t]);
    }
    W(s->ooms, f->ooms);
    W(s->device_allocs, f->device_allocs);
    W(s->device_frees, f->device_frees);
    W(s->published_ns, realtime_ns());
}

/* ---- views ------------------------------------------------------------------------------------------ */

int gp_ledger_view_read(gp_ledger *l, gp_ledger_view *out, bool locked)
{
    if (locked && !l->writable)
        return gp_error_set(GP_ERR_INVALID, "ledger %s: a locked view needs a read-write handle", l->name);
    if (locked)
        ledger_lock(l);
    ledger_shm *s = l->shm;
    memset(out, 0, sizeof *out);
    snprintf(out->name, sizeof out->name, "%s", l->name);
    out->version = s->version;
    out->capacity = s->capacity;
    out->reclaimed_bytes = R(s->reclaimed_bytes);
    out->reclaimed_pools = R(s->reclaimed_pools);
    out->lock_recoveries = R(s->lock_recoveries);
    out->charges = R(s->charges);
    out->refusals = R(s->refusals);
    out->pressure_asks = R(s->pressure_asks);
    for (unsigned t = 0; t < GP_LEDGER_TENANTS; t++) {
        const ledger_budget *b = &s->tenants[t];
        if (!atomic_load_explicit(&b->used, memory_order_acquire))
            continue;
        gp_ledger_view_tenant *vt = &out->tenants[t];
        memcpy(vt->name, b->name, sizeof vt->name);
        vt->name[sizeof vt->name - 1] = '\0';
        vt->max = R(b->max);
        vt->high = R(b->high);
        vt->min = R(b->min);
        vt->peak = R(b->peak);
        out->num_tenants = t + 1;
    }
    for (unsigned i = 0; i < GP_LEDGER_POOLS; i++) {
        const ledger_slot *sl = &s->slots[i];
        if (atomic_load_explicit(&sl->state, memory_order_acquire) != SLOT_ACTIVE)
            continue;
        gp_ledger_view_pool *vp = &out->pools[out->num_pools++];
        vp->slot = i;
        vp->pid = R(sl->pid);
        vp->device = R(sl->device);
        vp->start_time = R(sl->start_time);
        vp->serial = R(sl->serial);
        memcpy(vp->command, sl->command, sizeof vp->command);
        vp->command[sizeof vp->command - 1] = '\0';
        vp->alive = process_alive(vp->pid, vp->start_time);
        vp->device_held = R(sl->device_held);
        vp->device_peak = R(sl->device_peak);
        vp->device_allocs = R(sl->device_allocs);
        vp->device_frees = R(sl->device_frees);
        vp->ooms = R(sl->ooms);
        vp->published_ns = R(sl->published_ns);
        vp->pressure_pending = R(sl->pressure_seq) != R(sl->pressure_answered);
        out->device_held += vp->device_held;
        for (unsigned t = 0; t < GP_LEDGER_TENANTS; t++) {
            gp_ledger_view_charge *c = &vp->charges[t];
            c->held = R(sl->charges[t].held);
            c->live = R(sl->charges[t].live);
            c->peak = R(sl->charges[t].peak);
            c->refusals = R(sl->charges[t].refusals);
            out->tenants[t].held += c->held;
            out->tenants[t].live += c->live;
            out->tenants[t].refusals += c->refusals;
        }
    }
    if (locked)
        ledger_unlock(l);
    return GP_OK;
}
