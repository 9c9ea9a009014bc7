"""The attention backend vLLM Ascend's platform hands out while the plugin is on.

Subclasses of vLLM Ascend's own GQA backend (``AscendAttentionBackend``), implementation
(``AscendAttentionBackendImpl``) and metadata builder (``AscendAttentionMetadataBuilder``): the
implementation overrides only ``forward_impl`` (what ``forward`` calls after ``reshape_and_cache``
has written the step's K/V into the cache), the builder only ``build`` (it calls the parent's and,
in full-graph mode, refreshes the graph buffers). A routed step (see :mod:`splitkv_vllm.adapter`)
runs through splitkv; everything else goes to the parent unchanged. PCP/DCP implementations and
builders and the MLA/SFA/DSA backends are left alone (the parent's ``get_impl_cls`` /
``get_builder_cls`` answer is kept whenever it is not the plain class).

Graph modes (:data:`splitkv_vllm.graph.GRAPH_MODE_ROUTING`): a step is routed by what its
metadata says (decode-only: no prefill rows), in every mode, wherever attention runs eagerly: eager
mode, PIECEWISE (attention runs between the captured pieces), and the steps the full-graph modes run
eagerly. Full graphs run our op in ``FULL_DECODE_ONLY`` and ``FULL_AND_PIECEWISE``, where vLLM
replays a full graph only for uniform-decode batches. In plain ``FULL`` vLLM Ascend keys every graph
non-uniform, so the graph of a size replays mixed batches as well: captures stay on vLLM Ascend's
path and the builder makes and refreshes no graph buffers (said once in the log).

Full graphs (routed modes): the backend's metadata builder (:class:`SplitKVAscendMetadataBuilder`)
marks each step's metadata; an eager step of a graph size (vLLM's warm-up before each capture)
makes the fixed buffers of that size (:class:`splitkv_vllm.graph.GraphDecoder`); the capture
(``_EXTRA_CTX.capturing``) records our kernels on those buffers; and before every later step of that
size the builder re-plans the padded batch and rewrites the buffers in place (host, on the current
stream, before the runner enqueues the replay; with ``device_plan`` it makes no plan and only copies
the step's lengths, offsets and block table). vLLM Ascend's own ``update_graph_params`` has nothing
of ours to update. A capture that cannot use the buffers (no warm-up, a draft model,
``impl=torch``) goes to the parent, as before. The buffers' bytes are reserved while vLLM loads the
model (so its memory profile counts them) and handed back just before the buffers are made.

Every routed step first calls vLLM Ascend's ``record_attention_compute_start()`` (the KV-pool
transfer fence its own ``forward_impl`` records), and is counted in :mod:`splitkv_vllm.stats`.

This module imports vLLM Ascend (and so torch_npu): only the platform loads it, by name.
"""

from __future__ import annotations

import logging
import types

import torch
from vllm_ascend.attention import attention_v1 as _v1

from . import adapter, graph, settings, shared_prefix, stats
from .log import logger, once

_PARENT_BACKEND = _v1.AscendAttentionBackend
_PARENT_IMPL = _v1.AscendAttentionBackendImpl

# impl constructor order in vLLM Ascend: num_heads, head_size, scale, num_kv_heads, alibi_slopes,
# sliding_window, kv_cache_dtype, logits_soft_cap, attn_type, kv_sharing_target_layer_name
_SOFT_CAP_POS = 7


_PARENT_BUILDER = _v1.AscendAttentionMetadataBuilder
KERNEL_BLOCK_SIZE = 128   # AscendAttentionBackend.get_supported_kernel_block_sizes() at the tested versions


def _capturing() -> bool:
    try:
        from vllm_ascend.ascend_forward_context import _EXTRA_CTX
        return bool(getattr(_EXTRA_CTX, "capturing", False))
    except Exception:  # noqa: BLE001 - a layout without full-graph capture
        return False


def _full_capture() -> bool:
    """Whether the capture in progress records attention (a FULL graph), not a PIECEWISE one, whose
    attention runs eagerly between the captured pieces while vLLM Ascend's ``capturing`` flag stays set:
    vLLM's forward context's ``cudagraph_runtime_mode``; True when it does not say."""
    try:
        from vllm.forward_context import get_forward_context

        mode = getattr(get_forward_context(), "cudagraph_runtime_mode", None)
    except Exception:  # noqa: BLE001 - no forward context
        return True
    return mode is None or graph.mode_name(mode) != "PIECEWISE"


def _graph_unsupported() -> str | None:
    """``None`` when this step may use (or make) graph buffers, else why not."""
    from . import dispatch

    if dispatch.requested_impl() == "torch":
        return "impl=torch (graph mode needs the operator)"
    try:
        from vllm_ascend.ascend_forward_context import _EXTRA_CTX
        if getattr(_EXTRA_CTX, "is_draft_model", False):
            return "draft model (its graphs replay several steps' metadata)"
    except Exception as e:  # noqa: BLE001
        return f"no vLLM Ascend forward context ({type(e).__name__})"
    return None


