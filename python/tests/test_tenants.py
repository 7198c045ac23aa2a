"""Tenants from Python: model() budgets, bind_stream(), stats(), memory_summary(), trim(), pause and
resume, all on the simulated GPU through the same entry points PyTorch calls."""

from __future__ import annotations

import ctypes
import threading
import unittest

from _support import MiB, SimTestCase, gpupool, sim_call, sim_of


class Budgets(SimTestCase):
    def test_model_charges_its_tenant_and_refuses_past_max(self):
        with gpupool.model("llama", max="64MiB") as name:
            self.assertEqual(name, "llama")
            a = self.malloc(32 * MiB)
            self.assertTrue(a, gpupool.last_error())
            self.assertIsNone(self.malloc(48 * MiB))
        msg = gpupool.last_error()
        self.assertIn("llama", msg)
        self.assertIn("64.0 MiB", msg)
        t = gpupool.stats()["tenants"]["llama"]
        self.assertEqual(t["refusals"], 1)
        self.assertEqual(t["max"], 64 * MiB)
        self.assertEqual(t["allocated_bytes"], 32 * MiB)
        self.assertLessEqual(t["held_bytes"], 64 * MiB)
        # outside the block: the default tenant, which has no limit
        b = self.malloc(48 * MiB)
        self.assertTrue(b, gpupool.last_error())
        self.assertEqual(gpupool.tenant_stats("default")["allocated_bytes"], 48 * MiB)

    def test_tenants_sum_to_the_pool(self):
        with gpupool.model("a"):
            self.malloc(10 * MiB)
        with gpupool.model("b"):
            self.malloc(3 * MiB)
        self.malloc(MiB)
        s = gpupool.stats()
        self.assertEqual(sum(t["allocated_bytes"] for t in s["tenants"].values()), s["allocated_bytes"])
        self.assertLessEqual(sum(t["held_bytes"] for t in s["tenants"].values()), s["reserved_bytes"])
        self.assertEqual(gpupool.tenants(), ["default", "a", "b"])
        # no CUDA graph captured (the sims never capture): nothing in graph pools, in both views
        self.assertEqual((s["graph_pools"], s["graph_reserved_bytes"], s["graph_allocated_bytes"]), (0, 0, 0))
        self.assertTrue(all(t["graph_held_bytes"] == 0 for t in s["tenants"].values()))
        self.assertEqual(gpupool.tenant_stats("a")["graph_held_bytes"], 0)

    def test_models_nest_and_pop_back(self):
        with gpupool.model("outer"):
            with gpupool.model("inner"):
                self.malloc(MiB)
            self.malloc(2 * MiB)
        self.assertEqual(gpupool.tenant_stats("inner")["allocated_bytes"], MiB)
        self.assertEqual(gpupool.tenant_stats("outer")["allocated_bytes"], 2 * MiB)

    def test_model_pops_when_the_body_raises(self):
        with self.assertRaises(KeyError):
            with gpupool.model("x"):
                raise KeyError("boom")
        self.malloc(MiB)
        self.assertEqual(gpupool.tenant_stats("x")["allocated_bytes"], 0)
        self.assertEqual(gpupool.tenant_stats("default")["allocated_bytes"], MiB)

    def test_limits_given_later_update_the_tenant_and_none_keeps_them(self):
        with gpupool.model("m", max="64MiB", high="48MiB"):
            pass
        with gpupool.model("m"):
            pass
        t = gpupool.tenant_stats("m")
        self.assertEqual((t["max"], t["high"], t["min"]), (64 * MiB, 48 * MiB, 0))
        gpupool.set_limits("m", max=128 * MiB)
        t = gpupool.tenant_stats("m")
        self.assertEqual((t["max"], t["high"]), (128 * MiB, 48 * MiB))
        with gpupool.model("m", max=0):  # 0 removes the limit
            pass
        self.assertEqual(gpupool.tenant_stats("m")["max"], 0)

    def test_bad_limits_and_names_raise(self):
        with self.assertRaises(gpupool.GpupoolError) as cm:
            gpupool.set_limits("m", max="10MiB", min="20MiB")
        self.assertEqual(cm.exception.code, -1)
        self.assertIn("m", str(cm.exception))
        with self.assertRaises(gpupool.GpupoolError):
            with gpupool.model("x" * 80):
                pass
        with self.assertRaises(ValueError):
            gpupool.set_limits("m", max="ten gigs")

    def test_the_tenant_is_per_thread_and_frees_credit_the_owner(self):
        inside = threading.Event()
        done = threading.Event()
        got = {}

        def worker():
            with gpupool.model("worker"):
                got["p"] = self.lib.gp_torch_malloc(8 * MiB, 0, None)
                inside.set()
                done.wait(10)

        t = threading.Thread(target=worker)
        t.start()
        self.assertTrue(inside.wait(10))
        mine = self.malloc(2 * MiB)  # this thread has no current tenant: "default"
        done.set()
        t.join()
        self.assertEqual(gpupool.tenant_stats("worker")["allocated_bytes"], 8 * MiB)
        self.assertEqual(gpupool.tenant_stats("default")["allocated_bytes"], 2 * MiB)
        # freed here, on another thread outside any model(): still credited to "worker"
        self.lib.gp_torch_free(got["p"], 0, 0, None)
        self.assertEqual(gpupool.tenant_stats("worker")["allocated_bytes"], 0)
        self.free(mine)

    def test_bound_streams_charge_their_tenant_unless_the_thread_has_one(self):
        svc = 0x4242
        gpupool.bind_stream(svc, "svc")
        a = self.malloc(4 * MiB, stream=svc)
        self.assertEqual(gpupool.tenant_stats("svc")["allocated_bytes"], 4 * MiB)
        with gpupool.model("other"):
            b = self.malloc(MiB, stream=svc)
        self.assertEqual(gpupool.tenant_stats("other")["allocated_bytes"], MiB)
        gpupool.bind_stream(svc, None)
        c = self.malloc(2 * MiB, stream=svc)
        self.assertEqual(gpupool.tenant_stats("default")["allocated_bytes"], 2 * MiB)
        for p in (a, b, c):
            self.free(p, stream=svc)

    def test_bind_stream_takes_objects_with_a_cuda_stream_attribute(self):
        class FakeTorchStream:
            cuda_stream = 0x5151

        gpupool.bind_stream(FakeTorchStream(), "fake")
        p = self.malloc(MiB, stream=0x5151)
        self.assertEqual(gpupool.tenant_stats("fake")["allocated_bytes"], MiB)
        self.free(p, stream=0x5151)
        with self.assertRaises(TypeError):
            gpupool.bind_stream(object(), "fake")


