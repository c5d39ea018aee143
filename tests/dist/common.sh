# Shared by the multi-process test scripts: bounded runs, checks, cleanup.
# Each script gets the worker and loom-run paths as $1 and $2.
set -u
WORKER=$(realpath "$1")
LOOM_RUN=$(realpath "$2")
MARK="loom-test-$$"
failed=0
WORK=$(mktemp -d)
export LOOM_TEST_TIMEOUT_MS=${LOOM_TEST_TIMEOUT_MS:-30000}

cleanup() {
  pkill -9 -f "$MARK" 2>/dev/null
  rm -rf "$WORK"
}
trap cleanup EXIT

fail() { echo "FAIL: $*"; failed=1; }
pass() { echo "ok: $*"; }

# expect_contains FILE TEXT WHAT
expect_contains() {
  if grep -qF -- "$2" "$1"; then pass "$3"; else fail "$3: no '$2' in:"; sed 's/^/    /' "$1" | head -n 20; fi
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
# behind). Each time, what the path holds must load, complete.
kill_during_saves() {
  interrupted=0
  trials=${LOOM_KILL_TRIALS:-3}
  for trial in $(seq 1 "$trials"); do
    rm -rf "$WORK/killed" "$WORK"/killed.tmp-*
    "$LOOM_RUN" --strategy "$1" --devices 2 "$2" save_forever 2 "$MARK" > "$WORK/save_$trial" 2>&1 &
    launcher=$!
    for i in $(seq 1 100); do
      [ -e "$3" ] && [ "$(grep -c saving "$WORK/save_$trial")" -eq 2 ] && break
      sleep 0.05
    done
    sleep "0.$(( (trial * 37) % 10 ))"
    victim=$(sed -n 's/^rank 1 pid \([0-9]*\) saving/\1/p' "$WORK/save_$trial")
    kill -9 "$victim"
    wait $launcher
    # shellcheck disable=SC2086 # STAGED is a glob
    ls -d $4 > /dev/null 2>&1 && interrupted=$((interrupted + 1))
    "$2" load_check "$WORK/killed" "$MARK" > "$WORK/check_$trial" 2>&1 ||
      { fail "trial $trial: the checkpoint left after kill -9 does not load"; cat "$WORK/check_$trial"; }
  done
  expect_contains "$WORK/check_$trials" "loads (step" \
    "kill -9 during $5 ($trials trials, $interrupted inside a save): the checkpoint at the path loads every time"
}
