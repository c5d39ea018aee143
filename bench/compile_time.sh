#!/bin/sh
# compile_time.sh [REPEATS]
# Wall time of compiling (g++ -O2 -c, loom's flags) one TU each:
#   torch_h:      #include <torch/torch.h>
#   loom_hpp:     #include <loom/loom.hpp>
#   loom_minimal: examples/minimal.cpp (a whole training program)
# Prints the median of REPEATS (default 3) runs per TU.
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
repeats=${1:-3}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
printf '#include <torch/torch.h>\nint main() { return 0; }\n' > "$work/torch_h.cpp"
printf '#include <loom/loom.hpp>\nint main() { return 0; }\n' > "$work/loom_hpp.cpp"
cp "$root/examples/minimal.cpp" "$work/loom_minimal.cpp"
flags="-std=c++20 -O2 -D_GLIBCXX_USE_CXX11_ABI=1 -DUSE_C10D_GLOO -isystem /usr/include/torch/csrc/api/include -I$root/include"
for tu in torch_h loom_hpp loom_minimal; do
  times=""
  i=0
  while [ "$i" -lt "$repeats" ]; do
    start=$(date +%s.%N)
    g++ $flags -c "$work/$tu.cpp" -o "$work/$tu.o"
    end=$(date +%s.%N)
    times="$times $(awk -v a="$start" -v b="$end" 'BEGIN { printf "%.2f", b - a }')"
    i=$((i + 1))
  done
  median=$(printf '%s\n' $times | sort -n | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }')
  printf '%-13s median %.1f s over %d runs (%s )\n' "$tu" "$median" "$repeats" "$times"
done
