#!/bin/sh
# python_checkpoint.sh LOOM_TESTS PYTHON SCRIPT: checkpoints between loom and
# Debian's python3-torch, both ways (see the end of test_checkpoint.cpp).
set -eu
tests=$1
python=$2
script=$3
LOOM_PYTHON_DIR=$(mktemp -d)
export LOOM_PYTHON_DIR
trap 'rm -rf "$LOOM_PYTHON_DIR"' EXIT
"$tests" "[.python_export]"
"$python" "$script" "$LOOM_PYTHON_DIR"
"$tests" "[.python_import]"
