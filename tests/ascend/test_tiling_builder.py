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
    """One builder over the stream gives what build_buffers gives for each plan: fields, bytes, words."""
    builder = tl.TilingBuilder(**settings)
    for seq, plan in stream:
        want = tl.build_buffers(plan, seq_lens=seq, num_pages=100_000, **settings)
        got = builder.build(plan, seq, 100_000)
        assert got[0] == want[0]
        assert got[1] == want[1]
        np.testing.assert_array_equal(got[2], want[2])


@pytest.mark.parametrize("graph_stable", [False, True])
@pytest.mark.parametrize("policy", ["auto", "size:512"])
@pytest.mark.parametrize("kernel", ["auto", "vector"])
def test_builder_matches_build_buffers_step_by_step(graph_stable, policy, kernel):
    s = _settings(kernel)
    _builder_matches_step_by_step(s, _stream(graph_stable, policy))


def test_builder_reuses_its_words_across_graph_stable_steps():
    s = _settings("auto")
    builder = tl.TilingBuilder(**s)
    bufs = {id(builder.build(plan, seq, 1000)[2]) for seq, plan in _stream(True, "size:256", vary_rows=False)}
    assert len(bufs) == 1


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
