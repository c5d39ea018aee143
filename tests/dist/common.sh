# shellcheck shell=sh
# Shared by the multi-process test scripts: bounded runs, checks, cleanup.
# Each script gets the worker and loom-run paths as $1 and $2, and ends with
# `finish`: exit 1 on any failed check, 77 (Meson's SKIP) when a part could
# not run here, 0 only when every part ran and passed.
set -eu
WORKER=$(realpath "$1")
LOOM_RUN=$(realpath "$2")
MARK="loom-test-$$"
failed=0
skipped=0
WORK=$(mktemp -d)
export LOOM_TEST_TIMEOUT_MS="${LOOM_TEST_TIMEOUT_MS:-30000}"

cleanup() {
  pkill -9 -f "$MARK" 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

fail() { echo "FAIL: $*"; failed=1; }
pass() { echo "ok: $*"; }
# skip WHAT: a part that cannot run on this machine; the test ends as SKIP, never OK.
skip() { echo "SKIP: $*"; skipped=$((skipped + 1)); }

finish() {
  if [ "$failed" -ne 0 ]; then exit 1; fi
  if [ "$skipped" -ne 0 ]; then
    echo "SKIP: $skipped part(s) above could not run here; everything else passed"
    exit 77
  fi
  exit 0
}

# torchrun_usable: Debian's python3-torch can run torch.distributed.run
# (tests/dist/torchrun, shipped here, patches its Python 3.11 bug).
torchrun_usable() { /usr/bin/python3 -c 'import torch.distributed.run' > /dev/null 2>&1; }

# expect_contains FILE TEXT WHAT
expect_contains() {
  if grep -qF -- "$2" "$1"; then pass "$3"; else fail "$3: no '$2' in:"; sed 's/^/    /' "$1" | head -n 20; fi
}

# run_expecting FILE EXPECTED WHAT -- COMMAND...: runs COMMAND with its output
# in FILE; passes when it exits 0 and FILE holds EXPECTED.
run_expecting() {
  out=$1 expected=$2 what=$3
  shift 4
  status=0
  "$@" > "$out" 2>&1 || status=$?
  if [ $status -eq 0 ]; then
    expect_contains "$out" "$expected" "$what"
  else
    fail "$what: exited $status"; sed 's/^/    /' "$out" | head -n 40
  fi
}

# No process of this test is left.
expect_no_leftovers() {
  sleep 0.3
  if pgrep -f "$MARK" > "$WORK/left" 2>/dev/null; then
    fail "processes left behind: $(tr '\n' ' ' < "$WORK/left")"
  else
    pass "no process left behind ($1)"
  fi
}

free_port() {
  /usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

elapsed_ms() { echo $(( ($(date +%s%N) - $1) / 1000000 )); }

# kill_during_saves STRATEGY WORKER READY STAGED WHAT: LOOM_KILL_TRIALS
# (default 3) trials of kill -9 of rank 1 while WORKER's save_forever saves
# to $WORK/killed in a loop under loom-run --strategy STRATEGY. READY is the
# path whose existence says the first save is there; STAGED a glob that
# matches only when a kill landed inside a save (a staging directory left
# behind). Each time, what the path holds must load, complete. The check
# fails unless at least one kill landed inside a save (otherwise it proved
# nothing about interrupted saves): when none of the first trials did (about
# one run in thirty), it goes on, up to 10 trials in all, until one does.
# A trial whose victim never printed its pid fails.
kill_during_saves() {
  interrupted=0
  trials=${LOOM_KILL_TRIALS:-3}
  trial=0
  while [ "$trial" -lt "$trials" ] || { [ "$interrupted" -eq 0 ] && [ "$trial" -lt 10 ]; }; do
    trial=$((trial + 1))
    rm -rf "$WORK/killed" "$WORK"/killed.tmp-*
    "$LOOM_RUN" --strategy "$1" --devices 2 "$2" save_forever 2 "$MARK" > "$WORK/save_$trial" 2>&1 &
    launcher=$!
    for _ in $(seq 1 100); do
      if [ -e "$3" ] && [ "$(grep -c saving "$WORK/save_$trial")" -eq 2 ]; then break; fi
      sleep 0.05
    done
    sleep "0.$(( (trial * 37) % 10 ))"
    victim=$(sed -n 's/^rank 1 pid \([0-9]*\) saving/\1/p' "$WORK/save_$trial")
    if [ -z "$victim" ]; then
      fail "trial $trial: rank 1 never said it was saving (no pid to kill):"; sed 's/^/    /' "$WORK/save_$trial" | head -n 20
      kill -9 "$launcher" 2>/dev/null || true
      wait "$launcher" || true
      continue
    fi
    kill -9 "$victim"
    wait "$launcher" || true
    if ls -d $4 > /dev/null 2>&1; then interrupted=$((interrupted + 1)); fi
    "$2" load_check "$WORK/killed" "$MARK" > "$WORK/check_$trial" 2>&1 ||
      { fail "trial $trial: the checkpoint left after kill -9 does not load"; cat "$WORK/check_$trial"; }
  done
  if [ "$interrupted" -eq 0 ]; then
    fail "kill -9 during $5: none of the $trial kills landed inside a save (no staging directory left), so nothing was tested"
  fi
  expect_contains "$WORK/check_$trial" "loads (step" \
    "kill -9 during $5 ($trial trials, $interrupted of them inside a save): the checkpoint at the path loads every time"
}
