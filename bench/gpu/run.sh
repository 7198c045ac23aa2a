#!/usr/bin/env bash
# bench/gpu/run.sh — what gpupool checks on a real GPU, in one run that gives a verdict inside 8 minutes
# by its own clock (GPUPOOL_GPU_DEADLINE, default 480 s).
#
#   1. preflight: nvidia-smi (a GPU), nvcc, the toolkit's libcudart_static.a, a C compiler and CMake,
#      Python with PyTorch (version, CUDA); says what is missing, and stops in seconds without a GPU;
#   2. one build (RelWithDebInfo, assertions on, plain-program tests only: no Criterion needed);
#   3. the steps, in priority order, each with its own time limit cut to what is left:
#        conformance suite on the cuda and on the vmm backend (tests/conformance, the real backends),
#        the virtual-memory questions and call times (bench/gpu/vmm_probe.c: may cuMemMap take an
#        offset into a handle, may one cuMemUnmap span two mappings; cuMemCreate of 1/8/64 pages),
#        the PyTorch hooks under install(), NULL versus OutOfMemoryError on the installed PyTorch,
#        pause/resume with contents under PyTorch and the time of a trim of 8 GiB (backend vmm),
#        three threads on three streams with record_stream checking contents, graph capture
#        (torch.cuda.graph under install()), torch.cuda stats and memory_viz under gpupool
#        (torch_viz_check.py, issue 13), then the training and serving benchmarks against native
#        PyTorch and native with expandable_segments:True (bench/gpu/torch_bench.py --quick).
# The results table ($OUT/run_table.md, else bench/gpu/out/run_table.md) is rewritten after EVERY step, so
# a run cut short still leaves what it measured. Everything printed also goes to run.log there.
#
# Usage: bash bench/gpu/run.sh [--preflight-only]
# Exit: 0 every step passed or was skipped with a reason; 1 a step failed; 3 no GPU here (nothing was
# measured); 4 something needed to build is missing (the preflight says what).
# Environment: GPUPOOL_GPU_DEADLINE (seconds, default 480), PYTHON (default python3), CUDA_HOME.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 1
ROOT="$PWD"

preflight_only=0
for arg in "$@"; do
    case "$arg" in
        --preflight-only) preflight_only=1 ;;
        -h|--help) sed -n '2,24p' "$0"; exit 0 ;;
        *) echo "run.sh: unknown argument '$arg' (try --help)" >&2; exit 2 ;;
    esac
done

OUT_DIR="${OUT:-$ROOT/bench/gpu/out}"
mkdir -p "$OUT_DIR"
LOG="$OUT_DIR/run.log"
SUMMARY="$OUT_DIR/run_table.md" # torch_bench.py writes its own summary.md
: >"$LOG"
exec > >(tee -a "$LOG") 2>&1

DEADLINE="${GPUPOOL_GPU_DEADLINE:-480}"
PY="${PYTHON:-python3}"
JOBS="$(nproc 2>/dev/null || echo 4)"
BUILD="$ROOT/build-gpu"
MACHINE=""

declare -a S_NAME S_STATUS S_TIME S_NOTE
left() { echo $((DEADLINE - SECONDS)); }
render() {
    {
        echo "# bench/gpu/run.sh — $(date -u '+%Y-%m-%d %H:%M UTC'), ${SECONDS} s of ${DEADLINE} s"
        echo
        echo "$MACHINE"
        echo
        echo "| step | status | s | notes |"
        echo "|---|---|---|---|"
        for i in "${!S_NAME[@]}"; do
            echo "| ${S_NAME[$i]} | ${S_STATUS[$i]} | ${S_TIME[$i]} | ${S_NOTE[$i]} |"
        done
    } >"$SUMMARY.tmp" && mv "$SUMMARY.tmp" "$SUMMARY"
}
record() { # record NAME STATUS SECONDS NOTE
    S_NAME+=("$1"); S_STATUS+=("$2"); S_TIME+=("$3"); S_NOTE+=("${4//|/\/}")
    echo "==> run.sh [${SECONDS}s]: $1: $2${4:+ ($4)}"
    render
}

