# Sourced by the scripts that run an end-to-end model folder
# (test/e2e/<model>/): its inputs and their shapes, read without NumPy.

# npy_shape FILE: the shape in FILE's .npy header, as 2x8 (or "scalar").
npy_shape() {
  python3 - "$1" <<'PY'
import ast, struct, sys
data = open(sys.argv[1], "rb").read(4096)
major = data[6]
size, start = (struct.unpack_from("<H", data, 8)[0], 10) if major == 1 else (struct.unpack_from("<I", data, 8)[0], 12)
shape = ast.literal_eval(data[start:start + size].decode("latin1"))["shape"]
print("x".join(str(d) for d in shape) if shape else "scalar")
PY
}

# model_inputs DIR: fills input_names, input_files and input_shapes with
# each DIR/input_<name>.npy's name, path and shape, in file order.
model_inputs() {
  input_names=() input_files=() input_shapes=()
  local f name
  for f in "$1"/input_*.npy; do
    name=$(basename "$f" .npy)
    input_names+=("${name#input_}")
    input_files+=("$f")
    input_shapes+=("$(npy_shape "$f")")
  done
}
