"""vLLM Ascend attention metadata -> splitkv plan and call.

What vLLM Ascend hands its attention implementation (``vllm_ascend/attention/attention_v1.py``,
``AscendMetadata`` and ``AscendAttentionBackendImpl.forward``; version in
:data:`splitkv_vllm.VLLM_ASCEND_REFERENCE`):

* ``query``: ``[num_tokens, Hq, D]``; ``num_tokens`` may exceed the real tokens (graph padding).
* ``kv_cache``: ``(key_cache, value_cache)``, each ``[num_blocks, block_size, Hkv, D]``
  (``get_kv_cache_shape`` is ``(2, num_blocks, block_size, Hkv, D)``); the current tokens are
  already written by ``reshape_and_cache`` when attention runs.
* ``attn_metadata.actual_seq_lengths_q``: host list, the cumulative query ends
  (``query_start_loc[1:]``), including any padding request the runner adds so that the query
  lengths sum to ``num_tokens``; ``seq_lens`` (host int32 tensor) / ``seq_lens_list``: KV length of
  each request, current tokens included, padded with 1 for padding requests;
  ``block_tables``: int32 ``[num_reqs(+pad), max_blocks]`` on the device, padded with zero rows;
  ``query_start_loc``: the same offsets on the device; ``num_decodes`` / ``num_prefills`` /
  ``num_decode_tokens``; ``attn_state`` (``DecodeOnly``, ``SpecDecoding``, ``ChunkedPrefill``,
  ``PrefillNoCache``, ``PrefillCacheHit``); ``causal``.
* The layer (the impl object): ``num_heads``, ``num_kv_heads``, ``head_size``, ``scale``,
  ``sliding_window``, ``alibi_slopes``, ``sinks``, ``attn_type``, ``kv_cache_dtype``; vLLM's
  ``logits_soft_cap`` is an argument of the impl's constructor that vLLM Ascend does not keep.

What is routed (everything else stays on vLLM Ascend's own path): batches where every request
is a decode (``num_prefills == 0``: one query, or up to ``decode_threshold`` speculative /
short-extend queries, which our causal-tail rule computes exactly), causal, on layers that are
plain decoder self-attention without ALiBi, attention sinks or a quantized (C8) KV cache, with a head
size and dtypes the Ascend kernels take (:func:`kernel_unsupported`). Mixed prefill+decode batches stay
on vLLM Ascend's single FIA call.

Sliding window. vLLM's definition: ``sliding_window = W`` lets a query at position ``p`` see
``p - W + 1 .. p``, W keys (FlashAttention's ``window_size = (W - 1, 0)``): our ``window_left = W - 1``
(:func:`window_left_from_vllm`). vLLM Ascend does not compute that: it calls FIA with
``sparse_mode = 4`` (band), ``pre_tokens = W``, ``next_tokens = 0``, for prefill and decode alike, and
FIA's band keeps the keys ``diag - pre_tokens .. diag + next_tokens`` (torch_npu's documented band
mask for the FlashAttention family masks ``tril(k = -pre_tokens - 1)`` and ``triu(k = next_tokens + 1)``),
so each query sees W + 1 keys. A model served by vLLM Ascend is therefore served with W + 1 keys
everywhere (prefill included); a decode through splitkv must do the same or it disagrees with the
prefill that wrote the same context: the layer's ``window_left`` is ``W``
(:func:`window_left_like_vllm_ascend`). Whether FIA honours ``pre_tokens`` for one-row TND decode
(its docs say ``pre_tokens`` is ignored when the query's S is 1 in other layouts) is not confirmed on
a node, so window layers stay on vLLM Ascend's path unless the deployer opts in
(``route_window_layers`` / ``SPLITKV_VLLM_WINDOW=1``).

This module is the eager path (:func:`forward_decode`); full-graph mode is :mod:`splitkv_vllm.graph`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ascend_ops.support import profile, supported_head_dim, unsupported_reason
from splitkv_common.torch_io import torch_dtype_name
from splitkv_common.plan import Plan, make_plan

from . import settings

ROUTED_STATES = ("DecodeOnly", "SpecDecoding", "ChunkedPrefill")
_DECODER = "decoder"


def _state_name(state) -> str:
    return getattr(state, "name", None) or str(state).rsplit(".", 1)[-1]


def _window(sliding_window) -> int | None:
    if sliding_window is None:
        return None
    w = int(sliding_window[0] if isinstance(sliding_window, (tuple, list)) else sliding_window)
    return None if w <= 0 else w


def window_left_from_vllm(sliding_window) -> int | None:
    """vLLM's definition: ``sliding_window`` W (keys a query sees, itself included) -> ``window_left = W - 1``."""
    w = _window(sliding_window)
    return None if w is None else w - 1


