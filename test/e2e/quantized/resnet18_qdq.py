#!/usr/bin/env python3
"""A ResNet-18 quantized by ONNX Runtime's tool runs in `kiln run` and matches
ONNX Runtime within one quantization step per element.

The model is made here, at test time: torchvision's ResNet-18 with weights
from a fixed seed, exported by torch.onnx.export, then quantized by
onnxruntime.quantization.quantize_static in its default QDQ format with
per-channel weights, calibrated on a few random images. Kiln's `fold-qdq`
pass turns its Conv and Gemm nodes into int8 `qconv` and `qmatmul`
(oneDNN's int8 primitives on the CPU); the output is the final
DequantizeLinear's, so one step is that node's scale.

Usage: resnet18_qdq.py KILN WORKDIR [--bench N]
Exits 77 (a skip for ctest) when torch, torchvision or onnxruntime cannot be
imported: onnxruntime comes from PyPI into .venv-bench (scripts/install-deps).
With --bench it also times the quantized and the fp32 model with
`kiln run --bench N` and prints both medians.
"""
import json
import os
import subprocess
import sys

SKIP = 77


def main():
    if len(sys.argv) < 3:
        print(__doc__)
        return 2
    kiln, work = sys.argv[1], sys.argv[2]
    bench = int(sys.argv[sys.argv.index("--bench") + 1]) if "--bench" in sys.argv else 0
    try:
        import numpy as np
        import onnx
        import onnxruntime as ort
        import torch
        import torchvision
        from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static
    except ImportError as e:
        print(f"SKIP: {e} (onnxruntime is installed into .venv-bench by scripts/install-deps)")
        return SKIP

    os.makedirs(work, exist_ok=True)
    fp32 = os.path.join(work, "resnet18.onnx")
    int8 = os.path.join(work, "resnet18-qdq.onnx")
    torch.manual_seed(0)
    model = torchvision.models.resnet18().eval()
    # Batch norms with statistics of their own (fresh ones are the identity),
    # so that the exported convs have distinct biases.
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.uniform_(-0.1, 0.1)
                m.running_var.uniform_(0.5, 1.5)
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.1, 0.1)
    shape = (1, 3, 224, 224)
    torch.onnx.export(model, torch.randn(*shape), fp32, input_names=["x"], output_names=["logits"], opset_version=13)

    class Images(CalibrationDataReader):
        def __init__(self):
            rng = np.random.default_rng(1)
            self.batches = iter([{"x": rng.standard_normal(shape, dtype=np.float32)} for _ in range(4)])

        def get_next(self):
            return next(self.batches, None)

    quantize_static(fp32, int8, Images(), quant_format=QuantFormat.QDQ, per_channel=True,
                    activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)

    q = onnx.load(int8)
    kinds = {}
    for n in q.graph.node:
        kinds[n.op_type] = kinds.get(n.op_type, 0) + 1
    print("quantized model:", ", ".join(f"{k} {v}" for k, v in sorted(kinds.items())))
    # One quantization step of the output: the scale of the DequantizeLinear
    # that writes it.
    out = q.graph.output[0].name
    init = {t.name: onnx.numpy_helper.to_array(t) for t in q.graph.initializer}
    step = None
    for n in q.graph.node:
        if n.op_type == "DequantizeLinear" and n.output[0] == out:
            step = float(init[n.input[1]])
    if step is None:
        print(f"FAIL: no DequantizeLinear writes the output {out}")
        return 1

    x = np.random.default_rng(2).standard_normal(shape, dtype=np.float32)
    np.save(os.path.join(work, "x.npy"), x)
    options = ort.SessionOptions()
    want = ort.InferenceSession(int8, options, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]

    outdir = os.path.join(work, "out")
    subprocess.run([kiln, "run", int8, "--input", "x=" + os.path.join(work, "x.npy"), "--no-fallback",
                    "--output-dir", outdir], check=True)
    got = np.load(os.path.join(outdir, out + ".npy"))
    if got.shape != want.shape:
        print(f"FAIL: kiln's output has shape {got.shape}, onnxruntime's {want.shape}")
        return 1
    diff = np.abs(got.astype(np.float64) - want.astype(np.float64))
    steps = diff / step
    print(f"output step {step:.6g}: max difference {diff.max():.6g} ({steps.max():.3f} steps), "
          f"{int((steps > 0.5).sum())} of {diff.size} elements differ")
    if steps.max() > 1.0 + 1e-3:
        print("FAIL: an element differs from onnxruntime's by more than one quantization step")
        return 1

    if bench:
        def median(model):
            r = subprocess.run([kiln, "run", model, "--input", "x=" + os.path.join(work, "x.npy"), "--bench",
                                str(bench), "--json"], check=True, capture_output=True, text=True)
            return json.loads(r.stdout.strip().splitlines()[-1])["median_ms"]
        t8, t32 = median(int8), median(fp32)
        print(f"kiln run --bench {bench}: int8 (QDQ) median {t8:.2f} ms, fp32 median {t32:.2f} ms "
              f"({t32 / t8:.2f}x)")
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
