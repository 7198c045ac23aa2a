/*
 * conformance_capture.h — the graph capture case of conformance.c (included there).
 *
 * On the CUDA emulation: a capture on a stream the pool serves. The pool must call nothing illegal
 * (the capture stays valid: the emulation invalidates it and counts a violation otherwise), refuse the
 * capturing stream's allocations and frees with a message that says so, and memory allocated before
 * the capture must stay the graph's across replays with other allocations in between (contents
 * checked after each replay). Private pools per graph (so that a capture can allocate) are not built
 * yet: the refusal is what gpupool offers today.
 */
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
          "allocation during capture refused with a clear message: %d %s", rc, gp_last_error());
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
#else
    printf("     (capture: needs the CUDA emulation, or torch.cuda.graph in bench/gpu/run.sh)\n");
#endif
}
