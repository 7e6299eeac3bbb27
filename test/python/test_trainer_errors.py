"""kiln.Trainer survives its errors: a step whose loss is not finite keeps the weights, and no call sequence crashes."""
import copy
import random

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import kiln

RTOL, ATOL = 1e-4, 1e-5


class Mlp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(6, 8)
        self.fc2 = torch.nn.Linear(8, 3)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


def batch(n, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 6, generator=g), torch.randint(0, 3, (n,), generator=g)


def overflowing(n):
    """Finite inputs (the data checks refuse NaN and Inf) whose activations overflow (at test 1's weights)."""
    return torch.full((n, 6), 3e38), torch.zeros(n, dtype=torch.int64)


def all_ignored(n):
    """A batch whose every label is ignore_index: the mean cross-entropy is 0/0, NaN, in PyTorch as in Kiln."""
    return torch.randn(n, 6), torch.full((n,), -100)


def assert_state(got, expected):
    assert list(got) == list(expected)
    for key, value in expected.items():
        torch.testing.assert_close(got[key], value, rtol=RTOL, atol=ATOL, msg=key)


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_a_step_whose_loss_is_not_finite_keeps_the_weights_and_the_trainer_works_on(optimizer):
    torch.manual_seed(0)
    module = Mlp()
    reference = copy.deepcopy(module)
    options = {"momentum": 0.9} if optimizer == "sgd" else {}
    trainer = kiln.Trainer(module, optimizer=optimizer, lr=0.05, **options)
    opt = (torch.optim.SGD(reference.parameters(), lr=0.05, momentum=0.9) if optimizer == "sgd"
           else torch.optim.Adam(reference.parameters(), lr=0.05))

    def reference_step(x, y):
        opt.zero_grad()
        loss = F.cross_entropy(reference(x), y)
        loss.backward()
        opt.step()
        return loss.item()

    for seed in range(3):
        x, y = batch(8, seed)
        assert trainer.step(x, y) == pytest.approx(reference_step(x, y), rel=1e-3)
    before = trainer.state_dict()
    with pytest.raises(kiln.Error, match=r"step 4: the loss is (nan|inf).*check_numerics=True.*update was skipped"):
        trainer.step(*overflowing(8))
    # The weights and the optimizer state are those of step 3.
    assert trainer.steps == 3
    assert_state(trainer.state_dict(), before)
    assert_state(trainer.state_dict(), reference.state_dict())
    x, y = batch(8, 10)
    with torch.no_grad():
        expected_eval = F.cross_entropy(reference(x), y).item()
    assert trainer.evaluate(x, y)["loss"] == pytest.approx(expected_eval, rel=1e-4)
    # Training goes on from step 3 as PyTorch does when it skips the step
    # (GradScaler's way): the momentum and Adam moments were kept too.
    for seed in range(3, 6):
        x, y = batch(8, seed)
        assert trainer.step(x, y) == pytest.approx(reference_step(x, y), rel=1e-3)
    assert_state(trainer.state_dict(), reference.state_dict())


def test_a_model_file_too():
    torch.manual_seed(1)
    module = Mlp()
    trainer = kiln.Trainer(module, lr=0.1)
    trainer.step(*batch(4, 0))
    path = trainer._path
    file_trainer = kiln.Trainer(path, lr=0.1, batch_size=4)
    file_trainer.step(*batch(4, 0))
    before = file_trainer.state_dict()
    with pytest.raises(kiln.Error, match=r"the loss is (nan|inf)"):
        file_trainer.step(*all_ignored(4))
    after = file_trainer.state_dict()
    assert list(after) == list(before)
    for key in before:
        np.testing.assert_array_equal(after[key], before[key])


def test_check_numerics_names_the_op_and_keeps_the_weights():
    torch.manual_seed(2)
    trainer = kiln.Trainer(Mlp(), lr=0.1, check_numerics=True)
    trainer.step(*batch(4, 0))
    before = trainer.state_dict()
    with pytest.raises(kiln.Error, match=r"the loss is (nan|inf).*first produced by") as info:
        trainer.step(*all_ignored(4))
    assert "--check-numerics" not in str(info.value)
    assert_state(trainer.state_dict(), before)


