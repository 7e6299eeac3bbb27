#!/usr/bin/env python3
"""Bytes per second of generated transpose kernels, shape by shape, for one or more Kiln binaries (before and after
a change to codegen/Lowering.cpp's tiling, transposeTiling).

Each case is a small Kiln IR function (written to a temporary folder with zero-filled .npy inputs, so nothing but
the standard library is needed): a transpose alone, or a transpose inside an elementwise group (an optimizer update
reading a transposed gradient). The shapes are those of issue 28's profiles: the MLP training step's [1024,1024] and
[1024,256] weight-gradient transposes, the GPT step's [8,128,1024] -> [8,1024,128] batched transposes and its
attention heads, a channel shuffle and an NCHW -> NHWC reorder; and, as the bound to compare with, an elementwise
copy (neg) of as many bytes.

  python3 bench/transposes.py --kiln OLD/kiln --kiln build/tools/kiln [--threads 2] [--runs 20] [--rounds 3]

For each case and binary: `kiln run CASE.kir --bench RUNS --threads N --profile`, rounds interleaved between the
binaries; the table gives the least over rounds of the run's minimum (ms) and of the profile's mean time of the
transposing step, and the bytes that step reads and writes divided by that minimum (GB/s). On a loaded machine
the numbers are rough: look at the ratio.
"""
import argparse
import os
import re
import struct
import subprocess
import sys
import tempfile

# (name, function text, inputs {name: shape}, bytes moved by the transposing step, pattern of its profile row)
CASES = []


def case(name, text, inputs, moved, row):
    CASES.append((name, text, inputs, moved, row))


def transpose_case(name, shape, perm):
    out = [shape[p] for p in perm]
    dims = lambda s: ",".join(map(str, s))
    text = (f"func @t(%x: f32[{dims(shape)}]) -> f32[{dims(out)}] {{\n"
            f"  %y = transpose(%x) {{perm = [{', '.join(map(str, perm))}]}} : f32[{dims(out)}]\n"
            f"  return %y\n}}\n")
    n = 1
    for d in shape:
        n *= d
    case(name, text, {"x": shape}, 2 * 4 * n, r"transpose -> f32\[" + re.escape(dims(out)) + r"\]")


# The copy each transpose is measured against: an elementwise kernel moving as many bytes, written into a result
# allocated (and first touched) each run as a transpose's is.
case("copy (neg) [1024,1024]",
     "func @t(%x: f32[1024,1024]) -> f32[1024,1024] {\n  %y = neg(%x) : f32[1024,1024]\n  return %y\n}\n",
     {"x": [1024, 1024]}, 2 * 4 * 1024 * 1024, r"neg -> f32\[1024,1024\]")
case("copy (neg) [8,128,1024]",
     "func @t(%x: f32[8,128,1024]) -> f32[8,128,1024] {\n  %y = neg(%x) : f32[8,128,1024]\n  return %y\n}\n",
     {"x": [8, 128, 1024]}, 2 * 4 * 8 * 128 * 1024, r"neg -> f32\[8,128,1024\]")
transpose_case("mlp [1024,1024]^T", [1024, 1024], [1, 0])
transpose_case("mlp [256,1024]^T", [256, 1024], [1, 0])
transpose_case("mlp [1024,784]^T", [1024, 784], [1, 0])
transpose_case("gpt [8,128,1024] (0,2,1)", [8, 128, 1024], [0, 2, 1])
transpose_case("gpt K^T [8,4,128,64] (0,1,3,2)", [8, 4, 128, 64], [0, 1, 3, 2])
transpose_case("gpt heads [8,128,4,64] (0,2,1,3)", [8, 128, 4, 64], [0, 2, 1, 3])
transpose_case("nchw->nhwc [1,64,56,56]", [1, 64, 56, 56], [0, 2, 3, 1])
transpose_case("nhwc->nchw [1,56,56,64]", [1, 56, 56, 64], [0, 3, 1, 2])
transpose_case("shuffle nhwc [1,28,28,2,58]", [1, 28, 28, 2, 58], [0, 1, 2, 4, 3])
transpose_case("vit [1,197,12,64] (0,2,3,1)", [1, 197, 12, 64], [0, 2, 3, 1])
# An SGD step reading a transposed gradient: w - 0.01 * g^T (3 arrays of 4 MB).
case("sgd w - lr*g^T [1024,1024]",
     "func @t(%w: f32[1024,1024], %g: f32[1024,1024]) -> f32[1024,1024] {\n"
     "  %gt = transpose(%g) {perm = [1, 0]} : f32[1024,1024]\n"
     "  %lr = constant() {value = dense<f32[]>[0.01]} : f32[]\n"
     "  %s = mul(%gt, %lr) : f32[1024,1024]\n"
     "  %y = sub(%w, %s) : f32[1024,1024]\n"
     "  return %y\n}\n",
     {"w": [1024, 1024], "g": [1024, 1024]}, 3 * 4 * 1024 * 1024, r"fused\(.*transpose.*\) -> f32\[1024,1024\]")


def write_npy(path, shape):
    n = 1
    for d in shape:
        n *= d
    header = "{'descr': '<f4', 'fortran_order': False, 'shape': (%s), }" % "".join("%d," % d for d in shape)
    header += " " * (63 - (len(header) + 10) % 64) + "\n"
    with open(path, "wb") as f:
        f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode() + bytes(4 * n))


def run(kiln, folder, name, inputs, args, row):
    cmd = [kiln, "run", os.path.join(folder, name + ".kir"), "--bench", str(args.runs), "--threads", str(args.threads),
           "--profile", "--profile-rows", "0"]
    for input_name in inputs:
        cmd += ["--input", f"{input_name}={os.path.join(folder, name + '.' + input_name + '.npy')}"]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{done.stderr}")
    text = done.stdout + done.stderr
    least = float(re.search(r"min ([0-9.]+) ms", text).group(1))
    step = None
    for line in text.splitlines():
        fields = line.split()
        if len(fields) > 4 and re.search(row, line):
            step = float(fields[2])
    if step is None:
        sys.exit(f"no profile row matching {row!r} in:\n{text}")
    return least, step


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kiln", action="append", required=True, help="a kiln binary (repeatable)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--cases", default="", help="a regular expression: only the cases it finds")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        rows = []
        for index, (name, text, inputs, moved, row) in enumerate(CASES):
            if args.cases and not re.search(args.cases, name):
                continue
            stem = f"case{index}"
            with open(os.path.join(folder, stem + ".kir"), "w") as f:
                f.write(text)
            for input_name, shape in inputs.items():
                write_npy(os.path.join(folder, stem + "." + input_name + ".npy"), shape)
            best = [(float("inf"), float("inf")) for _ in args.kiln]
            for _ in range(args.rounds):
                for k, kiln in enumerate(args.kiln):
                    least, step = run(kiln, folder, stem, inputs, args, row)
                    best[k] = (min(best[k][0], least), min(best[k][1], step))
            rows.append((name, moved, best))
        print(f"{args.threads} threads; per binary: run minimum ms / step mean ms / GB/s (bytes moved / step mean)")
        print("| case | MB moved | " + " | ".join(f"`{k}`" for k in args.kiln) + " |")
        print("|---|---:|" + "---:|" * len(args.kiln))
        for name, moved, best in rows:
            cells = [f"{least:.3f} / {step:.3f} / {moved / step / 1e6:.1f}" for least, step in best]
            print(f"| {name} | {moved / 1e6:.1f} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
