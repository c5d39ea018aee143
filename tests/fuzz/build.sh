#!/bin/sh
# tests/fuzz/build.sh BUILD OUT [fuzz|coverage]
# Builds one libFuzzer binary per target of tests/fuzz/targets.hpp, OUT/fuzz_<target>.
# What is compiled with clang (Debian's clang 14, libFuzzer from
# libclang-rt-14-dev): the parser TUs (loom's checkpoint readers, its
# outside-file and outside-JSON readers, the DeepSpeed config and IDX
# readers) and the targets, with -DLOOM_FUZZING (every CRC32 accepted, so
# mutated bytes reach the parsers behind the check). The rest of loom comes
# from BUILD's libloom.so (g++): the executable's clang-built copies of the
# parser functions take precedence over libloom's at load time. LibTorch's
# zip reader and unpickler are not instrumented: what the fuzzers steer by
# is loom's own code.
#   fuzz:     -fsanitize=address,undefined (UB aborts), coverage feedback.
#   coverage: -fprofile-instr-generate -fcoverage-mapping, no sanitizers, for
#             tests/fuzz/coverage.sh (llvm-cov's line coverage of the corpus).
set -eu
root=$(cd "$(dirname "$0")/../.." && pwd)
build=$(cd "$1" && pwd)
out=$2
mode=${3:-fuzz}
case $mode in
  fuzz) flags="-O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=undefined"
        instrument="-fsanitize=fuzzer-no-link" ;;
  coverage) flags="-O1 -g -fprofile-instr-generate -fcoverage-mapping"
            instrument="" ;;
  *) echo "build.sh: mode is fuzz or coverage, not $mode" >&2; exit 2 ;;
esac
[ -f "$build/src/libloom.so" ] || { echo "build.sh: $build/src/libloom.so is missing: build BUILD first" >&2; exit 1; }

sources="src/checkpoint/python_pickle.cpp src/checkpoint/torch_archive.cpp src/checkpoint/block_crc.cpp src/checkpoint/tensor_records.cpp
src/checkpoint/unpickled_value.cpp src/checkpoint/io.cpp src/checkpoint/local_parts.cpp src/checkpoint/manifest.cpp src/checkpoint/sharded.cpp
src/checkpoint/deepspeed_layout.cpp src/checkpoint/state.cpp src/checkpoint/optimizer_state.cpp
src/util/outside_files.cpp src/util/outside_json.cpp src/strategy/zero_config.cpp src/data/idx.cpp
tests/fuzz/targets.cpp"
targets="pickle archive load sharded_index sharded_rank deepspeed_index local_parts zero_config idx"
# -include ATen/core/ivalue.h: LibTorch 1.13's headers reached through
# <ATen/ATen.h> first meet std::vector<c10::IValue> while IValue is only
# declared, and clang 14 in C++20 mode instantiates vector's constexpr
# members there (an error; g++ defers them). IValue complete first, it compiles.
common="-std=c++20 -include ATen/core/ivalue.h -I$root/src -I$root/include -I$root/src/torch_stand_in -isystem /usr/include/torch/csrc/api/include
-D_GLIBCXX_USE_CXX11_ABI=1 -DUSE_C10D_GLOO -DLOOM_FUZZING"

mkdir -p "$out/obj-$mode"
# compile SOURCE: its object, unless one newer than the source is there.
compile() {
  object="$out/obj-$mode/$(echo "$1" | tr / _).o"
  if [ -n "$(find "$object" -newer "$root/$1" 2> /dev/null)" ]; then return; fi
  rm -f "$object"
  clang++ $common $flags $instrument -c "$root/$1" -o "$object" || echo "build.sh: $1 did not compile" >&2
}
running=0
for source in $sources; do
  compile "$source" &
  running=$((running + 1))
  if [ "$running" -ge "$(nproc)" ]; then
    wait
    running=0
  fi
done
wait
for source in $sources; do
  [ -f "$out/obj-$mode/$(echo "$source" | tr / _).o" ] || exit 1
done
for target in $targets; do
  clang++ $common $flags -fsanitize=fuzzer -DLOOM_FUZZ_TARGET="$target" "$root/tests/fuzz/libfuzzer_entry.cpp" \
    "$out/obj-$mode"/*.o -L"$build/src" -lloom -Wl,-rpath,"$build/src" -ltorch -ltorch_cpu -lc10 -lz \
    -o "$out/${mode}_$target"
done
echo "build.sh: $(echo "$targets" | wc -w) $mode binaries in $out ($(echo "$sources" | wc -w) sources compiled with clang)"
