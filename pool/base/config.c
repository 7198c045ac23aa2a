/*
 * config.c — the configuration keys, their defaults, and the parser of "key:value,key:value" strings.
 *
 * GPUPOOL_CONF is applied first, then the string given to gp_pool_create, key by key. Parsing is
 * all-or-nothing: a string with one bad item changes nothing. Sizes accept B, K/KB/KiB, M/MB/MiB,
 * G/GB/GiB, T/TB/TiB (all binary, as PYTORCH_CUDA_ALLOC_CONF users expect) and decimals ("1.5GiB").
 */
#define _POSIX_C_SOURCE 200809L
#include "base/config.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "base/error.h"

#define MIB ((size_t)1 << 20)
#define GIB ((size_t)1 << 30)
#define DEVICE_PAGE (2 * MIB)

typedef enum { KEY_STRING, KEY_SIZE, KEY_UINT, KEY_BOOL, KEY_FRACTION, KEY_SIZE_OR_NONE, KEY_SECONDS } key_kind;

typedef struct key_spec {
    const char *name;
    key_kind kind;
    size_t offset;
    size_t capacity; /* strings: buffer size */
    const char *default_text;
    const char *meaning;
} key_spec;

#define FIELD(f) offsetof(gp_config, f)

static const key_spec keys[] = {
    {"backend", KEY_STRING, FIELD(backend), GP_CONFIG_NAME_MAX, "cuda",
     "device backend when gp_pool_create gets NULL: cuda, vmm (CUDA virtual memory), sim or sim-vmm"},
    {"device_memory", KEY_SIZE, FIELD(device_memory), 0, "80GiB",
     "sim backend: capacity of the simulated device"},
    {"small_size", KEY_SIZE, FIELD(small_size), 0, "512KiB",
     "requests up to this size are packed into small segments"},
    {"small_segment", KEY_SIZE, FIELD(small_segment), 0, "2MiB",
     "size of one small segment (a multiple of 2 MiB)"},
    {"large_segment", KEY_SIZE, FIELD(large_segment), 0, "20MiB",
     "segment size for requests above small_size and below huge_size (a multiple of 2 MiB)"},
    {"huge_size", KEY_SIZE, FIELD(huge_size), 0, "10MiB",
     "requests of this size or more get a segment of their own, rounded up to 2 MiB"},
    {"max_streams", KEY_UINT, FIELD(max_streams), 0, "256",
     "streams one pool can track"},
    {"pending_scan", KEY_UINT, FIELD(pending_scan), 0, "8",
     "cross-stream frees whose events an allocation queries before its fast path (0: none; slow paths "
     "still collect them)"},
    {"steal_wait", KEY_BOOL, FIELD(steal_wait), 0, "true",
     "let a stream wait on another's event to take its free segments (cudaMalloc path): when the device is "
     "full, and past the cache cap from a stream of its tenant (instead of a cudaFree that syncs the device)"},
    {"borrow", KEY_BOOL, FIELD(borrow), 0, "on",
     "a stream whose cache misses takes a fitting free block of another stream whose work is done"},
    {"reuse_wait", KEY_BOOL, FIELD(reuse_wait), 0, "off",
     "vmm: on: a stream may take free memory of another stream of its tenant whose work is still queued, by "
     "waiting on that stream's event (as cudaMallocAsync's internal dependencies); off: only once the work "
     "is done (with busy streams the waits delay them, and memory held for them grows: bench/RESULTS.md)"},
    {"tenant_best_fit", KEY_BOOL, FIELD(tenant_best_fit), 0, "off",
     "vmm, borrow: on: a large request that its stream's cache fits only loosely takes a tighter free block of "
     "another stream of its tenant whose work is done (best fit over the tenant's idle memory); off by default: "
     "less memory with idle streams, more with busy ones (the borrowed blocks come back to their stream only "
     "after the borrower's work on them: bench/RESULTS.md)"},
    {"thread_cache", KEY_BOOL, FIELD(thread_cache), 0, "on",
     "small blocks freed on their own stream wait in the freeing thread's cache (no stream lock); off: the stream's heap only"},
    {"cache_slack", KEY_FRACTION, FIELD(cache_slack), 0, "0.04",
     "before growing past (1 + this) x peak allocated bytes, give back wholly free cached segments (off = never)"},
    {"defrag", KEY_BOOL, FIELD(defrag), 0, "on",
     "vmm backends: map cached free pages into a new contiguous range instead of creating memory"},
    {"alias", KEY_BOOL, FIELD(alias), 0, "on",
     "vmm backends, with defrag: stitch by mapping free pages a second time (kept for the next step) rather than moving them"},
    {"loans", KEY_BOOL, FIELD(loans), 0, "on",
     "vmm backends, with alias: past the cache cap, stitch other idle streams' free pages too (loans) and repair idle stitched blocks, rather than moving pages"},
    {"vmm_reserve", KEY_SIZE, FIELD(vmm_reserve), 0, "0",
     "vmm backends: virtual address space reserved per growing range (0 = the device's memory; less where the address space is short)"},
    {"release_threshold", KEY_SIZE_OR_NONE, FIELD(release_threshold), 0, "none",
     "cached bytes kept when maintenance runs (gp_maintain, slow paths); none = keep all"},
    {"idle_release", KEY_SECONDS, FIELD(idle_release), 0, "off",
     "give back cached memory idle this long (e.g. 30s, 500ms; real time, or virtual time on the sim)"},
    {"log", KEY_STRING, FIELD(log_path), sizeof(((gp_config *)0)->log_path), "",
     "write every allocate and free to this file as an RMM allocation-log CSV"},
    {"ledger", KEY_STRING, FIELD(ledger), sizeof(((gp_config *)0)->ledger), "off",
     "share budgets with other processes on this GPU: off, on (the device's ledger, named by its UUID) or a ledger name"},
    {"ledger_wait", KEY_SECONDS, FIELD(ledger_wait), 0, "100ms",
     "ledger: how long a refused growth waits for other processes to give cached memory back"},
    {"empty_cache", KEY_STRING, FIELD(empty_cache), GP_CONFIG_NAME_MAX, "working-set",
     "torch.cuda.empty_cache(): working-set (give back what the last 8 calls' intervals did not use), trim (all), off"},
    {"peak_composition", KEY_BOOL, FIELD(peak_composition), 0, "off",
     "record what reserved memory is made of (live, pending, free beside live, free whole) at each raise of its peak"},
};

