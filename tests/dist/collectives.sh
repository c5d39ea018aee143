#!/bin/sh
# Collectives on real processes over loopback: 2 and 4 ranks under loom-run,
# 3 ranks started by fabric.launch() (subprocess launcher) and by launch(fn)
# (fork launcher). The worker checks every result against a hand-computed value.
set -eu
# shellcheck source=tests/dist/common.sh
. "$(dirname "$0")/common.sh"
for n in 2 4; do
  run_expecting "$WORK/out$n" "collectives: world_size=$n all checks passed" "loom-run, $n ranks" -- \
    timeout 120 "$LOOM_RUN" --accelerator cpu --devices $n "$WORKER" collectives 0 "$MARK"
done
timeout 120 "$WORKER" launch_self 3 "$MARK" > "$WORK/self" 2>&1 || { fail "launch_self exited $?"; cat "$WORK/self"; }
expect_contains "$WORK/self" "launch_self: world_size=3 all checks passed" "fabric.launch() starts 3 ranks itself"
timeout 120 "$WORKER" fork 3 "$MARK" > "$WORK/fork" 2>&1 || { fail "fork exited $?"; cat "$WORK/fork"; }
expect_contains "$WORK/fork" "fork: world_size=3 all checks passed" "launch(fn) with the fork launcher, 3 ranks"
expect_no_leftovers "collectives"
finish
