"""Writes OUT/linear.onnx, a Linear layer as PyTorch exports it (Gemm with
transB = 1, the weight stored [N, K]) whose weight is too large for
canonicalize to fold its transpose (K x N = 4096 x 8200, 2^25 + 32768
elements: kMaxFoldedMoveElements counts the operand and the result), then
a ReLU; and OUT/x.npy, an input of 2 rows. Usage: make-linear.py OUT."""
import os
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

out = sys.argv[1]
os.makedirs(out, exist_ok=True)
rng = np.random.default_rng(3)
k, n = 4096, 8200
weight = (rng.standard_normal((n, k), dtype=np.float32) * 0.02).astype(np.float32)
bias = (rng.standard_normal(n, dtype=np.float32) * 0.1).astype(np.float32)
graph = helper.make_graph(
    [helper.make_node("Gemm", ["x", "w", "b"], ["h"], transB=1), helper.make_node("Relu", ["h"], ["y"])],
    "linear",
    [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, k])],
    [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, n])],
    initializer=[numpy_helper.from_array(weight, "w"), numpy_helper.from_array(bias, "b")])
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
onnx.save(model, os.path.join(out, "linear.onnx"))
np.save(os.path.join(out, "x.npy"), rng.standard_normal((2, k), dtype=np.float32))
# The reference, in float64 from the same float32 values.
y = np.maximum(np.load(os.path.join(out, "x.npy")).astype(np.float64) @ weight.T.astype(np.float64) + bias, 0)
np.save(os.path.join(out, "want.npy"), y.astype(np.float32))
