/*
 * vmm_probe.c — asks a real GPU the questions about CUDA's virtual memory calls that the pool's design
 * turns on and that the documentation leaves open, and times the calls the warm-up model prices.
 *
 * Why: the virtual-memory path creates one physical handle per 2 MiB page (pool/provider/pages.c), so
 * that each page can be unmapped and mapped elsewhere alone (stitching, moves, loans). A first pass over
 * a 52 GiB trace makes about 26,000 cuMemCreate calls, which the published A100 cost (193 us) puts at
 * 5 s of the 5.2 s modelled warm-up. Larger physical chunks would cut that, but only if a page of a
 * chunk can still be mapped alone, i.e. if cuMemMap accepts an offset into a handle. CUDA 13.0's cuda.h
 * says both "Maps bytes of memory represented by handle starting from byte offset" and, of the same
 * parameter, "Note: currently must be zero"; the CUDA emulation (pool/cuda_emu) enforces the note. The
 * second open question is whether one cuMemUnmap may cover several adjacent mappings ("the entire
 * contiguous address range that was mapped to"), which would batch the unmaps of a run of pages. This
 * program answers both on the GPU it runs on, checks the documented refusal (unmapping part of one
 * mapping), and gives the median time of each call, so that the model's per-call costs can be replaced
 * by measured ones. It changes nothing in the pool; every handle, mapping and reservation it makes is
 * undone before it returns, whatever the answers.
 *
 * Output: one line per answer, "vmm_probe: <question>: accepted" or "refused (<CUresult name>)", then
 * "vmm_probe: time <call> <what>: <median> us (<reps> calls)" lines, and the `gpupool replay
 * --call-costs ...` option that prices the replay's warm-up and last-pass records at the medians measured.
 * Usage: vmm_probe [REPS]  (default 20). Exit 0 when every question was asked, 77 when no CUDA device or
 * driver is usable (nothing asked), 1 when a call that must work failed (the line says which).
 * Built by bench/gpu/run.sh against the CUDA runtime, with the vmm backend's own table of the driver's
 * entry points (pool/backend/vmm_driver.c); tests/emu/test_vmm_probe.c runs the same code over the
 * emulation (answers as the emulation's rules give them; its times mean nothing).
 */
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/vmm_driver.h"

#define PROBE_MAX_REPS 64
#define PROBE_CHUNK_PAGES 64 /* the largest chunk timed: a growth of 128 MiB */

/* The pool's own table of the driver's entry points (pool/backend/vmm_driver.h), so that the answers
 * are about the very calls, ABI version and memory properties the vmm backend uses. */
static const gp_vmm_driver *probe_drv;

typedef struct {
    FILE *out;
    int device;
    size_t page;
    unsigned reps;
    int failed; /* a call that must work did not */
} probe;

static const char *probe_error_name(CUresult r)
{
    const char *name, *text;
    gp_vmm_driver_error(r, &name, &text);
    return name;
}

/* A call that must succeed; false (and the probe failed, with a line saying which) when it did not. */
static int probe_must(probe *p, CUresult r, const char *what)
{
    if (r == CUDA_SUCCESS)
        return 1;
    fprintf(p->out, "vmm_probe: FAILED: %s: %s\n", what, probe_error_name(r));
    p->failed = 1;
    return 0;
}

static void probe_answer(probe *p, const char *question, CUresult r)
{
    if (r == CUDA_SUCCESS)
        fprintf(p->out, "vmm_probe: %s: accepted\n", question);
    else
        fprintf(p->out, "vmm_probe: %s: refused (%s)\n", question, probe_error_name(r));
}

static double probe_now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

static int probe_cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* One call's timings, in microseconds. */
typedef struct {
    double us[PROBE_MAX_REPS];
    unsigned n;
} probe_series;

static void series_add(probe_series *s, double us)
{
    if (s->n < PROBE_MAX_REPS)
        s->us[s->n++] = us;
}

static double series_median(probe_series *s)
{
    qsort(s->us, s->n, sizeof s->us[0], probe_cmp_double);
    return s->n % 2 ? s->us[s->n / 2] : (s->us[s->n / 2 - 1] + s->us[s->n / 2]) / 2;
}

static void probe_time_line(probe *p, const char *call, const char *what, probe_series *s)
{
    if (s->n > 0)
        fprintf(p->out, "vmm_probe: time %s %s: %.1f us (%u calls)\n", call, what, series_median(s), s->n);
}

static CUresult probe_access(const probe *p, CUdeviceptr va, size_t size)
{
    return gp_vmm_set_device_access(va, size, p->device);
}

static CUresult probe_create(const probe *p, size_t pages, CUmemGenericAllocationHandle *h)
{
    CUmemAllocationProp prop = gp_vmm_device_memory(p->device);
    return probe_drv->create(h, pages * p->page, &prop, 0);
}

