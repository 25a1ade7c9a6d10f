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
# same with e4m3 in between (logit error, greedy agreement). Then (issue 31)
# the rotation of q8_0 caches (--rotated yes, --unrotate, against a file
# saved with LLAMA_ATTN_ROT_DISABLE=1), a q8_0 K + f16 V cache, a 4-stream
# context (-np 4) and a Gemma-2-shaped iSWA model's two caches (a window that
# holds every token, and one that does not).
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
# Gemma-2-shaped (iSWA: two caches): a window of 64 holds all N tokens, one of 8 does not.
/usr/bin/python3 "$ROOT/tools/llama_roundtrip/make_model.py" "$SRC/gguf-py" gemma2-w64.gguf gemma2 64
/usr/bin/python3 "$ROOT/tools/llama_roundtrip/make_model.py" "$SRC/gguf-py" gemma2-w8.gguf gemma2 8
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
# Rotation, mixed types, streams and two caches (issue 31).
"$RT" "$MODEL" straight "$N" q8_0 1 "$GREEDY" "$WORK/q8.straight.f32" >"$WORK/q8.straight.txt"
{
  echo "# Rotation: the q8_0 file imported with --rotated yes, exported as f16 (kvfile un-rotates it), into an f16"
  echo "# context; the same with --unrotate at import; against the f16 uninterrupted run:"
  "$KVFILE" convert "$WORK/seq-q8_0-fa1.bin" "$WORK/rot.kv" --keep-raw k,v --head-size 64 --rotated yes --force \
    >/dev/null
  "$KVFILE" convert "$WORK/rot.kv" "$WORK/rot-f16.bin" --format llama-seq --dtype f16 --force >/dev/null
  "$RT" "$MODEL" restore "$WORK/rot-f16.bin" f16 1 "$GREEDY" seq "$WORK/rot-f16.f32" >"$WORK/rot-f16.txt"
  echo "--rotated yes, export f16 | $(compare "$ref.f32" "$WORK/rot-f16.f32"); greedy $(agreement "$ref.txt" \
"$WORK/rot-f16.txt")"
  "$KVFILE" convert "$WORK/seq-q8_0-fa1.bin" "$WORK/unrot.kv" --keep-raw k,v --head-size 64 --unrotate --force \
    >/dev/null
  "$KVFILE" convert "$WORK/unrot.kv" "$WORK/unrot-f16.bin" --format llama-seq --dtype f16 --force >/dev/null
  "$RT" "$MODEL" restore "$WORK/unrot-f16.bin" f16 1 "$GREEDY" seq "$WORK/unrot-f16.f32" >"$WORK/unrot-f16.txt"
  echo "--unrotate, export f16 | $(compare "$ref.f32" "$WORK/unrot-f16.f32"); greedy $(agreement "$ref.txt" \
"$WORK/unrot-f16.txt")"
  # and back: the un-rotated rows exported as q8_0 (kvfile rotates them) into a q8_0 context
  "$KVFILE" convert "$WORK/unrot.kv" "$WORK/unrot-q8.bin" --format llama-seq --force >/dev/null
  "$RT" "$MODEL" restore "$WORK/unrot-q8.bin" q8_0 1 "$GREEDY" seq "$WORK/unrot-q8.f32" >"$WORK/unrot-q8.txt"
  echo "--unrotate, export q8_0 (rotated again) into a q8_0 context, against its uninterrupted run | $(compare \
"$WORK/q8.straight.f32" "$WORK/unrot-q8.f32"); greedy $(agreement "$WORK/q8.straight.txt" "$WORK/unrot-q8.txt")"
  cp "$WORK/norot.bin" "$FIX/seq-q8_0-fa1-norot.bin"

  echo "# Mixed types: a q8_0 K + f16 V cache, flash attention off (-ctk q8_0 alone)"
  name=seq-q8_0-f16-fa0
  "$RT" "$MODEL" save "$WORK/$name.bin" q8_0/f16 0 "$N"
  "$RT" "$MODEL" restore "$WORK/$name.bin" q8_0/f16 0 "$GREEDY" seq "$WORK/$name.orig.f32" >/dev/null
  "$KVFILE" convert "$WORK/$name.bin" "$WORK/$name.kv" --keep-raw k,v --head-size 64 --force >/dev/null
  "$KVFILE" convert "$WORK/$name.kv" "$WORK/$name.raw.bin" --format llama-seq --force >/dev/null
  cmp -s "$WORK/$name.bin" "$WORK/$name.raw.bin" && bytes=identical || bytes=DIFFERENT
  "$RT" "$MODEL" restore "$WORK/$name.raw.bin" q8_0/f16 0 "$GREEDY" seq "$WORK/$name.raw.f32" >/dev/null
  echo "$name.bin, raw import, export with the recorded types | $bytes, $(compare "$WORK/$name.orig.f32" \
"$WORK/$name.raw.f32")"
  "$KVFILE" convert "$WORK/seq-f16-fa0.bin" "$WORK/f16.kv" --head-size 64 --force >/dev/null
  "$KVFILE" convert "$WORK/f16.kv" "$WORK/f16-to-mixed.bin" --format llama-seq --dtype k=q8_0,v=f16 --v-trans 1 \
    --force >/dev/null
  "$RT" "$MODEL" restore "$WORK/f16-to-mixed.bin" q8_0/f16 0 "$GREEDY" seq "$WORK/f16-to-mixed.f32" \
    >"$WORK/f16-to-mixed.txt"
  "$RT" "$MODEL" straight "$N" q8_0/f16 0 "$GREEDY" "$WORK/mixed.straight.f32" >"$WORK/mixed.straight.txt"
  echo "seq-f16-fa0.bin as e4m3, exported --dtype k=q8_0,v=f16, into that context, against its uninterrupted run \
| $(compare "$WORK/mixed.straight.f32" "$WORK/f16-to-mixed.f32"); greedy $(agreement "$WORK/mixed.straight.txt" \
"$WORK/f16-to-mixed.txt")"
  cp "$WORK/$name.bin" "$FIX/"

  echo "# Streams: a 4-stream context (llama-server -np 4), sequence 0"
  name=seq-f16-fa1-np4
  RT_NSEQ=4 "$RT" "$MODEL" save "$WORK/$name.bin" f16 1 "$N"
  "$KVFILE" convert "$WORK/$name.bin" "$WORK/$name.kv" --keep-raw k,v --head-size 64 --force >/dev/null
  "$KVFILE" convert "$WORK/$name.kv" "$WORK/$name.raw.bin" --format llama-seq --force >/dev/null
  cmp -s "$WORK/$name.bin" "$WORK/$name.raw.bin" && bytes=identical || bytes=DIFFERENT
  echo "$name.bin, raw import and export | $bytes"
  "$KVFILE" convert "$WORK/seq-f16-fa1.bin" "$WORK/one.kv" --keep-raw k,v --head-size 64 --force >/dev/null
  "$KVFILE" convert "$WORK/one.kv" "$WORK/one-np4.bin" --format llama-seq --n-stream 4 --force >/dev/null
  RT_NSEQ=4 RT_SEQ=2 "$RT" "$MODEL" restore "$WORK/one-np4.bin" f16 1 "$GREEDY" seq "$WORK/one-np4.f32" \
    >"$WORK/one-np4.txt"
  echo "seq-f16-fa1.bin (1 stream) exported --n-stream 4, restored into sequence 2 of a 4-stream context | \
$(compare "$WORK/seq-f16-fa1.orig.f32" "$WORK/one-np4.f32") against restoring the original into a 1-stream one"
  if RT_NSEQ=4 "$RT" "$MODEL" restore "$WORK/seq-f16-fa1.bin" f16 1 1 seq 2>"$WORK/np4-refused.err" >/dev/null; then
    echo "the 1-stream file itself into the 4-stream context | restored"
  else
    echo "the 1-stream file itself into the 4-stream context | refused by llama.cpp"
  fi
  cp "$WORK/$name.bin" "$FIX/"

  echo "# Two caches: Gemma-2-shaped, 4 layers (even ones sliding-window), window 64 then 8"
  for w in 64 8; do
    name=seq-gemma2-w$w-f16-fa1
    "$RT" "$WORK/gemma2-w$w.gguf" save "$WORK/$name.bin" f16 1 "$N"
    "$RT" "$WORK/gemma2-w$w.gguf" restore "$WORK/$name.bin" f16 1 "$GREEDY" seq "$WORK/$name.orig.f32" >/dev/null
    if "$KVFILE" convert "$WORK/$name.bin" "$WORK/$name.kv" --keep-raw k,v --head-size 64 --force \
        >"$WORK/$name.imp" 2>&1; then
      "$KVFILE" convert "$WORK/$name.kv" "$WORK/$name.raw.bin" --format llama-seq --force >/dev/null
      cmp -s "$WORK/$name.bin" "$WORK/$name.raw.bin" && bytes=identical || bytes=DIFFERENT
      "$RT" "$WORK/gemma2-w$w.gguf" restore "$WORK/$name.raw.bin" f16 1 "$GREEDY" seq "$WORK/$name.raw.f32" >/dev/null
      echo "$name.bin | $(cut -d: -f2- "$WORK/$name.imp" | cut -d';' -f2); raw through kvfile: $bytes, $(compare \
"$WORK/$name.orig.f32" "$WORK/$name.raw.f32")"
    else
      echo "$name.bin | refused: $(sed 's/.*(from byte [0-9]*): //' "$WORK/$name.imp")"
    fi
    cp "$WORK/$name.bin" "$FIX/"
  done
  # A session file keeps the masked cells the sliding-window cache still holds.
  name=session-gemma2-w8-f16-fa0
  "$RT" "$WORK/gemma2-w8.gguf" save "$WORK/$name.bin" f16 0 "$N" session
  "$RT" "$WORK/gemma2-w8.gguf" restore "$WORK/$name.bin" f16 0 "$GREEDY" session "$WORK/$name.orig.f32" >/dev/null
  "$KVFILE" convert "$WORK/$name.bin" "$WORK/$name.kv" --keep-raw k,v --head-size 64 --force >"$WORK/$name.imp"
  "$KVFILE" convert "$WORK/$name.kv" "$WORK/$name.raw.bin" --format llama-session --force >/dev/null
  cmp -s "$WORK/$name.bin" "$WORK/$name.raw.bin" && bytes=identical || bytes=DIFFERENT
  "$RT" "$WORK/gemma2-w8.gguf" restore "$WORK/$name.raw.bin" f16 0 "$GREEDY" session "$WORK/$name.raw.f32" >/dev/null
  echo "$name.bin | $(cut -d: -f2- "$WORK/$name.imp" | cut -d';' -f2); raw through kvfile: $bytes, $(compare \
"$WORK/$name.orig.f32" "$WORK/$name.raw.f32")"
  cp "$WORK/$name.bin" "$FIX/"
} >>"$WORK/results.txt"
cp "$WORK/results.txt" "$FIX/results.txt"
cat "$FIX/results.txt"