#define KEY_COUNT (sizeof keys / sizeof keys[0])

bool gp_parse_size(const char *text, size_t *out)
{
    static const struct { const char *suffix; double scale; } units[] = {
        {"", 1.0}, {"B", 1.0},
        {"K", 1024.0}, {"KB", 1024.0}, {"KIB", 1024.0},
        {"M", 1048576.0}, {"MB", 1048576.0}, {"MIB", 1048576.0},
        {"G", 1073741824.0}, {"GB", 1073741824.0}, {"GIB", 1073741824.0},
        {"T", 1099511627776.0}, {"TB", 1099511627776.0}, {"TIB", 1099511627776.0},
    };
    if (text == NULL || !isdigit((unsigned char)text[0]))
        return false;
    errno = 0;
    char *end = NULL;
    double value = strtod(text, &end);
    if (errno != 0 || end == text || !isfinite(value) || value < 0)
        return false;
    while (*end == ' ')
        end++;
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
        if (strcasecmp(end, units[i].suffix) != 0)
            continue;
        double bytes = value * units[i].scale;
        if (bytes >= 18446744073709551615.0 || bytes != floor(bytes))
            return false; /* too large, or a fraction of a byte */
        *out = (size_t)bytes;
        return true;
    }
    return false;
}

static bool parse_uint(const char *text, unsigned *out)
{
    if (text == NULL || !isdigit((unsigned char)text[0]))
        return false;
    errno = 0;
    char *end = NULL;
    unsigned long value = strtoul(text, &end, 10);
    if (errno != 0 || *end != '\0' || value > 1000000000UL)
        return false;
    *out = (unsigned)value;
    return true;
}

static bool parse_bool(const char *text, bool *out)
{
    static const char *const yes[] = {"true", "1", "on", "yes"};
    static const char *const no[] = {"false", "0", "off", "no"};
    for (size_t i = 0; i < 4; i++) {
        if (strcasecmp(text, yes[i]) == 0) { *out = true; return true; }
        if (strcasecmp(text, no[i]) == 0) { *out = false; return true; }
    }
    return false;
}

