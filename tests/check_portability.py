#!/usr/bin/env python3
"""check_portability.py SOURCE_DIR BUILD_DIR [--only REGEX] -- COMPILER

Every loom TU (src/, tools/, examples/, tests/, bench/) must compile against
LibTorch 2.11's headers with CUDA, NCCL and MPI on, at -Wall -Wextra
-Werror=deprecated-declarations, with no error and no warning from loom's own
code, and without reading a header from Debian's LibTorch 1.13 or Gloo
(/usr/include/{torch,ATen,c10,caffe2,gloo}).

The headers stay outside the repository (CUDA's are under NVIDIA's licence):
LOOM_TORCH2_HEADERS names a folder holding torch211-include.tar.xz,
cuda130-include.tar.xz and nccl-include.tar.xz (unpacked once under
BUILD_DIR/portability), or an already unpacked tree (include/, cuda/,
nccl/include/). Without it the test exits 77: skipped, never passed.

Compile-only (-fsyntax-only): there are no 2.11 libraries here. TUs whose
includes reach LibTorch compile over a precompiled prelude of LibTorch's
headers (never loom's): torch/torch.h; the TUs whose includes reach c10d also
over c10d's Gloo, NCCL and Reducer headers, parsed (a second precompiled
prelude took 43 s to build here for 12 TUs, more than they spend parsing
those headers). Every TU pays for the prelude's pending template
instantiations (about 4.5 s for torch.h on this machine's g++ 12), so the
fewer TUs the better (below). TUs that reach no LibTorch header compile
without a prelude (grouped the same way), on the other cores while the
prelude builds.

To pay that fixed cost less often, TUs of one tier compile up to GROUP_SIZE at
a time as one TU that #includes them (a unity TU). A TU that defines into no
named namespace of its own (every program, test, tool and example but a few)
is wrapped: included inside a namespace of its own (`namespace loom_unity_N
{`), after its preprocessor lines at file scope (its includes, their
conditions, its macros): its anonymous namespace, static functions and main
stay apart from every other member's, and the headers it includes are already
in (their include guards keep them out of the namespace); its macros are
undefined after it. The others are included as they are: src/'s together
(libloom's own unity build compiles them so), the others a folder's together
(one program's or one test executable's TUs, which link together), with at
most one `main` or `extern "C"` TU to a group (two model libraries' entry
points would clash; grouped by folder, 46 TUs became 40 and the check 132 s ->
107-112 s here). On a 2-core AMD EPYC VM, alone: the 28 torch-free TUs in 6
groups instead of one at a time, 21 -> 12 s (41 -> 20 s of CPU); then groups
of up to 32 instead of 16, the whole check 138 -> 121 s (19 TUs -> 16; 24 to a
group: 126 s). A group that fails, or warns from loom's code, compiles again
one TU at a time, and those results are the ones reported: a name two TUs both
define never fails the check, and every failure names its own TU (a planted
error in src/ and an unused variable in a program's main were each reported
so, by their TU; so were a planted error in a torch-free src/ TU and a planted
unused variable in loom-plot's main, in groups of 32). What a unity TU cannot
tell is a TU that compiles only after another one's includes; the torch.h
prelude already hides most of those, and the 1.13 build and
header_self_containment compile each TU and header alone.
"""
import concurrent.futures
import functools
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time

