/*
 * conformance_capture.h — the graph capture case of conformance.c (included there).
 *
 * On the CUDA emulation: a capture on a stream the pool serves. The pool must call nothing illegal
 * (the capture stays valid: the emulation invalidates it and counts a violation otherwise), refuse the
 * capturing stream's allocations and frees with a message that says so, and memory allocated before
 * the capture must stay the graph's across replays with other allocations in between (contents
 * checked after each replay). Then the same inside a graph pool window (gp_graph_pool_begin/end):
 * the capture allocates from a private pool, frees inside it are reused inside it only, replays with
 * other allocations in between keep the graph's memory to the graph, and the release hook gives the
 * private pool back once its blocks are freed.
 */
static bool overlaps(void *a, size_t alen, void *b, size_t blen)
{
    return (uintptr_t)a < (uintptr_t)b + blen && (uintptr_t)b < (uintptr_t)a + alen;
}

static void capture_in_a_graph_pool(void)
{
#if CONF_EMU
    conf_dev d;
    if (open_dev(&d, 0, "") != GP_OK)
        return;
    gp_stream s = stream_new(&d), other = stream_new(&d);
    void *before = NULL, *g1 = NULL, *g2 = NULL, *g3 = NULL, *side = NULL;
    CHECK(POOL(gp_alloc(d.pool, &before, 4 * MIB, s)) == GP_OK, "alloc before: %s", gp_last_error());
    kernel(&d, s, before, 4 * MIB, GP_SIM_WRITE, 1, 100);
    void *pending = NULL; /* a cross-stream free: its event would be queried by the next allocation */
    CHECK(POOL(gp_alloc(d.pool, &pending, 2 * MIB, other)) == GP_OK, "alloc: %s", gp_last_error());
    CHECK(POOL(gp_record_stream(d.pool, pending, s)) == GP_OK, "record_stream");
    CHECK(POOL(gp_free(d.pool, pending, other)) == GP_OK, "free");
    CHECK(POOL(gp_graph_pool_begin(d.pool, 7)) == GP_OK, "begin: %s", gp_last_error());
    CHECK(POOL(gp_graph_pool_begin(d.pool, 8)) == GP_ERR_INVALID, "a second window is refused");
    CHECK(cudaStreamBeginCapture((cudaStream_t)s, cudaStreamCaptureModeGlobal) == cudaSuccess, "capture");
    CHECK(POOL(gp_alloc(d.pool, &g1, 5 * MIB, s)) == GP_OK, "alloc in capture: %s", gp_last_error());
    kernel(&d, s, g1, 5 * MIB, GP_SIM_WRITE, 11, 100);
    CHECK(POOL(gp_alloc(d.pool, &g2, 1 * MIB, s)) == GP_OK, "alloc in capture: %s", gp_last_error());
    kernel(&d, s, g2, 1 * MIB, GP_SIM_WRITE, 12, 100);
    CHECK(POOL(gp_free(d.pool, g2, s)) == GP_OK, "free in capture: %s", gp_last_error());
    CHECK(POOL(gp_alloc(d.pool, &g3, 1 * MIB, s)) == GP_OK, "alloc in capture: %s", gp_last_error());
    kernel(&d, s, g3, 1 * MIB, GP_SIM_WRITE, 13, 100); /* may reuse g2: ordered inside the graph */
    CHECK(POOL(gp_free(d.pool, before, s)) == GP_OK, "a pre-capture block freed in capture: deferred");
    CHECK(POOL(gp_alloc(d.pool, &side, 3 * MIB, other)) == GP_OK, "a non-capturing stream during the capture: %s",
          gp_last_error());
    CHECK(!overlaps(side, 3 * MIB, g1, 5 * MIB) && !overlaps(side, 3 * MIB, g3, MIB), "side got graph memory");
    CHECK(!overlaps(side, 3 * MIB, before, 4 * MIB), "the deferred free was reused during the capture");
    kernel(&d, other, side, 3 * MIB, GP_SIM_WRITE, 14, 100);
    cudaGraph_t graph = NULL;
    cudaGraphExec_t exec = NULL;
    CHECK(cudaStreamEndCapture((cudaStream_t)s, &graph) == cudaSuccess && graph != NULL, "a valid graph");
    CHECK(POOL(gp_graph_pool_end(d.pool, 7)) == GP_OK, "end: %s", gp_last_error());
    CHECK(cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess, "instantiate");
    for (int replay = 0; replay < 3; replay++) {
        void *q[6] = {0};
        for (int i = 0; i < 6; i++) {
            CHECK(POOL(gp_alloc(d.pool, &q[i], (size_t)(i + 1) * MIB, i % 2 ? s : other)) == GP_OK, "alloc: %s",
                  gp_last_error());
            CHECK(!overlaps(q[i], (size_t)(i + 1) * MIB, g1, 5 * MIB) && !overlaps(q[i], (size_t)(i + 1) * MIB, g3, MIB),
                  "graph memory handed out after the capture");
            kernel(&d, i % 2 ? s : other, q[i], (size_t)(i + 1) * MIB, GP_SIM_WRITE, 500 + (uint64_t)i, 10);
        }
        stream_sync(&d, other);
        CHECK(cudaGraphLaunch(exec, (cudaStream_t)s) == cudaSuccess, "replay");
        kernel(&d, s, g1, 5 * MIB, GP_SIM_CHECK, 11, 10);
        kernel(&d, s, g3, 1 * MIB, GP_SIM_CHECK, 13, 10);
        for (int i = 0; i < 6; i++) {
            kernel(&d, i % 2 ? s : other, q[i], (size_t)(i + 1) * MIB, GP_SIM_CHECK, 500 + (uint64_t)i, 10);
            CHECK(POOL(gp_free(d.pool, q[i], i % 2 ? s : other)) == GP_OK, "free");
        }
        stream_sync(&d, s);
    }
    CHECK(cudaGraphExecDestroy(exec) == cudaSuccess && cudaGraphDestroy(graph) == cudaSuccess, "graph gone");
    CHECK(POOL(gp_graph_pool_release(d.pool, 7)) == GP_OK, "release: %s", gp_last_error());
    CHECK(POOL(gp_free(d.pool, g1, s)) == GP_OK, "free of a graph block after release: %s", gp_last_error());
    CHECK(POOL(gp_free(d.pool, g3, s)) == GP_OK, "free of a graph block after release: %s", gp_last_error());
    CHECK(POOL(gp_free(d.pool, side, other)) == GP_OK, "free");
    CHECK(POOL(gp_graph_pool_release(d.pool, 7)) == GP_ERR_INVALID, "the graph pool is gone");
    CHECK(POOL(gp_check(d.pool)) == GP_OK, "gp_check: %s", gp_last_error());
    sync_dev(&d);
    CHECK(mismatches(&d) == 0, "graph memory was disturbed");
    close_dev(&d, true);
#endif
}

