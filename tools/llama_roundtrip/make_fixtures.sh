#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The llama.cpp round trip of issue 19 (docs/llama.md), outside the project's
# build: gets llama.cpp from the npm package node-llama-cpp (its
# llama/gitRelease.bundle), builds its `llama` library (CPU), builds
# roundtrip.cc against llama.h, makes the tiny model (make_model.py, with
# llama.cpp's gguf-py; needs numpy), saves sequence states for f32, f16, bf16
# and q8_0 caches with flash attention on and off, and checks
#   llama.cpp saves -> kvfile convert (raw) -> kvfile convert --format
#   llama-seq (raw) -> llama.cpp restores -> logits
# against restoring the original file (and the uninterrupted run), then the
# same with e4m3 in between (logit error, greedy agreement).
#
# usage: make_fixtures.sh KVFILE_BINARY WORK_DIR [LLAMA_CPP_SOURCE_DIR]
#   WORK_DIR receives the npm package, the llama.cpp build and the run's
#   files; with LLAMA_CPP_SOURCE_DIR (a checkout with build/bin/libllama.so
#   already built) the download and the build are skipped.
# Writes tests/fixtures/llama/ (state files, the model, results.txt).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
KVFILE=$(realpath "$1")
WORK=$(mkdir -p "$2" && realpath "$2")
SRC=${3:-}
FIX="$ROOT/tests/fixtures/llama"
N=24        # tokens in the saved state
GREEDY=16   # greedy steps compared after the restore

if [ -z "$SRC" ]; then
  cd "$WORK"
  [ -f node-llama-cpp-3.22.1.tgz ] || npm pack node-llama-cpp@3.22.1
  rm -rf package && tar xzf node-llama-cpp-3.22.1.tgz
  TAG=$(python3 -c 'import json; print(json.load(open("package/llama/llama.cpp.info.json"))["tag"])')
  rm -rf llama.cpp && git clone -q package/llama/gitRelease.bundle llama.cpp
  (cd llama.cpp && git checkout -q "$TAG" 2>/dev/null || true)
  SRC="$WORK/llama.cpp"
  cmake -S "$SRC" -B "$SRC/build" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON -DLLAMA_BUILD_TESTS=OFF \
        -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_CURL=OFF >/dev/null
  cmake --build "$SRC/build" --target llama -j "$(nproc)"
fi
LIB="$SRC/build/bin"
cd "$WORK"
g++ -std=c++17 -O2 -I"$SRC/include" -I"$SRC/ggml/include" "$ROOT/tools/llama_roundtrip/roundtrip.cc" \
    -L"$LIB" -lllama -lggml -lggml-base -Wl,-rpath,"$LIB" -o llama_roundtrip
/usr/bin/python3 "$ROOT/tools/llama_roundtrip/make_model.py" "$SRC/gguf-py" tiny.gguf
RT="$WORK/llama_roundtrip"
MODEL="$WORK/tiny.gguf"

# Max |a - b| over two raw f32 logit files, and whether their argmax agree.
compare() {
  /usr/bin/python3 - "$1" "$2" <<'EOF'
import sys, numpy as np
a = np.fromfile(sys.argv[1], dtype=np.float32); b = np.fromfile(sys.argv[2], dtype=np.float32)
print("identical" if a.tobytes() == b.tobytes() else
      "max|d|=%.3g (max|logit| %.3g)" % (float(np.max(np.abs(a - b))), float(np.max(np.abs(a)))))
EOF
}

# Greedy steps that agree, in order, before the first difference: "k/16".
agreement() {
  /usr/bin/python3 -c '
import sys
a = open(sys.argv[1]).read().split("greedy=")[1].split(","); b = open(sys.argv[2]).read().split("greedy=")[1].split(",")
k = 0
while k < len(a) and a[k] == b[k]: k += 1
print("%d/%d" % (k, len(a)))' "$1" "$2"
}

