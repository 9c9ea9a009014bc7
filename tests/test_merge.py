"""The exact merge (seed sections 03/04; conventions: "Split state and merge")."""

import math

import numpy as np
import pytest

from splitkv_common.explain import block_bounds, explain
from splitkv_common.merge import merge_pair, merge_rows, merge_states, naive_average
from splitkv_common.states import mlu_to_state, state_to_mlu

LN = math.log


def seed_blocks():
    """Block A (positions 0-1) and B (2-3) of the seed as (o, lse) states, computed from (m, l, u)."""
    return mlu_to_state(np.array([LN(2), LN(4)]), np.array([1.5, 1.75]), np.array([[2.5], [11.0]]))


def merge_by_formula(o, lse):
    """The convention's merge written out row by row in float64 (independent of the package)."""
    o = np.asarray(o, np.float64)
    lse = np.asarray(lse, np.float64)
    out = np.zeros(o.shape[1:])
    out_lse = np.full(lse.shape[1:], -np.inf)
    for idx in np.ndindex(*lse.shape[1:]):
        ls = [x for x in lse[(slice(None),) + idx] if np.isfinite(x)]
        if not ls:
            continue
        m = max(ls)
        num = np.zeros(o.shape[-1])
        den = 0.0
        for i in range(lse.shape[0]):
            li = lse[(i,) + idx]
            if np.isfinite(li):
                w = math.exp(li - m)
                num += w * o[(i,) + idx]
                den += w
        out[idx] = num / den
        out_lse[idx] = m + math.log(den)
    return out, out_lse


# --- the seed's numbers -----------------------------------------------------------------------


def test_seed_two_blocks_merge_to_4_9_not_the_average_3_976():
    o, lse = seed_blocks()
    out, out_lse = merge_states(o, lse)
    assert out.shape == (1,) and out.dtype == np.float32
    assert float(out[0]) == pytest.approx(4.9, rel=1e-6)
    assert float(out_lse) == pytest.approx(LN(10), rel=1e-6)  # weights 1+2+3+4
    avg = float(naive_average(o)[0])
    assert avg == pytest.approx((5 / 3 + 44 / 7) / 2, rel=1e-6)
    assert round(avg, 3) == 3.976
    assert abs(avg - float(out[0])) > 0.9


def test_seed_merged_l_and_u_against_the_common_max():
    o, lse = seed_blocks()
    out, out_lse = merge_states(o, lse)
    mlu = state_to_mlu(out[None].astype(np.float64), np.array([out_lse]), m=np.array([LN(4)]))
    assert float(mlu.l[0]) == pytest.approx(2.5, rel=1e-6)
    assert float(mlu.u[0, 0]) == pytest.approx(12.25, rel=1e-6)
    # block weights in the full softmax: 3/10 and 7/10 (contributions 0.5 and 4.4)
    w = np.exp(lse - out_lse)
    np.testing.assert_allclose(w, [0.3, 0.7], rtol=1e-6)
    np.testing.assert_allclose(w * o[:, 0], [0.5, 4.4], rtol=1e-6)


@pytest.mark.parametrize("splits", [1, 2, 3, 4])
def test_explain_any_number_of_blocks_gives_4_9(splits):
    e = explain(splits)
    assert e.full_out == pytest.approx(4.9, rel=1e-12)
    assert e.merged_out == pytest.approx(4.9, rel=1e-6)
    assert e.merged_lse == pytest.approx(LN(10), rel=1e-6)
    assert e.merged_l == pytest.approx(2.5, rel=1e-6) and e.merged_u == pytest.approx(12.25, rel=1e-6)
    assert [p for b in e.blocks for p in b.positions] == [0, 1, 2, 3]
    local = [b.u / b.l for b in e.blocks]
    assert e.naive_average == pytest.approx(sum(local) / splits, rel=1e-6)
    if splits > 1:
        assert abs(e.naive_average - 4.9) > 0.1


