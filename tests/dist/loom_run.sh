#!/bin/sh
# loom-run itself: what it starts, what it exports, how it refuses bad flags,
# and how a job ends when one rank is killed.
set -eu
# shellcheck source=tests/dist/common.sh
. "$(dirname "$0")/common.sh"

# --devices 2 runs the command twice, with LOCAL_RANK 0 and 1, and the variables.
"$LOOM_RUN" --accelerator cpu --strategy parallel --devices 2 --precision bf16-mixed \
  sh -c 'echo "rank=$LOCAL_RANK world=$WORLD_SIZE node=$NODE_RANK cli=$LT_CLI_USED acc=$LT_ACCELERATOR strategy=$LT_STRATEGY devices=$LT_DEVICES nodes=$LT_NUM_NODES precision=$LT_PRECISION addr=$MASTER_ADDR port=$MASTER_PORT omp=${OMP_NUM_THREADS:+set}"; test -d "$LOOM_RENDEZVOUS_DIR" && stat -c "%a" "$LOOM_RENDEZVOUS_DIR"' "$MARK" \
  > "$WORK/run" 2>&1 || fail "loom-run exited $?"
for rank in 0 1; do
  expect_contains "$WORK/run" "rank=$rank world=2 node=0 cli=1 acc=cpu strategy=parallel devices=2 nodes=1 precision=bf16-mixed addr=127.0.0.1 port=29400 omp=set" "rank $rank started with the exported variables"
done
if [ "$(grep -c '^700$' "$WORK/run")" -eq 2 ]; then
  pass "the rendezvous directory is private (0700)"
else
  fail "rendezvous directory mode: $(cat "$WORK/run")"
fi
if [ "$(grep -c '^rank=' "$WORK/run")" -eq 2 ]; then pass "exactly two processes"; else fail "process count"; fi

# Everything after the program is the program's, even what looks like a loom-run flag.
"$LOOM_RUN" --devices 1 sh -c 'echo "args: $*"' zero --devices 7 --strategy x > "$WORK/args" 2>&1
expect_contains "$WORK/args" "args: --devices 7 --strategy x" "the program's arguments pass through untouched"

# Bad values are refused before anything starts, with what is accepted.
"$LOOM_RUN" --strategy no_such_strategy --devices 1 touch "$WORK/started" > "$WORK/bad" 2>&1 && fail "unknown strategy accepted"
if [ ! -e "$WORK/started" ]; then pass "nothing started for an unknown strategy"; else fail "the program started"; fi
expect_contains "$WORK/bad" "Available: single_device, parallel" "the error lists the available strategies"
expect_contains "$WORK/bad" "ddp" "the available strategies include ddp"
# Combinations go through the connector (the one make_fabric uses) before anything starts.
"$LOOM_RUN" --strategy single_device --devices 2 touch "$WORK/started" > "$WORK/combo" 2>&1 && fail "single_device x2 accepted"
if [ ! -e "$WORK/started" ]; then pass "nothing started for single_device on 2 devices"; else fail "the program started"; fi
expect_contains "$WORK/combo" "runs one process on one device" "the connector's sentence is shown"
"$LOOM_RUN" --precision 16-true true > "$WORK/half" 2>&1 && fail "16-true on cpu accepted"
expect_contains "$WORK/half" "no fp16 matmul" "16-true on cpu is refused with the reason"
"$LOOM_RUN" --precision 16-mixed true > "$WORK/fallback" 2>&1 || fail "16-mixed on cpu refused"
expect_contains "$WORK/fallback" "Using precision='bf16-mixed' instead" "16-mixed on cpu warns that it falls back"
"$LOOM_RUN" --strategy ddp_spawn true > "$WORK/spawn" 2>&1 && fail "ddp_spawn accepted"
expect_contains "$WORK/spawn" "no C++ meaning: use ddp" "ddp_spawn is refused, pointing to ddp"
"$LOOM_RUN" --precision 17 true > "$WORK/precision" 2>&1 && fail "precision 17 accepted"
expect_contains "$WORK/precision" "bf16-mixed" "a bad precision lists the accepted ones"
"$LOOM_RUN" --accelerator cpu --devices 0,1 true > "$WORK/devices" 2>&1 && fail "cpu index list accepted"
expect_contains "$WORK/devices" "counted, not selected by index" "cpu devices must be a count"
"$LOOM_RUN" --num-nodes 2 --node-rank 2 true > "$WORK/node" 2>&1 && fail "node rank 2 of 2 accepted"
expect_contains "$WORK/node" "is not below --num-nodes" "node rank out of range"
"$LOOM_RUN" --help > "$WORK/help" 2>&1
for flag in --accelerator --strategy --devices --num-nodes --num_nodes --node-rank --node_rank --main-address \
            --main_address --main-port --main_port --precision; do
  grep -q -- "$flag" "$WORK/help" || fail "--help does not list $flag"
done
pass "--help lists every flag in both spellings"

# kill -9 of one rank ends the job, non-zero, within 15 s, with nothing left.
start=$(date +%s%N)
status=0
timeout 60 "$LOOM_RUN" --devices 2 sh -c 'if [ "$LOCAL_RANK" = 1 ]; then sleep 0.5; kill -9 $$; fi; sleep 60' "$MARK" \
  > "$WORK/kill" 2>&1 || status=$?
took=$(elapsed_ms "$start")
if [ $status -ne 0 ] && [ $status -ne 124 ]; then pass "job ended non-zero ($status) after a kill -9"; else fail "exit status $status"; fi
if [ "$took" -lt 15000 ]; then pass "it ended within 15 s ($took ms)"; else fail "it took $took ms"; fi
expect_contains "$WORK/kill" "local rank 1" "the failing rank is named"
expect_contains "$WORK/kill" "killed by signal 9" "its signal is named"
expect_no_leftovers "after kill -9"

# SIGTERM to loom-run reaches every rank.
"$LOOM_RUN" --devices 2 sh -c 'trap "echo got-term-$LOCAL_RANK; exit 0" TERM; sleep 60 & wait' "$MARK" > "$WORK/term" 2>&1 &
launcher=$!
sleep 0.5
kill -TERM $launcher
wait $launcher || true
expect_contains "$WORK/term" "got-term-0" "SIGTERM reached rank 0"
expect_contains "$WORK/term" "got-term-1" "SIGTERM reached rank 1"
expect_no_leftovers "after SIGTERM"
finish
