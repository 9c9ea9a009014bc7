"""The attention backend vLLM Ascend's platform hands out while the plugin is on.

Subclasses of vLLM Ascend's own GQA backend (``AscendAttentionBackend``) and implementation
(``AscendAttentionBackendImpl``): the implementation overrides only ``forward_impl`` (what
``forward`` calls after ``reshape_and_cache`` has written the step's K/V into the cache). A routed
step (see :mod:`splitkv_vllm.adapter`) runs through splitkv; everything else goes to the parent
unchanged. PCP/DCP implementations and the MLA/SFA/DSA backends are left alone (the parent's
``get_impl_cls`` answer is kept whenever it is not the plain implementation).

Graphs: in vLLM Ascend's piecewise aclgraph mode attention runs eagerly between the captured
pieces, so routed steps go through splitkv. While a *full* graph is being captured
(``_EXTRA_CTX.capturing``), the step goes to the parent: vLLM Ascend re-targets its own captured
FIA launches on replay, and the in-place plan refresh our op needs for that
(:class:`splitkv_vllm.dispatch.GraphDecoder`) is not wired into its replay loop yet.

This module imports vLLM Ascend (and so torch_npu): only the platform loads it, by name.
"""

from __future__ import annotations

import logging

from vllm_ascend.attention import attention_v1 as _v1

from . import adapter

logger = logging.getLogger("splitkv_vllm")

_PARENT_BACKEND = _v1.AscendAttentionBackend
_PARENT_IMPL = _v1.AscendAttentionBackendImpl

# impl constructor order in vLLM Ascend: num_heads, head_size, scale, num_kv_heads, alibi_slopes,
# sliding_window, kv_cache_dtype, logits_soft_cap, attn_type, kv_sharing_target_layer_name
_SOFT_CAP_POS = 7


def _capturing() -> bool:
    try:
        from vllm_ascend.ascend_forward_context import _EXTRA_CTX
        return bool(getattr(_EXTRA_CTX, "capturing", False))
    except Exception:  # noqa: BLE001 - a layout without full-graph capture
        return False


class SplitKVAscendAttentionImpl(_PARENT_IMPL):
    """vLLM Ascend's implementation with decode-only steps routed through splitkv."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        cap = kwargs.get("logits_soft_cap", args[_SOFT_CAP_POS] if len(args) > _SOFT_CAP_POS else None)
        self._splitkv_layer = adapter.LayerSpec.from_impl(self, soft_cap=cap)
        if self._splitkv_layer.layer_unsupported:
            logger.info("splitkv: layer stays on vLLM Ascend's path: %s", self._splitkv_layer.layer_unsupported)
        self.splitkv_routed_steps = 0

    def forward_impl(self, query, key, value, kv_cache, attn_metadata, output):
        why = self._splitkv_layer.layer_unsupported or adapter.batch_unsupported(attn_metadata)
        if why or self.key_cache is None or _capturing():
            return super().forward_impl(query, key, value, kv_cache, attn_metadata, output)
        self.splitkv_routed_steps += 1
        return adapter.forward_decode(self._splitkv_layer, query, self.key_cache, self.value_cache, attn_metadata,
                                      output)


class SplitKVAscendAttentionBackend(_PARENT_BACKEND):
    """vLLM Ascend's GQA attention backend with splitkv decode."""

    @staticmethod
    def get_impl_cls():
        cls = _PARENT_BACKEND.get_impl_cls()
        return SplitKVAscendAttentionImpl if cls is _PARENT_IMPL else cls
