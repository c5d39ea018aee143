#!/bin/sh
# comm/'s fixed-shape and asynchronous collectives on real processes (Gloo's
# event loop at nice +10, the others at the rank's): every
# entry point with fp32, fp16, bf16 and int64, both Gloo emulations, mesh
# sub-groups, handles waited out of order, no allocation once warm.
set -eu
# shellcheck source=tests/dist/common.sh
. "$(dirname "$0")/common.sh"
for n in 2 4; do
  run_expecting "$WORK/out$n" "comm: world_size=$n all checks passed" "comm/ on $n ranks" -- \
    timeout 120 "$LOOM_RUN" --accelerator cpu --devices $n "$WORKER" comm 0 "$MARK"
done
expect_no_leftovers "comm"
finish
