#!/usr/bin/env python3
"""bench/gpu/torch_bench.py — the same PyTorch loops under PyTorch's native CUDA allocator and under
gpupool (gpupool.torch.install()), on one GPU.

Loops (each allocator in its own process: install() must precede any CUDA work, and peaks are per
process):
  train_tf  a decoder-only transformer of about 1.0B parameters in bf16 (d 2048, 18 layers, ffn 8192,
            vocab 32000), AdamW, random tokens: forward, backward, optimizer step, zero_grad(None)
  train_cnn ResNet-50 (torchvision; a small ResNet-like net without it), bf16 autocast, SGD momentum
  serve     three models in one process, each on its own thread and stream: "llm" (a 0.7B decoder),
            "enc" (a 0.1B decoder) and "vision" (ResNet-50), requests of varying shapes. Under gpupool
            each model is a tenant (gpupool.torch.model + bind_stream) whose max is set from a
            calibration pass (1.25 x its peak); then all three run at once, and finally "enc" gets a
            request far over its budget while the others keep serving: it must get
            torch.cuda.OutOfMemoryError, the others must finish, and "enc" must serve again after.

Reported per loop: step time (median of the timed steps, each ended by torch.cuda.synchronize()),
peak reserved (torch.cuda.max_memory_reserved() for native, gpupool's reserved_bytes_peak for gpupool),
peak allocated, device allocation calls (native: memory_stats()["num_device_alloc"]; gpupool:
num_device_allocs), in total and during the timed steps.

Artifacts (under --out, else $OUT, else bench/gpu/out/): results.json, summary.md (the tables), and
the traces of the same training loop for replay: torch_snapshot_train_tf.pickle.gz (PyTorch's
_dump_snapshot of two native steps; tools/snapshot_to_csv.py converts it) and
gpupool_trace_train_tf.csv.gz (gpupool's log: key, the RMM allocation-log CSV `gpupool replay` reads).

Out of memory under install(): PyTorch's CUDAPluggableAllocator (sources up to 2.10) does not check
the pointer its alloc function returns, so gpupool's NULL may become a tensor's data pointer instead of
an OutOfMemoryError. A first child ("probe") asks the installed PyTorch which it does, with
torch.empty only (no kernel touches the result). If it does not raise, the serving loop's gpupool run
uses gpupool.torch.model(..., mempool=True) (PyTorch's caching allocator in front of gpupool, which
does raise), and the table says so.

Usage: torch_bench.py [--quick] [--out DIR] [--only train_tf,train_cnn,serve] [--no-vmm]
       torch_bench.py --child LOOP --allocator native|gpupool --result FILE [...]   (internal)
       torch_bench.py --self-test      (tiny models on the CPU: checks the loops' code, no GPU)
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import json
import math
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "python"))

GiB = float(1 << 30)
MiB = 1 << 20

SIZES = {
    "full": {
        "train_tf": dict(d=2048, layers=18, heads=16, ff=8192, vocab=32000, batch=8, seq=1024, warmup=5, steps=20),
        "train_cnn": dict(batch=128, res=224, warmup=5, steps=20),
        "serve": dict(requests=40, over_requests=10, llm_layers=12, enc_layers=8, res=224),
    },
    "quick": {
        "train_tf": dict(d=2048, layers=18, heads=16, ff=8192, vocab=32000, batch=4, seq=1024, warmup=3, steps=10),
        "train_cnn": dict(batch=64, res=224, warmup=3, steps=10),
        "serve": dict(requests=15, over_requests=5, llm_layers=12, enc_layers=8, res=224),
    },
    "tiny": {  # --self-test on the CPU
        "train_tf": dict(d=64, layers=2, heads=4, ff=128, vocab=100, batch=2, seq=16, warmup=1, steps=2),
        "train_cnn": dict(batch=2, res=32, warmup=1, steps=2),
        "serve": dict(requests=3, over_requests=2, llm_layers=2, enc_layers=1, res=32),
    },
}
TRACE_STEPS = 2


# ==== the loops (run in a child process) ============================================================


def build_gpt(torch, d, layers, heads, ff, vocab, device, dtype):
    nn = torch.nn
    F = torch.nn.functional
    sdpa = getattr(F, "scaled_dot_product_attention", None)

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1 = nn.LayerNorm(d)
            self.qkv = nn.Linear(d, 3 * d, bias=False)
            self.proj = nn.Linear(d, d, bias=False)
            self.ln2 = nn.LayerNorm(d)
            self.fc1 = nn.Linear(d, ff, bias=False)
            self.fc2 = nn.Linear(ff, d, bias=False)

        def forward(self, x):
            b, t, _ = x.shape
            q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, heads, d // heads).permute(2, 0, 3, 1, 4)
            if sdpa is not None:
                a = sdpa(q, k, v, is_causal=True)
            else:  # PyTorch < 2.0 (the CPU self-test)
                w = (q @ k.transpose(-1, -2)) / math.sqrt(d // heads)
                mask = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
                a = w.masked_fill(mask, float("-inf")).softmax(-1) @ v
            x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
            return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(vocab, d)
            self.blocks = nn.ModuleList(Block() for _ in range(layers))
            self.ln = nn.LayerNorm(d)
            self.head = nn.Linear(d, vocab, bias=False)

        def forward(self, idx):
            x = self.emb(idx)
            for blk in self.blocks:
                x = blk(x)
            return self.head(self.ln(x))

    # Build straight on the device in the target dtype where this PyTorch allows it (no fp32 copy).
    old = torch.get_default_dtype()
    try:
        try:
            torch.set_default_dtype(dtype)
            direct_dtype = True
        except (TypeError, RuntimeError):
            direct_dtype = False
        if hasattr(torch.device(device), "__enter__"):
            with torch.device(device):
                model = GPT()
        else:
            model = GPT()
    finally:
        torch.set_default_dtype(old)
    del direct_dtype
    return model.to(device=device, dtype=dtype)  # no copy where it is already there


def build_cnn(torch, device, num_classes=1000):
    try:
        import torchvision

        model = torchvision.models.resnet50(num_classes=num_classes)
        name = "resnet50"
    except Exception:  # no torchvision: a small ResNet-like stack
        nn = torch.nn

        def stage(cin, cout):
            return nn.Sequential(nn.Conv2d(cin, cout, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(cout),
                                 nn.ReLU(inplace=True), nn.Conv2d(cout, cout, 3, padding=1, bias=False),
                                 nn.BatchNorm2d(cout), nn.ReLU(inplace=True))

        model = nn.Sequential(stage(3, 64), stage(64, 128), stage(128, 256), stage(256, 512),
                              nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(512, num_classes))
        name = "cnn(no torchvision)"
    model = model.to(device)
    if device != "cpu":
        model = model.to(memory_format=torch.channels_last)
    return model, name


def timed_loop(torch, device, step, warmup, steps):
    def sync():
        if device != "cpu":
            torch.cuda.synchronize()

    for _ in range(warmup):
        step()
    sync()
    before = mem_report(torch, device)
    times = []
    for _ in range(steps):
        sync()
        t0 = time.perf_counter()
        step()
        sync()
        times.append((time.perf_counter() - t0) * 1e3)
    after = mem_report(torch, device)
    out = {
        "step_ms_median": statistics.median(times),
        "step_ms_mean": statistics.fmean(times),
        "step_ms_min": min(times),
        "steps": steps,
        "warmup": warmup,
    }
    if before and after and before.get("device_allocs") is not None:
        out["device_allocs_timed"] = after["device_allocs"] - before["device_allocs"]
        out["device_frees_timed"] = after["device_frees"] - before["device_frees"]
    return out


ALLOCATOR = {"name": "native", "gt": None, "mempool": False}


def mem_report(torch, device):
    if device == "cpu":
        return None
    gt = ALLOCATOR["gt"]
    if gt is not None and gt.is_installed():
        s = gt.stats()
        return {
            "peak_reserved": s["reserved_bytes_peak"],
            "peak_allocated": s["allocated_bytes_peak"],
            "reserved_now": s["reserved_bytes"],
            "device_allocs": s["num_device_allocs"],
            "device_frees": s["num_device_frees"],
            "source": "gpupool.stats()",
        }
    s = torch.cuda.memory_stats()
    out = {
        "peak_reserved": torch.cuda.max_memory_reserved(),
        "peak_allocated": torch.cuda.max_memory_allocated(),
        "reserved_now": torch.cuda.memory_reserved(),
        "device_allocs": s.get("num_device_alloc"),
        "device_frees": s.get("num_device_free"),
        "source": "torch.cuda (native caching allocator)",
    }
    if gt is not None:  # gpupool behind MemPools: what gpupool itself holds, for the record
        g = gt.stats()
        out["gpupool_peak_reserved"] = g["reserved_bytes_peak"]
        out["gpupool_device_allocs"] = g["num_device_allocs"]
    return out


def loop_train_tf(torch, device, cfg, args):
    F = torch.nn.functional
    torch.manual_seed(0)
    dtype = torch.bfloat16 if device != "cpu" else torch.float32
    model = build_gpt(torch, cfg["d"], cfg["layers"], cfg["heads"], cfg["ff"], cfg["vocab"], device, dtype)
    params = sum(p.numel() for p in model.parameters())
    try:
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=(device != "cpu"))
    except (TypeError, RuntimeError):
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    b, t, v = cfg["batch"], cfg["seq"], cfg["vocab"]

    def step():
        idx = torch.randint(0, v, (b, t + 1), device=device)
        logits = model(idx[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, v).float(), idx[:, 1:].reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    if args.trace_only:
        for _ in range(1 + TRACE_STEPS):
            step()
        if device != "cpu":
            torch.cuda.synchronize()
        return {"params": params, "trace_steps": 1 + TRACE_STEPS}
    res = timed_loop(torch, device, step, cfg["warmup"], cfg["steps"])
    res["params"] = params
    res["tokens_per_step"] = b * t
    if args.snapshot and device != "cpu":
        res["snapshot"] = record_snapshot(torch, step, args.snapshot)
    return res


def record_snapshot(torch, step, path):
    """Two more steps under PyTorch's memory history (after the timed ones, so timing is unaffected)."""
    mem = torch.cuda.memory
    try:
        try:
            mem._record_memory_history(enabled="all", context=None, stacks="python", max_entries=500000)
        except TypeError:
            mem._record_memory_history(True, max_entries=500000)
        for _ in range(TRACE_STEPS):
            step()
        torch.cuda.synchronize()
        raw = path + ".raw"
        mem._dump_snapshot(raw)
        with open(raw, "rb") as src, gzip.open(path, "wb") as dst:
            shutil.copyfileobj(src, dst)
        os.remove(raw)
        return {"path": path, "steps": TRACE_STEPS}
    except Exception as e:  # a snapshot is an artifact, not a result: report and go on
        return {"error": f"{type(e).__name__}: {e}"}
    finally:
        with contextlib.suppress(Exception):
            mem._record_memory_history(enabled=None)


