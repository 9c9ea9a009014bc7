#!/usr/bin/env bash
# Build the Ascend operator's library, ascend_ops/_lib/libsplitkv_ascend.so, on a machine with an
# installed CANN toolkit and torch_npu: the Ascend C kernels (bisheng, through CANN's
# ascendc_library) and the torch_npu binding (docs/npu.md, "Build").
#
#   source <CANN>/set_env.sh          # sets ASCEND_HOME_PATH
#   scripts/build_ascend.sh [--soc Ascend910B2] [--jobs N] [--build-dir DIR] [--route cmake|bisheng]
#       cmake (default): CANN's ascendc_library(); bisheng: bisheng with the installed CANN's flags:
#       8.3 and later `-x asc --npu-arch=dav-2201`; 8.1 / 8.2 `-xcce --cce-soc-version=<SoC>
#       --cce-auto-sync` (the version from the toolkit's ascend_toolkit_install.info, or
#       SPLITKV_CANN_VERSION=8.1 to say it)
#
#   scripts/build_ascend.sh --offline-check
#       anywhere with g++ and torch: compile the binding with stand-in NPU headers and check its
#       C++ signature against the operator's schema (no CANN, no NPU).
#
# Exit status: 0 built, 2 a prerequisite is missing (said on stderr), other: a failed step.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/lib/python.sh

offline=0
for arg in "$@"; do
    [[ "$arg" == "--offline-check" ]] && offline=1
done

if [[ "$offline" == 0 ]]; then
    if [[ -z "${ASCEND_HOME_PATH:-}" ]]; then
        echo "error: ASCEND_HOME_PATH is not set: install the CANN toolkit (8.1.RC1 or newer) and source its" \
             "set_env.sh first (CANN's default: /usr/local/Ascend/ascend-toolkit/set_env.sh)" >&2
        exit 2
    fi
    if [[ ! -d "$ASCEND_HOME_PATH" ]]; then
        echo "error: ASCEND_HOME_PATH=$ASCEND_HOME_PATH is not a directory" >&2
        exit 2
    fi
fi
need_module torch "install torch (and, for a node build, the torch-npu wheel matching it and CANN)"

exec "$PYTHON" -m ascend_ops.build "$@"
