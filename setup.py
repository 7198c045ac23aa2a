"""The CMake step of `pip install .` (pyproject.toml says what the package is).

build_py runs as usual and then configures and builds the `gpupool` shared-library target of this
repository's CMakeLists.txt in build-pip/cmake (tests, the command and benchmarks off), and copies the
library into the package as gpupool/libgpupool.so. The wheel is marked platform-specific, since it
carries a compiled library. Nothing is downloaded: cmake, a C compiler and (optionally) the CUDA
Toolkit must be installed (tools/deps.sh installs them on Debian).
"""

import os
import re
import shutil
import subprocess
import sys

from setuptools import Distribution, setup
from setuptools.command.build_py import build_py

ROOT = os.path.dirname(os.path.abspath(__file__))


def version():
    with open(os.path.join(ROOT, "include", "gpupool.h")) as f:
        text = f.read()
    parts = [re.search(rf"#define GPUPOOL_VERSION_{p} +(\d+)", text).group(1) for p in ("MAJOR", "MINOR", "PATCH")]
    return ".".join(parts)


class BuildWithLibrary(build_py):
    def run(self):
        super().run()
        build_dir = os.path.join(ROOT, "build-pip", "cmake")
        jobs = os.environ.get("GPUPOOL_BUILD_JOBS", str(os.cpu_count() or 2))
        configure = ["cmake", "-S", ROOT, "-B", build_dir, "-DCMAKE_BUILD_TYPE=RelWithDebInfo",
                     "-DGPUPOOL_BUILD_TESTS=OFF", "-DGPUPOOL_BUILD_CLI=OFF", "-DGPUPOOL_BUILD_BENCH=OFF",
                     "-DGPUPOOL_SANITIZE="]
        for cmd in (configure, ["cmake", "--build", build_dir, "--target", "gpupool", "-j", jobs]):
            print("gpupool setup.py:", " ".join(cmd), flush=True)
            try:
                subprocess.run(cmd, check=True)
            except FileNotFoundError:
                sys.exit("gpupool: cmake not found: install cmake and a C compiler (Debian: bash tools/deps.sh)")
            except subprocess.CalledProcessError as e:
                sys.exit(f"gpupool: building libgpupool failed ({' '.join(cmd)} exited with {e.returncode})")
        library = os.path.realpath(os.path.join(build_dir, "libgpupool.so"))
        target = os.path.join(self.build_lib, "gpupool", "libgpupool.so")
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.copyfile(library, target)
        os.chmod(target, 0o755)


class BinaryDistribution(Distribution):
    def has_ext_modules(self):
        return True  # a platform wheel: it carries libgpupool.so


setup(
    version=version(),
    cmdclass={"build_py": BuildWithLibrary},
    distclass=BinaryDistribution,
    options={"build": {"build_base": os.path.join("build-pip", "setuptools")}},
)
