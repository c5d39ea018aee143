#!/usr/bin/python3
"""check_shell.py ROOT: every shell script of the repository (under tests/,
bench/, tools/ and .ci/) fails loudly and passes shellcheck.

- Each runs with `set -eu` (a sourced file too: it may be sourced by hand).
- `shellcheck -x` (every severity, notes included) reports nothing, except
  the findings listed in tests/shellcheck-exceptions.txt, each with its
  reason. An exception matches one finding: the file, the code, and a piece
  of the flagged line's text; one that matches nothing is stale and fails.
- No `# shellcheck disable=` comment in a script and no .shellcheckrc: the
  exceptions file is the one place where a finding is accepted.

Exits 77 (Meson's SKIP) when shellcheck is not installed."""
import json
import os
import re
import shutil
import subprocess
import sys

FOLDERS = ("tests", "bench", "tools", ".ci")
EXCEPTIONS = "tests/shellcheck-exceptions.txt"


def is_shell_script(path):
    if path.endswith(".sh"):
        return True
    try:
        with open(path, "rb") as text:
            first = text.readline()
    except OSError:
        return False
    return re.match(rb"#!\s*(/usr)?/bin/(env\s+)?(ba|da)?sh\b", first) is not None


def scripts(root):
    found = []
    for folder in FOLDERS:
        for directory, subfolders, files in os.walk(os.path.join(root, folder)):
            subfolders[:] = [name for name in subfolders if name != "__pycache__"]
            for name in files:
                path = os.path.join(directory, name)
                if is_shell_script(path):
                    found.append(os.path.relpath(path, root))
    return sorted(found)


def read_exceptions(root):
    """Lines `FILE<TAB>CODE<TAB>TEXT<TAB>REASON`; '#' starts a comment line."""
    exceptions = []
    with open(os.path.join(root, EXCEPTIONS), encoding="utf-8") as text:
        for number, line in enumerate(text, 1):
            line = line.rstrip("\n")
            if not line.strip() or line.startswith("#"):
                continue
            fields = line.split("\t")
            if len(fields) != 4 or not all(field.strip() for field in fields):
                sys.exit(f"{EXCEPTIONS}:{number}: want FILE<TAB>SCnnnn<TAB>text of the line<TAB>reason, got: {line}")
            exceptions.append({"file": fields[0], "code": fields[1], "text": fields[2], "reason": fields[3],
                               "where": f"{EXCEPTIONS}:{number}", "used": False})
    return exceptions


def main():
    root = sys.argv[1]
    if shutil.which("shellcheck") is None:
        print("SKIP: shellcheck is not installed (Debian's package shellcheck)")
        return 77
    problems = []
    if os.path.exists(os.path.join(root, ".shellcheckrc")):
        problems.append(".shellcheckrc exists: accepted findings belong in " + EXCEPTIONS)
    files = scripts(root)
    for path in files:
        with open(os.path.join(root, path), encoding="utf-8") as text:
            lines = text.read().splitlines()
        if not any(re.match(r"\s*set -eu\b", line) for line in lines):
            problems.append(f"{path}: does not run with `set -eu`")
        for number, line in enumerate(lines, 1):
            if re.search(r"#\s*shellcheck\s+disable", line):
                problems.append(f"{path}:{number}: a `shellcheck disable` comment; list the finding in {EXCEPTIONS}")
    run = subprocess.run(["shellcheck", "-x", "-P", "SCRIPTDIR", "-S", "style", "-f", "json1", *files], cwd=root,
                         capture_output=True, text=True, check=False)
    if run.returncode not in (0, 1):
        print(run.stderr)
        problems.append(f"shellcheck failed to run (exit {run.returncode})")
        findings = []
    else:
        findings = json.loads(run.stdout)["comments"]
    exceptions = read_exceptions(root)
    sources = {}
    for finding in findings:
        path = os.path.relpath(os.path.join(root, finding["file"]), root)
        if path not in sources:
            with open(os.path.join(root, path), encoding="utf-8") as text:
                sources[path] = text.read().splitlines()
        line = sources[path][finding["line"] - 1]
        code = f"SC{finding['code']}"
        match = next((e for e in exceptions if e["file"] == path and e["code"] == code and e["text"] in line), None)
        if match:
            match["used"] = True
            continue
        problems.append(f"{path}:{finding['line']}:{finding['column']}: {finding['level']} {code}: "
                        f"{finding['message']}\n    {line.strip()}")
    for exception in exceptions:
        if not exception["used"]:
            problems.append(f"{exception['where']}: the exception for {exception['file']} {exception['code']} "
                            f"('{exception['text']}') matches no finding any more: remove it")
    for problem in problems:
        print("FAIL:", problem)
    if problems:
        return 1
    used = sum(e["used"] for e in exceptions)
    print(f"check_shell: {len(files)} scripts run with set -eu; shellcheck reports nothing beyond "
          f"the {used} listed exception(s) of {EXCEPTIONS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