def loop_train_cnn(torch, device, cfg, args):
    F = torch.nn.functional
    torch.manual_seed(0)
    model, name = build_cnn(torch, device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    b, r = cfg["batch"], cfg["res"]
    autocast = (torch.autocast(device_type="cuda", dtype=torch.bfloat16) if device != "cpu"
                else contextlib.nullcontext())

    def step():
        x = torch.randn(b, 3, r, r, device=device)
        if device != "cpu":
            x = x.contiguous(memory_format=torch.channels_last)
        y = torch.randint(0, 1000, (b,), device=device)
        with autocast:
            loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    res = timed_loop(torch, device, step, cfg["warmup"], cfg["steps"])
    res["model"] = name
    return res


def loop_serve(torch, device, cfg, args):
    """Three models, three threads, three streams; budgets and an over-budget request under gpupool."""
    gt = ALLOCATOR["gt"]
    use_gp = gt is not None
    mempool = ALLOCATOR["mempool"]
    cuda = device != "cpu"
    dtype = torch.bfloat16 if cuda else torch.float32
    tiny = args.size == "tiny"
    d_llm, d_enc = (64, 32) if tiny else (2048, 1024)
    vocab = 100 if tiny else 32000

    def tenant(name):
        if use_gp:
            return gt.model(name, mempool=mempool)
        return contextlib.nullcontext()

    def stream_ctx(s):
        return torch.cuda.stream(s) if cuda else contextlib.nullcontext()

    rng = random.Random(1234)
    max_t = 32 if tiny else 1024
    shapes = {
        "llm": [(rng.randint(1, 8), rng.choice([max_t // 8, max_t // 4, max_t // 2, max_t]))
                for _ in range(cfg["requests"])],
        "enc": [(rng.randint(4, 32), rng.choice([max_t // 16, max_t // 8, max_t // 4, max_t // 2]))
                for _ in range(cfg["requests"])],
        "vision": [(rng.choice([8, 16, 32, 64]) if not tiny else 2, cfg["res"]) for _ in range(cfg["requests"])],
    }
    biggest = {"llm": (8, max_t), "enc": (32, max_t // 2), "vision": (64 if not tiny else 2, cfg["res"])}
    streams = {name: (torch.cuda.Stream() if cuda else None) for name in shapes}
    if use_gp:
        for name, s in streams.items():
            gt.bind_stream(s, name)

    models = {}
    for name in shapes:
        with tenant(name), stream_ctx(streams[name]):
            torch.manual_seed(len(name))
            if name == "llm":
                m = build_gpt(torch, d_llm, cfg["llm_layers"], 16 if not tiny else 4, 4 * d_llm, vocab, device, dtype)
            elif name == "enc":
                m = build_gpt(torch, d_enc, cfg["enc_layers"], 16 if not tiny else 4, 4 * d_enc, vocab, device, dtype)
            else:
                m, _ = build_cnn(torch, device)
                m = m.to(dtype)
            models[name] = m.eval()
    if cuda:
        torch.cuda.synchronize()

    def request(name, shape):
        b, t = shape
        with torch.inference_mode():
            if name == "vision":
                x = torch.randn(b, 3, t, t, device=device, dtype=dtype)
                if cuda:
                    x = x.contiguous(memory_format=torch.channels_last)
            else:
                x = torch.randint(0, vocab, (b, t), device=device)
            y = models[name](x)
            return y[..., :1].float().sum()  # keep a small result, drop the big output at once

    def sync(name):
        if cuda:
            streams[name].synchronize()

    # calibration: every shape once, the biggest first (both allocators do it: same warm-up)
    budgets = {}
    for name in shapes:
        with tenant(name), stream_ctx(streams[name]):
            for shape in [biggest[name]] + shapes[name]:
                request(name, shape)
            sync(name)
        if use_gp:
            peak = gt.tenant_stats(name)["held_bytes_peak"]
            budgets[name] = int(math.ceil(peak * 1.25 / (64 * MiB)) * 64 * MiB)
            gt.set_limits(name, max=budgets[name])

    # all three at once
    barrier = threading.Barrier(len(shapes))
    lat = {name: [] for name in shapes}
    errors = {}

    def serve(name, todo, record):
        try:
            with tenant(name), stream_ctx(streams[name]):
                barrier.wait(timeout=120)
                for shape in todo:
                    t0 = time.perf_counter()
                    request(name, shape)
                    sync(name)
                    record[name].append((time.perf_counter() - t0) * 1e3)
        except BaseException as e:  # noqa: BLE001 - reported in the results
            errors[name] = f"{type(e).__name__}: {e}"

    before = mem_report(torch, device)
    t0 = time.perf_counter()
    threads = [threading.Thread(target=serve, args=(n, shapes[n], lat)) for n in shapes]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    wall = time.perf_counter() - t0
    after = mem_report(torch, device)

    per_model = {}
    for name in shapes:
        xs = sorted(lat[name])
        row = {
            "requests": len(xs),
            "mean_ms": statistics.fmean(xs) if xs else None,
            "p90_ms": xs[int(0.9 * (len(xs) - 1))] if xs else None,
            "error": errors.get(name),
        }
        if use_gp:
            st = gt.tenant_stats(name)
            row.update(budget=budgets[name], held_peak=st["held_bytes_peak"], refusals=st["refusals"],
                       within_budget=st["held_bytes_peak"] <= budgets[name] and st["refusals"] == 0)
        per_model[name] = row
    res = {"wall_s": wall, "requests_per_s": sum(len(v) for v in lat.values()) / wall, "models": per_model,
           "route": ("mempool" if mempool else "install") if use_gp else "native"}
    if before and after and before.get("device_allocs") is not None:
        res["device_allocs_timed"] = after["device_allocs"] - before["device_allocs"]

    # one model far over its budget while the others keep serving
    if use_gp:
        over = {"victim": "enc"}
        barrier = threading.Barrier(len(shapes))
        lat2 = {name: [] for name in shapes}
        errors.clear()
        huge = (biggest["enc"][0] * 16, biggest["enc"][1])

        def victim():
            try:
                with tenant("enc"), stream_ctx(streams["enc"]):
                    barrier.wait(timeout=120)
                    try:
                        request("enc", huge)
                        sync("enc")
                        over["outcome"] = "no error (the request fit in the budget)"
                    except torch.cuda.OutOfMemoryError as e:
                        over["outcome"] = "torch.cuda.OutOfMemoryError"
                        over["message"] = str(e).strip().splitlines()[-1][:300]
                    except RuntimeError as e:
                        over["outcome"] = f"RuntimeError (not OutOfMemoryError): {str(e)[:300]}"
                    sync("enc")
                    request("enc", shapes["enc"][0])  # serves again after the refusal
                    sync("enc")
                    over["recovered"] = True
            except BaseException as e:  # noqa: BLE001
                over.setdefault("outcome", f"{type(e).__name__}: {e}")
                over["recovered"] = False

        others = [n for n in shapes if n != "enc"]
        todo = {n: shapes[n][: cfg["over_requests"]] for n in others}
        threads = [threading.Thread(target=victim)] + [
            threading.Thread(target=serve, args=(n, todo[n], lat2)) for n in others]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        over["others_ok"] = all(len(lat2[n]) == len(todo[n]) for n in others) and not errors
        over["others_errors"] = dict(errors)
        over["victim_refusals"] = gt.tenant_stats("enc")["refusals"]
        over["budgets_held"] = {n: gt.tenant_stats(n)["held_bytes_peak"] <= budgets[n] for n in shapes}
        res["over_budget"] = over
    return res


def loop_probe(torch, device, cfg, args):
    """What this PyTorch does with gp_torch_malloc's NULL: torch.empty only, no kernel on the result."""
    gt = ALLOCATOR["gt"]
    torch.zeros(1, device=device)
    out = {"torch": torch.__version__, "outcome": gt.probe_out_of_memory()}
    out["gpupool_message"] = gt.last_error()
    return out


LOOPS = {"train_tf": loop_train_tf, "train_cnn": loop_train_cnn, "serve": loop_serve, "probe": loop_probe}


def child(args):
    import torch

    device = args.device
    if args.allocator == "gpupool":
        import gpupool.torch as gt

        ALLOCATOR.update(name="gpupool", gt=gt, mempool=args.mempool)
        if not args.mempool:
            gt.install()  # before any CUDA work
    if device != "cpu":
        torch.backends.cudnn.benchmark = False
        torch.backends.cuda.matmul.allow_tf32 = True
    cfg = SIZES[args.size].get(args.loop, {})
    t0 = time.perf_counter()
    res = LOOPS[args.loop](torch, device, cfg, args)
    res.update(loop=args.loop, allocator=args.allocator, conf=os.environ.get("GPUPOOL_CONF", ""),
               size=args.size, seconds=time.perf_counter() - t0, torch=torch.__version__)
    mem = mem_report(torch, device)
    if mem:
        res["memory"] = mem
    gt = ALLOCATOR["gt"]
    if gt is not None and device != "cpu":
        res["gpupool_summary"] = gt.memory_summary()
        res["gpupool_failures"] = gt.failures()
        print(res["gpupool_summary"], flush=True)
    with open(args.result, "w") as f:
        json.dump(res, f, indent=1)


# ==== the driver ====================================================================================


def run_child(loop, allocator, size, outdir, conf=None, timeout=300, extra=(), device="cuda", torch_conf=None):
    fd, result = tempfile.mkstemp(prefix=f"{loop}-{allocator}-", suffix=".json")
    os.close(fd)
    env = dict(os.environ)
    if torch_conf is not None:  # PyTorch's own allocator settings (native runs)
        env["PYTORCH_CUDA_ALLOC_CONF"] = torch_conf
    env["PYTHONPATH"] = os.path.join(ROOT, "python") + os.pathsep + env.get("PYTHONPATH", "")
    env["PYTHONUNBUFFERED"] = "1"
    if conf is not None:
        env["GPUPOOL_CONF"] = conf
    cmd = [sys.executable, os.path.abspath(__file__), "--child", loop, "--allocator", allocator, "--size", size,
           "--result", result, "--device", device, *extra]
    label = f"{loop}/{allocator}" + (f" [{conf}]" if conf else "")
    print(f"==> torch_bench: {label}", flush=True)
    t0 = time.perf_counter()
    try:
        p = subprocess.run(cmd, env=env, timeout=timeout, capture_output=True, text=True)
        sys.stdout.write(p.stdout[-4000:])
        if p.returncode != 0:
            sys.stdout.write(p.stderr[-4000:])
            return {"loop": loop, "allocator": allocator, "conf": conf,
                    "error": f"exit {p.returncode}: " + (p.stderr.strip().splitlines() or ["?"])[-1][:300]}
        with open(result) as f:
            res = json.load(f)
        if torch_conf is not None:
            res["allocator"] = f"{allocator} ({torch_conf})"
        print(f"    done in {time.perf_counter() - t0:.1f} s", flush=True)
        return res
    except subprocess.TimeoutExpired:
        return {"loop": loop, "allocator": allocator, "conf": conf, "error": f"timed out after {timeout} s"}
    finally:
        with contextlib.suppress(OSError):
            os.remove(result)


def gib(x):
    return "—" if x is None else f"{x / GiB:.2f}"


def pct(a, b):
    if a is None or b in (None, 0):
        return "—"
    return f"{(a / b - 1) * 100:+.1f}%"


def render(results, probe, size):
    lines = []
    add = lines.append
    add(f"### Training loops ({size})")
    add("")
    add("| loop | allocator | step ms (median) | vs native | peak reserved GiB | vs native | "
        "peak allocated GiB | device allocs total / timed steps |")
    add("|---|---|---:|---:|---:|---:|---:|---:|")
    targets = []
    for loop in ("train_tf", "train_cnn"):
        rows = [r for r in results if r.get("loop") == loop]
        native = next((r for r in rows if r.get("allocator") == "native" and "error" not in r), None)
        for r in rows:
            label = r["allocator"] + (f" ({r['conf']})" if r.get("conf") else "")
            if "error" in r:
                add(f"| {loop} | {label} | error: {r['error']} | | | | | |")
                continue
            m = r.get("memory", {})
            step, nstep = r.get("step_ms_median"), native and native.get("step_ms_median")
            res_, nres = m.get("peak_reserved"), native and native.get("memory", {}).get("peak_reserved")
            add(f"| {loop} | {label} | {step:.1f} | {pct(step, nstep) if r is not native else ''} | {gib(res_)} | "
                f"{pct(res_, nres) if r is not native else ''} | {gib(m.get('peak_allocated'))} | "
                f"{m.get('device_allocs')} / {r.get('device_allocs_timed')} |")
            if r is not native and native and r["allocator"] == "gpupool":
                ok_t = step <= nstep * 1.01
                targets.append(f"- {loop}, {label}: step time {pct(step, nstep)} vs native "
                               f"(target within +1%): **{'met' if ok_t else 'missed'}**")
                ok_m = res_ <= nres * 0.90
                targets.append(f"- {loop}, {label}: peak reserved {pct(res_, nres)} vs native "
                               f"(target at least 10% below): **{'met' if ok_m else 'missed'}**")
    add("")
    serve = [r for r in results if r.get("loop") == "serve"]
    if serve:
        add(f"### Serving loop: three models, three threads, three streams ({size})")
        add("")
        add("| allocator | route | model | requests | mean ms | p90 ms | budget GiB | peak held GiB | within budget |")
        add("|---|---|---|---:|---:|---:|---:|---:|---|")
        for r in serve:
            if "error" in r:
                add(f"| {r['allocator']} | | error: {r['error']} | | | | | | |")
                continue
            for name, m in r["models"].items():
                mean = "—" if m.get("mean_ms") is None else f"{m['mean_ms']:.1f}"
                p90 = "—" if m.get("p90_ms") is None else f"{m['p90_ms']:.1f}"
                within = m.get("within_budget")
                add(f"| {r['allocator']} | {r.get('route')} | {name} | {m['requests']} | {mean} | {p90} | "
                    f"{gib(m.get('budget'))} | {gib(m.get('held_peak'))} | "
                    f"{'—' if within is None else ('yes' if within else 'NO')}"
                    f"{' (error: ' + m['error'] + ')' if m.get('error') else ''} |")
        add("")
        add("| allocator | wall s | requests/s | peak reserved GiB | device allocs total / timed |")
        add("|---|---:|---:|---:|---:|")
        for r in serve:
            if "error" in r:
                continue
            m = r.get("memory", {})
            add(f"| {r['allocator']} | {r['wall_s']:.2f} | {r['requests_per_s']:.1f} | {gib(m.get('peak_reserved'))} | "
                f"{m.get('device_allocs')} / {r.get('device_allocs_timed')} |")
        gp = next((r for r in serve if r.get("allocator") == "gpupool" and "error" not in r), None)
        if gp and "over_budget" in gp:
            o = gp["over_budget"]
            add("")
            add(f"Over budget: \"{o['victim']}\" asked for 16x its largest batch: **{o.get('outcome')}**"
                f"{' — ' + o['message'] if o.get('message') else ''}; others kept serving: "
                f"**{'yes' if o.get('others_ok') else 'NO ' + json.dumps(o.get('others_errors'))}**; "
                f"\"{o['victim']}\" served again after: **{'yes' if o.get('recovered') else 'NO'}**.")
            budgets_ok = all(m.get("within_budget") for m in gp["models"].values()) and all(
                o.get("budgets_held", {}).values())
            targets.append(f"- serve: every model's budget held: **{'met' if budgets_ok else 'missed'}**")
            oom_ok = o.get("outcome") == "torch.cuda.OutOfMemoryError" and o.get("others_ok") and o.get("recovered")
            targets.append(f"- serve: the model over budget gets torch.cuda.OutOfMemoryError while the others keep "
                           f"running (route: {gp.get('route')}): **{'met' if oom_ok else 'missed'}**")
    if probe:
        add("")
        add(f"PyTorch {probe.get('torch', '?')} with gpupool installed, tenant over budget: "
            f"`torch.empty` gave **{probe.get('outcome', probe.get('error'))}**"
            + (" (OutOfMemoryError raised)" if probe.get("outcome") == "oom" else
               " — PyTorch does not turn the NULL into OutOfMemoryError: model(mempool=True) is the route that does"
               if probe.get("outcome") == "null" else "") + ".")
    if targets:
        add("")
        add("Targets:")
        lines.extend(targets)
    return "\n".join(lines) + "\n"


def self_test():
    """The loops' code on tiny models on the CPU (native allocator only): no GPU needed."""
    args = argparse.Namespace(size="tiny", trace_only=False, snapshot=None)
    import torch

    for loop in ("train_tf", "train_cnn", "serve"):
        res = LOOPS[loop](torch, "cpu", SIZES["tiny"][loop], args)
        print(loop, json.dumps({k: v for k, v in res.items() if k != "models"})[:300])
        if loop == "serve":
            assert all(m["requests"] == SIZES["tiny"]["serve"]["requests"] and not m["error"]
                       for m in res["models"].values()), res
    args.trace_only = True
    loop_train_tf(torch, "cpu", SIZES["tiny"]["train_tf"], args)
    fake = [
        {"loop": "train_tf", "allocator": "native", "conf": "", "step_ms_median": 100.0,
         "memory": {"peak_reserved": 10 * GiB, "peak_allocated": 9 * GiB, "device_allocs": 50},
         "device_allocs_timed": 0},
        {"loop": "train_tf", "allocator": "gpupool", "conf": "backend:cuda", "step_ms_median": 100.5,
         "memory": {"peak_reserved": 8.5 * GiB, "peak_allocated": 9 * GiB, "device_allocs": 40},
         "device_allocs_timed": 0},
        {"loop": "train_cnn", "allocator": "gpupool", "conf": "backend:vmm", "error": "exit 1: boom"},
    ]
    text = render(fake, {"torch": "x", "outcome": "null"}, "tiny")
    assert "| train_tf | gpupool (backend:cuda) | 100.5 | +0.5% | 8.50 | -15.0% |" in text, text
    assert "step time +0.5% vs native (target within +1%): **met**" in text, text
    print(text)
    print("self-test passed")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="the ~2 minute version")
    ap.add_argument("--out", help="artifacts folder (default $OUT, else bench/gpu/out)")
    ap.add_argument("--only", default="train_tf,train_cnn,serve")
    ap.add_argument("--no-vmm", action="store_true", help="skip the gpupool backend:vmm training run")
    ap.add_argument("--no-traces", action="store_true")
    ap.add_argument("--timeout", type=int, default=0, help="seconds per child (default 240, quick 150)")
    ap.add_argument("--self-test", action="store_true")
    # internal: one loop in this process
    ap.add_argument("--child")
    ap.add_argument("--allocator", choices=("native", "gpupool"))
    ap.add_argument("--size", default="full", choices=tuple(SIZES))
    ap.add_argument("--result")
    ap.add_argument("--snapshot")
    ap.add_argument("--trace-only", action="store_true")
    ap.add_argument("--mempool", action="store_true")
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()
    if args.self_test:
        return self_test()
    if args.child:
        args.loop = args.child
        return child(args)

    size = "quick" if args.quick else "full"
    timeout = args.timeout or (150 if args.quick else 240)
    out = args.out or os.environ.get("OUT") or os.path.join(HERE, "out")
    os.makedirs(out, exist_ok=True)
    only = [x for x in args.only.split(",") if x]
    start = time.perf_counter()

    probe = run_child("probe", "gpupool", size, out, conf="backend:cuda", timeout=120)
    print("probe:", json.dumps(probe), flush=True)
    serve_mempool = probe.get("outcome") != "oom"

    results = []
    snap = os.path.join(out, "torch_snapshot_train_tf.pickle.gz")
    for loop in ("train_tf", "train_cnn"):
        if loop not in only:
            continue
        extra = ["--snapshot", snap] if (loop == "train_tf" and not args.no_traces) else []
        results.append(run_child(loop, "native", size, out, timeout=timeout, extra=extra))
        results.append(run_child(loop, "native", size, out, timeout=timeout, torch_conf="expandable_segments:True"))
        results.append(run_child(loop, "gpupool", size, out, conf="backend:cuda", timeout=timeout))
        if loop == "train_tf" and not args.no_vmm:
            results.append(run_child(loop, "gpupool", size, out, conf="backend:vmm", timeout=timeout))
    if "serve" in only:
        results.append(run_child("serve", "native", size, out, timeout=timeout))
        results.append(run_child("serve", "native", size, out, timeout=timeout, torch_conf="expandable_segments:True"))
        results.append(run_child("serve", "gpupool", size, out, conf="backend:cuda", timeout=timeout,
                                 extra=["--mempool"] if serve_mempool else []))
    if "train_tf" in only and not args.no_traces:
        log = os.path.join(tempfile.gettempdir(), "gpupool_trace_train_tf.csv")
        tr = run_child("train_tf", "gpupool", size, out, conf=f"backend:cuda,log:{log}", timeout=timeout,
                       extra=["--trace-only"])
        if "error" not in tr and os.path.exists(log):
            with open(log, "rb") as src, gzip.open(os.path.join(out, "gpupool_trace_train_tf.csv.gz"), "wb") as dst:
                shutil.copyfileobj(src, dst)
            os.remove(log)
        else:
            print("gpupool trace: not written:", tr.get("error"), flush=True)

    table = render(results, probe, size)
    gpu = "?"
    with contextlib.suppress(Exception):
        gpu = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20).stdout.strip()
    header = (f"GPU: {gpu}; torch {probe.get('torch', '?')}; {size} run in "
              f"{time.perf_counter() - start:.0f} s\n\n")
    with open(os.path.join(out, "summary.md"), "w") as f:
        f.write(header + table)
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump({"probe": probe, "results": results, "size": size}, f, indent=1, default=str)
    print()
    print(header + table, flush=True)
    failed = [f"{r.get('loop')}/{r.get('allocator')}" for r in results + [probe] if "error" in r]
    if failed:
        print("torch_bench: failed runs: " + ", ".join(failed), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
