"""kiln.compile takes forward as it is: scalar and unused arguments, nested outputs, dynamic axes, bf16 and f16."""
import collections

import numpy as np
import pytest
import torch

import kiln


class Scaled(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 3)

    def forward(self, x, scale=2.0, unused=None, *, shift: int = 1):
        return self.fc(x) * scale + shift


def test_scalar_arguments_with_defaults_are_frozen():
    torch.manual_seed(0)
    module = Scaled().eval()
    x = torch.randn(2, 4)
    compiled = kiln.compile(module, (x,))
    assert [p.name for p in compiled.inputs] == ["x"]
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), module(x), rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(compiled(x, 2.0), module(x), rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(compiled(x=x, shift=1), module(x), rtol=1e-5, atol=1e-6)
    with pytest.raises(kiln.InputError, match=r"argument 'scale' is 3\.0, but the module was compiled with scale=2\.0"):
        compiled(x, 3.0)


def test_a_scalar_given_at_compile_time_is_frozen_at_that_value():
    torch.manual_seed(1)
    module = Scaled().eval()
    x = torch.randn(2, 4)
    compiled = kiln.compile(module, (x, 0.5))
    with torch.no_grad():
        torch.testing.assert_close(compiled(x, 0.5), module(x, 0.5), rtol=1e-5, atol=1e-6)


class TwoInputs(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 2)

    def forward(self, x, mask):  # mask is not used
        return self.fc(x)


def test_an_unused_tensor_argument_is_ignored():
    torch.manual_seed(2)
    module = TwoInputs().eval()
    x, mask = torch.randn(3, 4), torch.ones(3, 4)
    compiled = kiln.compile(module, (x, mask))
    with torch.no_grad():
        expected = module(x, mask)
    torch.testing.assert_close(compiled(x, mask), expected, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(compiled(x=x, mask=torch.zeros(3, 4)), expected, rtol=1e-5, atol=1e-6)


class Nested(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)

    def forward(self, x):
        h = self.fc(x)
        Pair = collections.namedtuple("Pair", "low high")
        return {"hidden": h, "parts": (h.relu(), [h.sigmoid(), h * 2]), "pair": Pair(h.min(1).values, h.max(1).values)}


def test_nested_tuples_lists_and_dicts_of_outputs_keep_their_structure():
    torch.manual_seed(3)
    module = Nested().eval()
    x = torch.randn(2, 4)
    compiled = kiln.compile(module, (x,))
    got = compiled(x)
    with torch.no_grad():
        expected = module(x)
    assert list(got) == ["hidden", "parts", "pair"]
    assert isinstance(got["parts"], tuple) and isinstance(got["parts"][1], list)
    assert type(got["pair"]).__name__ == "Pair" and got["pair"]._fields == ("low", "high")
    torch.testing.assert_close(got["hidden"], expected["hidden"], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got["parts"][0], expected["parts"][0], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got["parts"][1][1], expected["parts"][1][1], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got["pair"].high, expected["pair"].high, rtol=1e-5, atol=1e-6)


class Tokens(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(20, 8)
        self.layer = torch.nn.TransformerEncoderLayer(8, 2, dim_feedforward=16, dropout=0.0, batch_first=True)

    def forward(self, tokens):
        return self.layer(self.embed(tokens))


class TokenAttention(torch.nn.Module):
    """One head of self-attention over embedded tokens, written with shape-free ops: PyTorch 2.x's TorchScript
    export of nn.MultiheadAttention bakes the example's sequence length into a Reshape (the graph itself is then
    static in that dim, for any consumer), where 1.13's computes it from the input's shape."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(20, 8)
        self.qkv = torch.nn.Linear(8, 24)
        self.out = torch.nn.Linear(8, 8)

    def forward(self, tokens):
        q, k, v = self.qkv(self.embed(tokens)).chunk(3, dim=-1)
        weights = torch.softmax(q @ k.transpose(-1, -2) / 8**0.5, dim=-1)
        return self.out(weights @ v)


def test_dynamic_axes_for_a_sequence_dim():
    torch.manual_seed(4)
    module = TokenAttention().eval()
    compiled = kiln.compile(module, (torch.randint(0, 20, (2, 7)),), dynamic_axes={"tokens": {1: "sequence"}})
    assert compiled.inputs[0].shape == ("batch", "sequence")
    longer = torch.randint(0, 20, (3, 9))
    with torch.no_grad():
        expected = module(longer)
    torch.testing.assert_close(compiled(longer), expected, rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match=r"dynamic_axes names 'ids', which is not a tensor argument"):
        kiln.compile(module, (longer,), dynamic_axes={"ids": [1]})


def test_a_static_sequence_dim_is_refused_without_dynamic_axes():
    module = Tokens().eval()
    compiled = kiln.compile(module, (torch.randint(0, 20, (2, 7)),))
    with pytest.raises(kiln.InputError, match=r"tokens"):
        compiled(torch.randint(0, 20, (2, 9)))


class HalfEdges(torch.nn.Module):
    """Takes and returns a half-precision tensor (PyTorch 1.13 has no f16 matmul on the CPU to run it in f16)."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 3)

    def forward(self, x):
        return torch.relu(self.fc(x.float())).to(x.dtype) * 2


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_tensors(dtype):
    torch.manual_seed(5)
    module = HalfEdges().eval()
    x = torch.randn(2, 4).to(dtype)
    compiled = kiln.compile(module, (x,))
    got = compiled(torch.randn(5, 4).to(dtype))
    assert got.dtype == dtype and got.shape == (5, 3)
    y = torch.randn(3, 4).to(dtype)
    with torch.no_grad():
        torch.testing.assert_close(compiled(y), module(y), rtol=0, atol=0)
    if dtype == torch.float16:
        as_numpy = compiled(y.numpy())
        assert isinstance(as_numpy, np.ndarray) and as_numpy.dtype == np.float16
    else:
        with pytest.raises(kiln.InputError, match=r"argument 'x' is a float32 array.*torch.bfloat16"):
            compiled(y.float().numpy())


def test_device_errors_name_the_python_parameter():
    with pytest.raises(ValueError) as info:
        kiln.compile(HalfEdges().eval(), (torch.randn(2, 4),), device="cuda:x")
    assert "--" not in str(info.value)
    if kiln.devices()["cuda_available"]:
        return
    with pytest.raises(kiln.DeviceError, match=r"^device='cuda': CUDA is not usable") as info:
        kiln.compile(HalfEdges().eval(), (torch.randn(2, 4),), device="cuda")
    assert "--device" not in str(info.value)
