"""Writes the ONNX models of kiln-allocation.test into the folder argv[1].

Each has a value that cannot be allocated: too large for any machine
(4 TiB, 4 PiB), or large enough (8 GiB, a 3 GiB weight) to fail under the
`ulimit -v` the test runs them with, so that the real allocation fails.
Nothing here allocates those sizes: the 3 GiB weight is a sparse file.
"""
import os
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

out = sys.argv[1]


def save(name, nodes, inputs, outputs, initializers):
    graph = helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info(o, TensorProto.FLOAT, None)
                                                   for o in outputs], initializer=initializers)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), os.path.join(out, name))


def shape(dims):
    return numpy_helper.from_array(np.array(dims, dtype=np.int64), "shape")


x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])
one = helper.make_tensor("one", TensorProto.FLOAT, [1], [1.0])

# ConstantOfShape whose result is returned.
for name, dims in [("cos-4tib", [1024] * 4), ("cos-4pib", [1024] * 5), ("cos-8gib", [2, 1024, 1024, 1024])]:
    save(name + ".onnx", [helper.make_node("ConstantOfShape", ["shape"], ["y"], name="node_3", value=one)], [], ["y"],
         [shape(dims)])

# Expand of an input, returned.
save("expand-4tib.onnx", [helper.make_node("Expand", ["x", "shape"], ["y"], name="expand_0")], [x], ["y"],
     [shape([1024] * 4)])

# An 8 GiB intermediate that two reductions read: it lives in the arena.
save("arena-8gib.onnx", [
    helper.make_node("Expand", ["x", "shape"], ["e"], name="expand_0"),
    helper.make_node("Exp", ["e"], ["a"], name="exp_0"),
    helper.make_node("Transpose", ["a"], ["t"], name="transpose_0", perm=[3, 2, 1, 0]),
    helper.make_node("ReduceSum", ["t"], ["s"], name="sum_0", keepdims=0),
    helper.make_node("ReduceMax", ["a"], ["m"], name="max_0", keepdims=0),
], [x], ["s", "m"], [shape([2, 1024, 1024, 1024])])

# A 2 GiB weight in external data (a sparse file of zeros).
w = TensorProto()
w.name = "w"
w.data_type = TensorProto.FLOAT
w.dims.extend([512, 1024, 1024])
w.data_location = TensorProto.EXTERNAL
for key, value in [("location", "w.bin"), ("offset", "0"), ("length", str(2 << 30))]:
    entry = w.external_data.add()
    entry.key = key
    entry.value = value
with open(os.path.join(out, "w.bin"), "wb") as f:
    f.truncate(2 << 30)
save("weight-2gib.onnx", [helper.make_node("Add", ["x", "w"], ["y"], name="add_0")], [x], ["y"], [w])

np.save(os.path.join(out, "x.npy"), np.ones([1], np.float32))
