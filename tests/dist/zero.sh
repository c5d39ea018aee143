#!/bin/sh
# ZeRO ("deepspeed") on real processes: stages 1, 2 and 3 on 2 and 4 ranks
# against single_device (the shared laws), gradient_accumulation_steps and
# gradient_clipping from a JSON config (a path, and PL_DEEPSPEED_CONFIG_PATH),
# stages 1 and 2 against loom's DDP (bit-identical on 2 ranks).
. "$(dirname "$0")/common.sh"
ZERO_WORKER=$(realpath "$3")
export LOOM_TEST_DIR="$WORK"

for n in 2 4; do
  timeout 200 "$ZERO_WORKER" laws $n "$MARK" > "$WORK/laws_$n" 2>&1 || { fail "laws on $n ranks exited $?"; cat "$WORK/laws_$n"; }
  expect_contains "$WORK/laws_$n" "zero laws (laws): world_size=$n all checks passed" "ZeRO laws on $n ranks"
  sed -n 's/^law/  law/p' "$WORK/laws_$n"
done
expect_no_leftovers "zero"
exit $failed
