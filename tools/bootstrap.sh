#!/usr/bin/env bash
# tools/bootstrap.sh — from a fresh clone to a running demo: installs the missing Debian packages,
# builds into build/ (RelWithDebInfo, assertions on) and runs `build/gpupool demo`.
# Usage: bash tools/bootstrap.sh [extra arguments for the demo]   (GPUPOOL_BUILD_DIR=DIR: not build/)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

# shellcheck source=tools/deps.sh
source tools/deps.sh
gp_install_deps

jobs="$(nproc 2>/dev/null || echo 2)"
build="${GPUPOOL_BUILD_DIR:-build}"
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DGPUPOOL_ASSERTS=ON
cmake --build "$build" -j "$jobs"

if [ ! -x "$build/gpupool" ]; then
    echo "bootstrap: the demo is not built: $build/gpupool does not exist (cli/ has no program yet)" >&2
    exit 1
fi
echo "bootstrap: running $build/gpupool demo $*"
exec "$build/gpupool" demo "$@"
