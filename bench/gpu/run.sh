#!/usr/bin/env bash
# bench/gpu/run.sh — everything gpupool checks on a real GPU, in one script that fits in 10 minutes on
# one H200: builds, runs the C tests and the cuda/vmm smoke program, the Python tests with real
# PyTorch, and bench/gpu/torch_bench.py (PyTorch's allocator against gpupool), then prints a summary
# table last.
#
# Usage: bash bench/gpu/run.sh [--quick]
#   --quick   torch_bench.py --quick (about 2 minutes instead of about 5); also chosen on its own when
#             less time is left than the full benchmark needs
# Artifacts go to $OUT when it is set, else bench/gpu/out/: run.log (all output), summary.md,
# results.json, torch_snapshot_train_tf.pickle.gz, gpupool_trace_train_tf.csv.gz, replay.json.
# Builds go to build-gpu/ (tests, assertions on) and build-gpu-rel/ (Release, for the benchmark).
#
# Works with what the machine has: no network is needed. Without Criterion only the plain-program
# suites are built (GPUPOOL_CRITERION=OFF); jemalloc is needed only by bench/, which is off here.
# Environment:
#   GPUPOOL_GPU_DEADLINE  seconds the whole script may take (default 570)
#   PYTHON                the interpreter with PyTorch (default python3)
#   CUDA_HOME             the CUDA Toolkit (default: from nvcc on PATH, else /usr/local/cuda)
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 1
ROOT="$PWD"

quick=0
for arg in "$@"; do
    case "$arg" in
        --quick) quick=1 ;;
        -h|--help) sed -n '2,21p' "$0"; exit 0 ;;
        *) echo "run.sh: unknown argument '$arg' (try --help)" >&2; exit 2 ;;
    esac
done

OUT_DIR="${OUT:-$ROOT/bench/gpu/out}"
mkdir -p "$OUT_DIR"
LOG="$OUT_DIR/run.log"
: >"$LOG"
exec > >(tee -a "$LOG") 2>&1

DEADLINE="${GPUPOOL_GPU_DEADLINE:-570}"
PY="${PYTHON:-python3}"
JOBS="$(nproc 2>/dev/null || echo 4)"
BUILD="$ROOT/build-gpu"
BUILD_REL="$ROOT/build-gpu-rel"

declare -a S_NAME S_STATUS S_TIME S_NOTE
step_start=0
begin() { step_start=$SECONDS; echo; echo "==> run.sh [$((SECONDS))s]: $1"; }
record() { # record NAME STATUS NOTE
    S_NAME+=("$1"); S_STATUS+=("$2"); S_TIME+=("$((SECONDS - step_start))"); S_NOTE+=("$3")
    echo "==> run.sh: $1: $2${3:+ ($3)}"
}
left() { echo $((DEADLINE - SECONDS)); }

# ---- the machine ------------------------------------------------------------------------------------
begin "machine"
if [ -z "${CUDA_HOME:-}" ]; then
    if command -v nvcc >/dev/null 2>&1; then
        CUDA_HOME="$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")")"
    else
        CUDA_HOME=/usr/local/cuda
    fi
fi
export PATH="$CUDA_HOME/bin:$PATH"
CUDA_LIB="$CUDA_HOME/lib64"; [ -d "$CUDA_LIB" ] || CUDA_LIB="$CUDA_HOME/lib"
gpu="$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | head -1)"
echo "gpu: ${gpu:-none seen by nvidia-smi}"
echo "nvcc: $(nvcc --version 2>/dev/null | tail -1)  (CUDA_HOME=$CUDA_HOME)"
echo "cmake: $(cmake --version 2>/dev/null | head -1)"
echo "cc: $(cc --version 2>/dev/null | head -1)"
torch_info="$("$PY" -c 'import torch; print(torch.__version__, "cuda", torch.version.cuda, "gpu", torch.cuda.is_available())' 2>&1 | tail -1)"
echo "python: $("$PY" --version 2>&1), torch: $torch_info"
record "machine" "ok" "${gpu:-no GPU}; torch $torch_info"

