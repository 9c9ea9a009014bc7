"""The one function the plugin calls: decode attention by the best implementation for the device.

Implementations (``SPLITKV_VLLM_IMPL`` forces one; default ``auto``):

* ``ascend``: the Ascend C operator through :class:`ascend_ops.AscendDecodeWrapper` (the NPU
  kernel; on the CPU the operator's CPU kernel, used by the tests here).
* ``torch``: :func:`splitkv_common.torch_eager.decode_attention`, stock torch ops on any device.

``auto`` picks ``ascend`` for NPU tensors when the operator can run there (torch_npu, an NPU, the
built extension) and ``torch`` otherwise, saying once in the log why the operator was not used.

Graph mode: :class:`GraphDecoder` keeps one graph-stable ``AscendDecodeWrapper`` per attention
layer. Its buffers keep their shapes and addresses; :meth:`GraphDecoder.refresh` rewrites them in
place from the step's plan, outside the graph, so a captured ``run()`` replays with new lengths.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field

import torch

from splitkv_common.plan import Plan

logger = logging.getLogger("splitkv_vllm")

IMPLS = ("auto", "ascend", "torch")
_WARNED: set[str] = set()


def _warn_once(msg: str) -> None:
    if msg not in _WARNED:
        _WARNED.add(msg)
        logger.warning(msg)


def requested_impl() -> str:
    impl = os.environ.get("SPLITKV_VLLM_IMPL", "auto").strip().lower() or "auto"
    if impl not in IMPLS:
        raise ValueError(f"SPLITKV_VLLM_IMPL: unknown {impl!r}; expected one of {IMPLS}")
    return impl


def ascend_unavailable(device: torch.device) -> str | None:
    """``None`` when the Ascend operator can run on ``device``, else why not."""
    try:
        from ascend_ops import ops
    except Exception as e:  # noqa: BLE001
        return f"ascend_ops does not import ({type(e).__name__}: {e})"
    if device.type == "cpu":
        return None  # the operator's CPU kernel
    return ops.runtime_unavailable()


def choose_impl(device: torch.device) -> str:
    """The implementation ``decode_attention`` uses for tensors on ``device``."""
    impl = requested_impl()
    if impl != "auto":
        return impl
    if device.type == "cpu":
        return "torch"
    why = ascend_unavailable(device)
    if why:
        _warn_once(f"splitkv: the Ascend operator cannot run ({why}); using the torch split-then-merge path")
        return "torch"
    return "ascend"


def decode_attention(q, k_cache, v_cache, block_table, seq_lens, query_start_loc, *, plan: Plan,
                     scale: float, soft_cap=None, window_left=None, k_scale=None, v_scale=None,
                     k_offset=None, v_offset=None, out=None, impl: str | None = None):
    """Split-KV decode attention, ``docs/conventions.md`` semantics.

    Args:
        q: ``[T, Hq, D]``; k_cache, v_cache: ``[num_pages, page_size, Hkv, D]``.
        block_table: int32 ``[B, max_pages]``; seq_lens: ``[B]`` (host or device);
        query_start_loc: ``[B + 1]``; plan: the shared plan of this batch.
        out: optional ``[T, Hq, D]`` to write into.
        impl: ``ascend`` / ``torch`` (default: :func:`choose_impl`).

    Returns:
        ``(out [T, Hq, D] in q's dtype, lse [T, Hq] float32, natural log)``.
    """
    impl = impl or choose_impl(q.device)
    quant = dict(k_scale=k_scale, v_scale=v_scale, k_offset=k_offset, v_offset=v_offset)
    if impl == "ascend":
        import ascend_ops

        o, lse = ascend_ops.decode_attention(q, k_cache, v_cache, block_table, seq_lens, query_start_loc,
                                             scale=scale, soft_cap=soft_cap, window_left=window_left, plan=plan,
                                             **quant)
    elif impl == "torch":
        from splitkv_common.torch_eager import decode_attention as eager

        dev = q.device
        o, lse = eager(q, k_cache, v_cache, block_table.to(dev), seq_lens.to(dev), query_start_loc.to(dev),
                       plan=plan, scale=scale, soft_cap=soft_cap, window_left=window_left, **quant)
    else:
        raise ValueError(f"impl: unknown {impl!r}; expected one of {IMPLS[1:]}")
    if out is not None:
        out.copy_(o)
        return out, lse
    return o, lse


@dataclass
class GraphDecoder:
    """Graph-stable decode for captured graphs: one ``AscendDecodeWrapper`` per layer, refreshed in place.

    ``capacity`` bounds every step the graph replays (``max_work_items``; ``max_splits`` slots per
    row). Usage per step: ``refresh(plan, seq_lens)`` (host, before replay; the metadata builder
    does it), then ``run(layer, ...)`` (captured once).
    """

    max_splits: int
    max_work_items: int
    profile: str = "910b2"
    device: str | None = None
    wrappers: dict = field(default_factory=dict)
    _plan: tuple | None = None

    def wrapper(self, layer: str, *, num_q_heads, num_kv_heads, head_dim, page_size, dtype, kv_dtype,
                scale, soft_cap, window_left):
        from ascend_ops import AscendDecodeWrapper

        w = self.wrappers.get(layer)
        if w is None:
            w = AscendDecodeWrapper(num_q_heads, num_kv_heads, head_dim, page_size, dtype=dtype, kv_dtype=kv_dtype,
                                    device=self.device, profile=self.profile, graph_stable=True,
                                    max_splits=self.max_splits, max_work_items=self.max_work_items)
            w._splitkv_attn = dict(scale=scale, soft_cap=soft_cap, window_left=window_left)
            self.wrappers[layer] = w
            if self._plan is not None:
                self._set(w)
        return w

    def _set(self, w) -> None:
        plan, seq_lens, max_pages, num_pages = self._plan
        w.set_plan(plan, seq_lens=seq_lens, max_pages=max_pages, num_pages=num_pages, **w._splitkv_attn)

    def refresh(self, plan: Plan, seq_lens, *, max_pages: int, num_pages: int) -> None:
        """Rewrite every layer's plan buffers in place for this step (outside the graph)."""
        if not plan.graph_stable:
            raise ValueError("plan: graph replay needs a graph-stable plan (make_plan(graph_stable=True))")
        self._plan = (plan, seq_lens, max_pages, num_pages)
        for w in self.wrappers.values():
            self._set(w)

    def run(self, layer: str, q, k_cache, v_cache, block_table, *, out=None, **shape):
        """The layer's decode into its wrapper's buffers (or ``out``): ``(out, lse)``."""
        w = self.wrapper(layer, **shape)
        attn = w._splitkv_attn
        return w.run(q, k_cache, v_cache, block_table, scale=attn["scale"], soft_cap=attn["soft_cap"],
                     window_left=attn["window_left"], out=out)
