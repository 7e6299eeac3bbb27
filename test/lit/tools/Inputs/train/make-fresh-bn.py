"""Writes fresh-bn.onnx beside this script: a small CNN with two batch norms of
the same width, exported fresh (weights 1, biases 0, running mean 0, running
variance 1), so torch.onnx.export stores each group of equal parameters once
and recreates the others, running statistics included, as Identity nodes.
kiln-train.test trains it (the running statistics must come apart).

    /usr/bin/python3 make-fresh-bn.py     # python3-torch, python3-onnx
"""
import os

import onnx
import torch
import torch.nn.functional as F


class FreshBn(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.c1 = torch.nn.Conv2d(1, 4, 3, padding=1, bias=False)
        self.b1 = torch.nn.BatchNorm2d(4)
        self.c2 = torch.nn.Conv2d(4, 4, 3, padding=1, bias=False)
        self.b2 = torch.nn.BatchNorm2d(4)
        self.fc = torch.nn.Linear(4, 10)

    def forward(self, x):
        h = F.relu(self.b1(self.c1(x)))
        h = F.relu(self.b2(self.c2(h)))
        return self.fc(h.mean((2, 3)))


torch.manual_seed(5)
model = FreshBn().eval()
path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fresh-bn.onnx")
torch.onnx.export(model, (torch.zeros(8, 1, 8, 8),), path, input_names=["x"], output_names=["logits"],
                  dynamic_axes={"x": {0: "batch"}, "logits": {0: "batch"}}, opset_version=17,
                  training=torch.onnx.TrainingMode.PRESERVE)
shared = [n.output[0] for n in onnx.load(path).graph.node if n.op_type == "Identity"]
assert "b1.running_mean" in shared and "b2.running_var" in shared, shared
print(f"{path}: {len(shared)} parameters shared through Identity: {', '.join(shared)}")
