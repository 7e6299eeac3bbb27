#!/usr/bin/env bash
# Runs `kiln generate` greedily on the GPT of test/e2e/gpt-generate/
# (scripts/export-gpt-generate.py) and compares it with PyTorch's greedy
# decoding of the same model: the tokens exactly, and the logits each new
# token was chosen from within rtol 1e-4 (atol 1e-5). The tokens being equal,
# each step's logits are those of PyTorch's model on the same prefix, which
# is the teacher-forced comparison.
#
#   run-generate.sh KILN KILN_NPY_COMPARE MODEL_DIR MODEL_FILE OUT_DIR [KILN_GENERATE_OPTION]...
#
# MODEL_FILE is model.onnx (no cache) or model-kv.onnx (with its key/value
# cache); extra options go to `kiln generate` (e.g. --device cuda).
set -euo pipefail
if [[ $# -lt 5 ]]; then
  echo "usage: run-generate.sh KILN KILN_NPY_COMPARE MODEL_DIR MODEL_FILE OUT_DIR [KILN_GENERATE_OPTION]..." >&2
  exit 2
fi
kiln=$1 compare=$2 model_dir=$3 model=$4 out_dir=$5
shift 5

rm -rf "$out_dir"
mkdir -p "$out_dir"
"$kiln" generate "$model_dir/$model" --prompt "$model_dir/prompt.npy" --max-new-tokens 40 \
  --output "$out_dir/tokens.npy" --step-logits "$out_dir/step_logits.npy" "$@"
status=0
"$compare" "$out_dir/tokens.npy" "$model_dir/expected_tokens.npy" || status=1
"$compare" "$out_dir/step_logits.npy" "$model_dir/expected_step_logits.npy" --rtol 1e-4 --atol 1e-5 || status=1
exit $status
