"""The offline Ascend910B lowering of cuda_ref's kernels (triton-ascend venv; skipped without it).

Slow-ish: lowers the quick subset (head dim 128, G=4, 16-bit q; float and int8 KV) plus the
checker's self-test. The full run is ``.venv-triton-ascend/bin/python -m splitkv_bench lower-triton-ascend`` (docs/triton-ascend.md).
"""

import os
import pathlib
import subprocess

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
VENV = pathlib.Path(os.environ.get("SPLITKV_TRITON_ASCEND_VENV", REPO / ".venv-triton-ascend"))
PY = VENV / "bin" / "python"

pytestmark = pytest.mark.skipif(not PY.exists(), reason=f"no triton-ascend venv at {VENV}: "
                                "run scripts/setup_triton_ascend_venv.sh")


def test_quick_lowering_has_no_ub_overflow(tmp_path):
    # the interpreter switch of this process (set by cuda_ref without a GPU) must not reach the compiler
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run([str(PY), "-m", "splitkv_bench", "lower-triton-ascend", "--self-test", "--quick",
                        "--report", str(tmp_path / "r.json")], capture_output=True, text=True, timeout=600, env=env,
                       cwd=REPO)
    assert "self-test: 2048x128 fp32 tile -> ub-overflow" in r.stdout, r.stdout + r.stderr
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
