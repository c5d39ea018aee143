#!/bin/sh
# Stress run (not in meson test): tests/dist/watchdog.sh with 10 trials of
# kill -STOP of a rank mid-training under loom-run (each must end within
# collective_timeout + 5 s with the rank named) and 10 minutes of DDP with
# one rank 1.2 s late every step (no false alarm allowed).
# Usage: tests/stress/watchdog_stuck.sh BUILD_DIR
set -eu
build=$(realpath "${1:-build}")
with_mpi=no-mpi
if [ -x "$build/tests/mpi_ddp" ]; then with_mpi=mpi; fi
LOOM_WATCHDOG_TRIALS=${LOOM_WATCHDOG_TRIALS:-10} LOOM_WATCHDOG_SLOW_SECONDS=${LOOM_WATCHDOG_SLOW_SECONDS:-600} \
  exec sh "$(dirname "$0")/../dist/watchdog.sh" "$build/tests/dist_worker" "$build/tools/loom-run" \
  "$build/tests/watchdog_worker" "$(dirname "$0")/../dist/torchrun" "$with_mpi"