def window_left_like_vllm_ascend(sliding_window) -> int | None:
    """What vLLM Ascend computes for the same layer: FIA band with ``pre_tokens = W``, ``next_tokens = 0``
    sees the query's own key and W before it: ``window_left = W``."""
    return _window(sliding_window)


@dataclass(frozen=True)
class LayerSpec:
    """The attention constants of one layer, read from vLLM Ascend's impl object."""

    num_heads: int
    num_kv_heads: int
    head_size: int
    scale: float
    window_left: int | None
    soft_cap: float | None
    layer_unsupported: str | None

    @classmethod
    def from_impl(cls, impl, soft_cap=None) -> "LayerSpec":
        why = layer_unsupported(impl, soft_cap)
        return cls(int(impl.num_heads), int(impl.num_kv_heads), int(impl.head_size), float(impl.scale),
                   window_left_like_vllm_ascend(getattr(impl, "sliding_window", None)),
                   None if not soft_cap else float(soft_cap), why)


def soft_cap_routed() -> bool:
    return settings.current().route_soft_cap


def window_routed() -> bool:
    return settings.current().route_window_layers


def cache_unsupported(layer: "LayerSpec", key_cache, value_cache, query=None) -> str | None:
    """``None`` when the layer's caches have the shape we read (``[blocks, block_size, Hkv, D]``, V's head
    size equal to K's, V's dtype K's, and, ``query`` given, q's dtype, one the kernels take), else why not."""
    if key_cache is None or value_cache is None:
        return "no KV cache bound to the layer yet"
    if key_cache.dim() != 4 or value_cache.dim() != 4:
        return f"KV cache of {key_cache.dim()} dims (expected [blocks, block_size, Hkv, D])"
    dk, dv = int(key_cache.shape[-1]), int(value_cache.shape[-1])
    if dv != dk:
        return f"V head size {dv} differs from K head size {dk}"
    if dk != layer.head_size or int(key_cache.shape[2]) != layer.num_kv_heads:
        return f"KV cache heads/size {tuple(key_cache.shape[2:])} differ from the layer's ({layer.num_kv_heads}, {layer.head_size})"
    if value_cache.dtype != key_cache.dtype:
        return f"V cache dtype {value_cache.dtype} differs from K's {key_cache.dtype}"
    if query is not None and key_cache.dtype != query.dtype:
        return f"KV cache dtype {key_cache.dtype} differs from q's {query.dtype} (quantized caches stay on vLLM Ascend's path)"
    if query is not None:
        return kernel_unsupported(layer.head_size, query.dtype, key_cache.dtype)
    return None


_KV_DTYPES = {"bfloat16": torch.bfloat16, "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16,
              "half": torch.float16}


def model_dtype(impl) -> torch.dtype | None:
    """The model's dtype from the impl's vLLM config (``model_config.dtype``), ``None`` when unknown."""
    dt = getattr(getattr(getattr(impl, "vllm_config", None), "model_config", None), "dtype", None)
    if isinstance(dt, torch.dtype):
        return dt
    return getattr(torch, str(dt), None) if isinstance(dt, str) else None


def kernel_unsupported(head_size: int, dtype: torch.dtype | None, kv_dtype: torch.dtype | None) -> str | None:
    """``None`` when the Ascend kernels take this head size and these dtypes (q ``dtype``, KV ``kv_dtype``,
    default q's; ``dtype`` ``None``: the head size only), else why not: the rules of
    :func:`ascend_ops.support.unsupported_reason`, asked before a step is routed so that nothing the
    kernels refuse ever reaches them."""
    if dtype is None:
        return supported_head_dim(int(head_size))
    return unsupported_reason(int(head_size), torch_dtype_name(dtype), torch_dtype_name(kv_dtype or dtype))


