"""``scripts/h200_tma_probe.py``: the tensor-copy probe kernel computes attention (CPU: the Triton
interpreter, a small ragged batch with shuffled pages and a partial last page, one to four pages a
softmax step), so its H200 timings are of a correct kernel."""

from __future__ import annotations

import pytest
from script_module import load_script

pytest.importorskip("torch")
pytest.importorskip("triton")

@pytest.mark.parametrize("ws", [False, True])
@pytest.mark.parametrize("ppi", [1, 2, 4])
def test_probe_matches_float32_attention(ppi, ws):
    import torch
    assert load_script("h200_tma_probe").check("cuda" if torch.cuda.is_available() else "cpu", ppi=ppi, ws=ws) < 1e-2
