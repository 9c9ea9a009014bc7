"""Every rule of the conventions, checked against attention computed independently here, loop by loop.

The float64 reference (``dense_attention``), the NumPy split path and the torch eager split path are
all held to a brute-force computation written from the rule's text.
"""

import math

import numpy as np
import pytest

from splitkv_common.parity.backends import numpy_backend, torch_backend
from splitkv_common.dtypes import round_to
from splitkv_common.inputs import DecodeInputs
from splitkv_common.reference import dense_attention

torch = pytest.importorskip("torch")
from splitkv_common import torch_eager, torch_io  # noqa: E402
from splitkv_common.torch_io import to_torch  # noqa: E402

POISON = 777.0


# --- the rules, written out -------------------------------------------------------------------


def brute(q, qsl, K, V, *, scale, soft_cap=None, window_left=None):
    """``q [T, Hq, D]``; ``K[b], V[b]``: request b's logical KV ``[L_b, Hkv, D]`` (float, dequantized).

    Query i of request b sees positions ``0 .. L_b - q_len_b + i`` (and ``>= pos - window_left``);
    head h reads KV head ``h // (Hq // Hkv)``. Returns float64 ``out [T, Hq, D]``, ``lse [T, Hq]``.
    """
    T, Hq, D = q.shape
    out = np.zeros((T, Hq, D))
    lse = np.full((T, Hq), -np.inf)
    for b in range(len(K)):
        L, Hkv = K[b].shape[0], K[b].shape[1]
        group = Hq // Hkv
        n = qsl[b + 1] - qsl[b]
        for i in range(n):
            t = qsl[b] + i
            pos = L - n + i
            vis = [p for p in range(L) if p <= pos and (window_left is None or p >= pos - window_left)]
            for h in range(Hq):
                if not vis:
                    continue
                kh = h // group
                s = [scale * float(np.dot(q[t, h].astype(np.float64), K[b][p, kh])) for p in vis]
                if soft_cap is not None:
                    s = [soft_cap * math.tanh(x / soft_cap) for x in s]
                m = max(s)
                w = [math.exp(x - m) for x in s]
                out[t, h] = sum(wi * V[b][p, kh] for wi, p in zip(w, vis)) / sum(w)
                lse[t, h] = m + math.log(sum(w))
    return out, lse


