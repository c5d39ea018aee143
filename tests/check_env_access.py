#!/usr/bin/python3
"""check_env_access.py ROOT: one way to read the environment.

- Reads: no getenv / secure_getenv in include/, src/, tools/, examples/,
  bench/ or tests/ outside src/environment.cpp; everything else reads through
  cluster::env_lookup and the setting_* parsers of loom/environment.hpp.
- Writes: no setenv / unsetenv / putenv in include/, src/, tools/ or
  examples/ outside src/environment.cpp (cluster::export_variable, which
  documents who may set what). Benchmarks and tests are harnesses that set
  up the processes they measure, and may.
- docs/configuration.md's table of variables names every variable the
  library and tools read (a quoted LOOM_*, LT_*, PL_* name in their
  sources), so the table cannot fall behind the code."""
import os
import re
import sys

READ = re.compile(r"\b(secure_getenv|getenv)\s*\(")
WRITE = re.compile(r"\b(setenv|unsetenv|putenv)\s*\(")
VARIABLE = re.compile(r'"((?:LOOM|LT|PL)_[A-Z0-9_]+)"')
THE_ONE = "src/environment.cpp"
DOC = "docs/configuration.md"


def files(root, areas):
    for area in areas:
        for directory, _, names in os.walk(os.path.join(root, area)):
            for name in sorted(names):
                if name.endswith((".cpp", ".hpp", ".h")):
                    yield os.path.relpath(os.path.join(directory, name), root)


def code_of(line):
    """The line without a // comment (a rough cut: enough for this rule)."""
    return line.split("//", 1)[0]


def main():
    root = sys.argv[1]
    problems = []
    named = set()
    for path in files(root, ("include", "src", "tools", "examples", "bench", "tests")):
        if path == THE_ONE or path == "tests/catch.hpp":
            continue
        library = not path.startswith(("bench/", "tests/"))
        with open(os.path.join(root, path), encoding="utf-8") as text:
            for number, line in enumerate(text, 1):
                code = code_of(line)
                if READ.search(code):
                    problems.append(f"{path}:{number}: reads the environment itself; use cluster::env_lookup or a "
                                    f"setting_* parser (loom/environment.hpp)")
                if library and WRITE.search(code):
                    problems.append(f"{path}:{number}: sets the environment itself; use cluster::export_variable "
                                    f"(loom/environment.hpp), which says who may")
                if library:
                    named.update(VARIABLE.findall(code))
    with open(os.path.join(root, DOC), encoding="utf-8") as text:
        doc = text.read()
    for variable in sorted(named):
        if f"`{variable}`" not in doc:
            problems.append(f"{variable} is read or set by loom but not listed in {DOC}'s table of variables")
    for problem in problems:
        print("FAIL:", problem)
    if problems:
        return 1
    print(f"check_env_access: the environment is read and set only in {THE_ONE}; the {len(named)} LOOM_*, LT_* and "
          f"PL_* variables the code names are all in {DOC}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