mkdir -p "$FIX"
rm -f "$FIX"/*.bin
cp "$MODEL" "$FIX/tiny.gguf"
{
  echo "# llama.cpp v0.5.0 (node-llama-cpp 3.22.1) round trip; $N tokens saved, then token 7 and $GREEDY greedy steps"
  echo "# file | restore of llama.cpp's file == uninterrupted run | raw through kvfile: file bytes, logits | e4m3 through kvfile: logits, greedy agreement"
} >"$WORK/results.txt"
for type in f16 bf16 f32 q8_0; do
  for fa in 1 0; do
    name="seq-$type-fa$fa"
    if ! "$RT" "$MODEL" save "$WORK/$name.bin" "$type" "$fa" "$N" 2>"$WORK/$name.err"; then
      echo "$name | llama.cpp cannot save it: $(tail -1 "$WORK/$name.err")" >>"$WORK/results.txt"
      continue
    fi
    "$RT" "$MODEL" straight "$N" "$type" "$fa" "$GREEDY" "$WORK/$name.straight.f32" >"$WORK/$name.straight.txt"
    "$RT" "$MODEL" restore "$WORK/$name.bin" "$type" "$fa" "$GREEDY" seq "$WORK/$name.orig.f32" >"$WORK/$name.orig.txt"
    # raw: import keeping the cache's values, export in the cache's type
    "$KVFILE" convert "$WORK/$name.bin" "$WORK/$name.raw.kv" --keep-raw k,v --head-size 64 --force >/dev/null
    "$KVFILE" convert "$WORK/$name.raw.kv" "$WORK/$name.raw.bin" --format llama-seq --dtype "$type" --force >/dev/null
    cmp -s "$WORK/$name.bin" "$WORK/$name.raw.bin" && bytes=identical || bytes=DIFFERENT
    "$RT" "$MODEL" restore "$WORK/$name.raw.bin" "$type" "$fa" "$GREEDY" seq "$WORK/$name.raw.f32" >"$WORK/$name.raw.txt"
    # e4m3
    "$KVFILE" convert "$WORK/$name.bin" "$WORK/$name.e4m3.kv" --head-size 64 --force >/dev/null
    "$KVFILE" convert "$WORK/$name.e4m3.kv" "$WORK/$name.e4m3.bin" --format llama-seq --dtype "$type" --force \
      >/dev/null 2>&1
    "$RT" "$MODEL" restore "$WORK/$name.e4m3.bin" "$type" "$fa" "$GREEDY" seq "$WORK/$name.e4m3.f32" \
      >"$WORK/$name.e4m3.txt"
    agree=$(agreement "$WORK/$name.orig.txt" "$WORK/$name.e4m3.txt")
    echo "$name.bin | $(compare "$WORK/$name.orig.f32" "$WORK/$name.straight.f32") | $bytes, $(compare \
      "$WORK/$name.orig.f32" "$WORK/$name.raw.f32") | $(compare "$WORK/$name.orig.f32" "$WORK/$name.e4m3.f32"), \
greedy $agree" >>"$WORK/results.txt"
    cp "$WORK/$name.bin" "$FIX/"
    cp "$WORK/$name.orig.f32" "$FIX/$name.logits.f32"
  done
done
# A session file (llama_state_save_file), f16, flash attention off.
"$RT" "$MODEL" save "$WORK/session-f16-fa0.bin" f16 0 "$N" session
"$RT" "$MODEL" restore "$WORK/session-f16-fa0.bin" f16 0 "$GREEDY" session "$WORK/session.orig.f32" >/dev/null
"$KVFILE" convert "$WORK/session-f16-fa0.bin" "$WORK/session.raw.kv" --keep-raw k,v --head-size 64 --force >/dev/null
"$KVFILE" convert "$WORK/session.raw.kv" "$WORK/session.raw.bin" --format llama-session --force >/dev/null
cmp -s "$WORK/session-f16-fa0.bin" "$WORK/session.raw.bin" && bytes=identical || bytes=DIFFERENT
"$RT" "$MODEL" restore "$WORK/session.raw.bin" f16 0 "$GREEDY" session "$WORK/session.raw.f32" >/dev/null
echo "session-f16-fa0.bin | - | $bytes, $(compare "$WORK/session.orig.f32" "$WORK/session.raw.f32") | -" \
  >>"$WORK/results.txt"
cp "$WORK/session-f16-fa0.bin" "$FIX/"
# The Hadamard trap: q8_0 rows exported to f16 and restored into an f16
# context, against the f16 uninterrupted run; beside it the q8_0 restore
# itself (the quantization error alone), and the same export of a q8_0 file
# saved with LLAMA_ATTN_ROT_DISABLE=1 (no rotation).
if [ -f "$WORK/seq-q8_0-fa1.bin" ]; then
  "$RT" "$MODEL" straight "$N" f16 1 "$GREEDY" "$WORK/f16.straight.f32" >"$WORK/f16.straight.txt"
  "$KVFILE" convert "$WORK/seq-q8_0-fa1.raw.kv" "$WORK/trap.bin" --format llama-seq --dtype f16 --force \
    >/dev/null 2>"$WORK/trap.err"
  "$RT" "$MODEL" restore "$WORK/trap.bin" f16 1 "$GREEDY" seq "$WORK/trap.f32" >"$WORK/trap.txt"
  LLAMA_ATTN_ROT_DISABLE=1 "$RT" "$MODEL" save "$WORK/norot.bin" q8_0 1 "$N" 2>/dev/null
  "$KVFILE" convert "$WORK/norot.bin" "$WORK/norot.kv" --keep-raw k,v --head-size 64 --force >/dev/null
  "$KVFILE" convert "$WORK/norot.kv" "$WORK/norot-f16.bin" --format llama-seq --dtype f16 --force \
    >/dev/null 2>&1
  "$RT" "$MODEL" restore "$WORK/norot-f16.bin" f16 1 "$GREEDY" seq "$WORK/norot.f32" >"$WORK/norot.txt"
  ref="$WORK/f16.straight"
  {
    echo "# Hadamard trap, against the f16 uninterrupted run (logits; greedy agreement):"
    echo "q8_0 file into a q8_0 context (quantization alone) | $(compare "$ref.f32" \
"$WORK/seq-q8_0-fa1.orig.f32"); greedy $(agreement "$ref.txt" "$WORK/seq-q8_0-fa1.orig.txt")"
    echo "q8_0 file -> kvfile -> f16 file into an f16 context (rotated rows) | $(compare "$ref.f32" \
"$WORK/trap.f32"); greedy $(agreement "$ref.txt" "$WORK/trap.txt")"
    echo "the same, saved with LLAMA_ATTN_ROT_DISABLE=1 | $(compare "$ref.f32" "$WORK/norot.f32"); greedy \
$(agreement "$ref.txt" "$WORK/norot.txt")"
  } >>"$WORK/results.txt"
fi
cp "$WORK/results.txt" "$FIX/results.txt"
cat "$FIX/results.txt"
