#!/usr/bin/python3
"""Writes the PyTorch reference runs that Kiln's training steps must match
(issue 6 item 6; test/unit/TrainingMatchTest.cpp compares them).

For the MLP, the CNN, the LSTM and the small GPT of scripts/export-e2e-models.py
(the same classes, imported from that script), with fixed seeds: a fixed
batch and integer labels, the cross-entropy loss, and two optimizers,

  sgd:    torch.optim.SGD(lr, momentum=0.9, weight_decay=0.1)
  adamw:  torch.optim.AdamW(lr, weight_decay=1.0)   (betas 0.9/0.999, eps 1e-8)

(weight decays larger than usual so that lr * weight_decay, the relative
change decay makes in one step, stays above the test's rtol 1e-4: a wrong
decay formula then fails the one-step comparison, not only the 100 steps)

and for the MLP also SGD with Nesterov momentum and StepLR and Adam with a
warm-up cosine schedule (see the settings below), trained 100 steps on that one batch in float32 (the models have no dropout
or batch norm, so training and eval mode compute the same). For each model,
test/training-match/<model>/ receives:

  input_<name>.npy       the batch, by ONNX graph input name
  labels.npy             int64 labels
  model.onnx             the initial model, only where the e2e model
                         (test/e2e/<model>/model.onnx) is not exactly it: the
                         script checks that it is for the MLP, CNN and LSTM
  <opt>-step1.onnx       the model after one step, exported by the same
                         torch.onnx.export call as the initial one, so that
                         its initializers (names and layouts: transposed
                         MatMul weights, the LSTM's gate order and
                         concatenated biases) are those of the initial model
  <opt>-losses.npy       float64 [100]: the loss computed by each of the 100 steps

The loss: F.cross_entropy(logits, labels) for the MLP and the CNN. The LSTM
and the GPT produce [N, T, C]; their loss is per position over the last
axis, F.cross_entropy(out.transpose(1, 2), labels) with labels [N, T] (the
mean over all N*T positions), which is what Kiln computes on the model's
output transposed to [N, C, T]. For the GPT the labels are the next tokens.

The GPT's layer norms all start as weight 1, bias 0; torch.onnx.export (eval
mode) merges initializers of equal value into one (Identity nodes), which
would tie the ten layer-norm parameters together in the ONNX model. The
script perturbs them (and so exports its own initial GPT model).

Re-running the script rewrites the same files (fixed seeds, deterministic
CPU kernels). It needs Debian's python3-torch (1.13), python3-onnx, python3-numpy:

  /usr/bin/python3 scripts/export-training-fixtures.py [OUT_DIR]   # default: test/training-match
"""
import importlib.util
import math
import os
import sys

import numpy as np
import onnx
import onnx.numpy_helper
import torch
import torch.nn.functional as F

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
STEPS = 100

# Per model: the learning rates of SGD and AdamW. Chosen so that 100 steps
# lower the loss substantially without driving it near zero (where a relative
# comparison of losses means little).
LEARNING_RATES = {
    "mlp": {"sgd": 2e-3, "adamw": 5e-4, "nesterov-steplr": 2e-3, "adam-cosine": 2e-3},
    "cnn": {"sgd": 1e-3, "adamw": 2e-4},
    "lstm": {"sgd": 0.01, "adamw": 5e-3},
    "gpt": {"sgd": 0.02, "adamw": 1e-3},
    "bncnn": {"sgd": 0.02, "adamw": 2e-3},
    "encoder": {"sgd": 0.05, "adamw": 5e-4},
}
SGD_MOMENTUM = 0.9
SGD_WEIGHT_DECAY = 0.1
ADAMW_WEIGHT_DECAY = 1.0
# The MLP's two further runs, which check the other optimizer variants and
# Kiln's learning-rate schedules (passes/TrainingStep.h) against torch's:
#   nesterov-steplr: SGD(momentum=0.9, nesterov=True, weight_decay=0.1) with
#                    StepLR(step_size=25, gamma=0.5)
#   adam-cosine:     Adam(weight_decay=0.1) (L2 in the gradient) with the
#                    warm-up cosine as a LambdaLR: lr * t / 10 for t < 10,
#                    then from lr down to 1e-4 over the remaining 90 steps
STEP_SIZE, GAMMA = 25, 0.5
WARMUP, TOTAL, MIN_LR = 10, 100, 1e-4


