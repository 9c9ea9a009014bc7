"""``python -m splitkv_bench eager-ab`` without a GPU: the fixed-batch loop times ``plan()`` of this tree against
another tree's ``cuda_ref`` (here this tree again), both trees planning the same batches."""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")
ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU mode (a GPU runs the whole comparison)")
def test_fixed_batches_time_plan_on_the_cpu(tmp_path):
    ab = importlib.import_module("splitkv_bench.eager_ab")
    out = tmp_path / "ab"
    assert ab.main(["--old", str(ROOT), "--old-label", "same", "--out", str(out), "--fixed-batches", "1,5,2-6",
                    "--steps", "4"]) == 0
    res = json.loads((out / "eager_ab.json").read_text())
    (rnd,) = res["rounds"]
    assert "repeated" not in rnd and [r["batch"] for r in rnd["fixed"]] == ["1", "5", "2-6"]
    for r in rnd["fixed"]:
        assert r["old_plan_p50"] > 0 and r["new_plan_p50"] > 0 and r["old_run_p50"] is None
    text = (out / "eager_ab.md").read_text()
    assert "| 1 | 5 |" in text and "| 1 | 2-6 |" in text and "A new batch every step" not in text


def test_without_a_gpu_or_fixed_batches_it_says_why(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("a GPU runs the whole comparison")
    with pytest.raises(SystemExit, match="--fixed-batches"):
        importlib.import_module("splitkv_bench.eager_ab").main(["--old", str(ROOT), "--out", str(tmp_path)])
