"""FlashAttention's ``flash_attn_with_kvcache`` call on every backend, against FlashAttention's
semantics written out as a float64 brute-force loop (bottom-right alignment, window pair, softcap,
in-place append of new keys, paged and contiguous caches, lse ``[B, Hq, Sq]``)."""

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from splitkv_common import flash_compat  # noqa: E402

B, HQ, HKV, D = 3, 4, 2, 16


def _impls():
    impls = [pytest.param(flash_compat.flash_attn_with_kvcache, id="torch")]
    try:
        from cuda_ref.flash import flash_attn_with_kvcache as triton_fa
        impls.append(pytest.param(triton_fa, id="triton"))
    except ImportError as e:  # triton missing here
        impls.append(pytest.param(None, id="triton", marks=pytest.mark.skip(reason=f"triton: {e}")))
    return impls


def fa_reference(q, k_cache, v_cache, lengths, rows, page, scale, causal, window, softcap):
    """FlashAttention's definition, one row at a time, in float64. ``rows(b)`` gives request b's
    physical (page, slot) list for logical positions 0..L-1."""
    Bq, Sq, Hq, Dd = q.shape
    G = Hq // k_cache.shape[2]
    left, right = window
    if causal:
        right = 0
    out = np.zeros((Bq, Sq, Hq, Dd))
    lse = np.full((Bq, Hq, Sq), -np.inf)
    qf, kf, vf = (x.double().numpy() for x in (q, k_cache, v_cache))
    for b in range(Bq):
        L = int(lengths[b])
        slots = rows(b)[:L]
        for i in range(Sq):
            p = L - Sq + i
            lo = 0 if left < 0 else max(0, p - left)
            hi = L - 1 if right < 0 else min(L - 1, p + right)
            if hi < lo:
                continue
            for h in range(Hq):
                ks = np.stack([kf[pg, sl, h // G] for pg, sl in slots[lo:hi + 1]])
                vs = np.stack([vf[pg, sl, h // G] for pg, sl in slots[lo:hi + 1]])
                s = ks @ qf[b, i, h] * scale
                if softcap:
                    s = softcap * np.tanh(s / softcap)
                m = s.max()
                w = np.exp(s - m)
                out[b, i, h] = w @ vs / w.sum()
                lse[b, h, i] = m + math.log(w.sum())
    return out, lse


def _inputs(seed, Sq, paged, dtype=torch.float32, capacity=24, page=4):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, Sq, HQ, D, generator=g).to(dtype)
    if paged:
        blocks = capacity // page
        nb = B * blocks + 2
        k_cache = torch.randn(nb, page, HKV, D, generator=g).to(dtype)
        v_cache = torch.randn(nb, page, HKV, D, generator=g).to(dtype)
        bt = torch.randperm(nb, generator=g)[:B * blocks].reshape(B, blocks).to(torch.int32)
        rows = lambda b: [(int(bt[b, j // page]), j % page) for j in range(capacity)]  # noqa: E731
        return q, k_cache, v_cache, bt, rows, page
    k_cache = torch.randn(B, capacity, HKV, D, generator=g).to(dtype)
    v_cache = torch.randn(B, capacity, HKV, D, generator=g).to(dtype)
    rows = lambda b: [(b, j) for j in range(capacity)]  # noqa: E731
    return q, k_cache, v_cache, None, rows, capacity


def _check(fa, Sq, paged, causal, window, softcap=0.0, num_splits=0, lengths=(17, 0, 24), seed=0):
    q, k_cache, v_cache, bt, rows, page = _inputs(seed, Sq, paged)
    seqlens = torch.tensor(lengths, dtype=torch.int32)
    out, lse = fa(q, k_cache, v_cache, cache_seqlens=seqlens, block_table=bt, causal=causal, window_size=window,
                  softcap=softcap, num_splits=num_splits, return_softmax_lse=True)
    ref_out, ref_lse = fa_reference(q, k_cache, v_cache, lengths, rows, page, D ** -0.5, causal, window, softcap)
    assert out.shape == (B, Sq, HQ, D) and out.dtype == q.dtype
    assert lse.shape == (B, HQ, Sq) and lse.dtype == torch.float32
    np.testing.assert_allclose(out.double().numpy(), ref_out, atol=2e-5, rtol=0)
    np.testing.assert_array_equal(np.isneginf(lse.numpy()), np.isneginf(ref_lse))
    fin = np.isfinite(ref_lse)
    np.testing.assert_allclose(lse.numpy()[fin], ref_lse[fin], atol=2e-5, rtol=1e-6)


@pytest.mark.parametrize("fa", _impls())
@pytest.mark.parametrize("paged", [True, False], ids=["paged", "contiguous"])
@pytest.mark.parametrize("Sq,causal,window", [
    (1, False, (-1, -1)),     # plain decode
    (3, True, (-1, -1)),      # speculative rows, bottom-right causal
    (3, False, (-1, -1)),     # every row sees the whole cache
    (2, True, (5, -1)),       # sliding window
    (3, False, (4, 2)),       # two-sided window: rows look ahead
    (1, False, (6, 0)),
])
def test_matches_flash_attention_semantics(fa, paged, Sq, causal, window):
    _check(fa, Sq, paged, causal, window)


@pytest.mark.parametrize("fa", _impls())
@pytest.mark.parametrize("num_splits", [0, 1, 3])
def test_softcap_and_num_splits(fa, num_splits):
    _check(fa, 2, True, True, (-1, -1), softcap=2.5, num_splits=num_splits, lengths=(24, 9, 1))


def test_rows_before_the_first_key_are_empty():
    # 3 query rows but only 1 key: rows 0 and 1 sit before position 0 and see nothing
    _check(flash_compat.flash_attn_with_kvcache, 3, False, True, (-1, -1), lengths=(1, 2, 0))


@pytest.mark.parametrize("paged", [True, False], ids=["paged", "contiguous"])
def test_new_keys_are_appended_in_place_then_attended(paged):
    fa = flash_compat.flash_attn_with_kvcache
    q, k_cache, v_cache, bt, rows, page = _inputs(1, 2, paged)
    before_k, before_v = k_cache.clone(), v_cache.clone()
    g = torch.Generator().manual_seed(5)
    k_new, v_new = torch.randn(B, 2, HKV, D, generator=g), torch.randn(B, 2, HKV, D, generator=g)
    lengths = [5, 0, 22]
    out = fa(q, k_cache, v_cache, k=k_new, v=v_new, cache_seqlens=torch.tensor(lengths, dtype=torch.int32),
             block_table=bt, causal=True)
    written = torch.zeros(k_cache.shape[:2], dtype=torch.bool)
    for b in range(B):
        for j in range(2):
            pg, sl = rows(b)[lengths[b] + j]
            assert torch.equal(k_cache[pg, sl], k_new[b, j]) and torch.equal(v_cache[pg, sl], v_new[b, j])
            written[pg, sl] = True
    assert torch.equal(k_cache[~written], before_k[~written]) and torch.equal(v_cache[~written], before_v[~written])
    ref, _ = fa_reference(q, k_cache, v_cache, [n + 2 for n in lengths], rows, page, D ** -0.5, True, (-1, -1), 0)
    np.testing.assert_allclose(out.double().numpy(), ref, atol=2e-5)


def test_int_lengths_cache_batch_idx_and_default_scale_are_flash_attentions():
    fa = flash_compat.flash_attn_with_kvcache
    q, k_cache, v_cache, _, _, page = _inputs(2, 1, False)
    idx = torch.tensor([2, 0, 1], dtype=torch.int32)
    out = fa(q, k_cache, v_cache, cache_seqlens=7, cache_batch_idx=idx, softmax_scale=0.3)
    ref, _ = fa_reference(q, k_cache, v_cache, [7] * B, lambda b: [(int(idx[b]), j) for j in range(24)], page,
                          0.3, False, (-1, -1), 0)
    np.testing.assert_allclose(out.double().numpy(), ref, atol=2e-5)
    # no cache_seqlens: the whole contiguous cache
    out = fa(q, k_cache, v_cache)
    ref, _ = fa_reference(q, k_cache, v_cache, [24] * B, lambda b: [(b, j) for j in range(24)], page,
                          D ** -0.5, False, (-1, -1), 0)
    np.testing.assert_allclose(out.double().numpy(), ref, atol=2e-5)


def test_bf16_through_the_paged_path():
    q, k_cache, v_cache, bt, rows, page = _inputs(3, 1, True, dtype=torch.bfloat16)
    out = flash_compat.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=torch.tensor([24, 3, 11]),
                                               block_table=bt)
    ref, _ = fa_reference(q, k_cache, v_cache, [24, 3, 11], rows, page, D ** -0.5, False, (-1, -1), 0)
    assert out.dtype == torch.bfloat16
    np.testing.assert_allclose(out.double().numpy(), ref, atol=2e-2)


@pytest.mark.parametrize("kwargs,message", [
    (dict(rotary_cos=torch.zeros(1)), "rotary_cos: not supported"),
    (dict(alibi_slopes=torch.zeros(HQ)), "alibi_slopes: not supported"),
    (dict(cache_leftpad=torch.zeros(B)), "cache_leftpad: not supported"),
    (dict(window_size=(-2, 0)), "window_size: each side must be >= 0, or -1"),
    (dict(window_size=5), "window_size: must be a pair"),
    (dict(num_splits=-1), "num_splits: must be an int >= 0"),
    (dict(cache_seqlens=torch.tensor([1, 2, 99])), "cache_seqlens: request 2 would attend 99 tokens"),
    (dict(cache_seqlens=torch.tensor([1, 2])), "cache_seqlens: must have shape [3]"),
    (dict(cache_seqlens=1.5), "cache_seqlens: must be an int or an int32/int64 tensor"),
    (dict(k=torch.zeros(B, 1, HKV, D)), "k, v: give both"),
    (dict(cache_batch_idx=torch.tensor([0, 1, 5])), "cache_batch_idx: entries must lie in [0, 3)"),
])
def test_bad_arguments_name_the_argument(kwargs, message):
    q, k_cache, v_cache, _, _, _ = _inputs(0, 1, False)
    with pytest.raises((ValueError, TypeError)) as e:
        flash_compat.flash_attn_with_kvcache(q, k_cache, v_cache, **kwargs)
    assert message in str(e.value)


def test_paged_cache_needs_lengths_and_no_batch_index():
    q, k_cache, v_cache, bt, _, _ = _inputs(0, 1, True)
    with pytest.raises(ValueError, match="cache_seqlens: required with block_table"):
        flash_compat.flash_attn_with_kvcache(q, k_cache, v_cache, block_table=bt)
    with pytest.raises(ValueError, match="cache_batch_idx: cannot be combined with block_table"):
        flash_compat.flash_attn_with_kvcache(q, k_cache, v_cache, block_table=bt, cache_seqlens=3,
                                             cache_batch_idx=torch.arange(B))


def test_ascend_entry_point_is_the_same_call_and_says_it_needs_an_npu():
    from ascend_ops.flash import flash_attn_with_kvcache as ascend_fa

    q, k_cache, v_cache, bt, _, _ = _inputs(0, 1, True)
    with pytest.raises(RuntimeError, match="NPU"):
        ascend_fa(q, k_cache, v_cache, cache_seqlens=torch.tensor([3, 4, 5]), block_table=bt)
