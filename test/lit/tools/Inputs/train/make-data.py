"""Writes the .npz (and .npy) fixtures of test/lit/tools/kiln-train.test
into the folder given as the only argument. Every array is drawn from a
fixed seed, so the files are the same on every run.

    make-data.py OUT_DIR
"""
import os
import sys

import numpy as np

out = sys.argv[1]
os.makedirs(out, exist_ok=True)
rng = np.random.default_rng(7)


def save(name, **arrays):
    np.savez(os.path.join(out, name), **arrays)


def separable(n):
    """Two classes on either side of x0 + x1 = 0, at least 0.5 away from it."""
    x = rng.uniform(-2, 2, size=(4 * n, 2)).astype(np.float32)
    x = x[np.abs(x.sum(axis=1)) > 0.5][:n]
    return x, (x.sum(axis=1) > 0).astype(np.int64)


x, y = separable(64)
save("sep.npz", x=x, y=y)
ex, ey = separable(32)
save("sep-eval.npz", x=ex, y=ey)
np.save(os.path.join(out, "sep-eval-x.npy"), ex)
np.save(os.path.join(out, "sep-eval-y.npy"), ey)

# The MLP of test/e2e/mlp (64 inputs, 10 classes): 100 samples, so that
# batches of 16 leave a last batch of 4.
mx = rng.standard_normal((100, 64)).astype(np.float32)
my = (mx @ rng.standard_normal((64, 10))).argmax(axis=1).astype(np.int64)
save("mlp.npz", x=mx, y=my)

# Bad data, one problem each.
open(os.path.join(out, "not-npz.npz"), "w").write("these are not the arrays you are looking for\n")
save("keys.npz", inputs=x, targets=y)
save("empty.npz", x=np.zeros((0, 2), np.float32), y=np.zeros((0,), np.int64))
save("lengths.npz", x=x[:10], y=y[:9])
save("shape.npz", x=np.zeros((10, 3), np.float32), y=y[:10])
save("rank.npz", x=np.zeros((10, 2, 1), np.float32), y=y[:10])
save("xint.npz", x=x[:10].astype(np.int64), y=y[:10])
save("yfloat.npz", x=x[:10], y=y[:10].astype(np.float32))
bad = y[:10].copy()
bad[6] = 2
save("range.npz", x=x[:10], y=bad)
neg = y[:10].copy()
neg[3] = -1
save("negative.npz", x=x[:10], y=neg)
nan = x[:10].copy()
nan[4, 1] = np.nan
save("nan.npz", x=nan, y=y[:10])
save("ylabels2d.npz", x=x[:10], y=y[:10].reshape(10, 1))
# Lossless and noted conversions: int32 labels, float64 inputs.
save("converted.npz", x=x.astype(np.float64), y=y.astype(np.int32))
# MSE: targets like the output ([N, 2] float), and a wrong shape.
save("mse.npz", x=x, y=np.stack([x.sum(axis=1), x[:, 0] - x[:, 1]], axis=1).astype(np.float32))
save("mse-shape.npz", x=x[:10], y=np.zeros((10, 3), np.float32))
# Inputs that make log.kir's x @ w negative: a NaN in the first step.
save("negative-inputs.npz", x=-np.abs(x[:8]) - 0.1, y=y[:8])
save("small.npz", x=x[:6], y=y[:6])
# Per-position classes for seq.kir (--classes-last): the quadrant of each
# position's 2-d point, learnable by a linear map.
sx = rng.uniform(-1, 1, size=(48, 3, 2)).astype(np.float32)
sx += np.sign(sx) * 0.2
sy = ((sx[..., 0] > 0).astype(np.int64) + 2 * (sx[..., 1] > 0)).astype(np.int64)
save("seq.npz", x=sx[:32], y=sy[:32])
save("seq-eval.npz", x=sx[32:], y=sy[32:])

# For the batch-norm CNN of test/training-match/bncnn (x [N, 1, 8, 8], 10
# classes): 32 samples, four batches of its fixed 8. Its own generator, so
# that the arrays above stay as they were.
bn_rng = np.random.default_rng(8)
save("bn.npz", x=bn_rng.standard_normal((32, 1, 8, 8)).astype(np.float32),
     y=bn_rng.integers(0, 10, 32).astype(np.int64))

# For the GPT of test/e2e/gpt-dynamic (idx [batch, 8] tokens below 64), whose
# shapes are computed from its dynamic batch: next-token labels, 40 samples,
# and samples of 9 tokens, which it does not take.
tok = bn_rng.integers(0, 64, (40, 9)).astype(np.int64)
save("tokens.npz", x=tok[:, :8], y=tok[:, 1:])
save("tokens9.npz", x=tok, y=tok)

# bn-momentum.kir: channel 0 holds 1, 2, 3, 6 (mean 3, unbiased variance
# 14/3), channel 1 holds 5, 7, 5, 7 (mean 6, unbiased variance 4/3).
save("bnm.npz", x=np.array([[1, 5], [2, 7], [3, 5], [6, 7]], dtype=np.float32), y=np.zeros((4, 2), np.float32))

# --ignore-index: the separable set with every fourth label -1 (16 of 64).
ign = y.copy()
ign[::4] = -1
save("ignore.npz", x=x, y=ign)
