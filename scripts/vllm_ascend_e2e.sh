#!/usr/bin/env bash
# NPU node: plugin off vs on, eager, PIECEWISE, FULL_DECODE_ONLY and FULL_AND_PIECEWISE (each mode given
# to vLLM explicitly). NOT RUN YET; see docs/vllm-ascend.md. Any run that routed nothing fails.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/lib/python.sh
need_module torch_npu "run on an NPU node with CANN and the matching torch-npu (docs/vllm-ascend.md)"
need_module vllm_ascend "install vLLM Ascend first (docs/vllm-ascend.md)"
model="${1:-Qwen/Qwen2.5-0.5B-Instruct}"
"$PYTHON" -c "import torch_npu, vllm_ascend, ascend_ops; print('ascend op:', ascend_ops.runtime_unavailable() or 'ready')"
status=0
for mode in eager PIECEWISE FULL_DECODE_ONLY FULL_AND_PIECEWISE; do
  "$PYTHON" scripts/vllm_ascend_e2e.py --model "$model" --graph-mode "$mode" \
    --out "reports/vllm-ascend-e2e-$mode.json" || status=1
done
exit $status
