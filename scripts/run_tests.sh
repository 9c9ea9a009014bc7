#!/usr/bin/env bash
# The test suite (CI runs exactly this). Extra arguments go to pytest, e.g. -m slow for the full catalog.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
py="$("$root/scripts/setup_env.sh" | tail -n 1)"
cd "$root"
if [ "$#" -eq 0 ]; then set -- -m "not slow"; fi
exec "$py" -m pytest -q "$@"
