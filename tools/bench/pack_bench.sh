#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Issue 17's pack figures on a corpus of N synthetic sessions that share a
# 2,048-token prefix and add 256 tokens each (llama-3.1-8b geometry):
# kvfile pack against the machine's own `cp -r DIR` + sync, measured in the
# same run (medians of 3), unpack of one member, peak memory (max RSS), the
# size ratio measured at N and the one the format gives for N = 1,000.
#
#   tools/bench/pack_bench.sh [N] [SCRATCH_DIR] [KVFILE]
#   (defaults: 40, ./pack_bench.tmp, build/kvfile; SCRATCH_DIR is removed at the end)
set -euo pipefail
n=${1:-40}
dir=${2:-./pack_bench.tmp}
kvfile=${3:-build/kvfile}
prefix=2048 own=256 chunk=256
# Arithmetic on decimals (awk: no bc needed). calc EXPR [DECIMALS]
calc() { awk "BEGIN { printf \"%.${2:-3}f\", $1 }"; }
mkdir -p "$dir/corpus"
shm=
trap 'rm -rf "$dir" ${shm:+"$shm"}' EXIT

for ((i = 1; i <= n; i++)); do
  "$kvfile" synth "$dir/corpus/$(printf 'session%04d.kv' "$i")" --preset llama-3.1-8b \
    --tokens $((prefix + own)) --seed "$i" --prefix-tokens $prefix --prefix-seed 0 >/dev/null
done
sync

now() { date +%s.%N; }
median() { sort -g | sed -n 2p; }
cp_times=() pack_times=()
for rep in 1 2 3; do
  rm -rf "$dir/copy" "$dir/c.kvpack"; sync
  t0=$(now); cp -r "$dir/corpus" "$dir/copy"; sync; t1=$(now)
  cp_times+=("$(calc "$t1 - $t0")")
  rm -rf "$dir/copy"; sync
  # kvfile pack syncs the pack (and its directory) before it returns.
  t0=$(now); "$kvfile" pack "$dir/corpus" -o "$dir/c.kvpack" >/dev/null; t1=$(now)
  pack_times+=("$(calc "$t1 - $t0")")
  [ $rep -lt 3 ] && rm -f "$dir/c.kvpack"
done
cp_med=$(printf '%s\n' "${cp_times[@]}" | median)
pack_med=$(printf '%s\n' "${pack_times[@]}" | median)

unpack_times=()
for rep in 1 2 3; do
  rm -rf "$dir/one"; sync
  t0=$(now); "$kvfile" unpack "$dir/c.kvpack" -o "$dir/one" session0001.kv >/dev/null; t1=$(now)
  unpack_times+=("$(calc "$t1 - $t0")")
done
unpack_med=$(printf '%s\n' "${unpack_times[@]}" | median)
# The machine's own limit for one durable file of that size: cp of the
# member's source .kv, then sync.
cp1_times=()
for rep in 1 2 3; do
  rm -f "$dir/one.kv"; sync
  t0=$(now); cp "$dir/corpus/session0001.kv" "$dir/one.kv"; sync; t1=$(now)
  cp1_times+=("$(calc "$t1 - $t0")")
done
cp1_med=$(printf '%s\n' "${cp1_times[@]}" | median)
member_bytes=$(stat -c %s "$dir/one/session0001.kv")
# The same two in memory, where no disk limits either: unpack into tmpfs
# against cp into tmpfs (skipped without /dev/shm room for two members).
shm_line="in memory (tmpfs): skipped (no room in /dev/shm)"
if [ -d /dev/shm ] && [ "$(df --output=avail -B1 /dev/shm 2>/dev/null | tail -1)" -gt $((3 * member_bytes)) ]; then
  shm=$(mktemp -d /dev/shm/pack_bench.XXXXXX)
  shm_unpack=() shm_cp=()
  for rep in 1 2 3; do
    rm -rf "$shm/one" "$shm/one.kv"
    t0=$(now); "$kvfile" unpack "$dir/c.kvpack" -o "$shm/one" session0001.kv >/dev/null; t1=$(now)
    shm_unpack+=("$(calc "$t1 - $t0")")
    t0=$(now); cp "$dir/corpus/session0001.kv" "$shm/one.kv"; t1=$(now)
    shm_cp+=("$(calc "$t1 - $t0")")
  done
  rm -rf "$shm"
  su=$(printf '%s\n' "${shm_unpack[@]}" | median) sc=$(printf '%s\n' "${shm_cp[@]}" | median)
  shm_line="in memory (tmpfs): unpack ${shm_unpack[*]} s median $su, cp ${shm_cp[*]} s median $sc; unpack vs cp: $(calc "$sc / $su" 2)x"
fi

rm -f "$dir/c2.kvpack" && rm -rf "$dir/one2"
pack_rss=$( { /usr/bin/time -f '%M' "$kvfile" pack "$dir/corpus" -o "$dir/c2.kvpack" >/dev/null; } 2>&1 | tail -1)
unpack_rss=$( { /usr/bin/time -f '%M' "$kvfile" unpack "$dir/c.kvpack" -o "$dir/one2" session0001.kv >/dev/null; } 2>&1 | tail -1)

dir_bytes=$(du -sb --apparent-size "$dir/corpus" | cut -f1)
kv_bytes=$(stat -c %s "$dir/corpus/session0001.kv")
pack_bytes=$(stat -c %s "$dir/c.kvpack")
# spec/PACK.md: header 128; chunks (prefix/chunk shared + N own) of chunk*P
# bytes; N records of 4*(tokens + chunks); model 1304; chunk table 48 per
# chunk; names; index 64 per member. P = 32 layers x 2 streams x
# (8 x 128 codes + 8 scales x 4).
P=$((32 * 2 * (8 * 128 + 8 * 4)))
tokens=$((prefix + own)) k=$(((prefix + own + chunk - 1) / chunk)) shared=$((prefix / chunk))
name=$(printf 'session%04d.kv' 1 | wc -c)
formula() {  # members
  local m=$1 own_chunks=$(((k - shared) * $1))
  echo $((128 + (shared + own_chunks) * chunk * P + m * 4 * (tokens + k) + 1304 + 48 * (shared + own_chunks) + m * name + 64 * m))
}
echo "corpus: $n sessions of $tokens tokens ($prefix shared), llama-3.1-8b e4m3: $dir_bytes bytes ($kv_bytes per .kv)"
echo "cp -r + sync:      ${cp_times[*]} s  median $cp_med"
echo "kvfile pack:       ${pack_times[*]} s  median $pack_med"
echo "pack speed vs cp:  $(calc "$cp_med / $pack_med" 2)x"
echo "unpack 1 member:   ${unpack_times[*]} s  median $unpack_med ($member_bytes bytes, $(calc "$member_bytes / $unpack_med / 1000000" 0) MB/s)"
echo "cp 1 .kv + sync:   ${cp1_times[*]} s  median $cp1_med; unpack speed vs cp: $(calc "$cp1_med / $unpack_med" 2)x"
echo "$shm_line"
echo "peak RSS:          pack $((pack_rss / 1024)) MiB, unpack of one member $((unpack_rss / 1024)) MiB"
echo "pack size:         $pack_bytes bytes (format arithmetic: $(formula "$n")); directory/pack $(calc "$dir_bytes / $pack_bytes" 2)x"
echo "N = 1000:          directory $((1000 * kv_bytes)) bytes, pack $(formula 1000) bytes: $(calc "1000 * $kv_bytes / $(formula 1000)" 2)x"
