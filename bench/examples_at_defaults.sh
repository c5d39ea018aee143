#!/bin/sh
# bench/examples_at_defaults.sh BUILD_DIR
# The examples CI runs at a smaller size (examples/meson.build), here at their
# defaults with the same checks: Fashion-MNIST's 5 epochs under loom-run's
# ddp, fsdp and deepspeed_stage_3 (test_accuracy >= 0.85; fsdp and ZeRO-3 at
# most 0.55 of the parameter bytes per rank) through tests/check_example.sh;
# the trainer's 3 full epochs in one process and under ddp, fsdp and
# deepspeed (val_accuracy >= 0.85, logs, checkpoints, plot) through
# tests/check_trainer_example.sh; and, when MPI is built, insitu_heat's 9600
# training steps under mpirun -n 2 (surrogate_rel_error <= 0.5 x
# persistence_rel_error within 3 minutes) through
# tests/check_insitu_example.sh. About 5 minutes on 2 cores. The last line:
# examples_at_defaults: N of M pass, with each run's accuracy (insitu: its
# surrogate_rel_error).
set -eu
build=$(realpath "${1:-build}")
source_dir=$(dirname "$(dirname "$(realpath "$0")")")
meson compile -C "$build" examples/fashion_mnist examples/trainer tools/loom-run tools/loom-plot >&2
passed=0
runs=0
figures=""
# run NAME CHECK ARGS...: one check at the defaults; its accuracy line kept.
run() {
  name=$1
  shift
  status=0
  output=$("$@" 2>&1) || status=$?
  accuracy=$(echo "$output" |
    sed -n 's/.*\(last line: test_accuracy\|last line: val_accuracy\|^ok: surrogate_rel_error\)[= ]\(0\.[0-9]*\).*/\2/p' |
    head -n 1)
  echo "$name: exit $status, accuracy ${accuracy:-none}"
  [ "$status" -eq 0 ] || echo "$output" | tail -n 20
  [ "$status" -ne 0 ] || passed=$((passed + 1))
  runs=$((runs + 1))
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
run trainer_one_process sh "$source_dir/tests/check_trainer_example.sh" "$build/examples/trainer" \
  "$build/tools/loom-plot" "$source_dir"
for strategy in ddp fsdp deepspeed; do
  run "trainer_$strategy" sh "$source_dir/tests/check_trainer_example.sh" "$build/examples/trainer" \
    "$build/tools/loom-plot" "$source_dir" "$build/tools/loom-run" "$strategy"
done
# insitu_heat is built only with MPI (libopenmpi-dev).
if meson compile -C "$build" examples/insitu_heat >&2; then
  export OMP_NUM_THREADS=1  # as meson test runs it: one thread per rank, 2 ranks on 2 cores
  run insitu_heat sh "$source_dir/tests/check_insitu_example.sh" "$build/examples/insitu_heat"
  unset OMP_NUM_THREADS
else
  echo "insitu_heat: not built (no MPI in this build)"
fi
echo "examples_at_defaults: $passed of $runs pass:$figures"
[ "$passed" -eq "$runs" ]
