#!/usr/bin/env bash
# Compiles an end-to-end model (test/e2e/<model>/) to a .kc with `kiln
# compile` (input shapes from its input_*.npy), then runs the .kc with
# kiln-embed-run, the program that embeds Kiln through runtime/Kiln.h
# alone, against the interpreter and PyTorch's expected outputs.
#
#   run-embed.sh KILN KILN_EMBED_RUN MODEL_DIR OUT_DIR
set -euo pipefail
if [[ $# -ne 4 ]]; then
  echo "usage: run-embed.sh KILN KILN_EMBED_RUN MODEL_DIR OUT_DIR" >&2
  exit 2
fi
kiln=$1 embed=$2 model_dir=$3 out_dir=$4

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
  inputs+=("${name#input_}=$f")
  shapes+=(--input-shape "${name#input_}=$(npy_shape "$f")")
done
expects=()
for f in "$model_dir"/expected_*.npy; do
  name=$(basename "$f" .npy)
  expects+=(--expect "${name#expected_}=$f")
done

rm -rf "$out_dir"
mkdir -p "$out_dir"
"$kiln" compile "$model_dir/model.onnx" "${shapes[@]}" -o "$out_dir/model.kc"
"$embed" "$out_dir/model.kc" "${inputs[@]}" "${expects[@]}"
