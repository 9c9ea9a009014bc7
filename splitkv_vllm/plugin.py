"""The ``vllm.general_plugins`` entry point: ``splitkv = "splitkv_vllm.plugin:register"``.

vLLM calls :func:`register` in every process it starts (``vllm.plugins.load_general_plugins``).
It does nothing unless ``SPLITKV_VLLM_ENABLE=1``. When switched on it:

1. checks that vLLM Ascend's platform imports (vLLM Ascend, torch_npu, CANN) and that the Ascend
   operator can run (``ascend_ops``: torch_npu, an NPU, the built extension, whose load registers
   ``torch.ops.splitkv_ascend.decode_attention``'s NPU kernel);
2. wraps ``NPUPlatform.get_attn_backend_cls`` so that where vLLM Ascend would choose its GQA
   backend (``vllm_ascend.attention.attention_v1.AscendAttentionBackend``) it gets
   :class:`splitkv_vllm.backend.SplitKVAscendAttentionBackend`, the same backend with decode-only
   steps routed through splitkv. Every other answer (MLA, SFA, DSA, FA3, 310P) is passed through.

If a piece is missing the plugin logs one warning saying which, and stays off: vLLM runs on its
own path. ``SPLITKV_VLLM_STRICT=1`` turns that warning into a ``RuntimeError`` (a deployment that
must not silently run without the plugin). ``SPLITKV_VLLM_IMPL=torch`` routes through the plain
torch split-then-merge path instead of the Ascend operator (slow; for checking the adapter on a node
where the extension is not built).

``python -m splitkv_vllm.plugin`` prints :func:`status` (is it on, and why not).
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import os

logger = logging.getLogger("splitkv_vllm")

ENV_ENABLE = "SPLITKV_VLLM_ENABLE"
ENV_STRICT = "SPLITKV_VLLM_STRICT"
ASCEND_GQA_BACKEND = "vllm_ascend.attention.attention_v1.AscendAttentionBackend"
SPLITKV_BACKEND = "splitkv_vllm.backend.SplitKVAscendAttentionBackend"
PLATFORM_MODULE = "vllm_ascend.platform"

_STATE = {"active": False, "reason": "register() not called"}


def _flag(name: str) -> bool:
    return os.environ.get(name, "0").strip().lower() in ("1", "true", "yes", "on")


def enabled() -> bool:
    """Whether ``SPLITKV_VLLM_ENABLE`` switches the plugin on (off by default)."""
    return _flag(ENV_ENABLE)


def platform_unavailable() -> str | None:
    """``None`` when vLLM Ascend's platform module imports, else why not."""
    if importlib.util.find_spec("vllm_ascend") is None:
        return "vLLM Ascend (vllm_ascend) is not installed"
    try:
        importlib.import_module(PLATFORM_MODULE)
    except Exception as e:  # noqa: BLE001 - torch_npu / CANN missing shows up here
        return f"vLLM Ascend's platform does not import ({type(e).__name__}: {e})"
    return None


def operator_unavailable() -> str | None:
    """``None`` when decode can run through splitkv on this node, else why not."""
    from .dispatch import requested_impl

    if requested_impl() == "torch":
        return None
    try:
        from ascend_ops import runtime
    except Exception as e:  # noqa: BLE001
        return f"ascend_ops does not import ({type(e).__name__}: {e})"
    return runtime.runtime_unavailable()


def _wrap_platform(platform_cls) -> None:
    current = platform_cls.get_attn_backend_cls
    if getattr(current, "_splitkv_wrapped", False):
        return
    original = current.__func__  # a classmethod, bound to the platform class

    def get_attn_backend_cls(cls, *args, **kwargs):
        name = original(cls, *args, **kwargs)
        return SPLITKV_BACKEND if name == ASCEND_GQA_BACKEND else name

    get_attn_backend_cls._splitkv_wrapped = True
    get_attn_backend_cls._splitkv_original = original
    get_attn_backend_cls.__doc__ = original.__doc__
    platform_cls.get_attn_backend_cls = classmethod(get_attn_backend_cls)


def _off(reason: str) -> None:
    _STATE.update(active=False, reason=reason)
    msg = f"splitkv: {ENV_ENABLE}=1 but the plugin stays off: {reason}; vLLM Ascend's own attention is used"
    if _flag(ENV_STRICT):
        raise RuntimeError(msg)
    logger.warning(msg)


def register() -> None:
    """vLLM general-plugin hook (see module docstring). Never raises unless ``SPLITKV_VLLM_STRICT=1``."""
    if not enabled():
        _STATE.update(active=False, reason=f"{ENV_ENABLE} is not set")
        return
    why = platform_unavailable()
    if why:
        return _off(why)
    why = operator_unavailable()
    if why:
        return _off(f"the splitkv Ascend operator cannot run ({why})")
    platform = importlib.import_module(PLATFORM_MODULE)
    platform_cls = getattr(platform, "NPUPlatform", None)
    if platform_cls is None or not hasattr(platform_cls, "get_attn_backend_cls"):
        return _off(f"{PLATFORM_MODULE}.NPUPlatform.get_attn_backend_cls not found (unsupported vLLM Ascend version)")
    _wrap_platform(platform_cls)
    _STATE.update(active=True, reason=f"{ASCEND_GQA_BACKEND} -> {SPLITKV_BACKEND}")
    logger.info("splitkv: decode-only attention routed through splitkv (%s)", _STATE["reason"])


def status() -> dict:
    """``{"enabled", "active", "reason"}``: what :func:`register` did in this process."""
    return {"enabled": enabled(), **_STATE}


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    register()
    print(status())
