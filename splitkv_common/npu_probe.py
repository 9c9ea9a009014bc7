"""Is an Ascend NPU usable here? The probes every backend that runs on one shares.

``ascend_ops`` (the Ascend C operator) and ``cuda_ref.npu`` (the Triton kernels through
triton-ascend) both need the same answers: does torch_npu import, is an NPU visible, what is the
NPU's torch device type called. Each probe returns ``None`` when all is well, else the reason in
words (as ``Backend.unavailable`` does).

Importing this module needs only the standard library: torch and torch_npu are imported by the
probes, when called, never at import time (``import splitkv_common`` keeps NumPy as its only hard
dependency).
"""

from __future__ import annotations

import importlib.util
import sys

#: The torch device type of Ascend NPUs once torch_npu is imported (PrivateUse1 renamed).
NPU_DEVICE = "npu"

#: The device profile (:mod:`splitkv_common.devices`) NPU backends plan for unless told otherwise.
DEFAULT_NPU_PROFILE = "910b2"


def torch_npu_imported() -> bool:
    """Whether torch_npu has been imported in this process (nothing is imported to find out)."""
    return "torch_npu" in sys.modules


def npu_device() -> str:
    """The torch device type of Ascend NPUs (``npu``, once torch_npu is imported)."""
    if torch_npu_imported():
        import torch

        return torch._C._get_privateuse1_backend_name()
    return NPU_DEVICE


def torch_npu_unavailable() -> str | None:
    """``None`` when torch_npu imports, else why not."""
    if importlib.util.find_spec("torch_npu") is None:
        import torch

        return ("torch_npu is not installed: install the torch-npu wheel matching this torch "
                f"({torch.__version__.split('+')[0]}) on a machine with CANN (see docs/npu.md)")
    try:
        import torch_npu  # noqa: F401
    except Exception as e:  # noqa: BLE001 - any import failure is reported as it is
        return (f"torch_npu is installed but does not import ({type(e).__name__}: {e}); source CANN's "
                "set_env.sh first (docs/npu.md)")
    return None


def npu_unavailable() -> str | None:
    """``None`` when an NPU is usable through torch_npu, else why not."""
    why = torch_npu_unavailable()
    if why:
        return why
    import torch

    try:
        n = torch.npu.device_count()
    except Exception as e:  # noqa: BLE001
        return f"torch_npu imports but cannot query devices ({type(e).__name__}: {e})"
    if n == 0:
        return "torch_npu imports but no NPU device is visible (check npu-smi info and ASCEND_RT_VISIBLE_DEVICES)"
    return None


def npu_op_unavailable(name: str, missing: str) -> str | None:
    """``None`` when torch and an NPU are usable and ``torch_npu`` has the op ``name``; else why not
    (``missing``: the reason given when this torch_npu lacks the op)."""
    try:
        import torch  # noqa: F401
    except Exception as e:  # noqa: BLE001
        return f"torch is not usable ({type(e).__name__}: {e})"
    why = npu_unavailable()
    if why:
        return why
    import torch_npu

    return None if hasattr(torch_npu, name) else missing
