#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Compares `kvfile bench` of two revisions on this machine: builds each
# (Release, command line only) from `git archive`, then runs their benches
# alternately, RUNS times each, and prints per row the medians of every run
# and the ratio new / base of the medians of runs (docs/performance.md).
#
#   tools/bench/bench_ab.sh BASE_REV NEW_REV [RUNS=3] [TOKENS=8192] [WORK_DIR]
#
# A revision may also be a .tar of a source tree (`git archive REV > F.tar`),
# for a machine that has the tree but not its history. A second call with the
# same WORK_DIR and the same revisions reuses the builds (the source is
# compared, not the name). CMAKE_OPTIONS: further CMake options for both
# builds (a prefix for the build dependencies, say).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
base=$1 new=$2 runs=${3:-3} tokens=${4:-8192} work=${5:-$(mktemp -d)}
mkdir -p "$work/data"
for side in base new; do
  rev=${!side}
  if [ -f "$rev" ]; then sum=$(sha256sum <"$rev"); else sum=$(git -C "$root" archive "$rev" | sha256sum); fi
  if [ -x "$work/$side/build/kvfile" ] && [ "$(cat "$work/$side/source.sha256" 2>/dev/null)" = "$sum" ]; then
    echo "== $side: the build of the same source, kept" >&2
    continue
  fi
  rm -rf "$work/$side" && mkdir -p "$work/$side/src"
  if [ -f "$rev" ]; then tar -x -C "$work/$side/src" -f "$rev"; else git -C "$root" archive "$rev" | tar -x -C "$work/$side/src"; fi
  # shellcheck disable=SC2086
  cmake -S "$work/$side/src" -B "$work/$side/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVFILE_BUILD_TESTS=OFF \
    -DKVFILE_BUILD_PYTHON=OFF -DKVFILE_BUILD_BENCH=OFF ${CMAKE_OPTIONS:-} >"$work/$side/build.log" 2>&1 &&
    cmake --build "$work/$side/build" --target kvfile_cli >>"$work/$side/build.log" 2>&1 ||
    { tail -30 "$work/$side/build.log"; exit 1; }
  echo "$sum" >"$work/$side/source.sha256"
done
label() { if [ -f "$1" ]; then basename "$1"; else git -C "$root" rev-parse --short "$1"; fi; }
for i in $(seq "$runs"); do
  for side in base new; do
    echo "== $side ($(label "${!side}")), run $i" >&2
    "$work/$side/build/kvfile" bench --preset llama-3.1-8b --tokens "$tokens" --dir "$work/data" --reps 3 --json \
      >"$work/${side}_$i.json"
  done
done
python3 - "$work" "$runs" <<'PY'
import json, statistics, sys
work, runs = sys.argv[1], int(sys.argv[2])
def rows(f):
    return {(r["path"], r["threads"]): r["gbps"]["median"] for r in json.load(open(f))["rows"]}
b = [rows(f"{work}/base_{i}.json") for i in range(1, runs + 1)]
n = [rows(f"{work}/new_{i}.json") for i in range(1, runs + 1)]
print(f"{'path':46s} thr  {'base GB/s per run':24s} {'new GB/s per run':24s} new/base")
for k in b[0]:
    if k not in n[0]:
        continue
    bb, nn = [x[k] for x in b], [x[k] for x in n]
    print(f"{k[0][:46]:46s} {k[1]:3d}  {' '.join(f'{v:7.2f}' for v in bb):24s} "
          f"{' '.join(f'{v:7.2f}' for v in nn):24s} {statistics.median(nn) / statistics.median(bb):.2f}")
PY
