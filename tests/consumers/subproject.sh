#!/bin/sh
# subproject.sh SOURCE_DIR: the consumer built by Meson with loom as a
# subproject (dependency('loom'), provided by loom's override_dependency),
# with loom's tests, examples and benchmarks off, and run.
set -eu
source=$(cd "$1" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cp "$source/tests/consumers/consumer.cpp" "$work/"
cp "$source/tests/consumers/meson.build.in" "$work/meson.build"
mkdir "$work/subprojects"
ln -s "$source" "$work/subprojects/loom"
meson setup "$work/build" "$work" --wrap-mode=forcefallback \
  -Dloom:tests=false -Dloom:examples=false -Dloom:benchmarks=false >"$work/setup.log" 2>&1 ||
  { cat "$work/setup.log" >&2; exit 1; }
meson compile -C "$work/build" consumer >"$work/compile.log" 2>&1 || { tail -n 40 "$work/compile.log" >&2; exit 1; }
"$work/build/consumer"
