"""kiln.Trainer trains modules whose exported graphs compute shapes (Shape ops), per batch shape as `kiln train` does."""
import copy

import pytest
import torch
import torch.nn.functional as F

import kiln


class Encoder(torch.nn.Module):
    """A small transformer classifier: its exported graph computes shapes from the batch."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Linear(4, 16)
        self.layer = torch.nn.TransformerEncoderLayer(16, 2, dim_feedforward=32, dropout=0.0, batch_first=True)
        self.head = torch.nn.Linear(16, 3)

    def forward(self, x):
        return self.head(self.layer(self.embed(x)).mean(1))


class Recurrent(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = torch.nn.LSTM(4, 8, batch_first=True)
        self.head = torch.nn.Linear(8, 3)

    def forward(self, x):
        out, _ = self.lstm(x)
        return self.head(out[:, -1])


def data(n, seed, length=5):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, length, 4, generator=g), torch.randint(0, 3, (n,), generator=g)


def test_a_transformer_encoder_layer_trains_as_pytorch():
    torch.manual_seed(0)
    module = Encoder()
    reference = copy.deepcopy(module)
    trainer = kiln.Trainer(module, lr=0.05, momentum=0.9, batch_size=8)
    opt = torch.optim.SGD(reference.parameters(), lr=0.05, momentum=0.9)
    # Two batch sizes: one step program each.
    for step, n in enumerate([8, 8, 5, 8]):
        x, y = data(n, step)
        loss = trainer.step(x, y)
        opt.zero_grad()
        expected = F.cross_entropy(reference(x), y)
        expected.backward()
        opt.step()
        assert loss == pytest.approx(expected.item(), rel=1e-3), step
    state = trainer.state_dict()
    for key, value in reference.state_dict().items():
        torch.testing.assert_close(state[key], value, rtol=1e-3, atol=1e-4, msg=key)
    x, y = data(6, 99)
    with torch.no_grad():
        expected = F.cross_entropy(reference(x), y).item()
    assert trainer.evaluate(x, y)["loss"] == pytest.approx(expected, rel=1e-3)


def test_a_transformer_model_file_trains():
    torch.manual_seed(1)
    trainer = kiln.Trainer(Encoder(), lr=0.05, batch_size=4)
    trainer.step(*data(4, 0))
    file_trainer = kiln.Trainer(trainer._path, lr=0.05, batch_size=4)
    first = file_trainer.step(*data(4, 0))
    second = file_trainer.step(*data(4, 0))
    assert second < first


def test_an_lstm_module_trains_as_pytorch():
    torch.manual_seed(2)
    module = Recurrent()
    reference = copy.deepcopy(module)
    trainer = kiln.Trainer(module, lr=0.1, batch_size=4)
    opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    for step in range(3):
        x, y = data(4, step)
        loss = trainer.step(x, y)
        opt.zero_grad()
        expected = F.cross_entropy(reference(x), y)
        expected.backward()
        opt.step()
        assert loss == pytest.approx(expected.item(), rel=1e-3), step
    state = trainer.state_dict()
    assert list(state) == list(reference.state_dict())
    for key, value in reference.state_dict().items():
        torch.testing.assert_close(state[key], value, rtol=1e-3, atol=1e-4, msg=key)


class Sampling(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 3)

    def forward(self, x):
        h = self.fc(x.mean(1))
        return h + torch.multinomial(h.softmax(-1), 1).float()


def test_an_op_kiln_cannot_import_is_the_unsupported_error():
    trainer = kiln.Trainer(Sampling(), lr=0.1, batch_size=4)
    with pytest.raises(kiln.UnsupportedError, match=r"Multinomial") as info:
        trainer.step(*data(4, 0))
    assert "cannot open" not in str(info.value) and "only known at run time" not in str(info.value)
