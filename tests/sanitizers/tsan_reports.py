#!/usr/bin/python3
"""tsan_reports.py SOURCE_ROOT BUILD_DIR REPORT_FILE...: ThreadSanitizer's
reports, split by the one rule tests/sanitize.sh applies: a report is loom's
when a frame of its racing accesses (or of the lock or signal it is about)
lies in loom's code: a file under SOURCE_ROOT's src/, include/, tests/,
tools/ or bench/ (the symbolizer prints them relative to BUILD_DIR), or,
whatever its source, an address in a binary BUILD_DIR built (libloom, the
tests, the tools, named by file name: a LibTorch header inlined there counts
as loom's); a report none of whose frames is loom's lies wholly in LibTorch,
Gloo, Open MPI or the C++ runtime, which are not instrumented, and is
counted as theirs, by library. No report with a loom frame is ever set
aside. Prints each loom report in full and a count per library for the
rest; exits 1 when any report is loom's."""
import collections
import os
import re
import sys

FRAME = re.compile(r"^\s+#\d+ (?P<function>.*?) (?P<location>\S+) \((?P<module>[^+)]+)\+0x[0-9a-f]+\)")
# Sections of a report that are not the racing accesses: where a thread, a
# mutex or a heap block came from. A frame there says who created the
# thing, not who raced on it.
ORIGIN = re.compile(r"^\s+(Thread T\d+|Mutex M\d+|Location is|Previous .*(created|allocated)|.* created at:)")


def reports_of(text):
    for block in text.split("==================\n"):
        if "WARNING: ThreadSanitizer:" in block:
            yield block.strip("\n")


def is_loom(frame, roots, build_dir):
    location = frame.group("location").rsplit(":", 2)[0]
    if not os.path.isabs(location):
        location = os.path.join(build_dir, location)
    location = os.path.realpath(location)
    # The runtime names a module by its file name (libloom.so.0, ddp_worker).
    module = os.path.basename(frame.group("module"))
    built_here = module.startswith("libloom.so") or any(
        os.path.isfile(os.path.join(build_dir, folder, module)) for folder in ("tests", "tools", "bench"))
    return any(location.startswith(root) for root in roots) or built_here


def loom_frames(report, roots, build_dir):
    frames, in_origin = [], False
    for line in report.splitlines():
        if ORIGIN.match(line):
            in_origin = True
        elif re.match(r"^\s+(Write|Read|Atomic|Previous (write|read)|Mutex .* acquired|Call to|Cycle|Signal)", line):
            in_origin = False
        match = FRAME.match(line)
        if match and not in_origin:
            frames.append(match)
    mine = [f for f in frames if is_loom(f, roots, build_dir)]
    return frames, mine


def main():
    source = os.path.realpath(sys.argv[1])
    build_dir = os.path.realpath(sys.argv[2])
    roots = [os.path.join(source, folder) + "/" for folder in ("src", "include", "tests", "tools", "bench")]
    loom_reports, theirs = [], collections.Counter()
    total = 0
    for path in sys.argv[3:]:
        with open(path, encoding="utf-8", errors="replace") as text:
            for report in reports_of(text.read()):
                total += 1
                frames, mine = loom_frames(report, roots, build_dir)
                if mine:
                    loom_reports.append((path, report))
                else:
                    modules = sorted({os.path.basename(f.group("module")) for f in frames}) or ["(no frames)"]
                    theirs[", ".join(modules)] += 1
    for path, report in loom_reports:
        print(f"--- a report with loom frames ({path}):\n{report}\n")
    for modules, count in theirs.most_common():
        print(f"not loom's: {count} report(s) whose frames all lie in {modules}")
    print(f"tsan_reports: {total} report(s), {len(loom_reports)} with a loom frame")
    return 1 if loom_reports else 0


if __name__ == "__main__":
    sys.exit(main())
