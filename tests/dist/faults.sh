#!/bin/sh
# Faults: a rank killed inside an all_reduce (survivors raise within 5 s,
# naming it), a rank that stops taking part (timeout), and the TCPStore
# rendezvous errors (port in use, nothing to reach). TRIALS kill trials.
set -eu
# shellcheck source=tests/dist/common.sh
. "$(dirname "$0")/common.sh"
TRIALS=${3:-3}

trial=1
while [ $trial -le "$TRIALS" ]; do
  dir=$(mktemp -d)
  for rank in 0 1 2; do
    LOOM_TEST_KILL_RANK=1 LOCAL_RANK=$rank WORLD_SIZE=3 LOOM_RENDEZVOUS_DIR=$dir \
      timeout 60 "$WORKER" allreduce_loop 0 "$MARK" > "$WORK/kill$trial.$rank" 2>&1 &
  done
  wait
  rm -rf "$dir"
  for rank in 0 2; do
    line=$(grep "caught after" "$WORK/kill$trial.$rank" || true)
    seconds=$(echo "$line" | sed -n 's/.*caught after \([0-9.]*\) s.*/\1/p')
    if [ -n "$seconds" ] && awk -v s="$seconds" 'BEGIN { exit !(s < 5) }' && echo "$line" | grep -q "rank 1 (pid"; then
      pass "trial $trial: rank $rank raised after ${seconds} s naming rank 1"
    else
      fail "trial $trial: rank $rank: $(cat "$WORK/kill$trial.$rank")"
    fi
  done
  trial=$((trial + 1))
done

# fabric.launch() started 3 ranks itself and one is killed: rank 0 ends the
# others and exits with the dead rank's status, naming it.
start=$(date +%s%N)
status=0
timeout 60 "$WORKER" launch_kill 3 "$MARK" > "$WORK/launch_kill" 2>&1 || status=$?
took=$(elapsed_ms "$start")
if [ $status -eq 137 ]; then
  pass "launch(): the job exits with the killed rank's status (137) in $took ms"
else
  fail "launch(): exit status $status after $took ms: $(cat "$WORK/launch_kill")"
fi
expect_contains "$WORK/launch_kill" "loom: local rank 2" "launch(): the dead rank is named"
expect_no_leftovers "after a rank of launch() died"

# A live rank that stops taking part: the others time out (2 s here).
dir=$(mktemp -d)
for rank in 0 1; do
  LOOM_TEST_TIMEOUT_MS=2000 LOCAL_RANK=$rank WORLD_SIZE=2 LOOM_RENDEZVOUS_DIR=$dir \
    timeout 60 "$WORKER" hang 0 "$MARK" > "$WORK/hang.$rank" 2>&1 &
done
# Until rank 0 names the timeout (a slow start, under a sanitizer say, takes
# more than a fixed wait), at most 50 s; then the silent rank is ended.
for _ in $(seq 1 250); do
  if grep -q "no answer within" "$WORK/hang.0"; then break; fi
  sleep 0.2
done
pkill -f "hang 0 $MARK" || true
wait
rm -rf "$dir"
expect_contains "$WORK/hang.0" "no answer within the timeout of 2000 ms" "a silent rank becomes a timeout error"

# TCPStore path: the port is taken.
port=$(free_port)
/usr/bin/python3 -c "import socket, time; s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(('0.0.0.0', $port)); s.listen(); time.sleep(30)" "$MARK" &
holder=$!
sleep 0.5
LOOM_TEST_TIMEOUT_MS=3000 LOCAL_RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
  timeout 30 "$WORKER" rendezvous 0 "$MARK" > "$WORK/inuse" 2>&1 && fail "rendezvous on a port in use exited 0"
expect_contains "$WORK/inuse" "cannot host the rendezvous store on port $port: the port is already in use" "port in use"
kill "$holder" 2>/dev/null || true

# TCPStore path: nothing answers at the main address; the error comes within the timeout.
port=$(free_port)
start=$(date +%s%N)
LOOM_TEST_TIMEOUT_MS=3000 LOCAL_RANK=1 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
  timeout 30 "$WORKER" rendezvous 0 "$MARK" > "$WORK/unreachable" 2>&1 && fail "rendezvous with nothing to reach exited 0"
took=$(elapsed_ms "$start")
expect_contains "$WORK/unreachable" "cannot reach the rendezvous store at 127.0.0.1:$port within 3000 ms" "main address unreachable"
if [ "$took" -lt 8000 ]; then pass "the unreachable error came in $took ms (timeout 3000 ms)"; else fail "it took $took ms"; fi
wait
expect_no_leftovers "faults"
finish
