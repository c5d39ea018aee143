#!/bin/sh
# pkgconfig.sh BUILD_DIR SOURCE_DIR: the consumer built with
#   g++ consumer.cpp $(pkg-config --cflags --libs loom)
# against a DESTDIR install, and run.
set -eu
. "$(dirname "$0")/install_prefix.sh"
pcdir=$(dirname "$(find "$work/root" -name loom.pc | head -n 1)")
flags=$(PKG_CONFIG_PATH="$pcdir" pkg-config --define-variable=prefix="$prefix" --cflags --libs loom)
echo "pkg-config --cflags --libs loom: $flags"
g++ "$work/consumer.cpp" -o "$work/consumer" -MD -MF "$work/consumer.d" $flags
check_no_tree "$work/consumer.d"
run_consumer "$work/consumer"
