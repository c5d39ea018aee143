#!/bin/sh
# bench/allreduce.sh BUILD_DIR: loom's all_reduce vs raw c10d on 2 ranks (Gloo, loopback).
set -eu
build=${1:-build}
OMP_NUM_THREADS=1 exec "$build/tools/loom-run" --accelerator cpu --devices 2 "$build/bench/allreduce_bench"
