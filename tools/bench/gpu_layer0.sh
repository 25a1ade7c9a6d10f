#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Issue 32's last figure on a machine with a CUDA GPU and torch: load_into's
# layer 0 in place after at most 2/32 of the time to the last layer, for the
# 32,768-token llama-3.1-8b e4m3 session. Builds the Python module alone
# (Release, no tests, no tools), then runs tools/bench/gpu_layer0.py (the file
# made once, untimed; then before and after, alternated, 7 rounds, medians;
# the ratio against 2/32).
#
#   tools/bench/gpu_layer0.sh [WORK_DIR]     (WORK_DIR: scratch space, ~3 GB)
#
# As tools/bench/gpu_session.sh: PYTHON (default python3) is the interpreter,
# BUILD the build folder, CMAKE_OPTIONS further CMake options (a prefix for
# the build dependencies, say). TESTS=1 also runs the load_into tests of
# tests/python/test_torch_session.py (CUDA included) before the measurement.
#
# Bounded as a whole: every step runs under `timeout` with what is left of
# BUDGET (default 195 s) from the script's start, the configure and the build
# leaving 60 s for the measurement (about 30 s: torch's start, the file made
# and saved, 7 rounds of 9 calls of about 0.1 s, the checks); each step prints
# the time it starts at. On a 16-core H200 box the build of the module (about
# 70 compilations) is the most of it.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
work=${1:-/tmp/kvfile-layer0}
build=${BUILD:-$work/build}
python=$(command -v "${PYTHON:-python3}")
jobs=$(nproc)
mkdir -p "$work"
start=$SECONDS
budget=${BUDGET:-195}
# Seconds left of the budget, less $1 kept for later steps (at least 1).
left() { local n=$((budget - (SECONDS - start) - ${1:-0})); echo $((n > 0 ? n : 1)); }
step() { echo "== $1 ($((SECONDS - start)) s)"; }
step machine
nvidia-smi -L
echo "cores: $jobs; $(df -h "$work" | tail -1)"
"$python" -c "import sys, torch; print('python', sys.version.split()[0], 'torch', torch.__version__)"
step configure
# shellcheck disable=SC2086
timeout "$(left 120)" cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVFILE_BUILD_TESTS=OFF \
  -DKVFILE_BUILD_BENCH=OFF -DKVFILE_BUILD_TOOLS=OFF -DKVFILE_INSTALL=OFF \
  -DPython_EXECUTABLE="$python" -Dpybind11_DIR="$("$python" -m pybind11 --cmakedir)" ${CMAKE_OPTIONS:-} \
  >"$work/configure.log" 2>&1 || { cat "$work/configure.log"; exit 1; }
step "build (kvfile_python, -j$jobs)"
timeout "$(left 60)" cmake --build "$build" -j "$jobs" --target kvfile_python >"$work/build.log" 2>&1 ||
  { tail -50 "$work/build.log"; exit 1; }
export PYTHONPATH=$build/python PYTHONDONTWRITEBYTECODE=1
if [ "${TESTS:-0}" = 1 ]; then
  step "tests (load_into)"
  timeout "$(left 60)" "$python" -m pytest -rs -q -p no:cacheprovider -k load_into "$root/tests/python/test_torch_session.py" ||
    echo "pytest: FAILED"
fi
step measurement
timeout "$(left)" "$python" "$root/tools/bench/gpu_layer0.py" "$work/bench" --rounds "${ROUNDS:-7}"
step finished