static gp_tenant_stats tenant_now(conf_dev *d, const char *name)
{
    gp_tenant_stats t = {.size = sizeof t, .version = GP_TENANT_STATS_VERSION};
    CHECK(POOL(gp_tenant_get_stats(d->pool, name, &t)) == GP_OK, "tenant stats: %s", gp_last_error());
    return t;
}

static gp_stats stats_now(conf_dev *d)
{
    gp_stats st = {.size = sizeof st, .version = GP_STATS_VERSION};
    CHECK(POOL(gp_get_stats(d->pool, &st)) == GP_OK, "stats: %s", gp_last_error());
    return st;
}

/* Per-model budgets with CUDA graphs: a graph pool's memory is the capturing tenant's (its graph_held),
 * counted against its max both inside the capture (refused before any device call, so the capture stays
 * valid) and outside it; the pool's stats keep it apart (graph_*), gp_get_breakdown (what
 * torch.cuda.memory_stats reports) counts it as PyTorch does, and releasing the graph pool gives the
 * tenant its budget back. */
static void capture_charged_to_its_tenant(void)
{
#if CONF_EMU
    conf_dev d;
    if (open_dev(&d, 0, "") != GP_OK)
        return;
    gp_stream s = stream_new(&d);
    CHECK(POOL(gp_tenant_create(d.pool, "m", NULL)) == GP_OK, "tenant: %s", gp_last_error());
    CHECK(POOL(gp_tenant_push(d.pool, "m")) == GP_OK, "push: %s", gp_last_error());
    void *own = NULL, *g1 = NULL, *g2 = NULL, *big = NULL;
    CHECK(POOL(gp_alloc(d.pool, &own, 4 * MIB, s)) == GP_OK, "alloc: %s", gp_last_error());
    size_t own_held = tenant_now(&d, "m").held_bytes;

    CHECK(POOL(gp_graph_pool_begin(d.pool, 3)) == GP_OK, "begin: %s", gp_last_error());
    CHECK(cudaStreamBeginCapture((cudaStream_t)s, cudaStreamCaptureModeGlobal) == cudaSuccess, "capture");
    CHECK(POOL(gp_alloc(d.pool, &g1, 2 * MIB, s)) == GP_OK, "alloc in capture: %s", gp_last_error());
    kernel(&d, s, g1, 2 * MIB, GP_SIM_WRITE, 31, 100);
    cudaGraph_t graph = NULL;
    CHECK(cudaStreamEndCapture((cudaStream_t)s, &graph) == cudaSuccess && graph != NULL, "a valid graph");
    CHECK(POOL(gp_graph_pool_end(d.pool, 3)) == GP_OK, "end: %s", gp_last_error());
    gp_tenant_stats m = tenant_now(&d, "m");
    gp_stats st = stats_now(&d);
    CHECK(m.held_bytes == own_held && m.graph_held_bytes > 0, "the graph's memory is m's graph_held: held %llu -> "
          "%llu, graph_held %llu", (unsigned long long)own_held, (unsigned long long)m.held_bytes,
          (unsigned long long)m.graph_held_bytes);
    CHECK(tenant_now(&d, "default").graph_held_bytes == 0, "charged to the capturing tenant only");
    CHECK(st.graph_pools == 1 && st.graph_allocated_bytes >= 2 * MIB && st.graph_reserved_bytes >= m.graph_held_bytes,
          "gp_stats: %llu graph pools, %llu allocated, %llu reserved", (unsigned long long)st.graph_pools,
          (unsigned long long)st.graph_allocated_bytes, (unsigned long long)st.graph_reserved_bytes);
    CHECK(st.reserved_bytes + st.graph_reserved_bytes > st.reserved_bytes && st.allocated_bytes < 4 * MIB + 2 * MIB,
          "the pool's own figures leave the graph's out");
    gp_breakdown b = {.size = sizeof b, .version = GP_BREAKDOWN_VERSION};
    CHECK(POOL(gp_get_breakdown(d.pool, &b)) == GP_OK, "breakdown: %s", gp_last_error());
    CHECK(b.small.reserved_bytes + b.large.reserved_bytes == st.reserved_bytes + st.graph_reserved_bytes &&
              b.small.allocated_bytes + b.large.allocated_bytes == st.allocated_bytes + st.graph_allocated_bytes,
          "the breakdown counts the graph pool as PyTorch's memory_stats do");

    /* m's max now leaves no room: a second capture into the same pool, and m's own growth, are refused */
    gp_tenant_limits at = {.max = m.held_bytes + m.graph_held_bytes};
    CHECK(POOL(gp_tenant_set_limits(d.pool, "m", &at)) == GP_OK, "limits: %s", gp_last_error());
    CHECK(POOL(gp_graph_pool_begin(d.pool, 3)) == GP_OK, "begin again: %s", gp_last_error());
    CHECK(cudaStreamBeginCapture((cudaStream_t)s, cudaStreamCaptureModeGlobal) == cudaSuccess, "capture");
    int rc = POOL(gp_alloc(d.pool, &g2, 64 * MIB, s));
    CHECK(rc == GP_ERR_QUOTA && g2 == NULL && strstr(gp_last_error(), "'m'") != NULL &&
              strstr(gp_last_error(), "CUDA graph") != NULL,
          "a capture past the capturing tenant's max is refused, saying so: %d %s", rc, gp_last_error());
    enum cudaStreamCaptureStatus status;
    CHECK(cudaStreamIsCapturing((cudaStream_t)s, &status) == cudaSuccess && status == cudaStreamCaptureStatusActive,
          "the refusal made no call that invalidated the capture");
    cudaGraph_t second = NULL;
    CHECK(cudaStreamEndCapture((cudaStream_t)s, &second) == cudaSuccess && second != NULL, "a valid graph");
    CHECK(POOL(gp_graph_pool_end(d.pool, 3)) == GP_OK, "end: %s", gp_last_error());
    rc = POOL(gp_alloc(d.pool, &big, 64 * MIB, s));
    CHECK(rc == GP_ERR_QUOTA && big == NULL && strstr(gp_last_error(), "graphs' pools") != NULL,
          "m's own growth counts its graphs' memory: %d %s", rc, gp_last_error());

    /* the graphs go: their pool is released, and m's budget with it */
    CHECK(cudaGraphDestroy(graph) == cudaSuccess && cudaGraphDestroy(second) == cudaSuccess, "graphs destroyed");
    CHECK(POOL(gp_free(d.pool, g1, s)) == GP_OK, "free of the graph's block: %s", gp_last_error());
    CHECK(POOL(gp_graph_pool_release(d.pool, 3)) == GP_OK, "release: %s", gp_last_error());
    m = tenant_now(&d, "m");
    st = stats_now(&d);
    CHECK(m.graph_held_bytes == 0 && st.graph_pools == 0 && st.graph_reserved_bytes == 0,
          "released: graph_held %llu, %llu graph pools", (unsigned long long)m.graph_held_bytes,
          (unsigned long long)st.graph_pools);
    CHECK(POOL(gp_free(d.pool, own, s)) == GP_OK, "free");
    CHECK(POOL(gp_tenant_pop(d.pool)) == GP_OK, "pop");
    CHECK(POOL(gp_check(d.pool)) == GP_OK, "gp_check: %s", gp_last_error());
    close_dev(&d, true);
#endif
}

