"""The ``ascend-sim`` backend: the Ascend C kernels on the CPU twin, held to the parity catalog.

The twin is a test double (g++ against our emulation of the Ascend C API), not the NPU. The small
catalog runs in CI; the full one with ``-m slow`` or ``SPLITKV_FULL=1``.
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
from pathlib import Path

import numpy as np
import pytest

from splitkv_common.parity import cases, harness
from splitkv_common.reference import dense_attention

sim = pytest.importorskip("ascend_ops.sim_backend")
pytestmark = pytest.mark.skipif(sim.compiler_missing() is not None, reason=str(sim.compiler_missing()))

SMALL = cases.catalog(sizes=("small",))
FULL = [c for c in cases.catalog(sizes=("small", "full")) if c.size == "full"]


def _judge(case):
    res = harness.run_case(sim.sim_backend, case)
    assert res.status == harness.PASS, f"{case.name}: {res.status} {res.message}"


@pytest.mark.parametrize("case", SMALL, ids=lambda c: c.name)
def test_small_catalog(case):
    _judge(case)


_VECTOR = dataclasses.replace(sim.sim_backend, name="ascend-sim-vector",
                              run=lambda inputs, plan: sim.run_catalog(inputs, plan, kernel="vector"))


@pytest.mark.parametrize("case", SMALL, ids=lambda c: c.name)
def test_small_catalog_vector_kernel(case):
    """The vector-only split stage (the fallback, and what the NPU binding launches) on every case,
    including the fp16/bf16 ones the mixed stage serves by default."""
    res = harness.run_case(_VECTOR, case)
    assert res.status == harness.PASS, f"{case.name}: {res.status} {res.message}"


@pytest.mark.slow
@pytest.mark.skipif(not FULL, reason="no full-size cases in the catalog")
@pytest.mark.parametrize("case", FULL, ids=lambda c: c.name)
def test_full_catalog(case, request):
    if os.environ.get("SPLITKV_FULL") != "1" and "slow" not in (request.config.getoption("-m") or ""):
        pytest.skip("full catalog: run with -m slow or SPLITKV_FULL=1")
    _judge(case)


def test_backend_metadata():
    b = sim.sim_backend
    assert b.name == "ascend-sim" and b.device == "910b2" and b.unavailable() is None
    assert "test double" in b.description
    meta = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())
    assert meta["project"]["entry-points"]["splitkv.backends"]["ascend-sim"] == "ascend_ops.sim_backend:sim_backend"


def test_unsupported_head_dim_is_reported_not_run():
    inp = cases.random_inputs(0, [10], head_dim=100)
    assert "head dim 100" in sim.sim_backend.unsupported(inp)


def test_empty_rows_give_zero_and_minus_inf():
    inp = cases.random_inputs(7, [0, 9, 0], dtype="bfloat16", num_q_heads=4, num_kv_heads=1)
    out, lse = sim.run_twin(inp, inp.plan("size:16", device="910b2"))
    assert not np.isnan(out).any() and not np.isnan(lse).any()
    assert (out[[0, 2]] == 0).all() and np.isneginf(lse[[0, 2]]).all() and np.isfinite(lse[1]).all()


def test_rows_split_across_row_chunks_match_whole_rows():
    """A GQA group too big for one UB chunk (forced small UB) gives the same result in chunks."""
    from ascend_ops import tiling as tl

    inp = cases.random_inputs(8, [70, 33], num_q_heads=16, num_kv_heads=1, head_dim=128, dtype="float16",
                              q_lens=[3, 2])
    plan = inp.plan("size:32", device="910b2")
    whole = sim.run_twin(inp, plan)
    real = tl.choose_tiles
    try:
        tl.choose_tiles = lambda *a, **k: (16, 5)  # 5-row chunks: heads and q rows split mid-group
        chunked = sim.run_twin(inp, plan)
    finally:
        tl.choose_tiles = real
    np.testing.assert_allclose(chunked[0], whole[0], rtol=0, atol=2e-3)
    np.testing.assert_allclose(chunked[1], whole[1], rtol=1e-6, atol=1e-6)
    ref_out, _ = dense_attention(inp)
    assert np.abs(chunked[0] - ref_out).max() < 5e-3


def test_bf16_storage_roundtrip():
    x = np.array([1.0, -2.5, 3.140625, 0.0, -0.0, 65504.0, 1e-30], np.float32)
    from splitkv_common.dtypes import round_to

    x = round_to(x, "bfloat16")
    np.testing.assert_array_equal(sim.from_native(sim.to_native(x, "bfloat16"), "bfloat16"), x)


@pytest.mark.parametrize("dtype, kernel", [("float32", "vector"), ("bfloat16", "vector"), ("bfloat16", "mix"),
                                           ("float16", "mix")])
@pytest.mark.parametrize("cap", [30.0, 1000.0, 1e6])
def test_soft_cap_to_float32_accuracy_for_any_cap(dtype, kernel, cap):
    """cap * tanh(s / cap) in both kernels is as accurate as the NumPy float32 split path, also for a
    cap far above the scores (the vector kernel's cap - 2 cap / (exp(2 s / cap) + 1) lost 8e-5 in lse
    at cap 1000 to cancellation)."""
    from splitkv_common.reference import split_attention

    inp = cases.random_inputs(5, [300, 77], num_q_heads=8, num_kv_heads=2, head_dim=64, dtype=dtype, soft_cap=cap,
                              q_scale=5.0)
    plan = inp.plan("size:64", device="910b2")
    ref_out, ref_lse = dense_attention(inp)
    np_out, np_lse = split_attention(inp, plan)
    out, lse = sim.run_twin(inp, plan, kernel=kernel)
    assert np.abs(lse - ref_lse).max() <= 2 * np.abs(np_lse - ref_lse).max() + 1e-6
    assert np.abs(out - ref_out).max() <= 2 * np.abs(np_out - ref_out).max() + 1e-6
