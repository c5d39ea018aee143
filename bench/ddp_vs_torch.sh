#!/bin/sh
# bench/ddp_vs_torch.sh BUILD_DIR [ROUNDS] [STEPS]
# One DDP training step of MLP 784-256-256-10 (batch 64 per rank, SGD, fp32,
# 2 ranks, Gloo on loopback, OMP_NUM_THREADS=1, DDP's default buckets), loom
# against PyTorch's DistributedDataParallel (Debian's python3-torch,
# tools/bench/torch_peer.py, ranks started with
# RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT): cells of loom-bench
# (docs/benchmarks.md),
#   loom-bench --world-sizes 2 --widths 784,256,256,10 --optimizer sgd --rounds ROUNDS --steps STEPS
#              --warmup 50 --strategies raw,ddp,torch_ddp
# The two alternate, ROUNDS times each (default 3), STEPS measured steps per
# round after 50 of warm-up (default 200); the medians are over every
# measured step of rank 0, timed from zero_grad through step on both sides.
# The breakdown lines say where the time goes; the last line is
# loom_ms=X torch_ms=Y ratio=R.
set -eu
build=$(realpath "${1:-build}")
rounds=${2:-3}
steps=${3:-200}
meson compile -C "$build" tools/loom-bench tools/loom-run >&2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export OMP_NUM_THREADS=1
"$build/tools/loom-bench" --world-sizes 2 --widths 784,256,256,10 --optimizer sgd --rounds "$rounds" \
  --steps "$steps" --warmup 50 --strategies raw,ddp,torch_ddp --out "$work" > "$work/table.txt"
/usr/bin/python3 - "$(dirname "$(realpath "$0")")" "$work/loom-bench.json" "$rounds" "$steps" <<'PY'
import sys
sys.path.insert(0, sys.argv[1])
from loom_bench_cells import measured
cells = measured(sys.argv[2], "ddp_vs_torch", ["raw", "ddp", "torch_ddp"], world_size=2)
loom, torch, raw = cells["ddp"], cells["torch_ddp"], cells["raw"]
print(f"medians over {sys.argv[3]} x {sys.argv[4]} steps each (ms), rank 0:")
print(f"{'':<20} {'loom':>10} {'torch':>10}")
print(f"{'step_ms':<20} {loom['step_ms']['median']:10.4f} {torch['step_ms']['median']:10.4f}")
for key in ("forward_ms", "backward_ms", "optimizer_ms", "off_cpu_ms"):
    print(f"{key:<20} {loom[key]:10.4f} {torch[key]:10.4f}")
print(f"{'nosync_backward_ms':<20} {raw['backward_ms']:10.4f} {'-':>10}")
print(f"{'allreduce_ms':<20} {loom['comm_alone_ms']:10.4f} {'-':>10}")
print("(forward_ms includes zero_grad; backward_ms includes the wait for the last bucket's all-reduce;")
print(" off_cpu_ms is the step's time off the CPU, waiting on a collective or a core; nosync_backward_ms is")
print(" backward without communication (the raw loop's); allreduce_ms is the step's bucket all-reduces replayed")
print(" alone)")
print(f"loom_ms={loom['step_ms']['median']:.4f} torch_ms={torch['step_ms']['median']:.4f} "
      f"ratio={loom['step_ms']['median'] / torch['step_ms']['median']:.4f}")
PY
