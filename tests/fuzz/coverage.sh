#!/bin/sh
# tests/fuzz/coverage.sh BUILD OUT [CORPUS_DIR...]
# Line coverage of loom's readers by the fuzz corpus: builds the targets for
# coverage (tests/fuzz/build.sh BUILD OUT coverage: clang's
# -fprofile-instr-generate), runs every input of tests/fuzz/corpus/<target>/
# (and of CORPUS_DIR/corpus-<target>/ when given, e.g. a campaign's OUT) once
# through its target, and prints llvm-cov's report for the readers the
# fuzzing issue names, with the lines each leaves unrun in OUT/uncovered-*.txt.
set -eu
root=$(cd "$(dirname "$0")/../.." && pwd)
build=$1
out=$2
shift 2
sh "$root/tests/fuzz/build.sh" "$build" "$out" coverage
targets="pickle archive load sharded_index sharded_rank deepspeed_index local_parts zero_config idx"
rm -rf "$out/profiles"
mkdir -p "$out/profiles"
objects=""
for target in $targets; do
  inputs="$root/tests/fuzz/corpus/$target"
  for extra in "$@"; do
    if [ -d "$extra/corpus-$target" ]; then inputs="$inputs $extra/corpus-$target"; fi
  done
  # -runs=0: each input of the directories once, no mutation.
  LLVM_PROFILE_FILE="$out/profiles/$target-%p.profraw" "$out/coverage_$target" -runs=0 $inputs \
    > "$out/coverage-$target.log" 2>&1 || { tail -n 20 "$out/coverage-$target.log"; exit 1; }
  if [ -z "$objects" ]; then objects="$out/coverage_$target"; else objects="$objects -object=$out/coverage_$target"; fi
done
llvm-profdata merge -sparse "$out"/profiles/*.profraw -o "$out/corpus.profdata"
files="src/checkpoint/python_pickle.cpp src/checkpoint/torch_archive.cpp src/checkpoint/block_crc.cpp src/checkpoint/tensor_records.cpp
src/checkpoint/unpickled_value.cpp src/checkpoint/manifest.cpp src/checkpoint/sharded.cpp
src/checkpoint/deepspeed_layout.cpp src/strategy/zero_config.cpp src/data/idx.cpp src/util/outside_files.cpp
src/util/outside_json.cpp"
paths=""
for file in $files; do paths="$paths $root/$file"; done
llvm-cov report $objects -instr-profile="$out/corpus.profdata" $paths | sed "s|$root/||"
for file in $files; do
  llvm-cov show $objects -instr-profile="$out/corpus.profdata" -show-line-counts "$root/$file" |
    awk -F'|' '$2 ~ /^ *0$/ { print $1 ": " $3 }' > "$out/uncovered-$(basename "$file").txt"
done
echo "coverage.sh: lines no input runs: $out/uncovered-*.txt"
