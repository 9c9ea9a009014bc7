"""``scripts/h200_tma_probe.py``: the tensor-copy probe kernel computes attention (CPU: the Triton
interpreter, a small ragged batch with shuffled pages and a partial last page, one to four pages a
softmax step), so its H200 timings are of a correct kernel."""

from __future__ import annotations

import importlib.util
import pathlib

import pytest

pytest.importorskip("torch")
pytest.importorskip("triton")

SCRIPT = pathlib.Path(__file__).resolve().parents[1] / "scripts" / "h200_tma_probe.py"


def _module():
    spec = importlib.util.spec_from_file_location("h200_tma_probe_under_test", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("ppi", [1, 2, 4])
def test_probe_matches_float32_attention(ppi):
    import torch
    assert _module().check("cuda" if torch.cuda.is_available() else "cpu", ppi=ppi) < 1e-2
