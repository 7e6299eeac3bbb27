#!/usr/bin/env python3
"""Writes the .npz fixtures of test/unit/NpzTest.cpp with NumPy (1.24 made
the committed ones): run it in this folder with /usr/bin/python3. The
arrays hold small, exactly representable values the test asserts."""
import io
import zipfile

import numpy as np


def arrays():
    return {
        "f32": np.arange(6, dtype=np.float32).reshape(2, 3) * 0.5 - 1,  # -1.0 .. 1.5
        "f64": np.array([1e300, -2.5, 0.0], dtype=np.float64),
        "i64": np.array([[-3], [7], [1 << 40]], dtype=np.int64),
        "i32": np.array([-2147483648, 2147483647], dtype=np.int32),
        "u8": np.array([0, 255, 17], dtype=np.uint8),
        "b": np.array([True, False, True, True]),
        "f16": np.array([65504.0, -0.0], dtype=np.float16),
        "scalar": np.array(42.0, dtype=np.float32),  # 0-d
        "empty": np.zeros((0, 4), dtype=np.float32),
    }


np.savez("stored.npz", **arrays())
np.savez_compressed("compressed.npz", **arrays())
# Positional arrays get NumPy's names arr_0, arr_1.
np.savez("positional.npz", np.array([1, 2], dtype=np.int64), np.array([3.0], dtype=np.float32))
np.savez("empty-archive.npz")


class Unseekable(io.RawIOBase):
    """A file NumPy cannot seek in, like a pipe: zipfile then writes each
    member's sizes and CRC in a data descriptor after its data (flag bit 3)
    and leaves them zero in the local header."""

    def __init__(self, f):
        self.f = f

    def writable(self):
        return True

    def write(self, b):
        return self.f.write(b)


with open("streamed.npz", "wb") as f:
    np.savez_compressed(Unseekable(f), a=np.arange(3, dtype=np.int16), b=np.ones((2, 2), dtype=np.float32))
# Zip64 records on small arrays: Python's zipfile writes them past
# ZIP64_LIMIT (2 GiB - 1), so lowering the limit makes NumPy write a zip64
# extra field in every central directory entry and the zip64 end records,
# as it does for large arrays.
zipfile.ZIP64_LIMIT = 8
np.savez_compressed("zip64.npz", a=np.arange(5, dtype=np.int32), b=np.array([[1.5]], dtype=np.float64))
