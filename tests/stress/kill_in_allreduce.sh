#!/bin/sh
# Stress: 20 trials (or $3) of kill -9 of a rank inside an all_reduce.
#   tests/stress/kill_in_allreduce.sh build/tests/dist_worker build/tools/loom-run 20
set -eu
exec "$(dirname "$0")/../dist/faults.sh" "$1" "$2" "${3:-20}"
