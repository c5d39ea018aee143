# Sourced by the consumer tests: installs BUILD_DIR into a fresh DESTDIR and
# sets work (a temporary folder, removed on exit), prefix (where loom's files
# now are), libdir, and check_no_tree DEPFILE (fails when a dependency file
# names a path of loom's source or build tree).
# shellcheck shell=sh
set -eu
build=$(cd "$1" && pwd)
source=$(cd "$2" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# One install at a time: meson install writes its log into the build tree,
# and the consumer tests run side by side.
DESTDIR="$work/root" flock "$build/meson-private/consumer-install.lock" \
  meson install -C "$build" --no-rebuild --quiet >/dev/null
options=$(meson introspect "$build" --buildoptions)
option() {
  printf '%s' "$options" | /usr/bin/python3 -c "import json, sys; print(next(o['value'] for o in json.load(sys.stdin) if o['name'] == sys.argv[1]))" "$1"
}
prefix="$work/root$(option prefix)"
libdir="$prefix/$(option libdir)"
test -f "$libdir/libloom.so" || { echo "consumer: no libloom.so under $libdir after meson install" >&2; exit 1; }
cp "$source/tests/consumers/consumer.cpp" "$work/"
check_no_tree() {
  test -s "$1" || { echo "consumer: no dependency file '$1' to check" >&2; exit 1; }
  if grep -q -e "$source/" -e "$build/" "$1"; then
    echo "consumer: the build read files of loom's source or build tree, not the installed ones:" >&2
    grep -o -e "$source/[^ ]*" -e "$build/[^ ]*" "$1" | sort -u | head -n 5 >&2
    exit 1
  fi
}
run_consumer() {
  # The installed libloom, not the build tree's (meson test points LD_LIBRARY_PATH there).
  LD_LIBRARY_PATH="$libdir" ldd "$1" | grep -q "libloom.so.* => $libdir/" ||
    { echo "consumer: $1 does not load libloom from $libdir" >&2; exit 1; }
  LD_LIBRARY_PATH="$libdir" "$1"
}
