#!/bin/sh
# check_detect_abi.sh DETECT_SCRIPT
# tools/detect-torch-abi.sh reads the C++ ABI of a LibTorch package: from
# TorchConfig.cmake when it states it, else from libc10.so's symbols; a
# directory without either is an error naming what is missing.
set -eu
detect=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail=0
expect() {
  got=$("$detect" "$1" 2>/dev/null) || got="error"
  if [ "$got" = "$2" ]; then echo "ok: $3 -> $got"; else echo "FAIL: $3: expected $2, got $got"; fail=1; fi
}
for abi in 0 1; do
  mkdir -p "$work/cmake$abi/share/cmake/Torch"
  printf 'set(TORCH_CXX_FLAGS "-D_GLIBCXX_USE_CXX11_ABI=%s")\n' "$abi" > "$work/cmake$abi/share/cmake/Torch/TorchConfig.cmake"
  expect "$work/cmake$abi" "$abi" "TorchConfig.cmake with ABI=$abi"
done
mkdir -p "$work/debian/lib"
ln -s /usr/lib/x86_64-linux-gnu/libc10.so "$work/debian/lib/libc10.so"
expect "$work/debian" 1 "Debian's libc10.so (new ABI) by its symbols"
mkdir -p "$work/empty"
expect "$work/empty" error "a directory without LibTorch"
"$detect" "$work/empty" 2>&1 | grep -q "libc10.so not found" || { echo "FAIL: the error does not name libc10.so"; fail=1; }
exit $fail
