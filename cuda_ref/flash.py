"""FlashAttention's ``flash_attn_with_kvcache`` on the Triton kernels (``splitkv_common.flash_compat``)."""

from __future__ import annotations

from splitkv_common.flash_compat import make_flash_attn_with_kvcache

from .wrapper import DecodeWrapper


def triton_decode(q, k_cache, v_cache, block_table, seq_lens, query_start_loc, *, scale, soft_cap, window_left,
                  policy):
    """One planned call of :class:`~cuda_ref.wrapper.DecodeWrapper` (the FlashAttention-call adapter's
    :class:`~splitkv_common.flash_compat.Decode`)."""
    _, Hq, D = q.shape
    _, page, Hkv, _ = k_cache.shape
    w = DecodeWrapper(Hq, Hkv, D, page, dtype=q.dtype, kv_dtype=k_cache.dtype, device=q.device, policy=policy)
    w.plan(seq_lens.cpu().numpy(), query_start_loc=query_start_loc.cpu().numpy(), window_left=window_left)
    # the lengths were just read on the host (a sync already): check the block table's values too
    return w.run(q, k_cache, v_cache, block_table, seq_lens, query_start_loc, scale=scale, soft_cap=soft_cap,
                 window_left=window_left, validate=True)


def triton_shared_decode(q, k_cache, v_cache, block_table, seq_lens, query_start_loc, *, shared_prefix, mode, scale,
                         soft_cap, window_left, policy):
    """One planned call of :class:`~cuda_ref.shared_prefix.SharedPrefixWrapper` (the adapter's
    :class:`~splitkv_common.flash_compat.SharedDecode`, for ``common_prefix_len``)."""
    from .shared_prefix import SharedPrefixWrapper

    _, Hq, D = q.shape
    _, page, Hkv, _ = k_cache.shape
    w = SharedPrefixWrapper(Hq, Hkv, D, page, dtype=q.dtype, kv_dtype=k_cache.dtype, device=q.device, policy=policy,
                            mode=mode)
    w.plan(seq_lens.cpu().numpy(), query_start_loc.cpu().numpy(), shared_prefix=shared_prefix,
           block_table=block_table.cpu().numpy(), window_left=window_left)
    return w.run(q, k_cache, v_cache, block_table, seq_lens, query_start_loc, scale=scale, soft_cap=soft_cap,
                 window_left=window_left, validate=True)


flash_attn_with_kvcache = make_flash_attn_with_kvcache(triton_decode, "the Triton kernels", triton_shared_decode)