/*
 * Question 1: a page of a 4-page handle mapped alone at an offset, unmapped, and mapped again at
 * another address (what moving one page of a chunk would need).
 */
static void probe_offset_map(probe *p)
{
    size_t g = p->page;
    CUmemGenericAllocationHandle h = 0;
    CUdeviceptr a = 0, b = 0;
    if (!probe_must(p, probe_create(p, 4, &h), "cuMemCreate(4 pages)"))
        return;
    if (probe_must(p, probe_drv->address_reserve(&a, 4 * g, 0, 0, 0), "cuMemAddressReserve(4 pages)") &&
        probe_must(p, probe_drv->address_reserve(&b, 4 * g, 0, 0, 0), "cuMemAddressReserve(4 pages)")) {
        CUresult r = probe_drv->map(a, g, 2 * g, h, 0); /* page 2 of the handle at a */
        probe_answer(p, "map one page of a 4-page handle at an offset (cuMemMap offset != 0)", r);
        if (r == CUDA_SUCCESS) {
            probe_answer(p, "set access on that page alone", probe_access(p, a, g));
            CUresult u = probe_drv->unmap(a, g);
            probe_answer(p, "unmap that page alone", u);
            CUresult m = probe_drv->map(b + g, g, 2 * g, h, 0); /* the same page, elsewhere */
            probe_answer(p, "map the same page again at another address", m);
            if (m == CUDA_SUCCESS) {
                probe_answer(p, "set access there", probe_access(p, b + g, g));
                probe_must(p, probe_drv->unmap(b + g, g), "cuMemUnmap(the moved page)");
            }
            if (u != CUDA_SUCCESS)
                probe_must(p, probe_drv->unmap(a, g), "cuMemUnmap(the offset page)");
        }
    }
    if (b != 0)
        probe_must(p, probe_drv->address_free(b, 4 * g), "cuMemAddressFree");
    if (a != 0)
        probe_must(p, probe_drv->address_free(a, 4 * g), "cuMemAddressFree");
    probe_must(p, probe_drv->release(h), "cuMemRelease(4 pages)");
}

/*
 * Question 2: one cuMemUnmap over two adjacent one-page mappings (batching a run's unmaps), and the
 * documented refusal: unmapping one page of a two-page mapping.
 */
static void probe_unmap_spans(probe *p)
{
    size_t g = p->page;
    CUmemGenericAllocationHandle h[3] = {0, 0, 0};
    int mapped[2] = {0, 0}, pair = 0; /* pages 0 and 1 (one page each); pages 2-3 (one mapping) */
    CUdeviceptr va = 0;
    if (!probe_must(p, probe_drv->address_reserve(&va, 4 * g, 0, 0, 0), "cuMemAddressReserve(4 pages)"))
        return;
    for (int i = 0; i < 2; i++)
        mapped[i] = probe_must(p, probe_create(p, 1, &h[i]), "cuMemCreate(1 page)") &&
                    probe_must(p, probe_drv->map(va + (size_t)i * g, g, 0, h[i], 0), "cuMemMap(1 page)");
    if (mapped[0] && mapped[1] && probe_must(p, probe_access(p, va, 2 * g), "cuMemSetAccess(2 pages, two mappings)")) {
        CUresult r = probe_drv->unmap(va, 2 * g);
        probe_answer(p, "one unmap over two adjacent mappings", r);
        if (r == CUDA_SUCCESS)
            mapped[0] = mapped[1] = 0;
    }
    pair = probe_must(p, probe_create(p, 2, &h[2]), "cuMemCreate(2 pages)") &&
           probe_must(p, probe_drv->map(va + 2 * g, 2 * g, 0, h[2], 0), "cuMemMap(2 pages)");
    if (pair) {
        CUresult r = probe_drv->unmap(va + 2 * g, g);
        probe_answer(p, "unmap one page of a two-page mapping (documented: refused)", r);
        if (r == CUDA_SUCCESS) /* then the other page is a mapping of its own */
            pair = !probe_must(p, probe_drv->unmap(va + 3 * g, g), "cuMemUnmap(the other page)");
        else
            pair = !probe_must(p, probe_drv->unmap(va + 2 * g, 2 * g), "cuMemUnmap(2 pages)");
    }
    for (int i = 0; i < 2; i++)
        if (mapped[i])
            probe_must(p, probe_drv->unmap(va + (size_t)i * g, g), "cuMemUnmap(1 page)");
    for (int i = 0; i < 3; i++)
        if (h[i] != 0)
            probe_must(p, probe_drv->release(h[i]), "cuMemRelease");
    if (!pair) /* a mapping left in it (an unmap that failed) keeps the reservation */
        probe_must(p, probe_drv->address_free(va, 4 * g), "cuMemAddressFree");
}

