"""The mixed AIC + AIV split stage (``splitkv_split_mix``) on the CPU twin.

Block orders, masked page ids (never dereferenced, contribute nothing), the soft cap's accuracy
when the cap is large against the scores, and the fallback rule. A test double: nothing here ran
on an NPU.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from splitkv_common.devices import get_profile
from splitkv_common.parity import cases
from splitkv_common.plan import make_plan
from splitkv_common.reference import dense_attention

sim = pytest.importorskip("ascend_ops.sim_backend")
from ascend_ops import tiling as tl  # noqa: E402

pytestmark = pytest.mark.skipif(sim.compiler_missing() is not None, reason=str(sim.compiler_missing()))


def _ref(inp):
    out, lse = dense_attention(inp)
    return np.asarray(out, np.float64), np.asarray(lse, np.float64)


@pytest.mark.parametrize("order", [0, 1, 12345])
def test_block_orders_give_identical_results(order):
    inp = cases.random_inputs(1, [700, 33, 0, 300], num_q_heads=16, num_kv_heads=4, head_dim=128,
                              page_size=64, dtype="bfloat16", q_lens=[1, 2, 1, 3])
    plan = inp.plan("size:256", device="910b2")
    assert tl.build_tiling(inp, plan).mixed
    lib = sim.twin_library()
    sim.set_block_order(lib, 0)
    base = sim.run_twin(inp, plan)
    sim.set_block_order(lib, order)
    try:
        out, lse = sim.run_twin(inp, plan)
    finally:
        sim.set_block_order(lib, 0)
    np.testing.assert_array_equal(out, base[0])
    np.testing.assert_array_equal(lse, base[1])
    ro, rl = _ref(inp)
    np.testing.assert_allclose(out, ro, atol=2e-2, rtol=0)
    ok = np.isfinite(rl)
    np.testing.assert_allclose(lse[ok], rl[ok], atol=1e-3, rtol=0)


@pytest.mark.parametrize("kernel", ["mix", "vector"])
@pytest.mark.parametrize("bad", [-1, 10 ** 6])
@pytest.mark.parametrize("seed, quant, out_tol_scaled, lse_tol", [
    (2, {}, False, 1e-4),                                          # fp16 KV
    (62, dict(kv_quant="head", kv_offset=True), True, 2e-3),       # int8 KV: the vector core writes zero rows
])
def test_page_ids_outside_the_cache_are_masked_and_never_read(bad, seed, quant, out_tol_scaled, lse_tol, kernel):
    """A block-table entry outside [0, num_pages) contributes nothing (and is not dereferenced:
    the twin's bounds check would reject a read outside the cache), with 16-bit and int8 KV, in
    the mixed kernel and the vector-only one."""
    inp = cases.random_inputs(seed, [300, 200], num_q_heads=8, num_kv_heads=2, head_dim=64, page_size=32,
                              dtype="float16", **quant)
    page = 32
    bt = inp.block_table.copy()
    masked = [(0, 2), (0, 5), (1, 0)]  # (request, logical page)
    for b, p in masked:
        bt[b, p] = bad
    bad_inp = dataclasses.replace(inp, block_table=bt)
    plan = bad_inp.plan("size:128", device="910b2")
    til = tl.build_tiling(bad_inp, plan, kernel=kernel)
    assert til.mixed == (kernel == "mix")
    # the kernel itself (run_twin refuses such a table on the host before any launch)
    ws = sim.new_workspace(til)
    out, lse = sim.run_tiling(bad_inp, plan, til, ws=ws)
    # each masked read counted (once per K tile copy), the first one named
    rec = sim.read_errors(ws)
    assert rec[0] >= len(masked) and (rec[1], rec[2]) in masked and rec[3] == bad and rec[4:] == [0, 0, 0, 0]
    # reference: the same attention with the masked pages' tokens left out
    T, Hq, D = inp.q.shape
    G = Hq // inp.k_cache.shape[2]
    scale = inp.scale if inp.scale is not None else D ** -0.5

    def kv(cache, sc, off, pages, L):  # [L, Hkv, D] float64 (int8: per-head scale and offset)
        x = cache[pages, np.arange(L) % page].astype(np.float64)
        return x if sc is None else (x - off[None, :, None]) * sc[None, :, None]

    for b in range(2):
        L = int(inp.seq_lens[b])
        keep = np.array([(b, p // page) not in masked for p in range(L)])
        pages = inp.block_table[b, np.arange(L) // page]
        k = kv(inp.k_cache, inp.k_scale, inp.k_offset, pages, L)[keep]
        v = kv(inp.v_cache, inp.v_scale, inp.v_offset, pages, L)[keep]
        for hq in range(Hq):
            s = (k[:, hq // G] @ inp.q[b, hq].astype(np.float64)) * scale
            m = s.max()
            w = np.exp(s - m)
            want = (w[:, None] * v[:, hq // G]).sum(0) / w.sum()
            atol = 5e-3 * max(1.0, np.abs(want).max()) if out_tol_scaled else 5e-3
            np.testing.assert_allclose(out[b, hq], want, atol=atol, rtol=0)
            assert abs(lse[b, hq] - (m + np.log(w.sum()))) < lse_tol


def test_all_pages_masked_gives_zero_and_minus_inf():
    inp = cases.random_inputs(3, [64], num_q_heads=4, num_kv_heads=1, head_dim=64, page_size=16, dtype="bfloat16")
    bad = dataclasses.replace(inp, block_table=np.full_like(inp.block_table, -5))
    plan = bad.plan("none", device="910b2")
    til = tl.build_tiling(bad, plan)
    # the kernel itself (run_twin refuses such a table on the host before any launch)
    assert til.mixed
    out, lse = sim.run_fused(bad, plan, til)
    assert (out == 0).all() and np.isneginf(lse).all()


def test_soft_cap_does_not_cancel_for_a_large_cap():
    """cap * tanh(s / cap) with the cap 10^4 times the scores: the lse keeps float accuracy (the
    form cap - 2 cap / (exp(2 s / cap) + 1) loses ~cap * 2^-24 absolutely, ~6e-4 here)."""
    inp = cases.random_inputs(4, [500], num_q_heads=8, num_kv_heads=2, head_dim=128, page_size=64,
                              dtype="float16", soft_cap=1.0e4)
    plan = inp.plan("size:256", device="910b2")
    assert tl.build_tiling(inp, plan).mixed
    _, lse = sim.run_twin(inp, plan)
    _, rl = _ref(inp)
    assert np.abs(lse - rl).max() < 5e-5


def test_soft_cap_saturates_for_large_scores():
    inp = cases.random_inputs(5, [200], num_q_heads=4, num_kv_heads=1, head_dim=64, page_size=32,
                              dtype="bfloat16", soft_cap=5.0, q_scale=50.0)
    out, lse = sim.run_twin(inp, inp.plan("size:128", device="910b2"))
    ro, rl = _ref(inp)
    assert np.isfinite(out).all()
    np.testing.assert_allclose(lse, rl, atol=1e-3, rtol=0)


@pytest.mark.parametrize("dtype,kv,d,why", [("float32", None, 128, "fp16/bf16"), ("float32", "head", 128, "fp16/bf16"),
                                            ("bfloat16", None, 72, "multiple of 16"),
                                            ("float16", "channel", 72, "multiple of 16")])
def test_shapes_the_mixed_kernel_leaves_to_the_vector_kernel(dtype, kv, d, why):
    inp = cases.random_inputs(6, [50], num_q_heads=4, num_kv_heads=2, head_dim=d, dtype=dtype, kv_quant=kv)
    kvd = "int8" if kv else dtype
    assert why in tl.mix_unsupported(d, dtype, kvd, 4, 2)
    til = tl.build_tiling(inp, inp.plan("none", device="910b2"))
    assert not til.mixed
    with pytest.raises(ValueError, match="mixed kernel"):
        tl.build_tiling(inp, inp.plan("none", device="910b2"), kernel="mix")


def test_core_ranges_are_contiguous_and_balanced():
    inp = cases.random_inputs(7, [5000, 100, 2000, 3000, 0, 700], num_q_heads=8, num_kv_heads=2, page_size=16)
    plan = inp.plan("size:512", device="910b2")
    for cores in (1, 3, 24):
        r = tl.balance_items(plan, cores)
        assert r[0] == 0 and r[-1] == plan.num_items and (np.diff(r) >= 0).all()
        w = np.maximum(0, plan.item_kv_end - plan.item_kv_start) + tl.MIX_ITEM_OVERHEAD_TOKENS
        w = np.where(plan.item_request >= 0, w, 0)
        loads = [w[r[c]:r[c + 1]].sum() for c in range(cores)]
        assert max(loads) <= w.sum() / cores + w.max()


@pytest.mark.parametrize("hq", [32, 64])
@pytest.mark.parametrize("batch,ctx,want", [(1, 16384, 3), (1, 65536, 3), (16, 8192, 2), (64, 2048, 1), (2, 600, 1),
                                            (64, 16384, 1), (4, 8192, 3)])
def test_npu_split_count_fills_the_cube_cores(batch, ctx, want, hq):
    """The issue's shapes on the 910B2 (24 cube cores, Hkv 8, page 128): B 1 is split in 3 (24 items,
    one per core); B 16 in 2 (256 items, 11 on the busiest core against 6 of twice the length
    unsplit; 3 splits would gain under 3 % more); B 64 (512 items) already fills the cores within
    3 % and is not split; 600 tokens are too short for two splits of at least 512."""
    assert tl.npu_split_count([ctx] * batch, 8, 128, "910b2", num_q_heads=hq) == want
    plan = make_plan([ctx] * batch, num_kv_heads=8, num_q_heads=hq, page_size=128, policy="auto", device="910b2")
    assert "NPU rule" in plan.reason and "24 cube cores" in plan.reason
    assert ("splits of" in plan.reason) == (want > 1)
    assert int(plan.num_splits.max()) == want and plan.split_tokens in plan.estimates_us


def test_npu_auto_uses_each_profiles_core_count():
    """One request with 4 KV heads fills each profile's own cube cores (24 on 910B2, 20 on 910B3: 6 and
    5 splits), the counts read from splitkv_common/devices.py."""
    from splitkv_common.devices import get_profile

    for prof in ("910b2", "910b3"):
        cores = get_profile(prof).cube_units
        plan = make_plan([65536], num_kv_heads=4, num_q_heads=32, page_size=128, policy="auto", device=prof)
        items = int(plan.num_valid_items)
        assert items % cores == 0 and items // cores == 1, (prof, items)
        assert f"{cores} cube cores" in plan.reason


def test_fused_launch_equals_split_then_combine():
    """splitkv_attention_mix (split, SyncAll, combine in one launch) == splitkv_split_mix + splitkv_combine."""
    inp = cases.random_inputs(8, [900, 5, 0, 260], num_q_heads=32, num_kv_heads=8, head_dim=128, page_size=128,
                              dtype="bfloat16", q_lens=[1, 1, 1, 2], window_left=300)
    plan = inp.plan("size:256", device="910b2")
    fused = sim.run_twin(inp, plan, fused=True)
    two = sim.run_twin(inp, plan, fused=False)
    np.testing.assert_array_equal(fused[0], two[0])
    np.testing.assert_array_equal(fused[1], two[1])
    with pytest.raises(ValueError, match="fused"):
        sim.run_twin(inp, plan, kernel="vector", fused=True)


def _kv_at(inp, b, pos):
    """(page, slot) of request b's logical position pos."""
    page = inp.k_cache.shape[1]
    return int(inp.block_table[b, pos // page]), pos % page


@pytest.mark.parametrize("what", ["nan-k", "inf-v", "minus-inf-k", "nan-q", "minus-inf-k-soft-cap",
                                  "nan-v-page-tail", "nan-v-windowed-out", "nan-v-unassigned-page",
                                  "nan-k-causally-masked", "nan-v-causally-masked"])
def test_nan_rule_on_the_mixed_kernel(what):
    """docs/conventions.md: a NaN / inf in q, or in K / V at a position a row can see, makes that
    row NaN (out and lse) for the query heads that read it; values no row can see change nothing
    (bit-identical to the clean run). Mixed kernel, fused launch, bf16, splits of 128 tokens."""
    window = 100 if what == "nan-v-windowed-out" else None
    cap = 5.0 if "soft-cap" in what else None
    inp = cases.random_inputs(9, [300, 150], num_q_heads=8, num_kv_heads=2, head_dim=64, page_size=64,
                              dtype="bfloat16", q_lens=[1, 2], window_left=window, soft_cap=cap)
    plan = inp.plan("size:128", device="910b2")
    assert tl.build_tiling(inp, plan).mixed
    clean = sim.run_twin(inp, plan)
    k, v, q = inp.k_cache.copy(), inp.v_cache.copy(), inp.q.copy()
    nan_cells = []                                       # (row, query head) that must be NaN
    if what in ("nan-k", "inf-v", "minus-inf-k", "minus-inf-k-soft-cap"):
        arr = v if what == "inf-v" else k
        val = {"nan-k": np.nan, "inf-v": np.inf}.get(what, -np.inf)
        page, slot = _kv_at(inp, 0, 200)                 # request 0 (row 0), KV head 1, split 1
        arr[page, slot, 1, :] = val
        nan_cells = [(0, h) for h in range(4, 8)]
    elif what == "nan-q":
        q[2, 5, 3] = np.nan
        nan_cells = [(2, 5)]
    elif what == "nan-v-page-tail":
        page, slot = _kv_at(inp, 1, 149)                 # request 1's last page: slots 22.. unused
        v[page, slot + 1:, :, :] = np.nan
        k[page, slot + 1:, :, :] = np.nan
    elif what == "nan-v-windowed-out":
        page, slot = _kv_at(inp, 0, 10)                  # request 0 sees [199, 300) only
        v[page, slot, :, :] = np.nan
        k[page, slot, :, :] = np.nan
    elif what == "nan-v-unassigned-page":
        used = set(inp.block_table[0, :5].tolist()) | set(inp.block_table[1, :3].tolist())
        free = [p for p in range(k.shape[0]) if p not in used]
        assert free
        v[free] = np.nan
        k[free] = np.nan
    elif what in ("nan-k-causally-masked", "nan-v-causally-masked"):
        page, slot = _kv_at(inp, 1, 149)                 # request 1's last token: row 2 sees it, row 1 not
        (k if what.startswith("nan-k") else v)[page, slot, 0, :] = np.nan
        nan_cells = [(2, h) for h in range(4)]
    bad = dataclasses.replace(inp, k_cache=k, v_cache=v, q=q)
    out, lse = sim.run_twin(bad, plan)
    want_nan = np.zeros(lse.shape, bool)
    for cell in nan_cells:
        want_nan[cell] = True
    assert (np.isnan(lse) == want_nan).all(), np.argwhere(np.isnan(lse) != want_nan)
    assert np.isnan(out[want_nan]).all()
    np.testing.assert_array_equal(out[~want_nan], clean[0][~want_nan])
    np.testing.assert_array_equal(lse[~want_nan], clean[1][~want_nan])


def test_combine_merges_the_heads_of_a_kv_head_together_and_in_chunks():
    """The combine merges combineHeads query heads of one KV head at once (vectorised over the heads
    and the splits): all G for the usual shapes, fewer when the splits' partials would not fit the UB;
    both give the reference."""
    assert tl.combine_heads(128, "bfloat16", 32, 3, 4) == 4
    assert tl.combine_heads(128, "bfloat16", 64, 8, 8) == 8
    few = tl.combine_heads(256, "bfloat16", 16, 32, 8)
    assert 1 <= few < 8
    for fused in (True, False):
        inp = cases.random_inputs(12, [2000, 700], num_q_heads=16, num_kv_heads=2, head_dim=256, page_size=64,
                                  dtype="bfloat16")
        plan = inp.plan("size:64", device="910b2")
        til = tl.build_tiling(inp, plan)
        assert til.fields["combineHeads"] == few and plan.max_splits == 32
        out, lse = sim.run_twin(inp, plan, fused=fused)
        ro, rl = _ref(inp)
        np.testing.assert_allclose(out, ro, atol=2e-2, rtol=0)
        np.testing.assert_allclose(lse, rl, atol=1e-3, rtol=0)


def test_band_value_before_a_later_rows_window_stays_out_of_it():
    """Several query rows and a window narrower than q_len: a band position (AddBand's V row, read from
    the cache) that a later row's window has already left is never multiplied into that row, even by a
    zero probability (0 * NaN is NaN). Rows 1 and 2 see position L - 3, row 0 (causal) and row 3 (window
    [L - 2, L - 1]) do not."""
    inp = cases.random_inputs(21, [200], num_q_heads=4, num_kv_heads=1, head_dim=64, page_size=32,
                              dtype="bfloat16", q_lens=[4], window_left=1)
    plan = inp.plan("size:128", device="910b2")
    assert tl.build_tiling(inp, plan).mixed
    clean = sim.run_twin(inp, plan)
    v = inp.v_cache.copy()
    page, slot = _kv_at(inp, 0, 200 - 3)
    v[page, slot, 0, :] = np.nan
    out, lse = sim.run_twin(dataclasses.replace(inp, v_cache=v), plan)
    want = np.zeros(lse.shape, bool)
    want[1:3] = True
    assert (np.isnan(lse) == want).all(), np.argwhere(np.isnan(lse) != want)
    np.testing.assert_array_equal(out[~want], clean[0][~want])
    np.testing.assert_array_equal(lse[~want], clean[1][~want])


@pytest.mark.parametrize("kind", ["bf16", "fp16-soft-cap", "int8", "multi-query"])
def test_pipeline_over_several_steps_and_items(kind):
    """Items of several exchange steps (the last one short), several items per AI core (QK of the
    next item issued before the current one's last P V), empty requests between them, with fused
    and split launches, in three block orders: the same bits each time and the reference's values.
    Exercises the S / P / O slot rotation, the L1 rings and the vector cores' one-step lag."""
    kw = dict(num_q_heads=8, num_kv_heads=2, head_dim=128, page_size=128, dtype="bfloat16")
    if kind == "fp16-soft-cap":
        kw.update(dtype="float16", soft_cap=30.0)
    if kind == "int8":
        kw.update(kv_quant="channel", kv_offset=True)
    lens = [5000, 0, 2049, 300, 4100, 17]
    if kind == "multi-query":
        kw.update(q_lens=[2, 1, 3, 1, 1, 2])
    inp = cases.random_inputs(7, lens, **kw)
    small = dataclasses.replace(get_profile("910b2"), name="910b2-3-cores", units=6, cube_units=3)
    plan = inp.plan("size:4096", device="910b2")
    til = tl.build_tiling(inp, plan, small)
    f = til.fields
    assert til.block_dim == 3 and plan.num_valid_items > 6  # several items per AI core
    assert til.mixed and f["mixStepTiles"] > 1
    step = f["mixTileTokens"] * f["mixStepTiles"]
    assert max(plan.item_kv_end[:plan.num_valid_items] - plan.item_kv_start[:plan.num_valid_items]) > step
    ref_out, ref_lse = _ref(inp)
    lib = sim.twin_library()
    results = []
    for order in (0, 1, 2026):
        sim.set_block_order(lib, order)
        try:
            for fused in (True, False):
                out, lse = sim.run_twin(inp, plan, profile=small, kernel="mix", fused=fused)
                results.append((np.asarray(out), np.asarray(lse)))
        finally:
            sim.set_block_order(lib, 0)
    for out, lse in results[1:]:
        assert np.array_equal(out.view(np.uint8), results[0][0].view(np.uint8))
        assert np.array_equal(lse.view(np.uint8), results[0][1].view(np.uint8))
    out, lse = results[0]
    tol = 2e-2 if kind != "fp16-soft-cap" else 5e-3
    np.testing.assert_allclose(out, ref_out, atol=tol, rtol=tol)
    np.testing.assert_allclose(lse, ref_lse, atol=1e-4, rtol=1e-4)
