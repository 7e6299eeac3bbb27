#!/usr/bin/env bash
# Runs one end-to-end model (test/e2e/<model>/, written by
# scripts/export-e2e-models.py) through `kiln run` and compares every output
# with PyTorch's, rtol 1e-4 and atol 1e-5.
#
#   run-e2e.sh KILN KILN_NPY_COMPARE MODEL_DIR OUT_DIR [KILN_RUN_OPTION]...
#
# Extra options go to `kiln run` (e.g. --interpret, or --no-fallback to
# require that the CPU JIT compiles the whole model).
# Each input_<name>.npy binds the graph input <name>; each
# expected_<name>.npy is compared with OUT_DIR/<name>.npy.
set -euo pipefail
if [[ $# -lt 4 ]]; then
  echo "usage: run-e2e.sh KILN KILN_NPY_COMPARE MODEL_DIR OUT_DIR [KILN_RUN_OPTION]..." >&2
  exit 2
fi
kiln=$1 compare=$2 model_dir=$3 out_dir=$4
shift 4

inputs=()
for f in "$model_dir"/input_*.npy; do
  name=$(basename "$f" .npy)
  inputs+=(--input "${name#input_}=$f")
done

rm -rf "$out_dir"
"$kiln" run "$model_dir/model.onnx" "${inputs[@]}" --output-dir "$out_dir" "$@"

status=0
found=0
for f in "$model_dir"/expected_*.npy; do
  name=$(basename "$f" .npy)
  found=1
  "$compare" "$out_dir/${name#expected_}.npy" "$f" --rtol 1e-4 --atol 1e-5 || status=1
done
if [[ $found -eq 0 ]]; then
  echo "run-e2e.sh: error: no expected_*.npy in $model_dir" >&2
  exit 1
fi
exit $status
