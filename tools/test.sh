#!/usr/bin/env bash
# tools/test.sh — builds and runs every test suite: plain (build/), ASan+UBSan (build-asan/) and
# TSan (build-tsan/, the "threaded" suites only); the benchmarks' Release build with asserts off
# (build-bench/); then the analysers (tools/analyse.sh: clang-tidy,
# cppcheck, valgrind memcheck) and the fuzz targets for a fixed number of runs (tools/fuzz.sh,
# build-fuzz/). Installs missing Debian packages first.
# Usage: bash tools/test.sh [--quick]     --quick: the plain build only (no sanitizers, analysers, fuzzing)
# Exits non-zero when a build, any suite, an analyser or a fuzz target fails. GPUPOOL_BUILD_DIR=DIR
# builds in DIR, DIR-asan, DIR-tsan, DIR-bench and DIR-fuzz instead; extra CMake arguments can be given in
# GPUPOOL_CMAKE_ARGS (not to the fuzz build).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

quick=0
for arg in "$@"; do
    case "$arg" in
        --quick) quick=1 ;;
        -h|--help) sed -n '2,10p' "$0"; exit 0 ;;
        *) echo "test.sh: unknown argument '$arg' (try --help)" >&2; exit 2 ;;
    esac
done

# shellcheck source=tools/deps.sh
source tools/deps.sh
gp_install_deps

jobs="$(nproc 2>/dev/null || echo 2)"
build="${GPUPOOL_BUILD_DIR:-build}"
read -r -a extra_args <<<"${GPUPOOL_CMAKE_ARGS:-}"

# Sanitizers stop at the first report, so a failing suite says why. protect_shadow_gap=0 lets the
# CUDA driver map memory where ASan would otherwise reserve its shadow gap (needed on real GPUs).
# handle_segv=0: some tests expect a SIGSEGV (the sim maps device memory PROT_NONE, so a host access
# must kill the test by that signal); ASan's own SEGV handler would turn it into an abort. A crash
# elsewhere is still a failing test; rerun it with ASAN_OPTIONS=handle_segv=1 for ASan's stack trace.
# Options already in the environment come last and so win.
export ASAN_OPTIONS="halt_on_error=1:abort_on_error=1:detect_leaks=1:protect_shadow_gap=0:handle_segv=0:${ASAN_OPTIONS:-}"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1:${UBSAN_OPTIONS:-}"
export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:${TSAN_OPTIONS:-}"

failed=()
passed=()
skipped=()
suites=0

# configure_build DIR [cmake args...]: configures and builds; a build error stops the script.
configure_build() {
    local dir="$1"; shift
    local start=$SECONDS
    echo "==> test.sh: configuring $dir"
    cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DGPUPOOL_ASSERTS=ON "$@" "${extra_args[@]}"
    echo "==> test.sh: building $dir"
    if ! cmake --build "$dir" -j "$jobs"; then
        echo "test.sh: FAILED to build $dir" >&2
        exit 1
    fi
    echo "==> test.sh: built $dir in $((SECONDS - start)) s"
}

# run_ctest NAME DIR [ctest args...]: runs the suites; a failure is recorded and the script goes on.
# No suite at all is a failure, except in the TSan build (see below).
run_ctest() {
    local name="$1" dir="$2"; shift 2
    local start=$SECONDS count
    count="$(ctest --test-dir "$dir" -N "$@" | sed -n 's/^Total Tests: *//p')"
    count="${count:-0}"
    if [ "$count" -eq 0 ] && [ "$name" = tsan ]; then
        # Criterion cannot run under TSan (tests/CMakeLists.txt explains), so only threaded suites
        # written as plain programs are built there; there may be none.
        echo "test.sh: WARNING: no threaded suite runs under TSan (only plain-program suites can)" >&2
        skipped+=("$name")
        return 0
    fi
    echo "==> test.sh: running $count suites in $dir ($name)"
    if ctest --test-dir "$dir" --output-on-failure --no-tests=error -j "$jobs" "$@"; then
        passed+=("$name")
    else
        failed+=("$name")
    fi
    echo "==> test.sh: $name suites took $((SECONDS - start)) s"
    if [ "$name" = plain ]; then
        suites="$count"
    fi
}

# The layering of pool/ first (seconds; also the CTest test `layers`): an upward include fails at once.
if ! python3 tools/check_layers.py; then
    echo "test.sh: FAILED: pool/ breaks its layering (pool/README.md)" >&2
    exit 1
fi

configure_build "$build"
run_ctest plain "$build"

if [ "$quick" -eq 0 ]; then
    # ASan+UBSan. The cuda backend stays ON: the static CUDA runtime works under ASan (without a
    # driver it fails cleanly; with one, protect_shadow_gap=0 above is what it needs). Benchmarks are
    # left out of the sanitizer builds to save time.
    configure_build "$build-asan" -DGPUPOOL_SANITIZE="address;undefined" -DGPUPOOL_BUILD_BENCH=OFF
    run_ctest asan+ubsan "$build-asan"

    # TSan: only the suites labelled "threaded" (see tests/CMakeLists.txt).
    configure_build "$build-tsan" -DGPUPOOL_SANITIZE=thread -DGPUPOOL_BUILD_BENCH=OFF
    run_ctest tsan "$build-tsan" -L threaded

    # The build the benchmarks are measured with (bench/RESULTS.md: Release, assert() compiled out):
    # NDEBUG changes what the compiler can prove, and GCC's warnings are errors here. Built, and the
    # pair counter run once, not timed.
    start=$SECONDS
    echo "==> test.sh: building $build-bench (Release, GPUPOOL_ASSERTS=OFF)"
    if cmake -S . -B "$build-bench" -DCMAKE_BUILD_TYPE=Release -DGPUPOOL_ASSERTS=OFF -DGPUPOOL_WITH_CUDA=OFF \
            -DGPUPOOL_BUILD_BENCH=ON -DGPUPOOL_CRITERION=OFF "${extra_args[@]}" >/dev/null &&
        cmake --build "$build-bench" -j "$jobs" --target gpupool_cli bench_alloc pair_count &&
        "$build-bench/bench/pair_count" 512 1000; then
        passed+=(bench-build)
    else
        failed+=(bench-build)
    fi
    echo "==> test.sh: bench build took $((SECONDS - start)) s"

    # clang-tidy and cppcheck (committed configurations), valgrind memcheck over one plain program.
    start=$SECONDS
    if bash tools/analyse.sh "$build"; then
        passed+=(analysers)
    else
        failed+=(analysers)
    fi
    echo "==> test.sh: analysers took $((SECONDS - start)) s"

    # The libFuzzer targets, a fixed number of runs each from the committed corpora (tests/fuzz/).
    start=$SECONDS
    if bash tools/fuzz.sh "$build-fuzz"; then
        passed+=(fuzz)
    else
        failed+=(fuzz)
    fi
    echo "==> test.sh: fuzzing took $((SECONDS - start)) s"
fi

if [ "${#failed[@]}" -ne 0 ]; then
    echo "tools/test.sh: FAILED: ${failed[*]} (passed: ${passed[*]:-none})" >&2
    exit 1
fi
summary="$(IFS=,; echo "${passed[*]}")"
summary="${summary//,/, }"
if [ "${#skipped[@]}" -ne 0 ]; then
    summary="$summary; nothing to run: ${skipped[*]}"
fi
echo "tools/test.sh: all $suites test suites passed ($summary)"
