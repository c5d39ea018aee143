#!/usr/bin/env python3
"""check_headers.py INCLUDE_DIR -- COMPILER ARGS...

Every public header must compile on its own: each is compiled alone
(-fsyntax-only) as the first and only include of a TU, on every core at once.
So a header that uses a standard, LibTorch or loom name without including what
declares it fails here, wherever else that include happens to come from in a
real program. (tests/check_headers_planted.sh proves it catches each kind.)

Most of the time goes to parsing LibTorch's headers, header by header. So a
header that reaches every LibTorch header of a prelude below anyway compiles
over that prelude, precompiled once: it sees the same declarations it sees
alone, only parsed earlier. What a header reaches is exact: its includes
followed through loom's headers, and each LibTorch header it names followed by
the compiler's own dependency list (-M, with the same flags), so a LibTorch
header that pulls in ATen/ATen.h counts as reaching it. A header that does not
reach all of a prelude's headers gets a smaller prelude or none, so a missing
include is still an error (the planted `uses_optimizer.hpp` holds
<ATen/core/Tensor.h> and uses torch::optim::Optimizer: it gets the Tensor
prelude only, and fails). A prelude holds LibTorch's headers only, never a
standard or loom one.
The preludes build first; the headers that need none compile on the other
cores meanwhile. Prints every header that fails, with the compiler's first lines.

A header whose very first line (after `#pragma once` and comments) includes
another loom header is, in its own TU, that header compiled alone, followed
by the rest: so one TU checks the whole chain of first includes, and a
header in another's chain gets no TU of its own when that TU's prelude is
one it reaches too (31 of the 141 headers here: 110 TUs, 116 -> 101 s). A
TU that fails compiles its chain again one header at a time, so each
failure names its header. What a chained header is not checked for is a
name its templates find by argument-dependent lookup only where they are
instantiated, at the end of the TU, when a later header declares it: the
header alone would fail there.
"""
import concurrent.futures
import os
import re
import subprocess
import sys
import tempfile
import time

# Largest first: each header gets the first whose every header it reaches.
# Chosen from what loom's headers reach (most reach ATen/ATen.h through
# LibTorch's own includes); only the preludes some header gets are built. A
# prelude costs its build (about 20 s of a core for torch/nn/module.h) and
# spares each of its headers the parse: one with optimizer.h and
# autocast_mode.h too, for the four headers that reach them, cost more than
# it spared. ATen.h with torch/data/example.h (torch/types.h and the autograd
# headers under it, 58 files past ATen.h), which 24 of the 30 headers over
# ATen.h reach: the check 133 -> 121 s, 261 -> 237 s of CPU (2-core AMD EPYC
# VM); with optimizer.h and autocast_mode.h as a further prelude, 132 s.
TENSOR, IVALUE, ATEN = "ATen/core/Tensor.h", "ATen/core/ivalue.h", "ATen/ATen.h"
MODULE, EXAMPLE = "torch/nn/module.h", "torch/data/example.h"
PRELUDES = [
    [TENSOR, IVALUE, ATEN, MODULE],
    [TENSOR, IVALUE, ATEN, EXAMPLE],
    [TENSOR, IVALUE, ATEN],
    [TENSOR, IVALUE],
    [TENSOR],
]
INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]([^>"]+)[>"]', re.M)


def includes_reached(include_dir, header, memo):
    """Every header name HEADER includes, followed through loom's own headers."""
    if header in memo:
        return memo[header]
    memo[header] = set()
    reached = set()
    for name in INCLUDE.findall(open(os.path.join(include_dir, header), errors="replace").read()):
        reached.add(name)
        if os.path.isfile(os.path.join(include_dir, name)):
            reached |= includes_reached(include_dir, name, memo)
    memo[header] = reached
    return reached


COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)


def first_include(include_dir, header):
    """The loom header HEADER's first line includes, when that line comes
    before anything else but `#pragma once` (else None)."""
    for line in COMMENT.sub("", open(os.path.join(include_dir, header), errors="replace").read()).splitlines():
        line = line.strip()
        if not line or re.fullmatch(r"#\s*pragma\s+once", line):
            continue
        match = INCLUDE.match(line)
        if match and os.path.isfile(os.path.join(include_dir, match.group(1))):
            return match.group(1)
        return None
    return None


def chain_of(header, first):
    """HEADER and the loom headers its first include leads to (FIRST: each
    header's first include), in the order they are compiled last to first:
    each is compiled alone in HEADER's TU."""
    chain = [header]
    while (following := first.get(chain[-1])) in first and following not in chain:
        chain.append(following)
    return chain


def roots(chains, chosen):
    """The headers that get a TU: all but those in another header's chain
    whose prelude they reach too (a prelude further down PRELUDES, or none,
    is smaller). A covered header's coverer is a root or covered in turn by
    one whose prelude is no larger, so every header is checked."""
    rank = {h: len(PRELUDES) if chosen[h] is None else chosen[h] for h in chains}
    covered = {member for header, chain in chains.items() for member in chain[1:]
               if rank[header] >= rank[member]}
    return [h for h in chains if h not in covered]


