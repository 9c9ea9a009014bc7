#!/usr/bin/env bash
# One command on an Ascend NPU node (docs/npu.md, "Bench"): build the operator, run the parity
# catalog on it and on the two CANN peers, then time ours against CANN's FIA and ATB's
# PagedAttention on the same shapes (splitkv_bench/npu.py), with msprof's pipe utilisation when
# msprof is installed.
#
#   source <CANN>/set_env.sh
#   scripts/npu_bench.sh [--skip-build] [--skip-parity] [--no-msprof] [--soc Ascend910B2]
#                        [--route cmake|bisheng] [--size small|full] [--out DIR]
#                        [-- extra arguments of python -m splitkv_bench npu, e.g. --set main --iters 100]
#
# Writes, under DIR (default reports/):
#   npu-parity.md / .json           splitkv parity, backends ascend, cann-fia, atb-paged, numpy
#   npu-bench.md / .json            medians per call (torch.npu.Event), ours / peer, x HBM floor
#   msprof/                         msprof's collection with --aic-metrics=PipeUtilization, when present
#
# Exit status: 0 done, 1 a parity case failed or a timed call errored, 2 a prerequisite is missing
# (said on stderr before anything is built or run).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/lib/python.sh

build=1
parity=1
use_msprof=1
size="small"
out="reports"
build_args=()
bench_args=()
while [[ $# -gt 0 ]]; do
    case "$1" in
        --skip-build) build=0; shift ;;
        --skip-parity) parity=0; shift ;;
        --no-msprof) use_msprof=0; shift ;;
        --soc|--route) build_args+=("$1" "$2"); shift 2 ;;
        --size) size="$2"; shift 2 ;;
        --out) out="$2"; shift 2 ;;
        --) shift; bench_args=("$@"); break ;;
        *) echo "error: unknown argument $1 (see the header of $0)" >&2; exit 2 ;;
    esac
done

# ---- prerequisites, before any work ---------------------------------------------------------
if [[ -z "${ASCEND_HOME_PATH:-}" ]]; then
    echo "error: ASCEND_HOME_PATH is not set: this runs on an Ascend NPU node; source CANN's set_env.sh" \
         "first (CANN's default: /usr/local/Ascend/ascend-toolkit/set_env.sh)" >&2
    exit 2
fi
need_module splitkv_common "install this package (pip install -e '.[test]', docs/npu.md)"
need_module torch "install torch and the torch-npu wheel matching it and CANN (docs/npu.md)"
if ! "$PYTHON" - <<'PY'
import sys
from splitkv_common.npu_probe import npu_unavailable
why = npu_unavailable()
if why:
    print(f"error: no usable NPU: {why}", file=sys.stderr)
sys.exit(2 if why else 0)
PY
then
    exit 2
fi

mkdir -p "$out"
status=0

# ---- 1. build ------------------------------------------------------------------------------
if [[ "$build" == 1 ]]; then
    scripts/build_ascend.sh "${build_args[@]}"
fi

# ---- 2. parity: our operator and the two peers against the float64 reference -----------------
if [[ "$parity" == 1 ]]; then
    "$PYTHON" -m splitkv_common.cli parity --backend ascend --backend cann-fia --backend atb-paged \
        --backend numpy --size "$size" --force --report "$out/npu-parity.md" --report "$out/npu-parity.json" \
        || status=1
fi

# ---- 3. timing -------------------------------------------------------------------------------
"$PYTHON" -m splitkv_bench npu --out-json "$out/npu-bench.json" --out-md "$out/npu-bench.md" \
    "${bench_args[@]}" || status=1

# ---- 4. pipe utilisation (msprof, when installed) --------------------------------------------
if [[ "$use_msprof" == 1 ]]; then
    if command -v msprof >/dev/null 2>&1; then
        # a short run of the main shapes under msprof: per-kernel pipe utilisation (cube, vector,
        # MTE1/2/3, scalar) of ours and the peers; read it with msprof's summary export
        # (the application at the end of the command: the msprof docs' recommended form)
        msprof --output="$out/msprof" --aic-metrics=PipeUtilization \
            "$PYTHON" -m splitkv_bench npu --set main --warmup 2 --iters 5 || status=1
        msprof --export=on --output="$out/msprof" \
            || echo "note: msprof --export failed; newer CANN releases export during collection" >&2
    else
        echo "note: msprof not found on PATH: no pipe utilisation collected" >&2
    fi
fi
exit "$status"
