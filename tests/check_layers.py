#!/usr/bin/python3
"""check_layers.py INCLUDE_DIR: every #include <loom/...> in a public header
must point along an arrow of docs/architecture.md's layer table (a layer
includes only the layers listed for it, and the vocabulary headers anyone may
include). Prints each arrow the table does not allow, with the file."""
import os
import re
import sys

# Headers every layer may include: names and errors with no policy behind them.
VOCABULARY = {"errors.hpp", "devices.hpp", "compat.hpp", "compat_c10d.hpp", "comm/reduce_op.hpp", "policy_names.hpp"}

# layer -> the layers it may include (besides itself, the vocabulary and util).
# The order is docs/architecture.md's table, bottom to top.
ALLOWED = {
    "util": set(),  # seed, rank-zero helpers, throughput, FLOPs, loggers
    "concepts": set(),
    "comm": set(),
    "cluster": set(),
    "data": set(),
    "callbacks": set(),
    "launch": {"cluster"},
    "accelerator": {"concepts"},
    "precision": {"concepts"},
    "checkpoint": {"concepts", "comm"},
    "tp": {"comm"},
    "strategy": {"concepts", "comm", "cluster", "launch", "checkpoint", "tp"},
    "wrap": {"concepts", "data", "strategy", "precision"},
    "fabric": {"concepts", "comm", "cluster", "launch", "checkpoint", "accelerator", "precision", "strategy",
               "wrap", "data", "callbacks", "tp"},
    "runtime": {"concepts", "comm", "cluster", "launch", "checkpoint", "accelerator", "precision", "strategy",
                "wrap", "data", "callbacks", "fabric", "tp"},
    "trainer": {"concepts", "comm", "cluster", "launch", "checkpoint", "accelerator", "precision", "strategy",
                "wrap", "data", "callbacks", "fabric", "runtime", "tp"},
    "umbrella": None,  # loom.hpp: everything
}

# Arrows the table does not allow yet, each with why it is still here; the
# test fails when one disappears too, so the list stays true.
KNOWN = {}


def layer_of(relative):
    """relative: a path under include/, e.g. loom/strategy/ddp.hpp."""
    inside = relative[len("loom/"):]
    if inside in VOCABULARY:
        return "vocabulary"
    head = inside.split("/")[0]
    if head in ("loggers",):
        return "util"
    if head in ("concepts.hpp", "concepts"):
        return "concepts"
    if head in ("fabric.hpp", "basic_fabric.hpp", "static_backend.hpp", "fabric_options.hpp", "fabric_services.hpp",
                "compatibility.hpp"):
        return "fabric"
    if head in ("any_fabric.hpp",):
        return "runtime"
    if head == "loom.hpp":
        return "umbrella"
    return head


def main():
    include_dir = sys.argv[1]
    problems = []
    seen_known = set()
    count = 0
    for directory, _, files in os.walk(os.path.join(include_dir, "loom")):
        for name in sorted(files):
            if not name.endswith(".hpp"):
                continue
            path = os.path.join(directory, name)
            relative = os.path.relpath(path, include_dir)
            source = layer_of(relative)
            if source not in ALLOWED and source != "vocabulary":
                problems.append(f"{relative}: layer '{source}' is not in the table")
                continue
            with open(path, encoding="utf-8") as text:
                for line in text:
                    match = re.match(r"\s*#\s*include\s*<(loom/[^>]+)>", line)
                    if not match:
                        continue
                    count += 1
                    target = layer_of(match.group(1))
                    key = ("include/" + relative, match.group(1))
                    if source == "umbrella" or target in (source, "vocabulary", "util"):
                        if source == "vocabulary" and target not in ("vocabulary",):
                            problems.append(f"{relative} -> {match.group(1)}: a vocabulary header includes '{target}'")
                        continue
                    if source == "vocabulary" or target not in ALLOWED.get(source, set()):
                        if key in KNOWN:
                            seen_known.add(key)
                            continue
                        problems.append(f"{relative} -> {match.group(1)}: '{source}' may not include '{target}'")
    for key, why in KNOWN.items():
        if key not in seen_known:
            problems.append(f"{key[0]} -> {key[1]} is listed as a known exception ({why}) but no longer exists: "
                            "remove it from KNOWN")
    for problem in problems:
        print("FAIL:", problem)
    if problems:
        return 1
    print(f"check_layers: {count} includes follow the layer table ({len(KNOWN)} known exception(s))")
    return 0


if __name__ == "__main__":
    sys.exit(main())