class StatsAndTrim(SimTestCase):
    def test_stats_is_a_dict_with_the_gp_stats_keys(self):
        self.malloc(3 * MiB)
        s = gpupool.stats()
        for key in ("allocated_bytes", "allocated_bytes_peak", "reserved_bytes", "reserved_bytes_peak",
                    "cached_bytes", "num_device_allocs", "num_device_frees", "num_ooms", "segments",
                    "size_class_allocs", "tenants"):
            self.assertIn(key, s)
        self.assertEqual(s["allocated_bytes"] + s["cached_bytes"], s["reserved_bytes"])
        self.assertIsInstance(s["tenants"]["default"], dict)
        d = s["tenants"]["default"]
        self.assertEqual(d["held_bytes_peak"], gpupool.tenant_stats("default")["held_bytes_peak"])

    def test_memory_summary_is_text_naming_the_tenants(self):
        with gpupool.model("llama", max="64MiB"):
            self.malloc(MiB)
        text = gpupool.memory_summary()
        self.assertIn("backend sim", text)
        self.assertIn("tenant llama", text)
        self.assertIn("max 64.0 MiB", text)

    def test_trim_returns_what_it_gave_back(self):
        p = self.malloc(30 * MiB)
        self.free(p)
        reserved = gpupool.stats()["reserved_bytes"]
        released = gpupool.trim()
        self.assertEqual(released, reserved)
        self.assertEqual(gpupool.stats()["reserved_bytes"], 0)
        self.assertEqual(gpupool.trim(), 0)

    def test_trim_can_keep_some_cache(self):
        for n in (12, 14, 16):
            self.free(self.malloc(n * MiB))
        gpupool.trim(keep="20MiB")
        self.assertLessEqual(gpupool.stats()["cached_bytes"], 20 * MiB)

    def test_check_and_config_help(self):
        self.malloc(MiB)
        gpupool.check()
        self.assertIn("device_memory", gpupool.config_help())


