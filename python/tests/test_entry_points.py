"""The C entry points PyTorch calls (pool/torch/torch_glue.c), driven through ctypes on the simulated GPU:
gp_torch_malloc / gp_torch_free and the hooks record_stream, empty_cache, memory fraction and init."""

from __future__ import annotations

import os
import threading
import unittest

from _support import SIM_CONF, MiB, SimTestCase, captured_stderr, gpupool


class MallocFree(SimTestCase):
    def test_round_trip_is_aligned_and_counted(self):
        ptrs = [self.malloc(n) for n in (1, 512, 4097, 3 * MiB, 12 * MiB)]
        self.assertTrue(all(ptrs), gpupool.last_error())
        self.assertEqual(len(set(ptrs)), len(ptrs))
        for p in ptrs:
            self.assertEqual(p % 512, 0)
        s = gpupool.stats()
        self.assertEqual(s["num_allocs"], 5)
        self.assertEqual(s["active_blocks"], 5)
        self.assertGreaterEqual(s["allocated_bytes"], 15 * MiB)
        self.assertEqual(s["backend"], "sim")
        for p in ptrs:
            self.free(p)
        s = gpupool.stats()
        self.assertEqual(s["allocated_bytes"], 0)
        self.assertEqual(s["num_frees"], 5)
        self.assertEqual(gpupool.failures(), 0)

    def test_cached_size_is_reused_without_a_device_call(self):
        p = self.malloc(8 * MiB)
        self.free(p)
        before = gpupool.stats()["num_device_allocs"]
        q = self.malloc(8 * MiB)
        self.assertEqual(q, p)
        self.assertEqual(gpupool.stats()["num_device_allocs"], before)
        self.free(q)

    def test_size_zero_gives_null_and_is_no_failure(self):
        self.assertIsNone(self.lib.gp_torch_malloc(0, 0, None))
        self.assertEqual(gpupool.failures(), 0)
        self.lib.gp_torch_free(None, 0, 0, None)  # free(NULL) is a no-op
        self.assertEqual(gpupool.failures(), 0)

    def test_negative_size_fails_with_a_message(self):
        self.assertIsNone(self.lib.gp_torch_malloc(-5, 0, None))
        self.assertEqual(gpupool.failures(), 1)
        self.assertIn("negative size -5", gpupool.last_error())

    def test_larger_than_the_device_fails_and_says_why(self):
        self.assertIsNone(self.malloc(1 << 40))
        self.assertEqual(gpupool.failures(), 1)
        msg = gpupool.last_error()
        self.assertTrue(msg, "no message")
        self.assertIn("1099511627776", msg)
        self.assertIn("256.0 MiB", msg)  # what the device has

    def test_out_of_memory_returns_null_with_a_message_and_keeps_working(self):
        big = [self.malloc(100 * MiB), self.malloc(100 * MiB)]
        self.assertTrue(all(big), gpupool.last_error())
        self.assertIsNone(self.malloc(100 * MiB))
        self.assertIn("out of device memory", gpupool.last_error())
        self.assertEqual(gpupool.stats()["num_ooms"], 1)
        self.free(big.pop())
        p = self.malloc(100 * MiB)
        self.assertTrue(p, gpupool.last_error())

    def test_device_out_of_range(self):
        self.assertIsNone(self.lib.gp_torch_malloc(MiB, 64, None))
        self.assertIn("device 64 out of range", gpupool.last_error())
        self.assertIsNone(self.lib.gp_torch_malloc(MiB, -1, None))
        self.assertEqual(gpupool.failures(), 2)

    def test_pools_are_per_device(self):
        a = self.malloc(MiB, device=0)
        b = self.malloc(MiB, device=1)
        self.assertTrue(a and b, gpupool.last_error())
        self.assertEqual(gpupool.stats(device=0)["device"], 0)
        self.assertEqual(gpupool.stats(device=1)["device"], 1)
        self.assertEqual(gpupool.stats(device=1)["active_blocks"], 1)
        self.lib.gp_torch_free(b, 0, 1, None)
        self.live.remove((b, None))
        self.assertEqual(gpupool.stats(device=1)["active_blocks"], 0)

    def test_free_of_a_foreign_pointer_is_reported(self):
        p = self.malloc(MiB)
        with captured_stderr() as err:
            self.lib.gp_torch_free(p + 512, 0, 0, None)  # interior pointer
            self.lib.gp_torch_free(0x1000, 0, 0, None)   # never allocated
        self.assertEqual(self.lib.gp_torch_free_failures(), 2)
        self.assertEqual(gpupool.failures(), 2)
        self.assertIn("gpupool: ", err[0])
        self.assertEqual(err[0].count("\n"), 2, err[0])
        self.free(p)

    def test_double_free_is_reported(self):
        p = self.malloc(MiB)
        self.free(p)
        with captured_stderr() as err:
            self.lib.gp_torch_free(p, 0, 0, None)
        self.assertEqual(self.lib.gp_torch_free_failures(), 1)
        self.assertTrue(err[0].startswith("gpupool: "), err[0])

    def test_messages_are_readable_from_another_thread(self):
        # PyTorch's backward pass allocates on its own threads: the process-wide copy is what Python reads
        def fail():
            self.lib.gp_torch_malloc(-7, 0, None)

        t = threading.Thread(target=fail)
        t.start()
        t.join()
        self.assertIn("negative size -7", gpupool.last_error())

    def test_init_limits_devices_to_what_pytorch_reported(self):
        self.lib.gp_torch_init(1)
        self.assertIsNone(self.lib.gp_torch_malloc(MiB, 1, None))
        self.assertIn("PyTorch reported 1 device", gpupool.last_error())
        p = self.malloc(MiB, device=0)
        self.assertTrue(p)

    def test_unknown_backend_in_the_configuration(self):
        gpupool.release_all()
        os.environ["GPUPOOL_CONF"] = "backend:nope"
        self.assertIsNone(self.lib.gp_torch_malloc(MiB, 0, None))
        msg = gpupool.last_error()
        self.assertIn("GPUPOOL_CONF", msg)
        self.assertIn("nope", msg)
        with self.assertRaises(gpupool.GpupoolError) as cm:
            gpupool.stats()
        self.assertLess(cm.exception.code, 0)
        self.assertIn("nope", str(cm.exception))
        os.environ["GPUPOOL_CONF"] = self.CONF  # the next call creates the pool that tearDown checks
        self.assertTrue(gpupool.stats())

    def test_bad_key_in_the_configuration(self):
        gpupool.release_all()
        os.environ["GPUPOOL_CONF"] = self.CONF + ",no_such_key:1"
        self.assertIsNone(self.lib.gp_torch_malloc(MiB, 0, None))
        self.assertIn("no_such_key", gpupool.last_error())
        os.environ["GPUPOOL_CONF"] = self.CONF


