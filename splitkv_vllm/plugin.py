"""The ``vllm.general_plugins`` entry point: ``splitkv = "splitkv_vllm.plugin:register"``.

vLLM calls :func:`register` in every process it starts (API server, EngineCore, workers;
``vllm.plugins.load_general_plugins``), before its config exists. So :func:`register` stays cheap:
it neither queries the NPU nor loads our extension. It

1. hands the plugin's logger (``vllm.splitkv_vllm``) to vLLM's logging;
2. if vLLM Ascend is installed and the plugin is not switched off by ``SPLITKV_VLLM_ENABLE=0``,
   wraps ``NPUPlatform.get_attn_backend_cls``.

The wrapper decides at its first call, which vLLM makes in a worker while it builds the model (so
with the vLLM config current): it reads the settings (``additional_config["splitkv"]``, then the
environment, :mod:`splitkv_vllm.settings`); if the plugin is on, it checks once in that process
that the operator can run (``ascend_ops``: torch_npu, an NPU, the built extension, whose load
registers ``torch.ops.splitkv_ascend.decode_attention``) and from then on answers
:class:`splitkv_vllm.backend.SplitKVAscendAttentionBackend` where vLLM Ascend would answer its GQA
backend (``vllm_ascend.attention.attention_v1.AscendAttentionBackend``). Every other answer (MLA,
SFA, DSA, FA3, 310P) is passed through. When the plugin is off the wrapper passes everything through.

If a piece is missing the plugin logs one warning saying which, and stays off: vLLM runs on its
own path. ``strict`` (``SPLITKV_VLLM_STRICT=1``) turns that warning into a ``RuntimeError``.
``impl=torch`` routes through the plain torch split-then-merge path instead of the Ascend operator
(slow; for checking the adapter on a node where the extension is not built). Nothing else raises:
malformed settings are logged and replaced by their defaults.

``python -m splitkv_vllm.plugin`` prints :func:`status` and, with ``--check``, runs the operator check.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import sys

from . import settings
from .log import attach_vllm, logger

ENV_ENABLE = "SPLITKV_VLLM_ENABLE"
ENV_STRICT = "SPLITKV_VLLM_STRICT"
ASCEND_GQA_BACKEND = "vllm_ascend.attention.attention_v1.AscendAttentionBackend"
SPLITKV_BACKEND = "splitkv_vllm.backend.SplitKVAscendAttentionBackend"
PLATFORM_MODULE = "vllm_ascend.platform"
ACTIVE_LINE = "splitkv: decode-only attention routed through splitkv in this worker (%s -> %s; impl=%s)"

_STATE = {"wrapped": False, "active": False, "reason": "register() not called", "operator": "not checked"}
_OPERATOR: dict = {}  # impl -> None | why not (checked once per process)


def enabled() -> bool:
    """Whether the plugin is switched on (``additional_config["splitkv"]["enable"]`` or the environment)."""
    return settings.current().enable


def explicitly_disabled() -> bool:
    return settings.env_set("enable") and not settings.current().enable


def platform_unavailable() -> str | None:
    """``None`` when vLLM Ascend's platform module imports, else why not."""
    try:
        if importlib.util.find_spec("vllm_ascend") is None:
            return "vLLM Ascend (vllm_ascend) is not installed"
    except (ImportError, ValueError):
        return "vLLM Ascend (vllm_ascend) is not installed"
    try:
        importlib.import_module(PLATFORM_MODULE)
    except Exception as e:  # noqa: BLE001 - torch_npu / CANN missing shows up here
        return f"vLLM Ascend's platform does not import ({type(e).__name__}: {e})"
    return None


