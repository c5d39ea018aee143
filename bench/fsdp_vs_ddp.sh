#!/bin/sh
# bench/fsdp_vs_ddp.sh BUILD_DIR [STEPS]
# One training step of MLP 784-1024-1024-1024-10 (2,913,290 parameters, each
# Linear a unit), batch 64 per rank, Adam, fp32, 2 ranks, Gloo on loopback,
# OMP_NUM_THREADS=1: FSDP FULL_SHARD (prefetch on, the default, and off),
# SHARD_GRAD_OP, and loom's DDP (pairwise exchange on), interleaved in blocks
# of 10 steps -- cells of loom-bench (docs/benchmarks.md):
#   loom-bench --world-sizes 2 --strategies raw,fsdp,fsdp+forward_prefetch=false+backward_prefetch=false,
#              fsdp+sharding_strategy=SHARD_GRAD_OP,ddp --steps STEPS
# Medians over STEPS measured steps of each (default 200) on rank 0. The
# breakdown says where the time goes: forward (with zero_grad), backward,
# optimizer, and exposed communication = the step minus the same step
# computed on one process with no collective (compute: loom-bench's raw
# cell, the raw LibTorch loop, its optimizer over the whole model). The last
# line is fsdp_ms=X ddp_ms=Y ratio=R for FULL_SHARD with prefetch on.
set -eu
build=$(realpath "${1:-build}")
steps=${2:-200}
meson compile -C "$build" tools/loom-bench tools/loom-run >&2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export OMP_NUM_THREADS=1
"$build/tools/loom-bench" --world-sizes 2 --steps "$steps" --out "$work" \
  --strategies raw,fsdp,fsdp+forward_prefetch=false+backward_prefetch=false,fsdp+sharding_strategy=SHARD_GRAD_OP,ddp \
  > "$work/table.txt"
/usr/bin/python3 - "$(dirname "$(realpath "$0")")" "$work/loom-bench.json" "$steps" <<'PY'
import sys
sys.path.insert(0, sys.argv[1])
from loom_bench_cells import measured
names = [("full_shard", "fsdp"), ("full_shard_no_prefetch", "fsdp+forward_prefetch=false+backward_prefetch=false"),
         ("shard_grad_op", "fsdp+sharding_strategy=SHARD_GRAD_OP"), ("ddp", "ddp"), ("compute", "raw")]
cells = measured(sys.argv[2], "fsdp_vs_ddp", [cell for _, cell in names], world_size=2)
step = {config: cells[cell]["step_ms"]["median"] for config, cell in names}
print(f"medians over {sys.argv[3]} steps each (ms), rank 0 of 2:")
print(f"{'config':<24} {'step':>10} {'forward':>10} {'backward':>10} {'optimizer':>10} {'exposed_comm':>10}")
for config, cell in names:
    c = cells[cell]
    print(f"{config:<24} {step[config]:10.4f} {c['forward_ms']:10.4f} {c['backward_ms']:10.4f} "
          f"{c['optimizer_ms']:10.4f} {step[config] - step['compute']:10.4f}")
print("(compute: the same step on one process without collectives, its optimizer over the whole model;")
print(" exposed_comm = step - compute)")
for config in ("full_shard_no_prefetch", "shard_grad_op"):
    print(f"{config} / ddp = {step[config] / step['ddp']:.4f}")
print(f"fsdp_ms={step['full_shard']:.4f} ddp_ms={step['ddp']:.4f} ratio={step['full_shard'] / step['ddp']:.4f}")
PY
