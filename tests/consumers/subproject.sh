#!/bin/sh
# subproject.sh SOURCE_DIR: the consumer and README.md's program
# (examples/minimal.cpp) built by Meson with loom as a subproject
# (dependency('loom'), provided by loom's override_dependency), with loom's
# tests, examples and benchmarks off, and run.
# LibTorch is a Python torch package, found the way README.md's GPU section
# says (-Dlibtorch_dir from `import torch`, through /usr/bin/python3): here
# Debian's python3-torch, whose torch/ holds include/ and lib/ (links into
# /usr) and no share/cmake; so this also proves loom reads that layout.
set -eu
source=$(cd "$1" && pwd)
torch_dir=$(/usr/bin/python3 -c 'import torch, os; print(os.path.dirname(torch.__file__))' 2>/dev/null) || {
  echo "SKIP: /usr/bin/python3 cannot import torch (python3-torch); the subproject build uses its torch/ folder"
  exit 77
}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cp "$source/tests/consumers/consumer.cpp" "$source/examples/minimal.cpp" "$work/"
cp "$source/tests/consumers/meson.build.in" "$work/meson.build"
mkdir "$work/subprojects"
ln -s "$source" "$work/subprojects/loom"
# What this proves is how loom is found, configured and linked, not how fast
# it runs: so -O0 (NDEBUG kept, as in a release build), and libloom's sources
# as one TU (a unity build), which also proves they share no clashing names,
# without the precompiled prelude (one TU pays for its headers once either
# way; the prelude only made it wait). On a 2-core AMD EPYC VM the test took
# 230 s at -O2 without unity, 190 s at -O0; its compile, 111 s (209 s of
# CPU) as three unity TUs over the prelude, 99 s (152 s of CPU) as one
# without it, beside the consumer's and README program's TUs.
meson setup "$work/build" "$work" --wrap-mode=forcefallback -Dloom:libtorch_dir="$torch_dir" \
  -Dloom:tests=false -Dloom:examples=false -Dloom:benchmarks=false \
  -Doptimization=0 -Db_ndebug=true -Db_pch=false -Dloom:libloom_unity_size=1000 >"$work/setup.log" 2>&1 ||
  { cat "$work/setup.log" >&2; exit 1; }
grep -q "LibTorch *: *$torch_dir" "$work/setup.log" ||
  { echo "the subproject did not configure against $torch_dir:" >&2; cat "$work/setup.log" >&2; exit 1; }
meson compile -C "$work/build" consumer readme_program >"$work/compile.log" 2>&1 ||
  { tail -n 40 "$work/compile.log" >&2; exit 1; }
"$work/build/consumer"
# README.md's program trains one epoch and saves linear.ckpt where it runs.
(cd "$work" && ./build/readme_program)
[ -s "$work/linear.ckpt" ] || { echo "README.md's program ran but wrote no linear.ckpt" >&2; exit 1; }
echo "subproject: the consumer and README.md's program built against $torch_dir, and ran"