class Hooks(SimTestCase):
    def test_record_stream_defers_reuse_and_counts_the_stream(self):
        s1, s2 = 0x1001, 0x1002
        p = self.malloc(4 * MiB, stream=s1)
        self.lib.gp_torch_record_stream(p, s2)
        self.assertEqual(gpupool.failures(), 0, gpupool.last_error())
        self.free(p, stream=s1)
        self.assertGreaterEqual(gpupool.stats()["streams"], 2)
        self.assertEqual(gpupool.stats()["allocated_bytes"], 0)

    def test_record_stream_of_a_foreign_pointer_is_reported(self):
        p = self.malloc(MiB)
        with captured_stderr() as err:
            self.lib.gp_torch_record_stream(0x2000, 0x1001)
        self.assertEqual(gpupool.failures(), 1)
        self.assertIn("not allocated by gpupool", gpupool.last_error())
        self.assertIn("gpupool: ", err[0])
        self.lib.gp_torch_record_stream(None, 0x1001)  # NULL: nothing to do
        self.assertEqual(gpupool.failures(), 1)
        self.free(p)

    def test_graph_pool_hooks_open_end_and_release_a_private_pool(self):
        # The sim never captures, so no allocation is routed; the hooks' bookkeeping is what is checked
        # here (the routing itself: tests/conformance on the CUDA emulation).
        self.lib.gp_torch_begin_allocate_to_pool(0, 5, 0, None)
        self.assertEqual(gpupool.failures(), 0, gpupool.last_error())
        with captured_stderr():
            self.lib.gp_torch_begin_allocate_to_pool(0, 6, 0, None)  # one window at a time
        self.assertEqual(gpupool.failures(), 1)
        self.assertIn("is open", gpupool.last_error())
        self.lib.gp_torch_end_allocate_to_pool(0, 5, 0)
        self.lib.gp_torch_release_pool(0, 5, 0)
        self.assertEqual(gpupool.failures(), 1, gpupool.last_error())
        with captured_stderr():
            self.lib.gp_torch_release_pool(0, 5, 0)  # released already
        self.assertEqual(gpupool.failures(), 2)
        self.assertIn("no such graph pool", gpupool.last_error())

    def test_empty_cache_gives_every_free_segment_back(self):
        gpupool.release_all()
        os.environ["GPUPOOL_CONF"] = SIM_CONF + ",empty_cache:trim"  # PyTorch's behaviour (not the default)
        ptrs = [self.malloc(n * MiB) for n in (1, 4, 16, 40)]
        for p in ptrs:
            self.free(p)
        self.assertGreater(gpupool.stats()["reserved_bytes"], 0)
        self.lib.gp_torch_empty_cache()
        s = gpupool.stats()
        self.assertEqual(s["reserved_bytes"], 0)
        self.assertEqual(s["segments"], 0)
        self.assertEqual(gpupool.failures(), 0)

    def test_empty_cache_keeps_live_blocks(self):
        gpupool.release_all()
        os.environ["GPUPOOL_CONF"] = SIM_CONF + ",empty_cache:trim"
        keep = self.malloc(16 * MiB)
        self.free(self.malloc(30 * MiB))
        self.lib.gp_torch_empty_cache()
        s = gpupool.stats()
        self.assertEqual(s["allocated_bytes"], 16 * MiB)
        self.assertLess(s["reserved_bytes"], 40 * MiB)
        self.free(keep)

    def test_memory_fraction_caps_what_the_pool_holds(self):
        self.lib.gp_torch_set_memory_fraction(0.25, 0)  # 64 MiB of the 256 MiB sim
        self.assertEqual(gpupool.failures(), 0, gpupool.last_error())
        self.assertEqual(gpupool.tenant_stats("default")["max"], 64 * MiB)
        a = self.malloc(40 * MiB)
        self.assertTrue(a, gpupool.last_error())
        self.assertIsNone(self.malloc(40 * MiB))
        self.assertIn("default", gpupool.last_error())
        self.assertLessEqual(gpupool.stats()["reserved_bytes"], 64 * MiB)
        self.lib.gp_torch_set_memory_fraction(1.0, 0)  # no cap
        self.assertEqual(gpupool.tenant_stats("default")["max"], 0)
        b = self.malloc(100 * MiB)
        self.assertTrue(b, gpupool.last_error())

    def test_memory_fraction_below_what_is_held_refuses_growth_and_frees_nothing(self):
        a = self.malloc(100 * MiB)
        self.lib.gp_torch_set_memory_fraction(0.125, 0)  # 32 MiB < 100 MiB held
        self.assertIsNone(self.malloc(MiB))
        self.assertEqual(gpupool.stats()["allocated_bytes"], 100 * MiB)
        self.free(a)
        self.lib.gp_torch_empty_cache()
        self.assertTrue(self.malloc(MiB), gpupool.last_error())

    def test_memory_fraction_out_of_range_is_refused(self):
        with captured_stderr() as err:
            self.lib.gp_torch_set_memory_fraction(1.5, 0)
            self.lib.gp_torch_set_memory_fraction(float("nan"), 0)
        self.assertEqual(gpupool.failures(), 2)
        self.assertIn("not in [0, 1]", gpupool.last_error())
        self.assertIn("not in [0, 1]", err[0])
        self.assertEqual(gpupool.tenant_stats("default")["max"], 0)

    def test_hooks_are_exported_under_the_names_install_uses(self):
        from gpupool import _lib

        for name in [_lib.TORCH_ALLOC, _lib.TORCH_FREE, *_lib.TORCH_HOOKS.values()]:
            self.assertTrue(self.lib.has(name), name)
            self.assertIsInstance(self.lib.address(name), int)


if __name__ == "__main__":
    unittest.main()
