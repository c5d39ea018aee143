#!/bin/sh
# check_headers.sh INCLUDE_DIR -- COMPILER ARGS...
# Every public header must compile on its own: each is compiled alone
# (-fsyntax-only), with no prelude, as the first and only include of a TU,
# on every core at once. So a header that uses a standard, LibTorch or loom
# name without including what declares it fails here, wherever else that
# include happens to come from in a real program.
# (tests/check_headers_planted.sh proves it catches both kinds.)
# Prints every header that fails, with the compiler's first lines.
set -eu
include=$1
shift 2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# The compiler command, for xargs' children: "$@" saved one word per line.
for word in "$@"; do printf '%s\n' "$word"; done > "$work/command"
cat > "$work/compile_one" <<'ONE'
#!/bin/sh
# compile_one WORK HEADER: compiles `#include <HEADER>` alone.
set -eu
work=$1 header=$2
out="$work/out.$$"
set --
while IFS= read -r word; do set -- "$@" "$word"; done < "$work/command"
if ! printf '#include <%s>\n' "$header" | "$@" -fsyntax-only -x c++ - > "$out" 2>&1; then
  echo "FAIL: $header"
  head -n 8 "$out"
  exit 1
fi
ONE
chmod +x "$work/compile_one"
count=$(cd "$include" && find loom -name '*.hpp' | wc -l)
if [ "$count" -eq 0 ]; then
  echo "check_headers: no header under $include/loom" >&2
  exit 1
fi
status=0
(cd "$include" && find loom -name '*.hpp' | sort) |
  xargs -P "$(nproc)" -I '{}' "$work/compile_one" "$work" '{}' || status=$?
if [ $status -ne 0 ]; then
  echo "check_headers: some of the $count headers do not compile on their own (above)" >&2
  exit 1
fi
echo "check_headers: all $count headers compile on their own, with no prelude"
