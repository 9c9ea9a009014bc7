"""Triton split-KV decode attention for NVIDIA GPUs (runs in the Triton interpreter on a CPU).

* :class:`~cuda_ref.wrapper.DecodeWrapper`: ``plan()`` on the host once per batch, ``run()`` on the
  device with no allocation and no host sync (CUDA-graph capturable).
* ``torch.ops.splitkv.decode_attention`` / ``torch.ops.splitkv.merge_states``: custom ops with fake
  implementations (``torch.compile``), registered by :mod:`cuda_ref.ops`.
* ``cuda_ref.backend:triton_backend``: the parity-harness backend (``splitkv.backends`` entry point).
* ``cuda_ref.npu:triton_npu_backend``: the same kernels on an Ascend NPU through triton-ascend
  (harness backend ``triton-npu``; :mod:`cuda_ref.npu`).

Without a device to compile for (no CUDA GPU, and a ``triton`` without triton-ascend's Ascend
backend), ``TRITON_INTERPRET=1`` is set before the kernels are defined, so the same kernels run on
CPU tensors through the interpreter (slow; for tests). ``TRITON_INTERPRET`` set by the caller wins.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path


def _triton_has_ascend_backend() -> bool:
    """triton-ascend replaces ``triton`` and ships ``triton/backends/ascend`` (checked without importing it)."""
    spec = importlib.util.find_spec("triton")
    return bool(spec and spec.origin and (Path(spec.origin).parent / "backends" / "ascend").is_dir())


def _select_interpreter() -> bool:
    if "TRITON_INTERPRET" not in os.environ:
        try:
            import torch
            has_gpu = torch.cuda.is_available()
        except Exception:  # torch missing: the backend reports itself unavailable
            has_gpu = False
        if not has_gpu and not _triton_has_ascend_backend():
            os.environ["TRITON_INTERPRET"] = "1"
    return os.environ.get("TRITON_INTERPRET") == "1"


INTERPRET = _select_interpreter()
