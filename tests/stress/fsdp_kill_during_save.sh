#!/bin/sh
# Stress run (not in meson test): 20 trials of kill -9 of a rank while FSDP
# saves sharded checkpoints in a loop; each time the checkpoint at the path
# must load. Usage: tests/stress/fsdp_kill_during_save.sh BUILD_DIR
set -eu
build=$(realpath "${1:-build}")
LOOM_KILL_TRIALS=${LOOM_KILL_TRIALS:-20} exec sh "$(dirname "$0")/../dist/fsdp.sh" \
  "$build/tests/dist_worker" "$build/tools/loom-run" "$build/tests/fsdp_worker"
