#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Installs kvfile into scratch prefixes and builds the API examples of
# docs/api.md (tests/consumer/example.cc and example.c) against the
# installed tree only, as a project outside this repository would, four
# ways: CMake's find_package(kvfile) with the shared and with the static
# library, and pkg-config with the shared library and with --static (a
# fully static program). Each program writes a session, reads it back and
# checks every value; the installed `kvfile verify` then checks the file it
# wrote. Then the kvfile command line and the resume example are built from
# their sources against the installed shared library (tests/consumer/tools:
# public headers only) and run.
# Then the Python package: imported from the installed prefix, and
# installed with `pip install --no-build-isolation .` (offline) into a fresh
# virtual environment and imported from there, outside the tree.
#
#   scripts/install_test.sh [BUILD_DIR]
#
# BUILD_DIR (default: build) is configured and built as scripts/test.sh does
# (the dev preset: libkvfile.so), so after test.sh nothing is compiled again
# there; BUILD_DIR-static is the same with BUILD_SHARED_LIBS=OFF (the
# library and the command only). Exits non-zero at the first failure.
set -euo pipefail
KVFILE_ROOT=$(cd "$(dirname "$0")/.." && pwd)
build_dir=${1:-$KVFILE_ROOT/build}
source "$KVFILE_ROOT/scripts/deps.sh"
kvfile_build "$build_dir" --preset=dev kvfile kvfile_cli kvfile_docs kvfile_python
# The static library alone (the installed kvfile command that checks the
# sessions comes from the shared build), unoptimized: what is checked here
# is the package, not the code (the tests above ran on the optimized build),
# and -O0 compiles in a third of the time.
kvfile_build "$build_dir-static" --preset=dev -DBUILD_SHARED_LIBS=OFF -DKVFILE_BUILD_TESTS=OFF \
  -DKVFILE_BUILD_TOOLS=OFF -DKVFILE_BUILD_PYTHON=OFF -DKVFILE_BUILD_BENCH=OFF \
  -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG=-O0 -DCMAKE_C_FLAGS_DEBUG=-O0 kvfile

scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
consumer_src=$KVFILE_ROOT/tests/consumer
# One prefix per library kind: the shared one (with the kvfile command that
# checks every session below) and the static one.
declare -A prefix_of libdir_of
for linkage in shared static; do
  dir=$build_dir
  [ "$linkage" = static ] && dir=$build_dir-static
  prefix_of[$linkage]=$scratch/prefix-$linkage
  cmake --install "$dir" --prefix "${prefix_of[$linkage]}" >"$scratch/install-$linkage.log"
  pc_file=$(find "${prefix_of[$linkage]}" -name kvfile.pc)
  libdir_of[$linkage]=$(dirname "$(dirname "$pc_file")")
done
prefix=${prefix_of[shared]}
libdir=${libdir_of[shared]}
if [ -e "${libdir_of[static]}/libkvfile.so" ] || [ ! -e "${libdir_of[static]}/libkvfile.a" ] ||
   [ -e "$libdir/libkvfile.a" ] || [ ! -e "$libdir/libkvfile.so" ]; then
  echo "install_test: each prefix must hold one kind of library (BUILD_SHARED_LIBS):" >&2
  ls "$libdir" "${libdir_of[static]}" >&2
  exit 1
fi

# Runs both example programs of one way (their directory $1) and checks the
# sessions they wrote with the installed command line; $2 says how the
# programs must use libkvfile: "shared" (linked to the installed .so) or
# "static" (no libkvfile.so at all).
run_examples() {
  local dir=$1 linkage=$2
  for program in example_cpp example_c; do
    local exe=$dir/$program deps
    deps=$(ldd "$exe" 2>&1 || true)  # a static program: "not a dynamic executable"
    local want_deps="*libkvfile.so.0 => $libdir/libkvfile.so.0 *"
    if { [ "$linkage" = shared ] && [[ $deps != $want_deps ]]; } ||
       { [ "$linkage" = static ] && [[ $deps == *libkvfile* ]]; }; then
      echo "install_test: $exe: not linked as expected ($linkage libkvfile):" >&2
      echo "$deps" >&2
      return 1
    fi
    "$exe" "$dir/$program.kv"
    "$prefix/bin/kvfile" verify "$dir/$program.kv"
  done
}

for linkage in shared static; do
  echo "== find_package(kvfile), $linkage library"
  cmake -S "$consumer_src" -B "$scratch/cmake-$linkage" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_PREFIX_PATH="${prefix_of[$linkage]}" \
    "-DCMAKE_C_FLAGS=-Wall -Wextra -Werror -pedantic" "-DCMAKE_CXX_FLAGS=-Wall -Wextra -Werror" \
    >"$scratch/cmake-$linkage.log" 2>&1 || { cat "$scratch/cmake-$linkage.log" >&2; exit 1; }
  cmake --build "$scratch/cmake-$linkage" >>"$scratch/cmake-$linkage.log" 2>&1 ||
    { cat "$scratch/cmake-$linkage.log" >&2; exit 1; }
  run_examples "$scratch/cmake-$linkage" $linkage
