#!/bin/sh
# bench/zero_vs_torch.sh BUILD_DIR [STEPS]
# One training step of MLP 784-1024-1024-1024-10 (2,913,290 parameters, each
# Linear a unit), batch 64 per rank, Adam, fp32, 2 ranks, Gloo on loopback,
# OMP_NUM_THREADS=1: loom's ZeRO stages 1, 2, 3 and loom's DDP (interleaved
# in blocks of 10 steps in one job: build/bench/fsdp_step_bench with
# LOOM_BENCH_SET=zero), against PyTorch's ZeroRedundancyOptimizer + DDP and
# DDP + Adam (bench/zero_torch.py, interleaved the same way). The loom and
# PyTorch jobs alternate, ROUNDS (default 4) of each, STEPS/ROUNDS measured
# steps per configuration per job (default STEPS 200); medians over all
# steps of a configuration on rank 0. The last line is
# zero1_ms=X torch_zero1_ms=Y ratio=R.
set -eu
build=$(realpath "${1:-build}")
# shellcheck source=bench/common.sh
. "$(dirname "$0")/common.sh"
build_bench "$build" fsdp_step_bench
steps=${2:-200}
rounds=${ROUNDS:-4}
here=$(dirname "$(realpath "$0")")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export OMP_NUM_THREADS=1
per=$((steps / rounds))

for _ in $(seq 1 "$rounds"); do
  LOOM_BENCH_SET=zero "$build/tools/loom-run" --accelerator cpu --strategy fsdp --devices 2 \
    "$build/bench/fsdp_step_bench" "$per" | grep -v '^config=compute' >> "$work/out.txt"
  port=$(/usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  for rank in 1 0; do
    RANK=$rank WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
      /usr/bin/python3 "$here/zero_torch.py" "$per" >> "$work/torch_$rank.txt" 2>&1 &
  done
  wait
done
grep '^config=' "$work/torch_0.txt" >> "$work/out.txt"

median() {  # median CONFIG
  grep "^config=$1 " "$work/out.txt" | grep -o " step_ms=[0-9.]*" | cut -d= -f2 | sort -n |
    awk '{ v[NR] = $1 } END { if (NR % 2) print v[(NR + 1) / 2]; else printf "%.4f\n", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}
count() { grep -c "^config=$1 " "$work/out.txt"; }
echo "medians of step_ms on rank 0 of 2 ($rounds alternating rounds of loom and PyTorch):"
for config in zero1 zero2 zero3 ddp torch_zero1 torch_ddp_adam; do
  printf '%-16s %10s ms  (%s steps)\n' "$config" "$(median $config)" "$(count $config)"
done
ratio() { awk -v a="$(median "$1")" -v b="$(median "$2")" -v t="$3" 'BEGIN { printf "%s = %.4f\n", t, a / b }'; }
ratio zero1 ddp "loom zero1 / loom ddp+adam (goal <= 1.05)"
ratio zero2 ddp "loom zero2 / loom ddp+adam (goal <= 1.05)"
ratio zero3 ddp "loom zero3 / loom ddp+adam"
ratio ddp torch_ddp_adam "loom ddp+adam / torch ddp+adam"
awk -v a="$(median zero1)" -v b="$(median torch_zero1)" \
  'BEGIN { printf "zero1_ms=%.4f torch_zero1_ms=%.4f ratio=%.4f\n", a, b, a / b }'
