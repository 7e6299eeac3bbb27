"""kiln.compile: PyTorch modules compiled by Kiln match PyTorch."""
import numpy as np
import pytest
import torch
import torchvision

import kiln


def _tuple(out):
    return out if isinstance(out, (tuple, list)) else (out,)


def test_every_e2e_model_matches_pytorch(e2e_models):
    seen = set()
    for name, module, inputs, output_names, axes in e2e_models:
        if id(module) in seen:  # the -dynamic twins share their module
            continue
        seen.add(id(module))
        module.eval()
        args = tuple(inputs.values())
        # A dynamic batch where the export script declares one, in dim 0 of every input.
        dynamic = bool(axes) and all(list(a) == [0] for a in axes.values())
        compiled = kiln.compile(module, args, dynamic_batch=dynamic)
        with torch.no_grad():
            expected = _tuple(module(*args))
        got = _tuple(compiled(*args))
        assert len(got) == len(expected), name
        for g, e in zip(got, expected):
            assert isinstance(g, torch.Tensor), name
            assert g.dtype == e.dtype and g.shape == e.shape, name
            torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-5, msg=name)
    assert len(seen) == 8


def test_torchvision_resnet18_matches():
    torch.manual_seed(0)
    model = torchvision.models.resnet18().eval()
    x = torch.randn(1, 3, 224, 224)
    compiled = kiln.compile(model, (x,))
    with torch.no_grad():
        expected = model(x)
    torch.testing.assert_close(compiled(x), expected, rtol=1e-4, atol=1e-5)


def test_a_module_in_training_mode_compiles_as_it_runs_and_keeps_its_statistics():
    # torchvision builds ResNets in training mode: batch norms normalize with
    # the batch's statistics, as PyTorch's forward does; compiling must not
    # move the module's running statistics.
    torch.manual_seed(4)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8), torch.nn.ReLU())
    x = torch.randn(2, 3, 10, 10)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    compiled = kiln.compile(model, (x,))
    for key, value in model.state_dict().items():
        assert torch.equal(value, before[key]), key
    with torch.no_grad():
        expected = model(x)
    torch.testing.assert_close(compiled(x), expected, rtol=1e-4, atol=1e-5)


class Small(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(6, 8)
        self.fc2 = torch.nn.Linear(8, 3)

    def forward(self, features, scale):
        return self.fc2(torch.relu(self.fc1(features))) * scale, features.sum(1)


def test_runs_in_kiln_after_forward_is_replaced():
    torch.manual_seed(1)
    module = Small().eval()
    x, s = torch.randn(4, 6), torch.full((4, 1), 2.0)
    compiled = kiln.compile(module, (x, s))
    with torch.no_grad():
        expected = module(x, s)
    module.forward = lambda *args: (torch.zeros(4, 3), torch.zeros(4))
    with torch.no_grad():
        module.fc1.weight.zero_()
    got = compiled(x, s)
    assert isinstance(got, tuple) and len(got) == 2
    torch.testing.assert_close(got[0], expected[0], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got[1], expected[1], rtol=1e-5, atol=1e-6)


def test_named_positional_numpy_and_dynamic_batch():
    torch.manual_seed(2)
    module = Small().eval()
    x, s = torch.randn(4, 6), torch.ones(4, 1)
    compiled = kiln.compile(module, (x, s))
    assert [p.name for p in compiled.inputs] == ["features", "scale"]
    assert compiled.inputs[0].shape == ("batch", 6)
    big_x, big_s = torch.randn(9, 6), torch.rand(9, 1)
    with torch.no_grad():
        expected = module(big_x, big_s)
    by_name = compiled(scale=big_s, features=big_x)
    as_numpy = compiled(big_x.numpy(), big_s.numpy())
    assert isinstance(as_numpy[0], np.ndarray)
    torch.testing.assert_close(by_name[0], expected[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(as_numpy[0], expected[0].numpy(), rtol=1e-5, atol=1e-6)


def test_static_batch_refuses_another_batch():
    module = Small().eval()
    compiled = kiln.compile(module, (torch.randn(4, 6), torch.ones(4, 1)), dynamic_batch=False)
    assert compiled.inputs[0].shape == (4, 6)
    with pytest.raises(kiln.InputError, match=r"input 'features' expects f32\[4,6\], got f32\[5,6\]"):
        compiled(torch.randn(5, 6), torch.ones(5, 1))


class Unsupported(torch.nn.Module):
    def forward(self, x):
        return torch.multinomial(x.softmax(-1), 1).float().sum() + x


def test_what_kiln_cannot_compile_is_named():
    with pytest.raises(kiln.UnsupportedError, match=r"Multinomial"):
        kiln.compile(Unsupported(), (torch.randn(3),))


def test_training_mode_dropout_is_named_with_the_fix():
    module = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Dropout(0.5)).train()
    with pytest.raises(kiln.UnsupportedError, match=r"(?s)Dropout.*random dropout.*call module.eval\(\)"):
        kiln.compile(module, (torch.randn(2, 4),))


def test_cuda_without_a_gpu_raises():
    if kiln.devices()["cuda_available"]:
        pytest.skip("a usable CUDA device is present")
    with pytest.raises(kiln.DeviceError):
        kiln.compile(Small().eval(), (torch.randn(4, 6), torch.ones(4, 1)), device="cuda")


def test_torch_compile_backend_where_pytorch_has_one():
    if not hasattr(torch, "compile"):
        pytest.skip("PyTorch " + torch.__version__ + " has no torch.compile (the backend is checked by scripts/gpu-check)")
    torch.manual_seed(3)
    module = Small().eval()
    x, s = torch.randn(4, 6), torch.ones(4, 1)
    with torch.no_grad():
        expected = module(x, s)
        got = torch.compile(module, backend="kiln")(x, s)
    torch.testing.assert_close(got[0], expected[0], rtol=1e-5, atol=1e-6)
