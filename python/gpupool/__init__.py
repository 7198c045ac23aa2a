"""gpupool from Python: the per-device pools behind PyTorch's allocator, their stats, budgets and pauses.

Pure Python over ctypes; the C library is found as described in :mod:`gpupool._lib` (first of all the
``GPUPOOL_LIBRARY`` environment variable). Every function works on the pool that the PyTorch entry
points use for a device (one pool per device, created on first use and configured from
``GPUPOOL_CONF``), so what PyTorch allocates after :func:`gpupool.torch.install` is what these report.
Without PyTorch the same pools are reachable, e.g. on the simulated GPU
(``GPUPOOL_CONF=backend:sim,device_memory:1GiB``), which is how the package is tested without a GPU.

    import gpupool
    with gpupool.model("llama", max="20GiB"):   # this thread's allocations go to tenant "llama"
        ...
    gpupool.stats()["tenants"]["llama"]["held_bytes"]
    print(gpupool.memory_summary())

``device=None`` everywhere means PyTorch's current device when PyTorch has initialised CUDA, else 0.
Errors raise :class:`GpupoolError` (or a subclass per code) with gpupool's message.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import re
import sys
import threading
from typing import Any, Iterator

from . import _lib
from ._lib import LibraryNotFound

__all__ = [
    "GpupoolError",
    "OutOfMemory",
    "QuotaExceeded",
    "TenantPaused",
    "LibraryNotFound",
    "parse_size",
    "library_path",
    "stats",
    "tenant_stats",
    "tenants",
    "memory_summary",
    "trim",
    "maintain",
    "check",
    "model",
    "set_limits",
    "bind_stream",
    "pause",
    "resume",
    "last_error",
    "failures",
    "config_help",
    "release_all",
]

__version__ = "0.1.0"


class GpupoolError(RuntimeError):
    """A gpupool call failed. ``code`` is the gp_error code (negative), ``message`` gpupool's text."""

    def __init__(self, code: int, message: str):
        self.code = code
        self.message = message
        super().__init__(message or f"gpupool error {code}")


class OutOfMemory(GpupoolError):
    """GP_ERR_OOM: the device has no memory for the request, even after giving cached memory back."""


class QuotaExceeded(GpupoolError):
    """GP_ERR_QUOTA: the allocation would pass the tenant's max."""


class TenantPaused(GpupoolError):
    """GP_ERR_PAUSED: the tenant is paused."""


_ERROR_CLASSES = {
    _lib.GP_ERR_OOM: OutOfMemory,
    _lib.GP_ERR_QUOTA: QuotaExceeded,
    _lib.GP_ERR_PAUSED: TenantPaused,
}


def _error(code: int, message: str | None = None) -> GpupoolError:
    lib = _lib.load()
    if message is None:
        raw = lib.gp_last_error()
        message = raw.decode(errors="replace") if raw else ""
    if not message:
        raw = lib.gp_strerror(code)
        message = raw.decode(errors="replace") if raw else f"gpupool error {code}"
    return _ERROR_CLASSES.get(code, GpupoolError)(code, message)


def _check(rc: int) -> None:
    if rc != _lib.GP_OK:
        raise _error(rc)


# ---- sizes ----------------------------------------------------------------------------------------

_UNITS = {
    "": 1, "b": 1,
    "k": 1 << 10, "kb": 1 << 10, "kib": 1 << 10,
    "m": 1 << 20, "mb": 1 << 20, "mib": 1 << 20,
    "g": 1 << 30, "gb": 1 << 30, "gib": 1 << 30,
    "t": 1 << 40, "tb": 1 << 40, "tib": 1 << 40,
}
_SIZE_RE = re.compile(r"^\s*([0-9]*)(?:\.([0-9]+))?\s*([a-zA-Z]*)\s*$")
# ctypes converts Python ints to C types by truncating them silently (2**64 becomes 0, which means "no
# limit"): every value handed to the library is range-checked here first.
_SIZE_MAX = (1 << (8 * ctypes.sizeof(ctypes.c_size_t))) - 1
_POINTER_MAX = (1 << (8 * ctypes.sizeof(ctypes.c_void_p))) - 1
_INT_MAX = (1 << (8 * ctypes.sizeof(ctypes.c_int) - 1)) - 1


def _whole_bytes(value: int, text: Any) -> int:
    if value < 0:
        raise ValueError(f"size {text!r} is negative")
    if value > _SIZE_MAX:
        raise ValueError(f"size {text!r} is more than a size_t holds ({_SIZE_MAX} bytes)")
    return value


