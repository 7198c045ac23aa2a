"""Finding and loading libgpupool, and the ctypes signatures of the C functions the package calls.

The library is looked for, in order:

1. the file named by the environment variable ``GPUPOOL_LIBRARY`` (always taken, sanitizer build or
   not: an explicit choice);
2. next to this package (``libgpupool.so`` in the ``gpupool`` folder: where ``pip install .`` puts
   the library it built);
3. the build folders of the source tree this package sits in (``<repo>/build*/libgpupool.so``, the
   most recently built first), except sanitizer builds: an ASan or TSan library cannot be loaded
   into an interpreter that was not started with its runtime ("ASan runtime does not come first in
   initial library list"), so a library that references a sanitizer runtime is skipped, and the
   message says so;
4. the system's library path (``ctypes.util.find_library("gpupool")``).

When none works, :class:`LibraryNotFound` names every place that was tried. The same path is given to
``torch.cuda.memory.CUDAPluggableAllocator``, so PyTorch and this package share one loaded copy (and so
one set of pools).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
import os
import threading

__all__ = ["LibraryNotFound", "load", "path"]

_LIB_NAMES = ("libgpupool.so",)

# gp_error codes (include/gpupool.h)
GP_OK = 0
GP_ERR_INVALID = -1
GP_ERR_OOM = -2
GP_ERR_DEVICE = -3
GP_ERR_CONFIG = -4
GP_ERR_NOT_OWNED = -5
GP_ERR_INTERIOR = -6
GP_ERR_DOUBLE_FREE = -7
GP_ERR_UNKNOWN_STREAM = -8
GP_ERR_DESTROYED = -9
GP_ERR_BACKEND = -10
GP_ERR_NOT_READY = -11
GP_ERR_QUOTA = -12
GP_ERR_PAUSED = -13
GP_ERR_CORRUPT = -14

GP_PAUSE_KEEP_CONTENTS = 1
GP_TENANT_NAME_MAX = 64
GP_TENANT_STATS_VERSION = 2


class LibraryNotFound(OSError):
    """libgpupool could not be found or loaded; the message lists where the package looked."""


class gp_tenant_limits(ctypes.Structure):
    _fields_ = [("max", ctypes.c_size_t), ("high", ctypes.c_size_t), ("min", ctypes.c_size_t)]


class gp_tenant_stats(ctypes.Structure):
    _fields_ = [
        ("size", ctypes.c_uint32),
        ("version", ctypes.c_uint32),
        ("name", ctypes.c_char * GP_TENANT_NAME_MAX),
        ("held_bytes", ctypes.c_uint64),
        ("held_bytes_peak", ctypes.c_uint64),
        ("allocated_bytes", ctypes.c_uint64),
        ("cached_bytes", ctypes.c_uint64),
        ("max", ctypes.c_uint64),
        ("high", ctypes.c_uint64),
        ("min", ctypes.c_uint64),
        ("refusals", ctypes.c_uint64),
        ("pauses", ctypes.c_uint64),
        ("paused", ctypes.c_int),
        ("graph_held_bytes", ctypes.c_uint64),
    ]


GP_BREAKDOWN_VERSION = 1


class gp_kind_stats(ctypes.Structure):
    _fields_ = [(name, ctypes.c_uint64) for name in (
        "segments", "reserved_bytes", "allocations", "allocated_bytes", "requested_bytes", "active_blocks",
        "active_bytes", "inactive_split", "inactive_split_bytes", "num_allocs_total", "num_frees_total",
        "alloc_bytes_total", "free_bytes_total")]


class gp_breakdown(ctypes.Structure):
    _fields_ = [("size", ctypes.c_uint32), ("version", ctypes.c_uint32),
                ("small", gp_kind_stats), ("large", gp_kind_stats)]


GP_SNAPSHOT_LIST = 1


class gp_leak_report(ctypes.Structure):
    _fields_ = [("live_blocks", ctypes.c_size_t), ("live_bytes", ctypes.c_size_t)]


GP_WRITER = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_char_p)

_c = ctypes
_P = ctypes.c_void_p
_SIG = {
    # core API
    "gp_strerror": (_c.c_char_p, [_c.c_int]),
    "gp_last_error": (_c.c_char_p, []),
    "gp_pool_create": (_c.c_int, [_c.POINTER(_P), _c.c_int, _c.c_char_p, _c.c_char_p]),
    "gp_pool_destroy": (_c.c_int, [_P, _c.POINTER(gp_leak_report)]),
    "gp_alloc": (_c.c_int, [_P, _c.POINTER(_P), _c.c_size_t, _P]),
    "gp_free": (_c.c_int, [_P, _P, _P]),
    "gp_record_stream": (_c.c_int, [_P, _P, _P]),
    "gp_trim": (_c.c_int, [_P, _c.c_size_t, _c.POINTER(_c.c_size_t)]),
    "gp_maintain": (_c.c_int, [_P, _c.POINTER(_c.c_size_t)]),
    "gp_stats_json": (_c.c_int, [_P, _c.c_char_p, _c.c_size_t, _c.POINTER(_c.c_size_t)]),
    "gp_stats_print": (_c.c_int, [_P, GP_WRITER, _P]),
    "gp_check": (_c.c_int, [_P]),
    "gp_config_help": (_c.c_char_p, []),
    # PyTorch's view: stats breakdown, peaks, snapshots (pool/api/memory_stats.c, snapshot.c)
    "gp_get_breakdown": (_c.c_int, [_P, _c.POINTER(gp_breakdown)]),
    "gp_reset_peaks": (_c.c_int, [_P]),
    "gp_release_unused": (_c.c_int, [_P, _c.POINTER(_c.c_size_t)]),
    "gp_history_record": (_c.c_int, [_P, _c.c_size_t]),
    "gp_snapshot_write": (_c.c_int, [_c.POINTER(_P), _c.c_size_t, _c.c_char_p, _c.c_uint]),
    # tenants
    "gp_tenant_create": (_c.c_int, [_P, _c.c_char_p, _c.POINTER(gp_tenant_limits)]),
    "gp_tenant_set_limits": (_c.c_int, [_P, _c.c_char_p, _c.POINTER(gp_tenant_limits)]),
    "gp_tenant_push": (_c.c_int, [_P, _c.c_char_p]),
    "gp_tenant_pop": (_c.c_int, [_P]),
    "gp_tenant_bind_stream": (_c.c_int, [_P, _c.c_char_p, _P]),
    "gp_tenant_pause": (_c.c_int, [_P, _c.c_char_p, _c.c_uint]),
    "gp_tenant_resume": (_c.c_int, [_P, _c.c_char_p]),
    "gp_tenant_get_stats": (_c.c_int, [_P, _c.c_char_p, _c.POINTER(gp_tenant_stats)]),
    "gp_tenant_count": (_c.c_int, [_P, _c.POINTER(_c.c_size_t)]),
    "gp_tenant_name": (_c.c_int, [_P, _c.c_size_t, _c.c_char_p, _c.c_size_t]),
    # the PyTorch glue (pool/torch/torch_glue.c)
    "gp_torch_malloc": (_P, [_c.c_ssize_t, _c.c_int, _P]),
    "gp_torch_free": (None, [_P, _c.c_ssize_t, _c.c_int, _P]),
    "gp_torch_record_stream": (None, [_P, _P]),
    "gp_torch_empty_cache": (None, []),
    "gp_torch_set_memory_fraction": (None, [_c.c_double, _c.c_int]),
    "gp_torch_init": (None, [_c.c_int]),
    "gp_torch_begin_allocate_to_pool": (None, [_c.c_int, _c.c_uint64, _c.c_uint64, _P]),
    "gp_torch_end_allocate_to_pool": (None, [_c.c_int, _c.c_uint64, _c.c_uint64]),
    "gp_torch_release_pool": (None, [_c.c_int, _c.c_uint64, _c.c_uint64]),
    "gp_torch_pool": (_P, [_c.c_int]),
    "gp_torch_get_pool": (_c.c_int, [_c.c_int, _c.POINTER(_P)]),
    "gp_torch_pool_peek": (_P, [_c.c_int]),
    "gp_torch_device_limit": (_c.c_int, []),
    "gp_torch_last_failure": (_c.c_uint64, [_c.c_char_p, _c.c_size_t]),
    "gp_torch_free_failures": (_c.c_uint64, []),
    "gp_torch_release_all": (_c.c_int, [_c.POINTER(gp_leak_report)]),
}

# The entry points torch.cuda.memory.CUDAPluggableAllocator and its setters load.
TORCH_ALLOC = "gp_torch_malloc"
TORCH_FREE = "gp_torch_free"
TORCH_HOOKS = {
    "set_record_stream_fn": "gp_torch_record_stream",
    "set_reset_fn": "gp_torch_empty_cache",
    "set_memory_fraction_fn": "gp_torch_set_memory_fraction",
    "set_init_fn": "gp_torch_init",
    # CUDA graph capture: a private pool per graph (pool/api/capture.c)
    "set_begin_allocate_to_pool": "gp_torch_begin_allocate_to_pool",
    "set_end_allocate_to_pool_fn": "gp_torch_end_allocate_to_pool",
    "set_release_pool": "gp_torch_release_pool",
}


class _Library:
    """The loaded library: attribute access gives C functions with their signatures set."""

    def __init__(self, cdll: ctypes.CDLL, where: str):
        self._cdll = cdll
        self.path = where

    def __getattr__(self, name: str):
        try:
            fn = getattr(self._cdll, name)
        except AttributeError:
            raise AttributeError(
                f"{self.path} has no function {name}: the library was built from an older gpupool "
                "(rebuild it, or point GPUPOOL_LIBRARY at a current build)"
            ) from None
        if name in _SIG:
            fn.restype, fn.argtypes = _SIG[name]
        setattr(self, name, fn)  # cache: later lookups skip __getattr__
        return fn

    def has(self, name: str) -> bool:
        return hasattr(self._cdll, name)

    def address(self, name: str) -> int:
        """The address of an exported function, as PyTorch's set_*_fn setters take it."""
        return ctypes.cast(getattr(self._cdll, name), ctypes.c_void_p).value


