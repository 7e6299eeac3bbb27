#!/usr/bin/env bash
# Runs one end-to-end model (test/e2e/<model>/) as a compiled artifact:
# `kiln compile model.onnx -o OUT_DIR/model.kc`, with each input's shape
# taken from its input_<name>.npy, then `kiln run OUT_DIR/model.kc` on the
# same inputs, and compares every output with PyTorch's (rtol 1e-4, atol
# 1e-5), like run-e2e.sh does for the model itself.
#
#   run-e2e-kc.sh KILN KILN_NPY_COMPARE MODEL_DIR OUT_DIR
set -euo pipefail
if [[ $# -ne 4 ]]; then
  echo "usage: run-e2e-kc.sh KILN KILN_NPY_COMPARE MODEL_DIR OUT_DIR" >&2
  exit 2
fi
kiln=$1 compare=$2 model_dir=$3 out_dir=$4

# The shape in a .npy header, as 2x8 (or "scalar"), without NumPy.
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

inputs=()
shapes=()
for f in "$model_dir"/input_*.npy; do
  name=$(basename "$f" .npy)
  inputs+=(--input "${name#input_}=$f")
  shapes+=(--input-shape "${name#input_}=$(npy_shape "$f")")
done

rm -rf "$out_dir"
mkdir -p "$out_dir"
"$kiln" compile "$model_dir/model.onnx" "${shapes[@]}" -o "$out_dir/model.kc"
"$kiln" run "$out_dir/model.kc" "${inputs[@]}" --output-dir "$out_dir" --no-fallback

status=0
for f in "$model_dir"/expected_*.npy; do
  name=$(basename "$f" .npy)
  "$compare" "$out_dir/${name#expected_}.npy" "$f" --rtol 1e-4 --atol 1e-5 || status=1
done
exit $status
