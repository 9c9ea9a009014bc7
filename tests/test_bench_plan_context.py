"""``scripts/bench_plan_context.py``: a short CPU run writes its report, and every timed ``plan()`` was
a captured plan's one-call refresh (the quantity the script is about)."""

import json

import pytest
from script_module import load_script

pytest.importorskip("torch")
pytest.importorskip("triton")


def test_short_run_times_one_call_refreshes(tmp_path):
    mod = load_script("bench_plan_context")
    assert mod.main(["--batch", "1", "5", "--reps", "4", "--out", str(tmp_path)]) == 0
    res = json.loads((tmp_path / "plan_context.json").read_text())
    assert [(r["batch"], r["between"]) for r in res["rows"]] == [(B, k) for B in (1, 5) for k in mod.KINDS]
    for r in res["rows"]:
        assert r["refreshed"] == r["steps"] == 4, r
        assert 0 < r["c_plan_us"] < r["plan_us"], r
        assert r["write_c_us"] > 0 and r["write_python_us"] > 0, r
    assert "git" in res["meta"]
    assert "| 5 | 64 MiB read | 4 / 4 |" in (tmp_path / "plan_context.md").read_text()
