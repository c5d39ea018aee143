#!/bin/sh
# Prints 1 when the LibTorch under $1 was built with the C++11 ABI, 0 when not.
# Official downloads ship both ABIs under the same file names, so read it from
# the package: first the flag CMake hands to consumers, then the symbols.
set -eu
dir=$1
cfg="$dir/share/cmake/Torch/TorchConfig.cmake"
if [ -f "$cfg" ]; then
  abi=$(sed -n 's/.*_GLIBCXX_USE_CXX11_ABI=\([01]\).*/\1/p' "$cfg" | head -n 1)
  if [ -n "$abi" ]; then echo "$abi"; exit 0; fi
fi
lib="$dir/lib/libc10.so"
if [ ! -f "$lib" ]; then
  echo "detect-torch-abi: $lib not found; -Dlibtorch_dir must hold include/ and lib/" >&2
  exit 1
fi
# New-ABI builds mangle std::string as std::__cxx11::basic_string.
if nm -DC "$lib" | grep -q '__cxx11::basic_string'; then echo 1; else echo 0; fi
