#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The GPU proof recorded in docs/gpu.md, in one run on a machine with a CUDA
# GPU, torch, transformers and safetensors: builds the Python module and the
# CLI, runs the Python tests (the CUDA ones included, -rs shows any skip),
# writes a 32,768-token llama-3.1-8b session and runs tools/bench/torch_resume.py
# (the comparison, then the sweep of staging sizes).
#
#   tools/bench/gpu_proof.sh [WORK_DIR]     (WORK_DIR: scratch space, ~11 GB)
#
# PYTHON (default python3) is the interpreter; BUILD the build folder.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
work=${1:-/tmp/kvfile-gpu}
build=${BUILD:-$work/build}
python=$(command -v "${PYTHON:-python3}")
mkdir -p "$work"
echo "== machine"
nvidia-smi -L
echo "cores: $(nproc)"
"$python" -c "import sys, torch, transformers, safetensors; print('python', sys.version.split()[0], 'torch', torch.__version__, 'transformers', transformers.__version__, 'safetensors', safetensors.__version__)"
echo "== build"
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVFILE_BUILD_TESTS=OFF \
  -DPython_EXECUTABLE="$python" -Dpybind11_DIR="$("$python" -m pybind11 --cmakedir)" >"$work/configure.log" 2>&1 ||
  { cat "$work/configure.log"; exit 1; }
cmake --build "$build" -j "$(nproc)" --target kvfile_python kvfile_cli >"$work/build.log" 2>&1 ||
  { tail -50 "$work/build.log"; exit 1; }
export PYTHONPATH=$build/python PYTHONDONTWRITEBYTECODE=1
echo "== tests"
tests=("$root/tests/python")
[ -d "$root/src/python/tests" ] && tests+=("$root/src/python/tests")
"$python" -m pytest -rs -s -q -p no:cacheprovider "${tests[@]}" || echo "pytest: FAILED"
echo "== benchmark"
"$build/kvfile" synth "$work/session.kv" --preset llama-3.1-8b --tokens 32768 --force
"$python" "$root/tools/bench/torch_resume.py" "$work/session.kv"
"$python" "$root/tools/bench/torch_resume.py" "$work/session.kv" --sweep 64,128,192,256,512 --repeat 9
