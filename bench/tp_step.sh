#!/bin/sh
# bench/tp_step.sh BUILD_DIR [STEPS]: a compute-bound transformer block
# (hidden 1024, sequence 256, batch 8; bench/tp_step_bench.cpp), tensor
# parallel 2 with one thread per rank, against single device with one thread
# and with two. Each line: step_ms (median over STEPS, default 3, after one
# of warm-up), the tensor-parallel group's collectives and bytes per step,
# and the time split (communication measured alone, compute the rest).
# Last line: tp2_ms=X single_ms=Y ratio=R (single with one thread).
set -eu
build=$(realpath "${1:-build}")
# shellcheck source=bench/common.sh
. "$(dirname "$0")/common.sh"
build_bench "$build" tp_step_bench
steps=${2:-3}
run() {  # run DEVICES THREADS
  OMP_NUM_THREADS=$2 "$build/tools/loom-run" --accelerator cpu --devices "$1" "$build/bench/tp_step_bench" "$steps"
}
single=$(run 1 1)
single2=$(run 1 2)
tp2=$(run 2 1)
echo "single device, 1 thread:  $single"
echo "single device, 2 threads: $single2"
echo "tensor parallel 2, 1 thread per rank: $tp2"
value() { echo "$2" | sed -n "s/.*$1=\([0-9.]*\).*/\1/p"; }
awk -v t="$(value step_ms "$tp2")" -v s2="$(value step_ms "$single2")" \
  'BEGIN { printf "tp2 / single with 2 threads = %.4f\n", t / s2 }'
awk -v t="$(value step_ms "$tp2")" -v s="$(value step_ms "$single")" \
  'BEGIN { printf "tp2_ms=%.1f single_ms=%.1f ratio=%.4f\n", t, s, t / s }'
