#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Installs what is missing, builds with warnings as errors, and runs every
# test: the unit tests and the long exhaustive codec checks with the default
# I/O backend (io_uring where the kernel allows it), then an install into a
# scratch prefix with the API examples built against it (install_test.sh),
# then the tests once more built with AddressSanitizer and
# UndefinedBehaviorSanitizer (leak checking on) and the POSIX backend forced,
# so both backends run the whole suite: every test of the first pass but the
# long ones, the damage sweeps checking 1 case in 8 (KVFILE_SWEEP_SAMPLE;
# every byte of every fixture is still flipped, every block boundary still
# cut) and the Python module with the ASan runtime preloaded into the
# interpreter (the S3 tests in both passes start their own object store,
# OpenStack Swift on 127.0.0.1: tests/support/swift_store.py); and last
# every fuzz target for 15 seconds (nine targets: the CPU time seven took at 20), two at a time
# (scripts/fuzz.sh).
set -euo pipefail
KVFILE_ROOT=$(cd "$(dirname "$0")/.." && pwd)
source "$KVFILE_ROOT/scripts/deps.sh"
kvfile_install_deps
kvfile_build "$KVFILE_ROOT/build" --preset=dev
# Background builds end with this script, whichever way it ends.
kill_tree() { local c; for c in $(pgrep -P "$1"); do kill_tree "$c"; done; kill "$1" 2>/dev/null || true; }
trap 'for j in $(jobs -p); do kill_tree "$j"; done' EXIT
# The sanitizer build (the asan preset: -O1, -g1, -fsanitize=address,undefined)
# starts now, at low priority: it takes what the first pass and
# install_test leave idle (waiting for fsync, for signals, for locks) and
# is waited for before its own pass. On 2 cores this saves minutes.
(renice -n 10 -p "$BASHPID" >/dev/null; kvfile_build "$KVFILE_ROOT/build-asan" --preset=asan) &
asan_build=$!
# llama-server for the llama_server test (scripts/llama_server_build.sh): cached
# outside the clone; a fresh machine builds it now, at low priority too (26
# minutes of wall time on the shared 2-core machine), and the test runs on its
# own after install_test.sh.
(renice -n 10 -p "$BASHPID" >/dev/null; "$KVFILE_ROOT/scripts/llama_server_build.sh" >/dev/null) &
llama_build=$!
cd "$KVFILE_ROOT/build"
echo "== every test but the exhaustive bit flips, default I/O backend"
ctest --output-on-failure -j "$(nproc)" --timeout 1500 -LE exhaustive -E '^llama_server$'
# The installed library as an outside project sees it: install the build
# above into a scratch prefix, build the C++ and C examples of docs/api.md against
# it with find_package(kvfile) and with pkg-config (shared and static) and
# run them. Reuses the build above: it compiles only the two examples.
echo "== install, and build the API examples against the installed tree"
bash "$KVFILE_ROOT/scripts/install_test.sh" "$KVFILE_ROOT/build"
echo "== kvfile llama-server against a real llama-server (tests/llama_server)"
wait "$llama_build"
KVFILE_REQUIRE_LLAMA_SERVER=1 ctest --output-on-failure --timeout 900 -R '^llama_server$'
echo "== unit tests, AddressSanitizer + UndefinedBehaviorSanitizer, KVFILE_IO=posix"
# The asan preset (CMakePresets.json): -O1, -g1 (line tables only, which is
# what a sanitizer report needs; full debug info made this build a third
# slower), -fsanitize=address,undefined; without -Werror (GCC 12 warns
# falsely under the sanitizers; the dev build above enforces the warnings).
wait "$asan_build"
# The fuzz targets' build, likewise in the background during this pass.
(renice -n 10 -p "$BASHPID" >/dev/null; "$KVFILE_ROOT/scripts/fuzz.sh" --build-only) &
fuzz_build=$!
cd "$KVFILE_ROOT/build-asan"
# The POSIX backend runs here: the first pass ran the default one (io_uring
# where the kernel allows it); the backends' own tests pick theirs
# explicitly, so io_uring's code runs under the sanitizers too. The long
# tests (every finite input through the codecs, the full damage sweeps) ran
# in the first pass; here their quick versions do.
KVFILE_IO=posix KVFILE_SWEEP_SAMPLE=8 ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ctest --output-on-failure -j "$(nproc)" --timeout 900 -LE 'exhaustive|long'
echo "== fuzz targets, 15 s each (libFuzzer, clang, ASan + UBSan)"
wait "$fuzz_build"
KVFILE_FUZZ_JOBS=2 "$KVFILE_ROOT/scripts/fuzz.sh" 15
