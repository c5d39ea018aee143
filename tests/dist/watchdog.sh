#!/bin/sh
# The collective watchdog (src/comm/watchdog.cpp), with real processes:
# - DDP's Reducer all-reduces are recorded, one entry each (count);
# - kill -STOP of a rank mid-training (alive but stuck) ends the job within
#   collective_timeout (3 s) + 5 s with that rank named, under loom-run
#   (LOOM_WATCHDOG_TRIALS trials, 3 ranks, the stopped one SIGKILLed),
#   torchrun and mpirun (the MPI group: records over MPI, MPI_Abort);
# - a rank stopped inside a collective every rank has entered (the records
#   agree) is told from a long collective by its heartbeat, which stops;
# - a rank that broadcasts where the other all-reduces is reported as a
#   desync naming both ops, by the watchdog or, when the group's timeout
#   fails the collective first, by the peer_error; an all-reduce of another
#   size (which Gloo ends with std::terminate) names both shapes;
# - slow is not stuck: one rank sleeping 1.2 s before every step, so that
#   the others wait >= 1 s in each, for LOOM_WATCHDOG_SLOW_SECONDS, raises
#   no alarm. The torchrun case waits out its launcher's teardown (30 s) while
#   the slow run goes on.
# Arguments: dist_worker (unused) loom-run watchdog_worker torchrun mpi|no-mpi
# Without python3-torch (torchrun) or MPI those parts are skipped, and the
# test reports SKIP.
set -eu
# shellcheck source=tests/dist/common.sh
. "$(dirname "$0")/common.sh"
WATCHDOG=$(realpath "$3")
TORCHRUN=$(realpath "$4")
WITH_MPI=$5
TRIALS=${LOOM_WATCHDOG_TRIALS:-3}
SLOW_SECONDS=${LOOM_WATCHDOG_SLOW_SECONDS:-60}
export LOOM_TEST_COLLECTIVE_S=3
BOUND_MS=8000  # collective_timeout + 5 s

"$LOOM_RUN" --devices 2 "$WATCHDOG" count "$MARK" > "$WORK/count" 2>&1 ||
  fail "count: exit $?"
expect_contains "$WORK/count" "watchdog count: world_size=2 all checks passed" \
  "DDP's Reducer all-reduces (and the pairwise exchange) are recorded one entry each, and the user's collectives"
sed -n 's/^watchdog count: pairwise/  pairwise/p' "$WORK/count"

# wait_started FILE N [WORD]: until N ranks printed WORD (training) at the
# end of a line (10 s at most).
wait_started() {
  set -- "$1" "$2" "${3:-training}"
  for _ in $(seq 1 200); do
    started=$(grep -c " $3\$" "$1" 2>/dev/null) || true
    if [ "${started:-0}" -ge "$2" ]; then return 0; fi
    sleep 0.05
  done
  return 1
}

# wait_bounded PID MS: waits for PID (a child of this shell) at most MS
# milliseconds longer than the bound; sets status and elapsed (since $start).
wait_bounded() {
  for _ in $(seq 1 $(( ($2 + 5000) / 50 ))); do
    kill -0 "$1" 2>/dev/null || break
    sleep 0.05
  done
  kill -9 "$1" 2>/dev/null || true
  status=0
  wait "$1" || status=$?
  elapsed=$(elapsed_ms "$start")
}

# stopped_rank_check WHAT OUT VICTIM LIVE BOUND_MS: the job ended non-zero
# within the bound, LIVE ranks printed a message naming rank 1, the victim
# is gone.
stopped_rank_check() {
  named=$(grep -c "^loom watchdog.* rank 1 (" "$2" || true)
  # mpirun returns while its runtime is still killing the ranks.
  for _ in $(seq 1 60); do kill -0 "$3" 2>/dev/null || break; sleep 0.05; done
  if [ "$status" -ne 0 ] && [ "$elapsed" -lt "$5" ] && [ "$named" -ge "$4" ] && ! kill -0 "$3" 2>/dev/null; then
    pass "$1: the job ended in $elapsed ms (exit $status), $named ranks printed the message naming rank 1"
  else
    fail "$1: exit $status after $elapsed ms, $named messages naming rank 1, victim $3 $(kill -0 "$3" 2>/dev/null && echo alive || echo gone):"
    sed 's/^/    /' "$2" | head -n 30
    kill -9 "$3" 2>/dev/null || true
  fi
}

