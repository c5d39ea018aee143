#!/bin/sh
# tests/sanitize.sh BUILD_DIR [asan|tsan|all]
# loom under the sanitizers, outside CI (the builds alone take longer than
# CI's budget allows; times in tests/sanitizers/README.md):
# - BUILD_DIR/asan: -Db_sanitize=address,undefined; three runs: the unit
#   tests, the multi-process tests of ddp, fsdp, deepspeed (zero),
#   model_parallel (tp), the watchdog, loom's collectives, comm/ and the
#   fault tests, and MPI's (unwound slowly: see lsan.supp);
# - BUILD_DIR/tsan: -Db_sanitize=thread, OMP_NUM_THREADS=1; the tests that
#   start loom's threads: the MPI progress thread (dist_mpi), the watchdog
#   (dist_watchdog), the pairwise exchange hook (dist_ddp, the watchdog's
#   count), dp's replicas (the contract tests) and the NVMe stream (dist_zero).
# LibTorch, Gloo and Open MPI are not instrumented. What ASan and UBSan
# suppress, and why each entry is theirs and not loom's:
# tests/sanitizers/*.supp; ThreadSanitizer's reports are split by one rule
# (tests/sanitizers/tsan_reports.py: a report with a loom frame is loom's)
# instead of a suppression list. Every process, the workers of the
# multi-process tests included, writes its reports to BUILD_DIR/*/reports-RUN/.
# Each build is configured once and rebuilt incrementally. Prints one line
# per run and exits non-zero when any test failed or any sanitizer reported.
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

# run NAME DIR MESON_TEST_ARGS...: meson test in DIR with the sanitizer
# options set by the caller, each process writing its reports to
# DIR/reports-NAME/ (log_path): the multi-process tests' workers write theirs
# there too, where a test's own log would have lost them.
run() {
  name=$1 dir=$2
  shift 2
  start=$(date +%s)
  result=0
  meson test -C "$dir" --no-rebuild --print-errorlogs "$@" > "$dir/sanitize-$name.log" 2>&1 || result=$?
  cp "$dir/meson-logs/testlog.txt" "$dir/sanitize-$name.testlog.txt" 2>/dev/null || true
  ran=$(grep -c -E '^ *[0-9]+/[0-9]+ ' "$dir/sanitize-$name.log" || true)
  if [ "${ran:-0}" -eq 0 ]; then
    echo "$name: no test ran (meson test $*): see $dir/sanitize-$name.log"
    status=1
    return
  fi
  # The report files, and the tests' own output (UBSan inside an ASan build
  # writes to stderr whatever log_path says).
  found=$(cat "$dir/reports-$name"/* "$dir/sanitize-$name.testlog.txt" 2>/dev/null |
    grep -c -E '^(==[0-9]+==ERROR: |.*runtime error: |WARNING: ThreadSanitizer)' || true)
  echo "$name: $(grep -E '^Ok:|^Fail:|^Timeout:' "$dir/sanitize-$name.log" | tr -s ' ' | tr '\n' ' ')sanitizer reports: ${found:-0}, $(( $(date +%s) - start )) s (reports: $dir/reports-$name/)"
  # ThreadSanitizer's reports are judged by tsan_reports.py's rule instead.
  if [ "$result" -ne 0 ] || { [ "$name" != tsan ] && [ "${found:-0}" -ne 0 ]; }; then status=1; fi
}

# fresh_reports NAME DIR: the directory each process of run NAME writes its reports to.
fresh_reports() {
  rm -rf "$2/reports-$1"
  mkdir -p "$2/reports-$1"
  echo "$2/reports-$1"
}

if [ "$which" = asan ] || [ "$which" = all ]; then
  build "$base/asan" address,undefined
  # UBSan stops at the first report, with its stack. meson test takes either
  # suites or names (it runs their intersection), so the unit suite and the
  # multi-process tests are separate runs. Open MPI's leaks are suppressed by
  # library (lsan.supp; nothing of LibTorch's needed it), and only a full
  # unwind reaches its frames past the components MPI_Finalize unloads: the
  # MPI run unwinds slowly, the others fast.
  for part in unit dist mpi; do
    out=$(fresh_reports "asan-$part" "$base/asan")
    unwind=1
    case $part in
      unit) set -- --suite unit ;;
      dist) set -- dist_ddp dist_fsdp dist_zero dist_tp dist_watchdog dist_collectives dist_comm dist_faults ;;
      mpi) set -- dist_mpi; unwind=0 ;;
    esac
    ASAN_OPTIONS="halt_on_error=1:abort_on_error=1:detect_leaks=1:detect_stack_use_after_return=1:strict_init_order=1:check_initialization_order=1:fast_unwind_on_malloc=$unwind:log_path=$out/asan" \
    LSAN_OPTIONS="suppressions=$supp/lsan.supp:print_suppressions=0" \
    UBSAN_OPTIONS="halt_on_error=1:abort_on_error=1:print_stacktrace=1:suppressions=$supp/ubsan.supp:log_path=$out/ubsan" \
    OMP_NUM_THREADS=1 \
      run "asan-$part" "$base/asan" --timeout-multiplier 4 "$@"
  done
fi

if [ "$which" = tsan ] || [ "$which" = all ]; then
  build "$base/tsan" thread
  # Every process writes its reports to a file; tsan_reports.py applies the
  # rule (a report with a loom frame is loom's, always) instead of a
  # suppression list, so nothing of loom's can be suppressed.
  reports=$(fresh_reports tsan "$base/tsan")
  # LibTorch, Gloo and Open MPI are not instrumented: TSan sees neither their
  # atomics nor their plain accesses, only the libc calls they make (free,
  # memcpy, pthread_cond_*) through its interceptors, and would pair those
  # with loom's instrumented accesses to the same tensors and futures as
  # races (2315 such reports in dist_ddp, dist_zero, dist_watchdog and
  # dist_mpi, 2232 of them with an inlined loom frame). ignore_noninstrumented_modules
  # drops the interceptor accesses made from uninstrumented libraries;
  # every access of loom's own code is still checked.
  TSAN_OPTIONS="halt_on_error=0:exitcode=0:second_deadlock_stack=1:ignore_noninstrumented_modules=1:log_path=$reports/tsan" \
  OMP_NUM_THREADS=1 \
    run tsan "$base/tsan" contract dist_ddp dist_zero dist_watchdog dist_mpi
  set -- "$reports"/tsan.*
  if [ -e "$1" ]; then
    /usr/bin/python3 "$supp/tsan_reports.py" "$root" "$base/tsan" "$@" > "$base/tsan/reports.txt" || status=1
  else
    echo "tsan_reports: 0 report(s), 0 with a loom frame" > "$base/tsan/reports.txt"
  fi
  tail -n 5 "$base/tsan/reports.txt"
fi
exit $status
