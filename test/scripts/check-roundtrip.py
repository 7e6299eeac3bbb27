#!/usr/bin/env python3
"""Checks that every Kiln IR input in the repository round-trips.

For each .kir file under the given folders, each '// -----' chunk that
kiln-opt accepts is printed, the printout parsed and printed again, and the
two printouts must be identical (print(parse(print(m))) == print(m)). Chunks
that kiln-opt rejects are the negative cases of --verify-diagnostics tests;
they are counted, and a file without expected-error annotations (or a
'// roundtrip: invalid' marker) may not have any. Prints one line per file and a total; exits non-zero on any failure.
"""
import os
import subprocess
import sys
import tempfile


def chunks(text):
    out, cur = [], []
    for line in text.splitlines(keepends=True):
        if line.strip() == "// -----":
            out.append("".join(cur))
            cur = []
        else:
            cur.append(line)
    out.append("".join(cur))
    return out


def kiln_opt(tool, text):
    p = subprocess.run([tool, "-"], input=text.encode(), capture_output=True)
    return p.returncode, p.stdout.decode(), p.stderr.decode()


def main():
    if len(sys.argv) < 3:
        print("usage: check-roundtrip.py KILN_OPT DIR...", file=sys.stderr)
        return 2
    tool, roots = sys.argv[1], sys.argv[2:]
    files = sorted(os.path.join(d, f) for root in roots for d, _, fs in os.walk(root) for f in fs if f.endswith(".kir"))
    total = rejected = failures = 0
    for path in files:
        text = open(path, encoding="utf-8").read()
        # Negative inputs: annotated errors, or a file that says it is invalid.
        negative = "expected-error" in text or "// roundtrip: invalid" in text
        ok = bad = 0
        for i, chunk in enumerate(chunks(text)):
            if not chunk.strip() or "func" not in chunk:
                continue
            rc, first, err = kiln_opt(tool, chunk)
            if rc != 0:
                if not negative:
                    print(f"FAIL {path} chunk {i}: rejected but the file expects no errors:\n{err}")
                    failures += 1
                rejected += 1
                continue
            rc, second, err = kiln_opt(tool, first)
            if rc != 0 or second != first:
                print(f"FAIL {path} chunk {i}: the printout does not read back to itself\n{err}")
                failures += 1
                bad += 1
                continue
            ok += 1
        total += ok
        print(f"{'FAIL' if bad else 'ok  '} {os.path.relpath(path)}: {ok} round-tripped")
    print(f"{total} chunks round-tripped in {len(files)} files, {rejected} negative chunks rejected, "
          f"{failures} failures")
    return 1 if failures or total == 0 else 0


if __name__ == "__main__":
    sys.exit(main())
