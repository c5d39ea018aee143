#!/bin/sh
# loom's MPI process group (src/comm/mpi_backend.cpp) under mpirun on 2 and
# 4 ranks: tests/dist/mpi_collectives.cpp. `mpi.sh --skip REASON` prints why
# the test does not run (a build without MPI) and passes.
set -u
if [ "${1:-}" = "--skip" ]; then
  echo "skipped: ${2:-no MPI}"
  exit 0
fi
program=$(realpath "$1")
laws=$(realpath "$2")
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
exit $failed
