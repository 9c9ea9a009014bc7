"""``flash_attn_with_kvcache(..., common_prefix_len=N)``: vLLM's cascade convention (every request's
block-table row starts with the same pages, ``block_table[0, :N / page]``) through each backend's
shared-prefix route, against FlashAttention's semantics (the float64 loop of ``test_flash_compat``),
and its refusals, each before anything is written or run."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from splitkv_common import flash_compat  # noqa: E402
from test_flash_compat import fa_reference  # noqa: E402

B, HQ, HKV, D, PAGE, BLOCKS = 3, 4, 2, 64, 8, 5


def _ascend_on_cpu(monkeypatch):
    """The Ascend entry with its NPU check lifted: the wrapper then runs the operator's CPU kernel."""
    import ascend_ops.flash as af

    monkeypatch.setattr(af, "_require_npu", lambda q: None)
    return af.flash_attn_with_kvcache


def _triton():
    try:
        from cuda_ref.flash import flash_attn_with_kvcache
    except ImportError as e:
        pytest.skip(f"triton: {e}")
    return flash_attn_with_kvcache


IMPLS = {"torch": lambda mp: flash_compat.flash_attn_with_kvcache, "triton": lambda mp: _triton(),
         "ascend-cpu-kernel": _ascend_on_cpu}


