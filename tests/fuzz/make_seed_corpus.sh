#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Regenerates the seed corpus of the fuzz targets (tests/fuzz/corpus/) with
# the kvfile CLI of a normal build: `tests/fuzz/make_seed_corpus.sh BUILD_DIR`.
# The seeds are small on purpose (libFuzzer's default input length is the
# largest seed's): the two fixtures, several chunks, a rewound file, a torn
# tail, e5m2, a raw stream, the dsa-mixed preset, nvfp4 (2.2), v1 files for the upgrade,
# and safetensors files of values and of codes for the importer.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
KVFILE="$1/kvfile"
CORPUS="$ROOT/tests/fuzz/corpus"
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
k() { "$KVFILE" -q "$@" >/dev/null; }

k synth "$TMP/chunks.kv" --preset tiny --tokens 21 --chunk-tokens 4 --seed 1
cp "$TMP/chunks.kv" "$TMP/rewound.kv" && k rewind "$TMP/rewound.kv" --to 13
head -c $(( $(stat -c %s "$TMP/chunks.kv") - 3000 )) "$TMP/chunks.kv" >"$TMP/torn.kv"
k synth "$TMP/e5m2.kv" --preset tiny --tokens 5 --chunk-tokens 3 --dtype e5m2 --seed 2
k convert "$TMP/chunks.kv" "$TMP/raw_v.kv" --keep-raw v --chunk-tokens 8
k synth "$TMP/dsa.kv" --preset dsa-mixed --tokens 1 --seed 3
k convert "$TMP/chunks.kv" "$TMP/nvfp4.kv" --dtype nvfp4 --chunk-tokens 8
k convert "$TMP/chunks.kv" "$TMP/v1_bf16.kv" --format v1 --chunk-tokens 6
k convert "$TMP/e5m2.kv" "$TMP/v1_f32.kv" --format v1 --dtype f32
k convert "$TMP/e5m2.kv" "$TMP/values.safetensors"
k convert "$TMP/e5m2.kv" "$TMP/codes.safetensors" --codes
k convert "$TMP/rewound.kv" "$TMP/f16.safetensors" --dtype f16

rm -rf "${CORPUS:?}"/{read,verify,upgrade,safetensors}
mkdir -p "$CORPUS"/{read,verify,upgrade,safetensors}
for t in read verify upgrade; do
  cp "$ROOT/tests/fixtures/example_v1.kv" "$ROOT/tests/fixtures/example_v2.kv" \
    "$ROOT/tests/fixtures/example_v2_0.kv" "$CORPUS/$t/"
done
for t in read verify; do
  cp "$TMP"/{chunks,rewound,torn,e5m2,raw_v,dsa,v1_bf16,v1_f32,nvfp4}.kv "$CORPUS/$t/"
done
cp "$TMP"/{v1_bf16,v1_f32,rewound,torn}.kv "$CORPUS/upgrade/"
cp "$TMP"/*.safetensors "$CORPUS/safetensors/"
# llama.cpp state files for the llama_state target: a sequence state (f16),
# a session with V transposed, a q8_0 one.
k synth "$TMP/llama.kv" --preset tiny --tokens 3 --seed 4
k convert "$TMP/llama.kv" "$TMP/seq-f16.bin" --format llama-seq
k convert "$TMP/llama.kv" "$TMP/session-vt.bin" --format llama-session --arch llama --v-trans 1
k convert "$TMP/llama.kv" "$TMP/seq-q8_0.bin" --format llama-seq --dtype q8_0
rm -rf "$CORPUS/llama_state" && mkdir -p "$CORPUS/llama_state"
cp "$TMP"/{seq-f16,session-vt,seq-q8_0}.bin "$CORPUS/llama_state/"
du -sh "$CORPUS"

# .kvpack seeds (fuzz_pack): members sharing chunks (two fp8 dtypes), and a raw stream.
mkdir -p "$TMP/p/d" "$TMP/r" "$CORPUS/pack"
k synth "$TMP/p/a.kv" --preset tiny --tokens 7 --chunk-tokens 4 --seed 1
k synth "$TMP/p/d/b.kv" --preset tiny --tokens 11 --chunk-tokens 3 --seed 1
k synth "$TMP/p/e.kv" --preset tiny --tokens 3 --dtype e5m2 --seed 2
k pack "$TMP/p" -o "$CORPUS/pack/shared.kvpack" --chunk-tokens 4 --force
k convert "$TMP/p/a.kv" "$TMP/r/raw.kv" --keep-raw v --chunk-tokens 8
k pack "$TMP/r" -o "$CORPUS/pack/raw.kvpack" --chunk-tokens 2 --force
