#!/bin/sh
# cmake.sh BUILD_DIR SOURCE_DIR: the consumer built by CMake with
# find_package(loom) and loom::loom against a DESTDIR install, and run.
set -eu
. "$(dirname "$0")/install_prefix.sh"
cp "$source/tests/consumers/CMakeLists.txt" "$work/"
cmake -S "$work" -B "$work/build" -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_BUILD_TYPE=Release >"$work/cmake.log" 2>&1 ||
  { cat "$work/cmake.log" >&2; exit 1; }
cmake --build "$work/build" >"$work/build.log" 2>&1 || { cat "$work/build.log" >&2; exit 1; }
check_no_tree "$(find "$work/build" -name 'consumer.cpp.o.d' | head -n 1)"
run_consumer "$work/build/consumer"