def layer_unsupported(impl, soft_cap=None) -> str | None:
    """``None`` when this layer's decode can run through splitkv, else the reason."""
    if getattr(impl, "alibi_slopes", None) is not None:
        return "ALiBi slopes"
    if getattr(impl, "sinks", None) is not None:
        return "attention sinks"
    at = str(getattr(impl, "attn_type", _DECODER)).lower()
    if _DECODER not in at or "encoder" in at:
        return f"attention type {getattr(impl, 'attn_type', None)!r} (only decoder self-attention)"
    kvd = str(getattr(impl, "kv_cache_dtype", "auto"))
    if kvd not in ("auto", "bfloat16", "float16", "bf16", "fp16", "half"):
        return f"KV cache dtype {kvd!r} (vLLM Ascend's C8 / quantized caches stay on its path)"
    if getattr(impl, "enable_c8_quant", False):
        return "C8 quantized KV cache"
    why = kernel_unsupported(int(impl.head_size), model_dtype(impl), kv_dtype=None)
    if why:
        return why
    if int(impl.num_heads) % int(impl.num_kv_heads):
        return "num_heads is not a multiple of num_kv_heads"
    if window_left_like_vllm_ascend(getattr(impl, "sliding_window", None)) is not None and not window_routed():
        return ("sliding window: vLLM Ascend's FIA band (pre_tokens = W) is matched (W + 1 keys) but not yet "
                "confirmed on a node (route_window_layers / SPLITKV_VLLM_WINDOW=1 routes it)")
    if soft_cap and not soft_cap_routed():
        return ("logits soft cap: vLLM Ascend ignores it on every path (prefill and decode), so decode through "
                "splitkv would disagree with the rest of the model (SPLITKV_VLLM_SOFT_CAP=1 routes it anyway)")
    return None


def batch_unsupported(meta) -> str | None:
    """``None`` when this step's metadata is a decode-only batch we compute exactly, else why not."""
    if meta is None:
        return "no attention metadata (profile run)"
    state = _state_name(getattr(meta, "attn_state", None))
    if state not in ROUTED_STATES:
        return f"attention state {state}"
    if int(getattr(meta, "num_prefills", 0) or 0) > 0:
        return f"mixed batch ({meta.num_prefills} prefill requests)"
    if not getattr(meta, "causal", True):
        return "non-causal attention"
    if getattr(meta, "actual_seq_lengths_q", None) is None or getattr(meta, "block_tables", None) is None:
        return "metadata without query offsets or block tables"
    return None


@dataclass
class DecodeBatch:
    """One decode step in our terms (host lengths, device block table) and its plan."""

    query_start_loc: torch.Tensor   # int32 [B + 1], host
    seq_lens: torch.Tensor          # int32 [B], host
    block_table: torch.Tensor       # int32 [B, max_blocks], device
    plan: Plan
    host_seq_lens: np.ndarray | None = None   # int32 [B], the same lengths as NumPy
    _uploaded: dict | None = None   # device str -> (seq_lens, query_start_loc) int32 on that device

    @property
    def num_tokens(self) -> int:
        return int(self.query_start_loc[-1])

    @property
    def num_reqs(self) -> int:
        return int(self.seq_lens.shape[0])

    def on_device(self, device) -> tuple[torch.Tensor, torch.Tensor]:
        """``(seq_lens [B], query_start_loc [B + 1])`` int32 on ``device``: uploaded at the first call
        of the step (the first layer), the same tensors for every later layer."""
        if self._uploaded is None:
            self._uploaded = {}
        key = str(device)
        hit = self._uploaded.get(key)
        if hit is None:
            hit = self._uploaded[key] = (self.seq_lens.to(device), self.query_start_loc.to(device))
        return hit


