#!/bin/sh
# bench/examples_at_defaults.sh BUILD_DIR
# The ranked examples at their defaults, with the checks CI runs on them at a
# smaller size (examples/meson.build): Fashion-MNIST's 5 epochs under
# loom-run's ddp, fsdp and deepspeed_stage_3 (test_accuracy >= 0.85; fsdp and
# ZeRO-3 at most 0.55 of the parameter bytes per rank) through
# tests/check_example.sh, and the trainer's 3 full epochs under ddp, fsdp and
# deepspeed (val_accuracy >= 0.85, logs, checkpoints, plot) through
# tests/check_trainer_example.sh. About 4 minutes on 2 cores. The last line:
# examples_at_defaults: N of 6 pass, with each run's accuracy.
set -eu
build=$(realpath "${1:-build}")
source_dir=$(dirname "$(dirname "$(realpath "$0")")")
meson compile -C "$build" examples/fashion_mnist examples/trainer tools/loom-run tools/loom-plot >&2
passed=0
figures=""
# run NAME CHECK ARGS...: one check at the defaults; its accuracy line kept.
run() {
  name=$1
  shift
  status=0
  output=$("$@" 2>&1) || status=$?
  accuracy=$(echo "$output" | sed -n 's/.*last line: \(test_accuracy\|val_accuracy\)=\(0\.[0-9]*\).*/\2/p' | head -n 1)
  echo "$name: exit $status, accuracy ${accuracy:-none}"
  [ "$status" -eq 0 ] || echo "$output" | tail -n 20
  [ "$status" -ne 0 ] || passed=$((passed + 1))
  figures="$figures $name=${accuracy:-none}"
}
for strategy in ddp fsdp deepspeed_stage_3; do
  if [ "$strategy" = deepspeed_stage_3 ]; then
    export PL_DEEPSPEED_CONFIG_PATH="$source_dir/examples/ds_config_stage3.json"
  fi
  run "fashion_mnist_$strategy" sh "$source_dir/tests/check_example.sh" "$build/examples/fashion_mnist" \
    "$build/tools/loom-run" "$strategy"
done
unset PL_DEEPSPEED_CONFIG_PATH
for strategy in ddp fsdp deepspeed; do
  run "trainer_$strategy" sh "$source_dir/tests/check_trainer_example.sh" "$build/examples/trainer" \
    "$build/tools/loom-plot" "$source_dir" "$build/tools/loom-run" "$strategy"
done
echo "examples_at_defaults: $passed of 6 pass:$figures"
[ "$passed" -eq 6 ]
