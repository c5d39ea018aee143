#!/bin/sh
# loom's MPI process group (src/comm/mpi_backend.cpp) under mpirun on 2 and
# 4 ranks: tests/dist/mpi_collectives.cpp, loom's collectives (dist_worker),
# DDP/FSDP laws, Fabrics on a split communicator, kill -9 (mpi_ddp).
# `mpi.sh --skip REASON` prints why the test cannot run (a build without
# MPI) and exits 77, Meson's SKIP: a build without MPI never reports OK.
set -eu
if [ "${1:-}" = "--skip" ]; then
  echo "SKIP: ${2:-no MPI}"
  exit 77
fi
program=$(realpath "$1")
laws=$(realpath "$2")
collectives=$(realpath "$3")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failed=0
# mpi_job RANKS EXPECTED COUNT WHAT -- PROGRAM ARGS...: runs PROGRAM under
# mpirun (as root in a container mpirun needs the flag, and --oversubscribe
# lets 4 ranks share 2 cores; MASTER_ADDR is unreachable TEST-NET-1, since the
# MPI group meets through MPI, not a store) and passes when it exits 0 with
# COUNT lines EXPECTED in its output.
job=0
mpi_job() {
  n=$1 expected=$2 count=$3 what=$4
  shift 5
  job=$((job + 1))
  out="$work/job_$job"
  status=0
  timeout 120 mpirun --allow-run-as-root --oversubscribe -x LOOM_TEST_BACKEND=mpi -x MASTER_ADDR=192.0.2.1 \
    -x MASTER_PORT=9 -n "$n" "$@" > "$out" 2>&1 || status=$?
  if [ "$(grep -c "$expected" "$out")" -eq "$count" ] && [ "$status" -eq 0 ]; then
    echo "ok: $what"
    sed -n 's/^law (mpi)/  law (mpi)/p' "$out"
  else
    echo "FAIL: $what (exit $status):"
    sed 's/^/    /' "$out" | head -n 40
    failed=1
  fi
}
# All-reduces through MPI's own calls (large ones in pieces) instead of
# loom's shared memory; and OpenMPI's shared-memory transport without
# cross-memory attach (the fallback docs/launching.md gives for containers
# that block it), where only a sender's progress moves a large message.
mpi_job 2 "mpi collectives: world_size=2 all checks passed" 1 \
  "MPI process group on 2 ranks with LOOM_MPI_SHARED_MEMORY=0 (all-reduces through MPI)" \
  -- -x LOOM_MPI_SHARED_MEMORY=0 "$program"
mpi_job 2 "mpi collectives: world_size=2 all checks passed" 1 \
  "MPI process group on 2 ranks with btl_vader_single_copy_mechanism none" \
  -- --mca btl_vader_single_copy_mechanism none "$program"
for n in 2 4; do
  mpi_job "$n" "mpi collectives: world_size=$n all checks passed" 1 \
    "MPI process group on $n ranks (every collective, dtypes, reductions, in flight, point to point, a split communicator)" \
    -- "$program"
  # loom's collectives (dist_worker's suite, the checks of tests/dist/collectives.sh) on the MPI group.
  mpi_job "$n" "collectives: world_size=$n all checks passed" 1 \
    "loom's collectives (all_reduce, gathers, broadcast_object, reduce_scatter, ...) on the MPI group, $n ranks" \
    -- "$collectives" collectives
  # DDP and FSDP on the MPI group equal single_device.
  for strategy in ddp fsdp; do
    mpi_job "$n" "mpi laws: world_size=$n all checks passed" 1 "$strategy on the MPI group, $n ranks, equals single_device" \
      -- "$laws" "$strategy"
  done
done
# A Fabric on the application's communicator: two halves of a 4-rank job
# (split by parity) train independently, each equal to single_device.
mpi_job 4 "mpi laws: world_size=2 all checks passed" 2 \
  "two Fabrics on the halves of a split MPI_COMM_WORLD (4 ranks) train independently, each equal to single_device" \
  -- "$laws" split
# kill -9 of one rank while the others train on the MPI group: mpirun ends
# the whole job (MPI's behaviour: its runtime sees the process die and
# aborts the rest), with a non-zero status, within the bound.
mpirun --allow-run-as-root --oversubscribe -n 2 "$laws" forever > "$work/forever" 2>&1 &
job=$!
for _ in $(seq 1 200); do
  if [ "$(grep -c ' training$' "$work/forever")" -eq 2 ]; then break; fi
  sleep 0.05
done
victim=$(sed -n 's/^rank 1 pid \([0-9]*\) training$/\1/p' "$work/forever")
start=$(date +%s%N)
if [ -n "$victim" ]; then kill -9 "$victim"; fi
bound=30
for _ in $(seq 1 $((bound * 20))); do
  kill -0 "$job" 2>/dev/null || break
  sleep 0.05
done
kill -9 "$job" 2>/dev/null || true
status=0
wait "$job" || status=$?
elapsed=$(( ($(date +%s%N) - start) / 1000000 ))
left=$(pgrep -f "$laws forever" | tr '\n' ' ' || true)
if [ -n "$victim" ] && [ "$status" -ne 0 ] && [ "$elapsed" -lt $((bound * 1000)) ] && [ -z "$left" ]; then
  echo "ok: kill -9 of rank 1 on the MPI group ends the job in $elapsed ms (mpirun exit $status), no process left"
else
  echo "FAIL: kill -9 of rank 1 (victim '$victim', exit $status after $elapsed ms, left: '$left'):"
  sed 's/^/    /' "$work/forever" | head -n 20
  pkill -9 -f "$laws forever" 2>/dev/null || true
  failed=1
fi
exit $failed
