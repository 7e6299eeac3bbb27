#!/usr/bin/python3
"""Data-parallel training on one machine: `mpirun -np 2 kiln train` with one
thread per rank against one `kiln train` process with two threads, the same
model, data and global batch (docs/distributed.md).

    bench/distributed.py [--kiln build/tools/kiln] [--steps 60] [--repeats 3]

Models: the e2e CNN (3x28x28, the tutorial's) at a global batch of 64, and
the e2e MLP at 256. Each run's samples/s is what `kiln train` prints (no
compilation or evaluation); the median over --repeats runs, interleaved.
Prints one Markdown table.
"""
import argparse
import os
import re
import statistics
import subprocess
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
E2E = os.path.join(HERE, "..", "test", "e2e")
MPIRUN = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "2"]
MPI_ENV = dict(os.environ, OMPI_MCA_btl_vader_single_copy_mechanism="none")


def rate(cmd, env=None):
    run = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)
    if run.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{run.stdout}{run.stderr[-2000:]}")
    return float(re.search(r"([0-9.]+) samples/s; final loss", run.stdout).group(1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kiln", default=os.path.join(HERE, "..", "build", "tools", "kiln"))
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    rng = np.random.default_rng(0)
    work = tempfile.mkdtemp(prefix="kiln-dp-bench-")
    rows = []
    for name, shape, batch in (("cnn", (3, 28, 28), 64), ("mlp", (64,), 256)):
        npz = os.path.join(work, f"{name}.npz")
        n = batch * 8
        np.savez(npz, x=rng.standard_normal((n,) + shape).astype(np.float32), y=rng.integers(0, 10, n))
        common = [os.path.join(E2E, name, "model.onnx"), "--data", npz, "--lr", "0.01", "--steps", str(a.steps)]
        one, two = [], []
        for _ in range(a.repeats):
            one.append(rate([a.kiln, "train"] + common + ["--batch-size", str(batch), "--threads", "2"]))
            two.append(rate(MPIRUN + [a.kiln, "train"] + common + ["--batch-size", str(batch // 2), "--threads", "1"],
                            env=MPI_ENV))
        rows.append((name, batch, statistics.median(one), statistics.median(two)))
    print("| model | global batch | 1 process x 2 threads, samples/s | 2 ranks x 1 thread, samples/s | ranks / process |")
    print("|---|---:|---:|---:|---:|")
    for name, batch, one, two in rows:
        print(f"| {name} | {batch} | {one:.0f} | {two:.0f} | {two / one:.2f} |")


if __name__ == "__main__":
    main()
