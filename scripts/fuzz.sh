#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Builds the libFuzzer targets (the fuzz preset of CMakePresets.json: clang,
# -DKVFILE_FUZZING=ON, into build-fuzz/) and runs each for a bounded time: `scripts/fuzz.sh [seconds]`
# (default 60 per target; `scripts/fuzz.sh --build-only` builds them only). Targets run from a scratch copy of the seed corpus
# (tests/fuzz/corpus/<target>/), so the tree is not modified; KVFILE_FUZZ_JOBS
# targets run at once (default 1). For long campaigns, KVFILE_FUZZ_CORPUS=DIR
# keeps each target's corpus in DIR/<target>/ (seeded on first use), so that
# a run continues where the last one stopped. Fails if a target finds a crash, a hang, a
# leak or an allocation above the limit; the input that did it is left in
# build-fuzz/fuzz-out/<target>/ (libFuzzer's crash-*/timeout-*/oom-* files,
# named in the target's log): copy it to tests/fuzz/regressions/<target>/
# once fixed, so that it is replayed by every test run from then on.
set -euo pipefail
KVFILE_ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD_ONLY=0
if [ "${1:-}" = --build-only ]; then BUILD_ONLY=1; shift; fi  # build the targets, run none
SECONDS_PER_TARGET=${1:-60}
JOBS=${KVFILE_FUZZ_JOBS:-1}
TARGETS=(read verify upgrade safetensors mooncake coli llama_state pack index)
BUILD="$KVFILE_ROOT/build-fuzz"
OUT="$BUILD/fuzz-out"
source "$KVFILE_ROOT/scripts/deps.sh"
kvfile_install_deps
mkdir -p "$BUILD"
if ! { (cd "$KVFILE_ROOT" && cmake --preset fuzz -B "$BUILD") &&
       cmake --build "$BUILD" -j "$(nproc)" $(printf -- '--target fuzz_%s ' "${TARGETS[@]}"); } \
     >"$BUILD/build.log" 2>&1; then
  cat "$BUILD/build.log" >&2
  echo "fuzz: build failed (log: $BUILD/build.log)" >&2
  exit 1
fi
[ "$BUILD_ONLY" = 0 ] || exit 0

# One target: libFuzzer's own limits turn a hang (-timeout, seconds per
# input) or an allocation out of proportion to a <= 1 MiB input
# (-malloc_limit_mb, -rss_limit_mb) into a finding.
run_target() {
  local t=$1 dir="$OUT/$1" corpus="$OUT/$1/corpus" seed
  [ -z "${KVFILE_FUZZ_CORPUS:-}" ] || corpus="$KVFILE_FUZZ_CORPUS/$t"
  rm -rf "$dir" && mkdir -p "$dir" "$corpus"
  for seed in "$KVFILE_ROOT/tests/fuzz/corpus/$t/"*; do
    [ -e "$corpus/$(basename "$seed")" ] || cp "$seed" "$corpus/"
  done
  # A small ASan quarantine: with the default 256 MB every run touched
  # fresh pages, and page faults took a large share of the time.
  if (cd "$dir" && ASAN_OPTIONS=${ASAN_OPTIONS:-quarantine_size_mb=8} \
        nice -n 10 "$BUILD/tests/fuzz/fuzz_$t" -max_total_time="$SECONDS_PER_TARGET" -print_funcs=0 \
        -dict="$KVFILE_ROOT/tests/fuzz/kvfile.dict" -timeout=10 \
        -rss_limit_mb=512 -malloc_limit_mb=512 -print_final_stats=1 \
        -artifact_prefix="$dir/" "$corpus" >"$dir/log" 2>&1); then
    echo "fuzz_$t: ok, $(grep -o 'stat::number_of_executed_units: *[0-9]*' "$dir/log" | grep -o '[0-9]*$') execs" \
         "in ${SECONDS_PER_TARGET}s (log: $dir/log)"
  else
    echo "fuzz_$t: FAILED; log: $dir/log; input:" $(ls "$dir" | grep -E '^(crash|timeout|oom|leak|slow-unit)-' || true) >&2
    tail -n 40 "$dir/log" >&2
    return 1
  fi
}

failed=0
pids=()
for t in "${TARGETS[@]}"; do
  run_target "$t" &
  pids+=($!)
  if [ ${#pids[@]} -ge "$JOBS" ]; then
    wait "${pids[0]}" || failed=1
    pids=("${pids[@]:1}")
  fi
done
for p in "${pids[@]}"; do wait "$p" || failed=1; done
exit $failed
