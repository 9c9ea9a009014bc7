"""``ascend_ops.tiling.TilingBuilder``: the per-step tiling of a stream of plans is what
``build_buffers`` makes for each plan, bit for bit (fields, tiling bytes, plan words), also when its
words buffer is reused across graph-stable steps."""

from __future__ import annotations

import numpy as np
import pytest

from ascend_ops import tiling as tl
from splitkv_common.plan import make_plan


def _settings(kernel, dtype="bfloat16", kv_dtype="bfloat16", d=128, hq=32, page=16, max_pages=600):
    return dict(num_q_heads=hq, head_dim=d, page_size=page, max_pages=max_pages, dtype=dtype, kv_dtype=kv_dtype,
                scale=0.088, profile="910b2", kernel=kernel)


def _stream(graph_stable, policy, hkv=8, hq=32, seed=0, steps=12, vary_rows=True):
    """Plans of one captured batch size (graph-stable) or of a changing batch, lengths moving up and
    down (requests finishing: zeros), query rows changing now and then."""
    rng = np.random.default_rng(seed)
    B = 6
    for i in range(steps):
        b = B if graph_stable else int(rng.integers(1, 9))
        seq = rng.integers(0, 9000, b)
        seq[rng.random(b) < 0.3] = 0
        q_lens = np.full(b, 1 + (vary_rows and i % 3 == 2), np.int64)
        yield seq, make_plan(seq, num_kv_heads=hkv, page_size=16, q_lens=q_lens, policy=policy, device="910b2",
                             num_q_heads=hq, head_dim=128, graph_stable=graph_stable)


def _builder_matches_step_by_step(settings, stream):
    """One builder over the stream gives what build_buffers gives for each plan: fields, bytes, words;
    past ``fresh_words`` the words are the previous step's (what an upload of only the fresh prefix
    relies on). Returns the steps whose fresh prefix was shorter than the words."""
    builder = tl.TilingBuilder(**settings)
    prev, short = None, 0
    for seq, plan in stream:
        want = tl.build_buffers(plan, seq_lens=seq, num_pages=100_000, **settings)
        got = builder.build(plan, seq, 100_000)
        assert got[0] == want[0]
        assert got[1] == want[1]
        np.testing.assert_array_equal(got[2], want[2])
        fresh = builder.fresh_words
        assert 0 < fresh <= got[2].size
        if fresh < got[2].size:
            np.testing.assert_array_equal(got[2][fresh:], prev[fresh:])
            short += 1
        prev = got[2].copy()
    return short


@pytest.mark.parametrize("graph_stable", [False, True])
@pytest.mark.parametrize("policy", ["auto", "size:512"])
@pytest.mark.parametrize("kernel", ["auto", "vector"])
def test_builder_matches_build_buffers_step_by_step(graph_stable, policy, kernel):
    s = _settings(kernel)
    short = _builder_matches_step_by_step(s, _stream(graph_stable, policy))
    # a graph-stable stream rewrites only a prefix (the items come last, padding past the valid ones)
    assert (short > 0) == graph_stable


def test_builder_reuses_its_words_across_graph_stable_steps():
    s = _settings("auto")
    builder = tl.TilingBuilder(**s)
    bufs = {builder.build(plan, seq, 1000)[2].ctypes.data for seq, plan in _stream(True, "size:256", vary_rows=False)}
    assert len(bufs) == 1


def test_builder_writes_into_the_callers_array():
    """``into``: the words go into the caller's array (what the wrapper's upload reads), after the
    fields are made; an array too small is refused by name before anything is written."""
    s = _settings("auto")
    seq, plan = next(_stream(True, "size:512"))
    want = tl.build_buffers(plan, seq_lens=seq, num_pages=100_000, **s)
    dest = np.full(want[2].size + 7, -5, np.int32)
    seen = []
    got = tl.TilingBuilder(**s).build(plan, seq, 100_000, into=lambda t, n: seen.append((t, n)) or dest)
    assert seen[0][1] == want[2].size and seen[0][0]["planWords"] == want[2].size
    assert got[2].ctypes.data == dest.ctypes.data and got[1] == want[1]
    np.testing.assert_array_equal(dest[:want[2].size], want[2])
    assert (dest[want[2].size:] == -5).all()
    small = np.full(want[2].size - 1, -5, np.int32)
    with pytest.raises(ValueError, match="into: must give"):
        tl.TilingBuilder(**s).build(plan, seq, 100_000, into=lambda t, n: small)
    assert (small == -5).all()


def test_builder_raises_what_build_buffers_raises():
    s = _settings("vector", d=100)
    plan = make_plan([300], num_kv_heads=8, page_size=16, num_q_heads=32, device="910b2")
    with pytest.raises(ValueError) as want:
        tl.build_buffers(plan, seq_lens=[300], num_pages=100, **s)
    with pytest.raises(ValueError) as got:
        tl.TilingBuilder(**s).build(plan, [300], 100)
    assert str(got.value) == str(want.value)


def _balance_reference(plan, cores, overhead_tokens=tl.MIX_ITEM_OVERHEAD_TOKENS):
    """balance_items as first written: weights over every item, one search per core."""
    valid = np.asarray(plan.item_request) >= 0
    w = np.where(valid, np.maximum(0, np.asarray(plan.item_kv_end) - np.asarray(plan.item_kv_start))
                 + overhead_tokens, 0).astype(np.float64)
    bounds = np.zeros(cores + 1, np.int64)
    bounds[cores] = w.shape[0]
    total = w.sum()
    if w.shape[0] == 0 or total <= 0:
        return bounds.astype(np.int32)
    owner = np.minimum(cores - 1, np.floor((np.cumsum(w) - w / 2) * cores / total)).astype(np.int64)
    for c in range(1, cores):
        bounds[c] = np.searchsorted(owner, c, side="left")
    return bounds.astype(np.int32)


