#!/usr/bin/env python3
"""Kiln against Kiln: two kiln binaries timed in interleaved rounds on bench/real.py's models.

A change that may cost speed (a library post-op given up for exact special values, a blocked sum) is
judged by this script: each round runs the old binary and the new one alternately on every configuration
(`kiln run MODEL --bench N --warmup W --threads 2 --json`, one process per run), so that a change in the
machine's load hits both alike; a configuration's time is the median of its round medians, and the ratio
new / old is printed per row with the geometric mean. Models, weights and inputs are bench/real.py's
(torchvision and the BERT/GPT-2/LSTM shapes, random weights fixed by seed, ONNX opset 17, dynamic batch),
exported once into a temporary folder.

  /usr/bin/python3 bench/ab.py --old OLD/kiln --new build/tools/kiln [--models resnet50,mobilenet_v2]
                               [--batches 1,8] [--rounds 5] [--runs 5] [--warmup 2]

Both binaries must agree with each other on every output (rtol 1e-4, atol 1e-5) or the row is reported as a
disagreement and not timed. Time nothing else on the machine while it runs.
"""
import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import real  # noqa: E402  (bench/real.py: the models)


def kiln_run(kiln, onnx_path, inputs, extra, timeout=900):
    cmd = [kiln, "run", onnx_path, "--threads", "2"] + [f"--input={k}={v}" for k, v in inputs.items()] + extra
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stderr.strip()[-2000:]}")
    return proc.stdout


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--old", required=True, help="the kiln binary before the change")
    parser.add_argument("--new", required=True, help="the kiln binary after the change")
    parser.add_argument("--models", default=",".join(real.INFERENCE_MODELS))
    parser.add_argument("--batches", default="1,8")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    args = parser.parse_args()
    import torch

    binaries = {"old": os.path.abspath(args.old), "new": os.path.abspath(args.new)}
    batches = [int(b) for b in args.batches.split(",")]
    work = tempfile.mkdtemp(prefix="kiln-ab-")
    configs = []
    try:
        for name in args.models.split(","):
            module, example, output_names, axes = real.build_model(name)
            real.prepare_weights(module, example)
            folder = os.path.join(work, name)
            os.makedirs(folder)
            onnx_path = os.path.join(folder, "model.onnx")
            real.export_onnx(module, example, output_names, axes, onnx_path)
            for batch in batches:
                inputs = {}
                for key, value in example.items():
                    shape = (batch,) + tuple(value.shape[1:])
                    gen = torch.Generator().manual_seed(batch)
                    if value.dtype.is_floating_point:
                        data = torch.randn(shape, generator=gen)
                    else:
                        data = torch.randint(0, int(value.max()) + 1, shape, generator=gen)
                    path = os.path.join(folder, f"{key}-{batch}.npy")
                    np.save(path, data.numpy())
                    inputs[key] = path
                outs = {}
                for which, kiln in binaries.items():
                    out_dir = os.path.join(folder, f"out-{which}-{batch}")
                    kiln_run(kiln, onnx_path, inputs, ["--output-dir", out_dir])
                    outs[which] = {f: np.load(os.path.join(out_dir, f)) for f in sorted(os.listdir(out_dir))}
                agree = all(np.allclose(outs["old"][f], outs["new"][f], rtol=1e-4, atol=1e-5, equal_nan=True)
                            for f in outs["old"])
                configs.append({"name": f"{name} b{batch}", "onnx": onnx_path, "inputs": inputs, "agree": agree,
                                "times": {"old": [], "new": []}})
                print(f"[ab] {name} batch {batch}: outputs {'agree' if agree else 'DISAGREE'}", file=sys.stderr,
                      flush=True)
        for r in range(args.rounds):
            for config in configs:
                if not config["agree"]:
                    continue
                order = ["old", "new"] if r % 2 == 0 else ["new", "old"]
                for which in order:
                    out = kiln_run(binaries[which], config["onnx"], config["inputs"],
                                   ["--bench", str(args.runs), "--warmup", str(args.warmup), "--json"])
                    config["times"][which].append(json.loads(out)["median_ms"])
            print(f"[ab] round {r + 1}/{args.rounds} done", file=sys.stderr, flush=True)
        print(f"| model | old ms | new ms | new / old |\n|---|---:|---:|---:|")
        ratios = []
        for config in configs:
            if not config["agree"]:
                print(f"| {config['name']} | – | – | outputs disagree |")
                continue
            old = statistics.median(config["times"]["old"])
            new = statistics.median(config["times"]["new"])
            ratios.append(new / old)
            print(f"| {config['name']} | {old:.3f} | {new:.3f} | {new / old:.3f} |")
        if ratios:
            print(f"\ngeometric mean new / old: {math.exp(sum(map(math.log, ratios)) / len(ratios)):.3f}; "
                  f"load average at the end: {os.getloadavg()[0]:.2f}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
