#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Speed of the seeds' formats in kvfile convert against a plain copy of the
# same bytes, in one run: `scripts/bench_formats.sh [KVFILE] [TOKENS] [DIR]`.
# A dsa-mixed session (61 layers: latent 512 + rope 64 e4m3, indexer 128
# bf16) of TOKENS tokens is exported to and imported from a COLIKV2 file and
# a Mooncake record directory; each step and `cp` of its input (and of its
# output, `cp -r` for a directory) runs 3 times, and the medians are
# printed (seconds, and the step's time over the copy's). Files are synced
# by every step (convert syncs; cp is followed by sync of the file).
set -euo pipefail
KV=${1:-build/kvfile}
TOKENS=${2:-2048}
DIR=${3:-$(mktemp -d)}
mkdir -p "$DIR"
"$KV" synth "$DIR/s.kv" --preset dsa-mixed --tokens "$TOKENS" --seed 1 --force >/dev/null

median() { sort -g | sed -n 2p; }
# time of one command in seconds (wall), its output discarded
t() { local s e; s=$(date +%s.%N); "$@" >/dev/null 2>&1; e=$(date +%s.%N); awk -v a="$s" -v b="$e" 'BEGIN { printf "%.4f\n", b - a }'; }
cpsync() { rm -rf "$2"; cp -r "$1" "$2"; sync -f "$2" 2>/dev/null || sync; }

run3() { for _ in 1 2 3; do t "$@"; done | median; }

report() {  # name, step median, copy-of-input median, copy-of-output median, bytes in, bytes out
  printf '%-22s %8.3f s   cp in %7.3f s (%5.2fx)   cp out %7.3f s (%5.2fx)   %s -> %s bytes\n' \
    "$1" "$2" "$3" "$(awk -v a="$2" -v b="$3" 'BEGIN { print a / b }')" \
    "$4" "$(awk -v a="$2" -v b="$4" 'BEGIN { print a / b }')" "$5" "$6"
}
size() { du -sb "$1" | cut -f1; }

"$KV" convert "$DIR/s.kv" "$DIR/s.coli_kv" --format coli-v2 --vocab 200000 --force >/dev/null
"$KV" convert "$DIR/s.kv" "$DIR/mc" --format mooncake --force >/dev/null

a=$(run3 "$KV" convert "$DIR/s.kv" "$DIR/x.coli_kv" --format coli-v2 --vocab 200000 --force)
b=$(run3 cpsync "$DIR/s.kv" "$DIR/copy1")
c=$(run3 cpsync "$DIR/s.coli_kv" "$DIR/copy2")
report "export coli-v2" "$a" "$b" "$c" "$(size "$DIR/s.kv")" "$(size "$DIR/s.coli_kv")"

a=$(run3 "$KV" convert "$DIR/s.coli_kv" "$DIR/x.kv" --force)
report "import .coli_kv" "$a" "$c" "$b" "$(size "$DIR/s.coli_kv")" "$(size "$DIR/x.kv")"

a=$(run3 "$KV" convert "$DIR/s.kv" "$DIR/mc2" --format mooncake --force)
d=$(run3 cpsync "$DIR/mc" "$DIR/copy3")
report "export mooncake" "$a" "$b" "$d" "$(size "$DIR/s.kv")" "$(size "$DIR/mc")"

a=$(run3 "$KV" convert "$DIR/mc" "$DIR/y.kv" --force)
report "import mooncake" "$a" "$d" "$b" "$(size "$DIR/mc")" "$(size "$DIR/y.kv")"
