"""Builds sac's Python module with the project's own CMake build, against the
installed torch: pip install --no-build-isolation ./python

The module (sac._C) links the one libsac that CMake builds from ../sac; both
land in the package. SAC_BUILD_DIR names a CMake build directory to build in
(CI passes its test build, so that only the module is compiled); without it
the build goes to ../build-python. SAC_JOBS: parallel compile jobs.
"""
import os
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

REPO = Path(__file__).resolve().parent.parent


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        import torch

        build = Path(os.environ.get("SAC_BUILD_DIR") or REPO / "build-python").resolve()
        configure = [
            "cmake", "-S", str(REPO), "-B", str(build), "-G", "Ninja",
            f"-DCMAKE_PREFIX_PATH={torch.utils.cmake_prefix_path}",
            f"-DPython3_EXECUTABLE={sys.executable}",
            "-DSAC_BUILD_PYTHON=ON",
        ]
        if not (build / "CMakeCache.txt").exists():
            configure += [
                "-DSAC_BUILD_TESTS=OFF", "-DSAC_BUILD_EXAMPLES=OFF",
                "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O2 -g1 -DNDEBUG",
            ]
        subprocess.check_call(configure, stdout=subprocess.DEVNULL)
        jobs = os.environ.get("SAC_JOBS", str(os.cpu_count() or 1))
        subprocess.check_call(
            ["cmake", "--build", str(build), "--target", "sac_python", "--parallel", jobs])

        target = Path(self.get_ext_fullpath(ext.name))
        target.parent.mkdir(parents=True, exist_ok=True)
        (module,) = (build / "python").glob("_C*.so")
        shutil.copyfile(module, target)
        shutil.copyfile(build / "libsac.so.0", target.parent / "libsac.so.0")
        (target.parent / "_built_with.py").write_text(
            f'"""Written by setup.py."""\ntorch_version = {torch.__version__!r}\n')


setup(ext_modules=[Extension("sac._C", sources=[])], cmdclass={"build_ext": CMakeBuild})
