"""``scripts/bench_decode.py --points``: the point list a targeted run times (CPU: parsing only)."""

from __future__ import annotations

import importlib.util
import pathlib

import pytest

pytest.importorskip("torch")
pytest.importorskip("triton")

SCRIPT = pathlib.Path(__file__).resolve().parents[1] / "scripts" / "bench_decode.py"


def _module():
    spec = importlib.util.spec_from_file_location("bench_decode_under_test", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_points_default_heads_and_given_ones():
    b = _module()
    assert b.parse_points("B1x2k, B128x1024,B1x16k@64/8,B1x32k@16/2/256,B16x4k@32/8/64") == [
        (1, 2048, 32, 8, 128, "bf16"), (128, 1024, 32, 8, 128, "bf16"), (1, 16384, 64, 8, 128, "bf16"),
        (1, 32768, 16, 2, 256, "bf16"), (16, 4096, 32, 8, 64, "bf16")]


@pytest.mark.parametrize("bad", ["B1y2k", "B1x", "Bx2k", "B1x2k@32", "B1x2k@32/8/64/1", "B1x2k@a/b"])
def test_points_refused_with_the_item_named(bad):
    with pytest.raises(ValueError, match=r"--points: .* is not B<batch>x<context>"):
        _module().parse_points(bad)
