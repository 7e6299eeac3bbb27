"""Writes ONNX models of the special-value tests into the folder argv[1], with
their weights as initializers (random, fixed seed): conv-relu.onnx (Conv with
bias, Relu), conv-clip.onnx (Conv with bias, Clip(0, 6) with min and max as
inputs, opset 13), matmul-relu.onnx (MatMul, Add of a bias, Relu). Each takes
x as make-inputs.py writes it (conv_x.npy, mm_x.npy) and returns y."""
import os
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

out = sys.argv[1]
os.makedirs(out, exist_ok=True)
rng = np.random.default_rng(2025)


def save(name, nodes, x_shape, y_shape, initializers):
    graph = helper.make_graph(nodes, name, [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, y_shape)],
                              [numpy_helper.from_array(a, n) for n, a in initializers.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    onnx.checker.check_model(model)
    onnx.save(model, os.path.join(out, name + ".onnx"))


w = rng.uniform(-0.5, 0.5, (16, 8, 3, 3)).astype(np.float32)
b = rng.uniform(-0.5, 0.5, (16,)).astype(np.float32)
conv = helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1])
save("conv-relu", [conv, helper.make_node("Relu", ["c"], ["y"])], [1, 8, 12, 12], [1, 16, 12, 12], {"w": w, "b": b})
save("conv-clip", [conv, helper.make_node("Clip", ["c", "lo", "hi"], ["y"])], [1, 8, 12, 12], [1, 16, 12, 12],
     {"w": w, "b": b, "lo": np.array(0, np.float32), "hi": np.array(6, np.float32)})
mw = rng.uniform(-0.5, 0.5, (64, 32)).astype(np.float32)
mb = rng.uniform(-0.5, 0.5, (32,)).astype(np.float32)
save("matmul-relu", [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Add", ["m", "b"], ["s"]),
                     helper.make_node("Relu", ["s"], ["y"])], [6, 64], [6, 32], {"w": mw, "b": mb})
