#!/usr/bin/env bash
# The main job: installs what is missing, builds, writes a 32,768-token
# synthetic llama-3.1-8b session, checks it, and shows its size against the
# same cache stored as raw bf16.
set -euo pipefail
KVFILE_ROOT=$(cd "$(dirname "$0")/.." && pwd)
source "$KVFILE_ROOT/scripts/deps.sh"
kvfile_install_deps
kvfile_build "$KVFILE_ROOT/build-release" --preset=release kvfile_cli
kv="$KVFILE_ROOT/build-release/kvfile"
out="$KVFILE_ROOT/build-release/demo"
mkdir -p "$out"
"$kv" synth "$out/session.kv" --preset llama-3.1-8b --tokens 32768 --force
"$kv" info "$out/session.kv"
"$kv" synth --check "$out/session.kv"