def test_balance_items_over_the_valid_prefix_is_the_full_computation():
    rng = np.random.default_rng(3)
    for _ in range(60):
        B = int(rng.integers(1, 40))
        seq = rng.integers(0, 20000, B)
        seq[rng.random(B) < 0.3] = 0
        plan = make_plan(seq, num_kv_heads=int(rng.choice([1, 2, 8])), page_size=16, device="910b2",
                         policy=str(rng.choice(["auto", "size:256", "none", "count:3"])),
                         graph_stable=bool(rng.integers(2)))
        for cores in (1, 2, 20, 24, 48):
            np.testing.assert_array_equal(tl.balance_items(plan, cores), _balance_reference(plan, cores))


@pytest.mark.parametrize("kernel", ["auto", "vector"])
@pytest.mark.parametrize("mode", [dict(all_cores=True), dict(device_split_tokens=512)])
def test_builder_matches_build_buffers_with_all_cores_and_device_splits(kernel, mode):
    """The wrapper's graph modes: every core (a captured launch keeps its block count) and device-made
    ranges (``device_split_tokens``: ranges from the lengths on the device, items per (request, KV head,
    split))."""
    s = dict(_settings(kernel), **mode)
    _builder_matches_step_by_step(s, _stream(True, "size:512" if "device_split_tokens" in mode else "auto"))


def test_builder_refuses_what_build_buffers_refuses_in_device_split_mode():
    """``device_split_tokens``: a length past ``S * max_splits`` is refused on every step, not only on
    the first plan of a key (the builder's per-plan check, with build_buffers' message)."""
    s = dict(_settings("auto"), device_split_tokens=512)
    builder = tl.TilingBuilder(**s)
    seq, plan = next(_stream(True, "size:512"))
    builder.build(plan, seq, 100_000)
    too_long = np.asarray(seq).copy()
    too_long[0] = 512 * (plan.num_slots // plan.num_rows) + 1
    with pytest.raises(ValueError) as want:
        tl.build_buffers(plan, seq_lens=too_long, num_pages=100_000, **s)
    with pytest.raises(ValueError) as got:
        builder.build(plan, too_long, 100_000)
    assert str(got.value) == str(want.value) and "device_split_tokens * max_splits" in str(got.value)


def _words_both_ways(builder_settings, plan, seq, monkeypatch):
    """The builder's words through the C module and through NumPy (the module hidden)."""
    got = tl.TilingBuilder(**builder_settings).build(plan, seq, 100_000)
    with monkeypatch.context() as m:
        m.setattr(tl._native, "load", lambda: None)
        want = tl.TilingBuilder(**builder_settings).build(plan, seq, 100_000)
    return got, want


@pytest.mark.skipif(tl._native.load() is None, reason="the C planner's module is not built here")
@pytest.mark.parametrize("seed", range(6))
def test_words_and_core_balance_in_c_are_numpys(seed, monkeypatch):
    """``ascend_words`` (the C module) writes the words and balances the items over the AI cores as
    ``plan_words`` and ``balance_items`` do in NumPy: ragged lengths, empty requests, graph-stable
    padding, multi-query rows, one request longer than the rest."""
    rng = np.random.default_rng(seed)
    B = int(rng.integers(1, 40))
    seq = rng.integers(0, 20000, B)
    seq[rng.random(B) < 0.2] = 0
    if seed % 2:
        seq[0] = 200_000
    q_lens = rng.integers(1, 4, B)
    for graph_stable in (False, True):
        plan = make_plan(seq, num_kv_heads=8, page_size=16, q_lens=q_lens, policy="auto", device="910b2",
                         num_q_heads=32, head_dim=128, graph_stable=graph_stable)
        got, want = _words_both_ways(_settings("auto", max_pages=200_000 // 16 + 1), plan, seq, monkeypatch)
        assert got[0] == want[0] and got[1] == want[1]
        np.testing.assert_array_equal(got[2], want[2])
        if got[0]["kernelKind"] == 1:   # the mixed kernel: its core ranges are balance_items'
            at, n = got[0]["coreRangeOffset"], got[0]["blockDim"] + 1
            np.testing.assert_array_equal(got[2][at:at + n], tl.balance_items(plan, got[0]["blockDim"]))


@pytest.mark.skipif(tl._native.load() is None, reason="the C planner's module is not built here")
def test_c_balance_hands_back_a_sum_past_int64():
    """Weights whose doubled sum times the cores passes int64 are left to NumPy (None, nothing
    claimed): 2**20 items of 2**31 - 65 tokens over 4,096 cores."""
    mod = tl._native.load()
    W = 1 << 20
    items = np.zeros((5, W), np.int32)
    items[4] = 2**31 - 65   # with the 64-token overhead: 2**31 - 1, the most an int32 weight holds
    q = np.zeros(2, np.int32)
    out = np.zeros(5 * W + 2 + 1 + 1 + 1 + 4097, np.int32)
    assert mod.ascend_words(items, W, W, q, np.array([5]), q[:1], q[:1], 4096, 64, out) is None
    assert mod.ascend_words(items, W, W, q, np.array([5]), q[:1], q[:1], 0, 64, out) == 5 * W + 5
    # one weight past int32 (2**31 - 1 tokens and the overhead wrap in NumPy's int32): NumPy again
    items[4, 0] = 2**31 - 1
    assert mod.ascend_words(items, W, W, q, np.array([5]), q[:1], q[:1], 4, 64, out[:5 * W + 10]) is None
