"""Bad input from Python (issue 9, findings 4, 9 and 12): every value ctypes would truncate or wrap is
refused with a ValueError or TypeError that says what and why, before it reaches the C library, and
the library's own refusals stay what they are."""

from __future__ import annotations

import json
import unittest

from _support import MiB, SimTestCase, gpupool


class Devices(SimTestCase):
    def test_string_devices_name_a_device(self):
        for device in ("cuda:0", "0", "cuda", " cuda:0 "):
            self.assertEqual(gpupool._device(device), 0, device)
        self.assertEqual(gpupool.stats(device="cuda:0")["device"], 0)

    def test_bad_devices_are_value_errors(self):
        for device in ("cuda:x", "gpu0", "-1", "cuda:-1", -1, 2**31, 2**32, 2**64):
            with self.assertRaises(ValueError, msg=repr(device)):
                gpupool._device(device)
        with self.assertRaises(ValueError):
            gpupool.stats(device=2**32)  # ctypes made this device 0
        with self.assertRaises(TypeError):
            gpupool._device(1.5)


class Sizes(SimTestCase):
    def test_whole_bytes_only_as_the_c_parser(self):
        self.assertEqual(gpupool.parse_size("1.5GiB"), 3 << 29)
        self.assertEqual(gpupool.parse_size(2.0), 2)
        for bad in ("0.3B", "1.5", 1.5, 0.3, "1.0000001KiB"):
            with self.assertRaises(ValueError, msg=repr(bad)):
                gpupool.parse_size(bad)

    def test_sizes_past_size_t_are_refused(self):
        for bad in (2**64, "99999999TiB", "16EiB", float("inf"), "inf", float("nan"), 1e30, -1, "-1"):
            with self.assertRaises(ValueError, msg=repr(bad)):
                gpupool.parse_size(bad)
        self.assertEqual(gpupool.parse_size(2**64 - 1), 2**64 - 1)

    def test_set_limits_refuses_a_max_ctypes_would_wrap_to_unlimited(self):
        with self.assertRaises(ValueError):
            gpupool.set_limits("t", max=2**64)
        self.assertNotIn("t", gpupool.tenants(), "nothing was created")


class Names(SimTestCase):
    def test_bad_names(self):
        with self.assertRaises(ValueError):
            gpupool.set_limits("a\0b")
        self.assertNotIn("a", gpupool.tenants(), "a\\0b must not create tenant 'a'")
        with self.assertRaises(TypeError):
            gpupool.set_limits(None)
        with self.assertRaises(TypeError):
            with gpupool.model(None):
                pass
        with self.assertRaises(gpupool.GpupoolError):  # the C library's length check
            gpupool.set_limits("")
        with self.assertRaises(gpupool.GpupoolError):
            gpupool.set_limits("x" * 64)
        with self.assertRaises(ValueError):
            gpupool.pause("a\0b")

    def test_a_quoted_name_keeps_stats_parsing(self):
        gpupool.set_limits('q"uote')
        gpupool.set_limits("back\\slash")
        s = gpupool.stats()
        self.assertIn('q"uote', s["tenants"])
        self.assertIn("back\\slash", s["tenants"])
        json.dumps(s)


class Streams(SimTestCase):
    def test_stream_handles_ctypes_would_wrap(self):
        for bad in (2**64, -1, 2**64 + 5):
            with self.assertRaises(ValueError, msg=repr(bad)):
                gpupool.bind_stream(bad, "t")
        gpupool.bind_stream(2**64 - 1, "t")


class ReleaseInsideModel(SimTestCase):
    def test_release_all_inside_a_model_then_allocate(self):
        with gpupool.model("m"):
            self.assertTrue(self.malloc(MiB))
            self.lib.gp_torch_free(self.live.pop()[0], 0, 0, None)
            gpupool.release_all()
            ptr = self.malloc(MiB)  # a fresh pool: it must not see the dead pool's frame
            self.assertTrue(ptr, gpupool.last_error())
            self.assertEqual(gpupool.tenant_stats("default")["allocated_bytes"], MiB)
        # leaving the with after the pool it entered was destroyed is not an error


if __name__ == "__main__":
    unittest.main()
