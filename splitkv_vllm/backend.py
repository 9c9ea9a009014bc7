"""The attention backend vLLM Ascend's platform hands out while the plugin is on.

Subclasses of vLLM Ascend's own GQA backend (``AscendAttentionBackend``), implementation
(``AscendAttentionBackendImpl``) and metadata builder (``AscendAttentionMetadataBuilder``): the
implementation overrides only ``forward_impl`` (what ``forward`` calls after ``reshape_and_cache``
has written the step's K/V into the cache), the builder only ``build`` (it calls the parent's and,
in full-graph mode, refreshes the graph buffers). A routed step (see :mod:`splitkv_vllm.adapter`)
runs through splitkv; everything else goes to the parent unchanged. PCP/DCP implementations and
builders and the MLA/SFA/DSA backends are left alone (the parent's ``get_impl_cls`` /
``get_builder_cls`` answer is kept whenever it is not the plain class).

Graphs: in vLLM Ascend's piecewise aclgraph mode attention runs eagerly between the captured
pieces, so routed steps go through splitkv as in eager mode. In full-graph mode
(``FULL_DECODE_ONLY`` / ``FULL``), the backend's metadata builder
(:class:`SplitKVAscendMetadataBuilder`) marks each step's metadata; an eager step of a graph size
(vLLM's warm-up before each capture) makes the fixed buffers of that size
(:class:`splitkv_vllm.dispatch.GraphDecoder`); the capture (``_EXTRA_CTX.capturing``) records our
kernels on those buffers; and before every later step of that size the builder re-plans the padded
batch and rewrites the buffers in place (host, on the current stream, before the runner enqueues the
replay; stream order puts the copies after the previous replay and before this one). vLLM
Ascend's own ``update_graph_params`` (run after the replay is enqueued, through events its captured
FIA tasks wait on) has nothing of ours to update. A capture that cannot use the buffers (no warm-up,
a draft model, a graph of mixed batches, ``SPLITKV_VLLM_IMPL=torch``) goes to the parent, as before.

This module imports vLLM Ascend (and so torch_npu): only the platform loads it, by name.
"""

from __future__ import annotations

import logging

from vllm_ascend.attention import attention_v1 as _v1

from . import adapter, graph

logger = logging.getLogger("splitkv_vllm")

_PARENT_BACKEND = _v1.AscendAttentionBackend
_PARENT_IMPL = _v1.AscendAttentionBackendImpl

# impl constructor order in vLLM Ascend: num_heads, head_size, scale, num_kv_heads, alibi_slopes,
# sliding_window, kv_cache_dtype, logits_soft_cap, attn_type, kv_sharing_target_layer_name
_SOFT_CAP_POS = 7
_LOGGED: set[str] = set()


_PARENT_BUILDER = _v1.AscendAttentionMetadataBuilder


def _capturing() -> bool:
    try:
        from vllm_ascend.ascend_forward_context import _EXTRA_CTX
        return bool(getattr(_EXTRA_CTX, "capturing", False))
    except Exception:  # noqa: BLE001 - a layout without full-graph capture
        return False


def _graph_unsupported() -> str | None:
    """``None`` when this step may use (or make) graph buffers, else why not."""
    from . import dispatch

    if dispatch.requested_impl() == "torch":
        return "SPLITKV_VLLM_IMPL=torch (graph mode needs the operator)"
    try:
        from vllm_ascend.ascend_forward_context import _EXTRA_CTX
        if getattr(_EXTRA_CTX, "is_draft_model", False):
            return "draft model (its graphs replay several steps' metadata)"
    except Exception as e:  # noqa: BLE001
        return f"no vLLM Ascend forward context ({type(e).__name__})"
    return None


def _capture_unsupported() -> str | None:
    """``None`` when the graph being captured replays only batches our refresh covers, else why not."""
    why = _graph_unsupported()
    if why:
        return why
    try:
        from vllm.forward_context import get_forward_context
        desc = getattr(get_forward_context(), "batch_descriptor", None)
    except Exception as e:  # noqa: BLE001
        return f"no forward context ({type(e).__name__})"
    if desc is None or not getattr(desc, "uniform", False):
        return "graph of mixed batches (only uniform-decode graphs are routed)"
    return None


def _graph_sizes(builder) -> frozenset:
    """The token counts vLLM captures full graphs for (empty when full graphs are off)."""
    cc = getattr(builder, "compilation_config", None)
    mode = getattr(cc, "cudagraph_mode", None)
    try:
        full = bool(mode is not None and mode.has_full_cudagraphs())
    except Exception:  # noqa: BLE001
        full = False
    return frozenset(int(n) for n in (getattr(cc, "cudagraph_capture_sizes", None) or ())) if full else frozenset()


class SplitKVAscendMetadataBuilder(_PARENT_BUILDER):
    """vLLM Ascend's metadata builder, plus the host step of full-graph mode: before each step of a
    captured size, re-plan the padded batch and rewrite the graph's buffers in place."""

    def build(self, common_prefix_len, common_attn_metadata, fast_build: bool = False):
        meta = super().build(common_prefix_len, common_attn_metadata, fast_build)
        ends = getattr(meta, "actual_seq_lengths_q", None)
        if ends and int(ends[-1]) in _graph_sizes(self):
            graph.refresh_graph_step(meta, self)
        return meta


class SplitKVAscendAttentionImpl(_PARENT_IMPL):
    """vLLM Ascend's implementation with decode-only steps routed through splitkv."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        cap = kwargs.get("logits_soft_cap", args[_SOFT_CAP_POS] if len(args) > _SOFT_CAP_POS else None)
        self._splitkv_layer = adapter.LayerSpec.from_impl(self, soft_cap=cap)
        if self._splitkv_layer.layer_unsupported:
            logger.info("splitkv: layer stays on vLLM Ascend's path: %s", self._splitkv_layer.layer_unsupported)
        self.splitkv_routed_steps = 0
        self.splitkv_graph_captures = 0

    def forward_impl(self, query, key, value, kv_cache, attn_metadata, output):
        layer = self._splitkv_layer
        why = layer.layer_unsupported or adapter.batch_unsupported(attn_metadata)
        if why or self.key_cache is None:
            return super().forward_impl(query, key, value, kv_cache, attn_metadata, output)
        if _capturing():
            why = _capture_unsupported() or graph.graph_unsupported(layer, query, self.key_cache, attn_metadata)
            if why:
                if why not in _LOGGED:
                    _LOGGED.add(why)
                    logger.info("splitkv: full-graph capture stays on vLLM Ascend's path: %s", why)
                return super().forward_impl(query, key, value, kv_cache, attn_metadata, output)
            self.splitkv_graph_captures += 1
            return graph.forward_graph(layer, query, self.key_cache, self.value_cache, attn_metadata, output)
        self.splitkv_routed_steps += 1
        if getattr(attn_metadata, "_splitkv_graph_group", None) is not None and not _graph_unsupported():
            graph.prepare_graph(layer, query, self.key_cache, attn_metadata)
        return adapter.forward_decode(layer, query, self.key_cache, self.value_cache, attn_metadata, output)


class SplitKVAscendAttentionBackend(_PARENT_BACKEND):
    """vLLM Ascend's GQA attention backend with splitkv decode."""

    @staticmethod
    def get_impl_cls():
        cls = _PARENT_BACKEND.get_impl_cls()
        return SplitKVAscendAttentionImpl if cls is _PARENT_IMPL else cls

    @staticmethod
    def get_builder_cls():
        cls = _PARENT_BACKEND.get_builder_cls()
        return SplitKVAscendMetadataBuilder if cls is _PARENT_BUILDER else cls