done

export PKG_CONFIG_PATH=$libdir/pkgconfig
echo "== pkg-config kvfile, shared library"
mkdir -p "$scratch/pc-shared" "$scratch/pc-static"
c++ -std=c++20 -Wall -Wextra -Werror -O2 "$consumer_src/example.cc" -o "$scratch/pc-shared/example_cpp" \
  $(pkg-config --cflags --libs kvfile) -Wl,-rpath,"$libdir"
cc -std=c99 -Wall -Wextra -Werror -pedantic -O2 "$consumer_src/example.c" -o "$scratch/pc-shared/example_c" \
  $(pkg-config --cflags --libs kvfile) -lm -Wl,-rpath,"$libdir"
run_examples "$scratch/pc-shared" shared

export PKG_CONFIG_PATH=${libdir_of[static]}/pkgconfig
echo "== pkg-config --static kvfile, fully static programs"
c++ -static -std=c++20 -Wall -Wextra -Werror -O2 "$consumer_src/example.cc" -o "$scratch/pc-static/example_cpp" \
  $(pkg-config --static --cflags --libs kvfile)
cc -static -std=c99 -Wall -Wextra -Werror -pedantic -O2 "$consumer_src/example.c" -o "$scratch/pc-static/example_c" \
  $(pkg-config --static --cflags --libs kvfile) -lm
run_examples "$scratch/pc-static" static

echo "== the kvfile command and the resume example from their sources, against the installed package"
cmake -S "$consumer_src/tools" -B "$scratch/tools" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$prefix" "-DCMAKE_CXX_FLAGS=-Wall -Wextra -Werror" >"$scratch/tools.log" 2>&1 ||
  { cat "$scratch/tools.log" >&2; exit 1; }
cmake --build "$scratch/tools" >>"$scratch/tools.log" 2>&1 || { cat "$scratch/tools.log" >&2; exit 1; }
LD_LIBRARY_PATH=$libdir "$scratch/tools/kvfile" synth "$scratch/tools/s.kv" --preset tiny --tokens 100 >/dev/null
LD_LIBRARY_PATH=$libdir "$scratch/tools/kvfile" verify "$scratch/tools/s.kv"
LD_LIBRARY_PATH=$libdir "$scratch/tools/resume_example" "$scratch/tools/r.kv" --prompt-tokens 64 --expect-reuse 0
python=$(sed -n 's/^Python_EXECUTABLE:[A-Z]*=//p' "$build_dir/CMakeCache.txt")
version=$(sed -n 's/^project(kvfile VERSION \([0-9.]*\).*/\1/p' "$KVFILE_ROOT/CMakeLists.txt")
# Imports kvfile with interpreter $1 from the scratch folder and checks that
# it came from under $2, with the project's version, and reads a session.
check_import() {
  (cd "$scratch" && "$1" - "$2" "$version" "$scratch/pc-shared/example_cpp.kv" <<'PY'
import sys
import kvfile
where, version, session = sys.argv[1:]
assert kvfile.__file__.startswith(where), (kvfile.__file__, where)
assert kvfile.__version__ == version, (kvfile.__version__, version)
with kvfile.open(session) as r:
    assert len(r.read_all()) == len(r.geometry["streams"])
print("import kvfile:", kvfile.__version__, "from", kvfile.__file__)
PY
  )
}
echo "== Python package, cmake --install"
site=$(dirname "$(dirname "$(find "$prefix" -path '*/kvfile/__init__.py' | head -1)")")
PYTHONPATH=$site check_import "$python" "$prefix"
echo "== Python package, pip install --no-build-isolation . into a fresh venv"
"$python" -m venv --system-site-packages "$scratch/venv"
# (CMAKE_ARGS, read by setup.py: unoptimized here too, for the same reason.)
(cd "$KVFILE_ROOT" && CMAKE_ARGS="-DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG=-O0" \
   "$scratch/venv/bin/python" -m pip install -q --no-index --no-build-isolation \
   --no-cache-dir . >"$scratch/pip.log" 2>&1) || { cat "$scratch/pip.log" >&2; exit 1; }
check_import "$scratch/venv/bin/python" "$scratch/venv"
echo "install_test: ok (installed to scratch prefixes; CMake package and pkg-config, shared and static; the CLI and the resume example built against the package; Python: cmake --install and pip)"