/* A model m with a 4 MiB tensor of its own (pattern seed) and a CUDA graph captured in its name into graph
 * pool `id`, whose kernel writes a 3 MiB buffer of the graph's (pattern seed + 1) at every replay;
 * replayed once. */
typedef struct model_graph {
    gp_stream s;
    uint64_t id, seed;
    void *own, *g;
    cudaGraph_t graph;
    cudaGraphExec_t exec;
} model_graph;

static model_graph model_with_graph(conf_dev *d, uint64_t id, uint64_t seed)
{
    model_graph m = {.s = stream_new(d), .id = id, .seed = seed};
    CHECK(POOL(gp_tenant_create(d->pool, "m", NULL)) == GP_OK && POOL(gp_tenant_push(d->pool, "m")) == GP_OK, "m");
    CHECK(POOL(gp_alloc(d->pool, &m.own, 4 * MIB, m.s)) == GP_OK, "alloc: %s", gp_last_error());
    kernel(d, m.s, m.own, 4 * MIB, GP_SIM_WRITE, seed, 100);
    CHECK(POOL(gp_graph_pool_begin(d->pool, id)) == GP_OK, "begin: %s", gp_last_error());
    CHECK(cudaStreamBeginCapture((cudaStream_t)m.s, cudaStreamCaptureModeGlobal) == cudaSuccess, "capture");
    CHECK(POOL(gp_alloc(d->pool, &m.g, 3 * MIB, m.s)) == GP_OK, "alloc in capture: %s", gp_last_error());
    kernel(d, m.s, m.g, 3 * MIB, GP_SIM_WRITE, seed + 1, 100); /* every replay writes it */
    CHECK(cudaStreamEndCapture((cudaStream_t)m.s, &m.graph) == cudaSuccess && m.graph != NULL, "a valid graph");
    CHECK(POOL(gp_graph_pool_end(d->pool, id)) == GP_OK, "end: %s", gp_last_error());
    CHECK(cudaGraphInstantiate(&m.exec, m.graph, 0) == cudaSuccess, "instantiate");
    CHECK(cudaGraphLaunch(m.exec, (cudaStream_t)m.s) == cudaSuccess, "replay");
    stream_sync(d, m.s);
    return m;
}