# ---- configure and build ----------------------------------------------------------------------------
have_header() { echo "#include <$1>" | cc -E -x c - >/dev/null 2>&1; }
cmake_args=(-DGPUPOOL_WITH_CUDA=ON -DGPUPOOL_BUILD_BENCH=OFF "-DCUDAToolkit_ROOT=$CUDA_HOME")
criterion=1
# GPUPOOL_GPU_NO_CRITERION=1 takes the path of a machine without Criterion: the plain-program suites
# only (CMake option GPUPOOL_CRITERION=OFF). jemalloc is needed only by bench/, which is off here.
if [ -n "${GPUPOOL_GPU_NO_CRITERION:-}" ] || ! have_header criterion/criterion.h; then
    criterion=0
    cmake_args+=(-DGPUPOOL_CRITERION=OFF)
fi
jemalloc_note=""

begin "build (tests, assertions on)"
mkdir -p "$BUILD" "$BUILD_REL"
if cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DGPUPOOL_ASSERTS=ON "${cmake_args[@]}" >"$BUILD/configure.log" 2>&1 \
    && cmake --build "$BUILD" -j "$JOBS"; then
    built=1
    record "build" "ok" "criterion $([ $criterion = 1 ] && echo yes || echo 'no: plain tests only')$jemalloc_note"
else
    built=0
    tail -40 "$BUILD/configure.log"
    record "build" "FAILED" "see run.log"
fi

begin "build (Release, for the benchmark)"
if cmake -S . -B "$BUILD_REL" -DCMAKE_BUILD_TYPE=Release -DGPUPOOL_ASSERTS=OFF -DGPUPOOL_BUILD_TESTS=OFF \
        -DGPUPOOL_BUILD_CLI=OFF "${cmake_args[@]}" >"$BUILD_REL/configure.log" 2>&1 \
    && cmake --build "$BUILD_REL" -j "$JOBS" --target gpupool; then
    BENCH_LIB="$BUILD_REL/libgpupool.so"
    record "build release" "ok" ""
else
    tail -20 "$BUILD_REL/configure.log"
    BENCH_LIB="$BUILD/libgpupool.so"
    record "build release" "FAILED" "the benchmark uses the test build"
fi

# ---- C tests ----------------------------------------------------------------------------------------
if [ "$built" = 1 ]; then
    begin "C tests"
    # every suite built here (the simulated GPU, and the vmm backend's round trip on this GPU; without
    # Criterion the plain-program suites only); Python's below
    ctest --test-dir "$BUILD" -j "$JOBS" --timeout 240 -E '^python_' --output-on-failure >"$BUILD/ctest.log" 2>&1
    rc=$?
    tail -25 "$BUILD/ctest.log"
    summary="$(grep -E 'tests passed|tests failed' "$BUILD/ctest.log" | tail -1)"
    [ "$criterion" = 1 ] || summary="$summary; Criterion suites not built (no Criterion here)"
    record "C tests (ctest)" "$([ $rc = 0 ] && echo ok || echo FAILED)" "$summary"

    begin "smoke: cuda and vmm backends on this GPU"
    if cc -std=c11 -O2 -D_POSIX_C_SOURCE=200809L -Iinclude -I"$CUDA_HOME/include" bench/gpu/gpu_smoke.c \
            -L"$BUILD" -lgpupool -L"$CUDA_LIB" -lcudart -Wl,-rpath,"$BUILD:$CUDA_LIB" -o "$BUILD/gpu_smoke"; then
        timeout 180 "$BUILD/gpu_smoke" cuda vmm >"$BUILD/smoke.log" 2>&1
        rc=$?
        cat "$BUILD/smoke.log"
        note="$(grep -E '^SMOKE' "$BUILD/smoke.log" | tr '\n' ';' | sed 's/;$//')"
        case $rc in
            0) record "smoke cuda+vmm" "ok" "$note" ;;
            77) record "smoke cuda+vmm" "skipped" "$note" ;;
            *) record "smoke cuda+vmm" "FAILED" "$note" ;;
        esac
    else
        record "smoke cuda+vmm" "FAILED" "did not compile"
    fi
fi

# ---- Python tests with real PyTorch -----------------------------------------------------------------
if [ -f "$BUILD/libgpupool.so" ]; then
    begin "Python tests (real PyTorch)"
    GPUPOOL_LIBRARY="$BUILD/libgpupool.so" PYTHONPATH="$ROOT/python" PYTHONDONTWRITEBYTECODE=1 \
        timeout 240 "$PY" -m unittest discover -s python/tests -v >"$BUILD/python-tests.log" 2>&1
    rc=$?
    cat "$BUILD/python-tests.log"
    summary="$(grep -E '^(Ran|OK|FAILED)' "$BUILD/python-tests.log" | tr '\n' ' ')"
    record "Python tests" "$([ $rc = 0 ] && echo ok || echo FAILED)" "$summary"
