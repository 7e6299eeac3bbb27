#!/usr/bin/env bash
# Compiles one end-to-end model's kernels to PTX with NVRTC and loads the
# PTX into Kiln's emulated GPU: every instruction and directive NVRTC emits
# for the model must be one the emulator implements (it refuses the others
# at load time, naming them). The architectures: sm_90, and sm_121, the
# newest NVRTC 13 has, which is what Kiln hands the emulated device (its
# compute capability 15.0 has no CUBIN) and which uses instructions sm_90
# PTX does not. NVRTC is required, as for run-e2e-nvrtc.sh.
#
#   run-emulator-load.sh KILN KILN_EMULATOR_LOAD EMULATOR MODEL_DIR OUT_DIR
set -euo pipefail
if [[ $# -ne 5 ]]; then
  echo "usage: run-emulator-load.sh KILN KILN_EMULATOR_LOAD EMULATOR MODEL_DIR OUT_DIR" >&2
  exit 2
fi
kiln=$1 loader=$2 emulator=$3 model_dir=$4 out=$5

. "$(dirname "$0")/model-inputs.sh"
model_inputs "$model_dir"
shapes=()
for i in "${!input_names[@]}"; do shapes+=(--input-shape "${input_names[$i]}=${input_shapes[$i]}"); done

mkdir -p "$out"
for arch in sm_90 sm_121; do
  "$kiln" compile "$model_dir/model.onnx" "${shapes[@]}" --device cuda --cuda-arch $arch --emit=ptx > "$out/model-$arch.ptx"
  "$loader" "$emulator" "$out/model-$arch.ptx"
done