/* A fraction >= 0 ("0.04"), or "off" (stored as -1). */
static bool parse_fraction(const char *text, double *out)
{
    if (strcasecmp(text, "off") == 0) {
        *out = -1.0;
        return true;
    }
    if (text == NULL || !isdigit((unsigned char)text[0]))
        return false;
    errno = 0;
    char *end = NULL;
    double value = strtod(text, &end);
    if (errno != 0 || *end != '\0' || !isfinite(value) || value < 0 || value > 1000)
        return false;
    *out = value;
    return true;
}

/* "none"/"off" (SIZE_MAX) or a size. */
static bool parse_size_or_none(const char *text, size_t *out)
{
    if (strcasecmp(text, "none") == 0 || strcasecmp(text, "off") == 0) {
        *out = SIZE_MAX;
        return true;
    }
    return gp_parse_size(text, out);
}

/* The longest duration accepted: what the pool's clock (uint64_t nanoseconds) can count, about 584
 * years. Anything longer would overflow the conversion to nanoseconds (maintain.c). */
#define GP_SECONDS_MAX 18446744073.0

/* "off" (-1) or a duration: "30", "30s", "500ms", "2m", of at most GP_SECONDS_MAX. */
static bool parse_seconds(const char *text, double *out)
{
    if (strcasecmp(text, "off") == 0) {
        *out = -1.0;
        return true;
    }
    if (!isdigit((unsigned char)text[0]))
        return false;
    errno = 0;
    char *end = NULL;
    double value = strtod(text, &end);
    if (errno != 0 || !isfinite(value) || value < 0)
        return false;
    double scale = strcmp(end, "") == 0 || strcmp(end, "s") == 0 ? 1.0
                   : strcmp(end, "ms") == 0                      ? 1e-3
                   : strcmp(end, "m") == 0                       ? 60.0
                                                                 : -1.0;
    if (scale < 0)
        return false;
    double seconds = value * scale;
    if (!isfinite(seconds) || seconds > GP_SECONDS_MAX)
        return false;
    *out = seconds;
    return true;
}

static const key_spec *find_key(const char *name)
{
    for (size_t i = 0; i < KEY_COUNT; i++)
        if (strcmp(keys[i].name, name) == 0)
            return &keys[i];
    return NULL;
}

static int apply_one(gp_config *cfg, const key_spec *key, const char *value, const char *origin)
{
    void *field = (char *)cfg + key->offset;
    switch (key->kind) {
    case KEY_STRING:
        if (strlen(value) >= key->capacity)
            return gp_error_set(GP_ERR_CONFIG, "%s: value of '%s' is too long (%zu characters, at most %zu)",
                                origin, key->name, strlen(value), key->capacity - 1);
        memcpy(field, value, strlen(value) + 1);
        return GP_OK;
    case KEY_SIZE:
        if (!gp_parse_size(value, (size_t *)field))
            return gp_error_set(GP_ERR_CONFIG,
                                "%s: '%s' is not a size for key '%s' (use bytes or a unit: 512, 4KiB, 2MiB, 1.5GiB)",
                                origin, value, key->name);
        return GP_OK;
    case KEY_UINT:
        if (!parse_uint(value, (unsigned *)field))
            return gp_error_set(GP_ERR_CONFIG, "%s: '%s' is not a whole number for key '%s'", origin, value,
                                key->name);
        return GP_OK;
    case KEY_BOOL:
        if (!parse_bool(value, (bool *)field))
            return gp_error_set(GP_ERR_CONFIG, "%s: '%s' is not true/false for key '%s'", origin, value,
                                key->name);
        return GP_OK;
    case KEY_SIZE_OR_NONE:
        if (!parse_size_or_none(value, (size_t *)field))
            return gp_error_set(GP_ERR_CONFIG, "%s: '%s' is not a size or none for key '%s'", origin, value,
                                key->name);
        return GP_OK;
    case KEY_SECONDS:
        if (!parse_seconds(value, (double *)field))
            return gp_error_set(GP_ERR_CONFIG, "%s: '%s' is not a duration (30s, 500ms, 2m) of at most %.0f s (about 584 "
                                "years, what the pool's nanosecond clock can count) or off for key '%s'",
                                origin, value, GP_SECONDS_MAX, key->name);
        return GP_OK;
    case KEY_FRACTION:
        if (!parse_fraction(value, (double *)field))
            return gp_error_set(GP_ERR_CONFIG, "%s: '%s' is not a fraction (such as 0.04) or off for key '%s'",
                                origin, value, key->name);
        return GP_OK;
    }
    return gp_error_set(GP_ERR_CONFIG, "%s: key '%s' has no parser", origin, key->name);
}

