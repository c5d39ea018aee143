#!/bin/sh
# check_example.sh EXAMPLE [LOOM_RUN [STRATEGY [EPOCHS]]]
# Runs the Fashion-MNIST example at its defaults, or for EPOCHS epochs (with
# LOOM_RUN: under `loom-run --accelerator cpu --strategy STRATEGY --devices
# 2`, ddp unless given; under fsdp and deepspeed_stage_3 the line before the last,
# param_bytes_per_rank=, must be
# at most 0.55 of the model's parameter bytes): the last line of
# stdout and stderr together must be test_accuracy=0.XXXX, printed once, with
# a value >= 0.85. Then with a data directory that does not exist: it must
# fail and name the file and the Debian package. Under LOOM_RUN, a flag of the
# example that contradicts loom-run's must be refused, naming both.
set -eu
example=$(realpath "$1")
launcher=""
strategy=${3:-ddp}
epochs=${4:-}
if [ $# -ge 2 ]; then launcher=$(realpath "$2"); fi
# run_example ARGS...: the example, under loom-run when one was given.
run_example() {
  if [ -n "$launcher" ]; then
    "$launcher" --accelerator cpu --strategy "$strategy" --devices 2 "$example" "$@"
  else
    "$example" "$@"
  fi
}
# run_training: the run whose accuracy counts (at the defaults unless EPOCHS).
run_training() {
  if [ -n "$epochs" ]; then run_example --epochs "$epochs"; else run_example; fi
}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work" || exit 1

status=0
run_training > out.txt 2>&1 || status=$?
last=$(tail -n 1 out.txt)
echo "exit status $status, last line: $last"
[ "$status" -eq 0 ] || { cat out.txt; exit 1; }
case "$last" in
  test_accuracy=0.[0-9][0-9][0-9][0-9]) ;;
  *) echo "the last line is not test_accuracy=0.XXXX"; exit 1 ;;
esac
[ "$(grep -c '^test_accuracy=' out.txt)" -eq 1 ] || { echo "test_accuracy is printed more than once"; exit 1; }
value=${last#test_accuracy=}
awk -v v="$value" 'BEGIN { exit !(v >= 0.85) }' || { echo "test accuracy $value is below 0.85"; exit 1; }
[ -f logs/fashion_mnist/version_0/metrics.csv ] || { echo "no metrics.csv written"; exit 1; }
bytes_line=$(tail -n 2 out.txt | head -n 1)
case "$bytes_line" in
  param_bytes_per_rank=*) ;;
  *) echo "the line before the last is not param_bytes_per_rank=...: $bytes_line"; exit 1 ;;
esac
held=$(echo "$bytes_line" | sed -n 's/^param_bytes_per_rank=\([0-9]*\) model_param_bytes=\([0-9]*\)$/\1/p')
model=$(echo "$bytes_line" | sed -n 's/^param_bytes_per_rank=\([0-9]*\) model_param_bytes=\([0-9]*\)$/\2/p')
echo "parameter bytes per rank $held of $model"
case "$strategy" in
  fsdp|deepspeed_stage_3*)
    awk -v h="$held" -v m="$model" 'BEGIN { exit !(h <= 0.55 * m) }' || { echo "$strategy holds $held of $model bytes (> 0.55)"; exit 1; } ;;
esac
# A DeepSpeed config through PL_DEEPSPEED_CONFIG_PATH: its notices show it was read.
if [ -n "${PL_DEEPSPEED_CONFIG_PATH:-}" ]; then
  grep -q "loom deepspeed: notice: 'steps_per_print'" out.txt ||
    { echo "no notice of the config's steps_per_print: was $PL_DEEPSPEED_CONFIG_PATH read?"; exit 1; }
  echo "read the DeepSpeed config $PL_DEEPSPEED_CONFIG_PATH"
fi

run_example --data "$work/missing" > missing.txt 2>&1 && { echo "missing data did not fail"; exit 1; }
if ! grep -q "missing/train-images-idx3-ubyte.gz" missing.txt || ! grep -q "dataset-fashion-mnist" missing.txt; then
  echo "the missing-data error does not name the file and the package:"; cat missing.txt; exit 1
fi

# Under loom-run its flags decide; the example's own flag that differs is an
# error naming both, before any training (Lightning's rule, through make_fabric).
if [ -n "$launcher" ]; then
  run_example --strategy single_device > conflict.txt 2>&1 && { echo "a conflicting --strategy was accepted"; exit 1; }
  if ! grep -q "strategy=single_device" conflict.txt || ! grep -q -- "--strategy=$strategy" conflict.txt; then
    echo "the conflict error does not name both values:"; cat conflict.txt; exit 1
  fi
fi
echo "ok"
