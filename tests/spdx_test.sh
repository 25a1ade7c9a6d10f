#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Fails if a tracked source or script file does not start with the SPDX line
# "SPDX-License-Identifier: Apache-2.0" in its comment syntax (// or /* */
# for C and C++ and the linker map, # for shell, Python, CMake and
# pkg-config templates): on its first line, or on the second after a "#!".
#
#   tests/spdx_test.sh SOURCE_DIR
set -euo pipefail
cd "$1"
if ! files=$(git ls-files 2>/dev/null); then
  echo "spdx_test: $1 is not a git checkout; nothing to check" >&2
  exit 0
fi
missing=()
checked=0
while IFS= read -r f; do
  case "$f" in
    *.cc | *.h | *.c | *.py | *.sh | *.cmake | *.in | *.map | */CMakeLists.txt | CMakeLists.txt | .ci/run) ;;
    *) continue ;;
  esac
  [ -f "$f" ] || continue
  checked=$((checked + 1))
  line=$(head -n 1 "$f")
  [[ $line == '#!'* ]] && line=$(sed -n 2p "$f")
  case "$line" in
    '// SPDX-License-Identifier: Apache-2.0' | '# SPDX-License-Identifier: Apache-2.0' | \
    '/* SPDX-License-Identifier: Apache-2.0 */') ;;
    *) missing+=("$f") ;;
  esac
done <<<"$files"
if [ ${#missing[@]} -gt 0 ]; then
  echo "spdx_test: ${#missing[@]} of $checked source files lack the SPDX line:" >&2
  printf '  %s\n' "${missing[@]}" >&2
  exit 1
fi
echo "spdx_test: $checked source files, each with its SPDX line"
