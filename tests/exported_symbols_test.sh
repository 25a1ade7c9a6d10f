#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Checks that a shared libkvfile exports only public names (docs/api.md,
# "The boundary"): the C API (kvfile_*), names in namespace kvfile and its
# public sub-namespaces (codec, safetensors), their vtables and typeinfo, and
# the version node. Fails, listing them, on any other defined dynamic
# symbol: kvfile::internal, Writer::Impl, codec kernels, the test hooks, the
# I/O fault hook, or a standard-library instantiation.
#
#   tests/exported_symbols_test.sh path/to/libkvfile.so
set -euo pipefail
lib=$1
symbols=$(nm -D --defined-only --demangle "$lib" | cut -d' ' -f3- | sed -E 's/@@?KVFILE_[0-9]+$//')
[ -n "$symbols" ] || { echo "exported_symbols_test: $lib exports nothing" >&2; exit 1; }
bad=$(printf '%s\n' "$symbols" | grep -Ev '^(kvfile_[a-z0-9_]+|KVFILE_[0-9]+)$' |
      grep -Ev '^((vtable|typeinfo|typeinfo name|VTT|construction vtable) for )?kvfile::' || true)
bad+=$'\n'$(printf '%s\n' "$symbols" | grep -E 'kvfile::(internal|hooks)::|::Impl\b|IoFault|io_fault|codec::internal' || true)
bad=$(printf '%s\n' "$bad" | sed '/^$/d' | sort -u)
total=$(printf '%s\n' "$symbols" | wc -l)
if [ -n "$bad" ]; then
  echo "exported_symbols_test: $lib exports $(printf '%s\n' "$bad" | wc -l) non-public name(s) of $total:" >&2
  printf '%s\n' "$bad" >&2
  exit 1
fi
echo "exported_symbols_test: $total exported names, all public"
