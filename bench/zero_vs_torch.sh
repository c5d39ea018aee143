#!/bin/sh
# bench/zero_vs_torch.sh BUILD_DIR [STEPS]
# One training step of MLP 784-1024-1024-1024-10 (2,913,290 parameters, each
# Linear a unit), batch 64 per rank, Adam, fp32, 2 ranks, Gloo on loopback,
# OMP_NUM_THREADS=1: loom's ZeRO stages 1, 2, 3 and loom's DDP (interleaved
# in blocks of 10 steps in one job), against PyTorch's ZeroRedundancyOptimizer
# + DDP and DDP + Adam (tools/bench/torch_peer.py, interleaved the same way):
# cells of loom-bench (docs/benchmarks.md),
#   loom-bench --world-sizes 2 --rounds ROUNDS --steps STEPS/ROUNDS
#              --strategies deepspeed_stage_1,deepspeed_stage_2,deepspeed_stage_3,ddp,torch_zero1,torch_ddp
# The loom and PyTorch jobs alternate, ROUNDS (default 4) of each, STEPS/ROUNDS
# measured steps per configuration per job (default STEPS 200); medians over
# all steps of a configuration on rank 0; denormals flushed on both sides.
# The last line is zero1_ms=X torch_zero1_ms=Y ratio=R.
set -eu
build=$(realpath "${1:-build}")
steps=${2:-200}
rounds=${ROUNDS:-4}
meson compile -C "$build" tools/loom-bench tools/loom-run >&2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export OMP_NUM_THREADS=1
"$build/tools/loom-bench" --world-sizes 2 --rounds "$rounds" --steps $((steps / rounds)) --out "$work" \
  --strategies deepspeed_stage_1,deepspeed_stage_2,deepspeed_stage_3,ddp,torch_zero1,torch_ddp > "$work/table.txt"
/usr/bin/python3 - "$(dirname "$(realpath "$0")")" "$work/loom-bench.json" "$rounds" <<'PY'
import sys
sys.path.insert(0, sys.argv[1])
from loom_bench_cells import measured
names = [("zero1", "deepspeed_stage_1"), ("zero2", "deepspeed_stage_2"), ("zero3", "deepspeed_stage_3"),
         ("ddp", "ddp"), ("torch_zero1", "torch_zero1"), ("torch_ddp_adam", "torch_ddp")]
cells = measured(sys.argv[2], "zero_vs_torch", [cell for _, cell in names], world_size=2)
step = {config: cells[cell]["step_ms"]["median"] for config, cell in names}
print(f"medians of step_ms on rank 0 of 2 ({sys.argv[3]} alternating rounds of loom and PyTorch):")
for config, cell in names:
    print(f"{config:<16} {step[config]:10.4f} ms  ({cells[cell]['steps']} steps)")
for a, b, text in (("zero1", "ddp", "loom zero1 / loom ddp+adam (goal <= 1.05)"),
                   ("zero2", "ddp", "loom zero2 / loom ddp+adam (goal <= 1.05)"),
                   ("zero3", "ddp", "loom zero3 / loom ddp+adam"),
                   ("ddp", "torch_ddp_adam", "loom ddp+adam / torch ddp+adam")):
    print(f"{text} = {step[a] / step[b]:.4f}")
print(f"zero1_ms={step['zero1']:.4f} torch_zero1_ms={step['torch_zero1']:.4f} "
      f"ratio={step['zero1'] / step['torch_zero1']:.4f}")
PY
