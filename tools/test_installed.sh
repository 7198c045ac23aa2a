#!/usr/bin/env bash
# tools/test_installed.sh BUILD_DIR — the Python suite against an installed copy of the package:
# a fresh venv (BUILD_DIR/venv-installed, with the system's site packages so that Debian's setuptools,
# wheel and, where installed, python3-torch are visible), `pip install --no-build-isolation --no-deps`
# of this repository (pyproject.toml: CMake builds libgpupool into the package), then
# `python -m unittest` of python/tests run from BUILD_DIR with GPUPOOL_TEST_INSTALLED=1: the tests
# import the installed gpupool (not python/ of the source tree), with no GPUPOOL_LIBRARY and no
# PYTHONPATH, so the package must find its own library. CTest runs it as python_installed.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="$(cd "${1:?usage: tools/test_installed.sh BUILD_DIR}" && pwd)"
py=python3
if [ -x /usr/bin/python3 ]; then
    py=/usr/bin/python3 # Debian's interpreter: its python3-venv, python3-setuptools and python3-wheel
fi
venv="$build/venv-installed"
rm -rf "$venv"
"$py" -m venv --system-site-packages "$venv"
start=$SECONDS
GPUPOOL_BUILD_JOBS="${GPUPOOL_BUILD_JOBS:-2}" \
    "$venv/bin/python" -m pip install --no-build-isolation --no-deps --no-input -q "$repo"
echo "test_installed.sh: pip install took $((SECONDS - start)) s"
cd "$build"
cli=()
if [ -x "$build/gpupool" ]; then
    cli=(GPUPOOL_CLI="$build/gpupool")
fi
exec env -u GPUPOOL_LIBRARY -u PYTHONPATH GPUPOOL_TEST_INSTALLED=1 PYTHONDONTWRITEBYTECODE=1 "${cli[@]}" \
    "$venv/bin/python" -m unittest discover -s "$repo/python/tests" -v