def dependencies(compiler, name):
    """The files the compiler reads for `#include <NAME>` (-M): NAME's closure."""
    done = subprocess.run(compiler + ["-M", "-x", "c++", "-"], input=f"#include <{name}>\n",
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if done.returncode != 0:
        return None
    # "-: /usr/include/stdc-predef.h NAME ...": the target, the implicit
    # predefines, then NAME itself and what it includes.
    return [os.path.realpath(f) for f in done.stdout.replace("\\\n", " ").split()[2:]]


def torch_closures(compiler, include_dir, reached, pool):
    """For each header name outside loom's tree that some header names: the
    files it reads. The first file of a prelude header's list is its own path."""
    names = sorted({name for names in reached.values() for name in names
                    if not os.path.isfile(os.path.join(include_dir, name))} |
                   {name for prelude in PRELUDES for name in prelude})
    return {name: files for name, files in zip(names, pool.map(lambda n: dependencies(compiler, n), names))
            if files is not None}


def prelude_for(names, closures, paths):
    """The first prelude whose every header is among the files NAMES reach."""
    files = set().union(*(closures[name] for name in names if name in closures))
    for index, prelude in enumerate(PRELUDES):
        if all(paths.get(name) in files for name in prelude):
            return index
    return None


def run(command):
    start = time.monotonic()
    done = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return done.returncode, done.stdout, time.monotonic() - start


def main():
    if len(sys.argv) < 4 or sys.argv[2] != "--":
        sys.exit(__doc__)
    include_dir, compiler = sys.argv[1], sys.argv[3:]
    headers = sorted(os.path.relpath(os.path.join(folder, name), include_dir)
                     for folder, _, names in os.walk(os.path.join(include_dir, "loom"))
                     for name in names if name.endswith(".hpp"))
    if not headers:
        sys.exit(f"check_headers: no header under {include_dir}/loom")
    memo = {}
    reached = {header: includes_reached(include_dir, header, memo) for header in headers}
    with tempfile.TemporaryDirectory() as work, \
            concurrent.futures.ThreadPoolExecutor(os.cpu_count() or 2) as pool:
        closures = torch_closures(compiler, include_dir, reached, pool)
        own_path = {}
        for name in {name for prelude in PRELUDES for name in prelude}:
            if name not in closures:
                print(f"check_headers: the prelude header <{name}> is not found with these flags")
                return 1
            own_path[name] = closures[name][0]
        chosen = {header: prelude_for(reached[header], closures, own_path) for header in headers}
        used = sorted({index for index in chosen.values() if index is not None})
        paths = {}
        for index in used:
            paths[index] = os.path.join(work, f"prelude{index}.hpp")
            with open(paths[index], "w") as f:
                f.write("".join(f"#include <{name}>\n" for name in PRELUDES[index]))
        # The preludes build first (the most used first), the headers that need
        # none compile while they do, then the others, prelude by prelude.
        used.sort(key=lambda index: -sum(1 for i in chosen.values() if i == index))
        built = {index: pool.submit(run, compiler + ["-x", "c++-header", paths[index], "-o", paths[index] + ".gch"])
                 for index in used}

        def compile_alone(header, prelude_of):
            prelude = []
            if chosen[prelude_of] is not None:
                if built[chosen[prelude_of]].result()[0] != 0:
                    return None
                prelude = ["-Winvalid-pch", "-include", paths[chosen[prelude_of]]]
            source = os.path.join(work, header.replace("/", "_") + ".cpp")
            with open(source, "w") as f:
                f.write(f"#include <{header}>\n")
            return run(compiler + prelude + ["-fsyntax-only", source])

        def check(root):
            """[(header, status, output, seconds)] for ROOT's chain: one TU, or,
            when it fails, each header of the chain alone over its own prelude."""
            status, output, seconds = compile_alone(root, root)
            if status == 0:
                return [(header, 0, "", seconds, root) for header in chains[root]]
            # ROOT's own TU is already its check alone.
            return [(root, status, output, seconds, root)] + [
                (header, *compile_alone(header, header), root) for header in chains[root][1:]]

        first = {header: first_include(include_dir, header) for header in headers}
        chains = {header: chain_of(header, first) for header in headers}
        order = sorted(roots(chains, chosen), key=lambda h: -1 if chosen[h] is None else used.index(chosen[h]))
        checks = [pool.submit(check, root) for root in order]
        for index, made in built.items():
            if made.result()[0] != 0:
                print(f"check_headers: the prelude {PRELUDES[index]} does not compile:\n{made.result()[1][:2000]}")
                return 1
        results = {}
        for job in checks:
            for header, status, output, seconds, root in job.result():
                if status != 0 or header not in results:
                    results[header] = (status, output, seconds, root)
        failed = 0
        seconds = {}
        for header in headers:
            status, output, seconds[header], root = results[header]
            if status != 0:
                failed += 1
                print(f"FAIL: {header}" + (f" (first in {root}'s TU; here alone)" if root != header else ""))
                print("\n".join(output.splitlines()[:8]))
    tiers = ", ".join(f"{sum(1 for i in chosen.values() if i == index)} over {'+'.join(PRELUDES[index])}"
                      for index in used)
    bare = sum(1 for i in chosen.values() if i is None)
    if failed:
        print(f"check_headers: {failed} of the {len(headers)} headers do not compile on their own (above)")
        return 1
    slowest = sorted(seconds, key=seconds.get, reverse=True)[:5]
    print("check_headers: slowest: " + ", ".join(
        f"{h} {seconds[h]:.1f} s ({'no prelude' if chosen[h] is None else 'prelude ' + str(chosen[h])})"
        for h in slowest))
    print(f"check_headers: all {len(headers)} headers compile on their own, in {len(order)} TUs "
          f"({bare} with no prelude; {tiers or 'none over a prelude'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
