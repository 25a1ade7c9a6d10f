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


# The line a missing build requirement gives: CMakeLists.txt's
# kvfile_require prints it, and the checks below for what CMake needs
# before it can say anything.
MISSING = "kvfile: missing build requirement: "


def missing(what):
    """Ends the build with one line naming the missing requirement."""
    sys.exit(MISSING + what)


def check_tools():
    """cmake and a C++ compiler, which CMake itself cannot name when absent."""
    if not shutil.which("cmake"):
        missing("cmake (Debian: cmake; or pip install cmake)")
    cxx = os.environ.get("CXX")
    if cxx:
        if not shutil.which(shlex.split(cxx)[0]):
            missing(f"the C++ compiler CXX={cxx} (Debian: g++)")
    elif not any(shutil.which(c) for c in ("c++", "g++", "clang++")):
        missing("a C++23 compiler (Debian: g++)")


def run_cmake(args):
    """Runs cmake, its output passed through as it comes; a failure that
    names a missing requirement ends the build with that line alone."""
    named = None
    following = False  # CMake wraps a long message onto indented lines
    with subprocess.Popen(["cmake", *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as p:
        for line in p.stdout:
            sys.stdout.write(line)
            if line.strip().startswith(MISSING):
                named, following = line.strip(), True
            elif following and line.startswith("  ") and line.strip():
                named += " " + line.strip()
            else:
                following = False
    sys.stdout.flush()
    if p.returncode != 0:
        sys.exit(named or f"kvfile: cmake {args[0]} failed (exit {p.returncode}); its output is above")


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        check_tools()
        build = Path(self.build_temp).resolve() / "cmake"
        configure = ["-S", str(ROOT), "-B", str(build), "-DCMAKE_BUILD_TYPE=Release",
                     f"-DPython_EXECUTABLE={sys.executable}", "-DKVFILE_BUILD_TESTS=OFF",
                     "-DKVFILE_BUILD_PYTHON=ON", "-DKVFILE_PYTHON_REQUIRED=ON", "-DKVFILE_BUILD_TOOLS=OFF"]
        # CMAKE_ARGS (a shell-quoted list) adds to the configure line or
        # overrides it, as in other CMake-driven Python packages:
        # CMAKE_ARGS="-DKVFILE_WITH_URING=OFF" pip install .
        configure += shlex.split(os.environ.get("CMAKE_ARGS", ""))
        if shutil.which("ninja"):
            configure += ["-G", "Ninja"]
        run_cmake(configure)
        jobs = os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL", str(os.cpu_count() or 1))
        run_cmake(["--build", str(build), "--target", "kvfile_python", "-j", jobs])
        built = next((build / "python" / "kvfile").glob("_kvfile*.so"))
        target = Path(self.get_ext_fullpath(ext.name))
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(built, target)


setup(
    version=project_version(),
    packages=["kvfile"],
    package_dir={"kvfile": "src/python/kvfile"},
    # The type stubs of the extension, and the marker that the package has
    # them (PEP 561).
    package_data={"kvfile": ["py.typed", "*.pyi"]},
    ext_modules=[Extension("kvfile._kvfile", sources=[])],
    cmdclass={"build_ext": CMakeBuild},
    zip_safe=False,
)
