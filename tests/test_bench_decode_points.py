"""``python -m splitkv_bench decode --points``: the point list a targeted run times, and
``config-grid --configs`` (CPU: parsing only)."""

from __future__ import annotations

import importlib

import pytest

pytest.importorskip("torch")
pytest.importorskip("triton")


def _module():
    return importlib.import_module("splitkv_bench.decode")


def test_points_default_heads_and_given_ones():
    b = _module()
    assert b.parse_points("B1x2k, B128x1024,B1x16k@64/8,B1x32k@16/2/256,B16x4k@32/8/64") == [
        (1, 2048, 32, 8, 128, "bf16"), (128, 1024, 32, 8, 128, "bf16"), (1, 16384, 64, 8, 128, "bf16"),
        (1, 32768, 16, 2, 256, "bf16"), (16, 4096, 32, 8, 64, "bf16")]


@pytest.mark.parametrize("bad", ["B1y2k", "B1x", "Bx2k", "B1x2k@32", "B1x2k@32/8/64/1", "B1x2k@a/b"])
def test_points_refused_with_the_item_named(bad):
    with pytest.raises(ValueError, match=r"--points: .* is not B<batch>x<context>"):
        _module().parse_points(bad)


def test_fixed_split_sizes_start_at_the_profiles_shortest_split():
    """The best fixed split is searched from 64 tokens (the H200 profile's shortest ``auto`` split), at
    most 64 splits."""
    mod = _module()
    assert mod.split_sizes(1024) == [64, 128, 256, 512]
    assert mod.split_sizes(65536) == [1024, 2048, 4096, 8192, 16384, 32768]


def test_auto_with_another_shortest_split_gets_its_own_table():
    mod = _module()
    row = dict(B=1, ctx=1024, hq=32, hkv=8, D=128, dtype="bf16", auto_us=12.0, auto_splits=16, none_us=30.0,
               best_fixed_us=11.9, best_fixed_size=64, sdpa_cudnn=10.9, sdpa_flash=13.0, gbps=300.0,
               pct_ceiling=7.0, ratio_to_best_peer=0.91, auto_vs_best_fixed=1.01, merge_share=0.1,
               workspace_bytes=65536, auto_plan="auto split=64",
               auto_min_split={"256": dict(us=14.5, split_tokens=256)})
    md = mod.to_markdown(dict(ceiling_gbps=4270.0, rows=[row], meta=dict(
        gpu="GPU", sms=132, torch="t", triton="tr", cuda="c", cudnn=1, date="d", iters=20, flush="read")))
    assert "| min split 256 µs (split) |" in md
    assert "| 1 | 1024 | 32/8 | 128 | 12.0 (64) | 14.5 (256) | 10.9 |" in md


def test_config_grid_reads_its_configurations():
    """``config-grid --configs``: BLOCK_N/WARPS/STAGES items, refused with the item named."""
    g = importlib.import_module("splitkv_bench.config_grid")
    got = g.parse_configs("64/4/5, 128/8/6, 128/8/6/c")
    assert [(c.block_n, c.num_warps, c.num_stages, c.column_sum) for c in got] == [
        (64, 4, 5, False), (128, 8, 6, False), (128, 8, 6, True)]
    assert [g.name_of(c) for c in got] == ["n64w4s5", "n128w8s6", "n128w8s6c"]
    assert len(g.parse_configs(g.CONFIGS)) == 11
    for bad in ("64/4", "64/4/x", "64-4-5", "64/4/5/x"):
        with pytest.raises(ValueError, match="is not BLOCK_N/WARPS/STAGES"):
            g.parse_configs(bad)
