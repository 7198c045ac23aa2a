#!/usr/bin/env bash
# tools/analyse.sh — the analysers CI runs besides the sanitizer builds:
#   clang-tidy  (.clang-tidy) over every C file of pool/, cli/ and tests/fuzz/ in BUILD_DIR's
#               compile_commands.json; every warning is an error;
#   cppcheck    (warning, performance, portability; tools/cppcheck-suppressions.txt) over the same
#               folders, but pool/cuda_emu/ (a test device that compiles only with GPUPOOL_CUDA_EMULATION
#               defined; clang-tidy sees it through the build's compile commands);
#   valgrind    memcheck over one plain test program, BUILD_DIR/tests/stress_threads (threads, streams,
#               OOMs on the "sim" backend; "sim-vmm" cannot run under valgrind: it reserves 64 GiB of
#               address space, more than valgrind's address space manager hands out).
# Called by tools/test.sh after the plain build. Usage: bash tools/analyse.sh [BUILD_DIR] (default build)
# Exits non-zero when any analyser reports anything.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

dir="${1:-build}"
jobs="$(nproc 2>/dev/null || echo 2)"
failed=()

tidy="$(command -v clang-tidy || command -v clang-tidy-14 || true)"
if [ -z "$tidy" ] || ! command -v cppcheck >/dev/null || ! command -v valgrind >/dev/null; then
    echo "analyse.sh: needs clang-tidy, cppcheck and valgrind (tools/deps.sh installs them)" >&2
    exit 1
fi
if [ ! -f "$dir/compile_commands.json" ]; then
    echo "analyse.sh: $dir/compile_commands.json not found: configure $dir first" >&2
    exit 1
fi

# ---- clang-tidy: the files the build compiles (so each gets its real flags) -------------------------
start=$SECONDS
# The CUDA emulation's test build compiles every pool source a second time (pool/cuda_emu/): clang-tidy
# given a file with two compile commands analyses both in one process, which makes clang-tidy 14 report
# false clang-analyzer-valist.Uninitialized findings. So it reads a copy of the database that keeps the
# first command of each file (the library's own flags) in $dir/analyse-db/.
db="$dir/analyse-db"
mkdir -p "$db"
mapfile -t files < <(python3 - "$dir/compile_commands.json" "$PWD" "$db/compile_commands.json" <<'PY'
import json, os, sys
root = sys.argv[2]
seen, kept = set(), []
for entry in json.load(open(sys.argv[1])):
    path = os.path.normpath(os.path.join(entry["directory"], entry["file"]))
    rel = os.path.relpath(path, root)
    if path in {os.path.normpath(os.path.join(k["directory"], k["file"])) for k in kept}:
        continue
    kept.append(entry)
    if rel.endswith(".c") and (rel.split(os.sep)[0] in ("pool", "cli") or rel.startswith("tests/fuzz/")):
        seen.add(rel)
json.dump(kept, open(sys.argv[3], "w"), indent=1)
print("\n".join(sorted(seen)))
PY
)
echo "==> analyse.sh: clang-tidy over ${#files[@]} files"
tidy_log="$dir/clang-tidy.log"
# --quiet drops the "N warnings generated" chatter; a finding is a line with "warning:" or "error:".
{
    # One file per clang-tidy process: clang-tidy 14 given several files reports a false
    # clang-analyzer-valist.Uninitialized at every vsnprintf after the first file.
    printf '%s\n' "${files[@]}" | xargs -P "$jobs" -n 1 "$tidy" -p "$db" --quiet || true
} >"$tidy_log" 2>&1
if grep -qE '(warning|error):' "$tidy_log"; then
    grep -E -A3 '(warning|error):' "$tidy_log" >&2 || true
    echo "analyse.sh: clang-tidy found $(grep -cE '(warning|error):' "$tidy_log") problems (log: $tidy_log)" >&2
    failed+=(clang-tidy)
else
    echo "==> analyse.sh: clang-tidy clean ($((SECONDS - start)) s)"
fi

# ---- cppcheck ---------------------------------------------------------------------------------------
start=$SECONDS
includes=(-I include -I cli)
while IFS= read -r d; do includes+=(-I "$d"); done < <(find pool -type d | sort)
if cppcheck --enable=warning,performance,portability --std=c11 --inline-suppr --error-exitcode=1 --quiet \
    --suppressions-list=tools/cppcheck-suppressions.txt -j "$jobs" "${includes[@]}" -D_POSIX_C_SOURCE=200809L \
    -i pool/cuda_emu pool cli tests/fuzz; then
    echo "==> analyse.sh: cppcheck clean ($((SECONDS - start)) s)"
else
    failed+=(cppcheck)
fi

# ---- valgrind memcheck ------------------------------------------------------------------------------
start=$SECONDS
program="$dir/tests/stress_threads"
if [ ! -x "$program" ]; then
    echo "analyse.sh: $program not built" >&2
    failed+=(valgrind)
elif valgrind --tool=memcheck --error-exitcode=99 --leak-check=full --errors-for-leak-kinds=definite,indirect \
    --show-leak-kinds=definite,indirect --track-origins=yes --quiet "$program"; then
    echo "==> analyse.sh: valgrind memcheck clean over $program ($((SECONDS - start)) s)"
else
    echo "analyse.sh: valgrind memcheck reported errors in $program" >&2
    failed+=(valgrind)
fi

if [ "${#failed[@]}" -ne 0 ]; then
    echo "analyse.sh: FAILED: ${failed[*]}" >&2
    exit 1
fi
echo "analyse.sh: clang-tidy, cppcheck and valgrind clean"
