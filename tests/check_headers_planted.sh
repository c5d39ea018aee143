#!/bin/sh
# check_headers_planted.sh CHECK_HEADERS_PY -- COMPILER ARGS...
# check_headers.py must catch a header that compiles only because another
# header brought its standard or LibTorch include: five headers are planted
# in a scratch include tree beside a correct one, and the check must fail
# naming each of them (and the header that includes one of them first),
# never the correct one.
# - loom/planted/uses_vector.hpp uses std::vector, includes nothing;
# - loom/planted/uses_tensor.hpp uses at::Tensor, includes only <vector>;
# - loom/planted/uses_loom.hpp uses a loom name, includes nothing;
# - loom/planted/uses_optimizer.hpp includes <ATen/core/Tensor.h> and uses
#   torch::optim::Optimizer: it compiles over the check's Tensor prelude,
#   and must not be given the larger prelude that holds optimizer.h;
# - loom/planted/uses_string.hpp uses std::string, includes nothing, and is
#   the first include of loom/planted/chains_string.hpp (which includes
#   <string> after it): it gets no TU of its own, chains_string.hpp's TU
#   compiles it alone first, and it must still be named (chains_string.hpp
#   fails too: alone, its first include fails).
# Every one of them compiles after a prelude (as the check used to compile
# them): the control compiles them that way and must pass.
set -eu
check=$1
shift 2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/include/loom/planted"
cat > "$work/include/loom/planted/complete.hpp" <<'EOF'
#pragma once
#include <vector>
#include <ATen/core/Tensor.h>
namespace loom::planted { inline std::vector<at::Tensor> complete() { return {}; } }
EOF
cat > "$work/include/loom/planted/uses_vector.hpp" <<'EOF'
#pragma once
namespace loom::planted { inline std::vector<int> needs_vector() { return {1, 2}; } }
EOF
cat > "$work/include/loom/planted/uses_tensor.hpp" <<'EOF'
#pragma once
#include <vector>
namespace loom::planted { inline std::vector<at::Tensor> needs_tensor() { return {}; } }
EOF
cat > "$work/include/loom/planted/uses_loom.hpp" <<'EOF'
#pragma once
#include <vector>
#include <ATen/core/Tensor.h>
namespace loom::planted { inline std::vector<at::Tensor> needs_loom() { return complete(); } }
EOF
cat > "$work/include/loom/planted/uses_optimizer.hpp" <<'EOF'
#pragma once
#include <ATen/core/Tensor.h>
namespace loom::planted { inline void needs_optimizer(torch::optim::Optimizer& o) { o.zero_grad(); } }
EOF
cat > "$work/include/loom/planted/uses_string.hpp" <<'EOF'
#pragma once
namespace loom::planted { inline std::string needs_string() { return "string"; } }
EOF
cat > "$work/include/loom/planted/chains_string.hpp" <<'EOF'
#pragma once
// Its first include: the check compiles uses_string.hpp alone in this TU.
#include <loom/planted/uses_string.hpp>
#include <string>
namespace loom::planted { inline std::string chained() { return needs_string(); } }
EOF

status=0
/usr/bin/python3 "$check" "$work/include" -- "$@" -I "$work/include" > "$work/out" 2>&1 || status=$?
sed 's/^/  /' "$work/out" | grep -E 'FAIL|check_headers' || true
failed=0
if [ $status -eq 0 ]; then
  echo "FAIL: check_headers.py passed a tree with five incomplete headers"
  failed=1
fi
for header in uses_vector uses_tensor uses_loom uses_optimizer uses_string chains_string; do
  if grep -q "^FAIL: loom/planted/$header.hpp" "$work/out"; then
    echo "ok: loom/planted/$header.hpp is caught"
  else
    echo "FAIL: loom/planted/$header.hpp is not named"
    failed=1
  fi
done
if ! grep -q "^FAIL: loom/planted/uses_string.hpp (first in loom/planted/chains_string.hpp's TU" "$work/out"; then
  echo "FAIL: loom/planted/uses_string.hpp got a TU of its own: it is not compiled in chains_string.hpp's"
  failed=1
fi
if grep -q "^FAIL: loom/planted/complete.hpp" "$work/out"; then
  echo "FAIL: the complete header was refused"
  failed=1
fi

# Control: behind a prelude (what a real program includes first) all seven
# compile in one TU, so only compiling each on its own tells them apart.
{
  printf '#include <string>\n#include <vector>\n#include <ATen/core/Tensor.h>\n#include <torch/optim/optimizer.h>\n#include <loom/planted/complete.hpp>\n'
  for header in uses_vector uses_tensor uses_loom uses_optimizer uses_string chains_string; do printf '#include <loom/planted/%s.hpp>\n' "$header"; done
} > "$work/control.cpp"
if ! "$@" -I "$work/include" -fsyntax-only "$work/control.cpp" > "$work/control" 2>&1; then
  echo "FAIL: control: the planted headers do not compile even behind a prelude:"
  head -n 5 "$work/control"
  failed=1
fi
if [ $failed -eq 0 ]; then
  echo "ok: behind a prelude all seven compile; check_headers.py, each on its own, names the five incomplete ones and the one that includes one first"
fi
exit $failed
