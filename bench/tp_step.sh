#!/bin/sh
# bench/tp_step.sh BUILD_DIR [STEPS]: a compute-bound transformer block
# (hidden 1024, sequence 256, batch 8, SGD; bench/tp_block.hpp as the model
# library build/bench/libloom_bench_tp_block.so), tensor parallel 2 with one
# thread per rank, against single device with one thread and with two: cells
# of loom-bench (docs/benchmarks.md), model_parallel at 1 and 2 ranks,
#   OMP_NUM_THREADS=T loom-bench --model-library .../libloom_bench_tp_block.so --batch 8 --optimizer sgd
#       --strategies model_parallel --world-sizes N --steps STEPS --warmup 1 --block 1
# Each line: step_ms (median over STEPS, default 3, after one of warm-up),
# the tensor-parallel group's collectives and bytes per step, and the time
# split (communication: the step's collectives replayed alone; compute the
# rest). Last line: tp2_ms=X single_ms=Y ratio=R (single with one thread).
set -eu
build=$(realpath "${1:-build}")
# shellcheck source=bench/common.sh
. "$(dirname "$0")/common.sh"
build_bench "$build" loom_bench_tp_block
meson compile -C "$build" tools/loom-bench tools/loom-run >&2
steps=${2:-3}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
run() {  # run DEVICES THREADS: the line of one loom-bench run
  OMP_NUM_THREADS=$2 "$build/tools/loom-bench" --model-library "$build/bench/libloom_bench_tp_block.so" \
    --batch 8 --optimizer sgd --strategies model_parallel --world-sizes "$1" --steps "$steps" --warmup 1 \
    --block 1 --replays 3 --out "$work/$1-$2" > /dev/null
  /usr/bin/python3 - "$(dirname "$(realpath "$0")")" "$work/$1-$2/loom-bench.json" "$2" <<'PY'
import sys
sys.path.insert(0, sys.argv[1])
from loom_bench_cells import measured
c = measured(sys.argv[2], "tp_step", ["model_parallel"])["model_parallel"]
step, comm = c["step_ms"]["median"], c["comm_alone_ms"] or 0.0
print(f"tp={c['world_size']} threads={sys.argv[3]} step_ms={step:.1f} collectives={c['collectives_per_step']:.0f} "
      f"bytes={c['payload_bytes_per_step']:.0f} comm_ms={comm:.1f} compute_ms={step - comm:.1f}")
PY
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
