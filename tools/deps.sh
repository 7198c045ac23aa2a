# shellcheck shell=bash
# tools/deps.sh — installs the Debian packages gpupool needs to build and test. Sourced by
# tools/bootstrap.sh and tools/test.sh; call gp_install_deps.
#
# Only packages not yet installed are installed (checked with dpkg-query); `apt-get update` runs once,
# before installing, and only when something is missing. Non-interactive (CI runs without a terminal),
# with sudo only when not root. The CUDA Toolkit is not installed here: CMake builds the cuda backend
# when it finds one (e.g. /usr/local/cuda) and builds only the sim backend otherwise.

# prometheus: promtool (checks the exporter's /metrics) and the server the cli_ledger test scrapes it
# with; measured on this machine: 5.9 s for `apt-get install --no-install-recommends prometheus` (22.5 MB
# fetched, 96 MB installed).
# clang + libclang-rt-14-dev: libFuzzer (libclang_rt.fuzzer, which Debian 12 ships in libclang-rt-14-dev,
# only recommended by clang-14) for the fuzz targets; clang-tidy, cppcheck, valgrind: tools/analyse.sh.
# zlib1g-dev: gzip traces (cli/trace.c). python3-venv, -pip, -setuptools, -wheel: `pip install .` into a
# fresh venv (tools/test_installed.sh). python3-torch (1.13, CPU; ~45 s to install): the real readers
# of the snapshots (torch.cuda._memory_viz) and the torch.cuda stats patch; those tests skip without it.
GP_DEPS=(build-essential cmake pkg-config libjemalloc-dev libcriterion-dev libbenchmark-dev zlib1g-dev
         python3-venv python3-pip python3-setuptools python3-wheel python3-torch prometheus curl
         clang libclang-rt-14-dev clang-tidy cppcheck valgrind)

gp_install_deps() {
    if ! command -v dpkg-query >/dev/null 2>&1; then
        echo "deps: dpkg-query not found: not a Debian/Ubuntu system; install by hand the equivalents of:" \
             "${GP_DEPS[*]}" >&2
        return 0
    fi

    local missing=() pkg
    for pkg in "${GP_DEPS[@]}"; do
        if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed'; then
            missing+=("$pkg")
        fi
    done
    if [ "${#missing[@]}" -eq 0 ]; then
        return 0
    fi

    local sudo=()
    if [ "$(id -u)" -ne 0 ]; then
        if ! command -v sudo >/dev/null 2>&1; then
            echo "deps: missing packages ${missing[*]}; not root and no sudo: run as root" \
                 "'apt-get install ${missing[*]}'" >&2
            return 1
        fi
        sudo=(sudo)
    fi

    echo "deps: installing ${missing[*]}"
    "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -q </dev/null || return 1
    "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive \
        apt-get install -y -q --no-install-recommends "${missing[@]}" </dev/null || return 1
}
