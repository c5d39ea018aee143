#!/bin/sh
# bench/benchmarks_doc.sh BUILD_DIR: docs/benchmarks.md's measured part, from
# one run of loom-bench on this machine: the one-rank overhead
# (--one-rank-overhead), the default matrix at 1 and 2 ranks with the
# PyTorch peers, the network model fitted in the run, its validation and
# its projection (--network fit --project), and the plot
# (docs/loom-bench.svg, loom-plot --bench).
# Everything above the file's marker line stays as written; everything
# below it is replaced. The machine, OS, compiler and LibTorch are named.
# The last line is loom-bench's own: worst_one_rank_ratio=R strategy=NAME.
set -eu
build=$(realpath "${1:-build}")
root=$(cd "$(dirname "$0")/.." && pwd)
doc="$root/docs/benchmarks.md"
marker='<!-- bench/benchmarks_doc.sh writes the rest of this file: edit above this line. -->'
grep -qxF "$marker" "$doc" || { echo "$doc has no marker line: $marker" >&2; exit 1; }
meson compile -C "$build" tools/loom-bench tools/loom-plot tools/loom-run >&2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
"$build/tools/loom-bench" --one-rank-overhead --out one > one.txt 2> one.err ||
  { cat one.err >&2; exit 1; }
"$build/tools/loom-bench" --world-sizes 1,2 --network fit --project "$root/tools/bench/networks/infiniband-200g.json" \
  --out matrix > matrix.txt 2> matrix.err ||
  { cat matrix.err >&2; exit 1; }
"$build/tools/loom-plot" --bench matrix/loom-bench.csv -o "$root/docs/loom-bench.svg" \
  --title "loom-bench: the default matrix at 1 and 2 ranks" 2>&1 >&2

cpu=$(lscpu | sed -n 's/^Model name: *//p' | head -n 1)
os=$(. /etc/os-release && echo "$PRETTY_NAME")
compiler=$(c++ --version | head -n 1)
# LibTorch's version, from the headers the build compiles against (Debian's by default).
version_h=/usr/include/torch/csrc/api/include/torch/version.h
torch=$(awk '/^#define TORCH_VERSION_(MAJOR|MINOR|PATCH) / { v = v (v == "" ? "" : ".") $3 } END { print v }' \
  "$version_h" 2>/dev/null || true)
{
  awk -v marker="$marker" '{ print } $0 == marker { exit }' "$doc"
  echo
  echo "Run on $(date -u +%Y-%m-%d): $cpu, $(nproc) CPUs; $os; $compiler; LibTorch ${torch:-of the build}."
  echo
  echo "### One rank"
  echo
  echo '`loom-bench --one-rank-overhead`:'
  echo
  grep '^|' one.txt
  echo
  echo "Last line: \`$(tail -n 1 one.txt)\`"
  echo
  echo "### The default matrix at 1 and 2 ranks"
  echo
  echo '`loom-bench --world-sizes 1,2 --network fit --project tools/bench/networks/infiniband-200g.json`'
  echo '(its output from its first line, without the files it names):'
  echo
  grep -v '^written: ' matrix.txt
  echo
  echo '![the matrix: step split, payload and state per rank](loom-bench.svg)'
} > "$work/benchmarks.md"
mv "$work/benchmarks.md" "$doc"
echo "written: $doc and $root/docs/loom-bench.svg"
tail -n 1 one.txt
