#!/bin/sh
# torch-external-libs.sh LIB_DIR: prints the libraries a LibTorch 1.x build
# leaves to the system and whose inline code (in the headers loom includes)
# ends up in loom's objects: glog (c10's logging) and gloo (ProcessGroupGloo).
# Debian's LibTorch links both dynamically; an official zip bundles them.
# LIB_DIR empty: Debian's libtorch-dev, in the linker's default path.
set -eu
dir=$1
if [ -n "$dir" ]; then
  c10="$dir/libc10.so" torch_cpu="$dir/libtorch_cpu.so"
else
  c10=$(find /usr/lib /usr/lib64 -name 'libc10.so' 2>/dev/null | head -n 1)
  torch_cpu=$(find /usr/lib /usr/lib64 -name 'libtorch_cpu.so' 2>/dev/null | head -n 1)
fi
for lib in "$c10" "$torch_cpu"; do
  if [ ! -f "$lib" ]; then
    echo "torch-external-libs: ${lib:-libc10.so} not found; -Dlibtorch_dir must hold lib/" >&2
    exit 1
  fi
done
# Undefined dynamic symbols name what the library expects from elsewhere.
if nm -D --undefined-only "$c10" | grep -q 'google'; then echo glog; fi
if nm -D --undefined-only "$torch_cpu" | grep -q 'gloo'; then echo gloo; fi
