# SPDX-License-Identifier: Apache-2.0
# Builds the extension kvfile._kvfile with the project's CMake (the target
# kvfile_python, for the interpreter running this) and packages it with the
# pure-Python modules of src/python/kvfile. The version is CMakeLists.txt's
# project version, its one owner. Used by `pip install .` (pyproject.toml).
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent


def project_version():
    text = (ROOT / "CMakeLists.txt").read_text()
    return re.search(r"project\(kvfile VERSION ([0-9.]+)", text).group(1)


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        build = Path(self.build_temp).resolve() / "cmake"
        configure = ["cmake", "-S", str(ROOT), "-B", str(build), "-DCMAKE_BUILD_TYPE=Release",
                     f"-DPython_EXECUTABLE={sys.executable}", "-DKVFILE_BUILD_TESTS=OFF",
                     "-DKVFILE_BUILD_PYTHON=ON", "-DKVFILE_BUILD_TOOLS=OFF"]
        # CMAKE_ARGS (a shell-quoted list) adds to the configure line or
        # overrides it, as in other CMake-driven Python packages:
        # CMAKE_ARGS="-DKVFILE_WITH_URING=OFF" pip install .
        configure += shlex.split(os.environ.get("CMAKE_ARGS", ""))
        if shutil.which("ninja"):
            configure += ["-G", "Ninja"]
        subprocess.run(configure, check=True)
        jobs = os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL", str(os.cpu_count() or 1))
        subprocess.run(["cmake", "--build", str(build), "--target", "kvfile_python", "-j", jobs], check=True)
        built = next((build / "python" / "kvfile").glob("_kvfile*.so"))
        target = Path(self.get_ext_fullpath(ext.name))
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(built, target)


setup(
    version=project_version(),
    packages=["kvfile"],
    package_dir={"kvfile": "src/python/kvfile"},
    ext_modules=[Extension("kvfile._kvfile", sources=[])],
    cmdclass={"build_ext": CMakeBuild},
    zip_safe=False,
)
