"""gpupool as PyTorch's CUDA allocator.

    import torch
    import gpupool.torch
    gpupool.torch.install()                 # before any CUDA work: every CUDA tensor comes from gpupool

    with gpupool.torch.model("llama", max="20GiB"):
        out = llama(batch)                  # this thread's allocations are charged to "llama"
    gpupool.torch.stats()["tenants"]["llama"]["held_bytes_peak"]

install() hands PyTorch the entry points of libgpupool through torch.cuda.memory.CUDAPluggableAllocator
(gp_torch_malloc / gp_torch_free) and the allocator object's hooks: record_stream (Tensor.record_stream),
reset (torch.cuda.empty_cache), memory fraction (torch.cuda.set_per_process_memory_fraction) and init.
PyTorch only swaps an allocator it has not initialised, hence "before any CUDA work".

What changes for PyTorch code once installed: nothing for the statistics. PyTorch's pluggable
allocator implements none of torch.cuda.memory_stats() and friends (they raise, pytorch/pytorch#133281),
so install(patch_stats=True), the default, makes them answer from gpupool with PyTorch's key names and
meanings (gpupool/torch_stats.py says which figures are exact). Snapshots for memory_viz come from
record_history() and dump_snapshot() (gpupool/snapshot.py) instead of torch.cuda.memory's.

torch.cuda.empty_cache() calls gpupool's reset hook, whose behaviour is the configuration key
empty_cache (GPUPOOL_CONF): working-set (the default) gives back only what no one in the pool is
likely to use again, so a loop that calls it every step stops asking the device for memory after its
first steps; trim gives every cached byte back (PyTorch's own behaviour); off ignores the call.

Out of memory. When gpupool refuses an allocation (device full, or a tenant over its max),
gp_torch_malloc returns NULL and the reason is readable with gpupool.torch.last_error(). Whether
PyTorch turns that NULL into torch.cuda.OutOfMemoryError depends on the PyTorch version: the
CUDAPluggableAllocator sources up to 2.10 hand the NULL on as the tensor's data pointer (see
bench/gpu/README.md). model(..., mempool=True) routes the model's allocations through a
torch.cuda.MemPool whose segments come from gpupool instead; there PyTorch's own caching allocator sees
the NULL and raises torch.cuda.OutOfMemoryError, so a model over budget fails cleanly while the others
keep running. model() uses that route by default when install() was not called.
"""

from __future__ import annotations

import contextlib
import os
import threading
from typing import Any, Iterator

try:
    import torch as _torch
except ImportError as _e:  # pragma: no cover - exercised only where torch is missing
    raise ImportError(
        "gpupool.torch needs PyTorch (import torch failed: %s); the rest of the gpupool package works "
        "without it" % (_e,)
    ) from _e

import gpupool as _gp
from gpupool import _lib
from gpupool import torch_stats as _torch_stats
from gpupool.snapshot import dump_snapshot, record_history  # noqa: F401 - re-exported
from gpupool import (  # noqa: F401 - re-exported
    GpupoolError,
    LibraryNotFound,
    OutOfMemory,
    QuotaExceeded,
    TenantPaused,
    check,
    config_help,
    failures,
    last_error,
    library_path,
    maintain,
    memory_summary,
    parse_size,
    resume,
    set_limits,
    stats,
    tenant_stats,
    tenants,
    trim,
)

__all__ = [
    "install",
    "is_installed",
    "patch_stats",
    "unpatch_stats",
    "dump_snapshot",
    "record_history",
    "empty_cache",
    "probe_out_of_memory",
    "model",
    "bind_stream",
    "stats",
    "tenant_stats",
    "tenants",
    "memory_summary",
    "pause",
    "resume",
    "trim",
    "set_limits",
    "last_error",
    "failures",
    "GpupoolError",
    "LibraryNotFound",
]

_lock = threading.Lock()
_installed: Any = None     # the CUDAPluggableAllocator handed to PyTorch (kept alive: PyTorch holds
                           # only the C++ object, and its function pointers point into our library)
_pool_allocator: Any = None  # a second one, never installed, behind the per-model MemPools
_mempools: dict = {}        # (name, device) -> torch.cuda.MemPool


def _require_cuda_build() -> None:
    if not hasattr(_torch._C, "_cuda_customAllocator") or not hasattr(_torch.cuda, "memory"):
        raise RuntimeError(
            f"this PyTorch ({_torch.__version__}) is built without CUDA: gpupool.torch needs a CUDA build"
        )


