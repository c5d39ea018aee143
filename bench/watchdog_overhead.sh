#!/bin/sh
# bench/watchdog_overhead.sh BUILD_DIR [ROUNDS] [STEPS]
# The collective watchdog's cost on bench/ddp_vs_torch.sh's DDP step (MLP
# 784-256-256-10, batch 64 per rank, SGD, 2 ranks, Gloo on loopback,
# OMP_NUM_THREADS=1): build/bench/ddp_step_bench under loom-run with the
# watchdog off (LOOM_COLLECTIVE_TIMEOUT=0), on at its default (300 s: the
# thread looks every 5 s), and on at 3 s (it looks, and publishes its
# record, every 375 ms). The three alternate, ROUNDS times each (default 5),
# STEPS measured steps per round (default 300). Medians over every measured
# step of rank 0; the spread is the range of the per-round medians of the
# "off" runs over their median (the bench's own round-to-round noise). Last
# line: off_ms=X on_ms=Y on3s_ms=Z on_vs_off=R on3s_vs_off=S spread_off=P.
set -eu
build=$(realpath "${1:-build}")
# shellcheck source=bench/common.sh
. "$(dirname "$0")/common.sh"
build_bench "$build" ddp_step_bench
rounds=${2:-5}
steps=${3:-300}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export OMP_NUM_THREADS=1

run() {  # run MODE ROUND TIMEOUT
  LOOM_COLLECTIVE_TIMEOUT=$3 "$build/tools/loom-run" --accelerator cpu --strategy ddp --devices 2 \
    "$build/bench/ddp_step_bench" "$steps" > "$work/$1.$2"
  cat "$work/$1.$2" >> "$work/$1.all"
}

median_of() {  # median_of FILE: the median of its step_ms values
  grep -o "^step_ms=[0-9.]*" "$1" | cut -d= -f2 | sort -n |
    awk '{ v[NR] = $1 } END { if (NR % 2) print v[(NR + 1) / 2]; else printf "%.4f\n", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}

for round in $(seq 1 "$rounds"); do
  run off "$round" 0
  run on "$round" 300
  run on3s "$round" 3
done

for mode in off on on3s; do
  printf '%-5s per-round medians (ms):' "$mode"
  for round in $(seq 1 "$rounds"); do printf ' %s' "$(median_of "$work/$mode.$round")"; done
  echo
done
off=$(median_of "$work/off.all")
on=$(median_of "$work/on.all")
on3s=$(median_of "$work/on3s.all")
spread=$(for round in $(seq 1 "$rounds"); do median_of "$work/off.$round"; done | sort -n |
  awk -v m="$off" 'NR == 1 { lo = $1 } { hi = $1 } END { printf "%.4f", (hi - lo) / m }')
awk -v a="$off" -v b="$on" -v c="$on3s" -v s="$spread" \
  'BEGIN { printf "off_ms=%.4f on_ms=%.4f on3s_ms=%.4f on_vs_off=%.4f on3s_vs_off=%.4f spread_off=%s\n", a, b, c, b / a, c / a, s }'