/* Both patterns are intact, and the graph replays (rewriting its buffer, checked again). */
static void model_graph_intact(conf_dev *d, const model_graph *m)
{
    kernel(d, m->s, m->own, 4 * MIB, GP_SIM_CHECK, m->seed, 10);
    kernel(d, m->s, m->g, 3 * MIB, GP_SIM_CHECK, m->seed + 1, 10);
    CHECK(cudaGraphLaunch(m->exec, (cudaStream_t)m->s) == cudaSuccess, "replay");
    kernel(d, m->s, m->g, 3 * MIB, GP_SIM_CHECK, m->seed + 1, 10);
    stream_sync(d, m->s);
}

/* The graph destroyed, its pool released, m's tensor freed; the pool checked and closed. */
static void model_graph_close(conf_dev *d, model_graph *m)
{
    CHECK(cudaGraphExecDestroy(m->exec) == cudaSuccess && cudaGraphDestroy(m->graph) == cudaSuccess, "graph gone");
    CHECK(POOL(gp_free(d->pool, m->g, m->s)) == GP_OK && POOL(gp_graph_pool_release(d->pool, m->id)) == GP_OK,
          "release: %s", gp_last_error());
    CHECK(POOL(gp_free(d->pool, m->own, m->s)) == GP_OK && POOL(gp_tenant_pop(d->pool)) == GP_OK, "free");
    CHECK(POOL(gp_check(d->pool)) == GP_OK, "gp_check: %s", gp_last_error());
    sync_dev(d);
    CHECK(mismatches(d) == 0, "contents changed across the pause");
    close_dev(d, true);
}