/* budget.NAME.max|high|min:SIZE — a GPU-wide budget of tenant NAME (used with `ledger`). */
static int apply_budget(gp_config *cfg, const char *key, const char *value, const char *origin)
{
    const char *name = key + strlen("budget.");
    const char *dot = strrchr(name, '.');
    if (dot == NULL || dot == name || (size_t)(dot - name) >= sizeof cfg->budgets[0].name)
        return gp_error_set(GP_ERR_CONFIG, "%s: '%s' is not budget.NAME.max, budget.NAME.high or budget.NAME.min",
                            origin, key);
    const char *limit = dot + 1;
    unsigned bit = strcmp(limit, "max") == 0 ? 1u : strcmp(limit, "high") == 0 ? 2u : strcmp(limit, "min") == 0 ? 4u : 0u;
    if (bit == 0)
        return gp_error_set(GP_ERR_CONFIG, "%s: '%s': unknown limit '%s' (max, high or min)", origin, key, limit);
    size_t bytes = 0;
    if (!gp_parse_size(value, &bytes))
        return gp_error_set(GP_ERR_CONFIG, "%s: '%s' is not a size for key '%s'", origin, value, key);
    size_t len = (size_t)(dot - name);
    gp_config_budget *b = NULL;
    for (unsigned i = 0; i < cfg->num_budgets && b == NULL; i++)
        if (strlen(cfg->budgets[i].name) == len && strncmp(cfg->budgets[i].name, name, len) == 0)
            b = &cfg->budgets[i];
    if (b == NULL) {
        if (cfg->num_budgets == GP_CONFIG_BUDGETS)
            return gp_error_set(GP_ERR_CONFIG, "%s: '%s': at most %d budget.NAME tenants", origin, key,
                                GP_CONFIG_BUDGETS);
        b = &cfg->budgets[cfg->num_budgets++];
        memset(b, 0, sizeof *b);
        memcpy(b->name, name, len);
        b->name[len] = '\0';
    }
    if (bit == 1)
        b->max = bytes;
    else if (bit == 2)
        b->high = bytes;
    else
        b->min = bytes;
    b->set |= bit;
    return GP_OK;
}

static char *trim(char *s)
{
    while (isspace((unsigned char)*s))
        s++;
    char *end = s + strlen(s);
    while (end > s && isspace((unsigned char)end[-1]))
        *--end = '\0';
    return s;
}

void gp_config_defaults(gp_config *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    for (size_t i = 0; i < KEY_COUNT; i++) {
        int rc = apply_one(cfg, &keys[i], keys[i].default_text, "defaults");
        if (rc != GP_OK)
            abort(); /* a default that does not parse is a bug in the table above */
    }
}

int gp_config_apply(gp_config *cfg, const char *text, const char *origin)
{
    if (text == NULL || text[0] == '\0')
        return GP_OK;
    /* A configuration is text: a control byte means it is not one (a binary file in GPUPOOL_CONF, say),
     * and echoing it into a message could drive the user's terminal. Bytes >= 0x80 (UTF-8) are text. */
    for (size_t i = 0; text[i] != '\0'; i++) {
        unsigned char c = (unsigned char)text[i];
        if ((c < 0x20 && c != '\t') || c == 0x7f)
            return gp_error_set(GP_ERR_CONFIG, "%s: byte 0x%02x at offset %zu is a control character: a configuration "
                                "is printable key:value,key:value text", origin, c, i);
    }
    gp_config work = *cfg; /* all-or-nothing: apply to a copy */
    char *copy = strdup(text);
    if (copy == NULL)
        return gp_error_set(GP_ERR_CONFIG, "%s: out of host memory while parsing", origin);
    int rc = GP_OK;
    char *save = NULL;
    for (char *item = strtok_r(copy, ",", &save); item != NULL; item = strtok_r(NULL, ",", &save)) {
        item = trim(item);
        if (item[0] == '\0')
            continue;
        char *colon = strchr(item, ':');
        if (colon == NULL) {
            rc = gp_error_set(GP_ERR_CONFIG, "%s: '%s' is not key:value", origin, item);
            break;
        }
        *colon = '\0';
        char *name = trim(item), *value = trim(colon + 1);
        if (strncmp(name, "budget.", strlen("budget.")) == 0) {
            rc = apply_budget(&work, name, value, origin);
            if (rc != GP_OK)
                break;
            continue;
        }
        const key_spec *key = find_key(name);
        if (key == NULL) {
            rc = gp_error_set(GP_ERR_CONFIG, "%s: unknown key '%s' (known keys: see gp_config_help)", origin,
                              name);
            break;
        }
        rc = apply_one(&work, key, value, origin);
        if (rc != GP_OK)
            break;
    }
    free(copy);
    if (rc == GP_OK)
        *cfg = work;
    return rc;
}

