#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The long fuzzing campaign (docs/testing.md, "Fuzzing"), run outside CI: every
# libFuzzer target of tests/fuzz/ to a total of N executions (default 10^7),
# spread over J processes (libFuzzer's -jobs/-workers; J defaults to the
# core count), each starting from the seed corpus tests/fuzz/corpus/<target>/.
# Afterwards the inputs that add coverage are merged into that corpus
# (libFuzzer's -merge=1, which keeps only inputs with new features) and
# copied to OUT/<target>/added/ (and packed in OUT/<target>/added.tar.xz)
# as well, and the script prints per target
# the executions done, the coverage of the merged corpus (cov: edges,
# ft: features, from one pass of the target over it) and every crash,
# hang, leak or allocation above the limit (the input is in OUT/<target>/).
#
#   scripts/fuzz_campaign.sh [--runs N] [--jobs J] [--seconds S] [--out DIR]
#                            [--binaries DIR|FILE.tar.xz | --bundle FILE.tar.xz] [TARGET...]
#
# Without --binaries the targets are built first (scripts/fuzz.sh
# --build-only: the fuzz preset, clang, into build-fuzz/). --binaries PATH
# runs prebuilt fuzz_<target> executables instead, from the directory PATH
# or from the .tar.xz PATH that --bundle wrote, so that a machine without
# the build dependencies can run the campaign: the libraries found beside
# the executables come first (LD_LIBRARY_PATH). --bundle FILE builds, then
# writes FILE (.tar.xz): the nine executables without their debug sections
# and the shared libraries they need besides glibc (libstdc++.so.6,
# libgcc_s.so.1, libxxhash.so.0, libz.so.1; the sanitizers and libFuzzer
# are linked in), and runs nothing. The executables need glibc 2.34 or
# later (objdump -T). --seconds S caps each target's time (per process;
# default none): a run cut short says so. Exit status 1 when a target
# found something, 2 on a usage or build error, else 0.
set -euo pipefail
KVFILE_ROOT=$(cd "$(dirname "$0")/.." && pwd)
ALL_TARGETS=(read verify upgrade safetensors mooncake coli llama_state pack index)
RUNS=10000000
JOBS=$(nproc)
SECONDS_CAP=0
OUT="$KVFILE_ROOT/build-fuzz/campaign"
BIN=""
BUNDLE=""
TARGETS=()
usage() {
  echo "usage: $0 [--runs N] [--jobs J] [--seconds S] [--out DIR] [--binaries DIR|FILE.tar.xz | --bundle FILE.tar.xz] [TARGET...]" >&2
  exit 2
}
while [ $# -gt 0 ]; do
  case "$1" in
    --runs) RUNS=${2:?}; shift 2 ;;
    --jobs) JOBS=${2:?}; shift 2 ;;
    --seconds) SECONDS_CAP=${2:?}; shift 2 ;;
    --out) OUT=${2:?}; shift 2 ;;
    --binaries) BIN=$(realpath "${2:?}"); shift 2 ;;
    --bundle) BUNDLE=${2:?}; shift 2 ;;
    -h|--help) usage ;;
    -*) usage ;;
    *) TARGETS+=("$1"); shift ;;
  esac
