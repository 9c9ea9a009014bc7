"""Split-KV decode attention backend for vLLM Ascend: the proposed ``vllm_ascend/attention/splitkv_v1.py``.

An alternative GQA backend built the way vLLM Ascend added FA3 (``attention/fa3_v1.py``): its own
module, selected in ``NPUPlatform.get_attn_backend_cls`` by ``_validate_splitkv_backend``
(:data:`splitkv_vllm.upstream.PLATFORM_FUNCTION`) when ``additional_config["enable_splitkv_decode"]``
is true and the external ``ascend_ops`` package is installed. The implementation subclasses
``AscendAttentionBackendImpl`` and the metadata builder ``AscendAttentionMetadataBuilder``:

* the builder plans each decode-only step once on the host, from the host lengths the parent's
  ``build()`` already made (``actual_seq_lengths_q``, ``seq_lens_list``), and owns one
  ``ascend_ops.AscendDecodeWrapper`` per set of layer constants, reused every step;
* the implementation routes a decode-only step (no prefill rows, causal) of a supported layer and
  leaves everything else, and every step inside a graph capture, to the parent's ``forward_impl``:
  no host sync, no allocation per layer (the wrapper takes the step's plan once, then each layer
  only enqueues the kernels);
* graph modes with FULL graphs are refused at start-up until the builder also owns graph-stable
  buffers; eager and PIECEWISE (attention runs eagerly between the pieces) are served.

Layers that stay on the parent's path: ALiBi, attention sinks, sliding window, encoder or
cross-attention, C8 or other quantized KV caches, head sizes or dtypes the kernels do not take
(``ascend_ops.support.unsupported_reason``).
"""

from __future__ import annotations

import logging

import torch
from vllm_ascend.attention import attention_v1 as _v1

logger = logging.getLogger("vllm.vllm_ascend.attention.splitkv_v1")

ROUTED_STATES = ("DecodeOnly", "SpecDecoding", "ChunkedPrefill")
KV_CACHE_DTYPES = ("auto", "bfloat16", "float16")
FULL_GRAPH_MODES = ("FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE")


def _name(x) -> str:
    return str(getattr(x, "name", None) or x).rsplit(".", 1)[-1]


def layer_unsupported(impl, dtype: torch.dtype) -> str | None:
    """``None`` when the layer's decode can run on the split-KV kernels, else why not."""
    from ascend_ops.support import unsupported_reason

    if impl.alibi_slopes is not None:
        return "ALiBi"
    if getattr(impl, "sinks", None) is not None:
        return "attention sinks"
    if impl.sliding_window is not None:
        return "sliding window"
    if _name(getattr(impl, "attn_type", "decoder")).lower() != "decoder":
        return f"attention type {impl.attn_type}"
    if str(impl.kv_cache_dtype) not in KV_CACHE_DTYPES or getattr(impl, "enable_c8_quant", False):
        return f"KV cache dtype {impl.kv_cache_dtype}"
    name = str(dtype).rsplit(".", 1)[-1]
    return unsupported_reason(int(impl.head_size), name, name)


def decode_only(meta) -> bool:
    """Whether the step is decode-only: no prefill rows, causal, a routed attention state."""
    return (meta is not None and not meta.num_prefills and meta.causal
            and _name(meta.attn_state) in ROUTED_STATES and meta.actual_seq_lengths_q is not None)