def test_explain_two_blocks_have_the_seed_states():
    a, b = explain(2).blocks
    assert (a.m, a.l, a.u) == pytest.approx((LN(2), 1.5, 2.5))
    assert (b.m, b.l, b.u) == pytest.approx((LN(4), 1.75, 11.0))
    assert a.out == pytest.approx(5 / 3, rel=1e-6) and b.out == pytest.approx(44 / 7, rel=1e-6)
    assert explain(2).naive_average == pytest.approx(3.976, abs=5e-4)


def test_block_bounds():
    assert block_bounds(4, 3) == [(0, 2), (2, 3), (3, 4)]
    assert block_bounds(4, 1) == [(0, 4)]
    for bad in (0, 5):
        with pytest.raises(ValueError, match="splits"):
            block_bounds(4, bad)


# --- the formula ------------------------------------------------------------------------------


@pytest.mark.parametrize("num_splits", [1, 2, 5, 17])
def test_merge_equals_the_formula(num_splits):
    rng = np.random.default_rng(num_splits)
    o = rng.standard_normal((num_splits, 3, 4, 8)).astype(np.float32)
    lse = (rng.standard_normal((num_splits, 3, 4)) * 10).astype(np.float32)
    lse[0, 0, 0] = -np.inf
    if num_splits > 1:
        lse[1, 1, 1] = np.inf
    out, out_lse = merge_states(o, lse)
    ref, ref_lse = merge_by_formula(o, np.where(np.isposinf(lse), -np.inf, lse))
    assert out.shape == (3, 4, 8) and out_lse.shape == (3, 4)
    assert out.dtype == np.float32 and out_lse.dtype == np.float32
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out_lse, ref_lse, rtol=1e-6, atol=1e-6)


def test_merge_along_another_axis():
    rng = np.random.default_rng(7)
    o = rng.standard_normal((3, 5, 4)).astype(np.float32)    # [rows, splits, D]
    lse = rng.standard_normal((3, 5)).astype(np.float32)
    a = merge_states(o, lse, axis=1)
    b = merge_states(np.moveaxis(o, 1, 0), lse.T, axis=0)
    c = merge_states(o, lse, axis=-1)
    for x, y in ((a, b), (a, c)):
        np.testing.assert_allclose(x[0], y[0], rtol=1e-6)
        np.testing.assert_allclose(x[1], y[1], rtol=1e-6)


def test_merge_with_huge_lse_does_not_overflow():
    o = np.array([[1.0], [3.0], [5.0]], np.float32)
    lse = np.array([3.0e4, 3.0e4 - 1.0, -3.0e4], np.float32)  # exactly representable in float32
    with np.errstate(over="raise", invalid="raise", divide="raise"):  # exp(-6e4) may underflow to 0
        out, out_lse = merge_states(o, lse)
    w = math.exp(-1.0)
    assert float(out[0]) == pytest.approx((1 + 3 * w) / (1 + w), rel=1e-6)
    assert float(out_lse) == pytest.approx(3.0e4 + math.log1p(w), rel=1e-7)


# --- empty splits -----------------------------------------------------------------------------


def test_empty_splits_contribute_nothing():
    o, lse = seed_blocks()
    o3 = np.concatenate([o, [[1e6]], [[-42.0]]]).astype(np.float32)  # garbage o in empty states
    lse3 = np.concatenate([lse, [-np.inf, np.inf]]).astype(np.float32)
    out, out_lse = merge_states(o3, lse3)
    assert float(out[0]) == pytest.approx(4.9, rel=1e-6)
    assert float(out_lse) == pytest.approx(LN(10), rel=1e-6)


@pytest.mark.parametrize("sentinel", [-np.inf, np.inf])
def test_all_empty_gives_zero_and_minus_inf_never_nan(sentinel):
    o = np.full((3, 2, 4), 7.0, np.float32)
    lse = np.full((3, 2), sentinel, np.float32)
    with np.errstate(all="raise"):  # no exp(-inf - -inf), no 0/0
        out, out_lse = merge_states(o, lse)
    assert np.all(out == 0) and np.all(np.isneginf(out_lse))
    assert not np.isnan(out).any()


