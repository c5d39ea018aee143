#!/bin/sh
# During a 2-rank single-node job, no loom process listens on a non-loopback
# address, and every connection it has is on loopback: the FileStore
# rendezvous opens no socket, Gloo binds 127.0.0.1. Sockets are sampled with
# ss for the whole life of the job. As a control, the same check must flag a
# job that rendezvouses through TCPStore (two simulated nodes), which in
# LibTorch 1.13 listens on every interface.
set -eu
# shellcheck source=tests/dist/common.sh
. "$(dirname "$0")/common.sh"

# watch_job OUTPUT: samples the sockets of processes carrying $MARK until none is left.
watch_job() {
  : > "$1"
  samples=0
  while pgrep -f "$MARK" > "$WORK/pids" 2>/dev/null; do
    ss -tanpH > "$WORK/ss" 2>/dev/null || true
    while read -r pid; do grep "pid=$pid," "$WORK/ss" || true; done < "$WORK/pids" >> "$1"
    samples=$((samples + 1))
    sleep 0.05
  done
  echo "$samples" > "$1.samples"
}

# not_loopback SOCKETS: prints the sockets with a non-loopback local or peer address.
not_loopback() {
  awk '{ local = $4; peer = $5;
         loop_local = (local ~ /^127\./ || local ~ /^\[::1\]/ || local ~ /^\[::ffff:127\./);
         loop_peer = (peer ~ /^127\./ || peer ~ /^\[::1\]/ || peer ~ /^\[::ffff:127\./ || peer ~ /^(0\.0\.0\.0|\[::\]|\*):\*/);
         if ($1 == "LISTEN") { if (!loop_local) print } else if (!loop_local || !loop_peer) print }' "$1"
}

"$LOOM_RUN" --devices 2 "$WORKER" listen_check 0 "$MARK" > "$WORK/job" 2>&1 &
watch_job "$WORK/sockets"
wait $! || fail "the single-node job exited $?: $(cat "$WORK/job")"
seen=$(wc -l < "$WORK/sockets")
bad=$(not_loopback "$WORK/sockets")
if [ "$seen" -gt 0 ]; then
  pass "$seen socket observations over $(cat "$WORK/sockets.samples") samples of the single-node job"
else
  fail "no socket of the job was seen"
fi
if [ -z "$bad" ]; then
  pass "single node: every socket on loopback, nothing listens elsewhere"
else
  fail "single node: sockets off loopback: $bad"
fi

# Control: the TCPStore path is seen listening on every interface.
port=$(free_port)
for node in 0 1; do
  "$LOOM_RUN" --num-nodes 2 --node-rank $node --devices 1 --main-port "$port" "$WORKER" listen_check 0 "$MARK" \
    > "$WORK/node$node" 2>&1 &
done
watch_job "$WORK/tcp_sockets"
wait
if not_loopback "$WORK/tcp_sockets" | grep -q "LISTEN"; then
  pass "control: the TCPStore rendezvous is seen listening off loopback"
else
  fail "control: the check did not see TCPStore's listener ($(wc -l < "$WORK/tcp_sockets") observations)"
fi
finish