SKIP = 77
GROUP_SIZE = 32
# A TU that opens a named namespace at file scope defines into it (loom's, a
# tool's): nested in another namespace, its definitions would go astray.
NAMED_NAMESPACE = re.compile(r"^namespace\s+[A-Za-z_]", re.M)
# Preprocessor lines hoisted to file scope before a wrapped TU (its includes
# and what decides them), with their continuation lines.
DIRECTIVE = re.compile(r"[ \t]*#[ \t]*(if|ifdef|ifndef|elif|else|endif|include|define|undef)\b")
# What can hide a brace: comments, string and character literals (raw strings too).
HIDING = re.compile(r'//[^\n]*|/\*.*?\*/|R"([^(\s]*)\(.*?\)\1"|"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'', re.S)
DEFINED = re.compile(r"^[ \t]*#[ \t]*define[ \t]+([A-Za-z_]\w*)", re.M)
PROGRAM = re.compile(r"^\s*int\s+main\s*\(", re.M)
TREES = ("src", "tools", "examples", "tests", "bench")
# Not loom TUs to port: compile_fail's cases must fail; consumers/ are
# separate projects built by their own tests.
EXCLUDED = ("tests/compile_fail/", "tests/consumers/")
TORCH_INCLUDE = re.compile(r'#\s*include\s*[<"](torch|ATen|c10|caffe2)/')
C10D_INCLUDE = re.compile(r'#\s*include\s*[<"]torch/csrc/distributed/')
# Each tier's preludes, in order; only the first is precompiled.
PRELUDES = {
    "torch": ["torch"],
    "distributed": ["torch", "c10d"],
}
PRELUDE_HEADERS = {
    "torch": ["torch/torch.h"],
    "c10d": ["torch/csrc/distributed/c10d/ProcessGroupGloo.hpp", "torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp",
             "torch/csrc/distributed/c10d/reducer.hpp"],
}
PRECOMPILED = "torch"
LOCAL_INCLUDE = re.compile(r'#\s*include\s*[<"]([^>"]+)[>"]')
FOREIGN_HEADER = re.compile(r"^\.+ (/usr/include/(?:torch|ATen|c10|caffe2|gloo)/\S+)", re.M)
TARBALLS = {"torch211-include.tar.xz": "", "cuda130-include.tar.xz": "cuda", "nccl-include.tar.xz": "nccl"}


def unpack(headers, build):
    """The unpacked 2.11 tree: HEADERS itself, or its tarballs unpacked once."""
    if os.path.isdir(os.path.join(headers, "include", "torch")):
        return headers
    root = os.path.join(build, "portability", "headers")
    stamp = os.path.join(root, ".unpacked")
    wanted = " ".join(f"{n}:{os.path.getsize(os.path.join(headers, n))}" for n in sorted(TARBALLS))
    if os.path.exists(stamp) and open(stamp).read() == wanted:
        return root
    shutil.rmtree(root, ignore_errors=True)
    for name, sub in TARBALLS.items():
        with tarfile.open(os.path.join(headers, name)) as tar:
            tar.extractall(os.path.join(root, sub))
    open(stamp, "w").write(wanted)
    return root


def check_gloo_config(headers, source):
    """third_party/gloo/gloo/config.h agrees with how that LibTorch was built."""
    config_txt = os.path.join(headers, "torch_config.txt")
    if not os.path.exists(config_txt):
        return []
    built = dict(re.findall(r"\b(USE_[A-Z_]+)=(\w+)", open(config_txt).read()))
    config = dict(re.findall(r"#define (GLOO_\w+) (\d+)",
                             open(os.path.join(source, "third_party/gloo/gloo/config.h")).read()))
    on = lambda key: built.get(key, "OFF").upper() in ("ON", "1", "TRUE")
    expected = {"GLOO_USE_CUDA": on("USE_CUDA"), "GLOO_USE_ROCM": on("USE_ROCM"),
                "GLOO_USE_MPI": on("USE_MPI"),
                # PyTorch turns NCCL off around Gloo's subdirectory.
                "GLOO_USE_NCCL": False}
    return [f"third_party/gloo/gloo/config.h: {k} is {config.get(k)}, but LibTorch was built with "
            f"{'it on' if v else 'it off'} ({config_txt})"
            for k, v in expected.items() if config.get(k) != ("1" if v else "0")]


def translation_units(source):
    units = []
    for tree in TREES:
        for folder, _, files in os.walk(os.path.join(source, tree)):
            for name in files:
                path = os.path.relpath(os.path.join(folder, name), source)
                if name.endswith(".cpp") and not path.startswith(EXCLUDED):
                    units.append(path)
    return sorted(units)


@functools.lru_cache(maxsize=None)
def text_of(source, unit):
    """UNIT's text, read once: the tiers, the grouping and the unity TUs all read it."""
    return open(os.path.join(source, unit), errors="replace").read()


def reaches(pattern, source, unit, search, memo):
    """Whether UNIT's own includes (followed through the repository) reach a line matching PATTERN."""
    if unit in memo:
        return memo[unit]
    memo[unit] = False
    text = text_of(source, unit)
    if pattern.search(text):
        memo[unit] = True
        return True
    here = os.path.dirname(unit)
    for name in LOCAL_INCLUDE.findall(text):
        for folder in (here,) + search:
            candidate = os.path.normpath(os.path.join(folder, name))
            if os.path.isfile(os.path.join(source, candidate)):
                if reaches(pattern, source, candidate, search, memo):
                    memo[unit] = True
                    return True
                break
    return memo[unit]


def prelude_of(source, unit, search, memos):
    if reaches(C10D_INCLUDE, source, unit, search, memos[0]):
        return "distributed"
    if reaches(TORCH_INCLUDE, source, unit, search, memos[1]):
        return "torch"
    return None


def mpi_include_args():
    try:
        out = subprocess.run(["mpicxx", "--showme:incdirs"], capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        sys.exit("check_portability: mpicxx (libopenmpi-dev) is needed to compile the MPI TUs")
    return [arg for d in out.stdout.split() for arg in ("-isystem", d)]


def in_loom(line):
    return not line.startswith(("/usr/", ".")) and "/portability/headers/" not in line


def loom_diagnostics(output):
    """Warning and error lines that point into loom's own files (not the system headers)."""
    return [line for line in output.splitlines() if re.search(r"(warning|error):", line) and in_loom(line)]


def failure_lines(output):
    """Why a TU failed: every error, and where in loom's code each was required from."""
    return [line for line in output.splitlines()
            if "error:" in line or ("required from here" in line and in_loom(line))]


def wrappable(source, unit):
    """Whether UNIT can be included inside a namespace of its own: it defines
    into no named namespace, and its main (if any) returns (only ::main may
    flow off its end; elsewhere it would warn)."""
    text = text_of(source, unit)
    program = PROGRAM.search(text)
    return (not NAMED_NAMESPACE.search(text) and 'extern "C"' not in text
            and (not program or "return" in text[program.end():]))


def file_scope_directives(text):
    """TEXT's preprocessor lines (with their continuation lines) that sit at
    file scope: one inside a function (an X-macro's #include, say) stays there."""
    lines = text.split("\n")
    # The same lines with comments and literals blanked (their line breaks kept).
    code = HIDING.sub(lambda m: "\n" * m.group(0).count("\n"), text).split("\n")
    depth, hoisted, continued = 0, [], False
    for line, bare in zip(lines, code):
        if continued or DIRECTIVE.match(line):
            if depth == 0:
                hoisted.append(line)
            continued = line.endswith("\\")
            continue
        depth += bare.count("{") - bare.count("}")
    return hoisted


def entry_point(source, unit):
    """Whether UNIT defines ::main or an extern "C" symbol: two such unwrapped
    TUs in one group would define the same name."""
    text = text_of(source, unit)
    return bool(PROGRAM.search(text)) or 'extern "C"' in text


def folder_groups(source, units):
    """Unwrapped TUs outside src/, a folder's together (one program's TUs, or
    one test executable's: they link together, so their external names do
    not clash), at most GROUP_SIZE and one entry point to a group."""
    groups = []
    for folder in sorted({os.path.dirname(u) for u in units}):
        for unit in (u for u in units if os.path.dirname(u) == folder):
            fits = [g for g in groups if os.path.dirname(g[0]) == folder and len(g) < GROUP_SIZE
                    and not (entry_point(source, unit) and any(entry_point(source, m) for m in g))]
            if fits:
                fits[0].append(unit)
            else:
                groups.append([unit])
    return groups


def groups_of(source, units, tier):
    """UNITS as unity groups of one tier: src/'s unwrapped TUs in groups of
    their own (at most GROUP_SIZE), the other unwrapped TUs in groups by
    folder, the wrapped TUs (the largest first) filling the smallest group,
    with about GROUP_SIZE to a group; the torch-free TUs (no prelude) in
    groups of their own the same way. The largest groups first, for the pool."""
    groups = []
    for name in sorted(set(tier.values()), key=lambda name: name or ""):
        members = [u for u in units if tier[u] == name]
        wrapped = [u for u in members if wrappable(source, u)]
        library = [u for u in members if u not in wrapped and u.startswith("src/")]
        count = -(-len(library) // GROUP_SIZE)
        groups += [library[i::count] for i in range(count)]
        seeded = folder_groups(source, [u for u in members if u not in wrapped and u not in library])
        seeded += [[] for _ in range(max(0, -(-len(wrapped) // GROUP_SIZE) - len(seeded)))]
        for unit in sorted(wrapped, key=lambda u: -len(text_of(source, u))):
            min(seeded, key=len).append(unit)
        groups += seeded
    return sorted(groups, key=len, reverse=True)


def unity_text(source, members):
    """One TU that includes MEMBERS: each wrappable one in a namespace of its
    own, after its preprocessor lines, its macros undefined after it."""
    parts = []
    for number, member in enumerate(members):
        path = os.path.join(source, member)
        if not wrappable(source, member):
            parts.append(f'#include "{path}"\n')
            continue
        text = text_of(source, member)
        # Quoted includes resolve against the member's own folder.
        hoisted = re.sub(r'(#[ \t]*include[ \t]*)"([^"]+)"',
                         lambda m: m.group(1) + '"' + resolve_quoted(source, member, m.group(2)) + '"',
                         "\n".join(file_scope_directives(text)))
        undefine = "".join(f"#undef {name}\n" for name in sorted(set(DEFINED.findall(text))))
        parts.append(f"{hoisted}\n{undefine}namespace loom_unity_{number} {{\n#include \"{path}\"\n}}\n{undefine}")
    return "".join(parts)


def resolve_quoted(source, unit, name):
    """NAME as UNIT's #include "NAME" finds it: next to UNIT when it is there, else unchanged."""
    beside = os.path.join(source, os.path.dirname(unit), name)
    return beside if os.path.isfile(beside) else name


def compile_all(groups, compile_group, tier, precompile):
    """Compiles GROUPS on every core; prints each failure and warning. The
    prelude builds first while the other cores compile the TUs that need none."""
    failed, warned, foreign = [], [], []
    with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        made = pool.submit(precompile) if any(tier[g[0]] for g in groups) else None
        jobs = [pool.submit(compile_group, g, None) for g in groups if tier[g[0]] is None]
        jobs += [pool.submit(compile_group, g, made) for g in groups if tier[g[0]] is not None]
        for unit, code, err in (result for job in jobs for result in job.result()):
            lines = loom_diagnostics(err)
            if code != 0:
                failed.append(unit)
                print(f"FAIL: {unit}\n" + "\n".join(failure_lines(err)[:12]))
            elif lines:
                warned.append(unit)
                print(f"WARN: {unit}\n" + "\n".join(lines[:12]))
            foreign += [f"{unit}: {p}" for p in FOREIGN_HEADER.findall(err)]
        return failed, warned, foreign, made and made.result()


def torch_version(root):
    # 2.x moved the numbers to torch/headeronly/version.h; 1.x has them in torch/version.h.
    text = "".join(open(os.path.join(root, "include", p)).read()
                   for p in ("torch/csrc/api/include/torch/version.h", "torch/headeronly/version.h")
                   if os.path.exists(os.path.join(root, "include", p)))
    return ".".join(re.search(rf"TORCH_VERSION_{part} (\d+)", text).group(1) for part in ("MAJOR", "MINOR"))


def compile_flags(source, build, root, local):
    """As meson.build compiles loom on 2.x with CUDA, NCCL and MPI on, plus -H and -fsyntax-only."""
    flags = ["-std=c++20", "-fsyntax-only", "-H", "-Wall", "-Wextra", "-Wno-missing-field-initializers",
             "-Werror=deprecated-declarations", "-DNDEBUG", "-D_GLIBCXX_USE_CXX11_ABI=1",
             "-DUSE_C10D_GLOO", "-DUSE_C10D_NCCL", "-DLOOM_WITH_CUDA=1", "-DLOOM_WITH_NCCL=1",
             "-DLOOM_WITH_MPI=1", "-pthread"]
    system = [os.path.join(source, "third_party/gloo"), os.path.join(root, "include"),
              os.path.join(root, "include/torch/csrc/api/include"), os.path.join(root, "cuda"),
              os.path.join(root, "nccl/include")]
    flags += [arg for d in system for arg in ("-isystem", d)] + mpi_include_args()
    return flags + [f"-I{os.path.join(source, d)}" for d in local] + [f"-I{os.path.join(build, 'src')}"]


def write_preludes(work):
    preludes = {}
    for name, headers in PRELUDE_HEADERS.items():
        preludes[name] = os.path.join(work, f"prelude_{name}.hpp")
        with open(preludes[name], "w") as f:
            f.write("".join(f"#include <{h}>\n" for h in headers))
    return preludes


def main():
    source, build = sys.argv[1], sys.argv[2]
    dash = sys.argv.index("--")
    compiler = sys.argv[dash + 1:]
    # --only REGEX: the TUs whose path matches (while porting; the test runs all).
    only = re.compile(sys.argv[sys.argv.index("--only") + 1]) if "--only" in sys.argv[:dash] else None
    headers = os.environ.get("LOOM_TORCH2_HEADERS", "")
    if not headers:
        print("SKIP: LOOM_TORCH2_HEADERS is not set (a folder with LibTorch 2.11's, CUDA's and NCCL's "
              "headers, e.g. ../shared/libtorch-2.11-headers)")
        return SKIP
    started = time.monotonic()
    root = unpack(headers, build)
    problems = check_gloo_config(headers, source)
    local = ("include", "src", "tests")
    flags = compile_flags(source, build, root, local)
    work = os.path.join(build, "portability")
    os.makedirs(work, exist_ok=True)
    units = [u for u in translation_units(source) if only is None or only.search(u)]
    memos = ({}, {})
    tier = {u: prelude_of(source, u, local, memos) for u in units}
    preludes = write_preludes(work)

    def precompile():
        header = preludes[PRECOMPILED]
        return subprocess.run(compiler + [f for f in flags if f != "-fsyntax-only"] +
                              ["-x", "c++-header", header, "-o", header + ".gch"], capture_output=True, text=True)

    def compile_one(unit, path=None, unity_flags=()):
        extra = [arg for name in PRELUDES.get(tier[unit], []) for arg in ("-include", preludes[name])]
        run = subprocess.run(compiler + flags + extra + list(unity_flags) + [path or os.path.join(source, unit)],
                             capture_output=True, text=True)
        return unit, run.returncode, run.stderr

    split = []  # the groups that compiled again one TU at a time

    def compile_group(members, prelude):
        """[(unit, status, stderr)]: the group as one TU when that is clean, else
        each TU alone; nothing when its PRELUDE (a future) did not compile."""
        if prelude is not None and prelude.result().returncode != 0:
            return []
        if len(members) > 1:
            unity = os.path.join(work, "unity_" + "_".join(m.replace("/", "_") for m in members)[:200] + ".cpp")
            with open(unity, "w") as f:
                f.write(unity_text(source, members))
            # A type in a member's anonymous namespace, used by a class the
            # member defines, warns only because the member is no longer the
            # main file (-Wsubobject-linkage); alone it never does.
            _, code, err = compile_one(members[0], unity, ["-Wno-subobject-linkage"])
            os.remove(unity)
            if code == 0 and not loom_diagnostics(err):
                return [(" + ".join(members), code, err)]
            split.append((members, (failure_lines(err) or loom_diagnostics(err))[:3]))
        return [compile_one(unit) for unit in members]

    try:
        groups = groups_of(source, units, tier)
        failed, warned, foreign, made = compile_all(groups, compile_group, tier, precompile)
        if made:
            problems += [f"prelude {PRECOMPILED}: {p}" for p in FOREIGN_HEADER.findall(made.stderr)]
            if made.returncode != 0:
                print(made.stderr[-4000:])
                print(f"check_portability: the 2.11 prelude '{PRECOMPILED}' does not compile", file=sys.stderr)
                return 1
    finally:
        # The precompiled prelude is 0.7 GB, and rebuilt every run.
        if os.path.exists(preludes[PRECOMPILED] + ".gch"):
            os.remove(preludes[PRECOMPILED] + ".gch")
    problems += [f"reads a header of Debian's LibTorch 1.13/Gloo: {p}" for p in foreign]
    for p in problems:
        print(p)
    for members, why in split:
        print("compiled again one TU at a time: " + " + ".join(members) + "; as one TU:\n  " + "\n  ".join(why))
    named = {"torch": "torch.h", "c10d": "c10d's headers"}
    counts = ", ".join(f"{sum(1 for t in tier.values() if t == name)} over "
                       + " and ".join(named[p] for p in PRELUDES[name]) for name in sorted(PRELUDES))
    print(f"portability: {len(units)} TUs ({counts}; compiled as {len(groups)} TUs, {len(split)} of them "
          f"again one TU at a time) against LibTorch {torch_version(root)} with CUDA, NCCL and MPI: "
          f"{len(failed)} failed, {len(warned)} with warnings from loom's code, {len(foreign)} reading "
          f"/usr/include/{{torch,ATen,c10,caffe2,gloo}}; {time.monotonic() - started:.0f} s on "
          f"{os.cpu_count()} cores")
    return 1 if failed or warned or problems else 0


if __name__ == "__main__":
    sys.exit(main())
