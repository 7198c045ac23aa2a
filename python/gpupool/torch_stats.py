"""torch.cuda's memory statistics answered by gpupool, with PyTorch's key names and meanings.

With gpupool installed as PyTorch's allocator (CUDAPluggableAllocator), PyTorch's own
torch.cuda.memory_stats() and friends raise or return nothing (pytorch/pytorch#133281).
gpupool.torch.install(patch_stats=True), the default, calls patch(torch) so that

    memory_stats, memory_stats_as_nested_dict, memory_allocated, max_memory_allocated,
    memory_reserved, max_memory_reserved, reset_peak_memory_stats, reset_accumulated_memory_stats,
    memory_summary

(in torch.cuda and torch.cuda.memory; the deprecated memory_cached, max_memory_cached,
reset_max_memory_allocated and reset_max_memory_cached call these) answer from the pool that serves
the device. This module does not import torch: the functions work on any device index, and patch()
takes the module to patch, so the same code path runs without a GPU (and without PyTorch) on the
simulated GPU in the tests.

The keys are PyTorch's (torch/cuda/memory.py, CUDACachingAllocator's DeviceStats):
``{allocated_bytes, reserved_bytes, active_bytes, inactive_split_bytes, requested_bytes, allocation,
segment, active, inactive_split}.{all, large_pool, small_pool}.{current, peak, allocated, freed}``,
``num_alloc_retries``, ``num_ooms``, ``num_sync_all_streams``, ``num_device_alloc``,
``num_device_free``, ``max_split_size``, ``oversize_allocations.*``, ``oversize_segments.*``, and
gpupool's own figures under ``gpupool.`` (``gpupool.num_stream_steals``,
``gpupool.tenants.<name>.held_bytes``, ...).

Meanings, and where gpupool's figure comes from:

- small_pool / large_pool: gpupool's small heap (requests up to small_size, packed into small
  segments) and large heap. A segment is one device allocation (cudaMalloc backends) or one run of
  mapped pages of a virtual range (vmm backends); large_pool's reserved bytes also count the pages
  kept unmapped for reuse, so small + large == all.
- current: exact, from one walk of the pool's segments and blocks (gp_get_breakdown) and gp_stats;
  the private pools of CUDA graphs are counted, as PyTorch counts its graphs' pools
  (``gpupool.graph_reserved_bytes`` says how much of reserved they are).
- peak: exact for allocated_bytes.all and reserved_bytes.all (the pool tracks them; reset by
  reset_peak_memory_stats through gp_reset_peaks), where no CUDA graph pool is alive; with graph pools,
  the pool's own peak or the current total, whichever is higher. Every other peak is the highest value
  seen by a call of memory_stats() since the last reset: a lower bound of the true peak.
- allocated / freed (accumulated): exact for allocation.* and allocated_bytes.* (blocks and bytes
  handed out and freed) and for segment.all (device allocate and free calls); requested_bytes,
  reserved_bytes, active*, inactive_split* and segment.small_pool/large_pool are not accumulated by
  gpupool and read 0. reset_accumulated_memory_stats subtracts the values at the reset.
- num_alloc_retries, num_ooms, num_device_alloc, num_device_free: gpupool's counters of the same
  meaning. num_sync_all_streams, max_split_size and oversize_*: PyTorch mechanisms gpupool does not
  have (it splits every block and never synchronises all streams to free memory), 0 (max_split_size:
  -1, PyTorch's "no limit").
"""

from __future__ import annotations

import collections
import ctypes
import threading
from typing import Any

import gpupool as _gp
from gpupool import _lib

__all__ = [
    "memory_stats",
    "memory_stats_as_nested_dict",
    "memory_allocated",
    "max_memory_allocated",
    "memory_reserved",
    "max_memory_reserved",
    "reset_peak_memory_stats",
    "reset_accumulated_memory_stats",
    "memory_summary",
    "patch",
    "unpatch",
    "PATCHED",
]