fi

# ---- the PyTorch benchmark ----------------------------------------------------------------------------
if [ -f "$BENCH_LIB" ]; then
    begin "torch_bench.py"
    remaining="$(left)"
    bench_args=(--out "$OUT_DIR")
    if [ "$quick" = 1 ] || [ "$remaining" -lt 330 ]; then
        bench_args+=(--quick)
    fi
    if [ "$remaining" -lt 150 ]; then
        record "torch_bench" "skipped" "only ${remaining}s left"
    else
        GPUPOOL_LIBRARY="$BENCH_LIB" PYTHONPATH="$ROOT/python" PYTHONDONTWRITEBYTECODE=1 \
            timeout $((remaining - 40)) "$PY" bench/gpu/torch_bench.py "${bench_args[@]}"
        rc=$?
        record "torch_bench" "$([ $rc = 0 ] && echo ok || echo FAILED)" "${bench_args[*]:2}"
    fi
fi

# ---- torch.cuda stats and memory_viz under gpupool (issue 13) -----------------------------------------
if [ -f "$BENCH_LIB" ] && [ "$(left)" -gt 60 ]; then
    begin "torch_viz_check.py"
    GPUPOOL_LIBRARY="$BENCH_LIB" PYTHONPATH="$ROOT/python" PYTHONDONTWRITEBYTECODE=1 \
        timeout 120 "$PY" bench/gpu/torch_viz_check.py --out "$OUT_DIR" | tee "$OUT_DIR/torch_viz_check.json"
    rc=${PIPESTATUS[0]}
    record "torch_viz_check" "$([ $rc = 0 ] && echo ok || echo FAILED)" "stats keys vs native, trace_plot"
fi

# ---- the traces replay --------------------------------------------------------------------------------
if [ -x "$BUILD/gpupool" ] && [ "$(left)" -gt 25 ]; then
    begin "replay the saved traces"
    tmp="$(mktemp -d)"
    traces=()
    if [ -f "$OUT_DIR/gpupool_trace_train_tf.csv.gz" ]; then
        gunzip -c "$OUT_DIR/gpupool_trace_train_tf.csv.gz" >"$tmp/gpupool_train_tf.csv" && traces+=("$tmp/gpupool_train_tf.csv")
    fi
    if [ -f "$OUT_DIR/torch_snapshot_train_tf.pickle.gz" ]; then
        timeout 60 "$PY" tools/snapshot_to_csv.py "$OUT_DIR/torch_snapshot_train_tf.pickle.gz" \
            -o "$tmp/torch_train_tf.csv" && traces+=("$tmp/torch_train_tf.csv")
    fi
    if [ "${#traces[@]}" -gt 0 ]; then
        timeout 60 "$BUILD/gpupool" replay --json --device-memory 140GiB "${traces[@]}" >"$OUT_DIR/replay.json"
        rc=$?
        head -c 2000 "$OUT_DIR/replay.json"; echo
        record "replay" "$([ $rc = 0 ] && echo ok || echo FAILED)" "${#traces[@]} trace(s): replay.json"
    else
        record "replay" "skipped" "no trace was saved"
    fi
    rm -rf "$tmp"
fi

# ---- summary (last) -----------------------------------------------------------------------------------
echo
echo "================================ run.sh summary ($((SECONDS)) s) ================================"
printf '| %-26s | %-8s | %5s | %s\n' "step" "status" "s" "notes"
printf '|%s|%s|%s|%s\n' "----------------------------" "----------" "-------" "------"
failed=0
for i in "${!S_NAME[@]}"; do
    printf '| %-26s | %-8s | %5s | %s\n' "${S_NAME[$i]}" "${S_STATUS[$i]}" "${S_TIME[$i]}" "${S_NOTE[$i]}"
    [ "${S_STATUS[$i]}" = "FAILED" ] && failed=1
done
if [ -f "$OUT_DIR/summary.md" ]; then
    echo
    cat "$OUT_DIR/summary.md"
fi
exit "$failed"
