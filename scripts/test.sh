#!/usr/bin/env bash
# Installs what is missing, builds with warnings as errors, and runs every
# test (the unit tests and the long exhaustive codec checks).
set -euo pipefail
KVFILE_ROOT=$(cd "$(dirname "$0")/.." && pwd)
source "$KVFILE_ROOT/scripts/deps.sh"
kvfile_install_deps
kvfile_build "$KVFILE_ROOT/build"
cd "$KVFILE_ROOT/build"
ctest --output-on-failure -j "$(nproc)" --timeout 1500