# stop_rank_start NAME RANKS PAUSE -- LAUNCHER...: starts RANKS ranks of
# `train` under LAUNCHER and stops rank 1 PAUSE seconds after all train. The
# job's exit status and the time it ended go to $WORK/NAME.status and
# $WORK/NAME.end, so that a job whose launcher takes long to tear down (
# torchrun) can be checked later, while other cases run.
stop_rank_start() {
  name=$1 ranks=$2 pause=$3
  shift 4
  out="$WORK/$name"
  ( job=0; "$@" "$WATCHDOG" train "$MARK" > "$out" 2>&1 || job=$?; echo "$job" > "$out.status"; date +%s%N > "$out.end" ) &
  echo $! > "$out.launcher"
  victim=""
  if wait_started "$out" "$ranks"; then
    sleep "$pause"
    victim=$(sed -n 's/^rank 1 pid \([0-9]*\) training$/\1/p' "$out")
    if [ -n "$victim" ]; then kill -STOP "$victim"; fi
  fi
  echo "$victim" > "$out.victim"
  date +%s%N > "$out.start"
}

# stop_rank_finish NAME BOUND_MS RANKS WHAT: the job stop_rank_start began
# ended within BOUND_MS of the stop (waiting at most 5 s past it), with rank 1
# named by every live rank; then nothing of the test is left running.
stop_rank_finish() {
  name=$1 bound=$2 ranks=$3 what=$4
  out="$WORK/$name"
  launcher=$(cat "$out.launcher") victim=$(cat "$out.victim") start=$(cat "$out.start")
  if [ -n "$victim" ]; then
    while [ ! -e "$out.end" ] && [ "$(elapsed_ms "$start")" -lt $((bound + 5000)) ]; do sleep 0.05; done
    if [ -e "$out.end" ]; then
      status=$(cat "$out.status")
      elapsed=$(( ($(cat "$out.end") - start) / 1000000 ))
    else
      status=124 elapsed=$(elapsed_ms "$start")
    fi
    stopped_rank_check "$what" "$out" "$victim" $((ranks - 1)) "$bound"
  else
    fail "$name: the ranks did not start"; sed 's/^/    /' "$out" | head -n 20
  fi
  pkill -9 -f "$WATCHDOG train $MARK" 2>/dev/null || true
  wait "$launcher" 2>/dev/null || true
}

# stop_rank_under NAME BOUND_MS RANKS PAUSE WHAT -- LAUNCHER...: both at once.
stop_rank_under() {
  name=$1 bound=$2 ranks=$3 pause=$4 what=$5
  shift 6
  stop_rank_start "$name" "$ranks" "$pause" -- "$@"
  stop_rank_finish "$name" "$bound" "$ranks" "$what"
}

# Under loom-run, 3 ranks: rank 1 is stopped at a different moment each trial.
for trial in $(seq 1 "$TRIALS"); do
  stop_rank_under "stuck_$trial" "$BOUND_MS" 3 "0.$(( (trial * 37) % 10 ))" \
    "kill -STOP of rank 1 under loom-run, trial $trial of $TRIALS" -- "$LOOM_RUN" --devices 3
done
sed -n 's/^\(loom watchdog: .*\)/  message: \1/p' "$WORK/stuck_1" | head -n 1
sed -n 's/^\(loom-run: .*\)/  \1/p' "$WORK/stuck_1"
expect_no_leftovers "after the stopped-rank trials"

