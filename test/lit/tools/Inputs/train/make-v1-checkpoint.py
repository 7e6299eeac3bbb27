"""Rewrites a kiln train checkpoint as format 1 wrote it (kiln.train_state
[1, ...] and no kiln.train_options), for the --resume test.

    make-v1-checkpoint.py IN.npz OUT.npz
"""
import sys

import numpy as np

src = np.load(sys.argv[1])
arrays = {k: src[k] for k in src.files if k != "kiln.train_options"}
state = arrays["kiln.train_state"].copy()
state[0] = 1
arrays["kiln.train_state"] = state
np.savez(sys.argv[2], **arrays)
