"""Checks a model `kiln train -o` wrote from one whose parameters PyTorch's
export shared through Identity nodes: no Identity of an initializer is left,
every named parameter is an initializer of its own, and the pairs given
(A=B) hold different values after training.

    check-untied.py TRAINED.onnx NAME,... A=B,...
"""
import sys

import numpy as np
import onnx
from onnx import numpy_helper

model = onnx.load(sys.argv[1])
onnx.checker.check_model(model)
inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
identities = [n.output[0] for n in model.graph.node if n.op_type == "Identity" and n.input[0] in inits]
assert not identities, f"still shared through Identity: {identities}"
for name in sys.argv[2].split(","):
    assert name in inits, f"no initializer {name}"
for pair in sys.argv[3].split(","):
    a, b = pair.split("=")
    assert not np.array_equal(inits[a], inits[b]), f"{a} and {b} hold the same values"
print(f"untied: {len(inits)} initializers, {len(sys.argv[3].split(','))} pairs apart")
