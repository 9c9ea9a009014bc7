#!/usr/bin/env bash
# NPU node: stock vLLM Ascend (FIA; paged attention in FULL_DECODE_ONLY) vs the splitkv plugin, in eager,
# PIECEWISE, FULL_DECODE_ONLY and FULL_AND_PIECEWISE (each mode given to vLLM explicitly), then the
# sliding-window check. NOT RUN YET; see docs/vllm-ascend.md. Any run that routed nothing, or whose graph
# replays do not match its uniform-decode steps, fails.
#   scripts/vllm_ascend_e2e.sh [model]         SPLITKV_E2E_TP=2 for tensor parallelism,
#   SPLITKV_E2E_SPEC='{"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 4}' for speculative decoding.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/lib/python.sh
need_module torch_npu "run on an NPU node with CANN and the matching torch-npu (docs/vllm-ascend.md)"
need_module vllm_ascend "install vLLM Ascend first (docs/vllm-ascend.md)"
model="${1:-Qwen/Qwen2.5-0.5B-Instruct}"
tp="${SPLITKV_E2E_TP:-1}"
spec="${SPLITKV_E2E_SPEC:-}"
"$PYTHON" -c "import torch_npu, vllm_ascend, ascend_ops; print('ascend op:', ascend_ops.runtime_unavailable() or 'ready')"
status=0
for mode in eager PIECEWISE FULL_DECODE_ONLY FULL_AND_PIECEWISE; do
  baselines=fia
  [[ $mode == FULL_DECODE_ONLY ]] && baselines=fia,pa
  "$PYTHON" scripts/vllm_ascend_e2e.py --model "$model" --graph-mode "$mode" --baselines "$baselines" \
    --tp "$tp" --speculative-config "$spec" --batch-sizes 1,16,64,256 \
    --out "reports/vllm-ascend-e2e-$mode-tp$tp${spec:+-spec}.json" || status=1
done
"$PYTHON" -m splitkv_vllm.window_check --out reports/vllm-ascend-window.json || status=1
exit $status
