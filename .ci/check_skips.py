#!/usr/bin/python3
"""check_skips.py TESTLOG ALLOWED: fails when Meson's test log holds a
skipped test (exit 77) that ALLOWED does not list, and prints every skip with
its reason. TESTLOG is meson-logs/testlog.json (one JSON object a line)."""
import json
import sys


def read_allowed(path):
    allowed = {}
    with open(path, encoding="utf-8") as text:
        for number, line in enumerate(text, 1):
            if not line.strip() or line.startswith("#"):
                continue
            name, _, reason = line.rstrip("\n").partition("\t")
            if not reason.strip():
                sys.exit(f"{path}:{number}: an entry needs a reason after a tab: {line.strip()}")
            allowed[name] = reason
    return allowed


def main():
    testlog, allowed_path = sys.argv[1], sys.argv[2]
    allowed = read_allowed(allowed_path)
    ran = skipped = passed = failed = 0
    refused = []
    with open(testlog, encoding="utf-8") as text:
        for line in text:
            if not line.strip():
                continue
            test = json.loads(line)
            ran += 1
            result = test.get("result")
            if result in ("OK", "EXPECTEDFAIL"):
                passed += 1
            elif result != "SKIP":
                failed += 1
            if result != "SKIP":
                continue
            skipped += 1
            name = test["name"]
            suites = [suite.split(":")[-1] for suite in test.get("suite", [])]
            reason = allowed.get(name) or next((allowed[f"suite:{s}"] for s in suites if f"suite:{s}" in allowed), None)
            why = (test.get("stdout") or "").strip().splitlines()
            said = why[-1] if why else "(no output)"
            if reason:
                print(f"check_skips: {name} skipped, as allowed: {reason}")
            else:
                refused.append(f"{name} reported SKIP ({said}); CI must run it: install what it needs "
                               f"(tools/debian-packages.txt), or list it in {allowed_path} with the reason")
    for problem in refused:
        print("check_skips: FAIL:", problem, file=sys.stderr)
    if ran == 0:
        print(f"check_skips: FAIL: {testlog} lists no test", file=sys.stderr)
        return 1
    if not refused:
        print(f"check_skips: every one of the {skipped} skip(s) is allowed")
    # The closing line CI reads; a refused skip counts as a failure.
    print(f"tests: {passed} passed, {failed + len(refused)} failed, {skipped - len(refused)} skipped")
    return 1 if refused or failed else 0


if __name__ == "__main__":
    sys.exit(main())