PATCHED = (
    "memory_stats",
    "memory_stats_as_nested_dict",
    "memory_allocated",
    "max_memory_allocated",
    "memory_reserved",
    "max_memory_reserved",
    "reset_peak_memory_stats",
    "reset_accumulated_memory_stats",
    "memory_summary",
)

_CORE = (
    "allocated_bytes",
    "reserved_bytes",
    "active_bytes",
    "inactive_split_bytes",
    "requested_bytes",
    "allocation",
    "segment",
    "active",
    "inactive_split",
)
_POOLS = ("all", "large_pool", "small_pool")
_EXACT_PEAKS = {("allocated_bytes", "all"), ("reserved_bytes", "all")}

_lock = threading.Lock()
_seen_peaks: dict = {}   # device -> {(stat, pool): highest current seen since the last reset}
_baselines: dict = {}    # device -> {(stat, pool, "allocated"|"freed") or counter name: value at the reset}


def _breakdown(handle: int) -> _lib.gp_breakdown:
    b = _lib.gp_breakdown()
    b.size = ctypes.sizeof(b)
    b.version = _lib.GP_BREAKDOWN_VERSION
    _gp._check(_lib.load().gp_get_breakdown(handle, ctypes.byref(b)))
    return b


def _pool_or_none(dev: int):
    lib = _lib.load()
    if not 0 <= dev < lib.gp_torch_device_limit():
        raise ValueError(f"device {dev} is out of range (0..{lib.gp_torch_device_limit() - 1})")
    return lib.gp_torch_pool_peek(dev)


def _raw(dev: int) -> tuple[dict, dict, dict]:
    """(current, accumulated, gpupool's stats) of device dev; zeros when its pool does not exist yet
    (asking creates no pool, as PyTorch's stats create no CUDA context)."""
    handle = _pool_or_none(dev)
    current: dict = {}
    acc: dict = {}
    own: dict = {}
    kinds = {"large_pool": None, "small_pool": None}
    if handle:
        b = _breakdown(handle)
        kinds = {"large_pool": b.large, "small_pool": b.small}
        own = _gp.stats(dev)
    for pool, k in kinds.items():
        get = (lambda name: int(getattr(k, name))) if k is not None else (lambda name: 0)
        current[("allocated_bytes", pool)] = get("allocated_bytes")
        current[("reserved_bytes", pool)] = get("reserved_bytes")
        current[("active_bytes", pool)] = get("active_bytes")
        current[("inactive_split_bytes", pool)] = get("inactive_split_bytes")
        current[("requested_bytes", pool)] = get("requested_bytes")
        current[("allocation", pool)] = get("allocations")
        current[("segment", pool)] = get("segments")
        current[("active", pool)] = get("active_blocks")
        current[("inactive_split", pool)] = get("inactive_split")
        acc[("allocation", pool, "allocated")] = get("num_allocs_total")
        acc[("allocation", pool, "freed")] = get("num_frees_total")
        acc[("allocated_bytes", pool, "allocated")] = get("alloc_bytes_total")
        acc[("allocated_bytes", pool, "freed")] = get("free_bytes_total")
    for stat in _CORE:
        current[(stat, "all")] = current[(stat, "large_pool")] + current[(stat, "small_pool")]
        for kind in ("allocated", "freed"):
            acc[(stat, "all", kind)] = acc.get((stat, "large_pool", kind), 0) + acc.get((stat, "small_pool", kind), 0)
    acc[("segment", "all", "allocated")] = int(own.get("num_device_allocs", 0))
    acc[("segment", "all", "freed")] = int(own.get("num_device_frees", 0))
    for counter in ("num_alloc_retries", "num_ooms", "num_device_allocs", "num_device_frees"):
        acc[counter] = int(own.get(counter, 0))
    return current, acc, own


def _gpupool_keys(own: dict) -> dict:
    """gpupool's own figures: numbers only (PyTorch's stats are all integers), tenants by name."""
    out: dict = {}
    for k, v in own.items():
        if k == "tenants" and isinstance(v, dict):
            out["tenants"] = {
                name: {tk: int(tv) for tk, tv in t.items() if isinstance(tv, (int, bool))}
                for name, t in v.items()
            }
        elif isinstance(v, (int, bool)):
            out[k] = int(v)
    return out


