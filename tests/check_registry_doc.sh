#!/bin/sh
# tests/check_registry_doc.sh TOOL DOC: fails when DOC differs from what TOOL writes now.
set -eu
tool=$1
doc=$2
out=$(mktemp)
trap 'rm -f "$out"' EXIT
"$tool" > "$out"
if ! diff -u "$doc" "$out"; then
  echo "docs/registry.md is stale: regenerate it with build/tools/loom-registry-doc > docs/registry.md" >&2
  exit 1
fi
