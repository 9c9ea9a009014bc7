#!/usr/bin/env bash
# The node day (docs/npu.md, "Node day"): one command for the first hour on an Ascend 910B node.
# Stages, in order, each stopping at its first failure and always writing what it found:
#   1 identify  2 build (each route, launch symbols)  3 smoke (one feature a case, each launch under
#   a watchdog)  4 determinism (repeats, block counts)  5 parity (small and full catalog, with the
#   CANN peers)  6 latency / bandwidth probes -> a constants file and the estimate  7 timing.
#
#   source <CANN>/set_env.sh
#   scripts/npu_node_day.sh [--out DIR] [--stages 1-7] [--repeats 50] [--timeout 300] ...
#   scripts/npu_node_day.sh --twin        # stages 1, 3-6 on the CPU twin (nothing on an NPU)
#
# Writes DIR (default reports/node-day-<UTC time>/): report.md, report.json, logs/, jobs/, the
# parity / timing / constants files, and DIR.tar.gz next to it. Exit status: 0 every stage that ran
# passed, 1 a stage failed, 2 refused (unsupported chip, missing prerequisite, bad argument).
# `scripts/npu_node_day.sh --help` lists every option.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/lib/python.sh

need_module numpy "install this package's requirements (scripts/setup_env.sh, or pip install -e '.[test]' on a node)"
export SPLITKV_NODE_DAY_ENTRY="scripts/npu_node_day.sh"
exec "$PYTHON" -m ascend_ops.node_day "$@"
