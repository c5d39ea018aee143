#!/bin/sh
# Stress run (not in meson test): 20 trials of kill -9 of a rank while ZeRO
# stage 3 saves checkpoints (DeepSpeed's layout) in a loop; each time the
# checkpoint at the path must load. Usage: tests/stress/zero_kill_during_save.sh BUILD_DIR
set -eu
build=$(realpath "${1:-build}")
LOOM_KILL_TRIALS=${LOOM_KILL_TRIALS:-20} exec sh "$(dirname "$0")/../dist/zero.sh" \
  "$build/tests/dist_worker" "$build/tools/loom-run" "$build/tests/zero_worker"
