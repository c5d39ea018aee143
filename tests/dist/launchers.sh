#!/bin/sh
# The same program, unchanged, under torchrun (Debian's, with the Python 3.11
# fix from ../shared/tools/torchrun), under mpirun, and as two simulated nodes
# of loom-run (world size 4) on loopback.
. "$(dirname "$0")/common.sh"
TORCHRUN=$3
if [ -x "$TORCHRUN" ]; then
  timeout 180 "$TORCHRUN" --standalone --nproc_per_node 2 --no_python "$WORKER" collectives 0 "$MARK" > "$WORK/torchrun" 2>&1
  expect_contains "$WORK/torchrun" "collectives: world_size=2 all checks passed" "under torchrun"
  expect_contains "$WORK/torchrun" "(torchelastic environment)" "torchrun detected as torchelastic"
else
  echo "SKIP torchrun: $TORCHRUN not found (it lives in ../shared/tools)"
fi
timeout 120 mpirun --allow-run-as-root --oversubscribe -np 2 "$WORKER" collectives 0 "$MARK" > "$WORK/mpirun" 2>&1
expect_contains "$WORK/mpirun" "collectives: world_size=2 all checks passed" "under mpirun"
expect_contains "$WORK/mpirun" "(mpi environment)" "mpirun detected as mpi"

port=$(free_port)
for node in 0 1; do
  timeout 120 "$LOOM_RUN" --num-nodes 2 --node-rank $node --devices 2 --main-port "$port" \
    "$WORKER" collectives 0 "$MARK" > "$WORK/node$node" 2>&1 &
done
wait
expect_contains "$WORK/node0" "collectives: world_size=4 all checks passed" "two simulated nodes of 2 ranks"
expect_contains "$WORK/node1" "rank 3/4 local 1 node 1" "node 1 holds global ranks 2 and 3"
expect_no_leftovers "launchers"
exit $failed
