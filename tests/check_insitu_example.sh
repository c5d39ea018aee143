#!/bin/sh
# check_insitu_example.sh EXAMPLE [ARGS...]: examples/insitu_heat (with ARGS)
# under mpirun -n 2 keeps its promise: the last line is
# surrogate_rel_error=X persistence_rel_error=Y with X <= 0.5 Y, within 3
# minutes. CI runs it on half the training trajectory (examples/meson.build);
# bench/examples_at_defaults.sh at its defaults.
set -eu
example=$(realpath "$1")
shift
out=$(mktemp)
trap 'rm -f "$out"' EXIT
start=$(date +%s)
status=0
timeout 240 mpirun --allow-run-as-root --oversubscribe -n 2 "$example" "$@" > "$out" 2>&1 || status=$?
took=$(( $(date +%s) - start ))
cat "$out"
last=$(tail -n 1 "$out")
x=$(echo "$last" | sed -n 's/^surrogate_rel_error=\([0-9.]*\) persistence_rel_error=[0-9.]*$/\1/p')
y=$(echo "$last" | sed -n 's/^surrogate_rel_error=[0-9.]* persistence_rel_error=\([0-9.]*\)$/\1/p')
if [ $status -eq 0 ] && [ -n "$x" ] && [ -n "$y" ] && awk -v x="$x" -v y="$y" 'BEGIN { exit !(x <= 0.5 * y) }' &&
  [ "$took" -lt 180 ]; then
  echo "ok: surrogate_rel_error $x <= 0.5 x persistence_rel_error $y, in $took s"
  exit 0
fi
echo "FAIL: exit $status after $took s; last line: $last"
exit 1
