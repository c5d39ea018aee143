#!/usr/bin/python3
"""check_layers.py ROOT [--write-doc]: every #include of loom's code follows
the layer table, which this script holds and docs/architecture.md shows.

- include/loom/ and src/: a file of a layer includes only its own layer, the
  layers its row lists, the vocabulary headers and util/. A src/ file of
  layer X belongs to X; it may include the internal headers (src/Y/*.hpp) of
  the layers X may include. A public header never includes src/, tests/ or
  bench/; src/ never includes tests/ or bench/.
- src/pch/ holds libloom's precompiled prelude: standard and LibTorch headers,
  no loom header (so it belongs to no layer).
- tests/ and bench/ are applications over all of loom (white-box tests may
  include src/ internals); examples/ and tools/ use the public headers and
  their own files only (a tool's headers beside it: tools/bench/).
  Every quoted include of any of them must resolve inside the repository.

The table in docs/architecture.md (between its two layer-table comments) is
generated from ROWS: --write-doc rewrites it; without it the script fails
when the document differs. Prints each include the table does not allow."""
import os
import re
import sys

# Headers every layer may include: names and errors with no policy behind them.
VOCABULARY = {"errors.hpp", "devices.hpp", "compat.hpp", "compat_c10d.hpp", "comm/reduce_op.hpp", "policy_names.hpp",
              "environment.hpp"}

# The list of the built-in accelerators: every layer may read it (with
# LOOM_ACCELERATOR defined each header it names is its one torch-free line),
# and it names accelerator headers only.
ACCELERATOR_LIST = "builtin_accelerators.def"

# The table, bottom to top: (layer, what the row names, what it holds, the
# layers it may include besides itself, the vocabulary and util).
ROWS = [
    ("util", "`util/`, `loggers/`",
     "seed, rank-zero helpers, throughput and FLOPs, module holders, clip options, process states, "
     "the autocast guard, CSV/TensorBoard loggers", set()),
    ("concepts", "`concepts.hpp`, `concepts/`",
     "the contracts: `Accelerator`, `Precision`, the five `Strategy*` layers, capability traits, `diagnose_*`, "
     "the compatibility rules (`compatibility_rules.hpp`, torch-free)", set()),
    ("comm", "`comm/`",
     "process group over c10d, asynchronous `work`, fixed-shape collectives, the backend capability table, "
     "`device_mesh`", set()),
    ("cluster", "`cluster/`",
     "environments (loom, torchelastic, SLURM, MPI, LSF, Kubeflow), agreement of a static Fabric with "
     "loom-run's `LT_*`", set()),
    ("data", "`data/`", "Fashion-MNIST/IDX, tensor datasets, sampler", set()),
    ("callbacks", "`callbacks/`", "callback registry and hooks", set()),
    ("launch", "`launch/`", "supervisor, subprocess/fork launchers", {"cluster"}),
    ("accelerator", "`accelerator/`", "`cpu`, `cuda`", {"concepts"}),
    ("precision", "`precision/`", "`fp32` ... `bf16_mixed`, `fp16_mixed`, grad scaler", {"concepts"}),
    ("checkpoint", "`checkpoint/`", "`state`, the file format, atomic writes, raw state dicts",
     {"concepts", "comm"}),
    ("tp", "`tp/`",
     "tensor parallel: styles, the layers a plan configures (`tp::Linear`, `tp::Embedding`), `parallelize_module`",
     {"comm"}),
    ("strategy", "`strategy/`",
     "`single_device`, `parallel`, `ddp`, `fsdp`, `deepspeed`, `model_parallel` and their engines",
     {"concepts", "comm", "cluster", "launch", "checkpoint", "tp"}),
    ("wrap", "`wrap/`", "what `setup` returns: module, optimizer, data loader wrappers",
     {"concepts", "data", "strategy", "precision"}),
    ("fabric",
     "`basic_fabric.hpp`, `static_backend.hpp`, `fabric.hpp` (+ `fabric_options.hpp`, `fabric_services.hpp`, "
     "`compatibility.hpp`)",
     "the one facade `basic_fabric<Derived, Backend>`; `static_backend<A, S, P>`, where the three policies meet; "
     "`Fabric<A, S, P>`",
     {"concepts", "comm", "cluster", "launch", "checkpoint", "accelerator", "precision", "strategy", "wrap", "data",
      "callbacks", "tp"}),
    ("runtime", "`runtime/`, `any_fabric.hpp`",
     "connector, registry, `erased_backend`, `fabric_model` (one compiled `Fabric` behind `fabric_interface`), "
     "`AnyFabric`",
     {"concepts", "comm", "cluster", "launch", "checkpoint", "accelerator", "precision", "strategy", "wrap", "data",
      "callbacks", "fabric", "tp"}),
    ("trainer", "`trainer/`", "`loom::trainer`, its loop, callbacks and schedulers",
     {"concepts", "comm", "cluster", "launch", "checkpoint", "accelerator", "precision", "strategy", "wrap", "data",
      "callbacks", "fabric", "runtime", "tp"}),
]
ALLOWED = {layer: allowed for layer, _, _, allowed in ROWS}
ALLOWED["umbrella"] = None  # loom.hpp: everything