class BnCnn(torch.nn.Module):
    """A small CNN with batch norms (2-d after the convolution, 1-d after the
    hidden linear layer): the one fixture trained in train mode, where each
    batch is normalized with its own statistics and the running ones are
    updated (momentum 0.1, the running variance with the unbiased batch
    variance)."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(1, 4, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(4)
        self.fc1 = torch.nn.Linear(4 * 4 * 4, 16)
        self.bn1 = torch.nn.BatchNorm1d(16)
        self.fc2 = torch.nn.Linear(16, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn(self.conv(x))), 2)
        return self.fc2(F.relu(self.bn1(self.fc1(torch.flatten(x, 1)))))


class Encoder(torch.nn.Module):
    """A token classifier on a two-layer nn.TransformerEncoder, exported
    fresh: its layers are copies of one, and its layer norms all start at
    weight 1 and bias 0, so torch.onnx.export stores each group of equal
    parameters once and recreates the others with Identity nodes, which Kiln
    must train as the separate tensors they are in PyTorch."""

    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(20, 16)
        layer = torch.nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
        self.enc = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.fc = torch.nn.Linear(16, 4)

    def forward(self, x):
        return self.fc(self.enc(self.emb(x)).mean(1))


def load_e2e_module():
    path = os.path.join(ROOT, "scripts", "export-e2e-models.py")
    spec = importlib.util.spec_from_file_location("export_e2e_models", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def e2e_models(e2e):
    """The e2e models with their exact initial weights (export-e2e-models.py
    seeds the global generator with 0, then builds the models in order), by
    name: (module, output names, dynamic axes)."""
    torch.manual_seed(0)
    found = {}
    for name, module, _, output_names, dynamic_axes in e2e.models():
        found[name] = (module, output_names, dynamic_axes)
    return found


def export(module, inputs, output_names, dynamic_axes, path):
    """The call of export-e2e-models.py, so that initializer names and
    layouts are the same. A model with batch norms is exported with
    TrainingMode.PRESERVE in eval mode: BatchNormalization nodes with the
    running statistics as initializers (TrainingMode.EVAL would fold each
    batch norm into the convolution before it)."""
    training = module.training
    module.eval()
    has_bn = any(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in module.modules())
    mode = torch.onnx.TrainingMode.PRESERVE if has_bn else torch.onnx.TrainingMode.EVAL
    torch.onnx.export(module, tuple(inputs.values()), path, input_names=list(inputs), output_names=output_names,
                      dynamic_axes=dynamic_axes, opset_version=17, do_constant_folding=True, training=mode)
    module.train(training)


def initializers(path):
    """The initializers by name, and the Identity nodes of initializers by
    their output's name (torch.onnx.export's form of a parameter equal to
    another), as Kiln loads a model for training."""
    graph = onnx.load(path).graph
    found = {i.name: onnx.numpy_helper.to_array(i) for i in graph.initializer}
    for node in graph.node:
        if node.op_type == "Identity" and node.input[0] in found:
            found[node.output[0]] = found[node.input[0]]
    return found


def same_initializers(a, b):
    return a.keys() == b.keys() and all(a[k].dtype == b[k].dtype and np.array_equal(a[k], b[k]) for k in a)


def loss_of(name, module, inputs, labels):
    out = module(*inputs.values())
    if isinstance(out, tuple):
        out = out[0]
    if out.dim() == 3:
        out = out.transpose(1, 2)  # [N, T, C] -> [N, C, T]: classes on axis 1
    return F.cross_entropy(out, labels)


def make_optimizer(kind, params, lr):
    """The optimizer of run `kind`, and its scheduler (None: constant lr)."""
    if kind == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=SGD_MOMENTUM, weight_decay=SGD_WEIGHT_DECAY), None
    if kind == "adamw":
        return torch.optim.AdamW(params, lr=lr, weight_decay=ADAMW_WEIGHT_DECAY), None
    if kind == "nesterov-steplr":
        optimizer = torch.optim.SGD(params, lr=lr, momentum=SGD_MOMENTUM, nesterov=True, weight_decay=SGD_WEIGHT_DECAY)
        return optimizer, torch.optim.lr_scheduler.StepLR(optimizer, step_size=STEP_SIZE, gamma=GAMMA)
    assert kind == "adam-cosine"
    optimizer = torch.optim.Adam(params, lr=lr, weight_decay=SGD_WEIGHT_DECAY)

    def factor(t):
        if t < WARMUP:
            return t / WARMUP
        progress = min(1.0, (t - WARMUP) / (TOTAL - WARMUP))
        return (MIN_LR + (lr - MIN_LR) * (1 + math.cos(math.pi * progress)) / 2) / lr

    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def batch(name, gen):
    """A fixed small batch and its labels."""
    if name == "mlp":
        return {"x": torch.randn(8, 64, generator=gen)}, torch.randint(0, 10, (8,), generator=gen)
    if name == "cnn":
        return {"x": torch.randn(4, 3, 28, 28, generator=gen)}, torch.randint(0, 10, (4,), generator=gen)
    if name == "bncnn":
        return {"x": torch.randn(8, 1, 8, 8, generator=gen)}, torch.randint(0, 10, (8,), generator=gen)
    if name == "encoder":
        return {"x": torch.randint(0, 20, (8, 6), generator=gen)}, torch.randint(0, 4, (8,), generator=gen)
    if name == "lstm":
        inputs = {"x": torch.randn(4, 5, 8, generator=gen), "h0": 0.5 * torch.randn(2, 4, 16, generator=gen),
                  "c0": 0.5 * torch.randn(2, 4, 16, generator=gen)}
        return inputs, torch.randint(0, 16, (4, 5), generator=gen)
    tokens = torch.randint(0, 64, (4, 9), generator=gen)
    return {"idx": tokens[:, :8].contiguous()}, tokens[:, 1:].contiguous()


def write_model(name, e2e, out_dir):
    folder = os.path.join(out_dir, name)
    os.makedirs(folder, exist_ok=True)
    gen = torch.Generator().manual_seed(4321)
    inputs, labels = batch(name, gen)
    if name == "gpt":
        torch.manual_seed(7)
        module, output_names, dynamic_axes = e2e.GPT(), ["logits"], {}
        with torch.no_grad():
            for pname, p in module.named_parameters():
                if ".ln" in pname or pname.startswith("ln_f"):
                    p.add_(0.1 * torch.randn(p.shape))
        initial_path = os.path.join(folder, "model.onnx")
        export(module, inputs, output_names, dynamic_axes, initial_path)
        onnx.checker.check_model(onnx.load(initial_path), full_check=True)
        graph = onnx.load(initial_path).graph
        floats = {i.name for i in graph.initializer if i.data_type == onnx.TensorProto.FLOAT}
        if any(n.op_type == "Identity" and n.input[0] in floats for n in graph.node):
            raise SystemExit("error: the GPT's ONNX export still merges float initializers (Identity nodes)")
    elif name == "bncnn":
        torch.manual_seed(11)
        module, output_names, dynamic_axes = BnCnn(), ["logits"], {}
        with torch.no_grad():  # running statistics other than PyTorch's initial zeros and ones
            for bn in (module.bn, module.bn1):
                bn.running_mean.copy_(0.1 * torch.randn(bn.running_mean.shape))
                bn.running_var.copy_(1 + 0.2 * torch.rand(bn.running_var.shape))
        initial_path = os.path.join(folder, "model.onnx")
        export(module, inputs, output_names, dynamic_axes, initial_path)
        ops = [n.op_type for n in onnx.load(initial_path).graph.node]
        if ops.count("BatchNormalization") != 2:
            raise SystemExit(f"error: the batch-norm CNN exports {ops}, not two BatchNormalization nodes")
    elif name == "encoder":
        torch.manual_seed(13)
        module, output_names, dynamic_axes = Encoder(), ["logits"], {}
        initial_path = os.path.join(folder, "model.onnx")
        export(module, inputs, output_names, dynamic_axes, initial_path)
        ops = [n.op_type for n in onnx.load(initial_path).graph.node]
        if ops.count("Identity") < 10:
            raise SystemExit(f"error: the encoder's export shares fewer parameters than expected: {ops.count('Identity')}")
    else:
        module, output_names, dynamic_axes = e2e_models(e2e)[name]
        initial_path = os.path.join(ROOT, "test", "e2e", name, "model.onnx")
        check_path = os.path.join(folder, "initial-check.onnx")
        export(module, inputs, output_names, dynamic_axes, check_path)
        same = same_initializers(initializers(check_path), initializers(initial_path))
        os.remove(check_path)
        if not same:
            raise SystemExit(f"error: test/e2e/{name}/model.onnx does not hold {name}'s initial weights; "
                             "re-run scripts/export-e2e-models.py")
    initial = initializers(initial_path)
    for input_name, value in inputs.items():
        np.save(os.path.join(folder, f"input_{input_name}.npy"), value.numpy())
    np.save(os.path.join(folder, "labels.npy"), labels.numpy())
    # The state dict holds the batch norms' running statistics and counters too.
    state = {k: v.clone() for k, v in module.state_dict().items()}
    summary = []
    for kind, lr in LEARNING_RATES[name].items():
        module.load_state_dict(state)
        module.train()
        optimizer, scheduler = make_optimizer(kind, module.parameters(), lr)
        losses = []
        for step in range(STEPS):
            optimizer.zero_grad()
            loss = loss_of(name, module, inputs, labels)
            loss.backward()
            optimizer.step()
            if scheduler:
                scheduler.step()
            losses.append(loss.item())
            if step == 0:
                step1_path = os.path.join(folder, f"{kind}-step1.onnx")
                export(module, inputs, output_names, dynamic_axes, step1_path)
                after = initializers(step1_path)
                if after.keys() != initial.keys():
                    raise SystemExit(f"error: {name}: the model after one step exports other initializers: "
                                     f"{sorted(after)} instead of {sorted(initial)}")
        np.save(os.path.join(folder, f"{kind}-losses.npy"), np.array(losses, dtype=np.float64))
        summary.append(f"{kind} lr {lr}: loss {losses[0]:.4f} -> {losses[-1]:.4f}")
    size = sum(os.path.getsize(os.path.join(folder, f)) for f in os.listdir(folder))
    print(f"{name}: {'; '.join(summary)}; {size / 1024:.0f} KiB")
    return size


def main():
    args = sys.argv[1:]
    out_dir = args.pop(0) if args else os.path.join(ROOT, "test", "training-match")
    names = args or list(LEARNING_RATES)  # the models to write: all by default
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    e2e = load_e2e_module()
    total = sum(write_model(name, e2e, out_dir) for name in names)
    print(f"total: {total / 1024:.0f} KiB")
    if total > 1536 * 1024:
        print("error: the training fixtures exceed 1.5 MB", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