def shared_inputs(seed, Sq, prefix_pages=2, dtype=torch.float16):
    """A paged cache whose every block-table row starts with request 0's first ``prefix_pages`` pages."""
    g = torch.Generator().manual_seed(seed)
    nb = B * BLOCKS + 2
    q = torch.randn(B, Sq, HQ, D, generator=g).to(dtype)
    k_cache = torch.randn(nb, PAGE, HKV, D, generator=g).to(dtype)
    v_cache = torch.randn(nb, PAGE, HKV, D, generator=g).to(dtype)
    bt = torch.randperm(nb, generator=g)[:B * BLOCKS].reshape(B, BLOCKS).to(torch.int32)
    bt[1:, :prefix_pages] = bt[0, :prefix_pages]
    rows = lambda b: [(int(bt[b, j // PAGE]), j % PAGE) for j in range(BLOCKS * PAGE)]  # noqa: E731
    return q, k_cache, v_cache, bt, rows


@pytest.mark.parametrize("impl", list(IMPLS))
@pytest.mark.parametrize("Sq,causal,window", [(1, False, (-1, -1)), (2, True, (-1, -1))])
def test_common_prefix_len_is_the_same_attention(impl, Sq, causal, window, monkeypatch):
    if impl == "triton" and Sq > 1:
        pytest.skip("one Triton case (the interpreter is slow)")
    fa = IMPLS[impl](monkeypatch)
    q, k_cache, v_cache, bt, rows = shared_inputs(1, Sq)
    lengths = [30, 18, 40]
    out, lse = fa(q, k_cache, v_cache, cache_seqlens=torch.tensor(lengths, dtype=torch.int32), block_table=bt,
                  causal=causal, window_size=window, return_softmax_lse=True, common_prefix_len=16,
                  shared_prefix_mode="on")
    ref_out, ref_lse = fa_reference(q, k_cache, v_cache, lengths, rows, PAGE, D ** -0.5, causal, window, 0.0)
    assert out.shape == (B, Sq, HQ, D) and lse.shape == (B, HQ, Sq)
    np.testing.assert_allclose(out.double().numpy(), ref_out, atol=3e-3, rtol=0)
    np.testing.assert_allclose(lse.numpy(), ref_lse, atol=1e-3, rtol=0)


def test_the_shared_route_runs_and_new_keys_are_appended_first():
    """A spy on the shared decode: it is what runs for ``common_prefix_len > 0`` (after the append)."""
    calls = []

    def spy(*a, **k):
        calls.append((k["shared_prefix"].groups[0].prefix_len, k["mode"], a[4].tolist()))
        return flash_compat.torch_shared_decode(*a, **k)
    fa = flash_compat.make_flash_attn_with_kvcache(flash_compat.torch_decode, "torch", spy)
    q, k_cache, v_cache, bt, rows = shared_inputs(2, 1, dtype=torch.float32)
    g = torch.Generator().manual_seed(3)
    k_new, v_new = torch.randn(B, 1, HKV, D, generator=g), torch.randn(B, 1, HKV, D, generator=g)
    out = fa(q, k_cache, v_cache, k=k_new, v=v_new, cache_seqlens=torch.tensor([20, 16, 33]), block_table=bt,
             causal=True, common_prefix_len=16, shared_prefix_mode="on")
    assert calls == [(16, "on", [21, 17, 34])]
    ref, _ = fa_reference(q, k_cache, v_cache, [21, 17, 34], rows, PAGE, D ** -0.5, True, (-1, -1), 0.0)
    np.testing.assert_allclose(out.double().numpy(), ref, atol=2e-5, rtol=0)
    # 0: the plain decode, the shared route untouched
    fa(q, k_cache, v_cache, cache_seqlens=torch.tensor([20, 16, 33]), block_table=bt, common_prefix_len=0)
    assert len(calls) == 1


@pytest.mark.parametrize("kwargs,exc,message", [
    (dict(common_prefix_len=16.0), TypeError, "common_prefix_len: must be an int"),
    (dict(common_prefix_len=True), TypeError, "common_prefix_len: must be an int"),
    (dict(common_prefix_len=-8), ValueError, "common_prefix_len: must be >= 0"),
    (dict(common_prefix_len=12), ValueError, "common_prefix_len: 12 tokens (vLLM's convention"),
    (dict(common_prefix_len=16, shared_prefix_mode="always"), ValueError, "shared_prefix_mode: must be one of"),
    (dict(common_prefix_len=24, cache_seqlens=torch.tensor([30, 27, 38])), ValueError, "is not the prefix's page"),
    (dict(common_prefix_len=32, cache_seqlens=torch.tensor([38, 30, 38])), ValueError, "must precede every query row"),
    (dict(common_prefix_len=16, block_table=None, cache_seqlens=None), ValueError, "common_prefix_len: needs block_table"),
    (dict(common_prefix_len=16, Sq=2, causal=False), ValueError, "common_prefix_len: needs causal=True"),
])
def test_refusals_name_the_argument_and_write_nothing(kwargs, exc, message):
    kwargs = dict(kwargs)
    Sq = kwargs.pop("Sq", 1)
    q, k_cache, v_cache, bt, _ = shared_inputs(4, Sq, dtype=torch.float32)
    if kwargs.get("block_table", bt) is None:
        k_cache, v_cache = k_cache[:B].clone(), v_cache[:B].clone()   # a contiguous cache [B, PAGE, ...]
    before = k_cache.clone()
    args = dict(cache_seqlens=torch.tensor([30, 17, 38]), block_table=bt, causal=True)
    args.update(kwargs)
    k_new = torch.ones(B, 1, HKV, D)
    with pytest.raises(exc) as e:
        flash_compat.flash_attn_with_kvcache(q, k_cache, v_cache, k=k_new, v=k_new.clone(), **args)
    assert message in str(e.value)
    assert torch.equal(k_cache, before)


def test_a_backend_without_the_route_refuses_it():
    fa = flash_compat.make_flash_attn_with_kvcache(flash_compat.torch_decode, "a plain backend")
    q, k_cache, v_cache, bt, _ = shared_inputs(5, 1, dtype=torch.float32)
    with pytest.raises(ValueError, match="common_prefix_len: a plain backend has no shared-prefix route"):
        fa(q, k_cache, v_cache, cache_seqlens=torch.tensor([30, 17, 40]), block_table=bt, common_prefix_len=16)


def test_the_ascend_entry_still_says_it_needs_an_npu():
    from ascend_ops.flash import flash_attn_with_kvcache as ascend_fa

    q, k_cache, v_cache, bt, _ = shared_inputs(6, 1)
    with pytest.raises(RuntimeError, match="NPU"):
        ascend_fa(q, k_cache, v_cache, cache_seqlens=torch.tensor([30, 17, 40]), block_table=bt, common_prefix_len=16,
                  shared_prefix_mode="on")