# Files a build generates (not in the repository) that src/ may include.
GENERATED = {"loom_tensorboard.pb.h"}

DOC = "docs/architecture.md"
BEGIN = "<!-- layer table: generated from tests/check_layers.py (--write-doc); do not edit by hand -->"
END = "<!-- end of the layer table -->"


def layer_of(inside):
    """inside: a path under include/loom/ or src/, e.g. strategy/ddp.hpp."""
    if inside in VOCABULARY or inside.removesuffix(".cpp") + ".hpp" in VOCABULARY:  # src/environment.cpp too
        return "vocabulary"
    if inside == ACCELERATOR_LIST:
        return "accelerator list"
    head = inside.split("/")[0]
    if head == "loggers":
        return "util"
    if head in ("concepts.hpp", "concepts"):
        return "concepts"
    if head in ("fabric.hpp", "basic_fabric.hpp", "static_backend.hpp", "fabric_options.hpp", "fabric_services.hpp",
                "compatibility.hpp"):
        return "fabric"
    if head == "any_fabric.hpp":
        return "runtime"
    if head == "loom.hpp":
        return "umbrella"
    return head


def may_include(source, target):
    if source == "accelerator list":
        return target == "accelerator"
    if source == "umbrella" or target in (source, "vocabulary", "accelerator list"):
        return True
    if source == "vocabulary":
        return False
    return target == "util" or target in ALLOWED.get(source, set())


def generated_table():
    lines = [BEGIN, "", "| layer | holds | may include |", "|---|---|---|"]
    below = []
    for layer, names, holds, allowed in ROWS:
        if not allowed:
            listed = "—"
        elif set(below) - {"util"} <= allowed:
            listed = "all of the above"
        else:
            listed = ", ".join(f"`{name}/`" for name in sorted(allowed, key=[row[0] for row in ROWS].index))
        lines.append(f"| {names} | {holds} | {listed} |")
        below.append(layer)
    lines += ["", END]
    return "\n".join(lines)


def check_doc(root, write):
    path = os.path.join(root, DOC)
    with open(path, encoding="utf-8") as text:
        doc = text.read()
    if BEGIN not in doc or END not in doc:
        return [f"{DOC} has no generated layer table ({BEGIN} ... {END})"]
    start = doc.index(BEGIN)
    end = doc.index(END) + len(END)
    table = generated_table()
    if doc[start:end] == table:
        return []
    if write:
        with open(path, "w", encoding="utf-8") as text:
            text.write(doc[:start] + table + doc[end:])
        print(f"check_layers: wrote the layer table into {DOC}")
        return []
    return [f"{DOC}'s layer table differs from tests/check_layers.py's rules: run "
            f"tests/check_layers.py . --write-doc"]


def resolve(root, path, included):
    """A quoted include: next to the file, then under src/ and include/ (the
    include directories the build gives)."""
    for base in (os.path.dirname(path), os.path.join(root, "src"), os.path.join(root, "include")):
        candidate = os.path.normpath(os.path.join(base, included))
        if os.path.isfile(candidate):
            return os.path.relpath(candidate, root)
    return None


def where(relative):
    """(area, layer) of a repository path."""
    parts = relative.split("/")
    if parts[0] == "include" and parts[1] == "loom":
        return "include", layer_of("/".join(parts[2:]))
    if parts[0] == "src":
        return "src", layer_of("/".join(parts[1:]))
    return parts[0], "application"


def sources(root):
    for area in ("include", "src", "tests", "bench", "examples", "tools"):
        for directory, subfolders, files in os.walk(os.path.join(root, area)):
            subfolders[:] = sorted(name for name in subfolders if name != "torch_stand_in")
            for name in sorted(files):
                if name.endswith((".hpp", ".cpp", ".h", ".def")) and name != "catch.hpp":
                    yield os.path.join(directory, name)


def check_prelude(relative, path):
    """src/pch/ holds libloom's precompiled prelude: standard and LibTorch headers only, no layer's."""
    with open(path, encoding="utf-8") as text:
        return [f"{relative}:{number}: a precompiled prelude includes no loom header ({line.strip()})"
                for number, line in enumerate(text, 1)
                if re.match(r'\s*#\s*include\s*(<loom/|")', line)], 0


