#!/bin/sh
# bench/allreduce.sh BUILD_DIR [ROUNDS]: loom's all_reduce against raw c10d's
# allreduce on the Gloo group under it (the same sockets, threads and buffer;
# loom's watchdog recorder is what loom adds), 2 ranks on loopback, float32,
# 1 KiB to 64 MiB: loom-bench's collective microbenchmarks
# (docs/benchmarks.md),
#   loom-bench --fit-network FILE --world-sizes 2 --fit-kinds all_reduce --fit-raw-baseline
#              --fit-sizes 1024,...,67108864 --fit-rounds ROUNDS --fit-calls 1
# (ROUNDS rounds, default 200, of one call each after a barrier, loom's and
# c10d's side by side in each round, their order alternating; medians: Gloo's
# latency on 2 shared cores has a long tail that a mean of calls back to back
# takes in). Then, when this loom has MPI, loom's MPI process group against
# its Gloo group at 1, 16 and 64 MiB under mpirun, in 4 alternating jobs of
# each (ROUNDS/4 rounds per job; the median of the jobs' medians):
#   mpirun -n 2 loom-bench --fit-network FILE --fit-backend mpi|gloo --fit-kinds all_reduce ...
# The last line is mpi_vs_gloo_1MiB=R mpi_vs_gloo_16MiB=S mpi_vs_gloo_64MiB=T
# (without MPI: loom_vs_c10d_1MiB=R loom_vs_c10d_16MiB=S loom_vs_c10d_64MiB=T).
set -eu
build=$(realpath "${1:-build}")
rounds=${2:-200}
jobs=4
meson compile -C "$build" tools/loom-bench tools/loom-run >&2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export OMP_NUM_THREADS=1
sizes=1024,4096,16384,65536,262144,1048576,4194304,16777216,67108864
"$build/tools/loom-bench" --fit-network "$work/c10d.json" --world-sizes 2 --fit-kinds all_reduce \
  --fit-raw-baseline --fit-sizes "$sizes" --fit-rounds "$rounds" --fit-calls 1 > /dev/null
mpi=no
if command -v mpirun > /dev/null; then
  for job in $(seq 1 "$jobs"); do
    for backend in mpi gloo; do
      if ! mpirun --allow-run-as-root --oversubscribe -n 2 "$build/tools/loom-bench" \
        --fit-network "$work/$backend-$job.json" --fit-backend "$backend" --fit-kinds all_reduce \
        --fit-sizes 1048576,16777216,67108864 --fit-rounds $((rounds / jobs + 1)) --fit-calls 1 \
        > "$work/$backend.log" 2>&1; then
        if grep -q "built without MPI" "$work/$backend.log"; then break 2; fi
        cat "$work/$backend.log" >&2
        exit 1
      fi
    done
  done
  [ -f "$work/gloo-$jobs.json" ] && mpi=yes
fi
/usr/bin/python3 - "$work" "$rounds" "$jobs" "$mpi" <<'PY'
import glob, json, statistics, sys
work, rounds, jobs, mpi = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "yes"
def times(path):
    return {(s["collective"], s["payload_bytes"]): s["seconds"] for s in json.load(open(path))["samples"]}
def label(size):
    return f"{size // 2**20}MiB" if size >= 2**20 else f"{size // 1024}KiB"
c10d = times(f"{work}/c10d.json")
print(f"all_reduce, 2 ranks, Gloo on loopback, float32: loom's against c10d's on the same Gloo group, median over "
      f"{rounds} rounds of one call after a barrier")
print(f"{'size':<7} {'loom_us':>10} {'c10d_us':>10} {'loom/c10d':>10}")
ratio = {}
for (kind, size), seconds in sorted(c10d.items(), key=lambda item: item[0][1]):
    if kind != "all_reduce":
        continue
    raw = c10d[("c10d_allreduce", size)]
    ratio[label(int(size))] = seconds / raw
    print(f"{label(int(size)):<7} {seconds * 1e6:10.1f} {raw * 1e6:10.1f} {seconds / raw:10.3f}")
if not mpi:
    print("(no MPI half: mpirun is missing or this loom was built without MPI)")
    print(" ".join(f"loom_vs_c10d_{size}={ratio[size]:.3f}" for size in ("1MiB", "16MiB", "64MiB")))
    sys.exit(0)
pooled = {backend: {} for backend in ("mpi", "gloo")}
for backend in pooled:
    for path in sorted(glob.glob(f"{work}/{backend}-*.json")):
        for (kind, size), seconds in times(path).items():
            pooled[backend].setdefault(size, []).append(seconds)
print()
print(f"all_reduce through loom, 2 ranks under mpirun, float32: loom's MPI group against its Gloo group, "
      f"{jobs} alternating jobs of each, the median of the jobs' medians")
print(f"{'size':<7} {'mpi_us':>10} {'gloo_us':>10} {'mpi/gloo':>10}")
mpi_ratio = {}
for size in sorted(pooled["mpi"]):
    m, g = statistics.median(pooled["mpi"][size]), statistics.median(pooled["gloo"][size])
    mpi_ratio[label(int(size))] = m / g
    print(f"{label(int(size)):<7} {m * 1e6:10.1f} {g * 1e6:10.1f} {m / g:10.3f}")
print(" ".join(f"mpi_vs_gloo_{size}={mpi_ratio[size]:.3f}" for size in ("1MiB", "16MiB", "64MiB")))
PY