def operator_unavailable() -> str | None:
    """``None`` when decode can run through splitkv in this process, else why not (checked once per impl).

    This is the check that loads the extension and looks for an NPU: the platform wrapper runs it
    at its first call in a worker, never :func:`register`."""
    impl = settings.current().impl
    if impl in _OPERATOR:
        return _OPERATOR[impl]
    if impl == "torch":
        why = None
    elif impl == "triton":
        try:
            import cuda_ref.wrapper  # noqa: F401 - the Triton kernels (a GPU, or the interpreter)

            why = None
        except Exception as e:  # noqa: BLE001
            why = f"cuda_ref does not import ({type(e).__name__}: {e})"
    else:
        try:
            from ascend_ops import runtime

            why = runtime.runtime_unavailable()
        except Exception as e:  # noqa: BLE001
            why = f"ascend_ops does not import ({type(e).__name__}: {e})"
    _OPERATOR[impl] = why
    _STATE["operator"] = "ready" if why is None else why
    return why


def _off(reason: str) -> None:
    _STATE.update(active=False, reason=reason)
    msg = f"splitkv: the plugin is switched on but stays off: {reason}; vLLM Ascend's own attention is used"
    if settings.current().strict:
        raise RuntimeError(msg)
    logger.warning(msg)


def _decide() -> bool:
    """First call in a process (and again while off): read the settings, check the operator once."""
    settings.configure()
    s = settings.current()
    if not s.enable:
        _STATE.update(active=False, reason="not switched on (additional_config splitkv.enable / SPLITKV_VLLM_ENABLE)")
        return False
    if _STATE["active"]:
        return True
    why = operator_unavailable()
    if why:
        _off(f"the splitkv Ascend operator cannot run ({why})")
        return False
    _STATE.update(active=True, reason=f"{ASCEND_GQA_BACKEND} -> {SPLITKV_BACKEND}")
    logger.info(ACTIVE_LINE, ASCEND_GQA_BACKEND, SPLITKV_BACKEND, s.impl)
    return True


def _wrap_platform(platform_cls) -> None:
    current = platform_cls.get_attn_backend_cls
    if getattr(current, "_splitkv_wrapped", False):
        return
    original = current.__func__  # a classmethod, bound to the platform class

    def get_attn_backend_cls(cls, *args, **kwargs):
        name = original(cls, *args, **kwargs)
        if name != ASCEND_GQA_BACKEND:
            return name
        return SPLITKV_BACKEND if _decide() else name

    get_attn_backend_cls._splitkv_wrapped = True
    get_attn_backend_cls._splitkv_original = original
    get_attn_backend_cls.__doc__ = original.__doc__
    platform_cls.get_attn_backend_cls = classmethod(get_attn_backend_cls)


def register() -> None:
    """vLLM general-plugin hook (see module docstring). Cheap; never raises unless strict."""
    attach_vllm()
    if explicitly_disabled():
        _STATE.update(wrapped=False, active=False, reason=f"{ENV_ENABLE}=0")
        return
    why = platform_unavailable()
    if why:
        _STATE.update(wrapped=False, active=False, reason=why)
        if settings.current().enable:  # asked for it by the environment: say why not
            return _off(why)
        return
    platform = importlib.import_module(PLATFORM_MODULE)
    platform_cls = getattr(platform, "NPUPlatform", None)
    if platform_cls is None or not hasattr(platform_cls, "get_attn_backend_cls"):
        why = f"{PLATFORM_MODULE}.NPUPlatform.get_attn_backend_cls not found (unsupported vLLM Ascend version)"
        _STATE.update(wrapped=False, active=False, reason=why)
        if settings.current().enable:
            return _off(why)
        return
    _wrap_platform(platform_cls)
    _STATE.update(wrapped=True, active=False,
                  reason="platform wrapped; decided at the first backend selection in a worker")


def status() -> dict:
    """What the plugin did in *this* process: ``{"enabled", "wrapped", "active", "reason", "operator"}``.

    The model runs in vLLM's worker processes: read their state with :mod:`splitkv_vllm.stats`."""
    return {"enabled": enabled(), **_STATE}


def _reset_for_tests() -> None:
    _STATE.update(wrapped=False, active=False, reason="register() not called", operator="not checked")
    _OPERATOR.clear()


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    register()
    if "--check" in sys.argv[1:]:
        print({"operator": operator_unavailable() or "ready"})
    print(status())
