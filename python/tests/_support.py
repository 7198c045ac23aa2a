"""Shared set-up for the Python tests: every test gets fresh pools on the simulated GPU."""

from __future__ import annotations

import contextlib
import ctypes
import os
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
PYTHON_DIR = os.path.dirname(HERE)
REPO = os.path.dirname(PYTHON_DIR)
# GPUPOOL_TEST_INSTALLED=1 (tools/test_installed.sh): test the installed package, never python/ here.
INSTALLED = os.environ.get("GPUPOOL_TEST_INSTALLED") == "1"
if INSTALLED:
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != PYTHON_DIR]
elif PYTHON_DIR not in sys.path:
    sys.path.insert(0, PYTHON_DIR)

import gpupool  # noqa: E402
from gpupool import _lib  # noqa: E402

if INSTALLED and os.path.abspath(gpupool.__file__).startswith(PYTHON_DIR + os.sep):
    raise ImportError(f"GPUPOOL_TEST_INSTALLED=1 but gpupool was imported from the source tree ({gpupool.__file__})")

MiB = 1 << 20
SIM_CONF = "backend:sim,device_memory:256MiB"


def lib():
    return _lib.load()


def sim_of(pool_handle: int) -> int:
    l = lib()
    fn = l._cdll.gp_sim_of
    fn.restype, fn.argtypes = ctypes.c_void_p, [ctypes.c_void_p]
    return fn(pool_handle)


def sim_call(name: str, restype, argtypes):
    fn = getattr(lib()._cdll, name)
    fn.restype, fn.argtypes = restype, argtypes
    return fn


@contextlib.contextmanager
def captured_stderr():
    """Captures what C code writes to file descriptor 2; yields a list that receives the text."""
    out: list[str] = []
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+b") as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            yield out
        finally:
            libc = ctypes.CDLL(None)
            libc.fflush(None)
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            out.append(tmp.read().decode(errors="replace"))


class SimTestCase(unittest.TestCase):
    """Fresh pools from GPUPOOL_CONF = CONF before each test, destroyed after it."""

    CONF = SIM_CONF

    def setUp(self):
        self._saved_conf = os.environ.get("GPUPOOL_CONF")
        gpupool.release_all()
        os.environ["GPUPOOL_CONF"] = self.CONF
        self.lib = lib()
        self.live: list[tuple[int, int]] = []  # (ptr, stream) still to free

    def tearDown(self):
        for ptr, stream in self.live:
            self.lib.gp_torch_free(ptr, 0, 0, stream)
        try:
            gpupool.check()
        finally:
            blocks, _ = gpupool.release_all()
            if self._saved_conf is None:
                os.environ.pop("GPUPOOL_CONF", None)
            else:
                os.environ["GPUPOOL_CONF"] = self._saved_conf
        self.assertEqual(blocks, 0, "a test left blocks allocated")

    def malloc(self, size: int, stream: int | None = None, device: int = 0) -> int | None:
        ptr = self.lib.gp_torch_malloc(size, device, stream)
        if ptr:
            self.live.append((ptr, stream))
        return ptr

    def free(self, ptr: int, stream: int | None = None, device: int = 0) -> None:
        self.live.remove((ptr, stream))
        self.lib.gp_torch_free(ptr, 0, device, stream)
