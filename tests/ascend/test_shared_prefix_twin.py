"""Shared-prefix decode on the Ascend kernels (CPU twin): the prefix stage is the mixed kernel's item
with the group's rows as the cube's M, the tails a plain launch, the two states merged exactly. A
test double: nothing here ran on an NPU."""

from __future__ import annotations

import numpy as np
import pytest

from splitkv_common.parity.cases import SHARED_PREFIX_CATALOG, shared_prefix_inputs
from splitkv_common.parity.shared_prefix import run_shared_prefix_parity
from splitkv_common.reference import dense_attention
from splitkv_common.shared_prefix import check_shared_prefix, plan_for_inputs

sim = pytest.importorskip("ascend_ops.sim_backend")
from ascend_ops import tiling as tl  # noqa: E402
from ascend_ops.shared_prefix import prefix_batch  # noqa: E402

pytestmark = pytest.mark.skipif(sim.compiler_missing() is not None, reason=str(sim.compiler_missing()))


def test_the_catalog_passes_on_the_twin():
    rep = run_shared_prefix_parity([sim.sim_backend])
    bad = [(r.case, r.status, r.message) for r in rep.results if r.status != "pass"]
    assert not bad and len(rep.results) == len(SHARED_PREFIX_CATALOG)


def test_the_prefix_stage_is_one_cube_item_per_chunk_of_a_groups_rows():
    """Two groups of 10 and 3 requests (GQA 4): the prefix batch has one request per chunk of at most
    16 query rows (64 cube rows), with the prefix's pages and lengths that let every row see it all."""
    inp, sp = shared_prefix_inputs(7, [40 + i for i in range(14)], [(0, 10, 32), (10, 13, 16)], num_q_heads=8,
                                   num_kv_heads=2, head_dim=64, page_size=8, dtype="bfloat16")
    splan = plan_for_inputs(inp, sp, device="910b2", mode="on")
    vin, causal, rows = prefix_batch(inp, splan.groups, rows_per_item=16)   # 4 query rows x G 4 per item
    assert vin.query_start_loc.tolist() == [0, 4, 8, 10, 13]
    assert vin.seq_lens.tolist() == [32, 32, 32, 16] and causal.tolist() == [35, 35, 33, 18]
    assert rows.tolist() == list(range(13))
    assert (vin.block_table[0, :4] == inp.block_table[0, :4]).all() and (vin.block_table[3, :2] == inp.block_table[10, :2]).all()
    til = tl.build_tiling(vin, vin.plan("auto", device="910b2"))
    assert til.mixed and til.fields["mixRowsPad"] == 16


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_rows_past_one_item_and_groups_beside_loners(dtype, monkeypatch):
    """Twenty requests under one prefix (more rows than one item holds: two prefix items), two
    requests without one: the same attention as the plain decode, through the prefix stage."""
    import ascend_ops.shared_prefix as asp

    made = []
    real = asp.prefix_batch
    monkeypatch.setattr(sim, "prefix_batch", lambda *a, **k: made.append(real(*a, **k)) or made[-1])
    inp, sp = shared_prefix_inputs(11, [70 + 3 * i for i in range(22)], [(1, 21, 64)], num_q_heads=8, num_kv_heads=2,
                                   head_dim=64, page_size=16, dtype=dtype)
    check_shared_prefix(sp, inp.seq_lens, inp.query_start_loc, 16, inp.block_table, inp.k_cache.shape[0])
    out, lse = sim.run_twin_shared_prefix(inp, sp, mode="on")
    vin = made[0][0]
    assert vin.query_start_loc.tolist() == [0, 16, 20]   # 16 rows x G 4 = 64 cube rows, then 4
    ro, rl = dense_attention(inp)
    np.testing.assert_allclose(out, ro, atol=2e-2, rtol=0)
    np.testing.assert_allclose(lse, rl, atol=2e-3, rtol=0)