def test_single_state_passes_through_and_plus_inf_becomes_minus_inf():
    o = np.array([[[2.0, -1.0]], [[5.0, 5.0]]], np.float32)[:, None]  # [rows 2, splits 1, H 1, D 2]
    out, lse = merge_states(o, np.array([0.25, np.inf], np.float32).reshape(2, 1, 1), axis=1)
    np.testing.assert_allclose(out[0], [[2.0, -1.0]])
    assert lse[0, 0] == np.float32(0.25)
    assert np.all(out[1] == 0) and np.isneginf(lse[1, 0])


def test_merge_errors():
    with pytest.raises(ValueError, match="o: shape"):
        merge_states(np.zeros((2, 3, 4)), np.zeros((2, 4)))
    with pytest.raises(ValueError, match="split axis is empty"):
        merge_states(np.zeros((0, 3, 4)), np.zeros((0, 3)))
    with pytest.raises(ValueError, match="lse"):
        merge_states(np.zeros(4), np.zeros(()))


def test_merge_propagates_nan_like_the_torch_merge():
    out, lse = merge_states(np.zeros((2, 4)), np.array([0.0, np.nan]))
    assert np.isnan(out).all() and np.isnan(lse)
    out, lse = merge_states(np.array([[np.nan] * 4, [1.0] * 4]), np.array([-np.inf, 0.0]))
    assert np.array_equal(out, np.ones(4, np.float32)) and lse == 0  # an empty state's o is ignored
    out, lse = merge_states(np.array([[np.inf] * 4, [1.0] * 4]), np.array([0.0, 0.0]))
    assert np.isnan(out).all() and np.isfinite(lse)


# --- pairs and plan rows ----------------------------------------------------------------------


def test_merge_pair_equals_merge_states():
    rng = np.random.default_rng(11)
    oa, ob = rng.standard_normal((2, 5, 3, 8)).astype(np.float32)
    la, lb = rng.standard_normal((2, 5, 3)).astype(np.float32)
    la[0, 0] = np.inf
    lb[1, 1] = -np.inf
    a = merge_pair(oa, la, ob, lb)
    b = merge_states(np.stack([oa, ob]), np.stack([la, lb]))
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_array_equal(a[1], b[1])


def test_merge_rows_reads_each_rows_slots():
    rng = np.random.default_rng(12)
    po = rng.standard_normal((9, 2, 4)).astype(np.float32)
    pl = rng.standard_normal((9, 2)).astype(np.float32)
    starts = np.array([0, 3, 3, 5, 8])
    counts = np.array([3, 0, 2, 3, 1])
    out, lse = merge_rows(po, pl, starts, counts)
    assert out.shape == (5, 2, 4) and lse.shape == (5, 2)
    for t, (s, c) in enumerate(zip(starts, counts)):
        if c == 0:
            assert np.all(out[t] == 0) and np.all(np.isneginf(lse[t]))
            continue
        ref, ref_lse = merge_by_formula(po[s:s + c], pl[s:s + c])
        np.testing.assert_allclose(out[t], ref, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(lse[t], ref_lse, rtol=1e-6)


def test_merge_rows_edge_shapes():
    po = np.zeros((0, 3, 4), np.float32)
    pl = np.zeros((0, 3), np.float32)
    out, lse = merge_rows(po, pl, np.zeros(0, int), np.zeros(0, int))
    assert out.shape == (0, 3, 4) and lse.shape == (0, 3)
    out, lse = merge_rows(po, pl, np.zeros(2, int), np.zeros(2, int))
    assert out.shape == (2, 3, 4) and np.all(out == 0) and np.all(np.isneginf(lse))
