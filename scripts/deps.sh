#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Installs, with apt-get, the Debian 12 packages kvfile needs to build and
# test, skipping those already installed. Sourced by demo.sh and test.sh.
set -euo pipefail

KVFILE_PACKAGES=(
  build-essential cmake ninja-build pkg-config
  liburing-dev zlib1g-dev libcli11-dev libgtest-dev libxxhash-dev nlohmann-json3-dev
  libbenchmark-dev
  python3-dev pybind11-dev python3-numpy python3-pytest
  python3-torch  # kvfile.torch's CPU paths (tests/python/test_torch*.py; 1.13, CPU only: the CUDA tests skip)
  python3-venv python3-pip python3-setuptools python3-wheel  # pip install . (scripts/install_test.sh)
  clang libclang-rt-14-dev  # the libFuzzer build (scripts/fuzz.sh); libclang-rt-14-dev has libFuzzer
  libcurl4-openssl-dev  # the S3 client (KVFILE_WITH_S3) and kvfile llama-server (HTTP)
  git  # llama-server from node-llama-cpp's llama.cpp bundle (scripts/llama_server_build.sh), with npm below
  # The S3 tests: a real object store (OpenStack Swift with s3api and
  # memcached, tests/support/swift_store.py), the clients kvfile must agree
  # with (awscli, boto3, curl), and Dask for the fan-out recipe.
  python3-swift memcached awscli python3-boto3 curl python3-distributed
)

kvfile_install_deps() {
  local missing=()
  for p in "${KVFILE_PACKAGES[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
      missing+=("$p")
    fi
  done
  # npm: Debian's package, unless a Node.js that brings its own is there
  # (NodeSource's nodejs conflicts with Debian's npm).
  if ! command -v npm >/dev/null 2>&1; then missing+=(npm); fi
  if [ ${#missing[@]} -eq 0 ]; then
    return 0
  fi
  echo "kvfile: installing ${missing[*]}" >&2
  local sudo=""
  if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

# Configures and builds into $1 with a configure preset of CMakePresets.json
# (--preset=NAME; default dev: warnings as errors); further arguments are
# CMake options (-D...) or the targets to build (all when none). The build
# log goes to $1/build.log and is printed only if the build fails.
kvfile_build() {
  local build_dir=$1
  shift
  local targets=() options=() preset=dev
  for t in "$@"; do
    case "$t" in
      --preset=*) preset=${t#--preset=} ;;
      -D*) options+=("$t") ;;
      *) targets+=(--target "$t") ;;
    esac
  done
  mkdir -p "$build_dir"
  # The Python module is built for Debian's interpreter, the one the
  # packages above install numpy and pytest into (KVFILE_PYTHON: another).
  if ! { (cd "$KVFILE_ROOT" && cmake --preset "$preset" -B "$build_dir" \
            -DPython_EXECUTABLE="${KVFILE_PYTHON:-/usr/bin/python3}" "${options[@]}") &&
         cmake --build "$build_dir" -j "$(nproc)" "${targets[@]}"; } >"$build_dir/build.log" 2>&1; then
    cat "$build_dir/build.log" >&2
    echo "kvfile: build failed (log: $build_dir/build.log)" >&2
    return 1
  fi
}
