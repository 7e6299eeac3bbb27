#!/usr/bin/env python3
"""docs/python.md's example: compile a torchvision ResNet-18 with Kiln, time it
against PyTorch, then fine-tune a small model with kiln.Trainer and load the
result back into the module.

    .venv/bin/python examples/python/quickstart.py      # after pip install .
"""
import time

import numpy as np
import torch
import torchvision

import kiln

print(kiln.devices()["verdict"])

# 1. Compile a torchvision ResNet-18 and check it against PyTorch.
torch.manual_seed(0)
resnet = torchvision.models.resnet18().eval()
x = torch.randn(1, 3, 224, 224)
compiled = kiln.compile(resnet, (x,))  # exported to ONNX in memory, compiled by Kiln
with torch.no_grad():
    expected = resnet(x)
y = compiled(x)
print("ResNet-18 max |kiln - torch|:", (y - expected).abs().max().item())


def median_ms(fn, runs=20):
    fn()  # warm-up (Kiln compiles here for a new shape)
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return float(np.median(times))


with torch.no_grad():
    torch_ms = median_ms(lambda: resnet(x))
kiln_ms = median_ms(lambda: compiled(x))
print(f"ResNet-18 batch 1: PyTorch {torch_ms:.1f} ms, Kiln {kiln_ms:.1f} ms ({kiln_ms / torch_ms:.2f}x)")

# 2. Fine-tune a small classifier on made-up data, then load the weights back.
g = torch.Generator().manual_seed(0)
centers = torch.randn(4, 20, generator=g) * 2
labels = torch.randint(0, 4, (512,), generator=g)
features = centers[labels] + torch.randn(512, 20, generator=g)
model = torch.nn.Sequential(torch.nn.Linear(20, 32), torch.nn.BatchNorm1d(32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
trainer = kiln.Trainer(model, loss="cross_entropy", optimizer="adam", lr=1e-2, batch_size=64)
history = trainer.fit(features, labels, epochs=3)
print("epoch losses:", [round(v, 4) for v in history])
print("accuracy:", trainer.evaluate(features, labels)["accuracy"])
model.load_state_dict(trainer.state_dict(), strict=True)
model.eval()
with torch.no_grad():
    accuracy = (model(features).argmax(1) == labels).float().mean().item()
print("accuracy of the module with Kiln's weights:", accuracy)