def check_file(root, path):
    relative = os.path.relpath(path, root)
    if relative.startswith("src/pch/"):
        return check_prelude(relative, path)
    area, source = where(relative)
    problems, count = [], 0
    if area in ("include", "src") and source not in ALLOWED and source not in ("vocabulary", "accelerator list"):
        return [f"{relative}: layer '{source}' is not in the table"], 0
    with open(path, encoding="utf-8") as text:
        for number, line in enumerate(text, 1):
            match = re.match(r'\s*#\s*include\s*([<"])([^>"]+)[>"]', line)
            if not match:
                continue
            bracket, included = match.groups()
            here = f"{relative}:{number}"
            if bracket == "<":
                if not included.startswith("loom/"):
                    continue
                count += 1
                if not os.path.isfile(os.path.join(root, "include", included)):
                    problems.append(f"{here}: <{included}> is not a public header")
                    continue
                target_area, target = "include", layer_of(included[len("loom/"):])
            else:
                count += 1
                if included in GENERATED and area == "src":
                    continue
                target_path = resolve(root, path, included)
                if target_path is None:
                    problems.append(f'{here}: "{included}" does not resolve inside the repository')
                    continue
                target_area, target = where(target_path)
                if target_area in ("include", "src", "tests", "bench") or \
                        (target_area == area and area in ("examples", "tools")):
                    pass
                else:
                    problems.append(f'{here}: "{included}" reaches {target_path}, outside loom\'s code')
                    continue
                included = target_path
            if area == "include" and target_area != "include":
                problems.append(f"{here}: a public header includes {included} ({target_area}/ is not installed)")
            elif area in ("include", "src") and target_area in ("tests", "bench"):
                problems.append(f"{here}: the library includes {included} (tests and benchmarks sit above it)")
            elif area in ("examples", "tools") and target_area not in ("include", area):
                problems.append(f"{here}: {area}/ uses loom's public headers only, not {included}")
            elif area in ("include", "src") and not may_include(source, target):
                kind = "an internal header of" if target_area == "src" else "layer"
                problems.append(f"{here}: '{source}' may not include {kind} '{target}' ({included})")
    return problems, count


# The engines behind the strategies, compiled in src/ and reached through
# calls declared beside a forward declaration (ddp.hpp, fsdp_engine_calls.hpp,
# parallel.hpp, deepspeed.hpp): the umbrella header reaches none of them, so
# no program that includes it parses them (tests and benchmarks that read an
# engine's own state include its header themselves).
UMBRELLA = "loom/loom.hpp"
ENGINE_INTERNALS = {"loom/launch/supervisor.hpp", "loom/strategy/ddp_engine.hpp", "loom/strategy/fsdp_engine.hpp",
                    "loom/strategy/nvme_stream.hpp", "loom/strategy/zero_config.hpp",
                    "loom/strategy/distributed_runtime.hpp"}


def umbrella_reach(root):
    """Every loom header <loom/loom.hpp> includes, directly or not, each with the header that includes it."""
    reached, pending = {UMBRELLA: None}, [UMBRELLA]
    while pending:
        header = pending.pop()
        with open(os.path.join(root, "include", header), encoding="utf-8") as text:
            for line in text:
                match = re.match(r"\s*#\s*include\s*<(loom/[^>]+)>", line)
                if match and match.group(1) not in reached and \
                        os.path.isfile(os.path.join(root, "include", match.group(1))):
                    reached[match.group(1)] = header
                    pending.append(match.group(1))
    return reached


def check_umbrella(root):
    reached = umbrella_reach(root)
    problems = []
    for internal in sorted(ENGINE_INTERNALS & reached.keys()):
        chain, header = [], internal
        while header is not None:
            chain.append(header)
            header = reached[header]
        problems.append(f"<{UMBRELLA}> reaches the engine header <{internal}> ({' <- '.join(chain)}): a strategy "
                        f"header reaches its engine through calls compiled in src/, not through the engine's header")
    return problems


def main():
    root = sys.argv[1]
    write = "--write-doc" in sys.argv[2:]
    problems = check_doc(root, write) + check_umbrella(root)
    count = 0
    files = 0
    for path in sources(root):
        found, includes = check_file(root, path)
        problems += found
        count += includes
        files += 1
    for problem in problems:
        print("FAIL:", problem)
    if problems:
        return 1
    print(f"check_layers: {count} includes of loom's own files in {files} files (include/, src/, tests/, bench/, "
          f"examples/, tools/) follow the layer table, and {DOC} shows the table; <{UMBRELLA}> reaches "
          f"{len(umbrella_reach(root)) - 1} loom headers, no engine header")
    return 0


if __name__ == "__main__":
    sys.exit(main())
