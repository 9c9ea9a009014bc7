#!/usr/bin/env bash
# The test suite (CI runs exactly this). Extra arguments go to pytest, e.g. -m slow for the full catalog.
#   SPLITKV_WITH_TRITON_ASCEND=1  also prepare the triton-ascend venv, so that the offline Ascend
#                                 lowering of every Triton kernel variant runs instead of skipping
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
py="$("$root/scripts/setup_env.sh" | tail -n 1)"
if [ "${SPLITKV_WITH_TRITON_ASCEND:-0}" = 1 ]; then
  "$root/scripts/setup_triton_ascend_venv.sh" >/dev/null || echo "note: triton-ascend venv not ready; its lowering test will skip" >&2
fi
cd "$root"
if [ "$#" -eq 0 ]; then set -- -m "not slow"; fi
exec "$py" -m pytest -q "$@"
