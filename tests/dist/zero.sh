#!/bin/sh
# ZeRO ("deepspeed") on real processes: stages 1, 2 and 3 on 2 and 4 ranks
# against single_device (the shared laws), gradient_accumulation_steps and
# gradient_clipping from a JSON config (a path, and PL_DEEPSPEED_CONFIG_PATH),
# stages 1 and 2 against loom's DDP (bit-identical on 2 ranks); checkpoints
# in DeepSpeed's layout: the identity, resharding, consolidate, damage.
set -eu
# shellcheck source=tests/dist/common.sh
. "$(dirname "$0")/common.sh"
ZERO_WORKER=$(realpath "$3")
export LOOM_TEST_DIR="$WORK"

for n in 2 4; do
  timeout 200 "$ZERO_WORKER" laws $n "$MARK" > "$WORK/laws_$n" 2>&1 || { fail "laws on $n ranks exited $?"; cat "$WORK/laws_$n"; }
  expect_contains "$WORK/laws_$n" "zero laws (laws): world_size=$n all checks passed" "ZeRO laws on $n ranks"
  sed -n 's/^law/  law/p' "$WORK/laws_$n"
done
# The 2-rank saves of every stage load on 4 ranks into every stage.
timeout 120 "$ZERO_WORKER" reshard 4 "$MARK" > "$WORK/reshard" 2>&1 || { fail "reshard exited $?"; cat "$WORK/reshard"; }
expect_contains "$WORK/reshard" "zero laws (reshard): world_size=4 all checks passed" \
  "ZeRO checkpoints of 2 ranks load on 4, any stage into any stage"
sed -n 's/^law/  law/p' "$WORK/reshard"

# loom-run consolidate (DeepSpeed's zero_to_fp32): one full file, equal
# (Python's torch.load) to what single_device wrote after loading the save.
for s in 1 3; do
  "$LOOM_RUN" consolidate "$WORK/zero${s}_2" "$WORK/zero${s}.consolidated.pt" > "$WORK/consolidate_$s" 2>&1 ||
    { fail "consolidate of stage $s exited $?"; cat "$WORK/consolidate_$s"; }
  /usr/bin/python3 "$(dirname "$0")/compare_checkpoints.py" "$WORK/zero${s}.consolidated.pt" "$WORK/zero${s}_2.full" \
    > "$WORK/compare_$s" 2>&1 || { fail "stage $s: consolidated differs from the full save"; cat "$WORK/compare_$s"; }
  expect_contains "$WORK/compare_$s" "entries equal" "stage $s: loom-run consolidate equals single_device's full save (torch.load)"
done

# Damaged copies are refused, naming the file, with nothing changed.
damage() {  # damage NAME HOW EXPECTED
  rm -rf "$WORK/damaged_$1" && cp -r "$WORK/zero3_2" "$WORK/damaged_$1" && eval "$2"
  timeout 120 "$ZERO_WORKER" load_damaged "$WORK/damaged_$1" "$3" "$MARK" > "$WORK/damaged_$1.txt" 2>&1 ||
    { fail "damaged ($1)"; cat "$WORK/damaged_$1.txt"; }
}
c="checkpoint"
damage missing "rm \"\$WORK/damaged_missing/$c/zero_pp_rank_1_mp_rank_00_optim_states.pt\"" \
  "is missing zero_pp_rank_1_mp_rank_00_optim_states.pt"
damage truncated "truncate -s -100 \"\$WORK/damaged_truncated/$c/zero_pp_rank_1_mp_rank_00_model_states.pt\"" \
  "zero_pp_rank_1_mp_rank_00_model_states.pt: has"
damage flipped "printf '\\377' | dd of=\"\$WORK/damaged_flipped/$c/zero_pp_rank_0_mp_rank_00_optim_states.pt\" bs=1 seek=2000 conv=notrunc 2>/dev/null" \
  "does not match the CRC32"
damage torn "rm \"\$WORK/damaged_torn/$c/zero_pp_rank_0_mp_rank_00_model_states.pt\"" "has neither"
damage no_latest "rm \"\$WORK/damaged_no_latest/latest\"" "or latest (a ZeRO checkpoint"
# The tag directory moved out and linked back: 'latest' names a link, refused.
damage tag_link "mv \"\$WORK/damaged_tag_link/$c\" \"\$WORK/tag_outside\" && ln -s \"\$WORK/tag_outside\" \"\$WORK/damaged_tag_link/$c\"" \
  "$c: is a symbolic link, not a directory"
cat "$WORK"/damaged_*.txt | sed "s/^/  /"
if [ "$failed" -eq 0 ]; then pass "damaged ZeRO checkpoints (a file missing, truncated, corrupted; the index or latest missing) are refused naming the file, nothing changed; a tag directory linked from outside is refused"; fi

# kill -9 of a rank while stage 3 saves in a loop: what the path holds
# afterwards is a complete checkpoint (the old or the new one).
kill_during_saves deepspeed "$ZERO_WORKER" "$WORK/killed/latest" "$WORK/killed/checkpoint.tmp-*" "ZeRO saves"

expect_no_leftovers "zero"
finish
