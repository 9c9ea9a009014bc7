"""The NumPy reference: float64 dense ground truth, the split path, the plain-dtype yardstick, dtypes."""

import math

import numpy as np
import pytest

from splitkv_common.parity.cases import random_inputs, worked_example
from splitkv_common.dtypes import EPS, dtype_name, round_to
from splitkv_common.inputs import DecodeInputs, dequantize
from splitkv_common.merge import naive_average
from splitkv_common.reference import (
    dense_attention,
    gather_kv,
    partial_state,
    plain_attention,
    split_attention,
    split_partials,
    visible,
)

LN = math.log


# --- the seed's worked example ----------------------------------------------------------------


def test_worked_example_dense_is_4_9():
    inp = worked_example(head_dim=8)
    out, lse = dense_attention(inp)
    assert out.dtype == np.float64 and lse.dtype == np.float64
    np.testing.assert_allclose(out, 4.9, rtol=1e-7)   # every channel of V is [1, 2, 4, 8]; k holds float32 logs
    assert lse[0, 0] == pytest.approx(LN(10), rel=1e-7)


@pytest.mark.parametrize("policy", ["size:2", "size:4", "none", "count:2", "size:1"])
def test_worked_example_split_paths_give_4_9(policy):
    inp = worked_example(head_dim=8)
    out, lse = split_attention(inp, inp.plan(policy) if policy != "size:1" else None)
    np.testing.assert_allclose(out, 4.9, rtol=1e-6)
    assert lse[0, 0] == pytest.approx(LN(10), rel=1e-6)


def test_worked_example_blocks_follow_the_block_table():
    inp = worked_example(head_dim=4)
    # pages are stored in reverse: block A (positions 0-1) lives in page 1
    np.testing.assert_allclose(gather_kv(inp.k_cache, inp.block_table, 0, 0, 4)[:, 0, 0], np.log([1, 2, 3, 4]),
                               rtol=1e-6)
    np.testing.assert_allclose(gather_kv(inp.v_cache, inp.block_table, 0, 1, 3)[:, 0, 0], [2, 4])
    plan = inp.plan("size:2")
    assert plan.num_splits.tolist() == [2]
    po, pl = split_partials(inp, plan)
    np.testing.assert_allclose(po[:, 0, 0], [5 / 3, 44 / 7], rtol=1e-6)   # the seed's local outputs
    np.testing.assert_allclose(pl[:, 0], [LN(3), LN(7)], rtol=1e-6)        # masses 3 and 7
    # averaging the same partials is the seed's wrong answer
    assert float(naive_average(po)[0, 0]) == pytest.approx(3.976, abs=5e-4)


def test_worked_example_bf16():
    inp = worked_example(dtype="bfloat16")
    out, _ = split_attention(inp, inp.plan("size:2"))
    assert np.all(round_to(out, "bfloat16") == out)
    np.testing.assert_allclose(out, 4.9, rtol=2 * EPS["bfloat16"])
    ref, _ = dense_attention(inp)
    np.testing.assert_allclose(ref, 4.9, rtol=EPS["bfloat16"])  # only the scores were rounded


def test_split_attention_default_plan():
    inp = random_inputs(0, [40, 0, 13], q_lens=[2, 1, 1])
    out, lse = split_attention(inp)
    ref, ref_lse = dense_attention(inp)
    np.testing.assert_allclose(out, ref, atol=2e-5)
    np.testing.assert_array_equal(np.isneginf(lse), np.isneginf(ref_lse))


# --- building blocks --------------------------------------------------------------------------


def test_visible_rule():
    pos = np.arange(6)
    # seq_len 6, 3 query rows at positions 3, 4, 5
    np.testing.assert_array_equal(visible(6, 3, pos, None), [[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 0], [1] * 6])
    np.testing.assert_array_equal(visible(6, 3, pos, 1), [[0, 0, 1, 1, 0, 0], [0, 0, 0, 1, 1, 0],
                                                          [0, 0, 0, 0, 1, 1]])
    np.testing.assert_array_equal(visible(6, 1, np.arange(2, 4), None), [[1, 1]])


def test_partial_state_fully_masked_and_zero_length_are_empty():
    s = np.array([[3.0, -1e4, 2.0]], np.float32)
    v = np.ones((1, 3, 2), np.float32)
    with np.errstate(all="raise"):
        o, lse = partial_state(s, v, np.zeros((1, 3), bool))
        o0, lse0 = partial_state(np.zeros((1, 0), np.float32), np.zeros((1, 0, 2), np.float32),
                                 np.zeros((1, 0), bool))
    assert np.all(o == 0) and np.isneginf(lse).all()
    assert np.all(o0 == 0) and np.isneginf(lse0).all()
    o, lse = partial_state(s, np.arange(6, dtype=np.float32).reshape(1, 3, 2), np.array([[True, False, True]]))
    w = np.exp([3.0, 2.0])
    np.testing.assert_allclose(o[0], (w[0] * np.array([0, 1]) + w[1] * np.array([4, 5])) / w.sum(), rtol=1e-6)
    assert lse[0] == pytest.approx(math.log(w.sum()), rel=1e-6)


