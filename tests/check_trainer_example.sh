#!/bin/sh
# check_trainer_example.sh TRAINER LOOM_PLOT SOURCE_DIR [LOOM_RUN [STRATEGY [BATCHES]]]
# Runs examples/trainer at its defaults, or with BATCHES batches per epoch
# (--limit-train-batches; its 3 epochs either way) (with LOOM_RUN: under
# loom-run --strategy STRATEGY --devices 2, ddp unless given; LOOM_RUN '-':
# one process, STRATEGY ignored; fsdp's
# checkpoints are sharded directories). The last line of stdout and stderr together
# must be val_accuracy=0.XXXX, printed once, >= 0.85; the progress bar,
# checkpoints (periodic, best, last), CSV and TensorBoard logs must be there;
# every value in every column of the CSV must be in the TensorBoard file at its step
# (read by tests/read_tensorboard.py, an independent Python reader); and
# loom-plot must turn the CSV into a valid SVG with the curves.
set -eu
example=$(realpath "$1")
plot=$(realpath "$2")
source_dir=$(realpath "$3")
launcher=""
strategy=${5:-ddp}
batches=${6:-}
if [ $# -ge 4 ] && [ "$4" != - ]; then launcher=$(realpath "$4"); fi
# run_example ARGS...: the example, under loom-run when one was given.
run_example() {
  if [ -n "$launcher" ]; then
    "$launcher" --accelerator cpu --strategy "$strategy" --devices 2 "$example" "$@"
  else
    "$example" "$@"
  fi
}
# run_training: at the defaults unless BATCHES was given.
run_training() {
  if [ -n "$batches" ]; then run_example --limit-train-batches "$batches"; else run_example; fi
}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work" || exit 1
fail() { echo "FAIL: $*"; exit 1; }

start=$(date +%s)
status=0
run_training > out.txt 2>&1 || status=$?
seconds=$(( $(date +%s) - start ))
last=$(tail -n 1 out.txt)
echo "exit status $status after ${seconds} s, last line: $last"
[ "$status" -eq 0 ] || { tail -n 30 out.txt; fail "the example failed"; }
case "$last" in
  val_accuracy=0.[0-9][0-9][0-9][0-9]) ;;
  *) fail "the last line is not val_accuracy=0.XXXX" ;;
esac
[ "$(grep -c '^val_accuracy=' out.txt)" -eq 1 ] || fail "val_accuracy is printed more than once"
awk -v v="${last#val_accuracy=}" 'BEGIN { exit !(v >= 0.85) }' || fail "val_accuracy ${last#val_accuracy=} is below 0.85"
grep -q '^Epoch 3/3 \[####################\]' out.txt || fail "no progress bar line for the end of epoch 3"
grep '^validation after epoch' out.txt
for file in checkpoints/epoch=1-step=*.ckpt checkpoints/epoch=3-step=*.ckpt checkpoints/best/last.ckpt \
            checkpoints/best/epoch=*-val_accuracy=*.ckpt logs/csv/version_0/metrics.csv \
            logs/csv/version_0/hparams.yaml logs/tensorboard/version_0/events.out.tfevents.*; do
  [ -e "$file" ] || fail "missing $file"
done
echo "checkpoints and logs are there"

/usr/bin/python3 "$source_dir/tests/read_tensorboard.py" --proto "$source_dir/src/loggers/proto" \
  --dir logs/tensorboard/version_0 --csv logs/csv/version_0/metrics.csv || fail "TensorBoard and CSV differ"

"$plot" logs/csv/version_0/metrics.csv -o curves.svg --metrics train_loss,val_loss,val_accuracy,lr-AdamW ||
  fail "loom-plot failed"
/usr/bin/python3 "$source_dir/tests/check_svg.py" curves.svg train_loss val_loss val_accuracy lr-AdamW ||
  fail "loom-plot's SVG is not valid"
"$plot" logs/csv/version_0/metrics.csv -o bad.svg --metrics no_such_metric > bad.txt 2>&1 && fail "an unknown metric was accepted"
grep -q "has no column 'no_such_metric'" bad.txt || fail "the unknown-metric error does not name it"
echo "ok"
