"""torch.cuda.memory_stats() and friends answered by gpupool (gpupool/torch_stats.py, issue 13 item 1).

The same code path install(patch_stats=True) takes: patch() replaces the functions of a torch module,
here a stand-in module (no PyTorch needed) and, where PyTorch is importable (Debian's python3-torch is
a CPU build: no GPU either way), torch itself; the pools are on the simulated GPU.
"""

from __future__ import annotations

import os
import types
import unittest

from _support import SIM_CONF, MiB, SimTestCase, gpupool

from gpupool import torch_stats

try:
    import torch  # noqa: F401
    import torch.cuda.memory  # noqa: F401

    HAVE_TORCH = True
except Exception:  # noqa: BLE001 - any failure means: no usable torch here
    HAVE_TORCH = False

CORE = ("allocated_bytes", "reserved_bytes", "active_bytes", "inactive_split_bytes", "requested_bytes",
        "allocation", "segment", "active", "inactive_split")


def fake_torch():
    """A module tree with the shape patch() needs: torch.cuda and torch.cuda.memory."""
    fake = types.ModuleType("faketorch")
    fake.cuda = types.ModuleType("faketorch.cuda")
    fake.cuda.memory = types.ModuleType("faketorch.cuda.memory")
    for mod in (fake.cuda, fake.cuda.memory):
        for name in torch_stats.PATCHED:
            setattr(mod, name, lambda *a, **k: "pytorch's own")
    return fake


