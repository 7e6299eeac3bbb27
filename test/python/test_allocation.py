"""Values that cannot be allocated raise kiln.Error, and Python lives on (issue 25).

A result of 4 TiB is refused when the model is compiled; under a limit on
the address space (RLIMIT_AS, as `ulimit -v` sets) an 8 GiB result fails
when it is allocated. Both are a kiln.Error naming the value, its type and
the bytes, never a MemoryError or an abort, and the interpreter goes on to
load, compile and run other models.
"""
import os
import resource
import subprocess
import sys
import textwrap

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

import kiln


def _constant_of_shape(path, dims):
    """An ONNX model returning ConstantOfShape(dims) filled with ones."""
    shape = numpy_helper.from_array(np.array(dims, dtype=np.int64), "shape")
    node = helper.make_node("ConstantOfShape", ["shape"], ["y"], name="node_3",
                            value=helper.make_tensor("one", TensorProto.FLOAT, [1], [1.0]))
    graph = helper.make_graph([node], "g", [], [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              initializer=[shape])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), str(path))
    return path


def _relu(path):
    node = helper.make_node("Relu", ["x"], ["y"])
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), str(path))
    return path


class Expand(torch.nn.Module):
    def __init__(self, shape):
        super().__init__()
        self.shape = shape

    def forward(self, x):
        return x.expand(*self.shape)  # a view in PyTorch: tracing allocates nothing


def _still_alive(tmp_path):
    model = kiln.load(_relu(tmp_path / "relu.onnx"), threads=2)
    np.testing.assert_array_equal(model(x=np.array([-1.0, 2.0], np.float32)), [0.0, 2.0])
    compiled = kiln.compile(torch.nn.ReLU(), (torch.ones(2),), threads=2)
    torch.testing.assert_close(compiled(torch.tensor([-3.0, 4.0])), torch.tensor([0.0, 4.0]))


def test_load_of_a_result_too_large_raises_and_python_lives_on(tmp_path):
    model = kiln.load(_constant_of_shape(tmp_path / "big.onnx", [1024] * 4), threads=2)
    message = r"cannot allocate 4\.0 TiB for %y: f32\[1024,1024,1024,1024\]"
    with pytest.raises(kiln.Error, match=message):
        model()
    with pytest.raises(kiln.Error, match=message):  # the same again: the model is still usable
        model()
    with pytest.raises(kiln.Error, match=message):
        kiln.load(tmp_path / "big.onnx", interpret=True)()
    _still_alive(tmp_path)


def test_compile_of_a_result_too_large_raises_and_python_lives_on(tmp_path):
    with pytest.raises(kiln.Error, match=r"cannot allocate 4\.0 TiB for %\w+: f32\[1024,1024,1024,1024\]"):
        compiled = kiln.compile(Expand((1024, 1024, 1024, 1024)), (torch.ones(1),), dynamic_batch=False, threads=2)
        compiled(torch.ones(1))
    _still_alive(tmp_path)


def test_allocation_failing_under_an_address_space_limit(tmp_path):
    """8 GiB results in a process limited to 4 GiB of address space."""
    _constant_of_shape(tmp_path / "big.onnx", [2, 1024, 1024, 1024])
    script = textwrap.dedent("""
        import sys
        import numpy as np
        import torch
        import kiln
        sys.path.insert(0, sys.argv[2])
        from test_allocation import Expand, _still_alive
        import pathlib
        folder = pathlib.Path(sys.argv[1])
        for interpret in (False, True):
            try:
                kiln.load(folder / "big.onnx", threads=2, interpret=interpret)()
                print("no error")
            except kiln.Error as e:
                print("kiln.Error:", e)
        try:
            kiln.compile(Expand((2, 1024, 1024, 1024)), (torch.ones(1),), dynamic_batch=False, threads=2)(torch.ones(1))
            print("no error")
        except kiln.Error as e:
            print("kiln.Error:", e)
        _still_alive(folder)
        print("alive")
    """)

    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))

    result = subprocess.run([sys.executable, "-c", script, str(tmp_path), os.path.dirname(__file__)],
                            capture_output=True, text=True, preexec_fn=limit, timeout=600)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 4, result.stdout + result.stderr
    assert "program 'g': cannot allocate 8.0 GiB for %y: f32[2,1024,1024,1024] (broadcast, the output 'y')" in lines[0]
    assert "'broadcast' cannot allocate 8.0 GiB for %y: f32[2,1024,1024,1024]" in lines[1]
    assert "cannot allocate 8.0 GiB for %" in lines[2] and "f32[2,1024,1024,1024]" in lines[2]
    assert lines[3] == "alive"
