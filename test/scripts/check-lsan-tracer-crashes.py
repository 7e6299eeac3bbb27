"""scripts/lsan-tracer-crashes on ctest logs written here: a failure that is
only LeakSanitizer's tracer crashing after the test passed is told apart
from a failed assertion, a sanitizer report, a failure without the crash,
and a run where another test failed for a real reason.

Usage: check-lsan-tracer-crashes.py SCRIPT WORK_DIR
"""
import pathlib
import subprocess
import sys

script, work = sys.argv[1], pathlib.Path(sys.argv[2])


def block(number, name, output, passed):
    return (f"{number}/9 Testing: {name}\n{number}/9 Test: {name}\nCommand: \"kiln-unit-tests\"\n"
            f"Directory: /build/test\n\"{name}\" start time: Nov 29 13:14 UTC\nOutput:\n"
            f"----------------------------------------------------------\n{output}<end of output>\n"
            f"Test time =   1.75 sec\n----------------------------------------------------------\n"
            f"Test {'Passed' if passed else 'Failed'}.\n----------------------------------------------------------\n\n")


PASSED = "[ RUN      ] A.B\n[       OK ] A.B (3 ms)\n[  PASSED  ] 1 test.\n"
CRASH = ("Tracer caught signal 11: addr=0x1f38 pc=0x558e9a345c6a sp=0x7ff9bb4afd10\n"
         "==14812==LeakSanitizer has encountered a fatal error.\n")
ASSERTION = "[ RUN      ] A.B\nA.cpp:3: Failure\n[  FAILED  ] A.B (3 ms)\n[  FAILED  ] 1 test, listed below:\n"
LEAK = "==1==ERROR: LeakSanitizer: detected memory leaks\nDirect leak of 8 byte(s)\n"


def classify(tests):
    """tests: (name, output, failed). Returns the script's status and output."""
    temporary = work / "Testing" / "Temporary"
    temporary.mkdir(parents=True, exist_ok=True)
    log = "Start testing: Nov 29 13:14 UTC\n----------------------------------------------------------\n"
    failed = ""
    for number, (name, output, fails) in enumerate(tests, 1):
        log += block(number, name, output, not fails)
        if fails:
            failed += f"{number}:{name}\n"
    (temporary / "LastTest.log").write_text(log)
    (temporary / "LastTestsFailed.log").write_text(failed)
    run = subprocess.run([sys.executable, script, str(work)], capture_output=True, text=True)
    return run.returncode, run.stdout.splitlines()


cases = [
    ("only tracer crashes", [("A.B", PASSED + CRASH, True), ("C.D", PASSED, False),
                             ("E.F/1  # GetParam() = 2", PASSED + CRASH, True)], 0),
    ("assertion failed before the crash", [("A.B", ASSERTION + CRASH, True)], 1),
    ("a leak reported, then the crash", [("A.B", PASSED + LEAK + CRASH, True)], 1),
    ("failed without the crash", [("A.B", PASSED, True)], 1),
    ("a crash and a real failure", [("A.B", PASSED + CRASH, True), ("C.D", ASSERTION, True)], 1),
    ("nothing failed", [("A.B", PASSED, False)], 1),
]
bad = 0
for title, tests, want in cases:
    status, names = classify(tests)
    expected_names = [n for n, _, fails in tests if fails] if want == 0 else []
    if status != want or (want == 0 and names != expected_names):
        print(f"FAIL {title}: status {status} (want {want}), printed {names}")
        bad += 1
    else:
        print(f"ok   {title}")
sys.exit(1 if bad else 0)
