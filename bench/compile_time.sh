#!/bin/sh
# compile_time.sh [REPEATS] (needs /usr/bin/time: Debian package time)
# Time of compiling (g++ -O2 -c, loom's flags) one TU each:
#   torch_h:      #include <torch/torch.h>
#   loom_hpp:     #include <loom/loom.hpp>
#   loom_minimal: examples/minimal.cpp (a whole training program)
#   raw_user:     bench/compile/raw_user.cpp (torch.h + the same training step, no loom)
#   make_fabric:  bench/compile/make_fabric_user.cpp (torch.h + a training step through make_fabric)
#   make_fabric_narrow: the same program with the narrow headers it uses instead of torch.h
#   static_ddp:   bench/compile/static_ddp_user.cpp (the same with Fabric<cpu, ddp, bf16_mixed>)
# Prints the median of REPEATS (default 3) runs per TU: CPU seconds (user +
# system) of the compiler, which a loaded machine disturbs less than wall time,
# and the wall time; then the ratios of the medians (loom_hpp / torch_h: what
# the umbrella header costs against LibTorch's own).
# With BASELINE=/path/to/another/loom/checkout, loom_hpp and loom_minimal are
# also compiled against that checkout's headers (base_loom_hpp,
# base_loom_minimal), interleaved in the same rounds, and the ratios printed:
#   git worktree add /tmp/loom-base <commit> && BASELINE=/tmp/loom-base TUS="loom_hpp loom_minimal" bench/compile_time.sh 5
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
# The same program with the narrow LibTorch headers it uses instead of torch.h.
sed 's|#include <torch/torch.h>|#include <torch/nn/functional/activation.h>\
#include <torch/nn/functional/loss.h>\
#include <torch/nn/modules/linear.h>\
#include <torch/optim/sgd.h>|' "$root/bench/compile/make_fabric_user.cpp" > "$work/make_fabric_narrow.cpp"
cp "$root/bench/compile/static_ddp_user.cpp" "$work/static_ddp.cpp"
if [ -n "${BASELINE:-}" ]; then
  cp "$work/loom_hpp.cpp" "$work/base_loom_hpp.cpp"
  cp "$BASELINE/examples/minimal.cpp" "$work/base_loom_minimal.cpp"
fi
flags="-std=c++20 -O2 -D_GLIBCXX_USE_CXX11_ABI=1 -DUSE_C10D_GLOO -isystem /usr/include/torch/csrc/api/include -I$root/include"
median_of() { sort -n | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }  # of the numbers on stdin
# Interleaved: round r compiles every TU once, so a slow phase of the machine
# touches all of them alike.
tus=${TUS:-torch_h loom_hpp loom_minimal raw_user make_fabric make_fabric_narrow static_ddp}
if [ -n "${BASELINE:-}" ]; then tus="$tus base_loom_hpp base_loom_minimal"; fi
i=0
while [ "$i" -lt "$repeats" ]; do
  for tu in $tus; do
    case $tu in
      base_*) tu_flags=$(printf '%s' "$flags" | sed "s|-I$root/include|-I$BASELINE/include|") ;;
      *) tu_flags=$flags ;;
    esac
    /usr/bin/time -f "%U %S %e" -o "$work/$tu.time" g++ $tu_flags -c "$work/$tu.cpp" -o "$work/$tu.o"
    awk '{ printf "%.2f %.2f\n", $1 + $2, $3 }' "$work/$tu.time" >> "$work/$tu.times"
  done
  i=$((i + 1))
done
for tu in $tus; do
  cpu=$(cut -d' ' -f1 "$work/$tu.times" | median_of)
  wall=$(cut -d' ' -f2 "$work/$tu.times" | median_of)
  printf '%-19s median %.1f s CPU, %.1f s wall over %d runs (CPU: %s)\n' "$tu" "$cpu" "$wall" "$repeats" \
    "$(cut -d' ' -f1 "$work/$tu.times" | tr '\n' ' ')"
  eval "median_$tu=$cpu"
done
if [ -n "${median_torch_h:-}" ] && [ -n "${median_loom_hpp:-}" ]; then
  awk -v a="$median_loom_hpp" -v b="$median_torch_h" 'BEGIN { printf "loom_hpp / torch_h = %.3f (goal <= 0.6)\n", a / b }'
fi
if [ -n "${median_torch_h:-}" ] && [ -n "${median_make_fabric:-}" ]; then
  awk -v a="$median_make_fabric" -v b="$median_torch_h" 'BEGIN { printf "make_fabric / torch_h = %.3f (goal <= 1.05)\n", a / b }'
fi
if [ -n "${median_torch_h:-}" ] && [ -n "${median_make_fabric_narrow:-}" ]; then
  awk -v a="$median_make_fabric_narrow" -v b="$median_torch_h" 'BEGIN { printf "make_fabric_narrow / torch_h = %.3f\n", a / b }'
fi
if [ -n "${median_raw_user:-}" ] && [ -n "${median_make_fabric:-}" ]; then
  awk -v a="$median_make_fabric" -v b="$median_raw_user" 'BEGIN { printf "make_fabric / raw_user = %.3f (what loom adds to the same program)\n", a / b }'
fi
for tu in loom_hpp loom_minimal; do
  eval "new=\${median_$tu:-}; base=\${median_base_$tu:-}"
  if [ -n "$new" ] && [ -n "$base" ]; then
    awk -v a="$new" -v b="$base" -v t="$tu" 'BEGIN { printf "%s / baseline = %.3f\n", t, a / b }'
  fi
done
