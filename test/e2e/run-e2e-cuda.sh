#!/usr/bin/env bash
# Runs one end-to-end model on CUDA — on the emulated GPU in CI
# (test/devices/emulator/, chosen by KILN_CUDA_DRIVER; scripts/gpu-check
# does the same on a real GPU) — and compares every output with PyTorch's (rtol 1e-4,
# atol 1e-5) and with the reference interpreter's. Then it compiles the
# model into a .kc for sm_80 and sm_90 (CUBINs and PTX for sm_80, no GPU
# needed) and runs that file on the device too, comparing again.
#
#   run-e2e-cuda.sh KILN KILN_NPY_COMPARE MODEL_DIR OUT_DIR [KILN_RUN_OPTION]...
set -euo pipefail
if [[ $# -lt 4 ]]; then
  echo "usage: run-e2e-cuda.sh KILN KILN_NPY_COMPARE MODEL_DIR OUT_DIR [KILN_RUN_OPTION]..." >&2
  exit 2
fi
kiln=$1 compare=$2 model_dir=$3 out_dir=$4
shift 4

. "$(dirname "$0")/model-inputs.sh"
model_inputs "$model_dir"
inputs=() shapes=()
for i in "${!input_names[@]}"; do
  inputs+=(--input "${input_names[$i]}=$model_dir/input_${input_names[$i]}.npy")
  shapes+=(--input-shape "${input_names[$i]}=${input_shapes[$i]}")
done

rm -rf "$out_dir"
mkdir -p "$out_dir"
"$kiln" run "$model_dir/model.onnx" "${inputs[@]}" --output-dir "$out_dir/cuda" --device cuda "$@"
"$kiln" run "$model_dir/model.onnx" "${inputs[@]}" --output-dir "$out_dir/interpret" --interpret
"$kiln" compile "$model_dir/model.onnx" "${shapes[@]}" --device cuda --cuda-arch sm_80,sm_90 -o "$out_dir/model.kc"
"$kiln" run "$out_dir/model.kc" "${inputs[@]}" --output-dir "$out_dir/kc" "$@"

status=0 found=0
for f in "$model_dir"/expected_*.npy; do
  name=$(basename "$f" .npy)
  name=${name#expected_}
  found=1
  for run in cuda kc; do
    "$compare" "$out_dir/$run/$name.npy" "$f" --rtol 1e-4 --atol 1e-5 || status=1
    "$compare" "$out_dir/$run/$name.npy" "$out_dir/interpret/$name.npy" --rtol 1e-4 --atol 1e-5 || status=1
  done
done
if [[ $found -eq 0 ]]; then
  echo "run-e2e-cuda.sh: error: no expected_*.npy in $model_dir" >&2
  exit 1
fi
exit $status
