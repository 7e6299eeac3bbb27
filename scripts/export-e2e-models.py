#!/usr/bin/python3
"""Exports the end-to-end test models of test/e2e/ from PyTorch.

These are the models of the tutorials Kiln's users come from (an MLP, the
small CNN on 3x28x28 images, an RNN, a 2-layer LSTM, a GRU, a Transformer
encoder layer, a small decoder-only GPT, and a small ResNet-like CNN with
batch norm, a residual add, a depthwise convolution and a channel concat),
with small sizes and random weights from fixed seeds. For each model, test/e2e/<model>/ receives:

  model.onnx           torch.onnx.export, opset 17, dynamic batch axis (the
                       Transformer and GPT also with a static one)
  input_<name>.npy     the inputs, by graph input name
  expected_<name>.npy  PyTorch's outputs for those inputs, by graph output name

test/e2e/run-e2e.sh runs each model through `kiln run` and compares its
outputs with the expected ones. Re-running this script rewrites the same
files (fixed seeds, deterministic CPU kernels); it needs Debian's
python3-torch (1.13), python3-onnx and python3-numpy:

  /usr/bin/python3 scripts/export-e2e-models.py [OUT_DIR]   # default: test/e2e
"""
import math
import os
import sys

import numpy as np
import onnx
import torch
import torch.nn as nn
import torch.nn.functional as F

OPSET = 17


class MLP(nn.Module):
    """The tutorials' two Linear layers (64 -> 32 -> 10), with a ReLU between."""

    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))

    def forward(self, x):
        return self.net(x)


class CNN(nn.Module):
    """The tutorial's CNN on 3x28x28: two conv+relu+maxpool stages and two
    Linear layers (fc1 narrowed from 128 to 64 to keep the file small)."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels=3, out_channels=16, kernel_size=3, stride=1, padding=1)
        self.pool1 = nn.MaxPool2d(kernel_size=2, stride=2)
        self.conv2 = nn.Conv2d(in_channels=16, out_channels=32, kernel_size=3, stride=1, padding=1)
        self.pool2 = nn.MaxPool2d(kernel_size=2, stride=2)
        self.fc1 = nn.Linear(in_features=32 * 7 * 7, out_features=64)
        self.fc2 = nn.Linear(in_features=64, out_features=10)

    def forward(self, x):
        x = self.pool1(F.relu(self.conv1(x)))
        x = self.pool2(F.relu(self.conv2(x)))
        x = x.view(-1, 32 * 7 * 7)
        x = F.relu(self.fc1(x))
        return self.fc2(x)


class RNN(nn.Module):
    """nn.RNN (tanh), batch-first, with the initial hidden state as an input."""

    def __init__(self):
        super().__init__()
        self.rnn = nn.RNN(input_size=8, hidden_size=16, batch_first=True)

    def forward(self, x, h0):
        out, h_n = self.rnn(x, h0)
        return out, h_n


class LSTM(nn.Module):
    """The tutorial's LSTM: 2 layers, batch-first, returning out, h_n, c_n."""

    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(input_size=8, hidden_size=16, num_layers=2, batch_first=True)

    def forward(self, x, h0, c0):
        out, (h_n, c_n) = self.lstm(x, (h0, c0))
        return out, h_n, c_n


class GRU(nn.Module):
    def __init__(self):
        super().__init__()
        self.gru = nn.GRU(input_size=8, hidden_size=16, batch_first=True)

    def forward(self, x, h0):
        out, h_n = self.gru(x, h0)
        return out, h_n


class Transformer(nn.Module):
    """One nn.TransformerEncoderLayer, batch-first, in eval mode."""

    def __init__(self):
        super().__init__()
        self.layer = nn.TransformerEncoderLayer(d_model=32, nhead=4, dim_feedforward=64, batch_first=True)

    def forward(self, x):
        return self.layer(x)


