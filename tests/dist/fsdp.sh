#!/bin/sh
# FSDP on real processes: the shared laws (strategy_laws.hpp) for FULL_SHARD,
# SHARD_GRAD_OP and NO_SHARD on 2 and 4 ranks and HYBRID_SHARD as 2 nodes x 2
# ranks on loopback; FULL_SHARD with prefetch off, with auto_wrap_policy and
# with the optimizer built after setup; accumulation under no_backward_sync
# without reduce-scatters; a tied embedding; full checkpoints.
set -eu
# shellcheck source=tests/dist/common.sh
. "$(dirname "$0")/common.sh"
FSDP_WORKER=$(realpath "$3")
export LOOM_TEST_DIR="$WORK"

timeout 200 "$FSDP_WORKER" laws 2 "$MARK" > "$WORK/laws" 2>&1 || { fail "laws on 2 ranks exited $?"; cat "$WORK/laws"; }
expect_contains "$WORK/laws" "fsdp laws (laws): world_size=2 all checks passed" "FSDP laws on 2 ranks (fabric.launch())"
sed -n 's/^law/  law/p' "$WORK/laws"

# Sharded checkpoints across world sizes: the 2-rank job's sharded save
# loads on 4 ranks and on single_device; consolidate equals its full save.
timeout 120 "$LOOM_RUN" --strategy fsdp --devices 4 "$FSDP_WORKER" reshard 4 "$MARK" > "$WORK/reshard" 2>&1 ||
  { fail "reshard on 4 ranks exited $?"; cat "$WORK/reshard"; }
expect_contains "$WORK/reshard" "fsdp laws (reshard): world_size=4 all checks passed" \
  "a sharded checkpoint from 2 ranks loads on 4 and on single_device"
sed -n 's/^law/  law/p' "$WORK/reshard"
"$LOOM_RUN" consolidate "$WORK/sharded_2" "$WORK/consolidated.pt" > "$WORK/consolidate" 2>&1 ||
  { fail "loom-run consolidate exited $?"; cat "$WORK/consolidate"; }
expect_contains "$WORK/consolidate" "loom-consolidate: wrote" "loom-run consolidate wrote one file"
/usr/bin/python3 "$(dirname "$0")/compare_checkpoints.py" "$WORK/consolidated.pt" "$WORK/sharded_2.full" \
  > "$WORK/compare" 2>&1 || { fail "consolidated differs from the full save"; cat "$WORK/compare"; }
expect_contains "$WORK/compare" "entries equal" "consolidate equals the full save tensor for tensor (Python's torch.load)"

# Damaged copies are refused, naming the file, with nothing changed.
# damage NAME EXPECTED: a copy of the 2-rank save, damaged as NAME says.
damage() {
  copy="$WORK/damaged_$1"
  rm -rf "$copy"
  cp -r "$WORK/sharded_2" "$copy"
  case $1 in
    missing) rm "$copy/shard_1_of_2.pt" ;;
    truncated) truncate -s -100 "$copy/shard_0_of_2.pt" ;;
    flipped) printf "\377" | dd of="$copy/shard_1_of_2.pt" bs=1 seek=2000 conv=notrunc 2>/dev/null ;;
    torn) rm "$copy/meta.pt" ;;
    # The same bytes outside the directory (size and CRC32 match): a link is still refused.
    symlink_out) mv "$copy/shard_1_of_2.pt" "$copy.outside" && ln -s "$copy.outside" "$copy/shard_1_of_2.pt" ;;
    fifo) rm "$copy/shard_1_of_2.pt" && mkfifo "$copy/shard_1_of_2.pt" ;;
  esac
  timeout 120 "$FSDP_WORKER" load_damaged "$WORK/damaged_$1" "$2" "$MARK" > "$WORK/damaged_$1.txt" 2>&1 ||
    { fail "damaged ($1)"; cat "$WORK/damaged_$1.txt"; }
}
damage missing "is missing shard_1_of_2.pt"
damage truncated "shard_0_of_2.pt: has"
damage flipped "shard_1_of_2.pt: does not match the CRC32"
damage torn "without meta.pt"
damage symlink_out "shard_1_of_2.pt: is a symbolic link"
damage fifo "shard_1_of_2.pt: is a FIFO, not a regular file"
cat "$WORK"/damaged_*.txt | sed "s/^/  /"
if [ "$failed" -eq 0 ]; then pass "damaged sharded checkpoints (rank file missing, truncated, corrupted, a link out of the directory, a FIFO; meta.pt missing) are refused naming the file, nothing changed"; fi

