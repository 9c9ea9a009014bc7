"""``scripts/h200_cluster_merge_probe.py``: the CUDA probe builds with the struct layout the script
passes (where nvcc is installed; the kernels themselves run only on a GPU, where the script checks
them against its reference before timing), and that reference is attention with its lse."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
from script_module import load_script

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def probe():
    return load_script("h200_cluster_merge_probe")


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
def test_probe_builds_with_the_scripts_struct(probe, tmp_path):
    lib, ptxas = probe.build(str(tmp_path))   # build() compares the two struct sizes
    assert "stage1_cluster" in ptxas and "0 bytes spill stores" in ptxas


def test_reference_is_attention_with_natural_lse(probe):
    from splitkv_common.reference import dense_attention
    from splitkv_common.parity.cases import random_inputs

    ctx = 48
    inp = random_inputs(5, [ctx], num_q_heads=probe.HQ, num_kv_heads=probe.HKV, head_dim=probe.D, page_size=16,
                        dtype="float32")
    want_o, want_lse = dense_attention(inp)
    q = torch.from_numpy(np.asarray(inp.q))                           # [1, Hq, D]: one request, one row
    k = torch.from_numpy(np.asarray(inp.k_cache))                      # [P, page, Hkv, D]
    v = torch.from_numpy(np.asarray(inp.v_cache))
    bt = torch.from_numpy(np.asarray(inp.block_table)).long()[0]
    kc = k[bt].reshape(-1, probe.HKV, probe.D)[:ctx].transpose(0, 1)[None]   # [1, Hkv, ctx, D]
    vc = v[bt].reshape(-1, probe.HKV, probe.D)[:ctx].transpose(0, 1)[None]
    o, lse = probe.reference(q, kc, vc)
    np.testing.assert_allclose(o[0].numpy(), np.asarray(want_o)[0], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(lse[0].numpy(), np.asarray(want_lse)[0], rtol=1e-5, atol=1e-5)


def test_points_parse(probe):
    assert probe.parse_points("B1x1k, B4x1k,B1x640") == [(1, 1024), (4, 1024), (1, 640)]
