"""Parity-harness backends that need an Ascend NPU: ``ascend`` and ``torch-npu``.

* ``torch-npu``: the plain PyTorch eager split-then-merge
  (:func:`splitkv_common.torch_eager.decode_attention`) run on the ``npu`` device through
  torch_npu. No extension of ours: it checks the device, the torch_npu install and the shared
  plan on the NPU before the Ascend C operator is involved.
* ``ascend``: the Ascend C operator, ``torch.ops.splitkv_ascend.decode_attention`` (the C++
  extension built by ``scripts/build_ascend.sh``), through :class:`ascend_ops.AscendDecodeWrapper`
  with the harness's plan.

Both plan for :data:`ascend_ops.support.DEFAULT_PROFILE` (``910b2``) unless
``SPLITKV_ASCEND_PROFILE`` names another (``910b3``, ``910b4``...; :func:`ascend_ops.support.profile`).
Without torch_npu, an NPU or the built extension they are *unavailable*, with the reason in words
(``splitkv backends`` lists it).
"""

from __future__ import annotations

from splitkv_common.inputs import DecodeInputs
from splitkv_common.npu_probe import npu_device, npu_unavailable
from splitkv_common.plan_layout import Plan
from splitkv_common.parity.registry import Backend

from .support import profile, unsupported_reason


def _torch_npu_run(inputs: DecodeInputs, plan: Plan):
    from splitkv_common.torch_io import from_torch, to_torch
    from splitkv_common.torch_eager import decode_attention

    t = to_torch(inputs, npu_device())
    out, lse = decode_attention(**t, plan=plan, scale=inputs.scale, soft_cap=inputs.soft_cap,
                                window_left=inputs.window_left)
    return from_torch(out, lse)


def _ascend_unavailable() -> str | None:
    from .runtime import runtime_unavailable

    return runtime_unavailable()


def _ascend_unsupported(inputs: DecodeInputs) -> str | None:
    return unsupported_reason(head_dim=int(inputs.q.shape[-1]), dtype=inputs.dtype, kv_dtype=inputs.kv_dtype)


def _ascend_run(inputs: DecodeInputs, plan: Plan):
    from splitkv_common.torch_io import from_torch, to_torch

    from .wrapper import AscendDecodeWrapper

    t = to_torch(inputs, npu_device())
    q, k = t["q"], t["k_cache"]
    w = AscendDecodeWrapper(q.shape[1], k.shape[2], q.shape[2], k.shape[1], dtype=q.dtype, kv_dtype=k.dtype,
                            device=q.device, profile=profile())
    w.set_plan(plan, seq_lens=inputs.seq_lens, scale=inputs.scale, soft_cap=inputs.soft_cap,
               window_left=inputs.window_left, max_pages=inputs.block_table.shape[1], num_pages=k.shape[0])
    out, lse = w.run(t["q"], t["k_cache"], t["v_cache"], t["block_table"], t["seq_lens"], t["query_start_loc"],
                     k_scale=t["k_scale"], v_scale=t["v_scale"], k_offset=t["k_offset"], v_offset=t["v_offset"])
    return from_torch(out, lse)


def run_shared_prefix(inputs: DecodeInputs, shared_prefix, *, mode: str = "auto", policy: str = "auto",
                      device=None):
    """One case through ``AscendDecodeWrapper.plan(..., shared_prefix=...)`` and ``run()``
    (:mod:`ascend_ops.shared_prefix_op`) on ``device`` (default the NPU; ``cpu``: the operator's CPU
    kernel): ``(out, lse)`` as NumPy float32. The ``ascend`` backend's shared-prefix route."""
    from splitkv_common.torch_io import from_torch, to_torch

    from .wrapper import AscendDecodeWrapper

    t = to_torch(inputs, npu_device() if device is None else device)
    q, k = t["q"], t["k_cache"]
    w = AscendDecodeWrapper(q.shape[1], k.shape[2], q.shape[2], k.shape[1], dtype=q.dtype, kv_dtype=k.dtype,
                            device=q.device, profile=profile(), policy=policy)
    w.plan(inputs.seq_lens, query_start_loc=inputs.query_start_loc, window_left=inputs.window_left,
           scale=inputs.scale, soft_cap=inputs.soft_cap, max_pages=inputs.block_table.shape[1], num_pages=k.shape[0],
           shared_prefix=shared_prefix, block_table=inputs.block_table, shared_prefix_mode=mode)
    out, lse = w.run(q, k, t["v_cache"], t["block_table"], t["seq_lens"], t["query_start_loc"],
                     k_scale=t["k_scale"], v_scale=t["v_scale"], k_offset=t["k_offset"], v_offset=t["v_offset"])
    return from_torch(out, lse)


torch_npu_backend = Backend(
    "torch-npu", _torch_npu_run, unavailable=npu_unavailable, device=profile(),
    description="plain PyTorch eager split-then-merge on an Ascend NPU (torch_npu, no custom kernel)")

ascend_backend = Backend(
    "ascend", _ascend_run, unavailable=_ascend_unavailable, unsupported=_ascend_unsupported, device=profile(),
    description="Ascend C split + combine kernels via torch.ops.splitkv_ascend.decode_attention",
    extra={"shared_prefix": run_shared_prefix})
