#!/bin/sh
# Tensor parallel (model_parallel, loom::tp) against single_device under
# loom-run: the column-then-row MLP law on 2 and 4 ranks, vocabulary-parallel
# and column-wise Embeddings, and the plan's refusals
# (tests/dist/tp_worker.cpp).
# Arguments: dist_worker (unused) loom-run tp_worker
set -eu
# shellcheck source=tests/dist/common.sh
. "$(dirname "$0")/common.sh"
TP=$(realpath "$3")
run_tp() {  # run_tp DEVICES SCENARIO EXPECTED WHAT
  timeout 120 "$LOOM_RUN" --devices "$1" "$TP" "$2" "$MARK" > "$WORK/$2.$1" 2>&1 || fail "$2 on $1 ranks exited $?"
  expect_contains "$WORK/$2.$1" "$3" "$4"
  sed -n 's/^\(law (.*\)/  \1/p; s/^\(tp [a-z]*: [a-z0-9].*\)/  \1/p' "$WORK/$2.$1" | grep -v "all checks passed" || true
}
run_tp 2 mlp "tp laws (mlp): world_size=2 all checks passed" \
  "column-then-row MLP on 2 ranks: forward, gradients, 1 + 1 all-reduces, bytes, clip norm, 20 Adam steps equal single_device"
run_tp 4 mlp "tp laws (mlp): world_size=4 all checks passed" "the same on 4 ranks"
run_tp 2 block "tp laws (block): world_size=2 all checks passed" \
  "a transformer block with heads split on 2 ranks: forward, gradients, 2 + 2 all-reduces, 20 Adam steps equal single_device"
run_tp 2 sequence "tp laws (sequence): world_size=2 all checks passed" \
  "the block with sequence parallelism: all-gathers and reduce-scatters instead of all-reduces, LayerNorm and bias gradients all-reduced, equal to single_device"
run_tp 2 dropout "tp laws (dropout): world_size=2 all checks passed" \
  "dropout masks agree across the group for replicated activations and differ for sequence-sharded ones"
run_tp 4 mesh "tp laws (mesh): world_size=4 all checks passed" \
  "a 2 x 2 mesh (FSDP on data parallel 2 x tensor parallel 2) with batch B/2 per data-parallel rank equals single_device with B, clipping norm included"
run_tp 2 construction "tp laws (construction): world_size=2 all checks passed" \
  "init_module(true) with tensor-parallel layers in units on 1 x 2: units sharded as built, each gathered once at setup, its chunks kept, equal to single_device"
run_tp 4 construction "tp laws (construction): world_size=4 all checks passed" \
  "the same on a 2 x 2 mesh, the chunks sharded again over data parallel"
timeout 120 "$LOOM_RUN" --devices 4 "$TP" checkpoint "$WORK" "$MARK" > "$WORK/checkpoint.4" 2>&1 ||
  { fail "checkpoint on 4 ranks exited $?"; cat "$WORK/checkpoint.4"; }
expect_contains "$WORK/checkpoint.4" "tp laws (checkpoint): world_size=4 all checks passed" \
  "a 2 x 2 mesh's distributed and full checkpoints load on 2 x 2 (each rank reading its parts) and into single_device"
sed -n 's/^\(law (tp).*\)/  \1/p' "$WORK/checkpoint.4"
"$LOOM_RUN" consolidate "$WORK/distributed" "$WORK/consolidated.pt" > "$WORK/consolidate" 2>&1 ||
  { fail "loom-run consolidate exited $?"; cat "$WORK/consolidate"; }
/usr/bin/python3 "$(dirname "$0")/compare_checkpoints.py" "$WORK/consolidated.pt" "$WORK/full.pt" \
  > "$WORK/compare" 2>&1 || { fail "consolidated differs from the full save"; cat "$WORK/compare"; }
expect_contains "$WORK/compare" "entries equal" \
  "consolidating the 2 x 2 distributed checkpoint equals its full save, tensor for tensor (Python's torch.load)"
run_tp 2 embed "tp laws (embed): world_size=2 all checks passed" \
  "vocabulary-parallel and column-wise Embeddings equal torch::nn::Embedding (forward, gradients) and hold 1/tp of their bytes (counting allocator)"
run_tp 2 plan "tp laws (plan): world_size=2 all checks passed" \
  "plans naming a plain Linear, no submodule, or an indivisible size are refused with a sentence"
expect_no_leftovers "tp"
finish
