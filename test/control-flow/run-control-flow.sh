#!/usr/bin/env bash
# A PyTorch model with a `for` loop and an `if` (export_model.py: scripted
# with torch.jit.script, exported to ONNX Loop and If) compiled to a .kc and
# run from it, against PyTorch's outputs on three input sets (both branches,
# the else branch alone, no iteration):
#
#   - `kiln run model.onnx` (the JIT, compiling each part as it runs);
#   - `kiln compile model.onnx -o model.kc` (one program with host steps,
#     runtime/Program.h StagedProgram), then `kiln run model.kc
#     --time-passes`, whose report must show nothing compiled at load: no
#     graph passes, no lowering, no LLVM module;
#   - kiln-embed-run on the .kc (runtime/Kiln.h, no compiler linked),
#     against the interpreter on the .kc's stored module and PyTorch.
#
# With --device cuda the same on CUDA (KILN_CUDA_DRIVER: the emulated GPU),
# the .kc compiled for sm_80 and sm_90.
#
#   run-control-flow.sh KILN KILN_NPY_COMPARE KILN_EMBED_RUN OUT_DIR [--device cuda]
set -euo pipefail
if [[ $# -lt 4 ]]; then
  echo "usage: run-control-flow.sh KILN KILN_NPY_COMPARE KILN_EMBED_RUN OUT_DIR [--device cuda]" >&2
  exit 2
fi
kiln=$1 compare=$2 embed=$3 out_dir=$4
shift 4
device=()
compile_device=()
if [[ $# -gt 0 ]]; then
  [[ "$*" == "--device cuda" ]] || { echo "run-control-flow.sh: unknown options: $*" >&2; exit 2; }
  device=(--device cuda)
  compile_device=(--device cuda --cuda-arch sm_80,sm_90)
fi

rm -rf "$out_dir"
mkdir -p "$out_dir"
/usr/bin/python3 "$(dirname "$0")/export_model.py" "$out_dir" 2>"$out_dir/export.log" ||
  { cat "$out_dir/export.log" >&2; exit 1; }
model=$out_dir/model.onnx
"$kiln" compile "$model" "${compile_device[@]}" -o "$out_dir/model.kc"

status=0
for set in a b c; do
  in=$out_dir/$set
  inputs=(--input "x=$in/input_x.npy" --input "n=$in/input_n.npy")
  "$kiln" run "$model" "${inputs[@]}" "${device[@]}" --no-fallback --output-dir "$in/jit"
  "$compare" "$in/jit/y.npy" "$in/expected_y.npy" --rtol 1e-4 --atol 1e-5 || status=1
  "$kiln" run "$out_dir/model.kc" "${inputs[@]}" "${device[@]}" --no-fallback --output-dir "$in/kc" \
    --time-passes 2>"$in/time-passes.txt"
  "$compare" "$in/kc/y.npy" "$in/expected_y.npy" --rtol 1e-4 --atol 1e-5 || status=1
  # Nothing compiled at load: the stored parts are only loaded.
  for line in ' 0 LLVM modules compiled' '0\.0000 (  0\.0%)  graph passes' '0\.0000 (  0\.0%)  lowering to kernel IR' \
              '0\.0000 (  0\.0%)  LLVM'; do
    if ! grep -q "$line" "$in/time-passes.txt"; then
      echo "run-control-flow.sh: kiln run model.kc --time-passes does not show '$line':" >&2
      cat "$in/time-passes.txt" >&2
      status=1
    fi
  done
  "$embed" "$out_dir/model.kc" "x=$in/input_x.npy" "n=$in/input_n.npy" --expect "y=$in/expected_y.npy" || status=1
done
exit $status