# Stopped inside a collective that every rank has entered: rank 1 stops
# itself 1 s into an all_reduce that rank 0 joins 2 s late. The records
# agree (everyone is in it, as in a long collective); rank 1's heartbeat,
# which stops with its process, is what names it.
out="$WORK/stopped_inside"
"$LOOM_RUN" --devices 3 "$WATCHDOG" stopped_inside "$MARK" > "$out" 2>&1 &
launcher=$!
if wait_started "$out" 3 ready; then
  start=$(date +%s%N)
  wait_bounded "$launcher" $((BOUND_MS + 1000))
  victim=$(sed -n 's/^rank 1 pid \([0-9]*\) ready$/\1/p' "$out")
  stopped_rank_check "rank 1 stopped inside an all_reduce every rank entered (1 s after ready)" "$out" "$victim" 2 \
    $((BOUND_MS + 1000))
  grep -q "is stopped or hung inside it" "$out" || fail "stopped inside: the message does not say so"
  sed -n 's/^\(loom watchdog: .*\)/  message: \1/p' "$out" | head -n 1
else
  fail "stopped_inside: the ranks did not start"; sed 's/^/    /' "$out" | head -n 20
fi
pkill -9 -f "$WATCHDOG stopped_inside $MARK" 2>/dev/null || true
wait "$launcher" 2>/dev/null || true
expect_no_leftovers "after the rank stopped inside a collective"

# A stopped rank 0 stops the TCP rendezvous store it serves (processes
# started by hand, MASTER_ADDR/MASTER_PORT): the records cannot meet, and
# the live rank ends on its own, naming rank 0 as the unanswering host. No
# launcher here, so the test ends the stopped rank itself.
port=$(free_port)
out="$WORK/store_host"
LOCAL_RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port "$WATCHDOG" train "$MARK" >> "$out" 2>&1 &
rank_0=$!
LOCAL_RANK=1 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port "$WATCHDOG" train "$MARK" >> "$out" 2>&1 &
rank_1=$!
if wait_started "$out" 2; then
  sleep 0.3
  kill -STOP "$rank_0"
  start=$(date +%s%N)
  wait_bounded "$rank_1" "$BOUND_MS"
  if [ "$status" -eq 70 ] && [ "$elapsed" -lt "$BOUND_MS" ] &&
    grep -q "^loom watchdog: rank 1 has waited .*, and rank 0, which hosts the rendezvous store, has not answered" "$out"; then
    pass "kill -STOP of rank 0, which serves the TCP store: rank 1 ended in $elapsed ms (exit 70) naming rank 0"
  else
    fail "kill -STOP of rank 0 (TCP store): rank 1 exit $status after $elapsed ms:"; sed 's/^/    /' "$out" | head -n 20
  fi
else
  fail "store_host: the ranks did not start"; sed 's/^/    /' "$out" | head -n 20
fi
kill -9 "$rank_0" "$rank_1" 2>/dev/null || true
wait "$rank_0" 2>/dev/null || true
expect_no_leftovers "after the stopped store host"

# The MPI group has no store: the records travel over a duplicated
# communicator, and the job ends with MPI_Abort.
if [ "$WITH_MPI" = mpi ]; then
  stop_rank_under mpirun "$BOUND_MS" 2 0.3 "kill -STOP of rank 1 under mpirun, on the MPI group (MPI_Abort ends the job)" -- \
    mpirun --allow-run-as-root --oversubscribe -x LOOM_TEST_BACKEND=mpi -x LOOM_TEST_COLLECTIVE_S \
    -x MASTER_ADDR=192.0.2.1 -x MASTER_PORT=9 -n 2
else
  skip "kill -STOP under mpirun on the MPI group: this build has no MPI"
fi

# Desynchronised collectives: both ops named, every rank ends.
start=$(date +%s%N)
status=0
timeout 60 "$LOOM_RUN" --devices 2 "$WATCHDOG" desync "$MARK" > "$WORK/desync" 2>&1 || status=$?
took=$(elapsed_ms "$start")
if [ $status -ne 0 ] && grep -q "desynchronised collectives in group 'world' (2 ranks): at collective #" "$WORK/desync" &&
  grep -q "entered broadcast(Float\[4\])" "$WORK/desync" && grep -q "entered all_reduce(Float\[4\])" "$WORK/desync"; then
  pass "broadcast against all_reduce is reported as a desync naming both, in $took ms (exit $status)"
  sed -n 's/^\(loom watchdog: .*\)/  message: \1/p; s/^\(dist.*desynchronised.*\)/  error: \1/p' "$WORK/desync" | head -n 2
