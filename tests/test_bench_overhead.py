"""``python -m splitkv_bench perf-check --overhead POINTS --cpu`` without a GPU: the host check path of
``DecodeWrapper.check`` by part on CPU tensors, written as JSON and a Markdown table (the timing loops
shortened: nothing here is a timing assertion)."""

from __future__ import annotations

import importlib
import json

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")


def test_overhead_cpu_writes_the_check_path_by_part(tmp_path, monkeypatch):
    pc = importlib.import_module("splitkv_bench.perf_check")
    monkeypatch.setattr(pc, "_host_us", lambda fn, n=2000: [fn() for _ in range(3)] and 1.0)
    out = tmp_path / "ov"
    assert pc.main(["--out", str(out), "--overhead", "B1x1k,B4x1k", "--cpu"]) == 0
    res = json.loads((out / "overhead.json").read_text())
    assert res["points"] == [] and [r["point"] for r in res["cpu_points"]] == ["B1x1k", "B4x1k"]
    for r in res["cpu_points"]:
        assert r["guard"] in ("native", "torch", "python")
        torch_guard = importlib.import_module("cuda_ref.checks").tensor_guard_kind() == "torch"
        assert all(r[k] == 1.0 for k, _ in pc.CHECK_PATH_COLUMNS if torch_guard or "torch" not in k)
    text = (out / "overhead.md").read_text()
    assert "| B1x1k (CPU tensors) |" in text and "| B4x1k (CPU tensors) |" in text and "graph µs" not in text
