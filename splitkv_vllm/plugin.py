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
from .log import attach_vllm, logger, once

ENV_ENABLE = "SPLITKV_VLLM_ENABLE"
ENV_STRICT = "SPLITKV_VLLM_STRICT"
ASCEND_GQA_BACKEND = "vllm_ascend.attention.attention_v1.AscendAttentionBackend"
SPLITKV_BACKEND = "splitkv_vllm.backend.SplitKVAscendAttentionBackend"
PLATFORM_MODULE = "vllm_ascend.platform"
ACTIVE_LINE = "splitkv: decode-only attention routed through splitkv in this worker (%s -> %s; impl=%s)"

#: vLLM Ascend versions whose sources the plugin was checked against (every class, signature, metadata
#: field and forward-context flag it uses; docs/vllm-ascend.md, "Tested versions"): the main snapshot
#: 182b75ea (v0.19.1rc1-1637, reports 0.19.2.devN) and the release 0.23.0.post1. Outside this range the
#: plugin stays off (``untested_versions`` lets it on, logged).
TESTED_VERSIONS = ("0.19.1rc1", "0.23.0.post1")
#: Ascend device types (vLLM Ascend's ``AscendDeviceType`` names) the kernels are built for: 910B (A2), A3.
SUPPORTED_DEVICE_TYPES = ("A2", "A3")
#: The environment variable of vLLM that selects the v2 model runner (not tested with the plugin).
ENV_V2_RUNNER = "VLLM_USE_V2_MODEL_RUNNER"

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


def vllm_ascend_version() -> str | None:
    """The installed vLLM Ascend's version (its generated ``vllm_ascend._version``, else the package
    metadata); ``None`` when neither says."""
    try:
        v = getattr(importlib.import_module("vllm_ascend._version"), "__version__", None)
        if v:
            return str(v)
    except Exception:  # noqa: BLE001 - a source tree without the generated file
        pass
    import importlib.metadata as md

    for name in ("vllm_ascend", "vllm-ascend"):
        try:
            return md.version(name)
        except md.PackageNotFoundError:
            continue
    return None


def version_unsupported(version: str | None) -> str | None:
    """``None`` when ``version`` is within :data:`TESTED_VERSIONS` (inclusive), else why not."""
    from packaging.version import InvalidVersion, Version

    lo, hi = TESTED_VERSIONS
    if version is None:
        return f"the vLLM Ascend version is unknown (tested: {lo} .. {hi})"
    try:
        v = Version(version)
    except InvalidVersion:
        return f"vLLM Ascend version {version!r} does not parse (tested: {lo} .. {hi})"
    if not Version(lo) <= v <= Version(hi):
        return f"vLLM Ascend {version} is outside the tested versions {lo} .. {hi}"
    return None


def device_type_unsupported() -> str | None:
    """``None`` when the NPU is one the kernels are built for (:data:`SUPPORTED_DEVICE_TYPES`), else why not.

    Asks vLLM Ascend (``get_ascend_device_type``: ``vllm_ascend.device.device_config`` at the main
    snapshot, ``vllm_ascend.utils`` in the 0.23 release), which knows A5 (Ascend 950) as well."""
    for mod in ("vllm_ascend.device.device_config", "vllm_ascend.utils"):
        try:
            fn = getattr(importlib.import_module(mod), "get_ascend_device_type", None)
        except Exception:  # noqa: BLE001 - the other layout
            continue
        if fn is None:
            continue
        try:
            kind = fn()
        except Exception as e:  # noqa: BLE001
            return f"vLLM Ascend cannot tell the device type ({type(e).__name__}: {e})"
        name = str(getattr(kind, "name", kind))
        if name not in SUPPORTED_DEVICE_TYPES:
            return (f"the NPU is an Ascend {name}; the splitkv kernels are built for "
                    f"{' / '.join(SUPPORTED_DEVICE_TYPES)} (910B, A3) only")
        return None
    return "vLLM Ascend has no get_ascend_device_type (unsupported version)"


def gate_unsupported() -> str | None:
    """``None`` when this worker may route, else why not: the v2 model runner (not tested), a vLLM
    Ascend version outside :data:`TESTED_VERSIONS` (unless ``untested_versions``), and, for the Ascend
    operator (``impl`` auto / ascend), a device type the kernels are not built for."""
    import os

    s = settings.current()
    if os.environ.get(ENV_V2_RUNNER, "").strip().lower() in settings.TRUE:
        return f"{ENV_V2_RUNNER}=1: the v2 model runner is not tested with the plugin"
    why = version_unsupported(vllm_ascend_version())
    if why and not s.untested_versions:
        return why + " (additional_config splitkv.untested_versions / SPLITKV_VLLM_UNTESTED_VERSIONS=1 routes anyway)"
    if why:
        logger.warning("splitkv: %s; routing anyway (untested_versions)", why)
    if s.impl in ("auto", "ascend"):
        return device_type_unsupported()
    return None


def _off(reason: str) -> None:
    _STATE.update(active=False, reason=reason)
    msg = f"splitkv: the plugin is switched on but stays off: {reason}; vLLM Ascend's own attention is used"
    if settings.current().strict:
        raise RuntimeError(msg)
    once(logging.WARNING, msg)


def _decide() -> bool:
    """First call in a process (and again while off): read the settings, check the operator once."""
    settings.configure()
    s = settings.current()
    if not s.enable:
        _STATE.update(active=False, reason="not switched on (additional_config splitkv.enable / SPLITKV_VLLM_ENABLE)")
        return False
    if _STATE["active"]:
        return True
    why = gate_unsupported()
    if why:
        _off(why)
        return False
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
