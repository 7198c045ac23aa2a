"""Memory snapshots for PyTorch's viewers (pytorch.org/memory_viz, torch.cuda._memory_viz), written
by libgpupool itself (gp_snapshot_write: its own pickle writer, the same code `gpupool replay
--snapshot` uses).

    gpupool.snapshot.record_history()          # as torch.cuda.memory._record_memory_history()
    ...                                        # allocations, frees, segments are recorded
    gpupool.snapshot.dump_snapshot("s.pickle") # as torch.cuda.memory._dump_snapshot("s.pickle")

The default format is the dict that torch.cuda.memory._snapshot() returns in PyTorch 2.x: "segments"
(each with its blocks) and "device_traces" (alloc, free_requested, free_completed, segment_alloc /
segment_free or, on virtual memory backends, segment_map / segment_unmap, oom; each with time_us), one
list per device. format="list" writes the segment list alone: the shape of PyTorch 1.x's
torch.cuda.memory_snapshot(), which 1.x's torch.cuda._memory_viz reads. Every segment, block and trace
entry carries its tenant's name in its frames ({"filename": "gpupool tenant", "name": NAME}).
"""

from __future__ import annotations

import ctypes
import os
from typing import Any, Iterable

import gpupool as _gp
from gpupool import _lib

__all__ = ["record_history", "dump_snapshot", "DEFAULT_MAX_ENTRIES"]

DEFAULT_MAX_ENTRIES = 100000


def _served_devices() -> list[int]:
    lib = _lib.load()
    return [d for d in range(lib.gp_torch_device_limit()) if lib.gp_torch_pool_peek(d)]


def record_history(max_entries: int | None = DEFAULT_MAX_ENTRIES, device: Any = None) -> None:
    """Records the pool's allocation events, keeping the last `max_entries` (None or 0 stops and
    forgets them). device None: every pool that exists now and the current device's (created if
    needed)."""
    if max_entries is None:
        max_entries = 0
    if isinstance(max_entries, bool) or not isinstance(max_entries, int) or max_entries < 0:
        raise ValueError(f"max_entries must be a non-negative int, not {max_entries!r}")
    lib = _lib.load()
    devices = [_gp._device(device)] if device is not None else sorted(set(_served_devices()) | {_gp._device(None)})
    for d in devices:
        _gp._check(lib.gp_history_record(_gp._pool(d), max_entries))


def dump_snapshot(path: str | os.PathLike, format: str = "dict", devices: Iterable[Any] | None = None) -> str:
    """Writes a snapshot of the pools of `devices` (default: every device gpupool serves) to `path`;
    returns the path. format "dict" (PyTorch 2.x's _snapshot()) or "list" (1.x's segment list)."""
    if format not in ("dict", "list"):
        raise ValueError(f"format must be 'dict' or 'list', not {format!r}")
    lib = _lib.load()
    if devices is None:
        devs = _served_devices() or [_gp._device(None)]
    else:
        devs = [_gp._device(d) for d in devices]
    handles = (ctypes.c_void_p * len(devs))(*[_gp._pool(d) for d in devs])
    target = os.fspath(path)
    flags = _lib.GP_SNAPSHOT_LIST if format == "list" else 0
    _gp._check(lib.gp_snapshot_write(handles, len(devs), target.encode(), flags))
    return target
