# shellcheck shell=sh
# Sourced by the bench scripts. bench/'s programs are not built by default
# (meson test needs none but loom_bench): build_bench BUILD_DIR NAME...
# builds what a script runs first, its output on stderr so that a script's
# last lines stay its own.
set -eu

build_bench() {
  bench_build_dir=$1
  shift
  for bench_name in "$@"; do
    meson compile -C "$bench_build_dir" "bench/$bench_name" >&2 ||
      { echo "cannot build bench/$bench_name in $bench_build_dir (configured with -Dbenchmarks=true?)" >&2; exit 1; }
  done
}
