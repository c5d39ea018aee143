#!/bin/sh
# check.sh EXPECTATIONS -- COMPILER ARGS...
# Compiles the cases once; the compiler must fail, and its output must contain,
# for every "case_name: sentence" line of EXPECTATIONS, that sentence in a
# static assertion (or, for a [[nodiscard]] result dropped, in the error that
# -Werror=unused-result makes of it). Prints the case whose sentence is missing.
set -eu
expect=$1
shift 2
status=0
output=$("$@" 2>&1) || status=$?
if [ "$status" -eq 0 ]; then
  echo "compile-fail: the cases compiled, but every one of them must fail" >&2
  exit 1
fi
missing=0
while IFS= read -r line; do
  [ -n "$line" ] || continue
  name=${line%%:*}
  sentence=${line#*: }
  if ! printf '%s\n' "$output" | grep -E "static assertion failed|error: ignoring return" | grep -qF -- "$sentence"; then
    echo "compile-fail: $name did not fail with: $sentence" >&2
    missing=1
  else
    echo "ok: $name"
  fi
done < "$expect"
if [ "$missing" -ne 0 ]; then
  printf '%s\n' "--- compiler output (errors only) ---" >&2
  printf '%s\n' "$output" | grep -E "error" | head -n 60 >&2
  exit 1
fi
