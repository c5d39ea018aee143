#!/bin/sh
# comm/'s fixed-shape and asynchronous collectives on real processes: every
# entry point with fp32, fp16, bf16 and int64, both Gloo emulations, mesh
# sub-groups, handles waited out of order, no allocation once warm.
set -eu
# shellcheck source=tests/dist/common.sh
. "$(dirname "$0")/common.sh"
for n in 2 4; do
  status=0
  timeout 120 "$LOOM_RUN" --accelerator cpu --devices $n "$WORKER" comm 0 "$MARK" > "$WORK/out$n" 2>&1 || status=$?
  if [ $status -eq 0 ]; then
    expect_contains "$WORK/out$n" "comm: world_size=$n all checks passed" "comm/ on $n ranks"
  else
    fail "comm/ on $n ranks exited $status"; cat "$WORK/out$n"
  fi
done
expect_no_leftovers "comm"
finish
