"""kiln.Trainer: training steps match torch.optim, and state_dict() loads back into the module."""
import copy

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import kiln

RTOL, ATOL = 1e-4, 1e-5  # the training match tolerances (test/unit/TrainingMatchTest.cpp)


class BnCnn(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(1, 4, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(4)
        self.fc = torch.nn.Linear(4 * 8 * 8, 10)

    def forward(self, x):
        return self.fc(torch.relu(self.bn(self.conv(x))).flatten(1))


def data(n, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 1, 8, 8, generator=g), torch.randint(0, 10, (n,), generator=g)


def assert_state_close(got, expected):
    assert list(got) == list(expected)
    for key, value in expected.items():
        assert got[key].shape == value.shape and got[key].dtype == value.dtype, key
        torch.testing.assert_close(got[key], value, rtol=RTOL, atol=ATOL, msg=key)


def test_20_sgd_steps_match_pytorch_and_load_back():
    torch.manual_seed(0)
    module = BnCnn()
    reference = copy.deepcopy(module).train()
    x, y = data(64, 0)
    trainer = kiln.Trainer(module, loss="cross_entropy", optimizer="sgd", lr=0.1, momentum=0.9)
    opt = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
    for step in range(20):
        rows = slice((step % 4) * 16, (step % 4) * 16 + 16)
        loss = trainer.step(x[rows], y[rows])
        opt.zero_grad()
        expected = F.cross_entropy(reference(x[rows]), y[rows])
        expected.backward()
        opt.step()
        assert loss == pytest.approx(expected.item(), rel=1e-3), step
    assert trainer.steps == 20
    state = trainer.state_dict()
    assert_state_close(state, reference.state_dict())
    assert state["bn.num_batches_tracked"].item() == 20
    fresh = BnCnn()
    fresh.load_state_dict(state, strict=True)
    fresh.eval()
    reference.eval()
    with torch.no_grad():
        torch.testing.assert_close(fresh(x), reference(x), rtol=1e-3, atol=1e-4)


class Mlp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(12, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))

    def forward(self, x):
        return self.body(x)


@pytest.mark.parametrize("optimizer", ["adam", "adamw"])
def test_adam_steps_match_pytorch(optimizer):
    torch.manual_seed(1)
    module = Mlp()
    reference = copy.deepcopy(module)
    g = torch.Generator().manual_seed(1)
    x, target = torch.randn(32, 12, generator=g), torch.randn(32, 3, generator=g)
    make = torch.optim.Adam if optimizer == "adam" else torch.optim.AdamW
    # The optimizer and loss also go as PyTorch's own class and module.
    trainer = kiln.Trainer(module, loss=torch.nn.MSELoss(), optimizer=make, lr=1e-2)
    opt = make(reference.parameters(), lr=1e-2)
    for step in range(20):
        rows = slice((step % 2) * 16, (step % 2) * 16 + 16)
        trainer.step(x[rows], target[rows])
        opt.zero_grad()
        F.mse_loss(reference(x[rows]), target[rows]).backward()
        opt.step()
    assert_state_close(trainer.state_dict(), reference.state_dict())


def test_fit_and_evaluate_learn_a_separable_problem():
    torch.manual_seed(2)
    g = torch.Generator().manual_seed(2)
    centers = torch.randn(3, 12, generator=g) * 3
    labels = torch.randint(0, 3, (300,), generator=g)
    x = centers[labels] + torch.randn(300, 12, generator=g)
    trainer = kiln.Trainer(Mlp(), optimizer="adam", lr=1e-2, batch_size=32)
    history = trainer.fit(x.numpy(), labels.numpy(), epochs=5)
    assert len(history) == 5 and history[-1] < history[0]
    result = trainer.evaluate(x, labels)
    assert result["accuracy"] > 0.95 and result["counted"] == 300
    assert trainer.steps == 5 * 10  # 300 samples in batches of 32: 10 a epoch


def test_training_a_model_file(e2e_dir):
    trainer = kiln.Trainer(e2e_dir / "mlp" / "model.onnx", lr=0.05, batch_size=8)
    rng = np.random.default_rng(4)
    x = rng.standard_normal((8, 64)).astype(np.float32)
    y = rng.integers(0, 10, 8)
    losses = [trainer.step(x, y) for _ in range(10)]
    assert losses[-1] < losses[0]
    state = trainer.state_dict()
    assert isinstance(state, dict) and all(isinstance(v, np.ndarray) for v in state.values())


def test_bad_batches_raise_input_errors():
    trainer = kiln.Trainer(Mlp(), lr=0.1)
    x = np.zeros((4, 12), np.float32)
    with pytest.raises(kiln.InputError, match=r"takes integer class indices"):
        trainer.step(x, np.zeros(4, np.float32))
    trainer.step(x, np.zeros(4, np.int64))
    with pytest.raises(kiln.InputError, match=r"outside \[0, 3\)"):
        trainer.step(x, np.full(4, 7))
    with pytest.raises(kiln.InputError, match=r"samples of shape \[13\]"):
        trainer.step(np.zeros((4, 13), np.float32), np.zeros(4, np.int64))
    with pytest.raises(kiln.InputError, match=r"one label per sample"):
        trainer.fit(x, np.zeros(3, np.int64))
    with pytest.raises(ValueError, match=r"loss='hinge'"):
        kiln.Trainer(Mlp(), loss="hinge")


def test_trainer_on_cuda_without_a_gpu_raises():
    if kiln.devices()["cuda_available"]:
        pytest.skip("a usable CUDA device is present")
    with pytest.raises(kiln.DeviceError):
        kiln.Trainer(Mlp(), device="cuda")


def test_bf16_steps_track_pytorch_autocast_and_keep_f32_weights():
    """precision="bf16": each step's GEMMs on bf16 inputs (forward and
    backward), f32 master weights and optimizer state; the losses follow
    PyTorch's f32 ones within bf16's rounding and the weights stay f32."""
    torch.manual_seed(0)
    module = BnCnn()
    reference = copy.deepcopy(module).train()
    x, y = data(64, 0)
    trainer = kiln.Trainer(module, loss="cross_entropy", optimizer="sgd", lr=0.1, momentum=0.9, precision="bf16")
    f32 = kiln.Trainer(copy.deepcopy(module), loss="cross_entropy", optimizer="sgd", lr=0.1, momentum=0.9)
    opt = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
    losses, f32_losses, expected = [], [], []
    for step in range(10):
        rows = slice((step % 4) * 16, (step % 4) * 16 + 16)
        losses.append(trainer.step(x[rows], y[rows]))
        f32_losses.append(f32.step(x[rows], y[rows]))
        opt.zero_grad()
        loss = F.cross_entropy(reference(x[rows]), y[rows])
        loss.backward()
        opt.step()
        expected.append(loss.item())
    assert losses == pytest.approx(expected, rel=3e-2)
    assert losses[-1] < losses[0]
    with open("/proc/cpuinfo") as cpuinfo:
        if "avx512_bf16" in cpuinfo.read():  # else the CPU computes in f32 (with a warning)
            assert losses != f32_losses
    state = trainer.state_dict()
    assert all(value.dtype == reference.state_dict()[key].dtype for key, value in state.items())
    torch.testing.assert_close(state["fc.weight"], reference.state_dict()["fc.weight"], rtol=5e-2, atol=5e-3)


def test_unknown_trainer_precision_is_a_value_error():
    with pytest.raises(ValueError, match="precision='int8'"):
        kiln.Trainer(BnCnn(), precision="int8")