_lock = threading.Lock()
_loaded: _Library | None = None


def _repo_root() -> str:
    # python/gpupool/_lib.py -> the checkout's root
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


# Symbols only a sanitizer-instrumented library references (its runtime's entry points).
_SANITIZER_MARKS = (b"__asan_init", b"__tsan_init", b"__ubsan_handle_", b"__msan_init")


def sanitizer_of(path: str) -> str | None:
    """The sanitizer a library was built with ("address", "thread", ...), or None: read from the
    runtime symbols it references, so a copied or renamed build folder is recognised too."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return None
    names = {b"__asan_init": "address", b"__tsan_init": "thread", b"__ubsan_handle_": "undefined",
             b"__msan_init": "memory"}
    found = [names[m] for m in _SANITIZER_MARKS if m in data]
    return "+".join(found) if found else None


def _build_folder_libraries() -> tuple[list[str], list[str]]:
    """(usable, skipped-with-reason) libraries of the source tree's build*/ folders, newest first."""
    root = _repo_root()
    built: list[str] = []
    for n in _LIB_NAMES:
        built.extend(glob.glob(os.path.join(root, "build*", n)))
    built.sort(key=lambda p: os.path.getmtime(p) if os.path.exists(p) else 0, reverse=True)
    usable, skipped = [], []
    for p in built:
        san = sanitizer_of(p)
        if san:
            skipped.append(f"{p} (a {san} sanitizer build: not loadable into an uninstrumented interpreter; "
                           "set GPUPOOL_LIBRARY to use it anyway)")
        else:
            usable.append(p)
    return usable, skipped


