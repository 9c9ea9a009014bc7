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


flash_attn_with_kvcache = make_flash_attn_with_kvcache(ascend_decode, "the Ascend C operator (NPU)")
