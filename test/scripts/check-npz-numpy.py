#!/usr/bin/env python3
"""Checks with numpy.load (and zipfile's own CRC check) the archives that
kiln-npz-sample (test/tools/NpzSample.cpp) wrote with runtime/Npz.

    check-npz-numpy.py DIR    (DIR holds plain.npz and zip64.npz)
"""
import os
import sys
import zipfile

import numpy as np

EXPECTED = {
    "f32": np.arange(6, dtype=np.float32).reshape(2, 3) * np.float32(0.5) - np.float32(1),
    "i64": (np.arange(4, dtype=np.int64) - 1) << 40,
    "u8": np.array([0, 128, 255], dtype=np.uint8),
    "b": np.array([True, False, True]),
    "f16": np.array([65504, -2.5], dtype=np.float16),
    "s": np.array(0.125, dtype=np.float64),
    "e": np.zeros((0, 5), dtype=np.int32),
}


def check(path):
    with zipfile.ZipFile(path) as z:
        bad = z.testzip()  # reads every member, checking its CRC-32
        if bad is not None:
            sys.exit(f"{path}: member {bad} fails zipfile's CRC check")
        if any(i.compress_type != zipfile.ZIP_STORED for i in z.infolist()):
            sys.exit(f"{path}: expected stored (uncompressed) members")
    with np.load(path) as npz:
        if npz.files != list(EXPECTED):
            sys.exit(f"{path}: arrays {npz.files}, expected {list(EXPECTED)} in this order")
        for name, want in EXPECTED.items():
            got = npz[name]
            if got.dtype != want.dtype or got.shape != want.shape or not np.array_equal(got, want):
                sys.exit(f"{path}: array {name} is {got.dtype}{list(got.shape)} {got!r}, "
                         f"expected {want.dtype}{list(want.shape)} {want!r}")
    print(f"{path}: {len(EXPECTED)} arrays as expected")


for name in ("plain.npz", "zip64.npz"):
    check(os.path.join(sys.argv[1], name))