def _make_allocator(with_hooks: bool):
    lib = _lib.load()  # LibraryNotFound names every place it looked
    alloc = _torch.cuda.memory.CUDAPluggableAllocator(lib.path, _lib.TORCH_ALLOC, _lib.TORCH_FREE)
    if with_hooks:
        obj = alloc.allocator()
        missing = []
        for setter, symbol in _lib.TORCH_HOOKS.items():
            fn = getattr(obj, setter, None)
            if fn is None:
                missing.append(setter)
                continue
            fn(lib.address(symbol))
        if missing:
            import warnings

            warnings.warn(
                "this PyTorch's pluggable allocator lacks %s; those hooks stay unset" % ", ".join(missing),
                RuntimeWarning,
                stacklevel=3,
            )
    return alloc


def patch_stats() -> None:
    """Makes torch.cuda.memory_stats() and friends (gpupool.torch_stats.PATCHED) answer from gpupool
    (install() does it unless patch_stats=False)."""
    _torch_stats.patch(_torch)


def unpatch_stats() -> None:
    """Puts PyTorch's own statistics functions back."""
    _torch_stats.unpatch(_torch)


def install(config: str | None = None, patch_stats: bool = True) -> None:
    """Makes gpupool PyTorch's CUDA allocator for this process. Call it before any CUDA work.

    `config` ("key:value,...") is added to GPUPOOL_CONF, overriding its keys (e.g. "backend:vmm").
    patch_stats (default True): torch.cuda.memory_stats(), memory_allocated(), max_memory_reserved(),
    reset_peak_memory_stats(), memory_summary(), ... answer from gpupool with PyTorch's keys; False
    leaves torch alone. Calling it again once installed does nothing. Raises RuntimeError when CUDA
    was already initialised, gpupool.LibraryNotFound when libgpupool cannot be found."""
    global _installed
    with _lock:
        if _installed is not None:
            return
        _require_cuda_build()
        if _torch.cuda.is_initialized():
            raise RuntimeError(
                "gpupool.torch.install() must run before any CUDA work: PyTorch has already initialised "
                "CUDA in this process (a tensor on a CUDA device, torch.cuda.init(), current_device(), ...) "
                "and only swaps an allocator that has not been initialised. Call install() right after "
                "`import torch`."
            )
        if config:
            base = os.environ.get("GPUPOOL_CONF", "")
            os.environ["GPUPOOL_CONF"] = f"{base},{config}" if base else config
        alloc = _make_allocator(with_hooks=True)
        try:
            _torch.cuda.memory.change_current_allocator(alloc)
        except RuntimeError as e:
            raise RuntimeError(
                "gpupool.torch.install(): PyTorch refused to swap its CUDA allocator (%s). Call install() "
                "before any CUDA work." % (e,)
            ) from e
        _installed = alloc
        if patch_stats:
            _torch_stats.patch(_torch)


def is_installed() -> bool:
    """True once install() has made gpupool PyTorch's allocator in this process."""
    return _installed is not None


def _mempool_for(name: str, device: int):
    global _pool_allocator
    with _lock:
        pool = _mempools.get((name, device))
        if pool is None:
            if not hasattr(_torch.cuda, "MemPool") or not hasattr(_torch.cuda, "use_mem_pool"):
                raise RuntimeError(
                    f"model(mempool=True) needs torch.cuda.MemPool, which PyTorch {_torch.__version__} lacks"
                )
            if _pool_allocator is None:
                _pool_allocator = _make_allocator(with_hooks=False)
            pool = _torch.cuda.MemPool(_pool_allocator.allocator())
            _mempools[(name, device)] = pool
        return pool


def _cuda_device(device: Any) -> int:
    if device is None:
        return int(_torch.cuda.current_device())
    if isinstance(device, int):
        return device
    return int(_torch.device(device).index if _torch.device(device).index is not None
               else _torch.cuda.current_device())


