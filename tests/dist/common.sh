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