def test_random_call_sequences_with_failures_injected():
    """150 random calls, good and bad (steps, refused batches, NaN losses, loads, evaluations), against a PyTorch twin stepped only when Kiln's step succeeds.

    No call may crash the interpreter; after every call the trainer's state
    equals the twin's, and a failed call changes nothing.
    """
    rng = random.Random(25)
    torch.manual_seed(25)
    module = Mlp()
    twin = copy.deepcopy(module)
    trainer = kiln.Trainer(module, lr=0.05, momentum=0.5)
    opt = torch.optim.SGD(twin.parameters(), lr=0.05, momentum=0.5)
    lr = 0.05
    stepped = 0
    failures = 0
    loads = 0

    def twin_step(x, y):
        opt.zero_grad()
        F.cross_entropy(twin(x), y).backward()
        opt.step()

    bad_calls = [
        lambda: trainer.step(torch.randn(4, 7), torch.zeros(4, dtype=torch.int64)),  # another sample shape
        lambda: trainer.step(torch.randn(4, 6), torch.zeros(5, dtype=torch.int64)),  # labels for 5 samples
        lambda: trainer.step(torch.randn(4, 6), torch.full((4,), 7)),  # a class out of range
        lambda: trainer.step(torch.randn(4, 6), torch.randn(4)),  # float labels for a class loss
        lambda: trainer.step(torch.randn(0, 6), torch.zeros(0, dtype=torch.int64)),  # no samples
        lambda: trainer.step(np.array(3.0), np.array(1)),  # scalars
        lambda: trainer.step("x", "y"),  # not arrays
        lambda: trainer.step(torch.randn(4, 6), torch.randn(4)),  # float labels (again, before any step)
        lambda: trainer.step(torch.full((4, 6), float("nan")), torch.zeros(4, dtype=torch.int64)),  # NaN data
        lambda: trainer.step(*all_ignored(4)),  # a NaN loss
        lambda: trainer.step(*all_ignored(3)),  # ... at a batch size never seen
        lambda: trainer.evaluate(torch.randn(4, 5), torch.zeros(4, dtype=torch.int64)),
        lambda: trainer.evaluate(torch.randn(4, 6), torch.zeros(3, dtype=torch.int64)),
        lambda: trainer.load_state_dict({**Mlp().state_dict(), "fc3.weight": torch.zeros(2)}),  # an unknown key
        lambda: trainer.load_state_dict({k: v for k, v in Mlp().state_dict().items() if k != "fc2.bias"}),
        lambda: trainer.load_state_dict({**Mlp().state_dict(), "fc1.bias": torch.zeros(9)}),  # a wrong shape
    ]
    for i in range(150):
        action = rng.choice(["step", "step", "step", "bad", "bad", "evaluate", "state", "lr", "load"])
        if action == "step":
            n = rng.choice([2, 4, 5])
            x, y = batch(n, 1000 + i)
            trainer.step(x, y)
            twin_step(x, y)
            stepped += 1
        elif action == "bad":
            call = rng.choice(bad_calls)
            try:
                call()
            except (kiln.Error, ValueError, TypeError):
                failures += 1
            else:
                pytest.fail(f"call {i}: a bad call succeeded")
        elif action == "evaluate":
            x, y = batch(rng.choice([1, 4, 9]), 2000 + i)
            with torch.no_grad():
                expected = F.cross_entropy(twin(x), y).item()
            assert trainer.evaluate(x, y)["loss"] == pytest.approx(expected, rel=1e-3, abs=1e-5), i
        elif action == "load":
            # New weights; both optimizers keep their momentum buffers.
            weights = {k: v + 0.01 * rng.random() for k, v in Mlp().state_dict().items()}
            trainer.load_state_dict(weights)
            twin.load_state_dict(weights)
            loads += 1
        elif action == "lr":
            lr = rng.choice([0.01, 0.05])
            trainer.lr = lr
            for group in opt.param_groups:
                group["lr"] = lr
        assert_state(trainer.state_dict(), twin.state_dict())
        assert trainer.steps == stepped
    assert failures > 10 and stepped > 20 and loads > 5


def test_messages_name_the_python_parameters_not_command_line_flags():
    trainer = kiln.Trainer(Mlp(), lr=0.1)
    with pytest.raises(kiln.InputError, match=r"loss='cross_entropy' takes integer class indices") as info:
        trainer.step(torch.randn(4, 6), torch.randn(4))
    assert "--" not in str(info.value)
    trainer.step(*batch(4, 0))
    with pytest.raises(kiln.InputError, match=r"ignore_index") as info:
        trainer.step(torch.randn(4, 6), torch.full((4,), 9))
    assert "--" not in str(info.value)
    with pytest.raises(kiln.Error, match=r"check_numerics=True names the op") as info:
        trainer.step(*all_ignored(4))
    assert "--" not in str(info.value)


def test_load_state_dict_before_and_after_steps():
    torch.manual_seed(3)
    module = Mlp()
    untouched = copy.deepcopy(module.state_dict())
    twin = Mlp()
    trainer = kiln.Trainer(module, lr=0.1, momentum=0.9)
    opt = torch.optim.SGD(twin.parameters(), lr=0.1, momentum=0.9)
    trainer.load_state_dict(twin.state_dict())  # before the first step: the module is not touched
    for seed in range(4):
        x, y = batch(4, seed)
        trainer.step(x, y)
        opt.zero_grad()
        F.cross_entropy(twin(x), y).backward()
        opt.step()
        if seed == 1:
            weights = Mlp().state_dict()
            trainer.load_state_dict(weights)
            twin.load_state_dict(weights)
    assert_state(trainer.state_dict(), twin.state_dict())
    for key, value in untouched.items():
        assert torch.equal(module.state_dict()[key], value), key