done
[ ${#TARGETS[@]} -gt 0 ] || TARGETS=("${ALL_TARGETS[@]}")
OUT=$(realpath -m "$OUT")
for v in "$RUNS" "$JOBS" "$SECONDS_CAP"; do [[ "$v" =~ ^[0-9]+$ ]] || usage; done
[ "$JOBS" -ge 1 ] && [ "$RUNS" -ge "$JOBS" ] || usage
for t in "${TARGETS[@]}"; do
  [ -d "$KVFILE_ROOT/tests/fuzz/corpus/$t" ] || { echo "fuzz_campaign: no target '$t'" >&2; exit 2; }
done

if [ -z "$BIN" ]; then
  bash "$KVFILE_ROOT/scripts/fuzz.sh" --build-only || exit 2
  BIN="$KVFILE_ROOT/build-fuzz/tests/fuzz"
  if [ -n "$BUNDLE" ]; then
    stage=$(mktemp -d)
    trap 'rm -rf "$stage"' EXIT
    for t in "${ALL_TARGETS[@]}"; do strip --strip-debug -o "$stage/fuzz_$t" "$BIN/fuzz_$t"; done
    ldd "$BIN/fuzz_pack" | awk '/=> \// {print $3}' | grep -Ev '/(libc|libm|libpthread|libdl|librt)\.so' |
      while read -r lib; do cp -L "$lib" "$stage/"; done
    tar -cJf "$BUNDLE" -C "$stage" .
    echo "fuzz_campaign: $BUNDLE ($(du -h "$BUNDLE" | cut -f1)): $(ls "$stage" | tr '\n' ' ')"
    exit 0
  fi
elif [ -f "$BIN" ]; then
  unpacked=$(mktemp -d)
  trap 'rm -rf "$unpacked"' EXIT
  tar -xJf "$BIN" -C "$unpacked"
  BIN=$unpacked
fi
export LD_LIBRARY_PATH="$BIN${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
for t in "${TARGETS[@]}"; do
  [ -x "$BIN/fuzz_$t" ] || { echo "fuzz_campaign: no executable $BIN/fuzz_$t" >&2; exit 2; }
  missing=$(ldd "$BIN/fuzz_$t" 2>&1 | grep 'not found' || true)
  [ -z "$missing" ] || { echo "fuzz_campaign: $BIN/fuzz_$t needs libraries not here: $missing" >&2; exit 2; }
done

# The limits of scripts/fuzz.sh: a hang, or an allocation out of
# proportion to a <= 1 MiB input, is a finding; a small ASan quarantine.
FLAGS=(-print_funcs=0 -dict="$KVFILE_ROOT/tests/fuzz/kvfile.dict" -timeout=10
       -rss_limit_mb=512 -malloc_limit_mb=512)
export ASAN_OPTIONS=${ASAN_OPTIONS:-quarantine_size_mb=8}

failed=0
mkdir -p "$OUT"
for t in "${TARGETS[@]}"; do
  dir="$OUT/$t" seeds="$KVFILE_ROOT/tests/fuzz/corpus/$t"
  rm -rf "$dir" && mkdir -p "$dir/corpus" "$dir/added"
  cp "$seeds"/* "$dir/corpus/"
  per_job=$(( (RUNS + JOBS - 1) / JOBS ))
  cap=()
  [ "$SECONDS_CAP" = 0 ] || cap=(-max_total_time="$SECONDS_CAP")
  # J processes of per_job runs each, all of them at once; they share
  # dir/corpus (each reloads what the others add). Their logs: dir/fuzz-<i>.log.
  (cd "$dir" && "$BIN/fuzz_$t" "${FLAGS[@]}" -jobs="$JOBS" -workers="$JOBS" -runs="$per_job" "${cap[@]}" \
     -print_final_stats=1 -artifact_prefix="$dir/" corpus >"$dir/jobs.log" 2>&1) || true
  execs=$(cat "$dir"/fuzz-*.log 2>/dev/null | grep -o 'stat::number_of_executed_units: *[0-9]*' |
          awk '{s += $2} END {print s + 0}')
  # The inputs with new features go into the seed corpus, minimized.
  ls "$seeds" | sort >"$dir/before.txt"
  if ! "$BIN/fuzz_$t" "${FLAGS[@]}" -merge=1 "$seeds" "$dir/corpus" >"$dir/merge.log" 2>&1; then
    echo "fuzz_$t: the merge failed (log: $dir/merge.log)" >&2
    failed=1
  fi
  ls "$seeds" | sort | comm -13 "$dir/before.txt" - | while read -r f; do cp "$seeds/$f" "$dir/added/"; done
  added=$(ls "$dir/added" | wc -l)
  # The same inputs as one file, for a machine whose output folder brings
  # back only so many files.
  tar -cJf "$dir/added.tar.xz" -C "$dir" added
  rm -rf "$dir/corpus"  # the campaign's whole corpus: what it adds is in added/
  # Coverage of the merged corpus: one pass of the target over it.
  "$BIN/fuzz_$t" "${FLAGS[@]}" -runs=0 "$seeds" >"$dir/coverage.log" 2>&1 || true
  cov=$(grep -o 'INITED cov: [0-9]* ft: [0-9]*' "$dir/coverage.log" | tail -n 1 | sed 's/INITED //')
  findings=$(cd "$dir" && ls | grep -E '^(crash|timeout|oom|leak|slow-unit)-' || true)
  cut=""
  [ "$execs" -ge "$RUNS" ] || cut=" (short of $RUNS)"
  echo "fuzz_$t: $execs executions$cut in $JOBS processes; merged corpus ${cov:-cov: ? ft: ?};" \
       "$added inputs added to tests/fuzz/corpus/$t/; findings: ${findings:-none} (logs: $dir/)"
  if [ -n "$findings" ]; then
    failed=1
    grep -h -E 'ERROR: (AddressSanitizer|UndefinedBehaviorSanitizer|libFuzzer)|runtime error|fuzz: ' \
      "$dir"/fuzz-*.log | head -n 5 >&2 || true
  fi
done
exit $failed
