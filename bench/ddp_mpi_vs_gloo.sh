#!/bin/sh
# bench/ddp_mpi_vs_gloo.sh BUILD_DIR [STEPS]: the DDP step of bench/ddp_vs_torch.sh's
# model (build/bench/ddp_step_bench: MLP 784-256-256-10, batch 64 per rank,
# SGD, fp32) on 2 ranks under mpirun, on loom's MPI process group and on its
# Gloo group, in alternating jobs (ROUNDS, default 4, of each); medians of
# step_ms on rank 0; also the MPI group without asynchronous completion
# (LOOM_MPI_SYNCHRONOUS=1). The last line is ddp_mpi_ms=X ddp_gloo_ms=Y ratio=R.
set -eu
build=$(realpath "${1:-build}")
# shellcheck source=bench/common.sh
. "$(dirname "$0")/common.sh"
build_bench "$build" ddp_step_bench
steps=${2:-200}
rounds=${ROUNDS:-4}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export OMP_NUM_THREADS=1
per=$((steps / rounds))
for _ in $(seq 1 "$rounds"); do
  mpirun --allow-run-as-root --oversubscribe -n 2 "$build/bench/ddp_step_bench" "$per" 2>/dev/null |
    grep '^step_ms=' | head -n "$per" >> "$work/gloo"
  mpirun --allow-run-as-root --oversubscribe -n 2 -x LOOM_BENCH_BACKEND=mpi "$build/bench/ddp_step_bench" "$per" 2>/dev/null |
    grep '^step_ms=' | head -n "$per" >> "$work/mpi"
  # The same without asynchronous completion: each all-reduce runs to its end
  # in the autograd thread that issued it, overlapping nothing.
  mpirun --allow-run-as-root --oversubscribe -n 2 -x LOOM_BENCH_BACKEND=mpi -x LOOM_MPI_SYNCHRONOUS=1 \
    "$build/bench/ddp_step_bench" "$per" 2>/dev/null | grep '^step_ms=' | head -n "$per" >> "$work/mpi_sync"
done
median() { grep -o 'step_ms=[0-9.]*' "$1" | cut -d= -f2 | sort -n |
  awk '{ v[NR] = $1 } END { if (NR % 2) print v[(NR + 1) / 2]; else printf "%.4f\n", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
m=$(median "$work/mpi")
g=$(median "$work/gloo")
s=$(median "$work/mpi_sync")
echo "DDP step, 2 ranks, $(grep -c step_ms "$work/mpi") and $(grep -c step_ms "$work/gloo") steps: MPI group $m ms, Gloo group $g ms"
awk -v a="$s" -v b="$g" 'BEGIN { printf "without asynchronous completion: MPI group %.4f ms, ratio to Gloo %.4f\n", a, a / b }'
awk -v a="$m" -v b="$g" 'BEGIN { printf "ddp_mpi_ms=%.4f ddp_gloo_ms=%.4f ratio=%.4f\n", a, b, a / b }'