class CausalSelfAttention(nn.Module):
    def __init__(self, d_model, n_head, context):
        super().__init__()
        self.n_head = n_head
        self.scale = 1.0 / math.sqrt(d_model // n_head)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.register_buffer("mask", torch.tril(torch.ones(context, context, dtype=torch.bool)))

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        q = q.view(b, t, self.n_head, c // self.n_head).transpose(1, 2)
        k = k.view(b, t, self.n_head, c // self.n_head).transpose(1, 2)
        v = v.view(b, t, self.n_head, c // self.n_head).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * self.scale
        att = att.masked_fill(~self.mask[:t, :t], float("-inf"))
        att = F.softmax(att, dim=-1)
        y = (att @ v).transpose(1, 2).reshape(b, t, c)
        return self.proj(y)


class Block(nn.Module):
    def __init__(self, d_model, n_head, context):
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model)
        self.attn = CausalSelfAttention(d_model, n_head, context)
        self.ln2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """A small decoder-only GPT: token and positional embeddings, 2 blocks of
    causal self-attention + MLP with pre-layer-norm, a final layer norm and
    the language-model head."""

    def __init__(self, vocab=64, d_model=32, n_head=4, context=16, n_layer=2):
        super().__init__()
        self.tok = nn.Embedding(vocab, d_model)
        self.pos = nn.Embedding(context, d_model)
        self.blocks = nn.Sequential(*[Block(d_model, n_head, context) for _ in range(n_layer)])
        self.ln_f = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab, bias=False)

    def forward(self, idx):
        t = idx.shape[1]
        pos = torch.arange(t, dtype=torch.long).unsqueeze(0)
        x = self.tok(idx) + self.pos(pos)
        return self.head(self.ln_f(self.blocks(x)))


class ResNetish(nn.Module):
    """A small CNN with the layers of ResNets and MobileNets on 3x32x32: a
    stem conv + BatchNorm + ReLU, a residual block (conv-bn-relu-conv-bn,
    identity add, ReLU), a depthwise conv (groups == channels) + BN + ReLU6,
    a channel concat of two branches (16 + 8 = 24 channels, not a multiple
    of 16) and a batch norm of the concat, a max pool, then a pointwise conv
    + BN + ReLU to 32 channels, global average pooling and a Linear head.
    In eval mode; the batch norms' running statistics and affine parameters
    are random (set by `randomize_bn`), so that no batch norm is the
    identity. The export folds each batch norm that follows a conv into the
    conv's weights; the one after the concat stays a BatchNormalization."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU())
        self.res_conv1 = nn.Conv2d(16, 16, 3, padding=1, bias=False)
        self.res_bn1 = nn.BatchNorm2d(16)
        self.res_conv2 = nn.Conv2d(16, 16, 3, padding=1, bias=False)
        self.res_bn2 = nn.BatchNorm2d(16)
        self.depthwise = nn.Sequential(nn.Conv2d(16, 16, 3, stride=2, padding=1, groups=16, bias=False),
                                       nn.BatchNorm2d(16), nn.ReLU6())
        self.branch = nn.Sequential(nn.Conv2d(16, 8, 1), nn.ReLU())
        self.concat_bn = nn.BatchNorm2d(24)
        self.pool = nn.MaxPool2d(2)
        self.pointwise = nn.Sequential(nn.Conv2d(24, 32, 1, bias=False), nn.BatchNorm2d(32), nn.ReLU())
        self.head = nn.Linear(32, 10)

    def forward(self, x):
        x = self.stem(x)
        y = F.relu(self.res_bn1(self.res_conv1(x)))
        x = F.relu(x + self.res_bn2(self.res_conv2(y)))
        d = self.depthwise(x)
        x = torch.cat([d, self.branch(d)], dim=1)
        x = self.pointwise(self.pool(self.concat_bn(x)))
        x = F.adaptive_avg_pool2d(x, 1).flatten(1)
        return self.head(x)


def randomize_bn(module, gen):
    """Random running statistics and affine parameters for every BatchNorm2d
    of MODULE (from GEN), so that eval-mode batch norm is not the identity."""
    for m in module.modules():
        if isinstance(m, nn.BatchNorm2d):
            with torch.no_grad():
                m.running_mean.copy_(0.5 * randn(gen, m.num_features))
                m.running_var.copy_(0.5 + torch.rand(m.num_features, generator=gen))
                m.weight.copy_(1.0 + 0.25 * randn(gen, m.num_features))
                m.bias.copy_(0.25 * randn(gen, m.num_features))
    return module


def randn(gen, *shape):
    return torch.randn(*shape, generator=gen, dtype=torch.float32)


def models():
    """(name, module, inputs by name, output names, dynamic axes) for each model."""
    gen = torch.Generator().manual_seed(1234)
    batch = 2
    yield "mlp", MLP(), {"x": randn(gen, batch, 64)}, ["logits"], {"x": {0: "batch"}, "logits": {0: "batch"}}
    yield ("cnn", CNN(), {"x": randn(gen, batch, 3, 28, 28)}, ["logits"],
           {"x": {0: "batch"}, "logits": {0: "batch"}})
    yield ("rnn", RNN(), {"x": randn(gen, batch, 5, 8), "h0": randn(gen, 1, batch, 16)}, ["out", "h_n"],
           {"x": {0: "batch"}, "h0": {1: "batch"}, "out": {0: "batch"}, "h_n": {1: "batch"}})
    yield ("lstm", LSTM(),
           {"x": randn(gen, batch, 5, 8), "h0": randn(gen, 2, batch, 16), "c0": randn(gen, 2, batch, 16)},
           ["out", "h_n", "c_n"],
           {"x": {0: "batch"}, "h0": {1: "batch"}, "c0": {1: "batch"}, "out": {0: "batch"}, "h_n": {1: "batch"},
            "c_n": {1: "batch"}})
    yield ("gru", GRU(), {"x": randn(gen, batch, 5, 8), "h0": randn(gen, 1, batch, 16)}, ["out", "h_n"],
           {"x": {0: "batch"}, "h0": {1: "batch"}, "out": {0: "batch"}, "h_n": {1: "batch"}})
    # The attention models read their input's shape (Shape -> Gather ->
    # Reshape), so a dynamic batch makes those shapes run-time values. Each
    # is exported twice: with a static batch, and with a dynamic one
    # (`*-dynamic`: the same weights and inputs).
    transformer = Transformer()
    x = randn(gen, batch, 6, 32)
    yield "transformer", transformer, {"x": x}, ["y"], {}
    yield "transformer-dynamic", transformer, {"x": x}, ["y"], {"x": {0: "batch"}, "y": {0: "batch"}}
    gpt = GPT()
    idx = torch.randint(0, 64, (batch, 8), generator=gen, dtype=torch.long)
    yield "gpt", gpt, {"idx": idx}, ["logits"], {}
    yield "gpt-dynamic", gpt, {"idx": idx}, ["logits"], {"idx": {0: "batch"}, "logits": {0: "batch"}}
    yield ("resnetish", randomize_bn(ResNetish(), gen), {"x": randn(gen, batch, 3, 32, 32)}, ["logits"],
           {"x": {0: "batch"}, "logits": {0: "batch"}})


def export(name, module, inputs, output_names, dynamic_axes, out_dir):
    folder = os.path.join(out_dir, name)
    os.makedirs(folder, exist_ok=True)
    module.eval()
    args = tuple(inputs.values())
    with torch.no_grad():
        outputs = module(*args)
    if isinstance(outputs, torch.Tensor):
        outputs = (outputs,)
    path = os.path.join(folder, "model.onnx")
    torch.onnx.export(module, args, path, input_names=list(inputs), output_names=output_names,
                      dynamic_axes=dynamic_axes, opset_version=OPSET, do_constant_folding=True)
    onnx.checker.check_model(onnx.load(path), full_check=True)
    for input_name, value in inputs.items():
        np.save(os.path.join(folder, f"input_{input_name}.npy"), value.numpy())
    for output_name, value in zip(output_names, outputs):
        np.save(os.path.join(folder, f"expected_{output_name}.npy"), value.numpy())
    size = sum(os.path.getsize(os.path.join(folder, f)) for f in os.listdir(folder))
    ops = sorted({n.op_type for n in onnx.load(path).graph.node})
    print(f"{name}: {size / 1024:.0f} KiB, ops: {' '.join(ops)}")
    return size


def main():
    out_dir = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "test", "e2e")
    torch.manual_seed(0)  # weights: each model's initializers draw from this in order
    torch.use_deterministic_algorithms(True)
    total = 0
    for name, module, inputs, output_names, dynamic_axes in models():
        total += export(name, module, inputs, output_names, dynamic_axes, out_dir)
    print(f"total: {total / 1024:.0f} KiB")
    if total > 5 * 1024 * 1024:
        print("error: the end-to-end models exceed 5 MB", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
