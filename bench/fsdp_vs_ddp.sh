#!/bin/sh
# bench/fsdp_vs_ddp.sh BUILD_DIR [STEPS]
# One training step of MLP 784-1024-1024-1024-10 (2,913,290 parameters, each
# Linear a unit), batch 64 per rank, Adam, fp32, 2 ranks, Gloo on loopback,
# OMP_NUM_THREADS=1, started by loom-run: FSDP FULL_SHARD (prefetch on, the
# default, and off), SHARD_GRAD_OP, and loom's DDP (pairwise exchange on),
# interleaved in blocks of 10 steps (build/bench/fsdp_step_bench). Medians
# over STEPS measured steps of each (default 200) on rank 0. The breakdown
# says where the time goes: forward (with zero_grad), backward, optimizer,
# and exposed communication = the step minus the same step computed on one
# process with no collective (compute). The last line is
# fsdp_ms=X ddp_ms=Y ratio=R for FULL_SHARD with prefetch on.
set -eu
build=$(realpath "${1:-build}")
# shellcheck source=bench/common.sh
. "$(dirname "$0")/common.sh"
build_bench "$build" fsdp_step_bench
steps=${2:-200}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export OMP_NUM_THREADS=1

"$build/tools/loom-run" --accelerator cpu --strategy fsdp --devices 2 "$build/bench/fsdp_step_bench" "$steps" > "$work/out.txt"

median() {  # median CONFIG KEY
  grep "^config=$1 " "$work/out.txt" | grep -o " $2=[0-9.]*" | cut -d= -f2 | sort -n |
    awk '{ v[NR] = $1 } END { if (NR % 2) print v[(NR + 1) / 2]; else printf "%.4f\n", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}
echo "medians over $steps steps each (ms), rank 0 of 2:"
printf '%-24s %10s %10s %10s %10s %10s\n' config step forward backward optimizer exposed_comm
compute=$(median compute step_ms)
for config in full_shard full_shard_no_prefetch shard_grad_op ddp compute; do
  step=$(median "$config" step_ms)
  exposed=$(awk -v s="$step" -v c="$compute" 'BEGIN { printf "%.4f", s - c }')
  printf '%-24s %10s %10s %10s %10s %10s\n' "$config" "$step" "$(median "$config" forward_ms)" \
    "$(median "$config" backward_ms)" "$(median "$config" optimizer_ms)" "$exposed"
done
echo "(compute: the same step on one process without collectives, its optimizer over the whole model;"
echo " exposed_comm = step - compute)"
ddp=$(median ddp step_ms)
for config in full_shard_no_prefetch shard_grad_op; do
  awk -v f="$(median "$config" step_ms)" -v d="$ddp" -v c="$config" 'BEGIN { printf "%s / ddp = %.4f\n", c, f / d }'
done
awk -v f="$(median full_shard step_ms)" -v d="$ddp" 'BEGIN { printf "fsdp_ms=%.4f ddp_ms=%.4f ratio=%.4f\n", f, d, f / d }'