int gp_config_check_ledger_name(const char *name)
{
    size_t len = strlen(name);
    if (len == 0)
        return gp_error_set(GP_ERR_CONFIG, "ledger: empty name (use on, off or a name)");
    if (len > GP_CONFIG_LEDGER_NAME_LEN)
        return gp_error_set(GP_ERR_CONFIG, "ledger: a name of %zu bytes is longer than %d characters", len,
                            GP_CONFIG_LEDGER_NAME_LEN);
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)name[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
              c == '-'))
            return gp_error_set(GP_ERR_CONFIG,
                                "ledger: a name may hold only letters, digits, '.', '_' and '-' (byte %zu is 0x%02x)",
                                i + 1, c);
    }
    return GP_OK;
}

int gp_config_validate(const gp_config *cfg)
{
    static const char *const backends[] = {"cuda", "vmm", "sim", "sim-vmm"};
    bool known = false;
    for (size_t i = 0; i < sizeof backends / sizeof backends[0]; i++)
        known = known || strcmp(cfg->backend, backends[i]) == 0;
    if (!known)
        return gp_error_set(GP_ERR_CONFIG, "backend '%s' unknown (cuda, vmm, sim or sim-vmm)", cfg->backend);
    if (cfg->device_memory < DEVICE_PAGE)
        return gp_error_set(GP_ERR_CONFIG, "device_memory %zu is below one 2 MiB device page", cfg->device_memory);
    if (cfg->small_segment == 0 || cfg->small_segment % DEVICE_PAGE != 0)
        return gp_error_set(GP_ERR_CONFIG, "small_segment %zu is not a positive multiple of 2 MiB",
                            cfg->small_segment);
    if (cfg->large_segment == 0 || cfg->large_segment % DEVICE_PAGE != 0)
        return gp_error_set(GP_ERR_CONFIG, "large_segment %zu is not a positive multiple of 2 MiB",
                            cfg->large_segment);
    if (cfg->small_size == 0 || cfg->small_size > cfg->small_segment)
        return gp_error_set(GP_ERR_CONFIG, "small_size %zu must be between 1 and small_segment (%zu)",
                            cfg->small_size, cfg->small_segment);
    if (cfg->huge_size <= cfg->small_size)
        return gp_error_set(GP_ERR_CONFIG, "huge_size %zu must be larger than small_size (%zu)", cfg->huge_size,
                            cfg->small_size);
    if (strcmp(cfg->empty_cache, "working-set") != 0 && strcmp(cfg->empty_cache, "trim") != 0 &&
        strcmp(cfg->empty_cache, "off") != 0)
        return gp_error_set(GP_ERR_CONFIG, "empty_cache '%s' unknown (working-set, trim or off)", cfg->empty_cache);
    if (cfg->max_streams == 0 || cfg->max_streams > 65536)
        return gp_error_set(GP_ERR_CONFIG, "max_streams %u must be between 1 and 65536", cfg->max_streams);
    if (strcmp(cfg->ledger, "off") != 0 && strcmp(cfg->ledger, "on") != 0)
        return gp_config_check_ledger_name(cfg->ledger); /* refused here, not first at gp_pool_create's attach */
    return GP_OK;
}

const char *gp_config_help_text(void)
{
    static char text[4096];
    if (text[0] != '\0')
        return text;
    size_t used = 0;
    for (size_t i = 0; i < KEY_COUNT && used < sizeof text; i++)
        used += (size_t)snprintf(text + used, sizeof text - used, "%-14s default %-6s  %s\n", keys[i].name,
                                 keys[i].default_text[0] ? keys[i].default_text : "\"\"", keys[i].meaning);
    if (used < sizeof text)
        snprintf(text + used, sizeof text - used, "%-14s default %-6s  %s\n", "budget.NAME.max", "none",
                 "ledger: GPU-wide max of tenant NAME (also budget.NAME.high, budget.NAME.min), all processes together");
    return text;
}

GP_API const char *gp_config_help(void)
{
    return gp_config_help_text();
}