/* torch_memory_saver's promise, for gpupool: pausing a model gives its CUDA graphs' memory back too,
 * and after the resume the graph replays at the same addresses, its buffers' contents kept (virtual
 * memory backends). A pause while a graph is being captured is refused, since waiting for a stream
 * would break the capture. */
static void capture_pauses_with_its_tenant(void)
{
#if CONF_EMU
    if (!vmm)
        return;
    conf_dev d;
    if (open_dev(&d, 0, "") != GP_OK)
        return;
    model_graph m = model_with_graph(&d, 9, 41);
    size_t graph_held = tenant_now(&d, "m").graph_held_bytes;
    CHECK(graph_held > 0, "the graph pool is m's");

    CHECK(POOL(gp_graph_pool_begin(d.pool, 10)) == GP_OK, "begin: %s", gp_last_error());
    int rc = POOL(gp_tenant_pause(d.pool, "m", GP_PAUSE_KEEP_CONTENTS));
    CHECK(rc == GP_ERR_INVALID && strstr(gp_last_error(), "being captured") != NULL,
          "a pause while a graph pool window is open is refused: %d %s", rc, gp_last_error());
    CHECK(POOL(gp_graph_pool_end(d.pool, 10)) == GP_OK && POOL(gp_graph_pool_release(d.pool, 10)) == GP_OK, "end");

    CHECK(POOL(gp_tenant_pause(d.pool, "m", GP_PAUSE_KEEP_CONTENTS)) == GP_OK, "pause: %s", gp_last_error());
    gp_stats st = stats_now(&d);
    CHECK(tenant_now(&d, "m").graph_held_bytes == 0 && st.graph_reserved_bytes == 0,
          "paused: the graph pool holds no device memory (graph_held %llu, graph reserved %llu)",
          (unsigned long long)tenant_now(&d, "m").graph_held_bytes, (unsigned long long)st.graph_reserved_bytes);
    CHECK(POOL(gp_tenant_resume(d.pool, "m")) == GP_OK, "resume: %s", gp_last_error());
    CHECK(tenant_now(&d, "m").graph_held_bytes == graph_held, "resumed: the graph pool holds %zu again", graph_held);
    rc = POOL(gp_tenant_resume(d.pool, "m"));
    CHECK(rc == GP_ERR_INVALID && strstr(gp_last_error(), "not paused") != NULL, "a second resume: %d", rc);
    model_graph_intact(&d, &m); /* staged and restored, and the graph replays at the same addresses */
    model_graph_close(&d, &m);
#endif
}

