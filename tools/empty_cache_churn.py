#!/usr/bin/env python3
"""Device calls per step of a training-like loop that calls torch.cuda.empty_cache() after every step,
under each empty_cache mode of gpupool (GPUPOOL_CONF empty_cache:trim|working-set|off), on the
simulated GPU: the figure behind "empty_cache without churn" (issue 13 item 7).

Each step allocates what one step of a training loop does (a few large tensors, many small ones; the
same sizes every step, drawn once from a fixed seed), frees them all, then calls the empty_cache
hook that PyTorch calls (gp_torch_empty_cache). Device calls are the simulated GPU's allocate, free,
create, release, map and unmap calls. After `--steps` steps the loop shrinks to a quarter of its sizes
for as many steps: the modes that give memory back must do so there.

Usage: python3 tools/empty_cache_churn.py [--steps N] [--backend sim|sim-vmm] [--json]
Needs libgpupool (GPUPOOL_LIBRARY, or a build in build/).
"""
import argparse
import ctypes
import json
import os
import random
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python"))

import gpupool  # noqa: E402
from gpupool import _lib  # noqa: E402

MiB = 1 << 20
DEVICE_CALLS = (1 << 0) | (1 << 1) | (1 << 11) | (1 << 12) | (1 << 13) | (1 << 14)


def step_sizes(rng, scale):
    sizes = [int(rng.uniform(8, 48) * MiB * scale) for _ in range(6)]
    sizes += [int(rng.uniform(1, 512) * 1024 * scale) for _ in range(60)]
    return sizes


def run(mode, steps, backend):
    os.environ["GPUPOOL_CONF"] = f"backend:{backend},device_memory:2GiB,empty_cache:{mode}"
    gpupool.release_all()
    lib = _lib.load()
    pool = gpupool._pool(0)
    sim_of = lib._cdll.gp_sim_of
    sim_of.restype, sim_of.argtypes = ctypes.c_void_p, [ctypes.c_void_p]
    calls = lib._cdll.gp_sim_calls
    calls.restype, calls.argtypes = ctypes.c_uint64, [ctypes.c_void_p, ctypes.c_uint]
    sim = sim_of(pool)
    per_step = []
    reserved = []
    for i in range(2 * steps):
        scale = 1.0 if i < steps else 0.25
        before = calls(sim, DEVICE_CALLS)
        live = []
        for size in step_sizes(random.Random(1), scale):
            ptr = lib.gp_torch_malloc(size, 0, None)
            if not ptr:
                raise SystemExit(f"allocation of {size} failed: {gpupool.last_error()}")
            live.append(ptr)
        for ptr in reversed(live):
            lib.gp_torch_free(ptr, 0, 0, None)
        lib.gp_torch_empty_cache()
        per_step.append(calls(sim, DEVICE_CALLS) - before)
        reserved.append(gpupool.stats(0)["reserved_bytes"])
    gpupool.release_all()
    return per_step, reserved


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--backend", default="sim", choices=("sim", "sim-vmm"))
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    out = {}
    for mode in ("trim", "working-set", "off"):
        per_step, reserved = run(mode, args.steps, args.backend)
        s = args.steps
        out[mode] = {
            "device_calls_first_step": per_step[0],
            "device_calls_per_step_after_warmup": sum(per_step[2:s]) / (s - 2),
            "device_calls_steps_3_to_n": sum(per_step[2:s]),
            "reserved_end_of_large_phase_mib": reserved[s - 1] / MiB,
            "reserved_end_of_small_phase_mib": reserved[-1] / MiB,
            "device_calls_small_phase": sum(per_step[s:]),
        }
    if args.json:
        print(json.dumps(out))
        return 0
    print(f"{args.steps} steps, then {args.steps} steps at a quarter of the sizes; backend {args.backend}")
    print(f"{'mode':<12} {'calls step 1':>12} {'calls/step 3..N':>16} {'reserved (large)':>17} "
          f"{'reserved (small)':>17} {'calls small phase':>18}")
    for mode, r in out.items():
        print(f"{mode:<12} {r['device_calls_first_step']:>12} {r['device_calls_per_step_after_warmup']:>16.1f} "
              f"{r['reserved_end_of_large_phase_mib']:>13.0f} MiB {r['reserved_end_of_small_phase_mib']:>13.0f} MiB "
              f"{r['device_calls_small_phase']:>18}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
