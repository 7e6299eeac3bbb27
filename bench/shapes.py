#!/usr/bin/env python3
"""The convolutions and matrix products of the benchmark's models, shape by shape: GFLOP/s and share of the FMA
peak for each Kiln binary given (each one's oneDNN, e.g. 2.6 and 3.2) and for ONNX Runtime's MLAS.

Each model of bench/real.py is exported as real.py exports it (random weights fixed by seed, opset 17) and run, in
the same process for all engines, interleaved round by round:

  - Kiln: `kiln run MODEL --bench R --profile --profile-rows 0 --threads 2`; the profile's library-call rows
    ("onednn conv [1,64,56,56]*[256,64,1,1] + relu (jit_1x1:avx512_core, ...)") give each call's ms and its
    oneDNN implementation;
  - ONNX Runtime (2 intra-op threads, all graph optimizations, as real.py runs it) with its profiler on: each
    Conv, FusedConv, Gemm, MatMul and FusedMatMul node's kernel time.

A shape is the pair of operand shapes and the output's element count (which tells strides apart); the FLOPs are
2 x the multiply-adds. Per engine, a shape's time is the median over rounds of its calls' mean time. Shapes whose
calls take under --min-share of the model's conv and matmul time on every engine are left out of the table (their
sums still count in the totals).

  .venv-bench/bin/python bench/shapes.py --kiln build/tools/kiln [--kiln OLD/kiln] [--models resnet50,bert]
      [--batches 1,8] [--rounds 3] [--runs 5] [--output F.md]

Each --kiln binary is labelled by the oneDNN version its verbose mode reports. The FMA peak is real.py's loop.
"""
import argparse
import collections
import json
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import real  # noqa: E402  (bench/real.py)

DEFAULT_MODELS = ["resnet50", "mobilenet_v2", "efficientnet_b0", "vit_b_16", "bert", "gpt2"]
# "onednn conv [1,64,56,56]*[256,64,1,1] + relu (impl, ...)", "onednn matmul [8,128,768]x[768,3072] ...".
KILN_ROW = re.compile(r"^\s*(?P<total>[\d.]+)\s+[\d.]+%\s+(?P<per>[\d.]+)\s+(?P<gflops>[\d.]+|-)\s+\S+ = onednn "
                      r"(?P<op>conv|matmul|deconv|int8 conv|int8 matmul) (?P<a>\[[\d,]*\])[*x](?P<b>\[[\d,]*\])"
                      r"(?P<rest>.*)$")
ORT_OPS = {"Conv": "conv", "FusedConv": "conv", "Gemm": "matmul", "MatMul": "matmul", "FusedMatMul": "matmul"}


def dims(text):
    return tuple(int(d) for d in text.strip("[]").split(",") if d)


def conv_key(x, w, out_elements):
    """Strides tell convolutions of the same operands apart by their output's size, which Kiln's profile gives
    only through its rounded GFLOP/s: the key keeps the size's nearest power of 2."""
    return ("conv", x, w, int(round(math.log2(out_elements))) if out_elements else 0)


def matmul_flops(a, b):
    """2 x multiply-adds of a (batched) matrix product of A [..., M, K] and B [..., K, N] (B may be [K, N])."""
    m, k = a[-2] if len(a) > 1 else 1, a[-1]
    n = b[-1]
    batch = int(np.prod(a[:-2])) if len(a) > 2 else 1
    return 2 * batch * m * k * n