/* What probe_times measures: creates and releases of 1, 8 and PROBE_CHUNK_PAGES pages; the calls of a
 * run of one-page mappings, as the pool maps its pages; and one PROBE_CHUNK_PAGES-page chunk mapped,
 * given access and unmapped whole (what a pool whose unit of moving is the chunk, with no offsets,
 * would pay per growth, against PROBE_CHUNK_PAGES calls of each). */
static const size_t probe_create_pages[3] = {1, 8, PROBE_CHUNK_PAGES};

typedef struct {
    probe_series create[3], release[3];
    probe_series map, access, access_run, unmap, sync;
    probe_series chunk_map, chunk_access, chunk_unmap;
} probe_timings;

static void time_creates(probe *p, probe_timings *t)
{
    for (int s = 0; s < 3 && !p->failed; s++)
        for (unsigned i = 0; i < p->reps && !p->failed; i++) {
            CUmemGenericAllocationHandle h = 0;
            double t0 = probe_now_us();
            if (!probe_must(p, probe_create(p, probe_create_pages[s], &h), "cuMemCreate (timed)"))
                break;
            double t1 = probe_now_us();
            probe_must(p, probe_drv->release(h), "cuMemRelease (timed)");
            series_add(&t->create[s], t1 - t0);
            series_add(&t->release[s], probe_now_us() - t1);
        }
}

/* reps one-page handles mapped side by side in one reservation, as a grown run of the pool's pages */
static void time_run(probe *p, probe_timings *t)
{
    size_t g = p->page, n = p->reps;
    CUmemGenericAllocationHandle hs[PROBE_MAX_REPS];
    unsigned have = 0, mapped = 0;
    CUdeviceptr va = 0;
    if (p->failed || !probe_must(p, probe_drv->address_reserve(&va, n * g, 0, 0, 0), "cuMemAddressReserve (timed)"))
        return;
    for (; have < n && probe_must(p, probe_create(p, 1, &hs[have]), "cuMemCreate (timed run)"); have++) {
    }
    for (; mapped < have; mapped++) {
        double t0 = probe_now_us();
        if (!probe_must(p, probe_drv->map(va + mapped * g, g, 0, hs[mapped], 0), "cuMemMap (timed)"))
            break;
        series_add(&t->map, probe_now_us() - t0);
    }
    for (unsigned i = 0; i < mapped; i++) {
        double t0 = probe_now_us();
        if (!probe_must(p, probe_access(p, va + i * g, g), "cuMemSetAccess (timed)"))
            break;
        series_add(&t->access, probe_now_us() - t0);
    }
    for (unsigned i = 0; i < 5 && mapped == n; i++) {
        double t0 = probe_now_us();
        if (!probe_must(p, probe_access(p, va, n * g), "cuMemSetAccess (timed run)"))
            break;
        series_add(&t->access_run, probe_now_us() - t0);
    }
    for (unsigned i = 0; i < 5; i++) {
        double t0 = probe_now_us();
        if (!probe_must(p, cudaDeviceSynchronize() == cudaSuccess ? CUDA_SUCCESS : CUDA_ERROR_UNKNOWN,
                        "cudaDeviceSynchronize"))
            break;
        series_add(&t->sync, probe_now_us() - t0);
    }
    for (unsigned i = 0; i < mapped; i++) {
        double t0 = probe_now_us();
        if (probe_must(p, probe_drv->unmap(va + i * g, g), "cuMemUnmap (timed)"))
            series_add(&t->unmap, probe_now_us() - t0);
    }
    for (unsigned i = 0; i < have; i++)
        probe_must(p, probe_drv->release(hs[i]), "cuMemRelease (timed run)");
    probe_must(p, probe_drv->address_free(va, n * g), "cuMemAddressFree (timed)");
}

static void time_chunk(probe *p, probe_timings *t)
{
    size_t bytes = PROBE_CHUNK_PAGES * p->page;
    for (unsigned i = 0; i < 5 && !p->failed; i++) {
        CUmemGenericAllocationHandle h = 0;
        CUdeviceptr va = 0;
        if (!probe_must(p, probe_drv->address_reserve(&va, bytes, 0, 0, 0), "cuMemAddressReserve (chunk)"))
            break;
        if (probe_must(p, probe_create(p, PROBE_CHUNK_PAGES, &h), "cuMemCreate (chunk)")) {
            double t0 = probe_now_us();
            if (probe_must(p, probe_drv->map(va, bytes, 0, h, 0), "cuMemMap (chunk)")) {
                double t1 = probe_now_us();
                int ok = probe_must(p, probe_access(p, va, bytes), "cuMemSetAccess (chunk)");
                double t2 = probe_now_us();
                if (probe_must(p, probe_drv->unmap(va, bytes), "cuMemUnmap (chunk)") && ok) {
                    series_add(&t->chunk_map, t1 - t0);
                    series_add(&t->chunk_access, t2 - t1);
                    series_add(&t->chunk_unmap, probe_now_us() - t2);
                }
            }
            probe_must(p, probe_drv->release(h), "cuMemRelease (chunk)");
        }
        probe_must(p, probe_drv->address_free(va, bytes), "cuMemAddressFree (chunk)");
    }
}

