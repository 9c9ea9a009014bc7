#!/usr/bin/env bash
# Create (once) the virtual environment the README's commands use: the CPU build of torch,
# Triton (for the interpreter), and this package in editable mode with its test extras.
# Usage: source-free; prints the venv's python path on the last line.
#   SPLITKV_VENV=dir   use another venv location (default: .venv in the repository)
#   SPLITKV_REINSTALL=1 reinstall even if the venv looks complete
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${SPLITKV_VENV:-$root/.venv}"
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv" >&2
fi
py="$venv/bin/python"
if [ "${SPLITKV_REINSTALL:-0}" = 1 ] || ! "$py" -c "import torch, splitkv_common, hypothesis" >/dev/null 2>&1; then
  # torch is pinned to the CPU build: an unpinned torch would pull a multi-GB CUDA build.
  "$py" -m pip install -q torch==2.13.0 >&2
  # Triton runs our kernels on the CPU through its interpreter; optional where no wheel exists.
  "$py" -m pip install -q triton==3.7.1 >&2 || echo "note: triton not installable here; the triton backend will report itself unavailable" >&2
  "$py" -m pip install -q -e "$root[test,bench]" >&2
fi
echo "$py"
