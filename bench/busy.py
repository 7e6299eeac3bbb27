#!/usr/bin/env python3
"""Kiln and ONNX Runtime on a machine whose cores other programs keep busy (issue 13 item 4, issue 28 item 6).

Times Kiln (`kiln run MODEL.kc --bench N --threads 2 --json`, the model compiled once by `kiln compile`, in the
user's environment) and ONNX Runtime (intra-op 2 threads, inter-op 1, all graph optimizations) on models of several
families, first on a quiet machine and then while `--busy N` competing processes each spin on a core (a one-line
Python busy loop, what `stress-ng --cpu N` or a `make -jN` build does), in interleaved rounds: each round times every
model quiet and busy, Kiln and ONNX Runtime one after the other (their order alternating by round). Prints, per model
and as geomeans, each system's median quiet and busy times, its slowdown (busy / quiet) and the ratio of the two
slowdowns (Kiln's / ONNX Runtime's), with that ratio's spread over the rounds.

  mobilenet_v2, resnet50,  torchvision 0.14's models (weights=None, weights made to exercise every layer as
  densenet121, swin_t,     bench/real.py does) on 3x224x224 images
  efficientnet_b0, vit_b_16
  lstm, bert               bench/real.py's text classifier (2-layer bidirectional LSTM, sequence 64) and
                           BERT-base-shaped encoder (sequence 128)
  cnn                      test/e2e/cnn (an MNIST-sized CNN); its batch is --batch

  .venv-bench/bin/python bench/busy.py [--kiln build/tools/kiln] [--busy 2] [--rounds 3] [--runs 20]
      [--models mobilenet_v2,resnet50,densenet121,swin_t,lstm] [--batch 1] [--keep DIR]

The machine should be otherwise idle: the quiet times are the baseline. Issue 28's target with --busy 2 on 2 cores:
every model's slowdown ratio at most 2 and their geomean at most 1.2.
"""
import argparse
import json
import math
import multiprocessing
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

TORCHVISION = ("mobilenet_v2", "resnet50", "densenet121", "swin_t", "efficientnet_b0", "vit_b_16")
TEXT = ("lstm", "bert")
MODELS = TORCHVISION + TEXT + ("cnn",)
DEFAULT_MODELS = "mobilenet_v2,resnet50,densenet121,swin_t,lstm"


def spin(stop):
    """A busy process: a loop that never sleeps."""
    x = 0
    while not stop.is_set():
        for _ in range(100000):
            x += 1


class Spinners:
    """`count` busy processes while the block runs (none for 0)."""

    def __init__(self, count):
        self.count = count
        self.stop = multiprocessing.Event()
        self.procs = []

    def __enter__(self):
        self.procs = [multiprocessing.Process(target=spin, args=(self.stop,)) for _ in range(self.count)]
        for p in self.procs:
            p.start()
        if self.procs:
            time.sleep(0.5)  # the spinners at full speed before the timing starts
        return self

    def __exit__(self, *exc):
        self.stop.set()
        for p in self.procs:
            p.join()


def export_model(name, batch, folder):
    """Exports NAME to FOLDER/NAME.onnx (dynamic batch) and writes its inputs at BATCH as .npy files; returns
    (onnx path, {input name: .npy path}). Files already there are reused (--keep)."""
    onnx_path = os.path.join(folder, f"{name}.onnx")
    inputs_path = os.path.join(folder, f"{name}-b{batch}.json")
    if os.path.exists(onnx_path) and os.path.exists(inputs_path):
        with open(inputs_path) as f:
            return onnx_path, json.load(f)
    rng = np.random.default_rng(0)
    vocab = {"lstm": 20000, "bert": 30522}.get(name)
    if name == "cnn":
        onnx_path = os.path.join(ROOT, "test", "e2e", "cnn", "model.onnx")
        shapes = {"x": ((batch, 3, 28, 28), np.float32)}
    else:
        import torch
        import real  # bench/real.py: its models, weights and export

        if name in TORCHVISION:
            import torchvision
            torch.manual_seed(real.SEED)
            module = getattr(torchvision.models, name)(weights=None)
            example = {"x": torch.randn(2, 3, 224, 224, generator=torch.Generator().manual_seed(real.SEED))}
            outputs, axes = ["logits"], {"x": {0: "batch"}, "logits": {0: "batch"}}
        else:
            module, example, outputs, axes = real.build_model(name)
        real.prepare_weights(module, example)
        real.export_onnx(module, example, outputs, axes, onnx_path)
        shapes = {k: ((batch,) + tuple(v.shape[1:]), v.numpy().dtype) for k, v in example.items()}
    files = {}
    for k, (shape, dtype) in shapes.items():
        if np.issubdtype(dtype, np.integer):
            value = rng.integers(0, vocab, shape).astype(dtype)
        else:
            value = rng.standard_normal(shape).astype(dtype)
        files[k] = os.path.join(folder, f"{name}-b{batch}-{k}.npy")
        np.save(files[k], value)
    with open(inputs_path, "w") as f:
        json.dump(files, f)
    return onnx_path, files


def compile_kc(kiln, onnx_path, files, out):
    """`kiln compile` for the inputs' shapes, so that each timed process loads the program instead of compiling."""
    cmd = [kiln, "compile", onnx_path, "-o", out]
    for k, path in files.items():
        shape = np.load(path, mmap_mode="r").shape
        cmd += ["--input-shape", f"{k}={'x'.join(map(str, shape)) or 'scalar'}"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"busy.py: {' '.join(cmd)} failed:\n{proc.stderr.strip()}")


