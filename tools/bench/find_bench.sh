#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# The prefix lookup figures of docs/packs.md ("Prefix lookup"): a directory
# of N tiny .kv files, `kvfile index`, then `kvfile find` and in-process
# lookups, warm and after dropping the page cache (root only; skipped
# otherwise). Medians of RUNS runs; peak RSS from /usr/bin/time -v.
# Usage: tools/bench/find_bench.sh BUILD_DIR WORK_DIR [N] [RUNS]
set -eu
build=$1 work=$2 n=${3:-100000} runs=${4:-5}
kv=$build/kvfile fb=$build/find_bench
dir=$work/corpus
export KVFILE_IO=posix
[ -d "$dir" ] || { mkdir -p "$work"; "$fb" make "$dir" "$n"; }
"$fb" query "$dir" "$work/q.txt"
secs() { /usr/bin/time -f '%e %M' -o "$work/t" "$@" >/dev/null 2>"$work/err" || { cat "$work/err"; exit 1; }; cat "$work/t"; }
median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
drop() { sync; echo 3 >/proc/sys/vm/drop_caches 2>/dev/null; }
rm -f "$dir/.kvfile-index"
echo "index (first build): $(secs "$kv" index "$dir") (s, peak KiB)"
echo "index (up to date):  $(secs "$kv" index "$dir")"
for i in $(seq "$runs"); do secs "$kv" find "$dir" --tokens "$work/q.txt"; done >"$work/warm"
echo "find, new process, warm cache: median $(cut -d' ' -f1 "$work/warm" | median) s, peak $(cut -d' ' -f2 "$work/warm" | sort -n | tail -1) KiB"
for i in $(seq "$runs"); do "$fb" lookup "$dir" 1000; done >"$work/api"
echo "in-process (PrefixIndex, warm): $(sed -n 1p "$work/api")"
echo "  open ms median: $(awk '{print $4}' "$work/api" | median), warm lookup ms median: $(awk '{print $13}' "$work/api" | median)"
if drop; then
  for i in $(seq "$runs"); do drop; secs "$kv" find "$dir" --tokens "$work/q.txt"; done >"$work/cold"
  echo "find, new process, after drop_caches: median $(cut -d' ' -f1 "$work/cold" | median) s"
  for i in $(seq "$runs"); do drop; "$fb" lookup "$dir" 2; done >"$work/coldapi"
  echo "in-process after drop_caches: open ms median $(awk '{print $4}' "$work/coldapi" | median), first lookup ms median $(awk '{print $8}' "$work/coldapi" | median)"
else
  echo "drop_caches not permitted: no cold figures"
fi
ls -l "$dir/.kvfile-index" | awk '{print "index bytes:", $5}'
