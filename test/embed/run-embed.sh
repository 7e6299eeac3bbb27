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

. "$(dirname "$0")/../e2e/model-inputs.sh"
model_inputs "$model_dir"
inputs=()
shapes=()
for i in "${!input_names[@]}"; do
  inputs+=("${input_names[$i]}=${input_files[$i]}")
  shapes+=(--input-shape "${input_names[$i]}=${input_shapes[$i]}")
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
