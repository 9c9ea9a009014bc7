"""Split states and the converters between the formats users meet (conventions: "Split state and merge")."""

import math

import numpy as np
import pytest

from splitkv_common import states
from splitkv_common.merge import merge_states
from splitkv_common.states import (
    accumulator_to_state,
    canonical_lse,
    empty_mask,
    ifa_to_state,
    lse_from_base2,
    lse_to_base2,
    mlu_to_state,
    state_to_accumulator,
    state_to_ifa,
    state_to_mlu,
)

LN = math.log
FLOAT32_LOWEST = -3.4028234663852886e38


def _random_states(rng, n, d, empty_every=0):
    o = rng.standard_normal((n, d)).astype(np.float32)
    lse = (rng.standard_normal(n) * 5).astype(np.float32)
    if empty_every:
        lse[::empty_every] = -np.inf
        o[::empty_every] = 0.0
    return o, lse


# --- the state of one split, from scores and values ---------------------------------------------


def test_seed_block_states_give_local_outputs_and_weight_masses():
    # seed section 04: block A m=ln2 l=1.5 u=2.5; block B m=ln4 l=1.75 u=11
    o, lse = mlu_to_state(np.array([LN(2), LN(4)]), np.array([1.5, 1.75]), np.array([[2.5], [11.0]]))
    assert o.dtype == np.float32 and lse.dtype == np.float32
    np.testing.assert_allclose(o[:, 0], [5 / 3, 44 / 7], rtol=1e-6)
    # lse = m + log l: the blocks' weight masses are 3 and 7 (of 10)
    np.testing.assert_allclose(lse, [LN(3), LN(7)], rtol=1e-6)