def kiln_median(kiln, kc, files, runs):
    cmd = [kiln, "run", kc, "--bench", str(runs), "--warmup", "3", "--threads", "2", "--json"]
    for k, path in files.items():
        cmd += ["--input", f"{k}={path}"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"busy.py: {' '.join(cmd)} failed:\n{proc.stderr.strip()}")
    return json.loads(proc.stdout.strip().splitlines()[-1])["median_ms"]


def ort_median(session, feeds, runs):
    for _ in range(3):
        session.run(None, feeds)
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        session.run(None, feeds)
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def geomean(values):
    return math.exp(sum(math.log(v) for v in values) / len(values))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kiln", default=os.path.join(ROOT, "build", "tools", "kiln"))
    parser.add_argument("--busy", type=int, default=2, help="competing busy processes while busy (default 2)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of quiet and busy timing (default 3)")
    parser.add_argument("--runs", type=int, default=20, help="timed runs per measurement (default 20)")
    parser.add_argument("--batch", type=int, default=1, help="the batch of every model (default 1)")
    parser.add_argument("--models", default=DEFAULT_MODELS, help=f"of: {', '.join(MODELS)} (default {DEFAULT_MODELS})")
    parser.add_argument("--keep", help="a folder for the exported models and inputs, reused by later runs")
    args = parser.parse_args()
    names = [m for m in args.models.split(",") if m]
    unknown = [m for m in names if m not in MODELS]
    if unknown:
        parser.error(f"unknown models {', '.join(unknown)} (expected some of {', '.join(MODELS)})")
    if args.busy < 1 or args.rounds < 1 or args.runs < 1 or args.batch < 1:
        parser.error("--busy, --rounds, --runs and --batch must be at least 1")
    kiln = os.path.abspath(args.kiln)
    if not os.access(kiln, os.X_OK):
        parser.error(f"no kiln binary at {kiln}: build the repository or pass --kiln PATH")
    import onnxruntime as ort

    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="kiln-busy-") as tmp:
        folder = args.keep or tmp
        os.makedirs(folder, exist_ok=True)
        setups = {}
        for m in names:
            onnx_path, files = export_model(m, args.batch, folder)
            kc = os.path.join(tmp, f"{m}.kc")
            compile_kc(kiln, onnx_path, files, kc)
            options = ort.SessionOptions()
            options.intra_op_num_threads = 2
            options.inter_op_num_threads = 1
            options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
            session = ort.InferenceSession(onnx_path, options, providers=["CPUExecutionProvider"])
            feeds = {k: np.load(p) for k, p in files.items()}
            setups[m] = (kc, files, session, feeds)
        times = {(m, s, b): [] for m in names for s in ("kiln", "ort") for b in (False, True)}
        for r in range(args.rounds):
            for busy in (False, True):
                with Spinners(args.busy if busy else 0):
                    for m in names:
                        kc, files, session, feeds = setups[m]
                        for system in (("kiln", "ort") if r % 2 == 0 else ("ort", "kiln")):
                            ms = kiln_median(kiln, kc, files, args.runs) if system == "kiln" else \
                                ort_median(session, feeds, args.runs)
                            times[(m, system, busy)].append(ms)
                            print(f"[busy.py] round {r + 1} {'busy' if busy else 'quiet'} {m} {system}: {ms:.3f} ms",
                                  file=sys.stderr)

    print(f"Load average before: {load_before:.1f}, after: {os.getloadavg()[0]:.1f}; {args.busy} busy "
          f"process{'es' if args.busy > 1 else ''}; batch {args.batch}; {args.rounds} rounds x {args.runs} runs, "
          "medians; ratio = Kiln's slowdown / ONNX Runtime's (its range over the rounds)\n")
    print("| model | Kiln quiet ms | Kiln busy ms | Kiln slowdown | ORT quiet ms | ORT busy ms | ORT slowdown | ratio |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    slow = {"kiln": [], "ort": []}
    ratios = []
    for m in names:
        med = {(s, b): statistics.median(times[(m, s, b)]) for s in ("kiln", "ort") for b in (False, True)}
        k = med[("kiln", True)] / med[("kiln", False)]
        o = med[("ort", True)] / med[("ort", False)]
        per_round = [(times[(m, "kiln", True)][i] / times[(m, "kiln", False)][i]) /
                     (times[(m, "ort", True)][i] / times[(m, "ort", False)][i]) for i in range(args.rounds)]
        slow["kiln"].append(k)
        slow["ort"].append(o)
        ratios.append(k / o)
        print(f"| {m} | {med[('kiln', False)]:.3f} | {med[('kiln', True)]:.3f} | {k:.2f}x | {med[('ort', False)]:.3f} "
              f"| {med[('ort', True)]:.3f} | {o:.2f}x | {k / o:.2f} ({min(per_round):.2f}-{max(per_round):.2f}) |")
    gk, go = geomean(slow["kiln"]), geomean(slow["ort"])
    print(f"| geomean | | | {gk:.2f}x | | | {go:.2f}x | {gk / go:.2f} |")


if __name__ == "__main__":
    main()
