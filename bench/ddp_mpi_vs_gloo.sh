#!/bin/sh
# bench/ddp_mpi_vs_gloo.sh BUILD_DIR [STEPS]: the DDP step of bench/ddp_vs_torch.sh's
# model (MLP 784-256-256-10, batch 64 per rank, SGD, fp32) on 2 ranks under
# mpirun, on loom's MPI process group and on its Gloo group, in alternating
# jobs (ROUNDS, default 4, of each); medians of the step on rank 0 over all
# rounds; also the MPI group without asynchronous completion
# (LOOM_MPI_SYNCHRONOUS=1). Each job is one loom-bench cell (docs/benchmarks.md):
#   mpirun -n 2 loom-bench --widths 784,256,256,10 --optimizer sgd --warmup 50 --steps STEPS/ROUNDS
#                          --strategies ddp+process_group_backend=mpi    (or ddp: Gloo)
# The last line is ddp_mpi_ms=X ddp_gloo_ms=Y ratio=R.
set -eu
build=$(realpath "${1:-build}")
meson compile -C "$build" tools/loom-bench >&2
steps=${2:-200}
rounds=${ROUNDS:-4}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export OMP_NUM_THREADS=1
per=$((steps / rounds))
job() {  # job NAME CELL [mpirun -x options]: one round of one variant, into $work/NAME-ROUND
  name=$1
  cell=$2
  shift 2
  mpirun --allow-run-as-root --oversubscribe -n 2 "$@" "$build/tools/loom-bench" --widths 784,256,256,10 \
    --optimizer sgd --warmup 50 --steps "$per" --strategies "$cell" --out "$work/$name-$round" \
    > "$work/$name-$round.log" 2>&1 || { cat "$work/$name-$round.log" >&2; exit 1; }
}
for round in $(seq 1 "$rounds"); do
  job gloo ddp
  job mpi ddp+process_group_backend=mpi
  # The same without asynchronous completion: each all-reduce runs to its end
  # in the autograd thread that issued it, overlapping nothing.
  job mpi_sync ddp+process_group_backend=mpi -x LOOM_MPI_SYNCHRONOUS=1
done
/usr/bin/python3 - "$(dirname "$(realpath "$0")")" "$work" "$rounds" <<'PY'
import glob, statistics, sys
sys.path.insert(0, sys.argv[1])
from loom_bench_cells import measured
work, rounds = sys.argv[2], int(sys.argv[3])
cell_of = {"gloo": "ddp", "mpi": "ddp+process_group_backend=mpi", "mpi_sync": "ddp+process_group_backend=mpi"}
def steps(name):
    pooled = []
    for path in sorted(glob.glob(f"{work}/{name}-*/loom-bench.json")):
        pooled += measured(path, "ddp_mpi_vs_gloo", [cell_of[name]])[cell_of[name]]["samples"]["step"]
    if len(glob.glob(f"{work}/{name}-*/loom-bench.json")) != rounds:
        sys.exit(f"ddp_mpi_vs_gloo: {name}: not every round ran")
    return pooled
mpi, gloo, sync = steps("mpi"), steps("gloo"), steps("mpi_sync")
m, g, s = statistics.median(mpi), statistics.median(gloo), statistics.median(sync)
print(f"DDP step, 2 ranks, {len(mpi)} and {len(gloo)} steps: MPI group {m:.4f} ms, Gloo group {g:.4f} ms")
print(f"without asynchronous completion: MPI group {s:.4f} ms, ratio to Gloo {s / g:.4f}")
print(f"ddp_mpi_ms={m:.4f} ddp_gloo_ms={g:.4f} ratio={m / g:.4f}")
PY
