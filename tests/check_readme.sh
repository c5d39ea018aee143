#!/bin/sh
# check_readme.sh SOURCE_ROOT
# README.md's program is examples/minimal.cpp (which consumer_subproject compiles and runs), and
# README.md holds exactly two set-up commands, the second one running the tests,
# and the first one's package list is part of the second one's.
set -eu
root=$1
readme="$root/README.md"
program=$(awk '/<!-- examples\/minimal.cpp/ { marked = 1; next }
               marked && /^```cpp$/ { inside = 1; next }
               inside && /^```$/ { exit }
               inside { print }' "$readme")
if [ "$program" != "$(cat "$root/examples/minimal.cpp")" ]; then
  echo "README.md's program differs from examples/minimal.cpp:"
  printf '%s\n' "$program" | diff - "$root/examples/minimal.cpp"
  exit 1
fi
commands=$(grep -c '^apt-get update ' "$readme" || true)
[ "$commands" -eq 2 ] || { echo "README.md has $commands set-up commands, not 2"; exit 1; }
grep '^apt-get update ' "$readme" | tail -n 1 | grep -q 'meson test' || { echo "the second command does not run the tests"; exit 1; }
grep '^apt-get update ' "$readme" | head -n 1 | grep -q 'build/examples/fashion_mnist' || { echo "the first command does not run the example"; exit 1; }
# The first command installs the example's packages only, and the second
# installs everything: so the example's list must be part of the full one.
grep '^apt-get update ' "$readme" | head -n 1 | grep -q 'tools/debian-packages-example.txt' ||
  { echo "the first command does not install tools/debian-packages-example.txt"; exit 1; }
grep '^apt-get update ' "$readme" | tail -n 1 | grep -q 'tools/debian-packages.txt' ||
  { echo "the second command does not install tools/debian-packages.txt"; exit 1; }
missing=$(grep -v -x -F -f "$root/tools/debian-packages.txt" "$root/tools/debian-packages-example.txt" || true)
[ -z "$missing" ] || { echo "tools/debian-packages.txt lacks what the example's list has: $missing"; exit 1; }
echo "ok"