class Keys(SimTestCase):
    def setUp(self):
        super().setUp()
        self.torch = fake_torch()
        torch_stats.patch(self.torch)
        self.addCleanup(torch_stats.unpatch, self.torch)

    def test_pytorch_keys_with_current_values_from_the_pool(self):
        small = self.malloc(1000)           # a small-heap block of 1024 B
        large = self.malloc(30 * MiB)       # a large-heap block
        s = self.torch.cuda.memory_stats(0)
        self.assertEqual(list(s), sorted(s), "sorted by key, as PyTorch's")
        for stat in CORE:
            for pool in ("all", "large_pool", "small_pool"):
                for metric in ("current", "peak", "allocated", "freed"):
                    self.assertIn(f"{stat}.{pool}.{metric}", s)
        for key in ("num_alloc_retries", "num_ooms", "num_sync_all_streams", "num_device_alloc",
                    "num_device_free", "max_split_size", "oversize_allocations.current",
                    "oversize_segments.peak"):
            self.assertIn(key, s)
        self.assertEqual(s["allocated_bytes.small_pool.current"], 1024)
        self.assertEqual(s["allocated_bytes.large_pool.current"], 30 * MiB)
        self.assertEqual(s["allocated_bytes.all.current"], 30 * MiB + 1024)
        self.assertEqual(s["requested_bytes.all.current"], 30 * MiB + 1000)
        self.assertEqual(s["allocation.all.current"], 2)
        own = gpupool.stats()
        self.assertEqual(s["reserved_bytes.all.current"], own["reserved_bytes"])
        self.assertEqual(s["reserved_bytes.small_pool.current"] + s["reserved_bytes.large_pool.current"],
                         own["reserved_bytes"])
        self.assertEqual(s["segment.all.current"], own["segments"])
        self.assertEqual(s["gpupool.reserved_bytes"], own["reserved_bytes"])
        self.assertEqual(s["gpupool.tenants.default.held_bytes"], own["reserved_bytes"])
        self.assertTrue(all(isinstance(v, int) for v in s.values()), "every value an int, as PyTorch's")
        self.assertEqual(self.torch.cuda.memory_allocated(0), 30 * MiB + 1024)
        self.assertEqual(self.torch.cuda.memory.memory_reserved(0), own["reserved_bytes"])
        nested = self.torch.cuda.memory_stats_as_nested_dict(0)
        self.assertEqual(nested["allocated_bytes"]["all"]["current"], 30 * MiB + 1024)
        self.free(small)
        self.free(large)

    def test_peaks_and_their_reset(self):
        a = self.malloc(40 * MiB)
        self.free(a)
        b = self.malloc(2 * MiB)
        self.assertEqual(self.torch.cuda.max_memory_allocated(0), 40 * MiB)
        peak_reserved = self.torch.cuda.max_memory_reserved(0)
        self.assertGreaterEqual(peak_reserved, 40 * MiB)
        self.torch.cuda.reset_peak_memory_stats(0)
        self.assertEqual(self.torch.cuda.max_memory_allocated(0), 2 * MiB)
        s = self.torch.cuda.memory_stats(0)
        self.assertEqual(s["reserved_bytes.all.peak"], s["reserved_bytes.all.current"])
        self.assertEqual(s["allocation.all.peak"], 1)
        self.free(b)

    def test_accumulated_counts_and_their_reset(self):
        for _ in range(3):
            self.free(self.malloc(MiB))
        s = self.torch.cuda.memory_stats(0)
        self.assertEqual(s["allocation.all.allocated"], 3)
        self.assertEqual(s["allocation.all.freed"], 3)
        self.assertEqual(s["allocated_bytes.large_pool.allocated"], 3 * MiB)
        self.assertEqual(s["allocated_bytes.all.freed"], 3 * MiB)
        self.assertEqual(s["num_device_alloc"], gpupool.stats()["num_device_allocs"])
        self.torch.cuda.reset_accumulated_memory_stats(0)
        s = self.torch.cuda.memory_stats(0)
        self.assertEqual(s["allocation.all.allocated"], 0)
        self.assertEqual(s["num_device_alloc"], 0)
        self.free(self.malloc(MiB))
        self.assertEqual(self.torch.cuda.memory_stats(0)["allocation.all.allocated"], 1)

    def test_a_device_without_a_pool_reads_zeros_and_creates_none(self):
        s = self.torch.cuda.memory_stats(3)
        self.assertEqual(s["allocated_bytes.all.current"], 0)
        self.assertEqual(s["reserved_bytes.all.peak"], 0)
        self.assertFalse(self.lib.gp_torch_pool_peek(3), "asking must not create a pool (a CUDA context)")

    def test_summary_in_pytorchs_layout_with_gpupools_after_it(self):
        p = self.malloc(3 * MiB)
        text = self.torch.cuda.memory_summary(0)
        self.assertIn("Allocated memory", text)
        self.assertIn("from small pool", text)
        self.assertIn("CUDA OOMs: 0", text)
        self.assertIn(gpupool.memory_summary().splitlines()[0], text)
        self.assertNotIn("from small pool", self.torch.cuda.memory_summary(0, abbreviated=True))
        self.free(p)

    def test_unpatch_restores_the_functions(self):
        torch_stats.unpatch(self.torch)
        self.assertEqual(self.torch.cuda.memory_stats(0), "pytorch's own")
        self.assertEqual(self.torch.cuda.memory.memory_summary(0), "pytorch's own")
        torch_stats.patch(self.torch)
        self.assertTrue(torch_stats.is_patched(self.torch))