else
  fail "desync: exit $status after $took ms:"; sed 's/^/    /' "$WORK/desync" | head -n 30
fi

# When the group's own timeout (2 s) fails the mismatched collective before
# the watchdog speaks (60 s), the error path names the desync the same way.
status=0
LOOM_TEST_GROUP_TIMEOUT_MS=2000 LOOM_TEST_COLLECTIVE_S=60 \
  timeout 60 "$LOOM_RUN" --devices 2 "$WATCHDOG" desync "$MARK" > "$WORK/desync_error" 2>&1 || status=$?
expect_contains "$WORK/desync_error" "the collective failed: desynchronised collectives in group 'world' (2 ranks): at collective #1" \
  "a desync that fails in Gloo (its timeout) raises a peer_error that starts with the desync sentence (exit $status)"

# Same op, different sizes: Gloo's I/O thread fails its size check and the
# exception ends the process through std::terminate; loom's handler names
# the desync first (both shapes) and ends with the watchdog's status.
start=$(date +%s%N)
status=0
LOOM_TEST_DESYNC=shape timeout 60 "$LOOM_RUN" --devices 2 "$WATCHDOG" desync "$MARK" > "$WORK/desync_shape" 2>&1 || status=$?
took=$(elapsed_ms "$start")
if [ $status -eq 70 ] && grep -q "^loom watchdog (Gloo ended this rank on a size mismatch): desynchronised collectives in group 'world' (2 ranks): at collective #1" "$WORK/desync_shape" &&
  grep -q "entered all_reduce(Float\[4\])" "$WORK/desync_shape" && grep -q "entered all_reduce(Float\[4096\])" "$WORK/desync_shape"; then
  pass "all_reduce of 4 against 4096 floats (Gloo's abort) is reported as a desync naming both shapes, in $took ms (exit 70)"
else
  fail "size mismatch: exit $status after $took ms:"; sed 's/^/    /' "$WORK/desync_shape" | head -n 30
fi

# The same under torchrun: its own teardown ends the stopped rank (SIGTERM
# stays pending on a stopped process; torchrun sends SIGKILL after its 30 s
# grace), so its bound is longer. That grace is idle waiting: the slow run
# below goes on meanwhile, and the job is checked after it.
if torchrun_usable; then
  stop_rank_start torchrun 2 0.3 -- "$TORCHRUN" --standalone --nproc_per_node 2 --no_python
else
  skip "kill -STOP under torchrun: /usr/bin/python3 cannot import torch.distributed.run (install python3-torch)"
fi

# Slow is not stuck.
status=0
LOOM_TEST_SECONDS=$SLOW_SECONDS LOOM_TEST_SLOW_RANK=1 LOOM_TEST_SLOW_MS=1200 \
  timeout $((SLOW_SECONDS + 120)) "$LOOM_RUN" --devices 2 "$WATCHDOG" train "$MARK" > "$WORK/slow" 2>&1 || status=$?
if [ $status -eq 0 ] && ! grep -q "loom watchdog" "$WORK/slow"; then
  pass "no false alarm: $SLOW_SECONDS s of DDP with one rank 1.2 s late every step (collective_timeout 3 s): $(sed -n 's/^rank 0: \(.*\), done$/\1/p' "$WORK/slow")"
else
  fail "slow run: exit $status:"; sed 's/^/    /' "$WORK/slow" | head -n 30
fi
if torchrun_usable; then
  stop_rank_finish torchrun 45000 2 "kill -STOP of rank 1 under torchrun (its teardown kills the stopped rank)"
fi
expect_no_leftovers "watchdog"
finish
