"""FlashAttention's ``flash_attn_with_kvcache`` on the Ascend C operator (``splitkv_common.flash_compat``).

The same call as FlashAttention's (and as the FlashAttention port for Ascend keeps it), run by
:func:`ascend_ops.decode_attention` on an NPU.
"""

from __future__ import annotations

from splitkv_common.flash_compat import make_flash_attn_with_kvcache


def ascend_decode(q, k_cache, v_cache, block_table, seq_lens, query_start_loc, *, scale, soft_cap, window_left,
                  policy):
    """:func:`ascend_ops.decode_attention` as the FlashAttention-call adapter's
    :class:`~splitkv_common.flash_compat.Decode`."""
    from .wrapper import decode_attention

    return decode_attention(q, k_cache, v_cache, block_table, seq_lens, query_start_loc, scale=scale,
                            soft_cap=soft_cap, window_left=window_left, policy=policy)


def _require_npu(q) -> None:
    """The operator runs on an NPU: a CPU ``q`` is refused as :func:`ascend_ops.decode_attention` refuses it."""
    from .ops import QUALNAME
    from .runtime import require_npu_kernel, runtime_unavailable

    if q.device.type == "cpu":
        why = runtime_unavailable()
        raise RuntimeError(f"{QUALNAME}: q is a CPU tensor; the operator runs on an Ascend NPU"
                           + (f", and none is usable here: {why}" if why else " (move the tensors to 'npu')"))
    require_npu_kernel(q.device)


def ascend_shared_decode(q, k_cache, v_cache, block_table, seq_lens, query_start_loc, *, shared_prefix, mode, scale,
                         soft_cap, window_left, policy):
    """``AscendDecodeWrapper.plan(..., shared_prefix=...)`` and ``run()`` (:mod:`ascend_ops.shared_prefix_op`)
    as the adapter's :class:`~splitkv_common.flash_compat.SharedDecode`, for ``common_prefix_len``."""
    from .wrapper import AscendDecodeWrapper

    _require_npu(q)
    _, Hq, D = q.shape
    P, page, Hkv, _ = k_cache.shape
    w = AscendDecodeWrapper(Hq, Hkv, D, page, dtype=q.dtype, kv_dtype=k_cache.dtype, device=q.device, policy=policy)
    w.plan(seq_lens.cpu().numpy(), query_start_loc=query_start_loc.cpu().numpy(), window_left=window_left,
           scale=scale, soft_cap=soft_cap, max_pages=block_table.shape[1], num_pages=P, shared_prefix=shared_prefix,
           block_table=block_table.cpu().numpy(), shared_prefix_mode=mode)
    return w.run(q, k_cache, v_cache, block_table.contiguous(), scale=scale, soft_cap=soft_cap,
                 window_left=window_left)


flash_attn_with_kvcache = make_flash_attn_with_kvcache(ascend_decode, "the Ascend C operator (NPU)",
                                                       ascend_shared_decode)
