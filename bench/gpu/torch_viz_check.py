#!/usr/bin/env python3
"""On a GPU, with the installed PyTorch: torch.cuda's statistics and memory_viz under gpupool
(issue 13 items 1 and 2). Not run in CI (no GPU); bench/gpu/run.sh runs it.

1. The same small training loop (a 3-layer MLP, a few steps) runs in two processes, one with PyTorch's
   native allocator and one after gpupool.torch.install(); each reads torch.cuda.memory_stats(),
   memory_allocated(), max_memory_reserved(), reset_peak_memory_stats() and memory_summary() after
   every step. Checked: under gpupool none raises, and every key native PyTorch returns is there
   (gpupool's own come on top, under "gpupool.").
2. Under gpupool, gpupool.torch.record_history() before the loop and dump_snapshot() after it; the
   installed PyTorch's torch.cuda._memory_viz renders trace_plot (and segment_plot where it has it)
   from the dict, into OUT/gpupool_trace_plot.html.

Usage: python3 bench/gpu/torch_viz_check.py [--out DIR]     (prints one JSON line; exit 1 on failure)
"""
import argparse
import json
import os
import subprocess
import sys


def loop(mode, out):
    import torch

    if mode == "gpupool":
        import gpupool.torch

        gpupool.torch.install()
        gpupool.torch.record_history()
    model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 1024)).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    keys = set()
    for _ in range(5):
        x = torch.randn(256, 1024, device="cuda")
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        torch.cuda.synchronize()
        keys |= set(torch.cuda.memory_stats())
        assert torch.cuda.memory_allocated() > 0
        assert torch.cuda.max_memory_reserved() >= torch.cuda.memory_reserved() > 0
        torch.cuda.reset_peak_memory_stats()
        assert "Allocated memory" in torch.cuda.memory_summary()
        torch.cuda.empty_cache()
    result = {"mode": mode, "keys": sorted(keys)}
    if mode == "gpupool":
        import pickle

        import gpupool.torch
        from torch.cuda import _memory_viz as viz

        path = gpupool.torch.dump_snapshot(os.path.join(out, "gpupool_snapshot.pickle"))
        with open(path, "rb") as f:
            snap = pickle.load(f)
        html = viz.trace_plot(snap)
        with open(os.path.join(out, "gpupool_trace_plot.html"), "w") as f:
            f.write(html)
        result["trace_plot_bytes"] = len(html)
        if hasattr(viz, "segment_plot"):
            result["segment_plot_bytes"] = len(viz.segment_plot(snap))
    print(json.dumps(result))


def main(argv):
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "bench/gpu/out"))
    ap.add_argument("--mode", choices=("native", "gpupool"))
    args = ap.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    if args.mode:
        loop(args.mode, args.out)
        return 0
    runs = {}
    for mode in ("native", "gpupool"):
        r = subprocess.run([sys.executable, __file__, "--mode", mode, "--out", args.out], capture_output=True,
                           text=True, timeout=300)
        if r.returncode != 0:
            print(json.dumps({"ok": False, "mode": mode, "stderr": r.stderr[-2000:]}))
            return 1
        runs[mode] = json.loads(r.stdout.strip().splitlines()[-1])
    missing = sorted(set(runs["native"]["keys"]) - set(runs["gpupool"]["keys"]))
    ok = not missing and runs["gpupool"].get("trace_plot_bytes", 0) > 0
    print(json.dumps({"ok": ok, "native_keys": len(runs["native"]["keys"]), "gpupool_keys": len(runs["gpupool"]["keys"]),
                      "missing_under_gpupool": missing, "trace_plot_bytes": runs["gpupool"].get("trace_plot_bytes"),
                      "segment_plot_bytes": runs["gpupool"].get("segment_plot_bytes")}))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
