#!/bin/sh
# DDP on real processes: the laws on 2 and 4 ranks (bit-identical ranks, equivalence with one
# process, accumulation under no_backward_sync with one all-reduce per bucket,
# unused parameters, checkpoints to and from single_device), started by
# fabric.launch() and by loom-run; then kill -9 of a rank mid-training ends
# the whole job within 5 s, naming the rank.
set -eu
# shellcheck source=tests/dist/common.sh
. "$(dirname "$0")/common.sh"
DDP_WORKER=$(realpath "$3")
export LOOM_TEST_DIR="$WORK"

timeout 120 "$DDP_WORKER" laws 2 "$MARK" > "$WORK/laws" 2>&1 || { fail "laws (launch) exited $?"; cat "$WORK/laws"; }
expect_contains "$WORK/laws" "ddp laws (laws): world_size=2 all checks passed" "DDP laws, ranks started by fabric.launch()"
sed -n 's/^law/  law/p' "$WORK/laws"
timeout 120 "$LOOM_RUN" --strategy ddp --devices 2 "$DDP_WORKER" laws 2 "$MARK" > "$WORK/laws_cli" 2>&1 ||
  { fail "laws (loom-run) exited $?"; cat "$WORK/laws_cli"; }
expect_contains "$WORK/laws_cli" "ddp laws (laws): world_size=2 all checks passed" "DDP laws under loom-run --strategy ddp"
# The same laws on 4 ranks (4 processes share 2 cores here).
timeout 180 "$LOOM_RUN" --strategy ddp --devices 4 "$DDP_WORKER" laws 4 "$MARK" > "$WORK/laws_4" 2>&1 ||
  { fail "laws on 4 ranks exited $?"; cat "$WORK/laws_4"; }
expect_contains "$WORK/laws_4" "ddp laws (laws): world_size=4 all checks passed" "DDP laws on 4 ranks"

"$LOOM_RUN" --strategy ddp --devices 2 "$DDP_WORKER" train_forever 2 "$MARK" > "$WORK/train" 2>&1 &
launcher=$!
for _ in $(seq 1 100); do
  if [ "$(grep -c training "$WORK/train")" -eq 2 ]; then break; fi
  sleep 0.1
done
victim=$(sed -n 's/^rank 1 pid \([0-9]*\) training/\1/p' "$WORK/train")
sleep 1
if [ -z "$victim" ]; then
  fail "rank 1 never said it was training (no pid to kill):"; sed 's/^/    /' "$WORK/train" | head -n 20
  kill -9 "$launcher" || true
fi
start=$(date +%s%N)
if [ -n "$victim" ]; then kill -9 "$victim"; fi
status=0
wait "$launcher" || status=$?
took=$(elapsed_ms "$start")
if [ $status -ne 0 ]; then pass "the DDP job ended non-zero ($status) after kill -9 of rank 1"; else fail "exit status $status"; fi
if [ "$took" -lt 5000 ]; then pass "within 5 s ($took ms)"; else fail "it took $took ms"; fi
expect_contains "$WORK/train" "local rank 1 (pid $victim) was killed by signal 9" "the killed rank is named"
expect_no_leftovers "ddp"
finish
