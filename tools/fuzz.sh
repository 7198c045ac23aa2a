#!/usr/bin/env bash
# tools/fuzz.sh — builds the libFuzzer targets (tests/fuzz/, GPUPOOL_FUZZ=ON, clang, ASan+UBSan) and
# runs each for a fixed number of runs from its committed corpus. Called by tools/test.sh; run it by
# hand to fuzz longer.
# Usage: bash tools/fuzz.sh [BUILD_DIR]        (default build-fuzz)
# Environment: GPUPOOL_FUZZ_SCALE=K multiplies every run count by K (CI: 1); GPUPOOL_FUZZ_ONLY=api
# runs one target. New inputs that add coverage go to BUILD_DIR/fuzz-corpus/<target> (not into the
# source tree); a crash leaves its input in BUILD_DIR/fuzz-crashes/ and fails the script: fix the bug
# and commit that file under tests/fuzz/<target>/ so that the normal suite replays it from then on.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

dir="${1:-build-fuzz}"
scale="${GPUPOOL_FUZZ_SCALE:-1}"
jobs="$(nproc 2>/dev/null || echo 2)"

# Runs per target, sized so that the three take about 2 minutes on a 2-core machine: fuzz_api makes a
# pool and up to 256 calls per input (~170 inputs/s there), the parsers are far cheaper.
declare -A runs=([api]=12000 [config]=100000 [trace]=400000)
declare -A max_len=([api]=512 [config]=512 [trace]=4096)

clang_bin="$(command -v clang || command -v clang-14 || true)"
if [ -z "$clang_bin" ]; then
    echo "fuzz.sh: clang not found (apt-get install clang libclang-rt-14-dev)" >&2
    exit 1
fi

start=$SECONDS
CC="$clang_bin" cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DGPUPOOL_ASSERTS=ON -DGPUPOOL_FUZZ=ON \
    -DGPUPOOL_SANITIZE="address;undefined" -DGPUPOOL_WITH_CUDA=OFF -DGPUPOOL_BUILD_TESTS=OFF \
    -DGPUPOOL_BUILD_BENCH=OFF -DGPUPOOL_PYTHON_TESTS=OFF >/dev/null
cmake --build "$dir" -j "$jobs" --target fuzz_api fuzz_config fuzz_trace
echo "==> fuzz.sh: built $dir in $((SECONDS - start)) s"

# The fuzz targets report a broken rule with abort(); sanitizers stop at their first report.
export ASAN_OPTIONS="halt_on_error=1:abort_on_error=1:detect_leaks=1:protect_shadow_gap=0:${ASAN_OPTIONS:-}"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1:${UBSAN_OPTIONS:-}"
unset GPUPOOL_CONF
export GPUPOOL_CHECK_LOCK_ORDER=1 # the lock order checked on every path an input drives (pool/base/lock_order.h)

mkdir -p "$dir/fuzz-crashes"
failed=()
for target in api config trace; do
    if [ -n "${GPUPOOL_FUZZ_ONLY:-}" ] && [ "$GPUPOOL_FUZZ_ONLY" != "$target" ]; then
        continue
    fi
    n=$((runs[$target] * scale))
    mkdir -p "$dir/fuzz-corpus/$target"
    t0=$SECONDS
    log="$dir/fuzz-$target.log"
    echo "==> fuzz.sh: fuzz_$target, $n runs"
    # -seed=1: the same runs every time on the same corpus, so a CI failure can be repeated.
    if "$dir/tests/fuzz/fuzz_$target" -runs="$n" -seed=1 -max_len="${max_len[$target]}" -timeout=30 \
        -print_final_stats=1 -artifact_prefix="$dir/fuzz-crashes/$target-" \
        "$dir/fuzz-corpus/$target" "tests/fuzz/$target" >"$log" 2>&1; then
        done_runs="$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")"
        rate="$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log")"
        echo "==> fuzz.sh: fuzz_$target: ${done_runs:-?} executions, ${rate:-?}/s, $((SECONDS - t0)) s"
    else
        tail -n 60 "$log" >&2
        echo "fuzz.sh: fuzz_$target FAILED (log: $log; the input: $dir/fuzz-crashes/$target-*)" >&2
        failed+=("$target")
    fi
done
if [ "${#failed[@]}" -ne 0 ]; then
    echo "fuzz.sh: FAILED: ${failed[*]}" >&2
    exit 1
fi
echo "fuzz.sh: every fuzz target ran clean ($((SECONDS - start)) s)"