# ---- 1. preflight -----------------------------------------------------------------------------------
if [ -z "${CUDA_HOME:-}" ]; then
    if command -v nvcc >/dev/null 2>&1; then
        CUDA_HOME="$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")")"
    else
        CUDA_HOME=/usr/local/cuda
    fi
fi
export PATH="$CUDA_HOME/bin:$PATH"
missing=()
gpu=""
if command -v nvidia-smi >/dev/null 2>&1; then
    gpu="$(timeout 20 nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | head -1)"
    [ -n "$gpu" ] || missing+=("a GPU: nvidia-smi lists none (no device, or the driver is not loaded)")
else
    missing+=("nvidia-smi: no NVIDIA driver installed")
fi
nvcc_v="$(nvcc --version 2>/dev/null | tail -1)"
[ -n "$nvcc_v" ] || missing+=("nvcc: no CUDA Toolkit on PATH or in CUDA_HOME=$CUDA_HOME (only informative: the build needs the toolkit's headers and libcudart_static.a)")
cudart=""
for d in "$CUDA_HOME/lib64" "$CUDA_HOME/lib" "$CUDA_HOME/targets/x86_64-linux/lib" "$CUDA_HOME/targets/sbsa-linux/lib"; do
    [ -f "$d/libcudart_static.a" ] && cudart="$d/libcudart_static.a" && break
done
build_missing=()
[ -n "$cudart" ] || build_missing+=("libcudart_static.a: not in $CUDA_HOME (install the toolkit's cudart dev package, or set CUDA_HOME)")
[ -f "$CUDA_HOME/include/cuda_runtime_api.h" ] || build_missing+=("cuda_runtime_api.h: not in $CUDA_HOME/include")
command -v cc >/dev/null 2>&1 || build_missing+=("cc: no C compiler")
command -v cmake >/dev/null 2>&1 || build_missing+=("cmake")
torch_v="$(timeout 60 "$PY" -c 'import torch; print(torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())' 2>/dev/null | tail -1)"
have_torch=0
case "$torch_v" in *"available True"*) have_torch=1 ;; esac
MACHINE="GPU: ${gpu:-none}; nvcc: ${nvcc_v:-none}; cudart_static: ${cudart:-none}; cc: $(cc --version 2>/dev/null | head -1); cmake: $(cmake --version 2>/dev/null | head -1); torch: ${torch_v:-not importable with $PY}"
echo "$MACHINE"
for m in "${missing[@]}" "${build_missing[@]}"; do echo "preflight: missing: $m"; done
[ "$have_torch" = 1 ] || echo "preflight: missing: PyTorch with CUDA for $PY (the PyTorch steps are skipped)"
if [ -z "$gpu" ]; then
    echo "preflight: no GPU: nothing to measure here; the GPU figures stay unmeasured"
    record "preflight" "no GPU" "$SECONDS" "nothing measured: ${missing[*]}"
    exit 3
fi
if [ "${#build_missing[@]}" -gt 0 ]; then
    echo "preflight: missing what the build needs: cannot go on"
    record "preflight" "FAILED" "$SECONDS" "${build_missing[*]}"
    exit 4
fi
echo "preflight: ready"
record "preflight" "ok" "$SECONDS" "torch: ${torch_v:-none}"
[ "$preflight_only" = 1 ] && exit 0

# ---- 2. one build -------------------------------------------------------------------------------------
t0=$SECONDS
mkdir -p "$BUILD"
if timeout $(( $(left) - 60 )) cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DGPUPOOL_WITH_CUDA=ON \
        "-DCUDAToolkit_ROOT=$CUDA_HOME" -DGPUPOOL_CRITERION=OFF -DGPUPOOL_BUILD_BENCH=OFF -DGPUPOOL_PYTHON_TESTS=OFF \
        >"$BUILD/configure.log" 2>&1 \
   && timeout $(( $(left) - 60 )) cmake --build "$BUILD" -j "$JOBS" --target gpupool conformance vmm_probe >"$BUILD/build.log" 2>&1; then
    record "build" "ok" "$((SECONDS - t0))" "one build: RelWithDebInfo, assertions on, no Criterion"
