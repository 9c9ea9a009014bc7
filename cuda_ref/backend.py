"""The ``triton`` backend of the parity harness (entry point ``splitkv.backends``).

On a machine with a CUDA GPU the kernels run there; otherwise in the Triton interpreter on CPU
tensors (``TRITON_INTERPRET=1``, set by :mod:`cuda_ref` before the kernels are defined).
"""

from __future__ import annotations

import numpy as np

from splitkv_common.inputs import DecodeInputs
from splitkv_common.plan_layout import Plan
from splitkv_common.parity.registry import Backend

MIN_HEAD_DIM, MAX_HEAD_DIM = 16, 256


def _unavailable() -> str | None:
    try:
        import torch  # noqa: F401
        import triton  # noqa: F401
    except ImportError as e:
        return f"needs torch and triton ({e})"
    from . import INTERPRET
    import torch
    if not torch.cuda.is_available() and not INTERPRET:
        return "no CUDA device and TRITON_INTERPRET is not 1"
    return None


def _unsupported(inputs: DecodeInputs) -> str | None:
    d = inputs.q.shape[-1]
    if not MIN_HEAD_DIM <= d <= MAX_HEAD_DIM:
        return f"head dim {d} outside [{MIN_HEAD_DIM}, {MAX_HEAD_DIM}] (the register tile holds one head)"
    return None


def run(inputs: DecodeInputs, plan: Plan, **wrapper_kw) -> tuple[np.ndarray, np.ndarray]:
    """Validate, copy the case to the device, run the kernels with ``plan``; NumPy float32 results."""
    from splitkv_common.torch_io import from_torch, to_torch

    from .wrapper import DecodeWrapper
    inputs.validate(backend="triton")
    msg = _unsupported(inputs)
    if msg:
        raise ValueError(f"q: {msg} (triton)")
    T, Hq, D = inputs.q.shape
    _, page, Hkv, _ = inputs.k_cache.shape
    w = DecodeWrapper(Hq, Hkv, D, page, dtype=inputs.dtype,
                      kv_dtype="int8" if inputs.kv_dtype == "int8" else inputs.dtype, **wrapper_kw)
    w.set_plan(plan, window_left=inputs.window_left)
    x = to_torch(inputs, w.device)
    out, lse = w.run(**x, scale=inputs.scale, soft_cap=inputs.soft_cap, window_left=inputs.window_left,
                     validate=True)
    return from_torch(out, lse)


def run_shared_prefix(inputs: DecodeInputs, shared_prefix, *, mode: str = "auto", policy: str = "auto",
                      profile: str = "h200") -> tuple[np.ndarray, np.ndarray]:
    """The shared-prefix route (:class:`cuda_ref.shared_prefix.SharedPrefixWrapper`) on one case."""
    from splitkv_common.torch_io import from_torch, to_torch

    from .shared_prefix import SharedPrefixWrapper
    inputs.validate(backend="triton")
    msg = _unsupported(inputs)
    if msg:
        raise ValueError(f"q: {msg} (triton)")
    w = SharedPrefixWrapper(inputs.q.shape[1], inputs.k_cache.shape[2], inputs.q.shape[2], inputs.k_cache.shape[1],
                            dtype=inputs.dtype, kv_dtype="int8" if inputs.kv_dtype == "int8" else inputs.dtype,
                            profile=profile, policy=policy, mode=mode)
    w.plan(inputs.seq_lens, inputs.query_start_loc, shared_prefix=shared_prefix, block_table=inputs.block_table,
           window_left=inputs.window_left)
    x = to_torch(inputs, w.device)
    out, lse = w.run(**x, scale=inputs.scale, soft_cap=inputs.soft_cap, window_left=inputs.window_left,
                     validate=True)
    return from_torch(out, lse)


def native_helpers() -> list[dict]:
    """The backend's native helpers, built (or loaded) now, with their status (``splitkv native``)."""
    from .checks import native_guard_status
    return [{"name": "call guard", "source": "cuda_ref/call_guard.cpp", "status": native_guard_status()}]


triton_backend = Backend(
    name="triton", run=run, unavailable=_unavailable, unsupported=_unsupported, device="h200",
    description="Triton split-KV kernels (GPU; the Triton interpreter on CPU)",
    extra={"shared_prefix": run_shared_prefix, "native": native_helpers})