def memory_stats_as_nested_dict(device: Any = None) -> dict:
    """PyTorch's nested statistics dict for `device` (see the module's docstring for the meanings)."""
    dev = _gp._device(device)
    current, acc, own = _raw(dev)
    with _lock:
        seen = _seen_peaks.setdefault(dev, {})
        base = _baselines.setdefault(dev, {})
        out: dict = {}
        for stat in _CORE:
            out[stat] = {}
            for pool in _POOLS:
                cur = current[(stat, pool)]
                if (stat, pool) in _EXACT_PEAKS:
                    peak = int(own.get(stat + "_peak", cur))
                else:
                    peak = max(seen.get((stat, pool), 0), cur)
                seen[(stat, pool)] = peak
                out[stat][pool] = {
                    "current": cur,
                    "peak": max(peak, cur),
                    "allocated": max(0, acc.get((stat, pool, "allocated"), 0) - base.get((stat, pool, "allocated"), 0)),
                    "freed": max(0, acc.get((stat, pool, "freed"), 0) - base.get((stat, pool, "freed"), 0)),
                }
        for name, counter in (("num_alloc_retries", "num_alloc_retries"), ("num_ooms", "num_ooms"),
                              ("num_device_alloc", "num_device_allocs"), ("num_device_free", "num_device_frees")):
            out[name] = max(0, acc[counter] - base.get(counter, 0))
    out["num_sync_all_streams"] = 0
    out["max_split_size"] = -1
    for name in ("oversize_allocations", "oversize_segments"):
        out[name] = {"current": 0, "peak": 0, "allocated": 0, "freed": 0}
    out["gpupool"] = _gpupool_keys(own)
    return out


def memory_stats(device: Any = None) -> "collections.OrderedDict[str, Any]":
    """The nested dict flattened with "." and sorted by key, as torch.cuda.memory_stats returns it."""
    result: list = []

    def add(prefix: str, obj: Any) -> None:
        if isinstance(obj, dict):
            if prefix:
                prefix += "."
            for k, v in obj.items():
                add(prefix + k, v)
        else:
            result.append((prefix, obj))

    add("", memory_stats_as_nested_dict(device))
    result.sort()
    return collections.OrderedDict(result)


def memory_allocated(device: Any = None) -> int:
    """Bytes of the blocks handed out (rounded to 512 B), as torch.cuda.memory_allocated."""
    return memory_stats(device).get("allocated_bytes.all.current", 0)


def max_memory_allocated(device: Any = None) -> int:
    return memory_stats(device).get("allocated_bytes.all.peak", 0)


def memory_reserved(device: Any = None) -> int:
    """Device memory the pool holds, as torch.cuda.memory_reserved."""
    return memory_stats(device).get("reserved_bytes.all.current", 0)


def max_memory_reserved(device: Any = None) -> int:
    return memory_stats(device).get("reserved_bytes.all.peak", 0)


def reset_peak_memory_stats(device: Any = None) -> None:
    """Every peak starts again from the current value (gp_reset_peaks for the pool's own peaks)."""
    dev = _gp._device(device)
    handle = _pool_or_none(dev)
    if handle:
        _gp._check(_lib.load().gp_reset_peaks(handle))
    with _lock:
        _seen_peaks.pop(dev, None)


def reset_accumulated_memory_stats(device: Any = None) -> None:
    """The accumulated figures ("allocated", "freed", num_alloc_retries, num_ooms, ...) count from now."""
    dev = _gp._device(device)
    _, acc, _ = _raw(dev)
    with _lock:
        _baselines[dev] = dict(acc)


def _format_size(sz: int, pref_sz: float) -> str:
    prefixes = ["B ", "KiB", "MiB", "GiB", "TiB", "PiB"]
    prefix = prefixes[0]
    for new_prefix in prefixes[1:]:
        if pref_sz < 768 * 1024:
            break
        prefix = new_prefix
        sz //= 1024
        pref_sz /= 1024
    return f"{sz:7d} {prefix:<3}"