else
    tail -30 "$BUILD/configure.log" "$BUILD/build.log" 2>/dev/null
    record "build" "FAILED" "$((SECONDS - t0))" "see run.log"
    exit 1
fi
export GPUPOOL_LIBRARY="$BUILD/libgpupool.so"
export PYTHONPATH="$ROOT/python:$ROOT/python/tests${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONDONTWRITEBYTECODE=1

failed=0
# step NAME BUDGET_S GPUPOOL_CONF COMMAND...: runs with the smaller of its budget and the time left (20 s
# kept for the table); records ok / FAILED / skipped, with the RESULT lines and the last line as notes.
step() {
    local name="$1" budget="$2" conf="$3"; shift 3
    local room=$(( $(left) - 20 ))
    if [ "$room" -lt 15 ]; then
        record "$name" "skipped" 0 "out of time (deadline ${DEADLINE} s)"
        return
    fi
    [ "$budget" -gt "$room" ] && budget="$room"
    local t=$SECONDS logf="$OUT_DIR/step-$(echo "$name" | tr -c 'a-zA-Z0-9' '_').log"
    echo; echo "==> run.sh [${SECONDS}s]: $name (limit ${budget} s)"
    GPUPOOL_CONF="$conf" timeout "$budget" "$@" >"$logf" 2>&1
    local rc=$?
    tail -15 "$logf"
    local notes
    notes="$(grep -E '^RESULT|^(passed|FAILED):|^OK|^Ran |skipped|^vmm_probe: ([^t]|the )' "$logf" | tr '\n' ' ' | cut -c1-600)"
    case $rc in
        0) if grep -q "skipped '" "$logf"; then record "$name" "skipped" "$((SECONDS - t))" "$notes"; else record "$name" "ok" "$((SECONDS - t))" "$notes"; fi ;;
        124) record "$name" "FAILED" "$((SECONDS - t))" "timed out after ${budget} s; $notes"; failed=1 ;;
        *) record "$name" "FAILED" "$((SECONDS - t))" "exit $rc; $notes"; failed=1 ;;
    esac
}
torch_test() { (cd "$ROOT/python/tests" && "$PY" -m unittest -v "test_torch.Installed.$1"); }

# ---- 3. the steps, most important first ---------------------------------------------------------------
step "conformance cuda" 60 "" "$BUILD/tests/conformance" cuda
step "conformance vmm" 60 "" "$BUILD/tests/conformance" vmm
step "vmm questions + call times" 30 "" "$BUILD/tests/vmm_probe" 20
if [ "$have_torch" = 1 ]; then
    step "PyTorch hooks (install)" 60 "backend:cuda" torch_test test_tensors_stats_hooks_and_streams
    step "NULL vs OOM" 45 "backend:cuda" torch_test test_over_budget_in_an_installed_pool_raises_out_of_memory
    step "pause/resume + trim 8 GiB" 60 "backend:vmm" "$PY" bench/gpu/torch_checks.py trim
    step "3 threads, 3 streams" 60 "backend:cuda" "$PY" bench/gpu/torch_checks.py threads
    step "graph capture" 60 "backend:cuda" torch_test test_graph_capture_allocates_from_a_private_pool_and_replays
    step "torch.cuda stats + memory_viz" 60 "backend:cuda" "$PY" bench/gpu/torch_viz_check.py --out "$OUT_DIR"
    step "benchmarks vs native" 400 "" "$PY" bench/gpu/torch_bench.py --quick --no-traces --no-vmm --timeout 60 --out "$OUT_DIR"
else
    record "PyTorch steps" "skipped" 0 "no PyTorch with CUDA for $PY"
fi

echo
echo "================================ run.sh: ${SECONDS} s ================================"
cat "$SUMMARY"
[ -f "$OUT_DIR/summary.md" ] && { echo; cat "$OUT_DIR/summary.md"; }
exit "$failed"
