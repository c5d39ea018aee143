#!/bin/sh
# loom's MPI process group (src/comm/mpi_backend.cpp) under mpirun on 2 and
# 4 ranks: tests/dist/mpi_collectives.cpp, loom's collectives (dist_worker),
# DDP/FSDP laws, Fabrics on a split communicator, kill -9 (mpi_ddp).
# `mpi.sh --skip REASON` prints why
# the test does not run (a build without MPI) and passes.
set -u
if [ "${1:-}" = "--skip" ]; then
  echo "skipped: ${2:-no MPI}"
  exit 0
fi
program=$(realpath "$1")
laws=$(realpath "$2")
collectives=$(realpath "$3")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failed=0
# As root in a container: mpirun refuses root without the flag, and
# --oversubscribe lets 4 ranks share 2 cores.
for n in 2 4; do
  timeout 120 mpirun --allow-run-as-root --oversubscribe -n "$n" "$program" > "$work/out_$n" 2>&1
  status=$?
  if grep -q "mpi collectives: world_size=$n all checks passed" "$work/out_$n" && [ "$status" -eq 0 ]; then
    echo "ok: MPI process group on $n ranks (every collective, dtypes, reductions, in flight, point to point, a split communicator)"
  else
    echo "FAIL: MPI process group on $n ranks (exit $status):"
    sed 's/^/    /' "$work/out_$n" | head -n 40
    failed=1
  fi
done
# loom's collectives (dist_worker's suite, every check of tests/dist/collectives.sh) on the MPI group.
for n in 2 4; do
  timeout 120 mpirun --allow-run-as-root --oversubscribe -x LOOM_TEST_BACKEND=mpi -x MASTER_ADDR=192.0.2.1 \
    -n "$n" "$collectives" collectives > "$work/collectives_$n" 2>&1
  status=$?
  if grep -q "collectives: world_size=$n all checks passed" "$work/collectives_$n" && [ "$status" -eq 0 ]; then
    echo "ok: loom's collectives (all_reduce, gathers, broadcast_object, reduce_scatter, ...) on the MPI group, $n ranks"
  else
    echo "FAIL: loom's collectives on the MPI group, $n ranks (exit $status):"
    sed 's/^/    /' "$work/collectives_$n" | head -n 40
    failed=1
  fi
done
# DDP and FSDP on the MPI group equal single_device.
for strategy in ddp fsdp; do
  for n in 2 4; do
    # An unreachable MASTER_ADDR (TEST-NET-1): the MPI group meets through MPI, not a store.
    timeout 120 mpirun --allow-run-as-root --oversubscribe -x MASTER_ADDR=192.0.2.1 -x MASTER_PORT=9 -n "$n" "$laws" "$strategy" > "$work/laws_$n" 2>&1
    status=$?
    if grep -q "mpi laws: world_size=$n all checks passed" "$work/laws_$n" && [ "$status" -eq 0 ]; then
      echo "ok: $strategy on the MPI group, $n ranks, equals single_device"
      sed -n 's/^law (mpi)/  law (mpi)/p' "$work/laws_$n"
    else
      echo "FAIL: $strategy on the MPI group, $n ranks (exit $status):"
      sed 's/^/    /' "$work/laws_$n" | head -n 40
      failed=1
    fi
  done
done
# A Fabric on the application's communicator: two halves of a 4-rank job
# (split by parity) train independently, each equal to single_device.
timeout 120 mpirun --allow-run-as-root --oversubscribe -x MASTER_ADDR=192.0.2.1 -x MASTER_PORT=9 -n 4 "$laws" split \
  > "$work/split" 2>&1
status=$?
if [ "$(grep -c "mpi laws: world_size=2 all checks passed" "$work/split")" -eq 2 ] && [ "$status" -eq 0 ]; then
  echo "ok: two Fabrics on the halves of a split MPI_COMM_WORLD (4 ranks) train independently, each equal to single_device"
  sed -n 's/^law (mpi)/  law (mpi)/p' "$work/split"
else
  echo "FAIL: Fabrics on a split communicator (exit $status):"
  sed 's/^/    /' "$work/split" | head -n 40
  failed=1
fi
# kill -9 of one rank while the others train on the MPI group: mpirun ends
# the whole job (MPI's behaviour: its runtime sees the process die and
# aborts the rest), with a non-zero status, within the bound.
mpirun --allow-run-as-root --oversubscribe -n 2 "$laws" forever > "$work/forever" 2>&1 &
job=$!
for i in $(seq 1 200); do
  [ "$(grep -c ' training$' "$work/forever")" -eq 2 ] && break
  sleep 0.05
done
victim=$(sed -n 's/^rank 1 pid \([0-9]*\) training$/\1/p' "$work/forever")
start=$(date +%s%N)
if [ -n "$victim" ]; then kill -9 "$victim"; fi
bound=30
for i in $(seq 1 $((bound * 20))); do
  kill -0 "$job" 2>/dev/null || break
  sleep 0.05
done
kill -9 "$job" 2>/dev/null
wait "$job"
status=$?
elapsed=$(( ($(date +%s%N) - start) / 1000000 ))
left=$(pgrep -f "$laws forever" | tr '\n' ' ')
if [ -n "$victim" ] && [ "$status" -ne 0 ] && [ "$elapsed" -lt $((bound * 1000)) ] && [ -z "$left" ]; then
  echo "ok: kill -9 of rank 1 on the MPI group ends the job in $elapsed ms (mpirun exit $status), no process left"
else
  echo "FAIL: kill -9 of rank 1 (victim '$victim', exit $status after $elapsed ms, left: '$left'):"
  sed 's/^/    /' "$work/forever" | head -n 20
  pkill -9 -f "$laws forever" 2>/dev/null
  failed=1
fi
exit $failed
