"""Prints the accuracy of the logits `kiln run` wrote against the labels.

    accuracy.py LOGITS.npy LABELS.npy
"""
import sys

import numpy as np

logits, labels = np.load(sys.argv[1]), np.load(sys.argv[2])
print(f"accuracy {np.mean(logits.argmax(axis=1) == labels):.4f}")