@contextlib.contextmanager
def model(
    name: str,
    max: Any = None,
    high: Any = None,
    min: Any = None,
    *,
    device: Any = None,
    mempool: bool | None = None,
) -> Iterator[str]:
    """Puts the allocations this thread makes in the body of the ``with`` under tenant `name`, created
    on first use with the limits given (max, high, min: bytes or strings such as "20GiB"; None keeps a
    limit as it is). Nestable; other threads are not affected (bind streams with bind_stream()).

    mempool: route the allocations through a torch.cuda.MemPool backed by gpupool (PyTorch's caching
    allocator in front, gpupool serving its segments under the tenant's budget, and
    torch.cuda.OutOfMemoryError when the budget refuses). Default: only when install() was not called.
    A torch.cuda.OutOfMemoryError raised in the body after gpupool refused an allocation gets gpupool's
    reason appended to its message."""
    dev = _cuda_device(device)
    route = (not is_installed()) if mempool is None else bool(mempool)
    if route and is_installed():
        raise RuntimeError(
            "gpupool.torch.model(mempool=True) puts PyTorch's caching allocator in front of gpupool; once "
            "install() made gpupool the allocator there is none: leave mempool unset"
        )
    if not route and max is not None and _probe.get(dev) is None:
        if probe_out_of_memory(dev) != "oom":
            import warnings

            warnings.warn(
                f"PyTorch {_torch.__version__} does not raise torch.cuda.OutOfMemoryError when gpupool refuses "
                "an allocation through the installed allocator (it hands the NULL on as the tensor's data "
                f"pointer): an allocation past {name!r}'s max would give such a tensor. Budgets that must "
                "fail cleanly need model(..., mempool=True) in a process without install().",
                RuntimeWarning,
                stacklevel=3,
            )
    lib = _lib.load()
    pool_handle = _gp._pool(dev)
    set_limits(name, max=max, high=high, min=min, device=dev)
    before = failures()
    _gp._check(lib.gp_tenant_push(pool_handle, _gp._name(name)))
    try:
        if route:
            with _torch.cuda.use_mem_pool(_mempool_for(name, dev), device=dev):
                yield name
        else:
            yield name
    except _torch.cuda.OutOfMemoryError as e:
        if failures() > before and "gpupool:" not in str(e):
            raise _torch.cuda.OutOfMemoryError(f"{e}\ngpupool: {last_error()}") from e
        raise
    finally:
        _gp._pop(lib, pool_handle)


_probe: dict = {}  # device -> probe_out_of_memory()'s answer
PROBE_TENANT = "gpupool.probe"


def probe_out_of_memory(device: Any = None) -> str:
    """What this PyTorch does when gpupool refuses an allocation under install(): "oom" when it raises
    torch.cuda.OutOfMemoryError, "null" when it hands the NULL on as a tensor's data pointer, else
    "runtime_error" or "no_error". Asks once per device, with torch.empty in a tenant whose max is one
    byte (no kernel touches the result); the tenant "gpupool.probe" stays, empty."""
    if not is_installed():
        raise RuntimeError("probe_out_of_memory() needs install()")
    dev = _cuda_device(device)
    if dev in _probe:
        return _probe[dev]
    lib = _lib.load()
    pool_handle = _gp._pool(dev)
    set_limits(PROBE_TENANT, max=1, device=dev)
    _gp._check(lib.gp_tenant_push(pool_handle, PROBE_TENANT.encode()))
    try:
        t = _torch.empty(4096, dtype=_torch.uint8, device=_torch.device("cuda", dev))
        answer = "null" if t.data_ptr() == 0 else "no_error"
        del t
    except _torch.cuda.OutOfMemoryError:
        answer = "oom"
    except RuntimeError:
        answer = "runtime_error"
    finally:
        _gp._check(lib.gp_tenant_pop(pool_handle))
    _probe[dev] = answer
    return answer


def bind_stream(stream: Any, name: str | None, device: Any = None) -> None:
    """Binds a torch.cuda.Stream (or a raw cudaStream_t as an int) to tenant `name`: allocations on it
    go to that tenant unless the allocating thread is inside a model() block. None unbinds."""
    if device is None and isinstance(stream, _torch.cuda.Stream):
        device = stream.device
    _gp.bind_stream(stream, name, device=None if device is None else _cuda_device(device))


def pause(name: str, keep_contents: bool = True, device: Any = None, synchronize: bool = False) -> None:
    """Releases tenant `name`'s physical memory and keeps its addresses (GPUPOOL_CONF backend:vmm).
    The pool first waits for the work queued on the streams the tenant allocated or freed on (and on
    streams its tensors were recorded for with Tensor.record_stream), not for other models' work; the
    caller must not launch work on the tenant's tensors until resume(). synchronize=True waits for the
    whole device first (torch.cuda.synchronize), for tensors used on a stream the pool never saw. The
    private pools of CUDA graphs captured in the tenant's model() block pause with it, at the same
    addresses: its graphs replay after resume()."""
    dev = None if device is None else _cuda_device(device)
    if synchronize and _torch.cuda.is_initialized():
        _torch.cuda.synchronize(dev)
    _gp.pause(name, keep_contents=keep_contents, device=dev)


def empty_cache(device: Any = None, mode: str = "trim") -> int:
    """Gives cached memory of the device's pool back; returns the bytes given back. mode "trim": every
    cached byte; "working-set": only what the pool did not use during the last 8 calls' intervals
    (gp_release_unused). torch.cuda.empty_cache() itself follows the empty_cache configuration key
    (default working-set) on every device's pool."""
    if mode == "trim":
        return trim(0, device=device)
    if mode != "working-set":
        raise ValueError(f"mode must be 'trim' or 'working-set', not {mode!r}")
    import ctypes

    released = ctypes.c_size_t(0)
    _gp._check(_lib.load().gp_release_unused(_gp._pool(device), ctypes.byref(released)))
    return released.value
