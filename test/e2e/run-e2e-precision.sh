#!/usr/bin/env bash
# An end-to-end model in a reduced precision (docs/precision.md): run with
# --precision P on the interpreter (the reference: the same casts) and on a
# backend (the CPU JIT with --no-fallback, or --device cuda), then
#  - the backend's outputs against the interpreter's: the same roundings, so
#    within REF_RTOL (f32 sums in another order);
#  - both against PyTorch's f32 outputs (expected_*.npy): within L2 of the
#    precision's rounding, relative error at most REL_L2.
#
#   run-e2e-precision.sh KILN KILN_NPY_COMPARE MODEL_DIR OUT_DIR PRECISION REL_L2 [KILN_RUN_OPTION]...
set -euo pipefail
if [[ $# -lt 6 ]]; then
  echo "usage: run-e2e-precision.sh KILN KILN_NPY_COMPARE MODEL_DIR OUT_DIR PRECISION REL_L2 [KILN_RUN_OPTION]..." >&2
  exit 2
fi
kiln=$1 compare=$2 model_dir=$3 out_dir=$4 precision=$5 rel_l2=$6
shift 6
ref_rtol=2e-3

inputs=()
for f in "$model_dir"/input_*.npy; do
  name=$(basename "$f" .npy)
  inputs+=(--input "${name#input_}=$f")
done

rm -rf "$out_dir"
"$kiln" run "$model_dir/model.onnx" "${inputs[@]}" --precision "$precision" --interpret --output-dir "$out_dir/interpret"
"$kiln" run "$model_dir/model.onnx" "${inputs[@]}" --precision "$precision" --output-dir "$out_dir/backend" "$@"

status=0
found=0
for f in "$model_dir"/expected_*.npy; do
  name=$(basename "$f" .npy)
  name=${name#expected_}
  found=1
  "$compare" "$out_dir/backend/$name.npy" "$out_dir/interpret/$name.npy" --rtol "$ref_rtol" --atol "$ref_rtol" || status=1
  "$compare" "$out_dir/interpret/$name.npy" "$f" --rel-l2 "$rel_l2" || status=1
  "$compare" "$out_dir/backend/$name.npy" "$f" --rel-l2 "$rel_l2" || status=1
done
if [[ $found -eq 0 ]]; then
  echo "run-e2e-precision.sh: error: no expected_*.npy in $model_dir" >&2
  exit 1
fi
exit $status
