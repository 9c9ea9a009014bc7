"""Split-KV decode attention for Ascend NPUs: Ascend C kernels and their torch_npu binding.

* :func:`decode_attention` and :class:`AscendDecodeWrapper` (``plan()`` on the host, ``run()`` on
  the NPU, aclgraph-capturable; :mod:`ascend_ops.wrapper`): the Python API, the same call as
  ``cuda_ref``'s.
* ``torch.ops.splitkv_ascend.decode_attention``: the operator (:mod:`ascend_ops.ops`); its NPU
  kernel is the C++ extension in ``csrc/`` built by ``scripts/build_ascend.sh`` on a machine with
  CANN and torch_npu, loaded by :mod:`ascend_ops.runtime` (which also says what is missing).
* :mod:`ascend_ops.support`: what the kernels take (dtypes, head dims) and the default device
  profile, in one place.
* :mod:`ascend_ops.tiling`: the kernels' tiling and plan buffers, from the shared plan.
* Harness backends ``ascend`` and ``torch-npu`` (:mod:`ascend_ops.npu_backend`).

``import ascend_ops`` needs neither torch, torch_npu, CANN nor an NPU; names are loaded on first
use. Without an NPU, using the operator raises ``RuntimeError`` saying what is missing
(:func:`runtime_unavailable` returns that sentence, or ``None`` when everything is in place).
"""

from __future__ import annotations

import importlib

# public name -> the submodule that defines it (loaded on first use)
_NAMES = {"decode_attention": "wrapper", "SCHEMA": "ops", "QUALNAME": "ops", "AscendDecodeWrapper": "wrapper",
          "load_extension": "runtime", "runtime_unavailable": "runtime", "npu_unavailable": "runtime"}
_SUBMODULES = ("ops", "runtime", "wrapper", "support", "tiling", "npu_backend", "sim_backend", "cann_fia", "atb_paged", "build")

__all__ = list(_NAMES) + list(_SUBMODULES)


def __getattr__(name: str):
    if name in _NAMES:
        return getattr(importlib.import_module(f".{_NAMES[name]}", __name__), name)
    if name in _SUBMODULES:
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module 'ascend_ops' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(__all__))