def host_lengths(meta) -> tuple[np.ndarray, np.ndarray]:
    """``(query_start_loc [B + 1], seq_lens [B])`` int32 on the host, padding requests included."""
    ends = np.asarray(list(meta.actual_seq_lengths_q), np.int64)
    qsl = np.concatenate([[0], ends]).astype(np.int32)
    B = ends.shape[0]
    src = getattr(meta, "seq_lens_list", None)
    if src is None:
        src = meta.seq_lens.cpu().tolist()
    sl = np.asarray(list(src), np.int64)
    if sl.shape[0] < B:
        raise ValueError(f"metadata: {sl.shape[0]} sequence lengths for {B} requests")
    return qsl, sl[:B].astype(np.int32)


def plan_options() -> dict:
    """Planner settings: the ``policy`` setting (``SPLITKV_VLLM_POLICY``, auto), ``SPLITKV_ASCEND_PROFILE``."""
    return dict(policy=settings.current().policy, device=profile())


def make_batch(meta, *, num_q_heads: int, num_kv_heads: int, head_dim: int, page_size: int, kv_elem_bytes: int = 2,
               window_left: int | None = None, graph_stable: bool = False, max_splits: int | None = None,
               max_work_items: int | None = None) -> DecodeBatch:
    """The :class:`DecodeBatch` of a routed step (see :func:`batch_unsupported`).

    The plan is cached on the metadata object per layer geometry *and lengths*, so the layers of one
    step share it and a metadata object reused with other lengths (or other query rows) gets a new
    plan, never the stale one. Cost per layer: reading the host lengths (O(B)) and one dict lookup.
    """
    qsl, sl = host_lengths(meta)
    key = (num_q_heads, num_kv_heads, head_dim, page_size, kv_elem_bytes, window_left, graph_stable, max_splits,
           max_work_items, qsl.tobytes(), sl.tobytes())
    cache = getattr(meta, "_splitkv_batches", None)
    if cache is None:
        cache = {}
        try:
            setattr(meta, "_splitkv_batches", cache)
        except AttributeError:
            pass
    if key in cache:
        return cache[key]
    if len(cache) >= 16:   # a metadata object reused for many batches: keep the newest only
        cache.clear()
    B = sl.shape[0]
    bt = meta.block_tables[:B]
    if bt.shape[0] < B:
        raise ValueError(f"metadata: block_tables has {bt.shape[0]} rows for {B} requests")
    if not bt.is_contiguous():
        bt = bt.contiguous()
    opts = plan_options()
    kw = {k: v for k, v in dict(max_splits=max_splits, max_work_items=max_work_items).items() if v is not None}
    plan = make_plan(sl, num_kv_heads=num_kv_heads, page_size=page_size, query_start_loc=qsl, num_q_heads=num_q_heads,
                     head_dim=head_dim, kv_elem_bytes=kv_elem_bytes, window_left=window_left,
                     graph_stable=graph_stable, **opts, **kw)
    batch = DecodeBatch(torch.from_numpy(qsl), torch.from_numpy(sl),
                        bt if bt.dtype == torch.int32 else bt.to(torch.int32), plan, host_seq_lens=sl)
    cache[key] = batch
    return batch


# (device, layer constants, dtypes) -> AscendDecodeWrapper of the eager path: made once per process,
# given the step's shared plan once per step (set_plan at the step's first layer of these constants)
_EAGER_WRAPPERS: dict = {}


def eager_wrapper(layer: LayerSpec, query: torch.Tensor, key_cache: torch.Tensor):
    """The eager :class:`ascend_ops.AscendDecodeWrapper` of ``layer``'s constants on ``query``'s device.

    One per (device, Hq, Hkv, D, block size, q dtype, KV dtype, scale, soft cap, window): the layers
    that share them share it. Its buffers grow to the largest step seen and are then reused (no
    allocation per step once grown); its pinned staging buffer is made once."""
    key = (str(query.device), layer.num_heads, layer.num_kv_heads, layer.head_size, int(key_cache.shape[1]),
           query.dtype, key_cache.dtype, layer.scale, layer.soft_cap, layer.window_left)
    w = _EAGER_WRAPPERS.get(key)
    if w is None:
        from ascend_ops import AscendDecodeWrapper

        opts = plan_options()
        w = _EAGER_WRAPPERS[key] = AscendDecodeWrapper(
            layer.num_heads, layer.num_kv_heads, layer.head_size, int(key_cache.shape[1]), dtype=query.dtype,
            kv_dtype=key_cache.dtype, device=query.device, profile=opts["device"], policy=opts["policy"])
        from . import errors

        errors.attach_ascend(w, query.device)   # its error section, read every error_check_steps calls
    return w


