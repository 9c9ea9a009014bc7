"""The two backends that ship with ``splitkv_common``: ``numpy`` and ``torch``.

* ``numpy``: :func:`splitkv_common.reference.split_attention`, the seed's method step by step.
* ``torch``: :func:`splitkv_common.torch_eager.decode_attention`, stock PyTorch ops on the CPU
  (``SPLITKV_TORCH_DEVICE`` picks another device, e.g. ``npu`` or ``cuda``).
"""

from __future__ import annotations

import os

from ..inputs import DecodeInputs
from ..plan_layout import Plan
from ..reference import split_attention
from .registry import Backend


def _numpy_run(inputs: DecodeInputs, plan: Plan):
    return split_attention(inputs, plan)


def _numpy_shared_prefix(inputs: DecodeInputs, shared_prefix, *, mode="auto", policy="auto"):
    from ..shared_prefix import plan_for_inputs, shared_prefix_attention

    return shared_prefix_attention(inputs, plan_for_inputs(inputs, shared_prefix, device="cpu", policy=policy,
                                                           mode=mode))


numpy_backend = Backend("numpy", _numpy_run, device="cpu",
                        description="NumPy split-then-merge reference (float32 partials, exact merge)",
                        extra={"shared_prefix": _numpy_shared_prefix})


def torch_device() -> str:
    return os.environ.get("SPLITKV_TORCH_DEVICE", "cpu")


def _torch_unavailable():
    try:
        import torch
    except Exception as e:  # noqa: BLE001
        return f"torch is not installed ({e}); pip install 'splitkv[torch]'"
    dev = torch_device()
    if dev != "cpu":
        try:
            torch.empty(1, device=dev)
        except Exception as e:  # noqa: BLE001
            return f"torch device {dev!r} is not usable here: {e}"
    return None


def _torch_run(inputs: DecodeInputs, plan: Plan):
    from ..torch_eager import decode_attention
    from ..torch_io import from_torch, to_torch

    t = to_torch(inputs, torch_device())
    out, lse = decode_attention(**t, plan=plan, scale=inputs.scale, soft_cap=inputs.soft_cap,
                                window_left=inputs.window_left)
    return from_torch(out, lse)


def _torch_shared_prefix(inputs: DecodeInputs, shared_prefix, *, mode="auto", policy="auto"):
    from ..shared_prefix import plan_for_inputs
    from ..shared_prefix_torch import decode_attention
    from ..torch_io import from_torch, to_torch

    splan = plan_for_inputs(inputs, shared_prefix, device="cpu", policy=policy, mode=mode)
    t = to_torch(inputs, torch_device())
    out, lse = decode_attention(**t, splan=splan, scale=inputs.scale, soft_cap=inputs.soft_cap,
                                window_left=inputs.window_left)
    return from_torch(out, lse)


torch_backend = Backend("torch", _torch_run, unavailable=_torch_unavailable, device="cpu",
                        description="plain PyTorch eager split-then-merge (any torch device)",
                        extra={"shared_prefix": _torch_shared_prefix})
