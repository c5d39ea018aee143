#!/usr/bin/python3
"""check_tsan_reports.py SOURCE_ROOT BUILD_DIR: tsan_reports.py's rule on two
reports written as ThreadSanitizer writes them (loom's frames relative to the
build directory, modules by file name): the one with a frame in loom's src/ is loom's, even when
the frame is the only one; the one whose racing accesses are all LibTorch's
(loom only created the thread) is not. Exits 0 when both are judged so."""
import os
import subprocess
import sys
import tempfile

source, build = os.path.realpath(sys.argv[1]), os.path.realpath(sys.argv[2])
loom_file = os.path.relpath(os.path.join(source, "src", "comm", "watchdog.cpp"), build)
REPORTS = f"""==================
WARNING: ThreadSanitizer: data race (pid=1)
  Write of size 8 at 0x7b0400000000 by thread T1:
    #0 loom::comm::watchdog::tick() {loom_file}:10 (libloom.so.0+0x1234)
    #1 start_thread nptl/pthread_create.c:442 (libc.so.6+0x89)

  Previous read of size 8 at 0x7b0400000000 by main thread:
    #0 c10::foo() <null> (libc10.so+0x99)

  Thread T1 (tid=2, running) created by main thread at:
    #0 pthread_create <null> (libtsan.so.2+0x5)
==================
==================
WARNING: ThreadSanitizer: data race (pid=1)
  Write of size 8 at 0x7b0400000000 by thread T2:
    #0 at::foo() <null> (libtorch_cpu.so.1.13+0x1234)

  Previous read of size 8 at 0x7b0400000000 by main thread:
    #0 c10::foo() <null> (libc10.so+0x99)

  Thread T2 (tid=3, running) created by main thread at:
    #0 pthread_create <null> (libtsan.so.2+0x5)
    #1 loom::start() {loom_file}:3 (libloom.so.0+0x5)
==================
"""
with tempfile.TemporaryDirectory() as work:
    path = os.path.join(work, "tsan.1")
    with open(path, "w", encoding="utf-8") as out:
        out.write(REPORTS)
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tsan_reports.py")
    run = subprocess.run([sys.executable, script, source, build, path], capture_output=True, text=True, check=False)
print(run.stdout)
ok = run.returncode == 1 and "tsan_reports: 2 report(s), 1 with a loom frame" in run.stdout and \
    "watchdog::tick" in run.stdout.split("not loom's")[0]
print("tsan_reports rule: " + ("as expected" if ok else f"WRONG (exit {run.returncode})"))
sys.exit(0 if ok else 1)
