"""Reads `kiln devices --json` on stdin and prints its facts one per line,
so that FileCheck can check them; fails if the output is not valid JSON or
lacks a field every report has."""
import json
import sys

report = json.load(sys.stdin)
for key in ("cuda_available", "problem", "kiln_cuda_version", "required_cuda_version"):
    print(f"{key}: {report[key]}")
print("message:", (report["message"] or "").splitlines()[0] if report["message"] else None)
print("verdict:", report["verdict"].splitlines()[0])
driver = report["driver"]
print("driver:", None if driver is None else f"{driver['path']} release {driver['release']} cuda {driver['cuda_version']}")
print("devices:", len(report["devices"]))
for d in report["devices"]:
    print(f"device {d['index']}: {d['name']} cc {d['compute_capability']} sms {d['multiprocessors']} "
          f"total {d['memory_total_bytes']} free {d['memory_free_bytes']} usable {d['usable']} problem {d['problem']}")
for name, lib in sorted(report["libraries"].items()):
    print(f"library {name}: found {lib['found']} required {lib['required']}")
