#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Builds llama.cpp's llama-server (CPU) from the llama.cpp bundle of the npm
# package node-llama-cpp 3.22.1 (llama.cpp v0.5.0), for the llama-server
# bridge's test (tests/python/test_llama_server.py) and figures
# (tools/bench/llama_server_bench.py), in a cache directory outside the
# repository:
#   $KVFILE_LLAMA_CACHE, else $XDG_CACHE_HOME/kvfile/llama, else
#   ~/.cache/kvfile/llama
# holding node-llama-cpp-3.22.1.tgz, the clone llama.cpp/ (checked out at
# the bundle's tag) and its build llama.cpp/build/ (bin/llama-server,
# bin/libllama.so, ...; the layout tools/llama_roundtrip/make_fixtures.sh
# takes as LLAMA_CPP_SOURCE_DIR). Nothing is done when
# llama.cpp/build/bin/llama-server is there already; a missing or failed
# build is redone. Prints the cache directory on its last line.
#
# A fresh machine's first run: the npm download (36 MB), the clone and the
# build of ggml, the llama library, mtmd and the server (26 minutes of wall
# time on the shared 2-core machine, load 8 to 20); later runs return at once.
set -euo pipefail
CACHE=${KVFILE_LLAMA_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/kvfile/llama}
if [ -x "$CACHE/llama.cpp/build/bin/llama-server" ]; then
  echo "$CACHE"
  exit 0
fi
mkdir -p "$CACHE"
cd "$CACHE"
[ -f node-llama-cpp-3.22.1.tgz ] || npm pack --silent node-llama-cpp@3.22.1 >/dev/null
rm -rf package && tar xzf node-llama-cpp-3.22.1.tgz
TAG=$(python3 -c 'import json; print(json.load(open("package/llama/llama.cpp.info.json"))["tag"])')
if [ ! -d llama.cpp/.git ]; then
  rm -rf llama.cpp
  git clone -q package/llama/gitRelease.bundle llama.cpp
fi
# The bundle holds the release's history; where it lacks the tag itself, its
# HEAD is that release.
git -C llama.cpp checkout -q "$TAG" 2>/dev/null || git -C llama.cpp checkout -q HEAD
cmake -S llama.cpp -B llama.cpp/build -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON -DLLAMA_BUILD_TESTS=OFF \
      -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON -DLLAMA_CURL=OFF \
      -DGGML_NATIVE=OFF >build.log
cmake --build llama.cpp/build --target llama llama-server -j "$(nproc)" >>build.log 2>&1 ||
  { tail -20 build.log >&2; exit 1; }
echo "$CACHE"
