#!/usr/bin/env python3
"""Kiln and ONNX Runtime on a machine that another program also uses (issue 13, item 4).

For the end-to-end CNN at batch 64 and the end-to-end LSTM at batch 1 (test/e2e, exported with a dynamic batch),
times Kiln (`kiln run MODEL --bench N --threads 2 --json`, in the user's environment) and ONNX Runtime (intra-op 2
threads, inter-op 1, all graph optimizations) first on a quiet machine, then while one busy process spins on a
core (a Python busy loop, what `stress-ng --cpu 1` does), in alternating rounds. Prints each system's median quiet
and busy times and its slowdown (busy / quiet) as Markdown.

  .venv-bench/bin/python bench/busy.py [--kiln build/tools/kiln] [--rounds 3] [--runs 200] [--models cnn,lstm]
"""
import argparse
import json
import multiprocessing
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Each model's inputs at the batch timed: name -> shape.
MODELS = {
    "cnn": (64, {"x": (64, 3, 28, 28)}),
    "lstm": (1, {"x": (1, 5, 8), "h0": (2, 1, 16), "c0": (2, 1, 16)}),
}


def spin(stop):
    """The busy process: a loop that never sleeps."""
    x = 0
    while not stop.is_set():
        for _ in range(100000):
            x += 1


def kiln_median(kiln, model, inputs, runs):
    cmd = [kiln, "run", model, "--bench", str(runs), "--warmup", "10", "--threads", "2", "--json"]
    for name, path in inputs.items():
        cmd += ["--input", f"{name}={path}"]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])["median_ms"]


def ort_median(session, feeds, runs):
    for _ in range(10):
        session.run(None, feeds)
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        session.run(None, feeds)
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kiln", default=os.path.join(ROOT, "build", "tools", "kiln"))
    parser.add_argument("--rounds", type=int, default=3, help="alternations of quiet and busy timing (default 3)")
    parser.add_argument("--runs", type=int, default=200, help="timed runs per measurement (default 200)")
    parser.add_argument("--models", default="cnn,lstm", help="of: " + ", ".join(MODELS))
    args = parser.parse_args()
    import onnxruntime as ort

    names = [m for m in args.models.split(",") if m]
    for m in names:
        if m not in MODELS:
            sys.exit(f"busy.py: unknown model '{m}' (expected {', '.join(MODELS)})")
    rng = np.random.default_rng(0)
    rows = []
    with tempfile.TemporaryDirectory(prefix="kiln-busy-") as tmp:
        for m in names:
            batch, shapes = MODELS[m]
            model = os.path.join(ROOT, "test", "e2e", m, "model.onnx")
            feeds, files = {}, {}
            for name, shape in shapes.items():
                feeds[name] = rng.standard_normal(shape).astype(np.float32)
                files[name] = os.path.join(tmp, f"{m}_{name}.npy")
                np.save(files[name], feeds[name])
            options = ort.SessionOptions()
            options.intra_op_num_threads = 2
            options.inter_op_num_threads = 1
            options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
            session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
            times = {("kiln", False): [], ("kiln", True): [], ("ort", False): [], ("ort", True): []}
            for _ in range(args.rounds):
                for busy in (False, True):
                    stop = multiprocessing.Event()
                    spinner = multiprocessing.Process(target=spin, args=(stop,)) if busy else None
                    if spinner:
                        spinner.start()
                        time.sleep(0.5)
                    try:
                        times[("kiln", busy)].append(kiln_median(args.kiln, model, files, args.runs))
                        times[("ort", busy)].append(ort_median(session, feeds, args.runs))
                    finally:
                        if spinner:
                            stop.set()
                            spinner.join()
            for system in ("kiln", "ort"):
                quiet = statistics.median(times[(system, False)])
                busy = statistics.median(times[(system, True)])
                rows.append((m, batch, "Kiln" if system == "kiln" else "ONNX Runtime", quiet, busy, busy / quiet))
    print(f"Load average before: {os.getloadavg()[0]:.1f}; {args.rounds} rounds x {args.runs} runs, medians\n")
    print("| model | batch | system | quiet ms | one busy process ms | slowdown |")
    print("|---|---:|---|---:|---:|---:|")
    for m, batch, system, quiet, busy, ratio in rows:
        print(f"| {m} | {batch} | {system} | {quiet:.4f} | {busy:.4f} | {ratio:.2f}x |")


if __name__ == "__main__":
    main()
