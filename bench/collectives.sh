#!/bin/sh
# bench/collectives.sh BUILD_DIR [ROUNDS] [CALLS]: loom's reduce_scatter_into and
# all_gather_into against a same-size all_reduce, Gloo on loopback, 4 and 2
# ranks under loom-run. The last line is the 2-rank figure at 16 MiB:
#   reduce_scatter_vs_allreduce=R all_gather_vs_allreduce=G
set -eu
build=${1:-build}
# shellcheck source=bench/common.sh
. "$(dirname "$0")/common.sh"
build_bench "$build" collectives_bench
rounds=${2:-3}
calls=${3:-20}
export OMP_NUM_THREADS=1
"$build/tools/loom-run" --accelerator cpu --devices 4 "$build/bench/collectives_bench" "$rounds" "$calls"
echo
"$build/tools/loom-run" --accelerator cpu --devices 2 "$build/bench/collectives_bench" "$rounds" "$calls" > "${TMPDIR:-/tmp}/loom-collectives.$$"
cat "${TMPDIR:-/tmp}/loom-collectives.$$"
last=$(tail -n 1 "${TMPDIR:-/tmp}/loom-collectives.$$")
rm -f "${TMPDIR:-/tmp}/loom-collectives.$$"
echo "${last#ranks=2 }"
