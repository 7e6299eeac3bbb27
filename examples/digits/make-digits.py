#!/usr/bin/env python3
"""The scikit-learn digits dataset as .npz files for `kiln train`, and the
tutorials' CNN adapted to its 1x8x8 images as ONNX.

    /usr/bin/python3 examples/digits/make-digits.py OUT_DIR
        writes OUT_DIR/train.npz and OUT_DIR/test.npz
    /usr/bin/python3 examples/digits/make-digits.py OUT_DIR --export-model
        also writes OUT_DIR/cnn.onnx (the committed examples/digits/cnn.onnx
        was made this way)
    /usr/bin/python3 examples/digits/make-digits.py OUT_DIR --check-torch
        also trains the same model from the same initial weights in PyTorch
        with the hyperparameters of train-digits.sh and prints its held-out
        accuracy and confusion matrix, the yardstick for Kiln's run

Data: sklearn.datasets.load_digits (1797 8x8 images of the digits 0-9 with
pixel values 0..16, shipped with scikit-learn, no download). x is float32
[N, 1, 8, 8] scaled to [0, 1] (divided by 16); y is int64 [N]. The held-out
split is stratified (each digit in the same proportion in both parts), 20%,
with a fixed seed: 1437 training and 360 test samples, the same every time.

Model: the CNN of the tutorials and scripts/export-e2e-models.py (conv,
relu, max-pool twice, then two Linear layers), sized for 1x8x8 inputs:
conv 1->16 3x3 pad 1, pool 2 (4x4), conv 16->32 3x3 pad 1, pool 2 (2x2),
Linear 128->64, relu, Linear 64->10, with PyTorch's default initialization
from seed 0. Exported by torch.onnx.export, opset 17, input "x" [batch, 1,
8, 8] with a dynamic batch axis, output "logits" [batch, 10].
"""
import argparse
import os
import sys

import numpy as np

SPLIT_SEED = 0
TEST_FRACTION = 0.2
MODEL_SEED = 0
OPSET = 17


def make_data():
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    x = (digits.images.astype(np.float32) / np.float32(16.0)).reshape(-1, 1, 8, 8)
    y = digits.target.astype(np.int64)
    x_train, x_test, y_train, y_test = train_test_split(
        x, y, test_size=TEST_FRACTION, random_state=SPLIT_SEED, stratify=y)
    return (np.ascontiguousarray(x_train), y_train), (np.ascontiguousarray(x_test), y_test)


def make_model():
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    class DigitsCNN(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv2d(in_channels=1, out_channels=16, kernel_size=3, stride=1, padding=1)
            self.pool1 = nn.MaxPool2d(kernel_size=2, stride=2)
            self.conv2 = nn.Conv2d(in_channels=16, out_channels=32, kernel_size=3, stride=1, padding=1)
            self.pool2 = nn.MaxPool2d(kernel_size=2, stride=2)
            self.fc1 = nn.Linear(in_features=32 * 2 * 2, out_features=64)
            self.fc2 = nn.Linear(in_features=64, out_features=10)

        def forward(self, x):
            x = self.pool1(F.relu(self.conv1(x)))
            x = self.pool2(F.relu(self.conv2(x)))
            x = x.reshape(-1, 32 * 2 * 2)
            x = F.relu(self.fc1(x))
            return self.fc2(x)

    torch.manual_seed(MODEL_SEED)
    return DigitsCNN()


def export_model(model, path):
    import torch

    model.eval()
    torch.onnx.export(model, (torch.zeros(2, 1, 8, 8),), path, input_names=["x"], output_names=["logits"],
                      dynamic_axes={"x": {0: "batch"}, "logits": {0: "batch"}}, opset_version=OPSET,
                      do_constant_folding=True)


def load_onnx_weights(model, path):
    """Sets the PyTorch model's parameters to the initializers of the ONNX
    file, so that --check-torch starts from exactly the weights Kiln does."""
    import onnx
    import torch
    from onnx import numpy_helper

    weights = {init.name: numpy_helper.to_array(init) for init in onnx.load(path).graph.initializer}
    state = model.state_dict()
    missing = [name for name in state if name not in weights]
    if missing:
        sys.exit(f"make-digits: {path} has no initializers named {missing}")
    model.load_state_dict({name: torch.from_numpy(weights[name].copy()) for name in state})


def confusion(y_true, y_pred):
    m = np.zeros((10, 10), dtype=np.int64)
    np.add.at(m, (y_true, y_pred), 1)
    return m


def check_torch(model, train, test, args):
    """Trains `model` as train-digits.sh has Kiln train it (cross-entropy,
    SGD with momentum, shuffled batches, the last partial batch kept) and
    prints the held-out accuracy and confusion matrix."""
    import torch
    import torch.nn.functional as F

    torch.manual_seed(args.seed)
    x, y = torch.from_numpy(train[0]), torch.from_numpy(train[1])
    if args.optimizer == "sgd":
        opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    else:
        opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    model.train()
    for epoch in range(args.epochs):
        order = torch.randperm(len(x))
        total = 0.0
        for start in range(0, len(x), args.batch_size):
            idx = order[start:start + args.batch_size]
            loss = F.cross_entropy(model(x[idx]), y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
            total += loss.item() * len(idx)
        print(f"torch: epoch {epoch + 1} loss {total / len(x):.4f}")
    model.eval()
    with torch.no_grad():
        logits = model(torch.from_numpy(test[0]))
        loss = F.cross_entropy(logits, torch.from_numpy(test[1])).item()
        pred = logits.argmax(1).numpy()
    accuracy = float((pred == test[1]).mean())
    print(f"torch: test loss {loss:.4f} accuracy {accuracy:.4f} ({int((pred == test[1]).sum())}/{len(pred)})")
    print(confusion(test[1], pred))
    return accuracy


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out_dir")
    parser.add_argument("--export-model", action="store_true", help="write OUT_DIR/cnn.onnx")
    parser.add_argument("--check-torch", action="store_true", help="train the model in PyTorch, print its accuracy")
    parser.add_argument("--model", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "cnn.onnx"),
                        help="initial weights for --check-torch (default: the committed cnn.onnx)")
    parser.add_argument("--optimizer", choices=["sgd", "adam"], default="sgd")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--momentum", type=float, default=0.9)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    os.makedirs(args.out_dir, exist_ok=True)
    train, test = make_data()
    np.savez(os.path.join(args.out_dir, "train.npz"), x=train[0], y=train[1])
    np.savez(os.path.join(args.out_dir, "test.npz"), x=test[0], y=test[1])
    print(f"make-digits: {args.out_dir}/train.npz ({len(train[1])} samples), "
          f"{args.out_dir}/test.npz ({len(test[1])} samples), x float32 [N,1,8,8] in [0,1], y int64 in 0..9")
    if args.export_model:
        path = os.path.join(args.out_dir, "cnn.onnx")
        export_model(make_model(), path)
        print(f"make-digits: {path}")
    if args.check_torch:
        model = make_model()
        load_onnx_weights(model, args.model)
        check_torch(model, train, test, args)


if __name__ == "__main__":
    main()
