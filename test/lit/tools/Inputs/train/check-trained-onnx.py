"""Checks that a model `kiln train -o` wrote is the original ONNX model with
only its trained initializers' values changed: the same nodes, inputs,
outputs, opsets and initializer names, types and shapes, and every float
initializer holding new values, except those named after --unchanged, which
must hold their old values.

    check-trained-onnx.py [--unchanged NAME,...] ORIGINAL.onnx TRAINED.onnx
"""
import sys

import numpy as np
import onnx
from onnx import numpy_helper

args = sys.argv[1:]
unchanged = set()
if args[0] == "--unchanged":
    unchanged = set(args[1].split(","))
    args = args[2:]
original, trained = onnx.load(args[0]), onnx.load(args[1])
onnx.checker.check_model(trained)
assert original.opset_import == trained.opset_import, "opsets differ"
for field in ("node", "input", "output", "value_info"):
    assert getattr(original.graph, field) == getattr(trained.graph, field), f"graph {field} differs"
names = [t.name for t in original.graph.initializer]
assert names == [t.name for t in trained.graph.initializer], "initializer names differ"
changed = 0
for a, b in zip(original.graph.initializer, trained.graph.initializer):
    assert (a.data_type, list(a.dims)) == (b.data_type, list(b.dims)), f"{a.name}: type or shape differs"
    va, vb = numpy_helper.to_array(a), numpy_helper.to_array(b)
    if a.name in unchanged:
        assert np.array_equal(va, vb), f"{a.name}: changed"
    elif a.data_type == onnx.TensorProto.FLOAT:
        assert np.all(np.isfinite(vb)), f"{a.name}: non-finite trained values"
        assert not np.array_equal(va, vb), f"{a.name}: not trained"
        changed += 1
    else:
        assert np.array_equal(va, vb), f"{a.name}: a non-float initializer changed"
print(f"same graph; {changed} of {len(names)} initializers trained: {', '.join(names)}")
