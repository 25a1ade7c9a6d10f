#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Checks that libkvfile, as built or as installed (scripts/install_test.sh
# runs it on both installed libraries), holds none of the test hooks: the
# writer salt of the tests (SetWriterSalt) and the system-call fault
# injector (SetIoFaults, TakeIoFault, ...). They live in the test library
# (tests/support/testing_hooks.h, io_faults.h; docs/design.md, "Test
# hooks"). Every symbol counts, defined or not, exported or local: the
# symbol table of an archive or a shared library (nm), and the dynamic one
# of a shared library (nm -D). Fails, listing them, on any hook name.
#
#   tests/test_hooks_absent_test.sh LIBRARY...   (libkvfile.so or libkvfile.a)
set -euo pipefail
[ $# -gt 0 ] || { echo "usage: $0 LIBRARY..." >&2; exit 2; }
hooks='SetWriterSalt|WriterSalt|SetIoFaults|ClearIoFaults|TakeIoFault|IoFaultsInjected|IoOpsCounted|io_faults_armed|IoFault\b|kvfile::hooks::'
status=0
for lib in "$@"; do
  [ -f "$lib" ] || { echo "test_hooks_absent_test: $lib: no such file" >&2; exit 2; }
  symbols=$(nm --demangle "$lib" 2>/dev/null || true)
  case "$lib" in
    *.a) ;;
    *) symbols+=$'\n'$(nm -D --demangle "$lib") ;;
  esac
  [ -n "$(printf '%s' "$symbols" | tr -d '[:space:]')" ] ||
    { echo "test_hooks_absent_test: $lib: no symbols" >&2; exit 1; }
  found=$(printf '%s\n' "$symbols" | grep -E "$hooks" | sed -E 's/^[0-9a-f ]*[A-Za-z?-] //' | sort -u || true)
  if [ -n "$found" ]; then
    echo "test_hooks_absent_test: $lib holds $(printf '%s\n' "$found" | wc -l) test hook name(s):" >&2
    printf '%s\n' "$found" >&2
    status=1
  else
    echo "test_hooks_absent_test: $lib: no test hooks"
  fi
done
exit $status
