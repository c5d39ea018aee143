#!/bin/sh
# check_headers.sh INCLUDE_DIR -- COMPILER ARGS...
# Every public header must compile on its own: each is compiled alone
# (-fsyntax-only) after a precompiled prelude of the LibTorch headers loom
# uses, so the test costs about a second per header instead of the ten that
# parsing LibTorch again would. What it catches: a loom header that uses a
# loom name without including its header. What the prelude hides: a missing
# LibTorch or standard include. Prints every header that fails.
set -u
include=$1
shift 2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cat > "$work/prelude.hpp" <<'PRELUDE'
#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <torch/data/dataloader.h>
#include <torch/data/datasets/map.h>
#include <torch/data/transforms/stack.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>
#include <torch/nn/utils/clip_grad.h>
#include <torch/optim/optimizer.h>
PRELUDE
"$@" -x c++-header "$work/prelude.hpp" -o "$work/prelude.hpp.gch" || { echo "check_headers: the prelude did not compile" >&2; exit 1; }
# The compiler command, for xargs' children.
{
  printf '#!/bin/sh\n'
  printf 'printf "#include <%%s>\\n" "$1" | '
  for word in "$@"; do printf "'%s' " "$word"; done
  printf -- "-fsyntax-only -Winvalid-pch -include '%s/prelude.hpp' -x c++ - > '%s/out.\$\$' 2>&1 || { echo \"FAIL: \$1\"; head -n 5 '%s/out.\$\$'; exit 1; }\n" "$work" "$work" "$work"
} > "$work/compile_one"
chmod +x "$work/compile_one"
count=$(cd "$include" && find loom -name '*.hpp' | wc -l)
(cd "$include" && find loom -name '*.hpp' | sort) | xargs -P 2 -n 1 "$work/compile_one"
status=$?
if [ $status -ne 0 ]; then
  echo "check_headers: some of the $count headers do not compile on their own (above)" >&2
  exit 1
fi
echo "check_headers: all $count headers compile on their own"
