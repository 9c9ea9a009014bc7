#!/usr/bin/env bash
# The main job: the parity catalog on every backend this machine has (NumPy and torch on a laptop;
# Triton through its interpreter on a CPU; more on a GPU or NPU node). Writes reports/parity.{md,json}.
# Extra arguments go to `splitkv parity`, e.g. --size all or --backend numpy.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
py="$("$root/scripts/setup_env.sh" | tail -n 1)"
cd "$root"
mkdir -p reports
# --force: each run replaces the previous reports (written atomically)
exec "$py" -m splitkv_common.cli parity --force --report reports/parity.md --report reports/parity.json "$@"