def _format_count(cnt: int, pref_cnt: float) -> str:
    prefixes = [" ", "K", "M"]
    prefix = prefixes[0]
    for new_prefix in prefixes[1:]:
        if pref_cnt < 750 * 1000:
            break
        prefix = new_prefix
        cnt //= 1000
        pref_cnt /= 1000
    return f"{cnt:7d} {prefix}  "


def memory_summary(device: Any = None, abbreviated: bool = False) -> str:
    """A table in the layout of torch.cuda.memory_summary (from these statistics), followed by
    gpupool's own summary of the pool and its tenants."""
    dev = _gp._device(device)
    stats = memory_stats(dev)
    rows = [
        ("allocated_bytes", "Allocated memory", _format_size),
        ("active_bytes", "Active memory", _format_size),
        ("requested_bytes", "Requested memory", _format_size),
        ("reserved_bytes", "GPU reserved memory", _format_size),
        ("inactive_split_bytes", "Non-releasable memory", _format_size),
        ("allocation", "Allocations", _format_count),
        ("active", "Active allocs", _format_count),
        ("segment", "GPU reserved segments", _format_count),
        ("inactive_split", "Non-releasable allocs", _format_count),
    ]
    width = 79
    lines = ["=" * width,
             f" {'':16} gpupool (PyTorch's layout) memory summary, device ID {dev:<5d}",
             "-" * width,
             f"  {'':9} CUDA OOMs: {stats['num_ooms']:<12d} | {'':6} cudaMalloc retries: {stats['num_alloc_retries']:<8d}",
             "=" * width,
             "        Metric         |  Cur Usage  | Peak Usage  |  Tot Alloc  |  Tot Freed  "]
    for key, name, fmt in rows:
        lines.append("-" * width)
        subs = [("all", name)]
        if not abbreviated:
            subs += [("large_pool", "      from large pool"), ("small_pool", "      from small pool")]
        ref = None
        for sub, label in subs:
            p = f"{key}.{sub}."
            vals = [stats[p + m] for m in ("current", "peak", "allocated", "freed")]
            if ref is None:
                ref = vals
            lines.append(f" {label:<21} | " + " | ".join(fmt(v, r) for v, r in zip(vals, ref)) + " ")
    lines.append("=" * width)
    table = "|" + "|\n|".join(lines) + "|\n"
    if _pool_or_none(dev):
        table += "\n" + _gp.memory_summary(dev)
    return table


# ---- patching torch.cuda --------------------------------------------------------------------------

_originals: dict = {}  # (module name, function name) -> the function replaced


def _targets(torch_module: Any) -> list:
    cuda = getattr(torch_module, "cuda", None)
    if cuda is None:
        raise TypeError(f"{torch_module!r} has no .cuda: pass the torch module")
    mods = [cuda]
    memory = getattr(cuda, "memory", None)
    if memory is not None and memory is not cuda:
        mods.append(memory)
    return mods


def patch(torch_module: Any) -> None:
    """Makes torch.cuda's statistics functions (PATCHED, in torch.cuda and torch.cuda.memory) answer
    from gpupool. Idempotent; unpatch() puts PyTorch's back."""
    with _lock:
        for mod in _targets(torch_module):
            for name in PATCHED:
                key = (mod.__name__, name)
                if key not in _originals:
                    _originals[key] = getattr(mod, name, None)
                setattr(mod, name, globals()[name])


def unpatch(torch_module: Any) -> None:
    """Restores the functions patch() replaced."""
    with _lock:
        for mod in _targets(torch_module):
            for name in PATCHED:
                key = (mod.__name__, name)
                if key in _originals:
                    original = _originals.pop(key)
                    if original is None:
                        delattr(mod, name)
                    else:
                        setattr(mod, name, original)


def is_patched(torch_module: Any) -> bool:
    return all(getattr(mod, name, None) is globals()[name] for mod in _targets(torch_module) for name in PATCHED)
