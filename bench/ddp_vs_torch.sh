#!/bin/sh
# bench/ddp_vs_torch.sh BUILD_DIR [ROUNDS] [STEPS]
# One DDP training step of MLP 784-256-256-10 (batch 64 per rank, SGD, fp32,
# 2 ranks, Gloo on loopback, OMP_NUM_THREADS=1, DDP's default buckets), loom
# (build/bench/ddp_step_bench under build/tools/loom-run) against PyTorch's
# DistributedDataParallel (Debian's python3-torch, bench/ddp_torch.py, ranks
# started with RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT). The two alternate,
# ROUNDS times each (default 3), STEPS measured steps per round after 50 of
# warm-up (default 200); the medians are over every measured step of rank 0,
# timed from zero_grad through step on both sides. The breakdown lines say
# where the time goes; the last line is loom_ms=X torch_ms=Y ratio=R.
set -eu
build=$(realpath "${1:-build}")
# shellcheck source=bench/common.sh
. "$(dirname "$0")/common.sh"
build_bench "$build" ddp_step_bench
rounds=${2:-3}
steps=${3:-200}
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export OMP_NUM_THREADS=1

free_port() { /usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

round=1
while [ "$round" -le "$rounds" ]; do
  "$build/tools/loom-run" --accelerator cpu --strategy ddp --devices 2 "$build/bench/ddp_step_bench" "$steps" >> "$work/loom.txt"
  port=$(free_port)
  RANK=1 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port /usr/bin/python3 "$here/ddp_torch.py" "$steps" > /dev/null &
  other=$!
  RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port /usr/bin/python3 "$here/ddp_torch.py" "$steps" >> "$work/torch.txt"
  wait $other
  round=$((round + 1))
done

median() {  # median KEY FILE
  grep -o "$1=[0-9.]*" "$2" | cut -d= -f2 | sort -n | awk '{ v[NR] = $1 } END { if (NR % 2) print v[(NR + 1) / 2]; else printf "%.4f\n", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}
echo "medians over $rounds x $steps steps each (ms), rank 0:"
printf '%-20s %10s %10s\n' "" loom torch
for key in step_ms forward_ms backward_ms optimizer_ms nosync_backward_ms allreduce_ms; do
  printf '%-20s %10s %10s\n' "$key" "$(median "$key" "$work/loom.txt")" "$(median "$key" "$work/torch.txt")"
done
echo "(forward_ms includes zero_grad; backward_ms includes the wait for the last bucket's all-reduce;"
echo " nosync_backward_ms is backward without communication; allreduce_ms is the whole gradient as one all-reduce)"
loom=$(median step_ms "$work/loom.txt")
torch=$(median step_ms "$work/torch.txt")
awk -v l="$loom" -v t="$torch" 'BEGIN { printf "loom_ms=%.4f torch_ms=%.4f ratio=%.4f\n", l, t, l / t }'
