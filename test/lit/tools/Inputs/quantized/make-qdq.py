"""Writes OUT/qdq.kir, a QDQ model (the ops Kiln's ONNX importer makes of an
ONNX Runtime quantize_static model: per-tensor activations, per-channel
symmetric int8 weights, int32 biases) of two convs (the first with a relu,
the second grouped and strided) and a matmul with a float bias, and
OUT/x.npy, a u8 input. Usage: make-qdq.py OUT."""
import os
import sys

import numpy as np

out = sys.argv[1]
os.makedirs(out, exist_ok=True)
rng = np.random.default_rng(5)


def dense(name, array, dtype):
    dims = ",".join(str(d) for d in array.shape)
    values = ", ".join(repr(float(v)) if dtype == "f32" else str(int(v)) for v in array.ravel())
    return f"  %{name} = constant() {{value = dense<{dtype}[{dims}]>[{values}]}} : {dtype}[{dims}]\n"


def weights(prefix, shape, axis, bias_scale):
    m = shape[axis]
    text = dense(prefix + "q", rng.integers(-127, 128, shape), "i8")
    scales = rng.uniform(0.002, 0.01, m).astype(np.float32)
    text += dense(prefix + "s", scales, "f32")
    text += dense(prefix + "z", np.zeros(m), "i8")
    dims = ",".join(str(d) for d in shape)
    text += f"  %{prefix}d = dequantize(%{prefix}q, %{prefix}s, %{prefix}z) {{axis = {axis}}} : f32[{dims}]\n"
    if bias_scale is not None:
        text += dense(prefix + "bq", rng.integers(-3000, 3000, m), "i32")
        text += dense(prefix + "bs", (scales * bias_scale).astype(np.float32), "f32")
        text += dense(prefix + "bz", np.zeros(()), "i32")
        text += f"  %{prefix}bd = dequantize(%{prefix}bq, %{prefix}bs, %{prefix}bz) {{axis = 0}} : f32[{m}]\n"
    return text


def qdq(name, value, dtype, scale, zero, shape):
    dims = ",".join(str(d) for d in shape)
    text = dense(name + "_s", np.array(scale, dtype=np.float32), "f32")
    text += dense(name + "_z", np.array(zero), dtype)
    text += f"  %{name} = quantize({value}, %{name}_s, %{name}_z) : {dtype}[{dims}]\n"
    text += f"  %{name}_d = dequantize(%{name}, %{name}_s, %{name}_z) : f32[{dims}]\n"
    return text


text = "func @qdq(%x: u8[2,8,10,10]) -> (\"y\": f32[2,16,10]) {\n"
text += dense("sx", np.array(0.05, dtype=np.float32), "f32") + dense("zx", np.array(131), "u8")
text += "  %xd = dequantize(%x, %sx, %zx) : f32[2,8,10,10]\n"
text += weights("w1", (16, 8, 3, 3), 0, 0.05)
text += "  %c1 = conv(%xd, %w1d, %w1bd) {pads = [1, 1, 1, 1]} : f32[2,16,10,10]\n"
text += "  %r1 = relu(%c1) : f32[2,16,10,10]\n"
text += qdq("a1", "%r1", "u8", 0.3, 0, (2, 16, 10, 10))
text += weights("w2", (16, 8, 3, 3), 0, 0.3)
text += "  %c2 = conv(%a1_d, %w2d, %w2bd) {strides = [2, 1], pads = [1, 1, 1, 1], groups = 2} : f32[2,16,5,10]\n"
text += qdq("a2", "%c2", "u8", 0.5, 120, (2, 16, 5, 10))
text += "  %t = reshape(%a2_d) : f32[2,16,50]\n"
text += weights("w3", (50, 10), 1, None)
text += "  %m = matmul(%t, %w3d) : f32[2,16,10]\n"
text += dense("b3", rng.uniform(-1, 1, 10).astype(np.float32), "f32")
text += "  %a = add(%m, %b3) : f32[2,16,10]\n"
text += qdq("a3", "%a", "u8", 0.25, 100, (2, 16, 10))
text += "  return %a3_d\n}\n"
with open(os.path.join(out, "qdq.kir"), "w") as f:
    f.write(text)
np.save(os.path.join(out, "x.npy"), rng.integers(0, 256, (2, 8, 10, 10)).astype(np.uint8))
