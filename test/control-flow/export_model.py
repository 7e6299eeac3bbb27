#!/usr/bin/env python3
"""Exports a PyTorch model with a `for` loop and an `if` (torch.jit.script,
so both stay control flow: ONNX Loop and If) and its inputs and PyTorch's
outputs, for run-control-flow.sh.

    export_model.py OUT_DIR

writes OUT_DIR/model.onnx and, per input set S (a: the `if` takes either
branch as the values fall, b: values that keep to the else branch, c: no
iteration at all), OUT_DIR/S/input_x.npy, input_n.npy and expected_y.npy.
"""
import os
import sys

import numpy as np
import torch


class LoopIf(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
        h = x
        for _ in range(int(n)):
            h = torch.tanh(self.lin(h)) + h
            if bool(h.sum() > 0):
                h = h * 0.5
            else:
                h = h - 1.0
        return h.relu() + h.sum()


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    torch.manual_seed(0)
    model = torch.jit.script(LoopIf())
    rng = np.random.RandomState(0)
    x = rng.randn(2, 8).astype(np.float32)
    sets = {
        "a": (x, 4),
        "b": (-np.abs(x) * 3 - 1, 3),
        "c": (x, 0),
    }
    torch.onnx.export(model, (torch.from_numpy(x), torch.tensor(4)), os.path.join(out, "model.onnx"),
                      input_names=["x", "n"], output_names=["y"], opset_version=13)
    for name, (xs, n) in sets.items():
        d = os.path.join(out, name)
        os.makedirs(d, exist_ok=True)
        xs = np.ascontiguousarray(xs, dtype=np.float32)
        nn = np.array(n, dtype=np.int64)
        with torch.no_grad():
            y = model(torch.from_numpy(xs), torch.from_numpy(nn)).numpy()
        np.save(os.path.join(d, "input_x.npy"), xs)
        np.save(os.path.join(d, "input_n.npy"), nn)
        np.save(os.path.join(d, "expected_y.npy"), y)


if __name__ == "__main__":
    main()