def parse_size(value: int | float | str | None) -> int:
    """Bytes from an int or a string such as "20GiB", "1.5G", "512MiB" (binary units, as GPUPOOL_CONF);
    None gives 0 (no limit). As in the C parser, a size is a whole number of bytes ("0.3B" and 1.5 are
    refused) that fits a size_t; a bad one raises ValueError, a value of the wrong type TypeError."""
    if value is None:
        return 0
    if isinstance(value, bool):
        raise TypeError("a size cannot be a bool")
    if isinstance(value, int):
        return _whole_bytes(value, value)
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            raise ValueError(f"size {value} is not a number of bytes")
        if not value.is_integer():
            raise ValueError(f"size {value} is not a whole number of bytes")
        return _whole_bytes(int(value), value)
    if isinstance(value, str):
        m = _SIZE_RE.match(value)
        if not m or (not m.group(1) and not m.group(2)) or m.group(3).lower() not in _UNITS:
            raise ValueError(f"bad size {value!r}: expected e.g. 512MiB, 20GiB, 1.5G or a byte count")
        whole, frac, unit = m.group(1) or "0", m.group(2) or "", _UNITS[m.group(3).lower()]
        # exact arithmetic: digits / 10**len(frac) * unit must be a whole number of bytes
        scaled = int(whole + frac) * unit
        denominator = 10 ** len(frac)
        if scaled % denominator:
            raise ValueError(f"size {value!r} is not a whole number of bytes")
        return _whole_bytes(scaled // denominator, value)
    raise TypeError(f"a size must be an int or a string like '20GiB', not {type(value).__name__}")


def _name(name: Any) -> bytes:
    """A tenant name as UTF-8 bytes for the C library, which checks its length (1 to 63 bytes). A NUL
    is refused here: ctypes would cut the name at it, so "a\\0b" would be tenant "a"."""
    if not isinstance(name, str):
        raise TypeError(f"a tenant name is a str, not {type(name).__name__}")
    if "\0" in name:
        raise ValueError(f"tenant name {name!r} contains a NUL character")
    return name.encode()


# ---- devices and pools ----------------------------------------------------------------------------


def _device(device: Any = None) -> int:
    """A device index from None (the current device), an int, "cuda", "cuda:N", "N" or a torch.device;
    ValueError for a string or index that names no device (negative, or past what a C int holds)."""
    if device is None:
        torch = sys.modules.get("torch")
        if torch is not None:
            try:
                if torch.cuda.is_initialized():
                    return int(torch.cuda.current_device())
            except Exception:  # a CPU-only build, or CUDA in a bad state: fall back to 0
                pass
        return 0
    if isinstance(device, bool):
        raise TypeError("a device cannot be a bool")
    if isinstance(device, str):  # before getattr: str has an .index method
        m = re.fullmatch(r"(?:cuda:)?(\d+)", device.strip())
        if m:
            return _device(int(m.group(1)))
        if device.strip() == "cuda":
            return _device(None)
        raise ValueError(f"not a CUDA device: {device!r} (expected e.g. 0, 'cuda' or 'cuda:0')")
    if isinstance(device, int):
        if not 0 <= device <= _INT_MAX:
            raise ValueError(f"device {device} is not a device index (0 to {_INT_MAX})")
        return device
    index = getattr(device, "index", None)  # torch.device
    if isinstance(index, int):
        return _device(index)
    if getattr(device, "type", None) == "cuda":
        return _device(None)
    raise TypeError(f"not a CUDA device: {device!r} (expected an int, a str like 'cuda:0' or a torch.device)")


def _pool(device: Any = None) -> int:
    """The handle of the device's pool, created (from GPUPOOL_CONF) when absent."""
    lib = _lib.load()
    handle = ctypes.c_void_p()
    _check(lib.gp_torch_get_pool(_device(device), ctypes.byref(handle)))
    return handle.value


def library_path() -> str:
    """Where the loaded libgpupool is (loading it if needed)."""
    return _lib.path()


def _stream_handle(stream: Any) -> int | None:
    """A gp_stream from None (the default stream), an int, or an object with .cuda_stream (torch) or
    .ptr (CuPy). ValueError for an int that is not a pointer value (ctypes would wrap 2**64 to NULL)."""
    if stream is None:
        return None
    value = stream if isinstance(stream, int) and not isinstance(stream, bool) else None
    if value is None:
        for attr in ("cuda_stream", "ptr", "handle"):
            v = getattr(stream, attr, None)
            if isinstance(v, int) and not isinstance(v, bool):
                value = v
                break
    if value is None:
        raise TypeError(f"not a stream: {stream!r} (expected an int handle or a torch.cuda.Stream)")
    if not 0 <= value <= _POINTER_MAX:
        raise ValueError(f"stream handle {value} is not a pointer value (0 to {_POINTER_MAX})")
    return value or None


# ---- stats ----------------------------------------------------------------------------------------


def stats(device: Any = None) -> dict:
    """The pool's statistics as a dict (the keys of gp_stats_json: allocated_bytes, reserved_bytes,
    reserved_bytes_peak, num_device_allocs, ...), with "tenants" as a dict keyed by tenant name."""
    lib = _lib.load()
    pool = _pool(device)
    needed = ctypes.c_size_t(0)
    size = 16384
    while True:
        buf = ctypes.create_string_buffer(size)
        _check(lib.gp_stats_json(pool, buf, size, ctypes.byref(needed)))
        if needed.value < size:
            break
        size = needed.value + 1
    data = json.loads(buf.value.decode())
    tenants_list = data.get("tenants", [])
    if isinstance(tenants_list, list):
        for t in tenants_list:  # the JSON says peak_bytes; gp_tenant_stats (tenant_stats()) held_bytes_peak
            if "peak_bytes" in t:
                t.setdefault("held_bytes_peak", t["peak_bytes"])
        data["tenants"] = {t["name"]: t for t in tenants_list}
    return data


def tenant_stats(name: str, device: Any = None) -> dict:
    """One tenant's stats (gp_tenant_get_stats)."""
    lib = _lib.load()
    s = _lib.gp_tenant_stats()
    s.size = ctypes.sizeof(s)
    s.version = _lib.GP_TENANT_STATS_VERSION
    _check(lib.gp_tenant_get_stats(_pool(device), _name(name), ctypes.byref(s)))
    out = {f: getattr(s, f) for f, _ in s._fields_ if f not in ("size", "version")}
    out["name"] = s.name.decode(errors="replace")
    out["paused"] = bool(s.paused)
    return out


def tenants(device: Any = None) -> list[str]:
    """The tenants' names, in order of creation ("default" first)."""
    lib = _lib.load()
    pool = _pool(device)
    count = ctypes.c_size_t(0)
    _check(lib.gp_tenant_count(pool, ctypes.byref(count)))
    names = []
    buf = ctypes.create_string_buffer(_lib.GP_TENANT_NAME_MAX)
    for i in range(count.value):
        _check(lib.gp_tenant_name(pool, i, buf, len(buf)))
        names.append(buf.value.decode(errors="replace"))
    return names


def memory_summary(device: Any = None) -> str:
    """gpupool's human-readable summary of the pool (gp_stats_print), tenants included."""
    lib = _lib.load()
    pieces: list[str] = []

    def write(_opaque, text):
        pieces.append(text.decode(errors="replace"))

    writer = _lib.GP_WRITER(write)
    _check(lib.gp_stats_print(_pool(device), writer, None))
    return "".join(pieces)


def trim(keep: int | str = 0, device: Any = None) -> int:
    """Gives cached memory back to the device until at most `keep` bytes stay cached; returns the bytes
    given back. Only wholly free segments whose last uses have completed are released."""
    lib = _lib.load()
    released = ctypes.c_size_t(0)
    _check(lib.gp_trim(_pool(device), parse_size(keep), ctypes.byref(released)))
    return released.value


def maintain(device: Any = None) -> int:
    """Runs the pool's maintenance (release_threshold, idle_release); returns the bytes given back."""
    lib = _lib.load()
    released = ctypes.c_size_t(0)
    _check(lib.gp_maintain(_pool(device), ctypes.byref(released)))
    return released.value


def check(device: Any = None) -> None:
    """Checks all of the pool's invariants (gp_check); raises GpupoolError naming the first broken one."""
    _check(_lib.load().gp_check(_pool(device)))


# ---- tenants --------------------------------------------------------------------------------------

_tenant_lock = threading.Lock()


def set_limits(name: str, max: Any = None, high: Any = None, min: Any = None, device: Any = None) -> None:
    """Creates tenant `name` with these limits, or changes the limits of an existing one. A limit left
    at None keeps its current value (0, no limit, for a new tenant); 0 removes it."""
    lib = _lib.load()
    pool = _pool(device)
    given = {"max": max, "high": high, "min": min}
    with _tenant_lock:
        s = _lib.gp_tenant_stats()
        s.size = ctypes.sizeof(s)
        s.version = _lib.GP_TENANT_STATS_VERSION
        exists = lib.gp_tenant_get_stats(pool, _name(name), ctypes.byref(s)) == _lib.GP_OK
        current = {"max": s.max, "high": s.high, "min": s.min} if exists else {"max": 0, "high": 0, "min": 0}
        values = {k: (current[k] if v is None else parse_size(v)) for k, v in given.items()}
        limits = _lib.gp_tenant_limits(values["max"], values["high"], values["min"])
        if not exists:
            _check(lib.gp_tenant_create(pool, _name(name), ctypes.byref(limits)))
        elif any(v is not None for v in given.values()):
            _check(lib.gp_tenant_set_limits(pool, _name(name), ctypes.byref(limits)))


@contextlib.contextmanager
def model(name: str, max: Any = None, high: Any = None, min: Any = None, device: Any = None) -> Iterator[str]:
    """Makes tenant `name` the calling thread's current tenant (creating it, or updating the limits
    given) for the body of the ``with``: every allocation this thread makes through gpupool meanwhile
    is charged to it. Nestable; per thread (other threads keep their own tenant)."""
    lib = _lib.load()
    pool = _pool(device)
    set_limits(name, max=max, high=high, min=min, device=device)
    _check(lib.gp_tenant_push(pool, _name(name)))
    try:
        yield name
    finally:
        _pop(lib, pool)


def _pop(lib: Any, pool: int) -> None:
    """Pops the thread's tenant of `pool`; a pool destroyed meanwhile (release_all() inside the with)
    took its frames with it, which is not an error."""
    rc = lib.gp_tenant_pop(pool)
    if rc != _lib.GP_ERR_DESTROYED:
        _check(rc)


def bind_stream(stream: Any, name: str | None, device: Any = None) -> None:
    """Binds a stream (an int handle, or a torch.cuda.Stream) to tenant `name` (created if absent):
    allocations on it go to that tenant unless the thread has a current tenant. name None unbinds."""
    lib = _lib.load()
    pool = _pool(device)
    if name is not None:
        set_limits(name, device=device)
    _check(lib.gp_tenant_bind_stream(pool, None if name is None else _name(name), _stream_handle(stream)))


def pause(name: str, keep_contents: bool = True, device: Any = None) -> None:
    """Releases tenant `name`'s physical memory, keeping its addresses (vmm and sim-vmm backends only).
    keep_contents copies its live blocks to pinned host memory first, and back on resume(). No kernel
    may use the tenant's memory while it is paused. The pool waits first for the work queued on the
    tenant's streams and on streams its blocks were recorded for, and for no other work."""
    flags = _lib.GP_PAUSE_KEEP_CONTENTS if keep_contents else 0
    _check(_lib.load().gp_tenant_pause(_pool(device), _name(name), flags))


def resume(name: str, device: Any = None) -> None:
    """Maps fresh physical memory at the paused tenant's addresses (and copies its contents back)."""
    _check(_lib.load().gp_tenant_resume(_pool(device), _name(name)))


# ---- errors and housekeeping ----------------------------------------------------------------------


def last_error() -> str:
    """The message of the last failed PyTorch entry point call (gp_torch_malloc, ...) in this process,
    from any thread; "" if none failed."""
    buf = ctypes.create_string_buffer(1024)
    _lib.load().gp_torch_last_failure(buf, len(buf))
    return buf.value.decode(errors="replace")


def failures() -> int:
    """How many PyTorch entry point calls have failed in this process (since release_all())."""
    return int(_lib.load().gp_torch_last_failure(None, 0))


def config_help() -> str:
    """The configuration keys, their defaults and meanings (gp_config_help)."""
    raw = _lib.load().gp_config_help()
    return raw.decode(errors="replace") if raw else ""


def release_all() -> tuple[int, int]:
    """Destroys every pool (for tests; never while PyTorch still holds gpupool memory): the next call
    creates fresh pools from GPUPOOL_CONF. Returns (live blocks, live bytes) that were never freed."""
    report = _lib.gp_leak_report()
    _check(_lib.load().gp_torch_release_all(ctypes.byref(report)))
    return report.live_blocks, report.live_bytes
