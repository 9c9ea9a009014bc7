"""int8 KV on the mixed AIC + AIV split stage (``splitkv_split_mix``) on the CPU twin.

CANN IFA's MSD route: q' = q * k_scale and the probabilities are expanded into int8 rows and the
cube multiplies them with the raw int8 K and V (int32 results); the K offset term ``q' . k_offset``
is taken per row (in the lse, or on every score under a soft cap), the V scale and offset applied
to the output (docs/ascend-kernel.md, "int8 KV on the mixed split stage"). Judged against the float64
reference and against the vector-only kernel, which dequantises every token in float32. A test
double: nothing here ran on an NPU.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from splitkv_common.parity import cases
from splitkv_common.parity.accuracy import check
from splitkv_common.reference import dense_attention, plain_attention

sim = pytest.importorskip("ascend_ops.sim_backend")
from ascend_ops import tiling as tl  # noqa: E402

pytestmark = pytest.mark.skipif(sim.compiler_missing() is not None, reason=str(sim.compiler_missing()))


def _judge(inp, plan, kernel):
    out, lse = sim.run_twin(inp, plan, kernel=kernel)
    ro, rl = dense_attention(inp)
    return check(out, lse, ro, rl, plain_attention(inp), inp.dtype), (out, lse)


@pytest.mark.parametrize("name", [c.name for c in cases.catalog(("small",), "int8*")
                                  if c.build().dtype != "float32"])
def test_catalog_int8_cases_take_the_mixed_kernel_and_match_the_vector_kernel(name):
    case = cases.get_case(name)
    inp = case.build()
    plan = inp.plan(case.policy, device="910b2", **case.plan_kwargs)
    assert tl.build_tiling(inp, plan).mixed
    mix, _ = _judge(inp, plan, "mix")
    vec, _ = _judge(inp, plan, "vector")
    assert mix.passed and vec.passed, (mix.reason, vec.reason)
    # the output error is the output rounding's in both (the mixed kernel's expanded P adds less
    # than that); the lse keeps float accuracy (q' in three int8 steps, l over the float P)
    assert mix.out_max <= 2 * vec.out_max + 1e-6, (mix.out_max, vec.out_max)
    assert mix.lse_max <= 2 * vec.lse_max + 1e-6, (mix.lse_max, vec.lse_max)


def _stress(dtype, **kw):
    inp = cases.random_inputs(61, [700, 1, 0, 300], num_q_heads=16, num_kv_heads=2, head_dim=128, page_size=64,
                              dtype=dtype, kv_quant="channel", kv_offset=True, q_lens=[1, 1, 1, 3], **kw)
    # large offsets: the K offset term q . (scale * offset) is then many times the score itself
    rng = np.random.default_rng(5)
    big = rng.uniform(-100, 100, inp.k_offset.shape).round().astype(np.float32)
    return dataclasses.replace(inp, k_offset=big, v_offset=big[::-1].copy())


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("extra", [{}, {"window_left": 200}, {"soft_cap": 20.0}])
def test_large_offsets_window_soft_cap_and_mtp(dtype, extra):
    inp = _stress(dtype, **extra)
    plan = inp.plan("size:256", device="910b2")
    mix, (out, lse) = _judge(inp, plan, "mix")
    vec, _ = _judge(inp, plan, "vector")
    assert mix.passed, mix.reason
    assert mix.out_max <= 2 * vec.out_max + 1e-6, (mix.out_max, vec.out_max)
    assert mix.lse_max <= 2 * vec.lse_max + 1e-5, (mix.lse_max, vec.lse_max)
    assert np.isneginf(lse[2]).all() and (out[2] == 0).all()  # request 2 is empty
    assert np.isfinite(np.delete(lse, 2, axis=0)).all()


@pytest.mark.parametrize("order", [1, 777])
def test_block_orders_give_identical_results(order):
    inp = _stress("bfloat16", window_left=300)
    plan = inp.plan("size:128", device="910b2")
    lib = sim.twin_library()
    base = sim.run_twin(inp, plan, kernel="mix")
    sim.set_block_order(lib, order)
    try:
        got = sim.run_twin(inp, plan, kernel="mix")
    finally:
        sim.set_block_order(lib, 0)
    np.testing.assert_array_equal(got[0], base[0])
    np.testing.assert_array_equal(got[1], base[1])


def test_int8_scratch_and_ub_are_what_the_kernel_uses():
    """The workspace holds the partials plus, per AI core, the scratch with the expanded rows (int32
    S and O, int8 P and q); the twin's measured UB equals the host's figure (the guard after the
    workspace intact)."""
    inp = cases.random_inputs(63, [500, 77], num_q_heads=8, num_kv_heads=2, head_dim=96, page_size=16,
                              dtype="bfloat16", kv_quant="channel", kv_offset=True, q_lens=[2, 1])
    plan = inp.plan("size:128", device="910b2")
    ws, peak, til = sim.run_split(inp, plan, guard_bytes=4096)
    f = til.fields
    assert til.mixed and peak == f["mixUbBytes"] <= tl.UB_BYTES
    step = f["mixTileTokens"] * f["mixStepTiles"]
    assert f["scratchCoreBytes"] == tl.mix_scratch_core_bytes(96, "bfloat16", step, f["mixRowsPad"], "int8")
    assert f["scratchCoreBytes"] > tl.mix_scratch_core_bytes(96, "bfloat16", step, f["mixRowsPad"])
    assert (ws[til.workspace_bytes:] == sim.WS_POISON).all()


# --- int8 KV with multi-query rows, windows, the NaN rule and graph mode ---------------------------

def _mtp(dtype, window=None, seed=64):
    """Several query rows per request (q_len 1 to 4, G 4) on int8 KV per channel with offsets, and an
    empty request; the window (if any) narrower than some q_len, so that later rows' windows start
    inside the causal band."""
    return cases.random_inputs(seed, [530, 77, 0, 300], num_q_heads=8, num_kv_heads=2, head_dim=64, page_size=32,
                               dtype=dtype, kv_quant="channel", kv_offset=True, q_lens=[4, 2, 3, 1],
                               window_left=window)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("window", [None, 1, 37, 200])
def test_multi_query_rows_band_and_window(dtype, window):
    """Several query rows: the causal band needs no pass of its own with int8 KV (P is 0 where a row
    cannot see, and integer products are never NaN); positions before the window and the tile tail
    are zero rows of the cube's loads. Out and lse as the float32 vector kernel's (within 2x), the
    empty request 0 / -inf."""
    inp = _mtp(dtype, window)
    plan = inp.plan("size:128", device="910b2")
    til = tl.build_tiling(inp, plan)
    assert til.mixed and til.fields["maxQLen"] == 4
    mix, (out, lse) = _judge(inp, plan, "mix")
    vec, _ = _judge(inp, plan, "vector")
    assert mix.passed and vec.passed, (mix.reason, vec.reason)
    assert mix.out_max <= 2 * vec.out_max + 1e-6, (mix.out_max, vec.out_max)
    assert mix.lse_max <= 2 * vec.lse_max + 1e-5, (mix.lse_max, vec.lse_max)
    empty = slice(6, 9)  # request 2's query rows
    assert np.isneginf(lse[empty]).all() and (out[empty] == 0).all()


def _poison_quant(inp, what):
    """int8 inputs with one scale / offset row or one q value made NaN or inf, and the (row, query
    head) cells that must then be NaN (docs/conventions.md: a NaN / inf in a dequantised K or V value a
    row sees makes it NaN; a row that sees nothing stays 0 / -inf)."""
    T, Hq, D = inp.q.shape
    hkv = inp.k_cache.shape[2]
    G = Hq // hkv
    seen = np.repeat(inp.seq_lens, np.diff(inp.query_start_loc)) > 0  # rows that see a position
    quant = {n: np.broadcast_to(np.asarray(getattr(inp, n), np.float32).reshape(hkv, -1), (hkv, D)).copy()
             for n in ("k_scale", "k_offset", "v_scale", "v_offset")}
    q = inp.q.copy()
    h = 1
    if what == "nan-q":
        q[1, 5, 7] = np.nan
        return dataclasses.replace(inp, q=q), [(1, 5)]
    name, val = {"nan-k-scale": ("k_scale", np.nan), "inf-k-offset": ("k_offset", np.inf),
                 "nan-v-scale": ("v_scale", np.nan), "inf-v-offset": ("v_offset", -np.inf)}[what]
    quant[name][h, 3] = val
    cells = [(r, hq) for r in range(T) if seen[r] for hq in range(h * G, (h + 1) * G)]
    return dataclasses.replace(inp, **quant), cells


@pytest.mark.parametrize("what", ["nan-q", "nan-k-scale", "inf-k-offset", "nan-v-scale", "inf-v-offset"])
def test_nan_rule_with_int8_kv(what):
    """A NaN / inf q value makes its (row, head) NaN; a NaN / inf K scale or offset channel of a KV
    head (it reaches q' or beta, so every visible score) or V scale or offset channel (every dequantised
    V row; checked once per item) makes every row of that head that sees a position NaN, out and lse;
    the empty request stays 0 / -inf and every other cell is bit-identical to the clean run. Mixed
    kernel, fused launch, several query rows and a window."""
    inp = _mtp("bfloat16", window=100)
    plan = inp.plan("size:128", device="910b2")
    assert tl.build_tiling(inp, plan).mixed
    clean = sim.run_twin(inp, plan)
    bad, cells = _poison_quant(inp, what)
    out, lse = sim.run_twin(bad, plan)
    want = np.zeros(lse.shape, bool)
    for cell in cells:
        want[cell] = True
    assert want.any()
    assert (np.isnan(lse) == want).all(), np.argwhere(np.isnan(lse) != want)
    assert np.isnan(out[want]).all()
    np.testing.assert_array_equal(out[~want], clean[0][~want])
    np.testing.assert_array_equal(lse[~want], clean[1][~want])


@pytest.mark.parametrize("window", [None, 300])
def test_graph_mode_replays_with_int8_kv(window):
    """Graph mode (deviceSplitTokens): one tiling, new lengths only in the plan's seqLens section; the
    int8 mixed kernel gives the reference for each set of lengths (the scratch sized for the largest
    tile and rows holds the expanded int8 rows too) and a fresh host plan's bits (a windowed request's
    first range starts on a page boundary in both)."""
    split, cap = 256, 8
    full = cases.random_inputs(11, [2048, 2048, 2048, 2048], num_q_heads=8, num_kv_heads=2, head_dim=64,
                               page_size=64, dtype="bfloat16", kv_quant="channel", kv_offset=True,
                               q_lens=[1, 2, 1, 1], window_left=window)
    first = dataclasses.replace(full, seq_lens=np.array([700, 33, 0, 1200], np.int32))
    plan = first.plan(f"size:{split}", device="910b2", graph_stable=True, max_splits=cap)
    til = tl.build_tiling(first, plan, device_split_tokens=split)
    assert til.mixed and til.fields["deviceSplitTokens"] == split
    assert til.fields["scratchCoreBytes"] == tl.mix_scratch_max_bytes(64, "bfloat16", "int8", False)
    for lens in ([700, 33, 0, 1200], [1500, 2, 64, 2048], [1, 2, 1, 1], [0, 300, 2048, 257]):
        inp = dataclasses.replace(full, seq_lens=np.array(lens, np.int32))
        out, lse = sim.run_tiling(inp, plan, sim.with_seq_lens(til, lens))
        res = check(out, lse, *dense_attention(inp), plain_attention(inp), inp.dtype)
        assert res.passed, (lens, res.reason)
        fresh = sim.run_twin(inp, inp.plan(f"size:{split}", device="910b2", graph_stable=True, max_splits=cap))
        np.testing.assert_array_equal(out, fresh[0], err_msg=str(lens))
        np.testing.assert_array_equal(lse, fresh[1], err_msg=str(lens))