# Each rank of a sharded load reads only its parts, each record checked by
# its CRC32: one tensor record of rank 1's file corrupted is found by rank 1
# alone, and every rank refuses the load with its state unchanged.
rm -rf "$WORK/damaged_part" && cp -r "$WORK/sharded_2" "$WORK/damaged_part"
/usr/bin/python3 - "$WORK/damaged_part/shard_1_of_2.pt" > "$WORK/damaged_part.record" <<'PY'
import struct, sys, zipfile
path = sys.argv[1]
with zipfile.ZipFile(path) as archive:
    record = max((i for i in archive.infolist() if "/data/" in i.filename), key=lambda i: i.file_size)
with open(path, "r+b") as f:
    f.seek(record.header_offset)
    name_length, extra_length = struct.unpack("<HH", f.read(30)[26:30])
    at = record.header_offset + 30 + name_length + extra_length + record.file_size // 2
    f.seek(at)
    byte = f.read(1)[0]
    f.seek(at)
    f.write(bytes([byte ^ 0xFF]))
print(record.filename)
PY
timeout 120 "$LOOM_RUN" --strategy fsdp --devices 2 "$FSDP_WORKER" damaged_part 2 "$MARK" > "$WORK/damaged_part.out" 2>&1 ||
  { fail "damaged_part on 2 ranks exited $?"; cat "$WORK/damaged_part.out"; }
expect_contains "$WORK/damaged_part.out" "fsdp laws (damaged_part): world_size=2 all checks passed" \
  "a record of rank 1's file corrupted ($(cat "$WORK/damaged_part.record")): rank 1 finds it, every rank refuses the load, state unchanged"
sed -n 's/^law/  law/p' "$WORK/damaged_part.out"

# kill -9 of a rank while it saves sharded checkpoints in a loop: what the
# path holds afterwards is a complete checkpoint (the old or the new one).
kill_during_saves fsdp "$FSDP_WORKER" "$WORK/killed" "$WORK/killed.tmp-*" "sharded saves"
cat "$WORK/compare"

timeout 200 "$LOOM_RUN" --strategy fsdp --devices 4 "$FSDP_WORKER" laws_short 4 "$MARK" > "$WORK/laws_4" 2>&1 ||
  { fail "laws on 4 ranks exited $?"; cat "$WORK/laws_4"; }
expect_contains "$WORK/laws_4" "fsdp laws (laws_short): world_size=4 all checks passed" "FSDP laws on 4 ranks (loom-run)"
sed -n 's/^law/  law/p' "$WORK/laws_4"

# HYBRID_SHARD: two simulated nodes of two ranks each, one loom-run per node.
port=$(free_port)
for node in 0 1; do
  timeout 200 "$LOOM_RUN" --strategy fsdp --num-nodes 2 --node-rank $node --devices 2 \
    --main-address 127.0.0.1 --main-port "$port" "$FSDP_WORKER" hybrid 2 "$MARK" > "$WORK/hybrid_$node" 2>&1 &
done
wait
expect_contains "$WORK/hybrid_0" "fsdp laws (hybrid): world_size=4 all checks passed" \
  "HYBRID_SHARD on 2 nodes x 2 ranks (loom-run --num-nodes 2)"
sed -n 's/^law/  law/p' "$WORK/hybrid_0"
expect_no_leftovers "fsdp"
finish
