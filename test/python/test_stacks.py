"""The package on the Python stacks users have: NumPy 1 and 2, PyTorch 1.13 to the current release.

ctest runs the whole suite twice (test/CMakeLists.txt): `python` with Debian's
stack (NumPy 1.24, torch 1.13, the extension built with pybind11 2.10) and
`python-pypi` in the .venv-pypi of scripts/install-deps (PyPI's current torch,
NumPy 2, the extension built with pybind11 3.x). KILN_OTHER_PACKAGE names the
package built with the other pybind11, which is also run here.
"""
import inspect
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
import torch

import kiln

SOURCE_DIR = pathlib.Path(__file__).resolve().parents[2]
DTYPES_MODEL = SOURCE_DIR / "test" / "lit" / "tools" / "Inputs" / "run" / "dtypes.kir"

# One array per input of dtypes.kir (every dtype NumPy shares with Kiln),
# with values that show a wrong item size or byte count.
ROUND_TRIP = """
import numpy as np, kiln
m = kiln.load({model!r})
arrays = dict(
    f64=np.array([1.5, -2.25]), f32=np.array([[1.5, -2.0], [3.25, 1e-3]], np.float32),
    f16=np.array([0.5, -1.0, 65504.0], np.float16), i64=np.array(-(2**40), np.int64), i32=np.zeros(0, np.int32),
    i16=np.array([-300, 7], np.int16), i8=np.array([-128, 127], np.int8), u64=np.array([2**63, 1], np.uint64),
    u32=np.array([2**31, 3], np.uint32), u16=np.array([65535, 1], np.uint16), u8=np.array([255, 0], np.uint8),
    b=np.array([True, False]))
out = m(**arrays)
out = out if isinstance(out, tuple) else (out,)
for (name, a), got in zip(arrays.items(), out):
    assert got.dtype == a.dtype and got.shape == a.shape and np.array_equal(got, a), (name, got, a)
# Strided and Fortran-order arrays are read by value.
strided = np.arange(8, dtype=np.float32)[::2]
m2 = kiln.load({model!r})
args = dict(arrays, f32=np.asfortranarray(arrays["f32"]), f64=np.arange(4, dtype=np.float64)[::2])
got = m2(**args)
assert np.array_equal(got[0], [0.0, 2.0]) and np.array_equal(got[1], arrays["f32"]), got
print("numpy", np.__version__, "ok")
"""


def test_every_numpy_dtype_round_trips():
    code = ROUND_TRIP.format(model=str(DTYPES_MODEL))
    exec(compile(code, "round_trip", "exec"), {})


def test_numpy_dtypes_kiln_does_not_take_are_named():
    m = kiln.load(DTYPES_MODEL)
    arrays = {p.name: np.zeros([d if isinstance(d, int) else 1 for d in p.shape], p.dtype) for p in m.inputs}
    with pytest.raises(kiln.InputError, match=r"input 'f32' is a NumPy array of dtype complex64, which Kiln does not take"):
        m(**dict(arrays, f32=np.zeros((2, 2), np.complex64)))
    with pytest.raises(kiln.InputError, match=r"input 'f32' is big-endian \(float32\); convert it with \.astype\(numpy\.float32\)"):
        m(**dict(arrays, f32=np.zeros((2, 2), ">f4")))


def test_the_extension_built_with_the_other_pybind11_takes_this_numpy():
    # The extension built with Debian's pybind11 2.10, which reads NumPy 1's
    # dtype struct, refused every float32 array of NumPy 2 before it read
    # dtypes through their Python attributes.
    other = os.environ.get("KILN_OTHER_PACKAGE")
    if not other:
        pytest.skip("KILN_OTHER_PACKAGE is not set (ctest sets it where both builds exist)")
    env = dict(os.environ, PYTHONPATH=other)
    code = ROUND_TRIP.format(model=str(DTYPES_MODEL))
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "ok" in done.stdout


def test_the_torchscript_exporter_is_chosen_where_torch_has_a_choice():
    # PyTorch 2.9 made the torch.export-based exporter the default, which
    # needs onnxscript (not a dependency) and makes other graphs.
    from kiln import _torch as kiln_torch

    has_choice = "dynamo" in inspect.signature(torch.onnx.export).parameters
    assert kiln_torch._torchscript_exporter(torch) == ({"dynamo": False} if has_choice else {})