def paged(K, V, page, rng, *, dtype=np.float32, spare=2):
    """Store logical KV lists in a shuffled paged cache with a poisoned rest; block tables padded with -1."""
    B = len(K)
    Hkv, D = K[0].shape[1], K[0].shape[2]
    npg = [max(1, -(-k.shape[0] // page)) for k in K]
    total = sum(npg) + spare
    perm = rng.permutation(total)
    poison = 127 if dtype == np.int8 else POISON
    kc = np.full((total, page, Hkv, D), poison, dtype)
    vc = np.full((total, page, Hkv, D), poison, dtype)
    bt = np.full((B, max(npg) + 1), -1, np.int32)
    nxt = 0
    for b in range(B):
        L = K[b].shape[0]
        n = -(-L // page)
        bt[b, :n] = perm[nxt:nxt + n]
        nxt += n
        for p in range(L):
            kc[bt[b, p // page], p % page] = K[b][p]
            vc[bt[b, p // page], p % page] = V[b][p]
    return kc, vc, bt, np.array([k.shape[0] for k in K], np.int32)


def problem(seed, seq_lens, *, q_lens=None, hq=4, hkv=2, d=16, page=4, dtype="float32", **kw):
    """Random logical KV and q, paged; returns (inputs, K list, V list)."""
    rng = np.random.default_rng(seed)
    q_lens = [1] * len(seq_lens) if q_lens is None else q_lens
    qsl = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
    K = [round_to(rng.standard_normal((L, hkv, d)), dtype).astype(np.float64) for L in seq_lens]
    V = [round_to(rng.standard_normal((L, hkv, d)), dtype).astype(np.float64) for L in seq_lens]
    q = round_to(rng.standard_normal((int(qsl[-1]), hq, d)) * kw.pop("q_scale", 1.0), dtype)
    kc, vc, bt, sl = paged(K, V, page, rng)
    inp = DecodeInputs(q=q, k_cache=kc, v_cache=vc, block_table=bt, seq_lens=sl, query_start_loc=qsl, dtype=dtype, **kw)
    inp.validate()
    return inp, K, V


def implementations(inp, policies=("none", "page", "count:3")):
    """``(label, out, lse)`` of the float64 reference and of both split paths under several plans."""
    yield "dense", *dense_attention(inp)
    for pol in policies:
        pol = f"size:{inp.k_cache.shape[1]}" if pol == "page" else pol
        plan = inp.plan(pol, device="h200")
        yield f"numpy {pol}", *numpy_backend.run(inp, plan)
        yield f"torch {pol}", *torch_backend.run(inp, plan)


def assert_matches(inp, ref, ref_lse, atol=2e-5, policies=("none", "page", "count:3")):
    unit = max(1.0, np.abs(ref).max())
    for label, out, lse in implementations(inp, policies):
        assert out.shape == ref.shape and lse.shape == ref_lse.shape, label
        assert not np.isnan(out).any() and not np.isnan(lse).any(), label
        np.testing.assert_allclose(out / unit, ref / unit, atol=atol, rtol=0, err_msg=label)
        np.testing.assert_array_equal(np.isneginf(lse), np.isneginf(ref_lse), err_msg=label)
        assert not np.isposinf(lse).any(), label
        fin = np.isfinite(ref_lse)
        np.testing.assert_allclose(lse[fin], ref_lse[fin], rtol=1e-5, atol=5e-5, err_msg=label)


# --- layout: q rows and query_start_loc --------------------------------------------------------


def test_query_rows_are_laid_out_request_after_request():
    q_lens = [2, 1, 3, 1]
    inp, K, V = problem(1, [9, 14, 6, 11], q_lens=q_lens)
    assert inp.q.shape[0] == sum(q_lens)
    np.testing.assert_array_equal(inp.query_start_loc, [0, 2, 3, 6, 7])
    assert_matches(inp, *brute(inp.q, inp.query_start_loc, K, V, scale=inp.scale))


def test_plain_decode_has_one_row_per_request():
    inp, K, V = problem(2, [5, 12, 1])
    assert inp.q.shape[0] == 3
    np.testing.assert_array_equal(inp.query_start_loc, [0, 1, 2, 3])
    ref = brute(inp.q, inp.query_start_loc, K, V, scale=inp.scale)
    assert_matches(inp, *ref)
    # request b's row reads request b's history only: changing another request's KV changes nothing there
    K2 = [K[0], K[1] * -3.0, K[2]]
    inp2 = DecodeInputs(q=inp.q, k_cache=inp.k_cache.copy(), v_cache=inp.v_cache, block_table=inp.block_table,
                        seq_lens=inp.seq_lens)
    for p in range(12):
        pg = inp.block_table[1, p // 4]
        inp2.k_cache[pg, p % 4] = K2[1][p]
    out2, _ = dense_attention(inp2)
    out1, _ = dense_attention(inp)
    np.testing.assert_array_equal(out2[[0, 2]], out1[[0, 2]])
    assert np.abs(out2[1] - out1[1]).max() > 1e-3


# --- paged KV and block tables ----------------------------------------------------------------


@pytest.mark.parametrize("page", [1, 2, 3, 5, 16])
def test_paged_kv_any_page_size(page):
    seq = [0, 1, 7, 16, 23]
    rng = np.random.default_rng(3)
    K = [rng.standard_normal((L, 2, 8)) for L in seq]
    V = [rng.standard_normal((L, 2, 8)) for L in seq]
    q = rng.standard_normal((5, 4, 8)).astype(np.float32)
    K32 = [k.astype(np.float32).astype(np.float64) for k in K]
    V32 = [v.astype(np.float32).astype(np.float64) for v in V]
    kc, vc, bt, sl = paged(K32, V32, page, np.random.default_rng(page))
    inp = DecodeInputs(q=q, k_cache=kc, v_cache=vc, block_table=bt, seq_lens=sl)
    inp.validate()
    assert np.any(bt == -1)  # unused block-table entries may hold anything
    assert_matches(inp, *brute(q, inp.query_start_loc, K32, V32, scale=inp.scale))


def test_contiguous_cache_is_one_page_per_request():
    rng = np.random.default_rng(4)
    seq = [10, 3]
    K = [rng.standard_normal((L, 1, 8)).astype(np.float32) for L in seq]
    V = [rng.standard_normal((L, 1, 8)).astype(np.float32) for L in seq]
    kc = np.zeros((2, 10, 1, 8), np.float32)
    vc = np.zeros((2, 10, 1, 8), np.float32)
    kc[0], vc[0] = K[0], V[0]
    kc[1, :3], vc[1, :3] = K[1], V[1]
    kc[1, 3:] = vc[1, 3:] = POISON
    q = rng.standard_normal((2, 2, 8)).astype(np.float32)
    inp = DecodeInputs(q=q, k_cache=kc, v_cache=vc, block_table=np.array([[0], [1]], np.int32),
                       seq_lens=np.array(seq, np.int32))
    inp.validate()
    K64 = [k.astype(np.float64) for k in K]
    V64 = [v.astype(np.float64) for v in V]
    assert_matches(inp, *brute(q, inp.query_start_loc, K64, V64, scale=inp.scale), policies=("none", "count:2"))


# --- seq_len 0 and empty rows -----------------------------------------------------------------


def test_seq_len_zero_is_legal_and_gives_zero_and_minus_inf():
    inp, K, V = problem(5, [0, 9, 0], q_lens=[1, 2, 3])
    ref, ref_lse = brute(inp.q, inp.query_start_loc, K, V, scale=inp.scale)
    assert np.isneginf(ref_lse[[0, 3, 4, 5]]).all()
    assert_matches(inp, ref, ref_lse)
    for label, out, lse in implementations(inp):
        assert np.all(out[[0, 3, 4, 5]] == 0), label
        assert np.all(np.isneginf(lse[[0, 3, 4, 5]])), label


def test_all_rows_empty():
    inp, K, V = problem(6, [0, 0])
    for label, out, lse in implementations(inp, ("none", "auto")):
        assert np.all(out == 0) and np.all(np.isneginf(lse)) and not np.isnan(out).any(), label


def test_rows_before_the_history_see_nothing():
    # more query rows than KV tokens: the first rows' positions are negative, so they see nothing
    inp, K, V = problem(7, [2, 5], q_lens=[4, 1])
    ref, ref_lse = brute(inp.q, inp.query_start_loc, K, V, scale=inp.scale)
    assert np.isneginf(ref_lse[:2]).all() and np.isfinite(ref_lse[2:]).all()
    assert_matches(inp, ref, ref_lse)


# --- GQA / MQA --------------------------------------------------------------------------------


@pytest.mark.parametrize("hq, hkv", [(4, 4), (6, 2), (6, 3), (9, 3), (10, 5), (12, 4), (5, 1), (7, 1), (8, 1)])
def test_gqa_head_mapping(hq, hkv):
    inp, K, V = problem(10 + hq * hkv, [13, 6], hq=hq, hkv=hkv, d=8)
    assert_matches(inp, *brute(inp.q, inp.query_start_loc, K, V, scale=inp.scale), policies=("page",))


@pytest.mark.parametrize("hq, hkv", [(6, 2), (6, 3), (5, 1), (12, 4)])
def test_query_head_h_reads_kv_head_h_div_group(hq, hkv):
    """V of KV head j is the constant j + 1: every output of query head h is exactly h // (Hq // Hkv) + 1."""
    inp, K, V = problem(20, [9, 4], hq=hq, hkv=hkv, d=8)
    inp.v_cache[:] = (np.arange(hkv) + 1.0)[None, None, :, None]
    expect = (np.arange(hq) // (hq // hkv) + 1.0)[None, :, None]
    for label, out, _ in implementations(inp, ("page",)):
        np.testing.assert_allclose(out, np.broadcast_to(expect, out.shape), rtol=1e-6, err_msg=label)


def test_hq_must_be_a_multiple_of_hkv():
    inp, _, _ = problem(21, [5], hq=6, hkv=2)
    bad = DecodeInputs(q=np.zeros((1, 5, 16), np.float32), k_cache=inp.k_cache, v_cache=inp.v_cache,
                       block_table=inp.block_table, seq_lens=inp.seq_lens)
    with pytest.raises(ValueError, match="Hq % Hkv"):
        bad.validate()


# --- scale and soft cap -----------------------------------------------------------------------


def test_default_scale_is_one_over_sqrt_d():
    for d in (8, 64, 80):
        inp, K, V = problem(30 + d, [11], d=d)
        assert inp.scale == pytest.approx(1 / math.sqrt(d))
        assert_matches(inp, *brute(inp.q, inp.query_start_loc, K, V, scale=1 / math.sqrt(d)), policies=("page",))
    t = to_torch(inp)
    plan = inp.plan("size:4")
    a = torch_eager.decode_attention(**t, plan=plan)
    b = torch_eager.decode_attention(**t, plan=plan, scale=1 / math.sqrt(80))
    torch.testing.assert_close(a[0], b[0], rtol=0, atol=0)
    torch.testing.assert_close(a[1], b[1], rtol=0, atol=0)


def test_explicit_scale():
    inp, K, V = problem(40, [12, 7], scale=0.37)
    assert_matches(inp, *brute(inp.q, inp.query_start_loc, K, V, scale=0.37))


@pytest.mark.parametrize("cap", [2.0, 15.0])
def test_soft_cap_is_cap_tanh_s_over_cap(cap):
    inp, K, V = problem(41, [20, 9], q_scale=12.0, soft_cap=cap)
    ref, ref_lse = brute(inp.q, inp.query_start_loc, K, V, scale=inp.scale, soft_cap=cap)
    uncapped, _ = brute(inp.q, inp.query_start_loc, K, V, scale=inp.scale)
    assert np.abs(ref - uncapped).max() > 1e-2          # the cap matters in this case
    assert np.all(ref_lse <= cap + math.log(20) + 1e-9)  # every capped score is below cap
    assert_matches(inp, ref, ref_lse)


# --- visibility: the causal tail and the sliding window -----------------------------------------


def test_causal_tail_for_multi_query():
    inp, K, V = problem(50, [17, 30, 3], q_lens=[4, 1, 3], page=4)
    assert_matches(inp, *brute(inp.q, inp.query_start_loc, K, V, scale=inp.scale),
                   policies=("none", "page", "size:8", "count:5"))


def test_each_query_row_sees_exactly_its_prefix():
    """Changing V at position p changes query i's output iff p <= seq_len - q_len + i."""
    seq, n = 12, 4
    inp, K, V = problem(51, [seq], q_lens=[n], page=4)
    base, _ = dense_attention(inp)
    split_base, _ = numpy_backend.run(inp, inp.plan("size:4"))
    for p in range(seq):
        pert = DecodeInputs(q=inp.q, k_cache=inp.k_cache, v_cache=inp.v_cache.copy(), block_table=inp.block_table,
                            seq_lens=inp.seq_lens, query_start_loc=inp.query_start_loc)
        pert.v_cache[inp.block_table[0, p // 4], p % 4] += 10.0
        out, _ = dense_attention(pert)
        sout, _ = numpy_backend.run(pert, pert.plan("size:4"))
        for i in range(n):
            sees = p <= seq - n + i
            assert (np.abs(out[i] - base[i]).max() > 1e-6) == sees, (p, i)
            assert (np.abs(sout[i] - split_base[i]).max() > 1e-6) == sees, (p, i)


@pytest.mark.parametrize("window", [0, 1, 5, 13, 100])
def test_sliding_window(window):
    inp, K, V = problem(60, [30, 9, 1], q_lens=[3, 2, 1], page=4, window_left=window)
    assert_matches(inp, *brute(inp.q, inp.query_start_loc, K, V, scale=inp.scale, window_left=window),
                   policies=("none", "page", "size:8", "count:4"))


def test_window_zero_sees_only_the_own_position():
    inp, K, V = problem(61, [10, 3], page=4, window_left=0)
    for label, out, lse in implementations(inp):
        np.testing.assert_allclose(out[0], np.repeat(V[0][9], 2, axis=0), atol=1e-6, err_msg=label)
        s = inp.scale * np.einsum("hd,hd->h", inp.q[0].astype(np.float64), np.repeat(K[0][9], 2, axis=0))
        np.testing.assert_allclose(lse[0], s, rtol=1e-5, atol=1e-5, err_msg=label)


def test_window_minus_one_means_no_window():
    inp, K, V = problem(62, [15], window_left=-1)
    assert inp.window_left is None
    assert_matches(inp, *brute(inp.q, inp.query_start_loc, K, V, scale=inp.scale))


def test_a_split_never_resets_positions():
    """With splits of one page, each split's visibility still uses logical positions (causal + window)."""
    inp, K, V = problem(63, [23], q_lens=[5], page=2, window_left=6)
    ref = brute(inp.q, inp.query_start_loc, K, V, scale=inp.scale, window_left=6)
    assert_matches(inp, *ref, policies=("size:2", "size:4", "count:11"))


# --- int8 KV ----------------------------------------------------------------------------------


@pytest.mark.parametrize("per", ["head", "channel"])
@pytest.mark.parametrize("with_offset", [False, True])
def test_int8_value_is_x_minus_offset_times_scale(per, with_offset):
    rng = np.random.default_rng(70)
    hkv, d, hq = 2, 8, 4
    seq = [13, 5]
    Kq = [rng.integers(-127, 128, (L, hkv, d)).astype(np.int8) for L in seq]
    Vq = [rng.integers(-127, 128, (L, hkv, d)).astype(np.int8) for L in seq]
    shape = (hkv,) if per == "head" else (hkv, d)
    ks = rng.uniform(0.01, 0.05, shape).astype(np.float32)
    vs = rng.uniform(0.01, 0.05, shape).astype(np.float32)
    ko = rng.integers(-5, 6, shape).astype(np.float32) if with_offset else None
    vo = rng.integers(-5, 6, shape).astype(np.float32) if with_offset else None

    def deq(x, s, o):  # the rule, per head ([Hkv] -> broadcast over channels) or per (head, channel)
        s2 = s[:, None] if s.ndim == 1 else s
        o2 = 0.0 if o is None else (o[:, None] if o.ndim == 1 else o)
        return (x.astype(np.float64) - o2) * s2

    kc, vc, bt, sl = paged(Kq, Vq, 4, rng, dtype=np.int8)
    q = rng.standard_normal((2, hq, d)).astype(np.float32)
    inp = DecodeInputs(q=q, k_cache=kc, v_cache=vc, block_table=bt, seq_lens=sl, k_scale=ks, v_scale=vs,
                       k_offset=ko, v_offset=vo)
    dims = inp.validate()
    assert dims.kv_dtype == "int8"
    K = [deq(k, ks, ko) for k in Kq]
    V = [deq(v, vs, vo) for v in Vq]
    assert_matches(inp, *brute(q, inp.query_start_loc, K, V, scale=inp.scale))


# --- output dtypes and the lse ----------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_out_has_q_dtype_and_lse_is_float32(dtype):
    inp, K, V = problem(80, [19, 4], dtype=dtype)
    t = to_torch(inp)
    assert t["q"].dtype == torch_io.torch_dtype(dtype)
    out, lse = torch_eager.decode_attention(**t, plan=inp.plan("size:4"))
    assert out.dtype == t["q"].dtype and lse.dtype == torch.float32
    assert tuple(out.shape) == inp.q.shape and tuple(lse.shape) == inp.q.shape[:2]
    # the NumPy path returns float32 arrays holding values of q's dtype
    nout, nlse = numpy_backend.run(inp, inp.plan("size:4"))
    assert nout.dtype == np.float32 and nlse.dtype == np.float32
    np.testing.assert_array_equal(round_to(nout, dtype), nout)
    np.testing.assert_array_equal(out.float().numpy(), round_to(out.float().numpy(), dtype))


def test_lse_is_the_natural_log_sum_exp_of_the_scaled_scores():
    inp, K, V = problem(81, [9], hq=2, hkv=1, d=4, scale=0.8)
    s = [0.8 * float(np.dot(inp.q[0, 0].astype(np.float64), K[0][p, 0])) for p in range(9)]
    expect = math.log(sum(math.exp(x) for x in s))
    assert abs(expect) > 0.5  # so that a base-2 lse (expect / ln 2) would be told apart
    for label, out, lse in implementations(inp):
        assert lse.dtype == (np.float64 if label == "dense" else np.float32), label
        assert float(lse[0, 0]) == pytest.approx(expect, rel=1e-5, abs=1e-5), label
