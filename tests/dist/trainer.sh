#!/bin/sh
# loom::trainer on real processes: a fit stopped inside an epoch (the process
# exits) and resumed from its checkpoint in a new process ends with the
# weights of a straight fit, bit for bit, and logs each step once, with the
# same values; on one process and on 2 DDP ranks. Under DDP with
# grad_accum_steps = 4, each optimizer step issues one gradient collective
# per bucket (counted).
set -eu
# shellcheck source=tests/dist/common.sh
. "$(dirname "$0")/common.sh"
TRAINER_WORKER=$(realpath "$3")

# fit NAME MAX_STEPS [ARGS...]: one run of the worker, bounded in time.
fit() {
  name=$1; steps=$2; shift 2
  set -- "$TRAINER_WORKER" fit "$WORK/$name" "$steps" "$@" "$MARK"
  if [ "$LAUNCH" = ddp ]; then set -- "$LOOM_RUN" --strategy ddp --devices 2 "$@"; fi
  timeout 120 "$@" > "$WORK/$name.log" 2>&1 ||
    { fail "$name: fit exited $?"; sed 's/^/    /' "$WORK/$name.log" | tail -n 20; }
}

# train_loss by step from a run's metrics.csv, sorted.
losses() {
  /usr/bin/python3 - "$1" <<'PY'
import csv, sys
rows = [(int(r["step"]), r["train_loss"]) for r in csv.DictReader(open(sys.argv[1])) if r.get("train_loss")]
steps = [s for s, _ in rows]
if len(steps) != len(set(steps)):
    print("duplicate steps")
for step, loss in sorted(rows):
    print(step, loss)
PY
}

resume_law() {
  label=$1
  fit "$label-straight" 30
  # 200 samples in batches of 10: 20 batches per epoch on one process, 10 per rank on two;
  # step 13 is inside an epoch either way.
  fit "$label-split" 13
  expect_contains "$WORK/$label-split.log" "steps=13 checkpoint=$WORK/$label-split/ckpt/epoch=" "$label: the first part stops at step 13 and checkpoints"
  fit "$label-split" 30 --resume last
  expect_contains "$WORK/$label-split.log" "steps=30" "$label: the resumed part continues to step 30"
  "$TRAINER_WORKER" compare "$WORK/$label-straight/final.ckpt" "$WORK/$label-split/final.ckpt" > "$WORK/$label-compare" 2>&1 ||
    fail "$label: compare exited $?"
  expect_contains "$WORK/$label-compare" "bit-identical" "$label: resumed weights equal the straight run's"
  sed 's/^/    /' "$WORK/$label-compare"
  losses "$WORK/$label-straight/logs/csv/version_0/metrics.csv" > "$WORK/$label-a"
  losses "$WORK/$label-split/logs/csv/version_0/metrics.csv" > "$WORK/$label-b"
  if [ "$(wc -l < "$WORK/$label-a")" -eq 30 ] && cmp -s "$WORK/$label-a" "$WORK/$label-b"; then
    pass "$label: metrics.csv after resume has each of the 30 steps once, with the straight run's losses"
  else
    fail "$label: metrics.csv differs after resume"; diff "$WORK/$label-a" "$WORK/$label-b" | head -n 10
  fi
}

# LAUNCH: how fit starts the worker: one process, or 2 DDP ranks under loom-run.
LAUNCH=single
resume_law single
LAUNCH=ddp
resume_law ddp

fit accum 12 --accum 4 --count-syncs
expect_contains "$WORK/accum.log" "steps=12" "DDP with grad_accum_steps=4 takes 12 optimizer steps"
line=$(grep '^syncs per optimizer step' "$WORK/accum.log" || true)
echo "    $line"
# The same count per optimizer step as without accumulation: the three
# micro-batches under no_backward_sync add no collective.
fit noaccum 12 --count-syncs
single=$(grep '^syncs per optimizer step' "$WORK/noaccum.log" || true)
echo "    $single"
if [ "${line%%|*}" = "${single%%|*}" ]; then
  pass "4 micro-batches per step issue the collectives of 1"
else
  fail "accumulation changed the collectives per step: '$line' vs '$single'"
fi
buckets=$(echo "$line" | sed -n 's/.*buckets=\([0-9]*\).*/\1/p')
# Step 1 teaches the reducer the gradient order and step 2 broadcasts the
# rebuilt bucket order once; from step 3 on only gradient reductions run.
rest=$(echo "$line" | sed 's/syncs per optimizer step: //; s/ |.*//' | cut -d' ' -f3-)
ok=1
for n in $rest; do [ "$n" = "$buckets" ] || ok=0; done
if [ -n "$buckets" ] && [ "$ok" = 1 ]; then
  pass "one gradient collective per bucket per optimizer step ($buckets bucket(s), 4 micro-batches)"
else
  fail "collectives per step: $line"
fi

expect_no_leftovers "trainer"
finish