def _capture_unsupported(mode) -> str | None:
    """``None`` when a capture in cudagraph ``mode`` may record our op, else why not."""
    if not graph.full_graphs_routed(mode):
        return graph.mode_routing(mode)
    return _graph_unsupported()


def _mode(obj):
    cc = getattr(getattr(obj, "vllm_config", None), "compilation_config", None)
    if cc is None:
        cc = getattr(obj, "compilation_config", None)
    return getattr(cc, "cudagraph_mode", None)


def _graph_sizes(builder) -> frozenset:
    """The token counts of the full decode graphs that run our op (:func:`splitkv_vllm.graph.decode_sizes`;
    empty when none do: no buffers, no refresh)."""
    cc = getattr(builder, "compilation_config", None)
    if not graph.full_graphs_routed(getattr(cc, "cudagraph_mode", None)):
        return frozenset()
    cfg = getattr(builder, "vllm_config", None) or types.SimpleNamespace(compilation_config=cc)
    return frozenset(graph.decode_sizes(cfg))


def _kernel_block_size() -> int:
    """The physical KV block the caches use: vLLM Ascend's kernel block size (128), not the scheduler's
    ``cache_config.block_size`` (larger for hybrid models)."""
    try:
        return int(_PARENT_BACKEND.get_supported_kernel_block_sizes()[0])
    except Exception:  # noqa: BLE001 - a stand-in without it
        return KERNEL_BLOCK_SIZE


def _fence() -> None:
    """vLLM Ascend's KV-pool transfer fence, as its own ``forward_impl`` records it first thing."""
    fn = getattr(_v1, "record_attention_compute_start", None)
    if fn is not None:
        fn()


def _device():
    npu = getattr(torch, "npu", None)
    try:
        if npu is not None and npu.is_available():
            return torch.device("npu", npu.current_device())
    except Exception:  # noqa: BLE001
        pass
    return torch.device("cpu")


_ESTIMATES: dict = {}


def _reserve_graph_memory(impl, layer: adapter.LayerSpec, soft_cap) -> None:
    """While vLLM loads the model: hold the bytes our graph buffers will take (one set per layer constants)."""
    cfg = getattr(impl, "vllm_config", None)
    mode = _mode(impl)
    if (layer.layer_unsupported or not graph.full_graphs_routed(mode) or not settings.current().reserve_graph_memory
            or settings.current().impl == "torch"):
        return
    try:
        mc = cfg.model_config
        dtype = mc.dtype if isinstance(mc.dtype, torch.dtype) else getattr(torch, str(mc.dtype))
        kv = str(getattr(impl, "kv_cache_dtype", "auto"))
        kv_dtype = dtype if kv == "auto" else {"bfloat16": torch.bfloat16, "float16": torch.float16}.get(kv, dtype)
        sizes = graph.decode_sizes(cfg)
        page = _kernel_block_size()
        key = (layer.num_heads, layer.num_kv_heads, layer.head_size, page, dtype, kv_dtype, layer.scale,
               layer.soft_cap, layer.window_left, int(mc.max_model_len), sizes)
        if key not in _ESTIMATES:
            _ESTIMATES[key] = graph.estimate_graph_bytes(
                num_q_heads=layer.num_heads, num_kv_heads=layer.num_kv_heads, head_dim=layer.head_size,
                page_size=page, dtype=dtype, kv_dtype=kv_dtype, max_model_len=int(mc.max_model_len),
                capture_sizes=sizes, window_left=layer.window_left, soft_cap=layer.soft_cap, scale=layer.scale,
                query_rows=graph.speculative_rows(types.SimpleNamespace(vllm_config=cfg)) or 1)
        graph.reserve_graph_memory(key, _ESTIMATES[key], _device())
    except Exception as e:  # noqa: BLE001 - a reserve we cannot size is logged, never fatal
        once(logging.WARNING, "splitkv: graph buffer memory not reserved before profiling (%s: %s)",
             type(e).__name__, e)


class SplitKVAscendMetadataBuilder(_PARENT_BUILDER):
    """vLLM Ascend's metadata builder, plus the host step of full-graph mode: before each step of a
    captured size, re-plan the padded batch and rewrite the graph buffers in place.

    A drafter's build (``fast_build``: vLLM Ascend's ``build_for_drafting``) is returned as the parent
    made it: it never touches the target's graph buffers."""

    def build(self, *args, **kwargs):
        meta = super().build(*args, **kwargs)
        fast_build = kwargs.get("fast_build", args[2] if len(args) > 2 else False)
        if fast_build:
            return meta
        # vLLM's build(common_prefix_len, common_attn_metadata, fast_build): kept for the eager step's
        # shared-prefix route (splitkv_vllm.shared_prefix)
        shared_prefix.record(meta, kwargs.get("common_prefix_len", args[0] if args else 0))
        ends = getattr(meta, "actual_seq_lengths_q", None)
        if ends and int(ends[-1]) in _graph_sizes(self):
            graph.refresh_graph_step(meta, self)
        return meta


