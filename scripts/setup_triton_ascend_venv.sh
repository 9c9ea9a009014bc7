#!/usr/bin/env bash
# Create the virtual environment used to lower our Triton kernels for Ascend offline.
#
# triton-ascend replaces the `triton` package, so it never goes into the environment that runs the
# CUDA kernels or the tests: it lives in its own venv, by default `.venv-triton-ascend/` at the
# repository root (gitignored), or wherever SPLITKV_TRITON_ASCEND_VENV points.
#
# Pinned set (checked together; see docs/triton-ascend.md):
#   triton-ascend 3.2.0   the Triton frontend + Ascend backend (TTIR -> linalg "ttadapter")
#   ascendnpu-ir 1.2.0    ships `bishengir-compile` (linalg -> HIVM, incl. Unified Buffer planning)
#   torch 2.13.0 (CPU)    triton-ascend imports torch; the CPU wheel is enough to lower
#   pybind11              imported by triton-ascend's backend but not declared as a dependency
#
# Usage: scripts/setup_triton_ascend_venv.sh [VENV_DIR]
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${1:-${SPLITKV_TRITON_ASCEND_VENV:-$repo_root/.venv-triton-ascend}}"
python="${PYTHON:-python3}"

if [[ ! -x "$venv/bin/python" ]]; then
    echo "creating $venv"
    "$python" -m venv "$venv"
fi
"$venv/bin/python" -m pip install --quiet --upgrade pip
# The CPU build of torch is enough; pass TORCH_INDEX_URL to pick a wheel index (e.g. PyTorch's CPU one).
"$venv/bin/python" -m pip install "torch==2.13.0" ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"}
"$venv/bin/python" -m pip install "triton-ascend==3.2.0" "ascendnpu-ir==1.2.0" pybind11 numpy

# triton-ascend must win over any `triton` that torch pulled in.
"$venv/bin/python" - <<'PY'
import importlib.metadata as md, pathlib, sys
import triton
dists = {d.metadata["Name"].lower() for d in md.distributions()}
if "triton" in dists:
    sys.exit("the venv holds the plain `triton` distribution too; uninstall it and reinstall triton-ascend")
import ascendnpuir
bindir = pathlib.Path(ascendnpuir.__file__).parent / "bin"
exe = bindir / "bishengir-compile"
if not exe.exists():
    sys.exit(f"bishengir-compile not found in {bindir}")
print(f"triton {triton.__version__} from {pathlib.Path(triton.__file__).parent}")
print(f"bishengir-compile: {exe}")
PY
echo "ready: $venv (run: $venv/bin/python -m splitkv_bench lower-triton-ascend)"