/* The pause (at_resume false) or the resume of a model with a graph pool, with the nth device call of
 * it failing, for every n it makes: whatever it returns, resuming until the model is not paused (a
 * graph pool left paused takes a second resume) brings the model and its graph pool back with their
 * contents, and the graph replays. */
static void capture_pause_fault_sweep(bool at_resume)
{
#if CONF_EMU
    if (!vmm)
        return;
    int runs = 0;
    for (uint64_t n = 1; n < 200; n++) {
        conf_dev d;
        if (open_dev(&d, 0, "") != GP_OK)
            return;
        model_graph mg = model_with_graph(&d, 4, 51);
        size_t graph_held = tenant_now(&d, "m").graph_held_bytes, held = tenant_now(&d, "m").held_bytes;

        if (at_resume)
            CHECK(POOL(gp_tenant_pause(d.pool, "m", GP_PAUSE_KEEP_CONTENTS)) == GP_OK, "pause: %s", gp_last_error());
        gp_sim_fail_call(d.sim, n, GP_SIM_CALL_ALL, n % 3 == 0 ? GP_ERR_OOM : GP_ERR_DEVICE);
        int rc = at_resume ? gp_tenant_resume(d.pool, "m") : gp_tenant_pause(d.pool, "m", GP_PAUSE_KEEP_CONTENTS);
        uint64_t injected = gp_sim_faults_injected(d.sim);
        gp_sim_fail_call(d.sim, 0, 0, 0);
        CHECK(rc == GP_OK || gp_last_error()[0] != '\0', "a failed pause or resume says why");
        if (!at_resume && rc != GP_OK && strstr(gp_last_error(), "rolled back") != NULL &&
            strstr(gp_last_error(), "failed too") == NULL)
            CHECK(!tenant_now(&d, "m").paused && tenant_now(&d, "m").graph_held_bytes == graph_held,
                  "fault #%llu: a pause that says it was rolled back changed nothing: %s", (unsigned long long)n,
                  gp_last_error());
        for (int tries = 0; tries < 3 && gp_tenant_resume(d.pool, "m") == GP_OK; tries++)
            ;
        gp_tenant_stats m = tenant_now(&d, "m");
        CHECK(!m.paused && m.graph_held_bytes == graph_held && m.held_bytes == held,
              "fault #%llu: after resume: paused %d, graph_held %llu of %zu, held %llu of %zu", (unsigned long long)n,
              m.paused, (unsigned long long)m.graph_held_bytes, graph_held, (unsigned long long)m.held_bytes, held);
        model_graph_intact(&d, &mg);
        model_graph_close(&d, &mg);
        if (injected == 0)
            break;
        runs++;
    }
    printf("     (%s with a graph pool: %d runs, one injected fault each)\n", at_resume ? "resume" : "pause", runs);
    CHECK(runs > 5, "it reached only %d device calls", runs);
#endif
}