_ERRORS_SEEN: set = set()


def _eager_failed(e: Exception) -> None:
    """A routed eager step raised: raise again when ``strict``, else log (once per error type) and count."""
    if settings.current().strict:
        raise e
    name = type(e).__name__
    stats.note_fallback(f"error: {name}")
    if name not in _ERRORS_SEEN:
        _ERRORS_SEEN.add(name)
        logger.warning("splitkv: a routed decode step raised %s (%s); it and later ones that raise go to vLLM "
                       "Ascend's path (strict: raise)", name, e)


class SplitKVAscendAttentionImpl(_PARENT_IMPL):
    """vLLM Ascend's implementation with decode-only steps routed through splitkv."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        settings.configure(getattr(self, "vllm_config", None))
        cap = kwargs.get("logits_soft_cap", args[_SOFT_CAP_POS] if len(args) > _SOFT_CAP_POS else None)
        self._splitkv_layer = adapter.LayerSpec.from_impl(self, soft_cap=cap)
        # vLLM keeps head_size_v to itself (its Attention layer does not pass it to the impl): the V head
        # size is checked once the caches are bound, with their layout and dtypes
        self._splitkv_cache_why = None
        self._splitkv_cache_checked = False
        if self._splitkv_layer.layer_unsupported:
            once(logging.INFO, "splitkv: layer stays on vLLM Ascend's path: %s", self._splitkv_layer.layer_unsupported)
        self.splitkv_routed_steps = 0
        self.splitkv_graph_captures = 0
        _reserve_graph_memory(self, self._splitkv_layer, cap)

    def _splitkv_unsupported(self, attn_metadata, query=None) -> str | None:
        layer = self._splitkv_layer
        if layer.layer_unsupported:
            return layer.layer_unsupported
        if self.key_cache is None:
            return "no KV cache bound to the layer yet"
        if not self._splitkv_cache_checked:
            self._splitkv_cache_why = adapter.cache_unsupported(layer, self.key_cache, self.value_cache, query)
            self._splitkv_cache_checked = True
            if self._splitkv_cache_why:
                once(logging.INFO, "splitkv: layer stays on vLLM Ascend's path: %s", self._splitkv_cache_why)
        return self._splitkv_cache_why or adapter.batch_unsupported(attn_metadata)

    def forward_impl(self, query, key, value, kv_cache, attn_metadata, output):
        layer = self._splitkv_layer
        capturing = _capturing()
        why = self._splitkv_unsupported(attn_metadata, query)
        if why:
            stats.note_fallback(why)
            if not capturing and not adapter.batch_unsupported(attn_metadata):   # the layer's own reason
                graph.note_warm_up(attn_metadata, id(self), why)
            return super().forward_impl(query, key, value, kv_cache, attn_metadata, output)
        if capturing:
            why = (_capture_unsupported(_mode(self)) or graph.capture_mixed(attn_metadata)
                   or graph.graph_unsupported(layer, query, self.key_cache, attn_metadata))
            if why:
                once(logging.INFO, "splitkv: full-graph capture stays on vLLM Ascend's path: %s", why)
                stats.note_fallback(f"capture: {why}")
                return super().forward_impl(query, key, value, kv_cache, attn_metadata, output)
            _fence()
            full = _full_capture()
            if full:
                self.splitkv_graph_captures += 1
                stats.note_capture()
            return graph.forward_graph(layer, query, self.key_cache, self.value_cache, attn_metadata, output,
                                       full=full)
        if getattr(attn_metadata, "_splitkv_graph_group", None) is not None and not _graph_unsupported():
            try:
                graph.prepare_graph(layer, query, self.key_cache, attn_metadata)
            except Exception as e:  # noqa: BLE001 - no buffers: the capture of this size stays on vLLM Ascend's
                if settings.current().strict:
                    raise
                once(logging.WARNING, "splitkv: graph buffers not made (%s: %s); captures of that size stay on "
                     "vLLM Ascend's path", type(e).__name__, e)
                graph.note_warm_up(attn_metadata, id(self), f"graph buffers not made ({type(e).__name__})")
                graph.drop_graph_mark(attn_metadata)
        try:
            _fence()
            adapter.forward_decode(layer, query, self.key_cache, self.value_cache, attn_metadata, output)
        except Exception as e:  # noqa: BLE001 - anything the op refuses goes to the stock path, unless strict
            _eager_failed(e)
            graph.note_warm_up(attn_metadata, id(self), f"the routed step raised {type(e).__name__}")
            return super().forward_impl(query, key, value, kv_cache, attn_metadata, output)
        self.splitkv_routed_steps += 1
        stats.note_routed(attn_metadata)
        return output


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
