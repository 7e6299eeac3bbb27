#!/usr/bin/env python3
"""Relative errors of long f32 sums (docs/codegen.md, "Long sums").

For each size 2^k and seed, sums n uniform floats in [0, 1) with
`kiln run` (reduce_sum over f32[n] to a scalar) on the devices asked for,
and compares with the float64 sum of the same f32 data (NumPy's pairwise
sum in float64, within about 1e-16); with --torch, PyTorch's f32 sum of the same data too. Prints
one line per size and device: the largest and the mean relative error over
the seeds. With --bound, exits 1 when a Kiln error exceeds it.

The full sweep of issue 25: `long-sums.py KILN --sizes 20,22,24,26,28
--seeds 5 --device cpu --torch`; ctest runs 2^24 on the CPU JIT and a
smaller size on the emulated GPU (KILN_CUDA_DRIVER names its driver).
"""
import argparse
import os
import subprocess
import sys
import tempfile
import time

import numpy as np


def kiln_sum(kiln, device, path, n, workdir):
    model = os.path.join(workdir, f"sum{n}.kir")
    if not os.path.exists(model):
        with open(model, "w") as f:
            f.write(f"func @main(%x: f32[{n}]) -> f32[] {{\n"
                    f"  %s = reduce_sum(%x) {{axes = []}} : f32[]\n  return %s\n}}\n")
    out = os.path.join(workdir, "out")
    cmd = [kiln, "run", model, "--input", f"x={path}", "--output-dir", out, "--device", device]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return float(np.load(os.path.join(out, "output_0.npy")))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("kiln", help="the kiln binary")
    p.add_argument("--sizes", default="24", help="comma-separated exponents k of n = 2^k (default 24)")
    p.add_argument("--seeds", type=int, default=2, help="seeds per size (default 2)")
    p.add_argument("--device", action="append", help="cpu, cuda (repeatable; default cpu)")
    p.add_argument("--torch", action="store_true", help="also PyTorch's error on the same data")
    p.add_argument("--bound", type=float, help="fail when a Kiln relative error exceeds this")
    args = p.parse_args()
    devices = args.device or ["cpu"]
    torch = None
    if args.torch:
        import torch as torch_module
        torch = torch_module
    failed = False
    with tempfile.TemporaryDirectory() as workdir:
        for k in (int(s) for s in args.sizes.split(",")):
            n = 1 << k
            errors = {d: [] for d in devices}
            seconds = {d: 0.0 for d in devices}
            if torch is not None:
                errors["torch"] = []
            for seed in range(args.seeds):
                x = np.random.default_rng(seed).random(n, dtype=np.float32)
                exact = float(np.sum(x, dtype=np.float64))
                path = os.path.join(workdir, "x.npy")
                np.save(path, x)
                for d in devices:
                    start = time.monotonic()
                    got = kiln_sum(args.kiln, d, path, n, workdir)
                    seconds[d] += time.monotonic() - start
                    errors[d].append(abs(got - exact) / exact)
                if torch is not None:
                    errors["torch"].append(abs(float(torch.from_numpy(x).sum()) - exact) / exact)
            for name, errs in errors.items():
                note = f"  ({seconds[name] / len(errs):.1f} s per run)" if name in seconds else ""
                print(f"2^{k} {name:6s} max {max(errs):.3g} mean {sum(errs) / len(errs):.3g}{note}")
                if args.bound is not None and name != "torch" and max(errs) > args.bound:
                    print(f"  FAIL: above the bound {args.bound:g}", file=sys.stderr)
                    failed = True
            sys.stdout.flush()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