/* The median time of each call the warm-up model prices, and the replay option that uses them. */
static void probe_times(probe *p)
{
    probe_timings t;
    memset(&t, 0, sizeof t);
    time_creates(p, &t);
    time_run(p, &t);
    time_chunk(p, &t);
    char what[64];
    for (int s = 0; s < 3; s++) {
        snprintf(what, sizeof what, "of %zu page%s", probe_create_pages[s], probe_create_pages[s] > 1 ? "s" : "");
        probe_time_line(p, "cuMemCreate", what, &t.create[s]);
        probe_time_line(p, "cuMemRelease", what, &t.release[s]);
    }
    probe_time_line(p, "cuMemMap", "of 1 page", &t.map);
    probe_time_line(p, "cuMemSetAccess", "of 1 page", &t.access);
    snprintf(what, sizeof what, "of a run of %u one-page mappings", p->reps);
    probe_time_line(p, "cuMemSetAccess", what, &t.access_run);
    probe_time_line(p, "cuMemUnmap", "of 1 page", &t.unmap);
    probe_time_line(p, "cudaDeviceSynchronize", "of an idle device", &t.sync);
    if (t.create[0].n > 0 && t.map.n > 0 && t.unmap.n > 0 && t.access.n > 0 && t.sync.n > 0)
        fprintf(p->out,
                "vmm_probe: the replay's device-time model at these costs: gpupool replay --call-costs "
                "create=%.1f,map=%.1f,unmap=%.1f,access=%.1f,sync=%.1f\n",
                series_median(&t.create[0]), series_median(&t.map), series_median(&t.unmap),
                series_median(&t.access), series_median(&t.sync));
    snprintf(what, sizeof what, "of one %d-page mapping", PROBE_CHUNK_PAGES);
    probe_time_line(p, "cuMemMap", what, &t.chunk_map);
    probe_time_line(p, "cuMemSetAccess", what, &t.chunk_access);
    probe_time_line(p, "cuMemUnmap", what, &t.chunk_unmap);
}

static int probe_resolve(FILE *out)
{
    const char *why = "";
    probe_drv = gp_vmm_driver_get(&why);
    if (probe_drv == NULL)
        fprintf(out, "vmm_probe: no CUDA driver entry points: %s: nothing asked\n", why);
    return probe_drv != NULL;
}

/* Runs every question and the timings on the current device; returns the exit status (above). */
int vmm_probe_run(FILE *out, unsigned reps)
{
    probe p = {.out = out, .device = 0, .page = 0, .reps = reps, .failed = 0};
    if (p.reps < 1 || p.reps > PROBE_MAX_REPS) {
        fprintf(out, "vmm_probe: REPS must be 1-%d, not %u\n", PROBE_MAX_REPS, reps);
        return 1;
    }
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count < 1 || cudaSetDevice(0) != cudaSuccess ||
        cudaFree(NULL) != cudaSuccess) {
        fprintf(out, "vmm_probe: no usable CUDA device: nothing asked\n");
        return 77;
    }
    if (!probe_resolve(out))
        return 77;
    CUmemAllocationProp prop = gp_vmm_device_memory(p.device);
    size_t minimum = 0, recommended = 0;
    if (!probe_must(&p, probe_drv->get_allocation_granularity(&minimum, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
                    "cuMemGetAllocationGranularity(minimum)") ||
        !probe_must(&p, probe_drv->get_allocation_granularity(&recommended, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED),
                    "cuMemGetAllocationGranularity(recommended)"))
        return 1;
    p.page = minimum;
    fprintf(out, "vmm_probe: page (minimum granularity) %zu bytes, recommended %zu bytes\n", minimum, recommended);
    probe_offset_map(&p);
    probe_unmap_spans(&p);
    if (!p.failed)
        probe_times(&p);
    return p.failed ? 1 : 0;
}

#ifndef VMM_PROBE_NO_MAIN
int main(int argc, char **argv)
{
    unsigned long reps = 20;
    char *end = NULL;
    if (argc == 2)
        reps = strtoul(argv[1], &end, 10);
    if (argc > 2 || (argc == 2 && (end == argv[1] || *end != '\0' || reps > PROBE_MAX_REPS))) {
        fprintf(stderr, "usage: vmm_probe [REPS]  (1-%d, default 20), not '%s'\n", PROBE_MAX_REPS,
                argc >= 2 ? argv[1] : "");
        return 2;
    }
    return vmm_probe_run(stdout, (unsigned)reps);
}
#endif
