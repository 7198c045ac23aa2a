"""Finding libgpupool (issue 13 item 3): an installed package uses its own library; GPUPOOL_LIBRARY
wins; the build-folder fallback never picks a sanitizer build (after `bash tools/test.sh`,
build-asan/libgpupool.so is the newest, and loading it into an uninstrumented interpreter dies with
"ASan runtime does not come first in initial library list")."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
import unittest

from _support import INSTALLED, gpupool

from gpupool import _lib

LIB = _lib.path()


class BuildFolders(unittest.TestCase):
    def setUp(self):
        self.root = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, self.root, True)
        self.saved = _lib._repo_root
        _lib._repo_root = lambda: self.root
        self.addCleanup(setattr, _lib, "_repo_root", self.saved)
        self.env = os.environ.pop("GPUPOOL_LIBRARY", None)
        self.addCleanup(lambda: self.env is not None and os.environ.__setitem__("GPUPOOL_LIBRARY", self.env))

    def lib_in(self, folder, sanitizer_mark=b""):
        os.makedirs(os.path.join(self.root, folder))
        path = os.path.join(self.root, folder, "libgpupool.so")
        shutil.copyfile(LIB, path)
        if sanitizer_mark:
            with open(path, "ab") as f:  # what an instrumented library references
                f.write(b"\0" + sanitizer_mark + b"\0")
        return path

    def test_a_sanitizer_build_is_skipped_even_when_newest(self):
        plain = self.lib_in("build")
        time.sleep(0.01)
        asan = self.lib_in("build-asan", b"__asan_init")
        tsan = self.lib_in("build-tsan", b"__tsan_init")
        os.utime(asan)
        os.utime(tsan)
        self.assertEqual(_lib.sanitizer_of(asan), "address")
        self.assertEqual(_lib.sanitizer_of(tsan), "thread")
        self.assertIsNone(_lib.sanitizer_of(plain))
        found = [p for p in _lib.candidates() if p.startswith(self.root)]
        self.assertEqual(found, [plain])
        usable, skipped = _lib._build_folder_libraries()
        self.assertEqual(usable, [plain])
        self.assertEqual(len(skipped), 2)
        self.assertIn("sanitizer build", skipped[0])
        self.assertIn("GPUPOOL_LIBRARY", skipped[0])

    @unittest.skipIf(INSTALLED, "the installed package ships its own library, found before any build folder")
    def test_only_sanitizer_builds_is_an_error_that_says_why(self):
        import ctypes.util

        self.lib_in("build-asan", b"__asan_init")
        saved_loaded, saved_find = _lib._loaded, ctypes.util.find_library
        _lib._loaded = None
        ctypes.util.find_library = lambda name: None
        try:
            with self.assertRaises(_lib.LibraryNotFound) as e:
                _lib.load()
        finally:
            _lib._loaded, ctypes.util.find_library = saved_loaded, saved_find
        self.assertIn("build-asan", str(e.exception))
        self.assertIn("sanitizer build", str(e.exception))

    def test_gpupool_library_wins(self):
        other = self.lib_in("elsewhere")
        os.environ["GPUPOOL_LIBRARY"] = other
        try:
            self.assertEqual(_lib.candidates()[0], other)
        finally:
            del os.environ["GPUPOOL_LIBRARY"]


@unittest.skipUnless(INSTALLED, "run by tools/test_installed.sh against a pip-installed copy")
class Installed(unittest.TestCase):
    def test_the_package_loads_the_library_it_ships(self):
        self.assertNotIn("GPUPOOL_LIBRARY", os.environ)
        here = os.path.dirname(os.path.abspath(gpupool.__file__))
        self.assertEqual(os.path.dirname(gpupool.library_path()), here)
        self.assertTrue(os.path.exists(os.path.join(here, "libgpupool.so")))


if __name__ == "__main__":
    unittest.main()
