"""torch.cuda.empty_cache() without churn (issue 13 item 7): the reset hook PyTorch calls
(gp_torch_empty_cache) under empty_cache:working-set (the default), trim (PyTorch's behaviour) and off.

A loop of steps that calls it after every step must make no device call per step once warm under
working-set, on cudaMalloc segments (sim) and on virtual memory (sim-vmm), where trim makes device
calls in every step; memory the loop stopped using still goes back (after the window of calls), and
at once when a lower limit needs it; another tenant that needs the device gets the cache too.
"""

from __future__ import annotations

import ctypes
import os
import random
import unittest

from _support import SIM_CONF, MiB, SimTestCase, gpupool, sim_call, sim_of

DEVICE_CALLS = (1 << 0) | (1 << 1) | (1 << 11) | (1 << 12) | (1 << 13) | (1 << 14)  # alloc, free, create, release, map, unmap
WINDOW = 8  # GP_WORKING_SET_CALLS


def step_sizes(scale=1.0):
    rng = random.Random(7)  # the same step every time, as a training loop
    return [int(rng.uniform(8, 40) * MiB * scale) for _ in range(4)] + \
           [int(rng.uniform(1, 400) * 1024 * scale) for _ in range(40)]


class Loop(SimTestCase):
    MODE = "working-set"
    BACKEND = "sim"

    def setUp(self):
        self.CONF = f"backend:{self.BACKEND},device_memory:1GiB,empty_cache:{self.MODE}"
        super().setUp()
        self.calls = sim_call("gp_sim_calls", ctypes.c_uint64, [ctypes.c_void_p, ctypes.c_uint])
        self.sim = sim_of(gpupool._pool(0))

    def step(self, scale=1.0):
        before = self.calls(self.sim, DEVICE_CALLS)
        ptrs = [self.malloc(s) for s in step_sizes(scale)]
        self.assertTrue(all(ptrs), gpupool.last_error())
        for p in reversed(ptrs):
            self.free(p)
        self.lib.gp_torch_empty_cache()
        self.assertEqual(gpupool.failures(), 0, gpupool.last_error())
        return self.calls(self.sim, DEVICE_CALLS) - before

    def steady_calls(self, steps=30):
        per_step = [self.step() for _ in range(steps)]
        return per_step


class WorkingSetSim(Loop):
    def test_no_device_call_per_step_after_warm_up(self):
        per_step = self.steady_calls()
        self.assertGreater(per_step[0], 0)
        self.assertEqual(per_step[2:], [0] * (len(per_step) - 2), per_step)

    def test_memory_the_loop_stopped_using_goes_back_after_the_window(self):
        self.steady_calls(10)
        big = gpupool.stats()["reserved_bytes"]
        small = [self.step(scale=0.25) for _ in range(WINDOW + 4)]
        after = gpupool.stats()["reserved_bytes"]
        self.assertLess(after, big * 0.6, (big, after, small))
        self.assertEqual(small[-3:], [0, 0, 0], "then the smaller loop is steady again")

    def test_a_lower_limit_gets_memory_back_at_once(self):
        self.steady_calls(4)
        held = gpupool.tenant_stats("default")["held_bytes"]
        self.lib.gp_torch_set_memory_fraction(64 * MiB / (1 << 30), 0)  # 64 MiB of the 1 GiB sim
        self.lib.gp_torch_empty_cache()
        self.assertGreater(held, 64 * MiB)
        self.assertLessEqual(gpupool.tenant_stats("default")["held_bytes"], 64 * MiB)
        self.assertTrue(self.malloc(MiB), gpupool.last_error())

    def test_another_tenant_that_needs_the_device_gets_the_cache(self):
        self.steady_calls(4)
        s = gpupool.stats()
        self.assertGreater(s["cached_bytes"], 32 * MiB)
        want = (1 << 30) - s["reserved_bytes"] + s["cached_bytes"] // 2  # more than the device has free
        with gpupool.model("other"):
            p = self.malloc(want // MiB * MiB)
        self.assertTrue(p, gpupool.last_error())
        self.free(p)


class WorkingSetVmm(WorkingSetSim):
    BACKEND = "sim-vmm"


class Trim(Loop):
    MODE = "trim"

    def test_trim_gives_everything_back_and_so_churns(self):
        per_step = self.steady_calls(6)
        self.assertTrue(all(n > 0 for n in per_step), per_step)
        self.assertEqual(gpupool.stats()["reserved_bytes"], 0)


class TrimVmm(Trim):
    BACKEND = "sim-vmm"


class Off(Loop):
    MODE = "off"

    def test_off_keeps_everything(self):
        self.steady_calls(WINDOW + 4)
        reserved = gpupool.stats()["reserved_bytes"]
        [self.step(scale=0.25) for _ in range(WINDOW + 4)]
        self.assertEqual(gpupool.stats()["reserved_bytes"], reserved)


class Config(SimTestCase):
    def test_an_unknown_mode_is_a_config_error_naming_it(self):
        gpupool.release_all()
        os.environ["GPUPOOL_CONF"] = SIM_CONF + ",empty_cache:sometimes"
        with self.assertRaises(gpupool.GpupoolError) as e:
            gpupool.stats()
        self.assertIn("empty_cache", str(e.exception))
        self.assertIn("sometimes", str(e.exception))
        os.environ["GPUPOOL_CONF"] = SIM_CONF

    def test_the_default_is_working_set(self):
        self.assertIn("working-set", gpupool.config_help())


if __name__ == "__main__":
    unittest.main()