class PauseOnSim(SimTestCase):
    def test_pause_needs_a_virtual_memory_backend(self):
        with gpupool.model("m"):
            self.malloc(MiB)
        with self.assertRaises(gpupool.GpupoolError) as cm:
            gpupool.pause("m")
        self.assertIn("virtual memory", str(cm.exception))


class PauseOnSimVmm(SimTestCase):
    CONF = "backend:sim-vmm,device_memory:256MiB"

    def test_pause_releases_memory_refuses_allocations_and_resume_restores_contents(self):
        lib = self.lib
        with gpupool.model("m"):
            p = self.malloc(8 * MiB)
        self.assertTrue(p, gpupool.last_error())
        # write a pattern with a simulated kernel, pause keeping contents, resume, check the pattern
        sim = sim_of(gpupool._pool())
        self.assertTrue(sim)
        launch = sim_call("gp_sim_launch", ctypes.c_int,
                          [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                           ctypes.c_uint64, ctypes.c_uint64])
        sync = sim_call("gp_sim_synchronize", None, [ctypes.c_void_p])
        violation = sim_call("gp_sim_first_violation", ctypes.c_char_p, [ctypes.c_void_p])
        GP_SIM_WRITE, GP_SIM_CHECK = 1, 2
        self.assertEqual(launch(sim, None, p, 8 * MiB, GP_SIM_WRITE, 77, 1000), 0)
        sync(sim)
        held = gpupool.tenant_stats("m")["held_bytes"]
        self.assertGreaterEqual(held, 8 * MiB)

        gpupool.pause("m", keep_contents=True)
        t = gpupool.tenant_stats("m")
        self.assertTrue(t["paused"])
        self.assertEqual(t["pauses"], 1)
        self.assertLess(t["held_bytes"], held)
        with gpupool.model("m"):
            self.assertIsNone(lib.gp_torch_malloc(MiB, 0, None))
        self.assertIn("paused", gpupool.last_error())
        other = self.malloc(MiB)  # other tenants go on
        self.assertTrue(other, gpupool.last_error())

        gpupool.resume("m")
        self.assertFalse(gpupool.tenant_stats("m")["paused"])
        self.assertEqual(launch(sim, None, p, 8 * MiB, GP_SIM_CHECK, 77, 1000), 0)
        sync(sim)
        self.assertEqual(violation(sim), b"")
        with gpupool.model("m"):
            q = self.malloc(MiB)
        self.assertTrue(q, gpupool.last_error())

    def test_pause_twice_and_resume_unpaused_raise(self):
        with gpupool.model("m"):
            self.malloc(MiB)
        gpupool.pause("m", keep_contents=False)
        with self.assertRaises(gpupool.GpupoolError):
            gpupool.pause("m")
        gpupool.resume("m")
        with self.assertRaises(gpupool.GpupoolError):
            gpupool.resume("m")
        with self.assertRaises(gpupool.GpupoolError):
            gpupool.pause("nobody")


if __name__ == "__main__":
    unittest.main()
