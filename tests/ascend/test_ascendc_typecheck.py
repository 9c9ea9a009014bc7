"""Type-check of the Ascend C kernels against the real CANN headers (CPU-debug mode).

Runs ``scripts/check_ascendc.sh`` when ``ASCEND_HOME_PATH`` points at a toolkit with the headers;
skips with the reason otherwise (CI cannot fetch them).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
SCRIPT = ROOT / "scripts" / "check_ascendc.sh"
HOME = os.environ.get("ASCEND_HOME_PATH", "")
have_headers = bool(HOME) and any((Path(HOME) / a / "ascendc" / "include").is_dir()
                                  for a in ("aarch64-linux", "x86_64-linux"))
needs_headers = pytest.mark.skipif(not have_headers, reason="ASCEND_HOME_PATH unset or without the Ascend C headers")
needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not found")


def _run(*args, env=None):
    return subprocess.run(["bash", str(SCRIPT), *map(str, args)], capture_output=True, text=True, env=env,
                          timeout=300)


def test_distinct_exit_code_without_headers():
    env = {k: v for k, v in os.environ.items() if k != "ASCEND_HOME_PATH"}
    res = _run(env=env)
    assert res.returncode == 2 and "ASCEND_HOME_PATH is not set" in res.stderr
    res = _run(env={**env, "ASCEND_HOME_PATH": str(ROOT)})
    assert res.returncode == 2 and "no Ascend C CPU-debug headers" in res.stderr


@needs_headers
@needs_gxx
def test_kernels_typecheck_clean():
    res = _run()
    assert res.returncode == 0, res.stdout + res.stderr
    oks = [line.split()[1:] for line in res.stdout.splitlines() if line.startswith("ok ")]
    assert {o[0] for o in oks} == {p.name for p in (ROOT / "ascend_ops" / "kernel").glob("*.cpp")}
    # the mixed kernel is checked as the cube (AIC) and the vector (AIV) compilation
    assert sorted(o[1:] for o in oks if o[0] == "splitkv_split_mix.cpp") == [["-D__DAV_C220_CUBE__"],
                                                                               ["-D__DAV_C220_VEC__"]]


@needs_headers
@needs_gxx
@pytest.mark.parametrize("body,what", [
    ("LocalTensor<half> h; LocalTensor<float> f; Axpy(f, h, 1.0f, 8);", "mixed Axpy scalar type"),
    ("LocalTensor<int32_t> a; Exp(a, a, 8);", "Exp on int32"),
    ("LocalTensor<float> a; GlobalTensor<half> g; DataCopy(a, g, 8);", "DataCopy dtype mismatch"),
    ("LocalTensor<float> a; ReduceSumm(a, a, a, 8);", "misspelled API"),
    ("int unused = 3;", "a warning in our file"),
])
def test_typecheck_has_teeth(tmp_path, body, what):
    bad = tmp_path / "bad_kernel.cpp"
    bad.write_text('#include "kernel_operator.h"\nusing namespace AscendC;\n'
                   'extern "C" __global__ __aicore__ void bad(GM_ADDR x) {\n' + body + "\n}\n")
    res = _run(bad)
    assert res.returncode == 1, f"{what} was not rejected:\n{res.stdout}"
