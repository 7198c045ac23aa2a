"""bench/gpu/torch_checks.py — short checks of gpupool under PyTorch on a real GPU, for run.sh.

    torch_checks.py trim       pause/resume keep a tenant's tensor contents (backend vmm), the time of
                               a pause while another model's kernels run (RESULT pause_beside_busy_ms=...,
                               against the same pause after torch.cuda.synchronize), and the time of a
                               trim that gives back 8 GiB of cached memory (RESULT trim_8gib_ms=...)
    torch_checks.py threads    three threads, each on its own stream, hand tensors to each other with
                               record_stream; every tensor's contents are checked after reuse

Each prints RESULT lines and exits 0 when every check passed. Needs gpupool installed as PyTorch's
allocator (it calls gpupool.torch.install() itself) and GPUPOOL_CONF (run.sh sets backend:vmm for trim).
"""
import sys
import threading
import time

import torch

import gpupool.torch as gt

GiB = 1 << 30


def pause_beside_busy_model():
    """Pauses model "m2" (64 MiB of weights) while model "busy" has about 300 ms of matmuls queued on a
    stream of its own: the pause waits for m2's streams only, so it should take far less than the
    busy model's queue; with synchronize=True (the whole device first) it takes the queue's time."""
    s = torch.cuda.Stream()
    gt.bind_stream(s, "busy")
    with torch.cuda.stream(s):
        a = torch.randn(4096, 4096, device="cuda")
    with gt.model("m2"):
        w = torch.arange(16 << 20, device="cuda", dtype=torch.float32)
    ref = float(w.sum())

    def queue(n):
        with torch.cuda.stream(s):
            for _ in range(n):
                a.copy_(a @ a * 1e-4)

    torch.cuda.synchronize()
    t0 = time.perf_counter()
    queue(10)
    s.synchronize()
    per = max((time.perf_counter() - t0) / 10, 1e-5)
    n = max(1, int(0.3 / per))
    times = {}
    for sync in (False, True):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        queue(n)
        queued = time.perf_counter()
        gt.pause("m2", synchronize=sync)
        paused = time.perf_counter()
        s.synchronize()
        done = time.perf_counter()
        gt.resume("m2")
        times[sync] = ((paused - queued) * 1000, (done - t0) * 1000)
    ok = float(w.sum()) == ref
    print("RESULT pause_beside_busy_ms=%.1f pause_after_device_sync_ms=%.1f busy_queue_ms=%.1f contents=%s"
          % (times[False][0], times[True][0], times[False][1], "ok" if ok else "CHANGED"), flush=True)
    del a, w
    return ok


def check_trim():
    gt.install()
    ok_busy = pause_beside_busy_model()
    with gt.model("m"):
        t = torch.arange(16 << 20, device="cuda", dtype=torch.float32)
    ref = float(t.sum())
    gt.pause("m")
    gt.resume("m")
    ok = float(t.sum()) == ref
    print("RESULT pause_resume_contents=%s" % ("ok" if ok else "CHANGED"), flush=True)
    del t
    blocks = [torch.empty(GiB // 2, dtype=torch.uint8, device="cuda") for _ in range(16)]  # 8 GiB
    del blocks
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    released = gt.empty_cache()
    ms = (time.perf_counter() - t0) * 1000
    print("RESULT trim_8gib_ms=%.1f released_bytes=%d" % (ms, released), flush=True)
    return ok and ok_busy and released >= 8 * GiB


def check_threads():
    gt.install()
    n = 1 << 22
    errors = []
    handoff = [None, None, None]
    ready = [threading.Event() for _ in range(3)]

    def worker(i):
        try:
            s = torch.cuda.Stream()
            with torch.cuda.stream(s):
                for round_ in range(50):
                    x = torch.full((n,), float(i * 1000 + round_), device="cuda")
                    if round_ == 25:  # hand one tensor to the next thread, used there on its stream
                        x.record_stream(s)
                        handoff[(i + 1) % 3] = (x, float(i * 1000 + round_))
                        ready[(i + 1) % 3].set()
                    y = x * 2
                    if float(y[0]) != 2 * float(i * 1000 + round_) or float(y[-1]) != float(y[0]):
                        errors.append("thread %d round %d: contents changed" % (i, round_))
                ready[i].wait(30)
                got = handoff[i]
                if got is not None:
                    other = torch.cuda.Stream()
                    got[0].record_stream(other)
                    with torch.cuda.stream(other):
                        z = got[0] + 0
                    other.synchronize()
                    if float(z[0]) != got[1]:
                        errors.append("thread %d: handed-over tensor changed" % i)
                s.synchronize()
        except Exception as e:  # noqa: BLE001 - reported
            errors.append("thread %d: %r" % (i, e))

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print("RESULT threads_streams=%s %s" % ("ok" if not errors else "FAILED", "; ".join(errors[:3])), flush=True)
    return not errors and gt.failures() == 0


if __name__ == "__main__":
    what = sys.argv[1] if len(sys.argv) > 1 else ""
    fn = {"trim": check_trim, "threads": check_threads}.get(what)
    if fn is None:
        print(__doc__)
        sys.exit(2)
    sys.exit(0 if fn() else 1)