def _query_rows(layer: LayerSpec, query: torch.Tensor, n: int) -> torch.Tensor:
    """``query[:n]`` as a contiguous ``[n, Hq, D]`` tensor (a view when it already is one, else a copy)."""
    q = query[:n].reshape(n, layer.num_heads, layer.head_size)
    return q if q.is_contiguous() else q.contiguous()


def forward_decode(layer: LayerSpec, query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                   meta, output: torch.Tensor, *, impl: str | None = None) -> torch.Tensor:
    """Decode attention of a routed step into ``output[:num_tokens]`` (vLLM's buffer); returns ``output``.

    ``query`` ``[num_tokens(+pad), Hq, D]`` (or ``[num_tokens, Hq * D]``; any strides); ``key_cache`` /
    ``value_cache`` ``[num_blocks, block_size, Hkv, D]``; ``output`` shaped like ``query``.
    Rows past the real tokens (graph padding) are left as they are.

    The Ascend route reads nothing back from the device: the step's plan is made once on the host
    from the metadata's host lengths (:func:`make_batch`, shared by the layers), the layer's eager
    wrapper (:func:`eager_wrapper`) takes it once per step (``set_plan(validate=False)``: the shared
    planner's plan, valid by construction) and each layer only enqueues the kernels
    (``run(validate=False)``). The ``debug_checks`` setting adds the host checks of the page ids and
    lengths (``run(validate=True)``: device-to-host copies of the block table and offsets).
    The other routes (``triton``, ``torch``) take the step's lengths and offsets uploaded once per step.
    With the ``shared_prefix`` setting on and ``common_prefix_len > 0`` in the metadata, the Ascend
    route plans the step with its shared prefix instead (:mod:`splitkv_vllm.shared_prefix`).
    """
    from .dispatch import choose_impl, decode_attention

    page = int(key_cache.shape[1])
    batch = make_batch(meta, num_q_heads=layer.num_heads, num_kv_heads=layer.num_kv_heads, head_dim=layer.head_size,
                       page_size=page, kv_elem_bytes=key_cache.element_size(), window_left=layer.window_left)
    n = batch.num_tokens
    q = _query_rows(layer, query, n)
    o = output.view(-1, layer.num_heads, layer.head_size)[:n]
    impl = impl or choose_impl(query.device)
    if impl == "ascend":
        from . import shared_prefix

        w = eager_wrapper(layer, q, key_cache)
        pages = (int(batch.block_table.shape[1]), int(key_cache.shape[0]))
        mode = shared_prefix.shared_mode(layer, impl) if shared_prefix.common_prefix_len(meta) else None
        if mode is not None and shared_prefix.plan_step(w, layer, batch, meta, key_cache, mode):
            pass   # planned with the step's shared prefix (the route, or the plain plan the planner chose)
        elif w.host_plan is not batch.plan or w._pages != pages or w.shared_prefix_plan is not None:
            w._splitkv_shared_step = None
            w.set_plan(batch.plan, seq_lens=batch.host_seq_lens, scale=layer.scale, soft_cap=layer.soft_cap,
                       window_left=layer.window_left, max_pages=pages[0], num_pages=pages[1], validate=False)
        debug = settings.current().debug_checks
        extra = dict(seq_lens=batch.seq_lens, query_start_loc=batch.query_start_loc) if debug else {}
        out, _ = w.run(q, key_cache, value_cache, batch.block_table, validate=debug,
                       out=o if o.is_contiguous() else None, **extra)
        from . import errors

        errors.tick(q.device)
    else:
        sl, qsl = batch.on_device(q.device)
        out, _ = decode_attention(q, key_cache, value_cache, batch.block_table, sl, qsl, plan=batch.plan,
                                  scale=layer.scale, soft_cap=layer.soft_cap, window_left=layer.window_left, impl=impl)
    if out is not o:
        o.copy_(out)
    return output
