#!/usr/bin/env bash
# Parity on an Ascend NPU node: the Ascend C operator (`ascend`), plain PyTorch on the NPU
# (`torch-npu`) and the NumPy reference (`numpy`) on the case catalog, each judged against the
# float64 reference. Writes reports/npu-parity.md and reports/npu-parity.json (docs/npu.md).
#
#   source <CANN>/set_env.sh && scripts/build_ascend.sh     # once
#   scripts/npu_parity.sh [--cases PATTERN] [--size small|full|all] [--profile 910b2|910b3|...]
#                         [--allow-unavailable] [extra `splitkv parity` arguments]
#
# Without --allow-unavailable it stops (exit 2) when `ascend` or `torch-npu` cannot run here, so a
# report never looks green because the NPU backends were skipped. Exit 1: a case failed.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/lib/python.sh

cases=""
size="small"
allow_unavailable=0
extra=()
while [[ $# -gt 0 ]]; do
    case "$1" in
        --cases) cases="$2"; shift 2 ;;
        --size) size="$2"; shift 2 ;;
        --profile) export SPLITKV_ASCEND_PROFILE="$2"; shift 2 ;;
        --allow-unavailable) allow_unavailable=1; shift ;;
        *) extra+=("$1"); shift ;;
    esac
done

need_module splitkv_common "install this package (scripts/setup_env.sh, or pip install -e '.[npu]' on a node)"
if [[ "$allow_unavailable" == 0 ]]; then
    need_module torch "install torch and the torch-npu wheel matching it and CANN (docs/npu.md)"
    if ! "$PYTHON" - <<'PY'
import sys
from ascend_ops.npu_backend import ascend_backend, torch_npu_backend
missing = [(b.name, b.unavailable()) for b in (torch_npu_backend, ascend_backend)]
missing = [(n, why) for n, why in missing if why]
for n, why in missing:
    print(f"error: backend {n} cannot run here: {why}", file=sys.stderr)
sys.exit(2 if missing else 0)
PY
    then
        echo "error: run on an NPU node after scripts/build_ascend.sh, or pass --allow-unavailable" >&2
        exit 2
    fi
fi

mkdir -p reports
args=(parity --backend torch-npu --backend ascend --backend numpy --size "$size"
      --report reports/npu-parity.md --report reports/npu-parity.json)
if [[ -n "$cases" ]]; then
    args+=(--cases "$cases")
fi
exec "$PYTHON" -m splitkv_common.cli "${args[@]}" "${extra[@]}"