def kiln_calls(binary, model, inputs, runs):
    """{key: (total ms per run, calls per run, flops per call, impl)} from one `kiln run --profile` process."""
    args = [binary, "run", model, "--bench", str(runs), "--warmup", "1", "--profile", "--profile-rows", "0",
            "--threads", "2"]
    for name, path in inputs.items():
        args += ["--input", f"{name}={path}"]
    proc = subprocess.run(args, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{binary} failed on {model}: {proc.stderr.strip()[-500:]}")
    calls = {}
    for line in proc.stderr.splitlines():
        m = KILN_ROW.match(line)
        if not m:
            continue
        a, b = dims(m["a"]), dims(m["b"])
        per, total = float(m["per"]), float(m["total"])
        count = round(total / per) if per > 0 else 1
        flops = float(m["gflops"]) * per * 1e6 if m["gflops"] != "-" else 0.0
        impl = re.search(r"\(([^,)]+)", m["rest"])
        if "conv" in m["op"]:
            key = conv_key(a, b, flops / (2 * np.prod(b[1:])) if flops else 0)
        else:
            key = ("matmul", a, b, 0)
        prev = calls.get(key, (0.0, 0, flops, impl[1] if impl else "?"))
        calls[key] = (prev[0] + total / runs, prev[1] + count / runs, flops, prev[3])
    return calls


def ort_calls(model, feeds, runs, work):
    import onnxruntime as ort
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    options.inter_op_num_threads = 1
    options.enable_profiling = True
    options.profile_file_prefix = os.path.join(work, "ort-profile")
    # The profiler leaves out the shapes of initializers (a MatMul's prepacked weight): they come from the
    # optimized graph, node by node.
    optimized = os.path.join(work, "ort-optimized.onnx")
    options.optimized_model_filepath = optimized
    session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
    node_inputs = initializer_shapes(optimized)
    session.run(None, feeds)  # warm-up
    for _ in range(runs):
        session.run(None, feeds)
    path = session.end_profiling()
    with open(path) as f:
        events = json.load(f)
    os.remove(path)
    per_key = collections.defaultdict(list)
    for e in events:
        args = e.get("args", {})
        op = ORT_OPS.get(args.get("op_name"))
        if e.get("cat") != "Node" or not e["name"].endswith("_kernel_time") or not op:
            continue
        profiled = [tuple(next(iter(s.values()))) for s in args.get("input_type_shape", [])]
        shapes = []
        for known in node_inputs.get(e["name"][:-len("_kernel_time")], [None] * len(profiled)):
            if known is not None:
                shapes.append(known)
            elif profiled:
                shapes.append(profiled.pop(0))
        shapes += profiled
        out = [tuple(next(iter(s.values()))) for s in args.get("output_type_shape", [])]
        if len(shapes) < 2 or not out:
            continue
        if op == "conv":
            x, w = shapes[0], shapes[1]
            out_elements = int(np.prod(out[0]))
            flops = 2 * out_elements * int(np.prod(w[1:]))
            key = conv_key(x, w, out_elements)
        else:
            a, b = shapes[0], shapes[1]
            if len(b) == 1:  # a vector
                b = (b[0], 1)
            if args["op_name"] == "Gemm" and b[0] != a[-1]:  # transB: B is [N, K]
                b = (b[1], b[0])
            flops = matmul_flops(a, b)
            key = ("matmul", a, b, 0)
        per_key[key].append((e["dur"] / 1e3, flops))
    # Each run's total per key, then the mean over runs (warm-up included in the events: drop the first run's).
    calls = {}
    for key, items in per_key.items():
        per_run = len(items) // (runs + 1) or 1
        timed = items[per_run:]
        total = sum(ms for ms, _ in timed) / runs
        calls[key] = (total, len(timed) / runs, items[0][1], "MLAS")
    return calls


def initializer_shapes(path):
    """{node name: [the shape of each input that is an initializer, None for the others]} of an ONNX file."""
    import onnx
    graph = onnx.load(path, load_external_data=False).graph
    known = {t.name: tuple(t.dims) for t in graph.initializer}
    return {n.name: [known.get(i) for i in n.input if i] for n in graph.node}


def oneDNN_version(binary, model, inputs):
    env = dict(os.environ, DNNL_VERBOSE="1", ONEDNN_VERBOSE="1")
    args = [binary, "run", model, "--bench", "1", "--warmup", "0", "--threads", "2"]
    for name, path in inputs.items():
        args += ["--input", f"{name}={path}"]
    proc = subprocess.run(args, capture_output=True, text=True, env=env)
    m = re.search(r"oneDNN v(\d+\.\d+(\.\d+)?)", proc.stdout + proc.stderr)
    return m[1] if m else "?"


def merge_matmul_keys(per_engine):
    """Kiln's and ORT's names of one matrix product differ when Kiln flattened the batch into M: both become
    (M*batch, K, N)."""
    def canonical(key):
        if key[0] != "matmul":
            return key
        a, b = key[1], key[2]
        rows = int(np.prod(a[:-1]))
        return ("matmul", (rows, a[-1]), (b[-2] if len(b) > 1 else 1, b[-1]), int(np.prod(b[:-2])) if len(b) > 2 else 1)
    out = []
    for calls in per_engine:
        merged = {}
        for key, (total, count, flops, impl) in calls.items():
            k = canonical(key)
            prev = merged.get(k)
            merged[k] = (total, count, flops, impl) if prev is None else (prev[0] + total, prev[1] + count, flops,
                                                                          prev[3])
        out.append(merged)
    return out


def describe(key):
    if key[0] == "conv":
        x, w = key[1], key[2]
        return f"conv {list(x)}*{list(w)}"
    a, b = key[1], key[2]
    batch = f"{key[3]} x " if key[3] > 1 else ""
    return f"matmul {batch}[{a[0]},{a[1]}]x[{b[0]},{b[1]}]"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kiln", action="append", required=True, help="a kiln binary (repeat to compare)")
    parser.add_argument("--models", default=",".join(DEFAULT_MODELS))
    parser.add_argument("--batches", default="1,8")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--min-share", type=float, default=0.02)
    parser.add_argument("--output")
    args = parser.parse_args()
    import torch
    torch.set_num_threads(2)
    work = tempfile.mkdtemp(prefix="kiln-shapes-")
    peak, problem = real.measure_fma_peak(work)
    peak_gflops = peak["gflops"] if peak else None
    print(f"[peak] {peak_gflops if peak else problem}", file=sys.stderr, flush=True)
    lines = []
    labels = None
    for name in args.models.split(","):
        module, example, outputs, axes = real.build_model(name)
        real.prepare_weights(module, example)
        path = os.path.join(work, f"{name}.onnx")
        real.export_onnx(module, example, outputs, axes, path)
        for batch in [int(b) for b in args.batches.split(",")]:
            feeds, inputs = {}, {}
            for input_name, value in example.items():
                shape = (batch,) + tuple(value.shape[1:])
                if value.dtype == torch.long:
                    array = np.random.default_rng(0).integers(0, 1000, size=shape).astype(np.int64)
                else:
                    array = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
                feeds[input_name] = array
                inputs[input_name] = os.path.join(work, f"{name}-{input_name}-{batch}.npy")
                np.save(inputs[input_name], array)
            if labels is None:
                labels = [f"oneDNN {oneDNN_version(k, path, inputs)}" for k in args.kiln]
                print(f"[engines] {labels}", file=sys.stderr, flush=True)
            rounds = [[] for _ in range(len(args.kiln) + 1)]
            for r in range(args.rounds):
                for i, binary in enumerate(args.kiln):
                    rounds[i].append(kiln_calls(binary, path, inputs, args.runs))
                rounds[-1].append(ort_calls(path, feeds, args.runs, work))
                print(f"[{name} b{batch}] round {r + 1}", file=sys.stderr, flush=True)
            per_engine = []
            for engine_rounds in rounds:
                merged = merge_matmul_keys(engine_rounds)
                keys = set().union(*merged)
                per_engine.append({k: (statistics.median(m[k][0] for m in merged if k in m),
                                       next(m[k] for m in merged if k in m)[1:]) for k in keys})
            emit(lines, name, batch, labels + ["MLAS (ORT)"], per_engine, peak_gflops, args.min_share)
    header = [f"# Convolutions and matrix products shape by shape (bench/shapes.py)", "",
              f"- models: {args.models}; batches {args.batches}; {args.rounds} rounds x {args.runs} runs, 2 threads",
              f"- FMA peak: {peak_gflops:.0f} GFLOP/s on 2 threads" if peak_gflops else f"- FMA peak: {problem}",
              f"- load average at the end: {os.getloadavg()[0]:.2f}", ""]
    text = "\n".join(header + lines) + "\n"
    print(text)
    if args.output:
        with open(args.output, "w") as f:
            f.write(text)


def emit(lines, name, batch, labels, per_engine, peak, min_share):
    totals = [sum(t for t, _ in calls.values()) for calls in per_engine]
    keys = set().union(*per_engine)
    shown = [k for k in keys if any(k in calls and calls[k][0] >= min_share * totals[i]
                                    for i, calls in enumerate(per_engine))]
    shown.sort(key=lambda k: -max(calls[k][0] if k in calls else 0 for calls in per_engine))
    lines.append(f"## {name}, batch {batch}")
    lines.append("")
    lines.append("| shape | calls | GFLOP/call | " + " | ".join(f"{l} GFLOP/s (% peak)" for l in labels) +
                 " | implementations |")
    lines.append("|---|---:|---:|" + "---:|" * len(labels) + "---|")

    def cell(calls, key):
        if key not in calls:
            return "-"
        total, (count, flops, _) = calls[key]
        if not total or not count or not flops:
            return "-"
        rate = flops * count / total / 1e6
        return f"{rate:.0f} ({100 * rate / peak:.0f}%)" if peak else f"{rate:.0f}"
    for k in shown:
        ref = next(calls[k] for calls in per_engine if k in calls)
        count, flops = ref[1][0], ref[1][1]
        impls = ", ".join(dict.fromkeys(calls[k][1][2] for calls in per_engine[:-1] if k in calls))
        lines.append(f"| {describe(k)} | {count:.0f} | {flops / 1e9:.3f} | " +
                     " | ".join(cell(calls, k) for calls in per_engine) + f" | {impls} |")

    def total_rate(calls):
        flops = sum(c[1][0] * c[1][1] for c in calls.values())
        ms = sum(c[0] for c in calls.values())
        rate = flops / ms / 1e6 if ms else 0
        return f"{ms:.2f} ms, {rate:.0f} GFLOP/s" + (f" ({100 * rate / peak:.0f}%)" if peak else "")
    lines.append("| all convs and matmuls | | | " + " | ".join(total_rate(c) for c in per_engine) + " | |")
    lines.append("")


if __name__ == "__main__":
    main()
