#!/bin/sh
# compile_time.sh [REPEATS]
# Wall time of compiling (g++ -O2 -c, loom's flags) one TU each:
#   torch_h:      #include <torch/torch.h>
#   loom_hpp:     #include <loom/loom.hpp>
#   loom_minimal: examples/minimal.cpp (a whole training program)
#   raw_user:     bench/compile/raw_user.cpp (torch.h + the same training step, no loom)
#   make_fabric:  bench/compile/make_fabric_user.cpp (torch.h + a training step through make_fabric)
#   static_ddp:   bench/compile/static_ddp_user.cpp (the same with Fabric<cpu, ddp, bf16_mixed>)
# Prints the median of REPEATS (default 3) runs per TU.
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
repeats=${1:-3}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
printf '#include <torch/torch.h>\nint main() { return 0; }\n' > "$work/torch_h.cpp"
printf '#include <loom/loom.hpp>\nint main() { return 0; }\n' > "$work/loom_hpp.cpp"
cp "$root/examples/minimal.cpp" "$work/loom_minimal.cpp"
cp "$root/bench/compile/raw_user.cpp" "$work/raw_user.cpp"
cp "$root/bench/compile/make_fabric_user.cpp" "$work/make_fabric.cpp"
cp "$root/bench/compile/static_ddp_user.cpp" "$work/static_ddp.cpp"
flags="-std=c++20 -O2 -D_GLIBCXX_USE_CXX11_ABI=1 -DUSE_C10D_GLOO -isystem /usr/include/torch/csrc/api/include -I$root/include"
for tu in ${TUS:-torch_h loom_hpp loom_minimal raw_user make_fabric static_ddp}; do
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
  eval "median_$tu=$median"
done
if [ -n "${median_torch_h:-}" ] && [ -n "${median_make_fabric:-}" ]; then
  awk -v a="$median_make_fabric" -v b="$median_torch_h" 'BEGIN { printf "make_fabric / torch_h = %.3f (goal <= 1.05)\n", a / b }'
fi
if [ -n "${median_raw_user:-}" ] && [ -n "${median_make_fabric:-}" ]; then
  awk -v a="$median_make_fabric" -v b="$median_raw_user" 'BEGIN { printf "make_fabric / raw_user = %.3f (what loom adds to the same program)\n", a / b }'
fi
