#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Installs kvfile into scratch prefixes and builds the API examples of
# docs/api.md (tests/consumer/example.cc and example.c) against the
# installed tree only, as a project outside this repository would, four
# ways: CMake's find_package(kvfile) with the shared and with the static
# library, and pkg-config with the shared library and with --static (a
# fully static program). Each program writes a session, reads it back and
# checks every value; the installed `kvfile verify` then checks the file it
# wrote. The installed libraries must hold no test hook
# (tests/test_hooks_absent_test.sh), and every installed header must
# compile on its own. The archive built without object storage and without
# the foreign formats (-DKVFILE_WITH_FORMATS=OFF) holds nothing of zlib or
# nlohmann-json, and its converters answer KVFILE_UNSUPPORTED
# (tests/consumer/no_formats.c). Then the kvfile command line and the resume example are built from
# their sources against the installed shared library (tests/consumer/tools:
# public headers only) and run.
# Then the Python package: imported from the installed prefix, and
# installed with `pip install --no-build-isolation .` (offline) into a fresh
# virtual environment and imported from there, outside the tree.
# The blocks of docs/api.md marked <!-- docs-test: install_test --> (the
# readme_examples test leaves them to this script) run as they are written,
# with the scratch prefix for /opt/kvfile and a program of their own for
# engine.cc (example.cc): the install lines make the static prefix, the
# find_package lines and both pkg-config lines build programs against it
# (the first pkg-config line against the shared one too), and the pip line
# makes the virtual environment.
#
#   scripts/install_test.sh [BUILD_DIR]
#
# BUILD_DIR (default: build) is configured and built as scripts/test.sh does
# (the dev preset: libkvfile.so), so after test.sh nothing is compiled again
# there; BUILD_DIR-static is the documented default build (libkvfile.a, no
# preset), without the command and the Python module. Exits non-zero at the
# first failure.
set -euo pipefail
KVFILE_ROOT=$(cd "$(dirname "$0")/.." && pwd)
build_dir=${1:-$KVFILE_ROOT/build}
source "$KVFILE_ROOT/scripts/deps.sh"
kvfile_build "$build_dir" --preset=dev kvfile kvfile_cli kvfile_docs kvfile_python

scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
consumer_src=$KVFILE_ROOT/tests/consumer
# docs/api.md's marked blocks, one file each, in order: 1 the install lines,
# 2 the find_package lines, 3 the pkg-config lines, 4 the pip line.
doc_blocks=$scratch/doc-blocks
mkdir -p "$doc_blocks"
awk -v dir="$doc_blocks" '
  /^<!-- docs-test: install_test -->$/ { marked = 1; next }
  marked && /^```/ { if (inside) { marked = 0; inside = 0 } else { inside = 1; n++ }; next }
  inside { print > (dir "/" n) }' "$KVFILE_ROOT/docs/api.md"
if [ "$(ls "$doc_blocks" | tr '\n' ' ')" != "1 2 3 4 " ] || ! grep -q 'cmake --install' "$doc_blocks/1" ||
   ! grep -q find_package "$doc_blocks/2" || ! grep -q pkg-config "$doc_blocks/3" || ! grep -q pip "$doc_blocks/4"; then
  echo "install_test: docs/api.md must mark its install, find_package, pkg-config and pip blocks, in that order" >&2
  exit 1
fi
# One prefix per library kind: the shared one (with the kvfile command that
# checks every session below) and the static one.
declare -A prefix_of libdir_of
prefix_of[shared]=$scratch/prefix-shared
prefix_of[static]=$scratch/prefix-static
# The static prefix: docs/api.md's install lines as written (a plain
# configure: no preset, the default libkvfile.a), with BUILD_DIR-static for
# build and the scratch prefix for /opt/kvfile. Only the library: the
# command that checks the sessions comes from the shared build, and -O0:
# what is checked here is the package, not the code (the tests ran on the
# optimized build), and it compiles in a third of the time.
sed -e "s# build\$# $build_dir-static#; s# build # $build_dir-static #g; s#/opt/kvfile#${prefix_of[static]}#g" \
    -e '1s#$# -DKVFILE_BUILD_TOOLS=OFF -DKVFILE_BUILD_PYTHON=OFF -DCMAKE_CXX_FLAGS_RELEASE=-O0 -DCMAKE_C_FLAGS_RELEASE=-O0#' \
    "$doc_blocks/1" >"$scratch/install-static.sh"
rm -rf "$build_dir-static"  # nothing cached from an earlier configure: the defaults
(cd "$KVFILE_ROOT" && bash -e "$scratch/install-static.sh") >"$scratch/install-static.log" 2>&1 ||
  { cat "$scratch/install-static.sh" "$scratch/install-static.log" >&2; exit 1; }
cmake --install "$build_dir" --prefix "${prefix_of[shared]}" >"$scratch/install-shared.log"
for linkage in shared static; do
  pc_file=$(find "${prefix_of[$linkage]}" -name kvfile.pc)
  libdir_of[$linkage]=$(dirname "$(dirname "$pc_file")")
done
# A fully static program cannot link libcurl's own dependencies (Debian
# ships nghttp2, ssh2, ldap, ... as shared libraries only): the fully static
# programs link a second archive, built without object storage
# (-DKVFILE_WITH_S3=OFF, docs/api.md). The same archive is the build
# without the foreign formats (-DKVFILE_WITH_FORMATS=OFF): no zlib, no
# nlohmann-json (checked below). Reconfiguring BUILD_DIR-static compiles
# only the few files the two options change.
prefix_of[fullstatic]=$scratch/prefix-static-minimal
{ cmake -S "$KVFILE_ROOT" -B "$build_dir-static" -DKVFILE_WITH_S3=OFF -DKVFILE_WITH_FORMATS=OFF &&
  cmake --build "$build_dir-static" -j "$(nproc)" &&
  cmake --install "$build_dir-static" --prefix "${prefix_of[fullstatic]}"; } >"$scratch/install-static-minimal.log" 2>&1 ||
  { cat "$scratch/install-static-minimal.log" >&2; exit 1; }
if grep -E '^Requires' "$(find "${prefix_of[fullstatic]}" -name kvfile.pc)" | grep -Eq 'libcurl|zlib'; then
  echo "install_test: -DKVFILE_WITH_S3=OFF -DKVFILE_WITH_FORMATS=OFF still asks for libcurl or zlib" >&2
  exit 1
fi
pc_file=$(find "${prefix_of[fullstatic]}" -name kvfile.pc)
libdir_of[fullstatic]=$(dirname "$(dirname "$pc_file")")
prefix=${prefix_of[shared]}
libdir=${libdir_of[shared]}
if [ -e "${libdir_of[static]}/libkvfile.so" ] || [ ! -e "${libdir_of[static]}/libkvfile.a" ] ||
   [ -e "$libdir/libkvfile.a" ] || [ ! -e "$libdir/libkvfile.so" ]; then
  echo "install_test: each prefix must hold one kind of library (BUILD_SHARED_LIBS):" >&2
  ls "$libdir" "${libdir_of[static]}" >&2
  exit 1
fi

echo "== the installed libraries: no test hooks; every public header compiles on its own"
libraries=("$libdir/libkvfile.so" "${libdir_of[static]}/libkvfile.a" "${libdir_of[fullstatic]}/libkvfile.a")
"$KVFILE_ROOT/tests/test_hooks_absent_test.sh" "${libraries[@]}"
# writer.h takes RowBlock and AppendBatch from row_block.h: each installed
# header must bring what it uses.
[ -f "$prefix/include/kvfile/row_block.h" ] || { echo "install_test: kvfile/row_block.h not installed" >&2; exit 1; }
[ -f "$prefix/include/kvfile/formats/safetensors.h" ] ||
  { echo "install_test: kvfile/formats/safetensors.h not installed" >&2; exit 1; }
for header in "$prefix"/include/kvfile/*.h "$prefix"/include/kvfile/formats/*.h; do
  name=${header#"$prefix/include/"}
  printf '#include "%s"\n' "$name" |
    c++ -std=c++20 -Wall -Wextra -Werror -fsyntax-only -I"$prefix/include" -x c++ - ||
    { echo "install_test: $name does not compile on its own" >&2; exit 1; }
done

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

export PKG_CONFIG_PATH=${libdir_of[fullstatic]}/pkgconfig
echo "== pkg-config --static kvfile, fully static programs"
c++ -static -std=c++20 -Wall -Wextra -Werror -O2 "$consumer_src/example.cc" -o "$scratch/pc-static/example_cpp" \
  $(pkg-config --static --cflags --libs kvfile)
cc -static -std=c99 -Wall -Wextra -Werror -pedantic -O2 "$consumer_src/example.c" -o "$scratch/pc-static/example_c" \
  $(pkg-config --static --cflags --libs kvfile) -lm
run_examples "$scratch/pc-static" static

# The archive without the foreign formats (docs/design.md, "Packaging"):
# nothing of zlib or nlohmann-json in it, no kvfile/formats/ headers, and a
# program linked against it (libc and the rest dynamically) needs no libz;
# its converters answer KVFILE_UNSUPPORTED and leave no output.
echo "== -DKVFILE_WITH_FORMATS=OFF: no zlib, no nlohmann-json; the converters refuse"
# (nm's output to files first: grep -q ending a pipe early fails it under pipefail.)
minimal_lib=${libdir_of[fullstatic]}/libkvfile.a
nm -C "$minimal_lib" >"$scratch/minimal.nm" 2>/dev/null
nm -C "${libdir_of[static]}/libkvfile.a" >"$scratch/default.nm" 2>/dev/null
if grep -Eq ' U (crc32|crc32_z)$|nlohmann' "$scratch/minimal.nm" || [ -e "${prefix_of[fullstatic]}/include/kvfile/formats" ]; then
  echo "install_test: $minimal_lib: zlib or nlohmann-json, or kvfile/formats/ installed, without the formats" >&2
  exit 1
fi
grep -q ' U crc32$' "$scratch/default.nm" && grep -q nlohmann "$scratch/default.nm" ||
  { echo "install_test: the default archive has no crc32 import or no nlohmann symbol: the check above proves nothing" >&2
    exit 1; }
mkdir -p "$scratch/no-formats"
cc -std=c99 -Wall -Wextra -Werror -pedantic "$consumer_src/no_formats.c" -o "$scratch/no-formats/no_formats" \
  $(pkg-config --cflags --libs kvfile) -lm
deps=$(ldd "$scratch/no-formats/no_formats")
if [[ $deps == *libz.* ]]; then
  echo "install_test: a program linked without the formats needs libz:" >&2
  echo "$deps" >&2
  exit 1
fi
out=$scratch/no-formats/out
in_before=$(cksum <"$scratch/pc-static/example_c.kv")
got=$("$scratch/no-formats/no_formats" "$scratch/pc-static/example_c.kv" "$out.safetensors" "$out.coli_kv")
want="unsupported: $out.safetensors: this build does not write safetensors files
unsupported: kvfile_coli_export: built without KVFILE_WITH_FORMATS
unsupported: $out.safetensors: this build does not read safetensors files"
if [ "$got" != "$want" ] || [ -e "$out.safetensors" ] || [ -e "$out.coli_kv" ] ||
   [ "$(cksum <"$scratch/pc-static/example_c.kv")" != "$in_before" ]; then
  printf 'install_test: without the formats, got:\n%s\nwant:\n%s\n' "$got" "$want" >&2
  ls "$scratch/no-formats" >&2
  exit 1
fi

# docs/api.md's own lines: find_package(kvfile) in a project of one program
# (engine.cc: example.cc) against the default (static) install, then each
# pkg-config line run as written in a directory holding engine.cc, and the
# a.out it makes run: both against the static install, the first against
# the shared one too.
echo "== docs/api.md: the find_package lines and the pkg-config lines, as written"
mkdir -p "$scratch/doc-cmake"
cp "$consumer_src/example.cc" "$scratch/doc-cmake/engine.cc"
{ printf 'cmake_minimum_required(VERSION 3.25)\nproject(engine LANGUAGES CXX)\nadd_executable(engine engine.cc)\n'
  cat "$doc_blocks/2"; } >"$scratch/doc-cmake/CMakeLists.txt"
{ cmake -S "$scratch/doc-cmake" -B "$scratch/doc-cmake/b" -G Ninja -DCMAKE_PREFIX_PATH="${prefix_of[static]}" &&
  cmake --build "$scratch/doc-cmake/b"; } >"$scratch/doc-cmake.log" 2>&1 || { cat "$scratch/doc-cmake.log" >&2; exit 1; }
"$scratch/doc-cmake/b/engine" "$scratch/doc-cmake/engine.kv"
"$prefix/bin/kvfile" verify "$scratch/doc-cmake/engine.kv"
line_number=0
while IFS= read -r line; do
  line_number=$((line_number + 1))
  for linkage in static shared; do
    [ "$linkage" = shared ] && [ $line_number -gt 1 ] && continue  # -static needs the archive
    dir=$scratch/doc-pc-$linkage-$line_number
    mkdir -p "$dir"
    cp "$consumer_src/example.cc" "$dir/engine.cc"
    p=$linkage
    [ "$linkage" = static ] && [ $line_number -gt 1 ] && p=fullstatic  # the -static line
    command=$(printf '%s\n' "$line" | sed -e "s#/opt/kvfile/lib#${libdir_of[$p]}#g" \
                                            -e "s#/opt/kvfile#${prefix_of[$p]}#g")
    echo "\$ $command"
    (cd "$dir" && PKG_CONFIG_PATH=${libdir_of[$p]}/pkgconfig bash -ec "$command")
    "$dir/a.out" "$dir/engine.kv"
    "$prefix/bin/kvfile" verify "$dir/engine.kv"
  done
done <"$doc_blocks/3"

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
echo "== Python package, docs/api.md's pip line (pip install --no-build-isolation . into a fresh venv)"
# As written, with the interpreter the module was built for and the venv
# in the scratch directory; offline (nothing to fetch: --system-site-packages
# has numpy). CMAKE_ARGS, read by setup.py: unoptimized here too, for the
# same reason as above.
sed -e "s#^python3 #$python #; s#packages venv #packages $scratch/venv #; s# venv/bin/pip # $scratch/venv/bin/pip #" \
  "$doc_blocks/4" >"$scratch/pip.sh"
(cd "$KVFILE_ROOT" && CMAKE_ARGS="-DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG=-O0" PIP_NO_INDEX=1 \
   PIP_NO_CACHE_DIR=1 bash -e "$scratch/pip.sh" >"$scratch/pip.log" 2>&1) ||
  { cat "$scratch/pip.sh" "$scratch/pip.log" >&2; exit 1; }
check_import "$scratch/venv/bin/python" "$scratch/venv"
echo "install_test: ok (installed to scratch prefixes; CMake package and pkg-config, shared and static; docs/api.md's install, find_package, pkg-config and pip lines as written; the CLI and the resume example built against the package; Python: cmake --install and pip)"