def test_state_definition_matches_scores_and_values():
    rng = np.random.default_rng(0)
    s = rng.standard_normal(13) * 4
    v = rng.standard_normal((13, 5))
    m = s.max()
    l = np.exp(s - m).sum()
    u = (np.exp(s - m)[:, None] * v).sum(0)
    o, lse = mlu_to_state(np.array(m), np.array(l), u)
    # o = u / l (the local softmax output) and lse = m + log l = log-sum-exp of the scores
    p = np.exp(s) / np.exp(s).sum()
    np.testing.assert_allclose(o, p @ v, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(lse, math.log(np.exp(s).sum()), rtol=1e-6)


def test_empty_split_is_zero_and_minus_inf_without_nan_or_warnings():
    with np.errstate(all="raise"):
        o, lse = mlu_to_state(np.array([-np.inf, 0.3]), np.array([0.0, 0.0]), np.array([[0.0, 0.0], [7.0, -1.0]]))
    assert np.all(o == 0) and np.all(np.isneginf(lse))


def test_canonical_lse_reads_plus_inf_as_empty_and_rejects_nan():
    out = canonical_lse([np.inf, -np.inf, 1.5])
    assert out.dtype == np.float32
    assert np.isneginf(out[0]) and np.isneginf(out[1]) and out[2] == np.float32(1.5)
    with pytest.raises(ValueError, match="lse"):
        canonical_lse([0.0, np.nan])
    np.testing.assert_array_equal(empty_mask([np.inf, -np.inf, 0.0, -1e30]), [True, True, False, False])


# --- the seed's (m, l, u) ---------------------------------------------------------------------


def test_state_to_mlu_against_a_given_max_recovers_the_seed_numbers():
    o, lse = mlu_to_state(np.array([LN(2), LN(4)]), np.array([1.5, 1.75]), np.array([[2.5], [11.0]]))
    mlu = state_to_mlu(o, lse, m=np.array([LN(2), LN(4)]))
    np.testing.assert_allclose(mlu.l, [1.5, 1.75], rtol=1e-6)
    np.testing.assert_allclose(mlu.u[:, 0], [2.5, 11.0], rtol=1e-6)
    # default reference point m = lse, so l = 1 and u = o
    d = state_to_mlu(o, lse)
    np.testing.assert_allclose(d.m, lse)
    np.testing.assert_allclose(d.l, 1.0)
    np.testing.assert_allclose(d.u, o, rtol=1e-6)


def test_mlu_round_trip_random_and_empty():
    rng = np.random.default_rng(1)
    o, lse = _random_states(rng, 12, 4, empty_every=4)
    lse[5] = np.inf  # FlashAttention 2 sentinel: empty on input
    m, l, u = state_to_mlu(o, lse)
    assert np.all(l[[0, 4, 5, 8]] == 0) and np.all(np.isneginf(m[[0, 4, 5, 8]]))
    o2, lse2 = mlu_to_state(m, l, u)
    canon = canonical_lse(lse)
    np.testing.assert_array_equal(np.isneginf(lse2), np.isneginf(canon))
    fin = np.isfinite(canon)
    np.testing.assert_allclose(lse2[fin], canon[fin], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(o2[fin], o[fin], rtol=1e-6, atol=1e-6)
    assert np.all(o2[~fin] == 0)


# --- base-2 lse (FlashInfer, Flex) ------------------------------------------------------------


def test_base2_lse_conversion():
    np.testing.assert_allclose(lse_to_base2([LN(8), 0.0]), [3.0, 0.0], rtol=1e-6)
    np.testing.assert_allclose(lse_from_base2([3.0, -1.0]), [LN(8), -LN(2)], rtol=1e-6)
    inf = lse_to_base2([np.inf, -np.inf])
    assert np.isposinf(inf[0]) and np.isneginf(inf[1])
    back = lse_from_base2([np.inf, -np.inf])
    assert np.isposinf(back[0]) and np.isneginf(back[1])
    rng = np.random.default_rng(2)
    x = (rng.standard_normal(50) * 30).astype(np.float32)
    np.testing.assert_allclose(lse_from_base2(lse_to_base2(x)), x, rtol=1e-6, atol=1e-6)


def test_base2_states_merge_correctly_only_after_conversion():
    # two FlashInfer-style states (base-2 lse) of the seed's blocks
    o = np.array([[5 / 3], [44 / 7]], np.float32)
    lse2 = np.array([math.log2(3), math.log2(7)], np.float32)
    out, lse = merge_states(o, lse_from_base2(lse2))
    assert out[0] == pytest.approx(4.9, rel=1e-6)
    assert lse == pytest.approx(LN(10), rel=1e-6)
    wrong, _ = merge_states(o, lse2)  # reading base-2 as natural log weighs the blocks wrongly
    assert abs(float(wrong[0]) - 4.9) > 0.05


# --- IFA's normalized output with (max, sum) --------------------------------------------------


def test_ifa_to_state_and_its_empty_sentinel():
    o = np.array([[5 / 3], [44 / 7], [123.0]], np.float32)
    mx = np.array([LN(2), LN(4), FLOAT32_LOWEST], np.float32)
    sm = np.array([1.5, 1.75, 0.0], np.float32)
    so, slse = ifa_to_state(o, mx, sm)
    np.testing.assert_allclose(slse[:2], [LN(3), LN(7)], rtol=1e-6)
    np.testing.assert_allclose(so[:2], o[:2])
    assert np.isneginf(slse[2]) and so[2, 0] == 0  # sum 0 is empty whatever the max and o
    out, lse = merge_states(so, slse)
    assert out[0] == pytest.approx(4.9, rel=1e-6)


def test_state_to_ifa_and_round_trip():
    rng = np.random.default_rng(3)
    o, lse = _random_states(rng, 9, 3, empty_every=3)
    lse[1] = np.inf
    ifa = state_to_ifa(o, lse)
    assert ifa.o.dtype == ifa.max.dtype == ifa.sum.dtype == np.float32
    empty = np.isinf(lse)
    assert np.all(ifa.max[empty] == np.float32(FLOAT32_LOWEST))
    assert np.all(ifa.sum[empty] == 0) and np.all(ifa.o[empty] == 0)
    assert np.all(ifa.sum[~empty] == 1) and np.all(ifa.max[~empty] == lse[~empty])
    o2, lse2 = ifa_to_state(*ifa)
    np.testing.assert_array_equal(np.isneginf(lse2), empty)
    np.testing.assert_allclose(lse2[~empty], lse[~empty], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(o2[~empty], o[~empty])


# --- un-normalized accumulators ---------------------------------------------------------------


def test_accumulators_round_trip():
    rng = np.random.default_rng(4)
    o, lse = _random_states(rng, 10, 6, empty_every=5)
    acc = state_to_accumulator(o, lse)
    o2, lse2 = accumulator_to_state(acc.u, acc.m, acc.l)
    np.testing.assert_array_equal(np.isneginf(lse2), np.isneginf(lse))
    fin = np.isfinite(lse)
    np.testing.assert_allclose(lse2[fin], lse[fin], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(o2, np.where(fin[:, None], o, 0), rtol=1e-6, atol=1e-6)
    # an accumulator against an arbitrary max is the same state
    s = rng.standard_normal(7)
    v = rng.standard_normal((7, 6))
    for m in (s.max(), s.max() + 3.0, 0.0):
        e = np.exp(s - m)
        o3, lse3 = accumulator_to_state((e[:, None] * v).sum(0), np.array(m), np.array(e.sum()))
        np.testing.assert_allclose(lse3, math.log(np.exp(s).sum()), rtol=1e-6)
        np.testing.assert_allclose(o3, (np.exp(s) / np.exp(s).sum()) @ v, rtol=1e-5, atol=1e-6)


def test_constants():
    assert states.LN2 == pytest.approx(math.log(2))
    assert states.LOG2E * states.LN2 == pytest.approx(1.0)
