#!/bin/sh
# check_unit_areas.sh LOOM_TESTS AREA...: every test case of loom_tests runs
# under one of meson's unit tests, which select by area tag ([contract], ...).
# A case tagged with none of the areas (nor hidden, [.name], run by its own
# script) would compile and never run: such cases are listed, and fail this.
set -eu
binary=$1
shift
spec=""
for area in "$@"; do spec="$spec~[$area]"; done
# Catch exits with the number of names it lists.
orphans=$("$binary" "$spec~[.]" --list-test-names-only || true)
if [ -n "$orphans" ]; then
  echo "test cases that no unit test runs (tag each with one of: $*):"
  printf '%s\n' "$orphans"
  exit 1
fi
echo "check_unit_areas: every test case of $(basename "$binary") is in one of the $# areas, or hidden"
