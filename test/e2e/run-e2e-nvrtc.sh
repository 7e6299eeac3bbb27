#!/usr/bin/env bash
# Compiles one end-to-end model's kernels for CUDA with NVRTC, which needs
# no GPU: `kiln compile model.onnx --device cuda --cuda-arch sm_90
# --emit=cubin-size`, with each input's shape taken from its input_<name>.npy.
# Fails when any kernel fails to compile, when the CUBIN lacks a kernel, and
# when NVRTC cannot be loaded (kiln names the library and the paths tried):
# CI machines have the CUDA toolkit, so a missing NVRTC is a failure, not a
# skip. The kernels are not run (that needs a GPU).
#
#   run-e2e-nvrtc.sh KILN MODEL_DIR [ARCH]
set -euo pipefail
if [[ $# -lt 2 || $# -gt 3 ]]; then
  echo "usage: run-e2e-nvrtc.sh KILN MODEL_DIR [ARCH]" >&2
  exit 2
fi
kiln=$1 model_dir=$2 arch=${3:-sm_90}

. "$(dirname "$0")/model-inputs.sh"
model_inputs "$model_dir"
shapes=()
for i in "${!input_names[@]}"; do shapes+=(--input-shape "${input_names[$i]}=${input_shapes[$i]}"); done

summary=$("$kiln" compile "$model_dir/model.onnx" "${shapes[@]}" --device cuda --cuda-arch "$arch" --emit=cubin-size)
echo "$summary"
# "compiled N kernels of 'F' with NVRTC V for sm_90: CUBIN B bytes, PTX P bytes", B above 0. N is 0
# for a model whose every op is a cuBLASLt call with its epilogue (the MLP).
if ! [[ $summary =~ ^compiled\ [0-9]+\ kernels\ .*\ for\ $arch:\ CUBIN\ [1-9][0-9]*\ bytes ]]; then
  echo "run-e2e-nvrtc.sh: unexpected summary from kiln compile: $summary" >&2
  exit 1
fi
