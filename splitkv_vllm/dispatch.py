"""The one function the plugin calls: decode attention by the best implementation for the device.

Implementations (the ``impl`` setting, ``SPLITKV_VLLM_IMPL``, forces one; default ``auto``; an unknown
value is logged once and read as ``auto``):

* ``ascend``: the Ascend C operator through :class:`ascend_ops.AscendDecodeWrapper` (the NPU
  kernel; on the CPU the operator's CPU kernel, used by the tests here).
* ``triton``: the Triton kernels through :class:`cuda_ref.DecodeWrapper` (a CUDA GPU; on the CPU the
  Triton interpreter, used by the tests here).
* ``torch``: :func:`splitkv_common.torch_eager.decode_attention`, stock torch ops on any device.

``auto`` picks ``triton`` for CUDA tensors, ``ascend`` for NPU tensors when the operator can run there
(torch_npu, an NPU, the built extension) and ``torch`` otherwise, saying once in the log why the
operator was not used.
Full-graph mode (graph-stable buffers refreshed in place) is :mod:`splitkv_vllm.graph`.
"""

from __future__ import annotations

import logging

import torch

from splitkv_common.plan import Plan

from . import settings
from .log import once

IMPLS = settings.IMPLS


def _warn_once(msg: str) -> None:
    once(logging.WARNING, msg)


def requested_impl() -> str:
    """The ``impl`` setting (``auto`` / ``ascend`` / ``torch``); never raises (a bogus value reads as ``auto``)."""
    return settings.current().impl


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
    if device.type == "cuda":
        return "triton"
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
        impl: ``ascend`` / ``triton`` / ``torch`` (default: :func:`choose_impl`).

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
    elif impl == "triton":
        from cuda_ref.wrapper import DecodeWrapper

        Hq, D, page = q.shape[1], q.shape[2], k_cache.shape[1]
        from . import errors

        w = DecodeWrapper(Hq, k_cache.shape[2], D, page, dtype=q.dtype, kv_dtype=k_cache.dtype, device=q.device)
        errors.attach(w, k_cache.shape[0])   # counts into the device's shared buffer, read every N calls
        w.set_plan(plan, validate=False)  # the shared planner's plan of this step: valid by construction
        dev = q.device
        o, lse = w.run(q, k_cache, v_cache, block_table.to(dev), seq_lens.to(dev), query_start_loc.to(dev),
                       scale=scale, soft_cap=soft_cap, window_left=window_left, **quant)
        errors.tick(dev)
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
