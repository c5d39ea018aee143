#!/bin/sh
# The same program, unchanged, under torchrun (Debian's, with the Python 3.11
# fix of tests/dist/torchrun), under mpirun, and as two simulated nodes of
# loom-run (world size 4) on loopback. Without python3-torch or mpirun the
# part that needs it is skipped and the test reports SKIP.
# Arguments: dist_worker loom-run torchrun
set -eu
# shellcheck source=tests/dist/common.sh
. "$(dirname "$0")/common.sh"
TORCHRUN=$(realpath "$3")
if torchrun_usable; then
  timeout 180 "$TORCHRUN" --standalone --nproc_per_node 2 --no_python "$WORKER" collectives 0 "$MARK" > "$WORK/torchrun" 2>&1 ||
    fail "torchrun exited $?"
  expect_contains "$WORK/torchrun" "collectives: world_size=2 all checks passed" "under torchrun"
  expect_contains "$WORK/torchrun" "(torchelastic environment)" "torchrun detected as torchelastic"
else
  skip "torchrun: /usr/bin/python3 cannot import torch.distributed.run (install python3-torch)"
fi
if command -v mpirun > /dev/null; then
  timeout 120 mpirun --allow-run-as-root --oversubscribe -np 2 "$WORKER" collectives 0 "$MARK" > "$WORK/mpirun" 2>&1 ||
    fail "mpirun exited $?"
  expect_contains "$WORK/mpirun" "collectives: world_size=2 all checks passed" "under mpirun"
  expect_contains "$WORK/mpirun" "(mpi environment)" "mpirun detected as mpi"
else
  skip "mpirun: not installed (openmpi-bin)"
fi

port=$(free_port)
for node in 0 1; do
  timeout 120 "$LOOM_RUN" --num-nodes 2 --node-rank $node --devices 2 --main-port "$port" \
    "$WORKER" collectives 0 "$MARK" > "$WORK/node$node" 2>&1 &
done
wait
expect_contains "$WORK/node0" "collectives: world_size=4 all checks passed" "two simulated nodes of 2 ranks"
expect_contains "$WORK/node1" "rank 3/4 local 1 node 1" "node 1 holds global ranks 2 and 3"
expect_no_leftovers "launchers"
finish