@unittest.skipUnless(HAVE_TORCH, "PyTorch is not importable here (apt-get install python3-torch)")
class RealTorch(SimTestCase):
    """torch itself patched: its module-level aliases and its own memory_summary read gpupool's keys."""

    def setUp(self):
        super().setUp()
        import torch

        self.torch = torch
        torch_stats.patch(torch)
        self.addCleanup(torch_stats.unpatch, torch)

    def test_torch_cuda_answers_from_gpupool(self):
        p = self.malloc(5 * MiB)
        self.assertEqual(self.torch.cuda.memory_allocated(0), 5 * MiB)
        self.assertEqual(self.torch.cuda.memory_stats(0)["allocated_bytes.all.current"], 5 * MiB)
        # deprecated aliases call the module's functions by name, so they follow
        self.assertEqual(self.torch.cuda.memory_cached(0), gpupool.stats()["reserved_bytes"])
        self.assertEqual(self.torch.cuda.max_memory_cached(0), gpupool.stats()["reserved_bytes_peak"])
        self.free(p)

    def test_gpupool_torch_patches_what_install_patches(self):
        import inspect

        import gpupool.torch as gt

        self.assertIs(inspect.signature(gt.install).parameters["patch_stats"].default, True)
        torch_stats.unpatch(self.torch)
        gt.patch_stats()
        self.assertTrue(torch_stats.is_patched(self.torch))
        gt.unpatch_stats()
        self.assertFalse(torch_stats.is_patched(self.torch))
        torch_stats.patch(self.torch)
        self.free(self.malloc(20 * MiB))
        self.assertEqual(gt.empty_cache(0, mode="working-set"), 0, "the window is not full yet")
        self.assertGreater(gt.empty_cache(0), 0, "trim gives the free segment back")
        with self.assertRaises(ValueError):
            gt.empty_cache(0, mode="sometimes")

    def test_every_key_pytorchs_docstring_lists_is_there(self):
        import itertools
        import re

        doc = torch_stats._originals[("torch.cuda.memory", "memory_stats")].__doc__ or ""
        keys = set()
        for pattern in re.findall(r'``"([a-z_.{},]+)"``', doc):
            parts = [p.split(",") for p in re.findall(r"\{([^}]*)\}", pattern)]
            stem = re.sub(r"\{[^}]*\}", "{}", pattern)
            keys |= {stem.format(*combo) for combo in itertools.product(*parts)}
        # PyTorch 1.13's docstring calls the allocation counts "allocated.*"; its allocator (and its own
        # memory_summary) names them "allocation.*", as 2.x's docstring does.
        keys = {k.replace("allocated.", "allocation.", 1) if k.startswith("allocated.") else k for k in keys}
        self.assertGreater(len(keys), 100, f"the docstring's key patterns were not found: {sorted(keys)[:5]}")
        missing = keys - set(self.torch.cuda.memory_stats(0))
        self.assertEqual(missing, set())

    def test_pytorchs_own_summary_finds_every_key_it_reads(self):
        original = torch_stats._originals[("torch.cuda.memory", "memory_summary")]
        p = self.malloc(MiB)
        text = original(0)  # PyTorch's code, reading our memory_stats
        self.assertIn("PyTorch CUDA memory summary", text)
        self.assertIn("Allocated memory", text)
        self.free(p)


class PeakComposition(SimTestCase):
    """GPUPOOL_CONF's peak_composition:on reaches stats(): what the reserved peak was made of."""

    CONF = "backend:sim-vmm,device_memory:256MiB,peak_composition:on"

    def test_stats_say_what_the_peak_held(self):
        p = self.malloc(3 * MiB)
        self.assertTrue(p, gpupool.last_error())
        c = gpupool.stats()["peak_composition"]
        self.assertTrue(c["recorded"])
        self.assertEqual(c["unit"], "page")
        parts = sum(c[k][f] for k in ("small", "large")
                    for f in ("allocated_bytes", "pending_bytes", "free_in_used_bytes", "free_whole_bytes"))
        self.assertEqual(parts + c["unmapped_cached_bytes"] + c["parked_bytes"], c["reserved_bytes"])
        self.assertEqual(c["reserved_bytes"], gpupool.stats()["reserved_bytes_peak"])
        self.assertEqual(c["large"]["allocated_bytes"], 3 * MiB)
        self.assertEqual(c["large"]["free_in_used_bytes"], MiB, "the rest of the block's second page")
        self.free(p)

    def test_off_by_default(self):
        os.environ["GPUPOOL_CONF"] = SIM_CONF
        gpupool.release_all()
        self.malloc(MiB)
        self.assertNotIn("peak_composition", gpupool.stats())


if __name__ == "__main__":
    unittest.main()
