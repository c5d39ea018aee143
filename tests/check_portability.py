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
headers (never loom's): `torch` (torch/torch.h), or `distributed` (that and
c10d's Gloo, NCCL and Reducer headers) for the TUs whose includes reach c10d.
Two tiers, because every TU pays for the prelude's pending template
instantiations (about 4 s for torch.h, 5.5 s with c10d on this machine's
g++ 12), and most TUs never touch c10d. TUs that reach no LibTorch header
compile without a prelude.

To pay that fixed cost less often, TUs of one folder and one tier compile
GROUP_SIZE at a time as one TU that #includes them (a unity TU); a program's
TU (one with main) compiles alone. A group that fails, or warns from loom's
code, compiles again one TU at a time, and those results are the ones
reported: a name two TUs both define (in anonymous namespaces, say) never
fails the check, and every failure names its own TU. What a unity TU cannot
tell is a TU that compiles only after another one's includes; the torch.h
prelude already hides most of those, and the 1.13 build and
header_self_containment compile each TU and header alone.
"""
import concurrent.futures
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time

SKIP = 77
GROUP_SIZE = 6
PROGRAM = re.compile(r"^\s*int\s+main\s*\(", re.M)
TREES = ("src", "tools", "examples", "tests", "bench")
# Not loom TUs to port: compile_fail's cases must fail; consumers/ are
# separate projects built by their own tests.
EXCLUDED = ("tests/compile_fail/", "tests/consumers/")
TORCH_INCLUDE = re.compile(r'#\s*include\s*[<"](torch|ATen|c10|caffe2)/')
C10D_INCLUDE = re.compile(r'#\s*include\s*[<"]torch/csrc/distributed/')
PRELUDES = {
    "torch": ["torch/torch.h"],
    "distributed": ["torch/torch.h", "torch/csrc/distributed/c10d/ProcessGroupGloo.hpp",
                    "torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp", "torch/csrc/distributed/c10d/reducer.hpp"],
}
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


def reaches(pattern, source, unit, search, memo):
    """Whether UNIT's own includes (followed through the repository) reach a line matching PATTERN."""
    if unit in memo:
        return memo[unit]
    memo[unit] = False
    text = open(os.path.join(source, unit), errors="replace").read()
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


def groups_of(source, units, tier):
    """UNITS in groups of one folder and one tier, at most GROUP_SIZE each; programs and
    torch-free TUs (cheap: no prelude) alone. The largest groups first, for the pool."""
    by_key, alone = {}, []
    for unit in units:
        if tier[unit] is None or PROGRAM.search(open(os.path.join(source, unit), errors="replace").read()):
            alone.append([unit])
        else:
            by_key.setdefault((tier[unit], os.path.dirname(unit)), []).append(unit)
    grouped = [members[i:i + GROUP_SIZE] for members in by_key.values()
               for i in range(0, len(members), GROUP_SIZE)]
    return sorted(grouped, key=len, reverse=True) + alone


def compile_all(groups, compile_group):
    """Compiles GROUPS on every core; prints each failure and warning."""
    failed, warned, foreign = [], [], []
    with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        for unit, code, err in (result for results in pool.map(compile_group, groups) for result in results):
            lines = loom_diagnostics(err)
            if code != 0:
                failed.append(unit)
                print(f"FAIL: {unit}\n" + "\n".join(failure_lines(err)[:12]))
            elif lines:
                warned.append(unit)
                print(f"WARN: {unit}\n" + "\n".join(lines[:12]))
            foreign += [f"{unit}: {p}" for p in FOREIGN_HEADER.findall(err)]
    return failed, warned, foreign


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


def write_preludes(work, tiers):
    preludes = {}
    for name in sorted(set(tiers) - {None}):
        preludes[name] = os.path.join(work, f"prelude_{name}.hpp")
        with open(preludes[name], "w") as f:
            f.write("".join(f"#include <{h}>\n" for h in PRELUDES[name]))
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
    preludes = write_preludes(work, tier.values())

    def precompile(name):
        header = preludes[name]
        return name, subprocess.run(compiler + [f for f in flags if f != "-fsyntax-only"] +
                                    ["-x", "c++-header", header, "-o", header + ".gch"],
                                    capture_output=True, text=True)

    def compile_one(unit, path=None, unity_flags=()):
        extra = ["-include", preludes[tier[unit]]] if tier[unit] else []
        run = subprocess.run(compiler + flags + extra + list(unity_flags) + [path or os.path.join(source, unit)],
                             capture_output=True, text=True)
        return unit, run.returncode, run.stderr

    split = []  # the groups that compiled again one TU at a time

    def compile_group(members):
        """[(unit, status, stderr)]: the group as one TU when that is clean, else each TU alone."""
        if len(members) > 1:
            unity = os.path.join(work, "unity_" + "_".join(m.replace("/", "_") for m in members)[:200] + ".cpp")
            with open(unity, "w") as f:
                f.write("".join(f'#include "{os.path.join(source, m)}"\n' for m in members))
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
        with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
            for name, made in pool.map(precompile, preludes):
                problems += [f"prelude {name}: {p}" for p in FOREIGN_HEADER.findall(made.stderr)]
                if made.returncode != 0:
                    print(made.stderr[-4000:])
                    print(f"check_portability: the 2.11 prelude '{name}' does not compile", file=sys.stderr)
                    return 1
        groups = groups_of(source, units, tier)
        failed, warned, foreign = compile_all(groups, compile_group)
    finally:
        # The precompiled preludes are 0.7-0.9 GB each, and rebuilt every run.
        for header in preludes.values():
            if os.path.exists(header + ".gch"):
                os.remove(header + ".gch")
    problems += [f"reads a header of Debian's LibTorch 1.13/Gloo: {p}" for p in foreign]
    for p in problems:
        print(p)
    for members, why in split:
        print("compiled again one TU at a time: " + " + ".join(members) + "; as one TU:\n  " + "\n  ".join(why))
    counts = ", ".join(f"{sum(1 for t in tier.values() if t == name)} over the {name} prelude"
                       for name in sorted(preludes))
    print(f"portability: {len(units)} TUs ({counts}; compiled as {len(groups)} TUs, {len(split)} of them "
          f"again one TU at a time) against LibTorch {torch_version(root)} with CUDA, NCCL and MPI: "
          f"{len(failed)} failed, {len(warned)} with warnings from loom's code, {len(foreign)} reading "
          f"/usr/include/{{torch,ATen,c10,caffe2,gloo}}; {time.monotonic() - started:.0f} s on "
          f"{os.cpu_count()} cores")
    return 1 if failed or warned or problems else 0


if __name__ == "__main__":
    sys.exit(main())
