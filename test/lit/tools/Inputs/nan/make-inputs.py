"""Writes the inputs of the special-value tests into the folder argv[1]:
random x, w and b for conv-relu*.kir and matmul-relu.kir, x with one NaN and
one +inf and -inf (conv: pixel (5, 6) of channel 2 is NaN; matmul: x[2, 7] is
NaN, x[4, 0] is -inf), and the CNN's e2e input with pixel (3, 5) of the
first image NaN."""
import os
import sys

import numpy as np

out = sys.argv[1]
cnn_input = sys.argv[2]
os.makedirs(out, exist_ok=True)
rng = np.random.default_rng(25)
x = rng.uniform(-1, 1, (1, 8, 12, 12)).astype(np.float32)
x[0, 2, 5, 6] = np.nan
x[0, 4, 0, 11] = np.inf
np.save(os.path.join(out, "conv_x.npy"), x)
np.save(os.path.join(out, "conv_w.npy"), rng.uniform(-0.5, 0.5, (16, 8, 3, 3)).astype(np.float32))
np.save(os.path.join(out, "conv_b.npy"), rng.uniform(-0.5, 0.5, (16,)).astype(np.float32))
x = rng.uniform(-1, 1, (6, 64)).astype(np.float32)
x[2, 7] = np.nan
x[4, 0] = -np.inf
np.save(os.path.join(out, "mm_x.npy"), x)
np.save(os.path.join(out, "mm_w.npy"), rng.uniform(-0.5, 0.5, (64, 32)).astype(np.float32))
np.save(os.path.join(out, "mm_b.npy"), rng.uniform(-0.5, 0.5, (32,)).astype(np.float32))
image = np.load(cnn_input)
image[0, 0, 3, 5] = np.nan
np.save(os.path.join(out, "cnn_x.npy"), image)
