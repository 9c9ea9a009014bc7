"""Runtime of ``torch.ops.splitkv_ascend.decode_attention``: what is missing, the library, the device.

* What is missing, in words: :func:`runtime_unavailable` (the first missing piece: torch_npu, an
  NPU, the built extension) and :func:`extension_unavailable`. The NPU probes themselves
  (:func:`~splitkv_common.npu_probe.npu_unavailable`, :func:`~splitkv_common.npu_probe.npu_device`...)
  are :mod:`splitkv_common.npu_probe`'s, shared with ``cuda_ref.npu``.
* The C++ library ``scripts/build_ascend.sh`` builds (the op's ``PrivateUse1`` kernel,
  ``ascend_ops/csrc/binding.cpp``): :func:`library_path`, :func:`load_extension`,
  :func:`has_npu_kernel`.
* The device: :func:`resolve_device`, :func:`require_npu_kernel`.

Importing this module defines the operator first (:mod:`ascend_ops.ops`): the library implements
the Python schema without restating it, and the dispatcher checks its C++ signature against the
schema when it is loaded.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from splitkv_common.npu_probe import npu_device, npu_unavailable, torch_npu_unavailable

from .ops import QUALNAME

LIBRARY_FILE = "libsplitkv_ascend.so"
#: Where ``scripts/build_ascend.sh`` puts the library (``SPLITKV_ASCEND_LIB`` names another file).
LIBRARY_DIR = Path(__file__).resolve().parent / "_lib"


def library_path() -> Path:
    """The extension library to load: ``SPLITKV_ASCEND_LIB`` or ``ascend_ops/_lib/libsplitkv_ascend.so``."""
    env = os.environ.get("SPLITKV_ASCEND_LIB")
    return Path(env) if env else LIBRARY_DIR / LIBRARY_FILE


def has_npu_kernel() -> bool:
    """Whether a ``PrivateUse1`` kernel is registered for the op (the C++ library is loaded)."""
    return torch._C._dispatch_has_kernel_for_dispatch_key(QUALNAME, "PrivateUse1")


def load_extension(path: "str | Path | None" = None) -> None:
    """Load the C++ library (its ``PrivateUse1`` kernel); raise ``RuntimeError`` saying what is missing.

    torch_npu is imported first (the library links against it). Loading twice is a no-op.
    """
    if has_npu_kernel():
        return
    why = torch_npu_unavailable()
    if why:
        raise RuntimeError(f"{QUALNAME}: cannot load the NPU kernel: {why}")
    lib = Path(path) if path is not None else library_path()
    if not lib.is_file():
        raise RuntimeError(f"{QUALNAME}: the extension is not built ({lib} does not exist); run "
                           "scripts/build_ascend.sh on a machine with CANN and torch_npu (docs/npu.md)")
    try:
        torch.ops.load_library(str(lib))
    except Exception as e:  # noqa: BLE001
        raise RuntimeError(f"{QUALNAME}: loading {lib} failed: {type(e).__name__}: {e}") from e
    if not has_npu_kernel():
        raise RuntimeError(f"{QUALNAME}: {lib} loaded but registered no PrivateUse1 kernel for the op")


def extension_unavailable() -> str | None:
    """``None`` when the NPU kernel is registered or loads now, else why not."""
    try:
        load_extension()
    except RuntimeError as e:
        return str(e)
    return None


def runtime_unavailable() -> str | None:
    """``None`` when the operator can run on an NPU here, else the first missing piece in words:
    torch_npu (not installed / not importable), an NPU device, the built extension."""
    return npu_unavailable() or extension_unavailable()


def resolve_device(device=None) -> torch.device:
    """``device`` (default: the NPU) as a ``torch.device``; ``RuntimeError`` saying what is missing
    when it names the NPU and torch does not know it (torch_npu not imported)."""
    try:
        return torch.device(device if device is not None else npu_device())
    except RuntimeError:
        why = npu_unavailable() or "torch does not know the device"
        raise RuntimeError(f"{QUALNAME}: cannot use device {str(device or 'npu')!r}: {why}") from None


def require_npu_kernel(device: torch.device) -> None:
    """Raise a clear ``RuntimeError`` unless the op can run on ``device``."""
    if device.type == "cpu":
        return
    if device.type != torch._C._get_privateuse1_backend_name() and device.type != "npu":
        raise RuntimeError(f"{QUALNAME}: tensors are on {device}; the operator runs on an Ascend NPU ('npu')")
    if has_npu_kernel():
        return
    why = runtime_unavailable()
    if why:
        raise RuntimeError(f"{QUALNAME}: cannot run on {device}: {why}")
