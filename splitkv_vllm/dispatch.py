"""The one function the plugin calls: decode attention by the best implementation for the device.

Implementations (``SPLITKV_VLLM_IMPL`` forces one; default ``auto``):

* ``ascend``: the Ascend C operator through :class:`ascend_ops.AscendDecodeWrapper` (the NPU
  kernel; on the CPU the operator's CPU kernel, used by the tests here).
* ``torch``: :func:`splitkv_common.torch_eager.decode_attention`, stock torch ops on any device.

``auto`` picks ``ascend`` for NPU tensors when the operator can run there (torch_npu, an NPU, the
built extension) and ``torch`` otherwise, saying once in the log why the operator was not used.

Graph mode: :class:`GraphDecoder` keeps graph-stable ``AscendDecodeWrapper`` s for one captured
graph size. Their buffers keep their shapes and addresses; :meth:`GraphDecoder.refresh` rewrites
them in place from the step's padded plan, outside the graph, so a captured ``run()`` replays with
new lengths.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field

import numpy as np
import torch

from ascend_ops.support import DEFAULT_PROFILE
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
        from ascend_ops import runtime
    except Exception as e:  # noqa: BLE001
        return f"ascend_ops does not import ({type(e).__name__}: {e})"
    if device.type == "cpu":
        return None  # the operator's CPU kernel
    return runtime.runtime_unavailable()


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
    """Graph-stable decode for one captured graph size: its buffers keep their shapes and addresses.

    One decoder serves the layers of one KV-cache group in graphs of ``num_tokens`` query rows. It
    holds one graph-stable :class:`ascend_ops.AscendDecodeWrapper` per set of layer constants (the
    layers that share them share its plan, tiling and workspace; they run one after another) and a
    fixed ``block_table`` buffer ``[max_reqs, max_pages]``. Capacity: ``max_reqs`` requests (the
    real ones first, the rest padded with ``seq_len 0``, no query rows), ``max_splits`` partial slots
    per query row, ``max_work_items`` work items (default ``max_reqs * Hkv * max_splits``).

    Per step: :meth:`refresh` (host, outside the graph, before the replay is enqueued) plans the
    padded batch and rewrites the buffers in place; :meth:`run` (captured once) only enqueues the
    kernels on those buffers.
    """

    num_tokens: int
    max_reqs: int
    max_splits: int
    max_work_items: int | None = None
    profile: str = DEFAULT_PROFILE
    policy: str = "auto"
    wrappers: dict = field(default_factory=dict)
    block_table: torch.Tensor | None = None
    _lengths: tuple | None = None  # (seq_lens [max_reqs], query_start_loc [max_reqs + 1]), host int32
    plans: dict = field(default_factory=dict)  # plan per (Hkv, page, Hq, D, kv bytes, window) of the last refresh

    @staticmethod
    def key(*, num_q_heads, num_kv_heads, head_dim, page_size, dtype, kv_dtype, scale, soft_cap, window_left) -> tuple:
        return (int(num_q_heads), int(num_kv_heads), int(head_dim), int(page_size), dtype, kv_dtype, float(scale),
                None if soft_cap is None else float(soft_cap), None if window_left is None else int(window_left))

    def has(self, key: tuple) -> bool:
        return key in self.wrappers

    def add(self, key: tuple, *, k_cache: torch.Tensor, max_pages: int):
        """The wrapper of these layer constants, created (buffers allocated and filled) if new.

        Host work and device copies: call it outside a graph capture (an eager warm-up step).
        """
        from ascend_ops import AscendDecodeWrapper

        w = self.wrappers.get(key)
        if w is not None:
            return w
        hq, hkv, d, page, dtype, kv_dtype, scale, soft_cap, window_left = key
        if self.block_table is None:
            self.block_table = torch.zeros((self.max_reqs, int(max_pages)), dtype=torch.int32, device=k_cache.device)
        elif self.block_table.shape[1] != max_pages:
            raise ValueError(f"block_table: {max_pages} pages per request, this graph's buffer has "
                             f"{self.block_table.shape[1]}")
        w = AscendDecodeWrapper(hq, hkv, d, page, dtype=dtype, kv_dtype=kv_dtype, device=k_cache.device,
                                profile=self.profile, policy=self.policy, graph_stable=True,
                                max_splits=self.max_splits, max_work_items=self.max_work_items)
        w._splitkv_const = dict(scale=scale, soft_cap=soft_cap, window_left=window_left,
                                max_pages=int(max_pages), num_pages=int(k_cache.shape[0]))
        self.wrappers[key] = w
        if self._lengths is not None:
            self._set(key, w)
        return w

    def pad(self, seq_lens, query_start_loc) -> tuple[np.ndarray, np.ndarray]:
        """Host lengths of ``B <= max_reqs`` requests -> ``max_reqs`` requests (padding: no rows, seq_len 0)."""
        sl = np.asarray(seq_lens, np.int64).reshape(-1)
        qsl = np.asarray(query_start_loc, np.int64).reshape(-1)
        B = sl.shape[0]
        if B > self.max_reqs:
            raise ValueError(f"max_reqs: the batch has {B} requests, over this graph's capacity {self.max_reqs}")
        if qsl.shape[0] != B + 1:
            raise ValueError(f"query_start_loc: must be [B + 1] = [{B + 1}], got {qsl.shape[0]}")
        if qsl[-1] != self.num_tokens:
            raise ValueError(f"query_start_loc: ends at {int(qsl[-1])} rows; this graph has {self.num_tokens}")
        sl_p = np.zeros(self.max_reqs, np.int32)
        sl_p[:B] = sl
        qsl_p = np.full(self.max_reqs + 1, qsl[-1], np.int32)
        qsl_p[:B + 1] = qsl
        return sl_p, qsl_p

    def _plan_for(self, w) -> Plan:
        window_left = w._splitkv_const["window_left"]
        key = (w.plan_spec(), window_left)
        if key not in self.plans:
            sl, qsl = self._lengths
            self.plans[key] = w.plan_spec().make(sl, query_start_loc=qsl, window_left=window_left)
        return self.plans[key]

    def _set(self, key, w) -> None:
        c = w._splitkv_const
        w.set_plan(self._plan_for(w), seq_lens=self._lengths[0], scale=c["scale"], soft_cap=c["soft_cap"],
                   window_left=c["window_left"], max_pages=c["max_pages"], num_pages=c["num_pages"])

    def refresh(self, seq_lens, query_start_loc, block_table: torch.Tensor) -> None:
        """Plan this step's padded batch and rewrite every buffer in place (host; outside the graph).

        ``seq_lens`` ``[B]`` and ``query_start_loc`` ``[B + 1]`` are host lengths (padding requests
        already given ``seq_len 0``); ``block_table`` ``[B, max_pages]`` int32 on the device is copied
        into the fixed buffer (rows past ``B`` zeroed), ordered on the current stream.

        Raises ``ValueError`` naming the bound (``max_reqs``, ``max_work_items``) a step exceeds.
        """
        lengths = self.pad(seq_lens, query_start_loc)
        old = (self._lengths, self.plans)
        self._lengths, self.plans = lengths, {}
        try:
            for key, w in self.wrappers.items():
                self._set(key, w)
        except Exception:
            self._lengths, self.plans = old
            raise
        if self.block_table is not None:
            B = block_table.shape[0]
            if block_table.shape[1] != self.block_table.shape[1]:
                raise ValueError(f"block_table: {block_table.shape[1]} pages per request, this graph's buffer has "
                                 f"{self.block_table.shape[1]}")
            self.block_table[:B].copy_(block_table)
            self.block_table[B:].zero_()

    def run(self, key: tuple, q, k_cache, v_cache, *, out=None):
        """The decode of the layers with constants ``key`` on the current buffers: ``(out, lse)``.

        Enqueues the kernels only: no host read, no allocation, no host work (capturable).
        ``q`` ``[num_tokens, Hq, D]``; ``out`` (optional) the same shape, else the wrapper's buffer.
        """
        w = self.wrappers[key]
        c = w._splitkv_const
        return w.run(q, k_cache, v_cache, self.block_table, scale=c["scale"], soft_cap=c["soft_cap"],
                     window_left=c["window_left"], out=out)
