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

. "$(dirname "$0")/model-inputs.sh"
model_inputs "$model_dir"
inputs=()
shapes=()
for i in "${!input_names[@]}"; do
  inputs+=(--input "${input_names[$i]}=${input_files[$i]}")
  shapes+=(--input-shape "${input_names[$i]}=${input_shapes[$i]}")
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
