"""gpupool.torch with real PyTorch on a real GPU. Skipped where PyTorch is not importable or sees no
GPU (CI); bench/gpu/run.sh runs it on the GPU machine.

install() must precede any CUDA work and can happen once per process, so each case runs a script in a
fresh interpreter and checks what it printed."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap
import unittest

from _support import PYTHON_DIR

HAVE_TORCH = importlib.util.find_spec("torch") is not None


def _cuda_available() -> bool:
    if not HAVE_TORCH:
        return False
    r = subprocess.run([sys.executable, "-c", "import torch; print(torch.cuda.is_available())"],
                       capture_output=True, text=True, timeout=120)
    return r.stdout.strip().endswith("True")


HAVE_GPU = _cuda_available()


def run_script(body: str, conf: str = "backend:cuda", timeout: int = 180) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env["PYTHONPATH"] = PYTHON_DIR + os.pathsep + env.get("PYTHONPATH", "")
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env["GPUPOOL_CONF"] = conf
    code = "import torch\nimport gpupool.torch as gt\nMiB = 1 << 20\n" + textwrap.dedent(body)
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=timeout)


@unittest.skipUnless(HAVE_TORCH, "PyTorch is not importable")
@unittest.skipUnless(HAVE_GPU, "PyTorch sees no CUDA device")
class Installed(unittest.TestCase):
    def check(self, r: subprocess.CompletedProcess, *expected: str) -> None:
        out = r.stdout + r.stderr
        self.assertEqual(r.returncode, 0, out)
        for e in expected:
            self.assertIn(e, r.stdout, out)

    def test_tensors_stats_hooks_and_streams(self):
        r = run_script("""
            gt.install()
            assert gt.is_installed()
            x = torch.randn(1024, 1024, device="cuda")
            y = x @ x
            torch.cuda.synchronize()
            s = gt.stats()
            assert s["backend"] == "cuda", s["backend"]
            assert s["allocated_bytes"] >= 8 * MiB, s
            assert s["num_allocs"] >= 2, s
            del x, y
            # cuBLAS keeps its workspace (32 MiB on sm90) allocated through the allocator after the
            # matmul; PyTorch frees it only on request.
            if hasattr(torch._C, "_cuda_clearCublasWorkspaces"):
                torch._C._cuda_clearCublasWorkspaces()
            torch.cuda.empty_cache()                      # the reset hook
            assert gt.stats()["reserved_bytes"] == 0, gt.memory_summary()
            print("EMPTY_CACHE_OK")

            side = torch.cuda.Stream()                    # the record_stream hook
            z = torch.ones(1 << 20, device="cuda")
            with torch.cuda.stream(side):
                w = z * 2
            z.record_stream(side)
            del z
            torch.cuda.synchronize()
            assert gt.failures() == 0, gt.last_error()
            assert float(w.sum()) == 2.0 * (1 << 20)
            print("RECORD_STREAM_OK")

            total = torch.cuda.get_device_properties(0).total_memory
            torch.cuda.set_per_process_memory_fraction(0.5)  # the memory fraction hook
            cap = gt.tenant_stats("default")["max"]
            assert abs(cap - total // 2) < 64 * MiB, (cap, total)
            torch.cuda.set_per_process_memory_fraction(1.0)
            assert gt.tenant_stats("default")["max"] == 0
            print("FRACTION_OK")

            s2 = torch.cuda.Stream()
            gt.bind_stream(s2, "svc")
            with torch.cuda.stream(s2):
                v = torch.empty(16 * MiB, dtype=torch.uint8, device="cuda")
            assert gt.tenant_stats("svc")["allocated_bytes"] >= 16 * MiB, gt.memory_summary()
            with gt.model("llama", max="1GiB"):
                u = torch.empty(32 * MiB, dtype=torch.uint8, device="cuda")
            assert gt.tenant_stats("llama")["allocated_bytes"] >= 32 * MiB
            assert "tenant llama" in gt.memory_summary()
            print("TENANTS_OK")
        """)
        self.check(r, "EMPTY_CACHE_OK", "RECORD_STREAM_OK", "FRACTION_OK", "TENANTS_OK")

    def test_install_after_cuda_work_is_a_clear_error(self):
        r = run_script("""
            torch.zeros(1, device="cuda")
            try:
                gt.install()
            except RuntimeError as e:
                print("REFUSED", "before any CUDA work" in str(e))
        """)
        self.check(r, "REFUSED True")

    def test_over_budget_in_an_installed_pool_raises_out_of_memory(self):
        # The issue asks for torch.cuda.OutOfMemoryError. PyTorch's CUDAPluggableAllocator (sources up
        # to 2.10) does not check the pointer its alloc function returns: a NULL becomes the tensor's
        # data pointer. torch.empty launches no kernel, so the probe is safe either way.
        r = run_script("""
            gt.install()
            torch.zeros(1, device="cuda")
            print("PROBE", gt.probe_out_of_memory())
            if gt.probe_out_of_memory() != "oom":
                print("NULL_DATA_PTR")
                raise SystemExit(0)
            try:
                with gt.model("small", max="64MiB"):
                    t = torch.empty(128 * MiB, dtype=torch.uint8, device="cuda")
                print("NULL_DATA_PTR" if t.data_ptr() == 0 else "NO_ERROR")
            except torch.cuda.OutOfMemoryError as e:
                print("OOM", "gpupool:" in str(e))
            except RuntimeError as e:
                print("RUNTIME_ERROR", e)
            print("LAST", gt.last_error())
        """)
        if "NULL_DATA_PTR" in r.stdout:
            # pytorch/pytorch#133280 (open): CUDAPluggableAllocator passes a NULL from the alloc
            # function on as the tensor's data pointer. Not gpupool's to fix; the mempool route
            # (test_mempool_route_raises_out_of_memory_and_others_go_on) is the supported one.
            self.skipTest("PyTorch %s hands gp_torch_malloc's NULL on as a tensor instead of raising "
                          "OutOfMemoryError (pytorch/pytorch#133280); use gpupool.torch.model(..., "
                          "mempool=True). Output: %s" % (torch_version(), r.stdout))
        self.check(r, "OOM True", "over budget")

    def test_mempool_route_raises_out_of_memory_and_others_go_on(self):
        r = run_script("""
            torch.zeros(1, device="cuda")               # native allocator: no install()
            with gt.model("m", max="64MiB", mempool=True):
                a = torch.empty(32 * MiB, dtype=torch.uint8, device="cuda")
                try:
                    b = torch.empty(64 * MiB, dtype=torch.uint8, device="cuda")
                    print("NO_ERROR", b.data_ptr())
                except torch.cuda.OutOfMemoryError as e:
                    print("OOM", "gpupool:" in str(e) or "over budget" in gt.last_error())
            t = gt.tenant_stats("m")
            assert t["held_bytes_peak"] <= 64 * MiB, t
            assert t["refusals"] >= 1, t
            c = torch.ones(256 * MiB, dtype=torch.uint8, device="cuda")   # others keep running
            assert int(c.sum()) == 256 * MiB
            print("OTHERS_OK")
        """)
        self.check(r, "OOM True", "OTHERS_OK")

    def test_graph_capture_allocates_from_a_private_pool_and_replays(self):
        r = run_script("""
            gt.install()
            x = torch.ones(1 << 20, device="cuda")
            torch.cuda.synchronize()
            g = torch.cuda.CUDAGraph()
            with gt.model("g"):                            # the graph pool is charged to model g
                with torch.cuda.graph(g):                  # begin/end-allocate-to-pool hooks
                    y = x * 2 + 1                          # allocated inside the capture
            st = gt.stats()
            charged = gt.tenant_stats("g")["graph_held_bytes"]
            assert charged > 0 and st["graph_pools"] == 1 and st["graph_allocated_bytes"] >= 4 << 20, (charged, st)
            assert torch.cuda.memory_reserved() == st["reserved_bytes"] + st["graph_reserved_bytes"], (
                torch.cuda.memory_reserved(), st["reserved_bytes"], st["graph_reserved_bytes"])
            print("GRAPH_CHARGED", charged)
            others = [torch.full((1 << 20,), 7.0, device="cuda") for _ in range(8)]
            for i in range(3):
                x.fill_(float(i))
                g.replay()
                torch.cuda.synchronize()
                assert float(y[0]) == 2 * i + 1, (i, float(y[0]))
                assert all(float(o[0]) == 7.0 for o in others), "a replay overwrote another tensor"
            print("REPLAYS_OK", gt.last_error())
            del g, y                                       # the release-pool hook
            torch.cuda.synchronize()
            print("RELEASED", gt.failures())
            print("GRAPH_HELD_AFTER", gt.tenant_stats("g")["graph_held_bytes"], gt.stats()["graph_pools"])
        """)
        self.check(r, "REPLAYS_OK", "RELEASED 0", "GRAPH_CHARGED", "GRAPH_HELD_AFTER 0 0")

    def test_pause_and_resume_keep_tensor_contents_on_vmm(self):
        r = run_script("""
            gt.install()
            with gt.model("m"):
                t = torch.arange(4 << 20, device="cuda", dtype=torch.float32)
                torch.cuda.synchronize()
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g):                  # its pool is m's, and pauses with m
                    y = t * 2
            g.replay()
            torch.cuda.synchronize()
            ref = float(t.sum())
            held = gt.tenant_stats("m")["held_bytes"]
            graph_held = gt.tenant_stats("m")["graph_held_bytes"]
            assert graph_held > 0, graph_held
            gt.pause("m")
            st = gt.tenant_stats("m")
            assert st["paused"] and st["held_bytes"] < held and st["graph_held_bytes"] < graph_held, st
            gt.resume("m")
            assert float(t.sum()) == ref
            assert float(y.sum()) == 2 * ref                # the graph's output, staged and restored
            t.fill_(1.0)
            g.replay()                                     # at the same addresses after the resume
            torch.cuda.synchronize()
            assert float(y.sum()) == 2.0 * t.numel(), float(y.sum())
            print("PAUSE_OK")
            print("GRAPH_AFTER_RESUME_OK")
        """, conf="backend:vmm")
        self.check(r, "PAUSE_OK", "GRAPH_AFTER_RESUME_OK")


@unittest.skipUnless(HAVE_TORCH, "PyTorch is not importable")
class WithoutAGpu(unittest.TestCase):
    def test_install_explains_what_is_missing(self):
        if HAVE_GPU:
            self.skipTest("a GPU is present: Installed covers install()")
        r = run_script("""
            try:
                gt.install()
                print("INSTALLED")
            except RuntimeError as e:
                print("REFUSED", e)
        """)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        # a CPU-only PyTorch has no pluggable allocator; a CUDA build without a device swaps it lazily
        self.assertTrue("built without CUDA" in r.stdout or "INSTALLED" in r.stdout, r.stdout + r.stderr)

    def test_gpupool_torch_reexports_the_package(self):
        r = run_script("print(gt.stats is __import__('gpupool').stats, gt.is_installed())")
        self.assertEqual(r.stdout.strip(), "True False", r.stdout + r.stderr)


def torch_version() -> str:
    r = subprocess.run([sys.executable, "-c", "import torch; print(torch.__version__)"],
                       capture_output=True, text=True, timeout=120)
    return r.stdout.strip()


if __name__ == "__main__":
    unittest.main()