class Cnn(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.conv2 = torch.nn.Conv2d(8, 16, 3, padding=1)
        self.fc = torch.nn.Linear(16 * 4 * 4, 10)

    def forward(self, x):
        x = torch.nn.functional.max_pool2d(torch.relu(self.conv1(x)), 2)
        x = torch.nn.functional.max_pool2d(torch.relu(self.conv2(x)), 2)
        return self.fc(x.flatten(1))


def _torch_compile_through_kiln(module, *args, **kwargs):
    """torch.compile(module, backend="kiln") called on args, and how many graphs Kiln compiled for it."""
    from kiln import _torch as kiln_torch

    compiled = []
    original = kiln_torch.compile

    def counting(gm, *rest, **options):
        compiled.append(gm)
        return original(gm, *rest, **options)

    kiln_torch.compile = counting
    try:
        with torch.no_grad():
            got = torch.compile(module, backend="kiln")(*args, **kwargs)
    finally:
        kiln_torch.compile = original
    return got, len(compiled)


@pytest.mark.skipif(not hasattr(torch, "compile"), reason="PyTorch " + torch.__version__ + " has no torch.compile")
def test_torch_compile_of_a_cnn_and_transformers_matches_eager():
    torch.manual_seed(5)
    cases = [
        ("cnn", Cnn().eval(), (torch.randn(2, 3, 16, 16),), {}),
        # Eval mode without gradients: the fused fast-path op, rewritten (kiln/_fastpath.py).
        ("encoder layer", torch.nn.TransformerEncoderLayer(32, 4, 64, batch_first=True).eval(),
         (torch.randn(2, 6, 32),), {}),
        ("pre-norm gelu encoder layer with a causal mask",
         torch.nn.TransformerEncoderLayer(32, 4, 64, batch_first=True, norm_first=True, activation="gelu").eval(),
         (torch.randn(3, 5, 32),), {"src_mask": torch.triu(torch.ones(5, 5, dtype=torch.bool), 1)}),
        ("encoder layer with key padding", torch.nn.TransformerEncoderLayer(32, 4, 64, batch_first=True).eval(),
         (torch.randn(2, 6, 32),), {"src_key_padding_mask": torch.tensor([[False] * 6, [False] * 4 + [True] * 2])}),
        ("attention", torch.nn.MultiheadAttention(32, 4, batch_first=True).eval(), (torch.randn(2, 6, 32),) * 3, {}),
    ]
    for name, module, args, kwargs in cases:
        with torch.no_grad():
            expected = module(*args, **kwargs)
        # Dynamo sees the modules' shared call code again with other sizes
        # and passes sizes as arguments after the first: both ways are run.
        got, graphs = _torch_compile_through_kiln(module, *args, **kwargs)
        assert graphs >= 1, name
        expected = expected if isinstance(expected, tuple) else (expected,)
        got = got if isinstance(got, tuple) else (got,)
        assert len(got) == len(expected), name
        for g, e in zip(got, expected):
            torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-5, msg=name)


@pytest.mark.skipif(not hasattr(torch, "compile"), reason="PyTorch " + torch.__version__ + " has no torch.compile")
def test_torch_compile_called_with_other_batch_sizes_matches_eager():
    # A second batch size makes Dynamo recompile with the batch dynamic: the
    # graph then takes it as a SymInt argument, and Kiln compiles each size.
    from kiln import _torch as kiln_torch

    torch.manual_seed(6)
    module = Cnn().eval()
    compiled_graphs = []
    original = kiln_torch.compile

    def counting(gm, *rest, **options):
        compiled_graphs.append(type(gm).__name__)
        return original(gm, *rest, **options)

    kiln_torch.compile = counting
    try:
        torch._dynamo.reset()
        function = torch.compile(module, backend="kiln")
        with torch.no_grad():
            for batch in (2, 3, 5, 3):
                x = torch.randn(batch, 3, 16, 16)
                torch.testing.assert_close(function(x), module(x), rtol=1e-4, atol=1e-5, msg=f"batch {batch}")
    finally:
        kiln_torch.compile = original
    # The first graph static, then one program per new size with it fixed.
    assert compiled_graphs == ["GraphModule", "WithSizes", "WithSizes"], compiled_graphs
