#!/bin/sh
# tests/sanitize.sh BUILD_DIR [asan|tsan|all]
# loom under the sanitizers, outside CI (a run takes longer than CI allows):
# - BUILD_DIR/asan: -Db_sanitize=address,undefined; the unit tests and the
#   multi-process tests of ddp, fsdp, deepspeed (zero), model_parallel (tp),
#   the watchdog, MPI, loom's collectives and comm/;
# - BUILD_DIR/tsan: -Db_sanitize=thread, OMP_NUM_THREADS=1; the tests that
#   start loom's threads: the MPI progress thread (dist_mpi), the watchdog
#   (dist_watchdog), the pairwise exchange hook (dist_ddp, the watchdog's
#   count), dp's replicas (the contract tests) and the NVMe stream (dist_zero).
# LibTorch, Gloo and Open MPI are not instrumented. What ASan and UBSan
# suppress, and why each entry is theirs and not loom's:
# tests/sanitizers/*.supp; ThreadSanitizer's reports are split by one rule
# (tests/sanitizers/tsan_reports.py: a report with a loom frame is loom's)
# instead of a suppression list. Every
# build is configured once and rebuilt incrementally. Prints one line per
# run and exits non-zero when any test failed or any sanitizer reported.
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
base=$1
which=${2:-all}
supp="$root/tests/sanitizers"
status=0

# build DIR SANITIZERS: configures DIR (once) and builds what the tests run.
build() {
  if [ ! -f "$1/build.ninja" ]; then
    meson setup "$1" "$root" -Db_sanitize="$2" -Db_lundef=false -Dbuildtype=debugoptimized \
      -Dexamples=false -Dbenchmarks=false > "$1.setup.log" 2>&1 ||
      { tail -n 30 "$1.setup.log"; exit 1; }
  fi
  meson compile -C "$1" > "$1.compile.log" 2>&1 || { grep -E 'error|FAILED' "$1.compile.log" | head -n 30; exit 1; }
}

# run NAME DIR TESTS...: meson test in DIR with the sanitizer options set
# by the caller; the reports land in the test logs (log_path below).
run() {
  name=$1 dir=$2
  shift 2
  start=$(date +%s)
  result=0
  meson test -C "$dir" --no-rebuild --print-errorlogs "$@" > "$dir/sanitize-$name.log" 2>&1 || result=$?
  reports=$(grep -c -E '^(==[0-9]+==ERROR: |SUMMARY: (Address|Undefined|Thread|Leak)Sanitizer|.*runtime error: |WARNING: ThreadSanitizer)' \
    "$dir/meson-logs/testlog.txt" || true)
  echo "$name: $(grep -E '^Ok:|^Fail:' "$dir/sanitize-$name.log" | tr -s ' ' | tr '\n' ' ')sanitizer reports: $reports, $(( $(date +%s) - start )) s (log: $dir/meson-logs/testlog.txt)"
  if [ "$result" -ne 0 ] || [ "$reports" -ne 0 ]; then status=1; fi
}

if [ "$which" = asan ] || [ "$which" = all ]; then
  build "$base/asan" address,undefined
  # LibTorch's own allocations that live until exit are leaks to LSan
  # (lsan.supp); UBSan stops at the first report, with its stack.
  ASAN_OPTIONS="halt_on_error=1:abort_on_error=1:detect_leaks=1:detect_stack_use_after_return=1:strict_init_order=1:check_initialization_order=1" \
  LSAN_OPTIONS="suppressions=$supp/lsan.supp:print_suppressions=0" \
  UBSAN_OPTIONS="halt_on_error=1:abort_on_error=1:print_stacktrace=1:suppressions=$supp/ubsan.supp" \
  OMP_NUM_THREADS=1 \
    run asan "$base/asan" --suite unit dist_ddp dist_fsdp dist_zero dist_tp dist_watchdog dist_mpi dist_collectives \
      dist_comm dist_faults
fi

if [ "$which" = tsan ] || [ "$which" = all ]; then
  build "$base/tsan" thread
  # Every process writes its reports to a file; tsan_reports.py applies the
  # rule (a report with a loom frame is loom's, always) instead of a
  # suppression list, so nothing of loom's can be suppressed.
  reports="$base/tsan/reports"
  rm -rf "$reports"
  mkdir -p "$reports"
  TSAN_OPTIONS="halt_on_error=0:exitcode=0:second_deadlock_stack=1:log_path=$reports/tsan" \
  OMP_NUM_THREADS=1 \
    run tsan "$base/tsan" contract dist_ddp dist_zero dist_watchdog dist_mpi
  set -- "$reports"/tsan.*
  if [ -e "$1" ]; then
    /usr/bin/python3 "$supp/tsan_reports.py" "$root" "$@" > "$base/tsan/reports.txt" || status=1
  else
    echo "tsan_reports: 0 report(s), 0 with a loom frame" > "$base/tsan/reports.txt"
  fi
  tail -n 5 "$base/tsan/reports.txt"
fi
exit $status
