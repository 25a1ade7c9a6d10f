#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The GPU proof of issue 32 recorded in docs/gpu.md, in one run on a machine
# with a CUDA GPU, torch, transformers and safetensors: builds the Python
# module (Release), runs the Python tests (the CUDA ones included; -rs shows
# any skip), then tools/bench/torch_session.py (durable save, append of a
# turn, load_into, each beside the machine's limit).
#
#   tools/bench/gpu_session.sh [WORK_DIR]     (WORK_DIR: scratch space, ~12 GB)
#
# PYTHON (default python3) is the interpreter; BUILD the build folder; any
# further CMake options (a prefix for the build dependencies, say) in
# CMAKE_OPTIONS. ONLY=load_into runs only the load tests and load_into's
# measurement (the file saved once, untimed).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
work=${1:-/tmp/kvfile-gpu}
build=${BUILD:-$work/build}
python=$(command -v "${PYTHON:-python3}")
mkdir -p "$work"
echo "== machine"
nvidia-smi -L
echo "cores: $(nproc); $(df -h "$work" | tail -1)"
"$python" -c "import sys, torch, transformers, safetensors; print('python', sys.version.split()[0], 'torch', torch.__version__, 'transformers', transformers.__version__, 'safetensors', safetensors.__version__)"
echo "== build"
# shellcheck disable=SC2086
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVFILE_BUILD_TESTS=OFF -DKVFILE_BUILD_BENCH=OFF \
  -DPython_EXECUTABLE="$python" -Dpybind11_DIR="$("$python" -m pybind11 --cmakedir)" ${CMAKE_OPTIONS:-} \
  >"$work/configure.log" 2>&1 || { cat "$work/configure.log"; exit 1; }
cmake --build "$build" -j "$(nproc)" --target kvfile_python >"$work/build.log" 2>&1 ||
  { tail -50 "$work/build.log"; exit 1; }
export PYTHONPATH=$build/python PYTHONDONTWRITEBYTECODE=1
echo "== tests"
only=()
[ "${ONLY:-}" = load_into ] && only=(-k load)
"$python" -m pytest -rs -s -q -p no:cacheprovider "${only[@]}" "$root/tests/python/test_torch.py" \
  "$root/tests/python/test_torch_session.py" || echo "pytest: FAILED"
echo "== benchmark"
"$python" "$root/tools/bench/torch_session.py" "$work/bench" --repeat 5 ${ONLY:+--only "$ONLY"}
