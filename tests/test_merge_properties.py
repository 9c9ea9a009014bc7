"""Property-based tests of the merge: commutative and associative up to rounding, any split of the same
history gives the float64 answer, and empty splits change nothing."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from splitkv_common.parity.cases import random_inputs
from splitkv_common.merge import merge_pair, merge_states
from splitkv_common.reference import dense_attention, partial_state, split_attention
from splitkv_common.states import mlu_to_state

torch = pytest.importorskip("torch")
from splitkv_common import torch_eager  # noqa: E402
from splitkv_common.parity.backends import torch_backend  # noqa: E402

FAST = settings(max_examples=50, deadline=None)
SLOWER = settings(max_examples=30, deadline=None)


@st.composite
def states(draw, min_splits=1, max_splits=8):
    """``(o [S, D], lse [S])`` float32 with some empty states (-inf)."""
    s = draw(st.integers(min_splits, max_splits))
    d = draw(st.integers(1, 4))
    o = draw(hnp.arrays(np.float32, (s, d), elements=st.floats(-10, 10, width=32)))
    lse = draw(hnp.arrays(np.float32, (s,), elements=st.floats(-60, 60, width=32)))
    empty = draw(hnp.arrays(np.bool_, (s,)))
    lse = np.where(empty, np.float32(-np.inf), lse).astype(np.float32)
    o = np.where(empty[:, None], np.float32(0), o).astype(np.float32)
    return o, lse


def assert_same_state(a, b, atol=2e-5):
    (oa, la), (ob, lb) = a, b
    np.testing.assert_array_equal(np.isneginf(la), np.isneginf(lb))
    assert not np.isnan(oa).any() and not np.isnan(la).any()
    fin = np.isfinite(la)
    np.testing.assert_allclose(la[fin], lb[fin], rtol=1e-6, atol=1e-5)
    np.testing.assert_allclose(oa, ob, rtol=1e-5, atol=atol)


# --- algebra ----------------------------------------------------------------------------------


@FAST
@given(states(), st.randoms(use_true_random=False))
def test_merge_is_commutative_up_to_rounding(st_, rnd):
    o, lse = st_
    perm = list(range(len(lse)))
    rnd.shuffle(perm)
    assert_same_state(merge_states(o, lse), merge_states(o[perm], lse[perm]))


@FAST
@given(states(min_splits=2), st.data())
def test_merge_is_associative_up_to_rounding(st_, data):
    o, lse = st_
    k = data.draw(st.integers(1, len(lse) - 1))
    left = merge_states(o[:k], lse[:k])
    right = merge_states(o[k:], lse[k:])
    whole = merge_states(o, lse)
    assert_same_state(merge_pair(*left, *right), whole)
    # a deeper tree: ((first, middle), rest) with a second cut
    if len(lse) > 2 and k < len(lse) - 1:
        j = data.draw(st.integers(k + 1, len(lse) - 1))
        mid = merge_states(o[k:j], lse[k:j])
        rest = merge_states(o[j:], lse[j:])
        assert_same_state(merge_pair(*merge_pair(*left, *mid), *rest), whole)


@FAST
@given(states(), st.data())
def test_empty_splits_change_nothing(st_, data):
    o, lse = st_
    n_empty = data.draw(st.integers(1, 4))
    eo, el = list(o), list(lse)
    for _ in range(n_empty):
        pos = data.draw(st.integers(0, len(el)))
        garbage = data.draw(hnp.arrays(np.float32, (o.shape[1],), elements=st.floats(-2.0**100, 2.0**100, width=32)))
        eo.insert(pos, garbage)
        el.insert(pos, data.draw(st.sampled_from([-np.inf, np.inf])))
    eo, el = np.array(eo, np.float32), np.array(el, np.float32)
    base = merge_states(o, lse)
    assert_same_state(merge_states(eo, el), base)
    t = torch_eager.merge_states(torch.from_numpy(eo), torch.from_numpy(el))
    assert_same_state((t[0].numpy(), t[1].numpy()), base)


# --- any split of the same history --------------------------------------------------------------


def _history(data, max_len=60):
    n = data.draw(st.integers(1, max_len))
    d = data.draw(st.integers(1, 6))
    big = data.draw(st.sampled_from([1.0, 30.0, 300.0]))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    s = rng.standard_normal(n) * big
    v = rng.standard_normal((n, d))
    cuts = sorted(data.draw(st.lists(st.integers(0, n), max_size=8)))
    bounds = [0] + cuts + [n]
    return s, v, list(zip(bounds[:-1], bounds[1:]))


@FAST
@given(st.data())
def test_hand_made_partition_seed_states_merge_to_the_float64_answer(data):
    s, v, parts = _history(data)
    m_all = s.max()
    w = np.exp(s - m_all)
    ref = (w[:, None] * v).sum(0) / w.sum()
    ref_lse = m_all + math.log(w.sum())
    os_, ls = [], []
    for a, b in parts:  # the seed's (m, l, u) of each part, empty parts included
        if b > a:
            m = s[a:b].max()
            e = np.exp(s[a:b] - m)
            o, lse = mlu_to_state(np.array(m), np.array(e.sum()), (e[:, None] * v[a:b]).sum(0))
        else:
            o, lse = mlu_to_state(np.array(-np.inf), np.array(0.0), np.zeros(v.shape[1]))
        os_.append(o)
        ls.append(lse)
    order = data.draw(st.permutations(range(len(parts))))
    out, lse = merge_states(np.stack(os_)[list(order)], np.stack(ls)[list(order)])
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5 * max(1.0, np.abs(v).max()))
    assert float(lse) == pytest.approx(ref_lse, rel=1e-6, abs=1e-5)


@FAST
@given(st.data())
def test_hand_made_partition_with_masks_float32_partials(data):
    """Kernel-style float32 partials of any partition, with positions masked; fully masked parts are empty."""
    s, v, parts = _history(data)
    mask = data.draw(hnp.arrays(np.bool_, s.shape))
    os_, ls = [], []
    for a, b in parts:
        with np.errstate(over="raise", invalid="raise", divide="raise"):
            o, lse = partial_state(s[a:b], v[a:b], mask[a:b])
        if not mask[a:b].any():
            assert np.all(o == 0) and np.isneginf(lse)
        os_.append(o)
        ls.append(lse)
    out, lse = merge_states(np.stack(os_), np.stack(ls))
    if not mask.any():
        assert np.all(out == 0) and np.isneginf(lse)
        return
    sm = s[mask]
    w = np.exp(sm - sm.max())
    ref = (w[:, None] * v[mask]).sum(0) / w.sum()
    # float32 scores of magnitude |s|: rounding of s itself moves the weights by ~|s| * 2^-24
    tol = 1e-5 * max(1.0, np.abs(sm).max() / 10)
    np.testing.assert_allclose(out, ref, rtol=tol, atol=tol * max(1.0, np.abs(v).max()))
    assert float(lse) == pytest.approx(sm.max() + math.log(w.sum()), rel=1e-6, abs=1e-4)


@st.composite
def batches(draw):
    b = draw(st.integers(1, 3))
    page = draw(st.sampled_from([1, 2, 3, 8, 16]))
    seq = draw(st.lists(st.integers(0, 70), min_size=b, max_size=b))
    q_lens = draw(st.lists(st.integers(1, 3), min_size=b, max_size=b))
    hkv = draw(st.integers(1, 2))
    group = draw(st.sampled_from([1, 2, 3]))
    window = draw(st.one_of(st.none(), st.integers(0, 30)))
    if draw(st.booleans()):
        policy = f"size:{page * draw(st.integers(1, 5))}"
    else:
        policy = f"count:{draw(st.integers(1, 9))}"
    seed = draw(st.integers(0, 2**31 - 1))
    inp = random_inputs(seed, seq, num_q_heads=hkv * group, num_kv_heads=hkv, head_dim=8, page_size=page,
                        q_lens=q_lens, window_left=window, q_scale=draw(st.sampled_from([1.0, 8.0])))
    return inp, policy


@SLOWER
@given(batches())
def test_any_plan_of_the_same_history_gives_the_float64_answer(batch):
    inp, policy = batch
    inp.validate()
    ref, ref_lse = dense_attention(inp)
    unit = max(1.0, np.abs(ref).max())
    for pol in (policy, "none"):
        plan = inp.plan(pol, device="h200")
        for out, lse in (split_attention(inp, plan), torch_backend.run(inp, plan)):
            assert not np.isnan(out).any() and not np.isnan(lse).any()
            np.testing.assert_allclose(out / unit, ref / unit, atol=3e-5, rtol=0)
            np.testing.assert_array_equal(np.isneginf(lse), np.isneginf(ref_lse))
            fin = np.isfinite(ref_lse)
            np.testing.assert_allclose(lse[fin], ref_lse[fin], rtol=1e-5, atol=1e-4)