def test_partial_state_with_very_negative_scores_and_masks_does_not_overflow():
    s = np.array([-500.0, -501.0, 0.0], np.float32)
    v = np.array([[1.0], [2.0], [99.0]], np.float32)
    with np.errstate(over="raise", invalid="raise"):
        o, lse = partial_state(s, v, np.array([True, True, False]))
    w = np.array([1.0, math.exp(-1.0)])
    assert float(o[0]) == pytest.approx((w[0] + 2 * w[1]) / w.sum(), rel=1e-6)
    assert float(lse) == pytest.approx(-500.0 + math.log(w.sum()), rel=1e-6)


def test_dequantize():
    x = np.arange(-6, 6, dtype=np.int8).reshape(1, 2, 2, 3)  # [P, page, Hkv, D]
    s_head = np.array([0.5, 2.0], np.float32)
    np.testing.assert_allclose(dequantize(x, s_head), x * np.array([0.5, 2.0])[None, None, :, None])
    s_ch = np.array([[1, 2, 3], [4, 5, 6]], np.float32)
    off = np.array([[1, 0, -1], [2, 2, 2]], np.float32)
    np.testing.assert_allclose(dequantize(x, s_ch, off), (x - off[None, None]) * s_ch[None, None])
    np.testing.assert_allclose(dequantize(x, s_head, np.array([3.0, -3.0], np.float32)),
                               (x - np.array([3.0, -3.0])[None, None, :, None]) * np.array([0.5, 2.0])[None, None, :, None])
    f = np.ones((1, 2, 2, 3), np.float32)
    assert dequantize(f).dtype == np.float64 and np.all(dequantize(f, s_head) == 1)  # float KV: no scale


# --- the plain-dtype yardstick ----------------------------------------------------------------


def test_plain_attention_error_grows_with_coarser_dtypes():
    errs = {}
    for dt in ("float32", "float16", "bfloat16"):
        inp = random_inputs(9, [70, 33, 0], dtype=dt)
        ref, _ = dense_attention(inp)
        plain = plain_attention(inp)
        assert plain.dtype == np.float32
        assert np.all(round_to(plain, dt) == plain)
        assert np.all(plain[2] == 0)
        errs[dt] = np.abs(plain - ref).max()
    assert errs["float32"] < 1e-5
    assert errs["float32"] < errs["float16"] < errs["bfloat16"] < 0.1
    assert errs["float16"] > 1e-5


def test_dense_attention_ignores_poisoned_pages():
    inp = random_inputs(12, [17, 5], page_size=8)
    out, _ = dense_attention(inp)
    assert np.abs(out).max() < 10  # POISON (1000) would show
    rows = inp.block_table[inp.block_table >= 0]
    spare = np.setdiff1d(np.arange(inp.k_cache.shape[0]), rows)
    inp.k_cache[spare] = -5.0
    inp.v_cache[spare] = 1e6
    out2, _ = dense_attention(inp)
    np.testing.assert_array_equal(out, out2)


# --- dtypes -----------------------------------------------------------------------------------


def test_round_to_float16_and_bfloat16():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.standard_normal(2000).astype(np.float32) * 10,
                        np.float32([1 + 2**-8, 1 + 3 * 2**-8, -(1 + 2**-8), 3.0e38, 1e-40, 0.0, -0.0])])
    with np.errstate(over="ignore"):  # 3e38 overflows float16 to inf, as it should
        np.testing.assert_array_equal(round_to(x, "float16"), x.astype(np.float16).astype(np.float32))
    np.testing.assert_array_equal(round_to(x, "bfloat16"), torch.from_numpy(x).to(torch.bfloat16).float().numpy())
    assert round_to(np.float32(1 + 2**-8), "bfloat16") == 1.0                  # tie to even
    assert round_to(np.float32(1 + 3 * 2**-8), "bfloat16") == 1 + 2**-6        # tie to even (up)
    assert np.isnan(round_to(np.float32([np.nan]), "bfloat16")).all()
    y = round_to(x, "float32")
    np.testing.assert_array_equal(y, x)
    assert y is not x
    with pytest.raises(ValueError, match="dtype"):
        round_to(x, "float8")


def test_dtype_name():
    torch = pytest.importorskip("torch")
    assert dtype_name(np.zeros(1, np.int32)) == "int32"
    assert dtype_name(torch.zeros(1, dtype=torch.bfloat16)) == "bfloat16"
    with pytest.raises(TypeError):
        dtype_name([1, 2])


# --- DecodeInputs -----------------------------------------------------------------------------


def test_decode_inputs_defaults():
    inp = random_inputs(1, [5, 9], head_dim=32)
    bare = DecodeInputs(q=inp.q, k_cache=inp.k_cache, v_cache=inp.v_cache, block_table=inp.block_table,
                        seq_lens=inp.seq_lens)
    np.testing.assert_array_equal(bare.query_start_loc, [0, 1, 2])
    np.testing.assert_array_equal(bare.q_lens, [1, 1])
    assert bare.scale == pytest.approx(1 / math.sqrt(32))
    assert bare.window_left is None and bare.kv_dtype == "float32"
    q8 = random_inputs(1, [5], kv_quant="head", dtype="float16")
    assert q8.kv_dtype == "int8" and q8.dtype == "float16"
    p8 = q8.plan("none")
    assert p8.kv_bytes_read(q8.q.shape[2], 1) == 5 * 2 * 64 * 2
