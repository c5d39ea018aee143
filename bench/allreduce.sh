#!/bin/sh
# bench/allreduce.sh BUILD_DIR: loom's all_reduce vs raw c10d on 2 ranks (Gloo, loopback);
# then, with MPI built, loom's MPI group vs its Gloo group (last line
# mpi_vs_gloo_1MiB=R mpi_vs_gloo_16MiB=S mpi_vs_gloo_64MiB=T).
set -eu
build=${1:-build}
# shellcheck source=bench/common.sh
. "$(dirname "$0")/common.sh"
build_bench "$build" allreduce_bench
OMP_NUM_THREADS=1 "$build/tools/loom-run" --accelerator cpu --devices 2 "$build/bench/allreduce_bench"
# loom's MPI process group against its Gloo one, when this build has MPI.
if has_bench "$build" mpi_allreduce_bench; then
  build_bench "$build" mpi_allreduce_bench
  echo
  OMP_NUM_THREADS=1 mpirun --allow-run-as-root --oversubscribe -n 2 "$build/bench/mpi_allreduce_bench"
fi
