#!/bin/sh
# tests/fuzz/fuzz.sh OUT TARGET RUNS
# One libFuzzer campaign of OUT/fuzz_TARGET (tests/fuzz/build.sh BUILD OUT):
# RUNS executions starting from tests/fuzz/corpus/TARGET, new inputs kept in
# OUT/corpus-TARGET, findings in OUT/findings-TARGET/. A finding is a crash,
# an escaped exception, a sanitizer report (AddressSanitizer, UBSan, a leak
# in one input), an input running longer than 10 s (a hang) or any single
# allocation above 256 MiB (-malloc_limit_mb: the inputs are at most 64 kB,
# so that is an allocation without bound). Prints libFuzzer's final line
# (executions, cov, ft) and the time taken; exits non-zero on a finding.
# Afterwards, `OUT/fuzz_TARGET -merge=1 tests/fuzz/corpus/TARGET OUT/corpus-TARGET`
# adds to the committed corpus the inputs that reach new coverage.
set -eu
root=$(cd "$(dirname "$0")/../.." && pwd)
out=$(cd "$1" && pwd)
target=$2
runs=$3
mkdir -p "$out/corpus-$target" "$out/findings-$target"
start=$(date +%s)
status=0
ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=0 UBSAN_OPTIONS=print_stacktrace=1 \
  "$out/fuzz_$target" -runs="$runs" -max_len=65536 -timeout=10 -malloc_limit_mb=256 -rss_limit_mb=3072 \
  -print_final_stats=1 -artifact_prefix="$out/findings-$target/" \
  "$out/corpus-$target" "$root/tests/fuzz/corpus/$target" > "$out/fuzz-$target.log" 2>&1 || status=$?
end=$(date +%s)
grep -E 'DONE|stat::number_of_executed_units|stat::average_exec_per_sec|ERROR|SUMMARY' "$out/fuzz-$target.log" | tail -n 6
echo "fuzz.sh: $target: exit $status after $((end - start)) s; findings: $(find "$out/findings-$target" -type f | wc -l)"
exit "$status"