def candidates() -> list[str]:
    """Every path load() tries, in order (the environment variable's first, when set)."""
    out: list[str] = []
    env = os.environ.get("GPUPOOL_LIBRARY")
    if env:
        out.append(env)
    here = os.path.dirname(os.path.abspath(__file__))
    out.extend(os.path.join(here, n) for n in _LIB_NAMES)
    out.extend(_build_folder_libraries()[0])
    return out


def load() -> _Library:
    """Loads libgpupool once per process; raises LibraryNotFound saying where it looked."""
    global _loaded
    if _loaded is not None:
        return _loaded
    with _lock:
        if _loaded is not None:
            return _loaded
        tried: list[str] = list(_build_folder_libraries()[1])
        env = os.environ.get("GPUPOOL_LIBRARY")
        for where in candidates():
            if not os.path.exists(where):
                tried.append(f"{where} (no such file)")
                if env and where == env:
                    # an explicit choice that is wrong is an error, not a hint to look elsewhere
                    raise LibraryNotFound(
                        f"GPUPOOL_LIBRARY={env} does not exist; unset it to search "
                        f"the package folder and {os.path.join(_repo_root(), 'build*')}/"
                    )
                continue
            try:
                cdll = ctypes.CDLL(where)
            except OSError as e:
                tried.append(f"{where} ({e})")
                if env and where == env:
                    raise LibraryNotFound(f"GPUPOOL_LIBRARY={env} cannot be loaded: {e}") from e
                continue
            if not hasattr(cdll, "gp_torch_malloc"):
                tried.append(f"{where} (built without the PyTorch entry points: rebuild it)")
                continue
            _loaded = _Library(cdll, os.path.abspath(where))
            return _loaded
        system = ctypes.util.find_library("gpupool")
        if system:
            try:
                cdll = ctypes.CDLL(system)
                if hasattr(cdll, "gp_torch_malloc"):
                    _loaded = _Library(cdll, system)
                    return _loaded
                tried.append(f"{system} (from the system's library path: no PyTorch entry points)")
            except OSError as e:
                tried.append(f"{system} (from the system's library path: {e})")
        else:
            tried.append("the system's library path (ctypes.util.find_library('gpupool') found nothing)")
        if not env:
            tried.insert(0, "GPUPOOL_LIBRARY (not set)")
        if not any("build" in t for t in tried):
            tried.append(f"{os.path.join(_repo_root(), 'build*', 'libgpupool.so')} (no build folder)")
        raise LibraryNotFound(
            "libgpupool not found. Build it (cmake -S . -B build && cmake --build build) or set "
            "GPUPOOL_LIBRARY to its path. Looked in:\n  " + "\n  ".join(tried)
        )


def path() -> str:
    """The path of the library load() found."""
    return load().path
