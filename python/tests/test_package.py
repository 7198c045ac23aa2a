"""The package itself: finding the library, sizes, errors, and gpupool.torch without PyTorch."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

from _support import PYTHON_DIR, gpupool


def run_python(code: str, env_extra: dict | None = None, pythonpath: str = PYTHON_DIR) -> subprocess.CompletedProcess:
    """Runs `code` in a fresh interpreter that imports gpupool from `pythonpath`. It runs in that folder:
    `python -c` puts the working directory first on sys.path, so from python/ (where CTest runs the
    suite) it would import the checkout's package instead of a copy elsewhere, and find whatever
    library the checkout's build folders hold."""
    env = dict(os.environ)
    env["PYTHONPATH"] = pythonpath
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    for k, v in (env_extra or {}).items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60,
                          cwd=pythonpath)


class Loading(unittest.TestCase):
    def test_the_library_found_has_the_entry_points(self):
        path = gpupool.library_path()
        self.assertTrue(os.path.exists(path), path)
        if os.environ.get("GPUPOOL_LIBRARY"):
            self.assertEqual(os.path.realpath(path), os.path.realpath(os.environ["GPUPOOL_LIBRARY"]))

    def test_a_wrong_GPUPOOL_LIBRARY_is_an_error_naming_it(self):
        r = run_python(
            "import gpupool\n"
            "try:\n"
            "    gpupool.stats()\n"
            "except gpupool.LibraryNotFound as e:\n"
            "    print('NOTFOUND', e)\n",
            {"GPUPOOL_LIBRARY": "/nonexistent/libgpupool.so"},
        )
        self.assertIn("NOTFOUND", r.stdout, r.stderr)
        self.assertIn("/nonexistent/libgpupool.so", r.stdout)

    def test_without_any_library_the_error_lists_where_it_looked(self):
        with tempfile.TemporaryDirectory() as tmp:
            # a copy of the package in a tree with no build folder
            shutil.copytree(os.path.join(PYTHON_DIR, "gpupool"), os.path.join(tmp, "python", "gpupool"),
                            ignore=shutil.ignore_patterns("__pycache__", "*.so"))
            r = run_python(
                "import gpupool\n"
                "try:\n"
                "    gpupool.stats()\n"
                "except gpupool.LibraryNotFound as e:\n"
                "    print('NOTFOUND', e)\n",
                {"GPUPOOL_LIBRARY": None, "LD_LIBRARY_PATH": None},
                pythonpath=os.path.join(tmp, "python"),
            )
        out = r.stdout
        if "NOTFOUND" not in out:
            self.skipTest("a libgpupool is installed on the system library path: " + out + r.stderr)
        self.assertIn("GPUPOOL_LIBRARY (not set)", out)
        self.assertIn(os.path.join(tmp, "python", "gpupool", "libgpupool.so"), out)
        self.assertIn("build*", out)
        self.assertIn("cmake", out)

    def test_importing_gpupool_does_not_load_the_library(self):
        r = run_python("import gpupool, gpupool._lib as l; print(l._loaded is None)",
                       {"GPUPOOL_LIBRARY": "/nonexistent/libgpupool.so"})
        self.assertEqual(r.stdout.strip(), "True", r.stderr)


class Sizes(unittest.TestCase):
    def test_parse_size(self):
        p = gpupool.parse_size
        self.assertEqual(p(None), 0)
        self.assertEqual(p(123), 123)
        self.assertEqual(p("512"), 512)
        self.assertEqual(p("4K"), 4096)
        self.assertEqual(p("20GiB"), 20 << 30)
        self.assertEqual(p("1.5G"), 3 << 29)
        self.assertEqual(p(" 64 MiB "), 64 << 20)
        self.assertEqual(p("2TiB"), 2 << 40)
        for bad in ("", "MiB", "-1G", "1 parsec", "1e3"):
            with self.assertRaises(ValueError, msg=bad):
                p(bad)
        with self.assertRaises(ValueError):
            p(-1)
        with self.assertRaises(TypeError):
            p([1])
        with self.assertRaises(TypeError):
            p(True)


class ErrorClasses(unittest.TestCase):
    def test_codes_map_to_subclasses(self):
        from gpupool import _error, _lib

        self.assertIsInstance(_error(_lib.GP_ERR_QUOTA, "q"), gpupool.QuotaExceeded)
        self.assertIsInstance(_error(_lib.GP_ERR_OOM, "o"), gpupool.OutOfMemory)
        self.assertIsInstance(_error(_lib.GP_ERR_PAUSED, "p"), gpupool.TenantPaused)
        e = _error(_lib.GP_ERR_CONFIG, "")
        self.assertEqual(type(e), gpupool.GpupoolError)
        self.assertTrue(str(e))  # falls back to gp_strerror
        self.assertIsInstance(e, RuntimeError)


@unittest.skipIf(importlib.util.find_spec("torch") is not None, "PyTorch is installed")
class TorchMissing(unittest.TestCase):
    def test_gpupool_torch_says_it_needs_pytorch(self):
        r = run_python("import gpupool.torch")
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("gpupool.torch needs PyTorch", r.stderr)


if __name__ == "__main__":
    unittest.main()