static void case_capture(void)
{
#if CONF_EMU
    if (!cuda_api) {
        printf("     (capture: the sims have no graph capture)\n");
        return;
    }
    conf_dev d;
    if (open_dev(&d, 0, "") != GP_OK)
        return;
    gp_stream s = stream_new(&d), other = stream_new(&d);
    void *buf = NULL, *tmp = NULL;
    CHECK(POOL(gp_alloc(d.pool, &buf, 6 * MIB, s)) == GP_OK, "alloc before capture: %s", gp_last_error());
    CHECK(cudaStreamBeginCapture((cudaStream_t)s, cudaStreamCaptureModeGlobal) == cudaSuccess, "begin capture");
    int rc = POOL(gp_alloc(d.pool, &tmp, 2 * MIB, s));
    CHECK(rc == GP_ERR_INVALID && tmp == NULL && strstr(gp_last_error(), "capturing") != NULL,
          "allocation during capture, no window: refused with a clear message: %d %s", rc, gp_last_error());
    CHECK(POOL(gp_free(d.pool, buf, s)) == GP_ERR_INVALID, "free on the capturing stream refused");
    kernel(&d, s, buf, 6 * MIB, GP_SIM_WRITE, 5, 1000); /* captured */
    enum cudaStreamCaptureStatus status;
    CHECK(cudaStreamIsCapturing((cudaStream_t)s, &status) == cudaSuccess && status == cudaStreamCaptureStatusActive,
          "the pool made no call that invalidated the capture");
    cudaGraph_t graph = NULL;
    cudaGraphExec_t exec = NULL;
    CHECK(cudaStreamEndCapture((cudaStream_t)s, &graph) == cudaSuccess && graph != NULL, "a valid graph");
    CHECK(cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess, "instantiate");
    for (int replay = 0; replay < 3; replay++) {
        void *q[4] = {0};
        for (int i = 0; i < 4; i++) { /* other allocations between replays, on another stream */
            CHECK(POOL(gp_alloc(d.pool, &q[i], 3 * MIB, other)) == GP_OK, "alloc between replays: %s", gp_last_error());
            CHECK(q[i] != buf, "the graph's memory was handed out again");
            kernel(&d, other, q[i], 3 * MIB, GP_SIM_WRITE, 900 + (uint64_t)i, 100);
        }
        CHECK(cudaGraphLaunch(exec, (cudaStream_t)s) == cudaSuccess, "replay %d", replay);
        kernel(&d, s, buf, 6 * MIB, GP_SIM_CHECK, 5, 10);
        for (int i = 0; i < 4; i++) {
            kernel(&d, other, q[i], 3 * MIB, GP_SIM_CHECK, 900 + (uint64_t)i, 10);
            CHECK(POOL(gp_free(d.pool, q[i], other)) == GP_OK, "free");
        }
    }
    CHECK(cudaGraphExecDestroy(exec) == cudaSuccess && cudaGraphDestroy(graph) == cudaSuccess, "graph destroyed");
    CHECK(POOL(gp_free(d.pool, buf, s)) == GP_OK, "free after the graph is gone: %s", gp_last_error());
    sync_dev(&d);
    CHECK(mismatches(&d) == 0, "replays and other allocations disturbed each other's contents");
    close_dev(&d, true);
    capture_in_a_graph_pool();
    capture_charged_to_its_tenant();
    capture_pauses_with_its_tenant();
    capture_pause_fault_sweep(false);
    capture_pause_fault_sweep(true);
#else
    printf("     (capture: needs the CUDA emulation, or torch.cuda.graph in bench/gpu/run.sh)\n");
#endif
}
