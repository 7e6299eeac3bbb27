"""Prints how many elements of each .npy file given are NaN, +inf, -inf and
finite, per leading index when --rows: what the special-value tests check."""
import sys

import numpy as np

rows = "--rows" in sys.argv
for path in [a for a in sys.argv[1:] if a != "--rows"]:
    a = np.load(path)
    parts = [a[i] for i in range(a.shape[0])] if rows else [a]
    for i, p in enumerate(parts):
        label = f"{i}: " if rows else ""
        print(f"{label}nan {int(np.isnan(p).sum())} +inf {int(np.isposinf(p).sum())} "
              f"-inf {int(np.isneginf(p).sum())} finite {int(np.isfinite(p).sum())}")
