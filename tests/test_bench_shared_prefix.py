"""The shared-prefix benchmark's cost-model mode (no GPU): it writes the JSON and the Markdown table,
one row per point and profile, with the planner's choice and the bytes against the unique floor."""

import json

from splitkv_bench import shared_prefix as bench


def test_model_only_writes_tables(tmp_path):
    rc = bench.main(["--model-only", "--out", str(tmp_path), "--batches", "2", "64", "--prefixes", "4096",
                     "--tails", "256", "--profiles", "h200,910b2"])
    assert rc == 0
    res = json.loads((tmp_path / "bench_shared_prefix.json").read_text())
    assert res["device"] == "cost model only" and set(res["model"]) == {"h200", "910b2"}
    rows = {(r["B"], r["profile"]): r for p in res["model"].values() for r in p}
    assert rows[(64, "h200")]["auto_shared"] and not rows[(2, "h200")]["auto_shared"]
    for r in rows.values():
        assert r["unique_mb"] <= r["shared_mb"] < r["plain_mb"]
    md = (tmp_path / "bench_shared_prefix.md").read_text()
    assert "profile 910b2 (estimates, not measurements)" in md and "| 64 | 4096 | 256 |" in md
