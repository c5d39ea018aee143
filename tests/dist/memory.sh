#!/bin/sh
# Memory caps the tests enforce (memory_worker.cpp): FULL_SHARD on 4 and 8
# ranks, deepspeed_stage_3 on 4 and model_parallel on a 2 x 2 mesh build,
# train, save and consolidate the 16 x Linear(1024, 1024) MLP with each
# phase under a heap cap from its formula, and equal single_device (the
# consolidated file byte for byte the one written whole); each also loads
# its save and the consolidated file, and FULL_SHARD on 8 ranks and the
# 2 x 2 mesh the 4-rank FULL_SHARD save, under their caps, each rank
# reading its parts. Each phase's negative control (the model built
# outside init_module(true); parameters kept whole through the step; a full
# save; the merged checkpoint read whole; the checkpoint read whole by every
# rank to load it) hits its cap on one rank, and that ends every rank within
# seconds.
set -eu
# shellcheck source=tests/dist/common.sh
. "$(dirname "$0")/common.sh"
MEMORY_WORKER=$(realpath "$3")
HEAP_CAP=$(realpath "$4")
CONSOLIDATE=$(realpath "$5")
SANITIZED=0
# The saves go to this test's directory, removed with it (0.6 GB a run).
export LOOM_TEST_DIR="$WORK"
# In the runs that print each phase's peaks, glibc's mmap threshold is
# fixed: freed blocks go back to the system, so the printed VmHWM follows the
# heap (with the default, dynamic threshold glibc keeps them resident: 3x the
# heap's peak here). The caps count the heap itself, whatever glibc keeps, so
# the controls run with the default: each block's fresh pages faulted in
# again cost them a fifth of their time (10.8 s against 8.4 s for
# control_full_load, half of it system time).

# capped SCENARIO STRATEGY N [RESHARD_FROM]: every phase under its cap on
# every rank (SCENARIO capped, or capped_full: with a full save).
capped() {
  scenario=$1
  shift
  out="$WORK/${scenario}_$1_$2"
  status=0
  MALLOC_MMAP_THRESHOLD_=131072 timeout 150 "$MEMORY_WORKER" "$1" "$scenario" "$2" "$MARK" ${3:+"$3"} > "$out" 2>&1 ||
    status=$?
  if [ $status -eq 77 ]; then SANITIZED=1; skip "$(cat "$out")"; return; fi
  if [ $status -ne 0 ]; then fail "$1 $scenario on $2 ranks exited $status"; sed 's/^/    /' "$out" | tail -n 30; return; fi
  expect_contains "$out" "memory caps ($1, $scenario): world_size=$2 all checks passed" \
    "$1 $scenario on $2 ranks: build, step, save, consolidate and the loads under their caps, equal to single_device"
  sed -n 's/^\(phase\|law\|  read\)/  \1/p' "$out"
  # The 4-rank FULL_SHARD save stays for the 8-rank run to reshard.
  if [ "${scenario}_$1_$2" = capped_fsdp_4 ]; then mv "$WORK/memory_fsdp_capped_4" "$WORK/reshard_from_4"; fi
  rm -rf "$WORK"/memory_*  # the saves: 0.6 GB a run
}

# loom-consolidate itself under the heap cap (LD_PRELOAD of heap_cap_preload):
# the 4-rank save made one file holding at most the largest tensor (W,
# 4 MiB) + the margin (6 MiB) above the program's start; its control, a cap
# of half a tensor, is refused there.
consolidate_capped() {
  if [ "$SANITIZED" = 1 ]; then skip "loom-consolidate's heap cap: not enforced under a sanitizer"; return; fi
  out="$WORK/consolidate_capped"
  status=0
  LD_PRELOAD="$HEAP_CAP" LOOM_HEAP_CAP_BYTES=$((10 << 20)) timeout 120 "$CONSOLIDATE" "$WORK/reshard_from_4" \
    "$WORK/consolidated.pt" > "$out" 2>&1 || status=$?
  if [ $status -ne 0 ]; then fail "loom-consolidate under a cap of W + 6 MiB exited $status"; tail -n 5 "$out"; return; fi
  expect_contains "$out" "heap cap: peak" \
    "loom-consolidate (4-rank FULL_SHARD save, 192 MiB) under a heap cap of W + 6 MiB = 10 MiB above its start"
  grep -m 1 "heap cap: peak" "$out" | sed 's/^/  /'
  status=0
  LD_PRELOAD="$HEAP_CAP" LOOM_HEAP_CAP_BYTES=$((2 << 20)) timeout 120 "$CONSOLIDATE" "$WORK/reshard_from_4" \
    "$WORK/control.pt" > "$out.control" 2>&1 || status=$?
  if [ $status -eq 0 ]; then fail "loom-consolidate under a cap of half a tensor passed: its cap did not bind"; return; fi
  expect_contains "$out.control" "heap cap: refused an allocation" "loom-consolidate under a cap of W/2 hits it (exit $status)"
  rm -f "$WORK/consolidated.pt" "$WORK/control.pt"
}

# control STRATEGY N SCENARIO: must hit the cap on the rank it caps, and every
# rank must be gone within LIMIT seconds.
control() {
  out="$WORK/$3_$1_$2"
  limit=30
  started=$(date +%s%N)
  status=0
  timeout 150 "$MEMORY_WORKER" "$1" "$3" "$2" "$MARK" > "$out" 2>&1 || status=$?
  took=$(elapsed_ms "$started")
  if [ $status -eq 77 ]; then skip "$(cat "$out")"; return; fi
  if [ $status -eq 0 ]; then fail "$1 $3 on $2 ranks passed: its cap did not bind"; sed 's/^/    /' "$out" | tail -n 20; return; fi
  expect_contains "$out" "heap cap: refused an allocation" "$1 $3 on $2 ranks hits its cap (exit $status)"
  if [ "$took" -le $((limit * 1000)) ]; then
    pass "$1 $3: every rank ended ${took} ms after the start, within ${limit} s"
  else
    fail "$1 $3: the ranks took ${took} ms to end (limit ${limit} s)"
  fi
  grep -m 3 "heap cap\|memory_worker rank" "$out" | sed 's/^/  /' || true
  rm -rf "$WORK"/memory_*
}

capped capped fsdp 4
consolidate_capped
control fsdp 4 control_build
control fsdp 4 control_step
control fsdp 4 control_save
capped capped_full fsdp 4
control fsdp 4 control_consolidate
control fsdp 4 control_load
control fsdp 4 control_full_load
capped capped zero3 4
control zero3 4 control_build
control zero3 4 control_step
control zero3 4 control_consolidate
control zero3 4 control_load
capped capped fsdp 8 "$WORK/reshard_from_4"
capped capped mp 4 "$WORK/reshard_from_4"
rm -rf "$WORK/reshard_from_4"
control mp 4 control_build
control mp 4 control_step
control mp 4 control_save
capped capped_full mp 4
control mp 4 control_load
expect_no_leftovers "memory"
finish
