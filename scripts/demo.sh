#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The main job: installs what is missing, builds, writes a 32,768-token
# synthetic llama-3.1-8b session, checks it, and shows its size against the
# same cache stored as raw bf16.
set -euo pipefail
KVFILE_ROOT=$(cd "$(dirname "$0")/.." && pwd)
source "$KVFILE_ROOT/scripts/deps.sh"
# Each step says what it does on stderr (the build alone can take minutes).
step() { echo "demo: $*" >&2; }
step "checking the build dependencies"
kvfile_install_deps
step "building kvfile in $KVFILE_ROOT/build-release (a first build takes several minutes)"
kvfile_build "$KVFILE_ROOT/build-release" --preset=release kvfile_cli
kv="$KVFILE_ROOT/build-release/kvfile"
out="$KVFILE_ROOT/build-release/demo"
mkdir -p "$out"
step "writing a 32,768-token synthetic llama-3.1-8b session to $out/session.kv"
"$kv" synth "$out/session.kv" --preset llama-3.1-8b --tokens 32768 --force
step "what the file holds"
"$kv" info "$out/session.kv"
step "checking every stored code and scale against the regenerated data"
"$kv" synth --check "$out/session.kv"