class SplitKVStep:
    """A decode-only step: its host lengths and its plans, made once per set of KV-cache constants.

    ``query_start_loc`` ``[B + 1]`` and ``seq_lens`` ``[B]`` are int32 NumPy arrays (host), read from
    the metadata at first use and compared at every later use (the v2 speculator rewrites them in
    place between draft steps; a changed length makes a new plan)."""

    def __init__(self, meta, wrappers: dict):
        self.meta, self.wrappers, self.plans, self._lengths = meta, wrappers, {}, None

    def lengths(self):
        import numpy as np

        ends = tuple(self.meta.actual_seq_lengths_q)
        seqs = tuple(self.meta.seq_lens_list[:len(ends)])
        if self._lengths is None or self._lengths[0] != (ends, seqs):
            qsl = np.asarray((0,) + ends, np.int32)
            self._lengths = ((ends, seqs), qsl, np.asarray(seqs, np.int32))
            self.plans.clear()
        return self._lengths[1], self._lengths[2]

    def run(self, impl, query: torch.Tensor, output: torch.Tensor) -> torch.Tensor:
        """Decode attention of the step into ``output[:num_tokens]``; ``query`` ``[T, Hq, D]``."""
        from ascend_ops import AscendDecodeWrapper
        from splitkv_common.plan import make_plan

        qsl, sl = self.lengths()
        n, B = int(qsl[-1]), int(sl.shape[0])
        kc, vc = impl.key_cache, impl.value_cache
        Hq, Hkv, D, page = impl.num_heads, impl.num_kv_heads, impl.head_size, int(kc.shape[1])
        bt = self.meta.block_tables[:B]
        pkey = (Hkv, page, Hq, D, kc.element_size())
        plan = self.plans.get(pkey)
        if plan is None:
            plan = self.plans[pkey] = make_plan(sl, num_kv_heads=Hkv, page_size=page, query_start_loc=qsl,
                                                num_q_heads=Hq, head_dim=D, kv_elem_bytes=kc.element_size())
        wkey = pkey + (query.dtype, kc.dtype, float(impl.scale))
        w = self.wrappers.get(wkey)
        if w is None:
            w = self.wrappers[wkey] = AscendDecodeWrapper(Hq, Hkv, D, page, dtype=query.dtype, kv_dtype=kc.dtype,
                                                          device=query.device)
        if w.host_plan is not plan:
            w.set_plan(plan, seq_lens=sl, scale=impl.scale, max_pages=int(bt.shape[1]), num_pages=int(kc.shape[0]),
                       validate=False)
        q = query[:n].reshape(n, Hq, D)
        o = output.view(-1, Hq, D)[:n]
        out, _ = w.run(q if q.is_contiguous() else q.contiguous(), kc, vc,
                       bt if bt.dtype == torch.int32 else bt.to(torch.int32), out=o if o.is_contiguous() else None)
        if out is not o:
            o.copy_(out)
        return output


class AscendSplitKVMetadataBuilder(_v1.AscendAttentionMetadataBuilder):
    """The parent's builder, plus the step's split-KV state on decode-only metadata (``splitkv_step``)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.splitkv_wrappers: dict = {}   # layer constants -> AscendDecodeWrapper, reused every step

    def build(self, *args, **kwargs):
        meta = super().build(*args, **kwargs)
        meta.splitkv_step = SplitKVStep(meta, self.splitkv_wrappers) if decode_only(meta) else None
        return meta


class AscendSplitKVImpl(_v1.AscendAttentionBackendImpl):
    """The parent's implementation with decode-only steps of supported layers on the split-KV kernels."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        cfg = self.vllm_config
        mode = _name(cfg.compilation_config.cudagraph_mode)
        if not cfg.model_config.enforce_eager and mode in FULL_GRAPH_MODES:
            raise ValueError(f"AscendSplitKVImpl does not support ACL graph capture in {mode} mode yet (its graph "
                             "buffers are not builder-owned). Set enforce_eager=True, use "
                             "cudagraph_mode=PIECEWISE, or unset enable_splitkv_decode.")
        self.splitkv_unsupported = layer_unsupported(self, cfg.model_config.dtype)
        if self.splitkv_unsupported:
            logger.info("split-KV decode: a layer keeps the default attention path (%s)", self.splitkv_unsupported)

    def forward_impl(self, query, key, value, kv_cache, attn_metadata, output):
        from vllm_ascend.ascend_forward_context import _EXTRA_CTX

        step = getattr(attn_metadata, "splitkv_step", None)
        if self.splitkv_unsupported or step is None or self.key_cache is None or _EXTRA_CTX.capturing:
            return super().forward_impl(query, key, value, kv_cache, attn_metadata, output)
        _v1.record_attention_compute_start()
        return step.run(self, query, output)


class AscendSplitKVBackend(_v1.AscendAttentionBackend):
    """vLLM Ascend's GQA backend (same name, KV-cache shape and block sizes) with split-KV decode.
    The context-parallel implementations and builders the parent picks are kept."""

    @staticmethod
    def get_impl_cls():
        cls = _v1.AscendAttentionBackend.get_impl_cls()
        return AscendSplitKVImpl if cls is _v1.AscendAttentionBackendImpl else cls

    @staticmethod
    def get_builder_cls():
        cls = _v1.AscendAttentionBackend.get_builder_cls()
        return AscendSplitKVMetadataBuilder if cls is _v1.AscendAttentionMetadataBuilder else cls
