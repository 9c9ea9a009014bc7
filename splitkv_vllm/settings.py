"""The plugin's settings: vLLM's ``additional_config["splitkv"]``, overridden by environment variables.

Like vLLM Ascend's own switches, the settings live in vLLM's ``additional_config``
(``--additional-config '{"splitkv": {"enable": true}}'`` or ``LLM(..., additional_config=...)``);
each has an environment variable that, when set, wins (for a quick switch without editing the
launch command). Unknown or malformed values never raise: they are logged once and the default is
used (the plugin promises never to stop vLLM, unless ``strict`` asks it to).

=====================  ===================================  =========  ==========================================
key                    environment variable                 default    meaning
=====================  ===================================  =========  ==========================================
enable                 SPLITKV_VLLM_ENABLE                  false      route decode-only steps through splitkv
strict                 SPLITKV_VLLM_STRICT                  false      a missing piece raises instead of a warning
impl                   SPLITKV_VLLM_IMPL                    auto       auto / ascend / triton / torch
route_window_layers    SPLITKV_VLLM_WINDOW                  false      route sliding-window layers (not yet
                                                                       confirmed on a node; see docs)
route_soft_cap         SPLITKV_VLLM_SOFT_CAP                false      route layers with a logits soft cap
policy                 SPLITKV_VLLM_POLICY                  auto       planner split policy
graph_max_splits       SPLITKV_VLLM_GRAPH_MAX_SPLITS        8          full graphs: partial slots per query row
graph_max_work_items   SPLITKV_VLLM_GRAPH_MAX_WORK_ITEMS    (bound)    full graphs: work-item capacity
reserve_graph_memory   SPLITKV_VLLM_RESERVE_GRAPH_MEMORY    true       hold the graph buffers' bytes during
                                                                       vLLM's memory profiling
device_plan            SPLITKV_VLLM_DEVICE_PLAN             false      full graphs: the kernels plan from the
                                                                       device lengths (no host plan per step)
split_tokens           SPLITKV_VLLM_SPLIT_TOKENS            512        device_plan: the fixed split size (tokens,
                                                                       a multiple of the block size)
stats_dir              SPLITKV_VLLM_STATS_DIR               (none)     each worker writes its counters here
error_check_steps      SPLITKV_VLLM_ERROR_CHECK_STEPS       256        read the kernels' error
                                                                       counter every N routed calls / steps
                                                                       (one host sync; 0 never)
untested_versions      SPLITKV_VLLM_UNTESTED_VERSIONS       false      route under a vLLM Ascend version outside
                                                                       the tested range (logged)
debug_checks           SPLITKV_VLLM_DEBUG_CHECKS            false      eager steps: check page ids and lengths
                                                                       on the host (device-to-host copies of
                                                                       the block table per layer: debugging)
shared_prefix          SPLITKV_VLLM_SHARED_PREFIX           off        eager steps whose metadata carries
                                                                       common_prefix_len > 0: auto (the planner
                                                                       decides), on, off (off by default until
                                                                       measured on a node)
=====================  ===================================  =========  ==========================================

Every value is parsed once per configuration (:func:`current`): a malformed one (``policy=bogus``, a
``size:N`` that is not a multiple of the KV block size) is logged at start-up and replaced by its
default, so no routed step raises for it.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, fields, replace

from splitkv_common.plan import SplitPolicy

from .log import once

CONFIG_KEY = "splitkv"
IMPLS = ("auto", "ascend", "triton", "torch")
SHARED_PREFIX_MODES = ("auto", "on", "off")
TRUE = ("1", "true", "yes", "on")
FALSE = ("0", "false", "no", "off", "")


@dataclass(frozen=True)
class Settings:
    enable: bool = False
    strict: bool = False
    impl: str = "auto"
    route_window_layers: bool = False
    route_soft_cap: bool = False
    policy: str = "auto"
    graph_max_splits: int = 8
    graph_max_work_items: int | None = None
    reserve_graph_memory: bool = True
    device_plan: bool = False
    split_tokens: int = 512
    stats_dir: str | None = None
    error_check_steps: int = 256
    debug_checks: bool = False
    untested_versions: bool = False
    shared_prefix: str = "off"


ENV = {
    "enable": "SPLITKV_VLLM_ENABLE", "strict": "SPLITKV_VLLM_STRICT", "impl": "SPLITKV_VLLM_IMPL",
    "route_window_layers": "SPLITKV_VLLM_WINDOW", "route_soft_cap": "SPLITKV_VLLM_SOFT_CAP",
    "policy": "SPLITKV_VLLM_POLICY", "graph_max_splits": "SPLITKV_VLLM_GRAPH_MAX_SPLITS",
    "graph_max_work_items": "SPLITKV_VLLM_GRAPH_MAX_WORK_ITEMS",
    "reserve_graph_memory": "SPLITKV_VLLM_RESERVE_GRAPH_MEMORY", "device_plan": "SPLITKV_VLLM_DEVICE_PLAN",
    "split_tokens": "SPLITKV_VLLM_SPLIT_TOKENS", "stats_dir": "SPLITKV_VLLM_STATS_DIR",
    "error_check_steps": "SPLITKV_VLLM_ERROR_CHECK_STEPS", "debug_checks": "SPLITKV_VLLM_DEBUG_CHECKS",
    "untested_versions": "SPLITKV_VLLM_UNTESTED_VERSIONS", "shared_prefix": "SPLITKV_VLLM_SHARED_PREFIX",
}
DEFAULTS = Settings()

# additional_config["splitkv"] of this process's vLLM config, once seen (configure())
_CONFIG: dict = {}
_CONFIG_SEEN = [False]
_BLOCK_SIZE = [0]     # the KV cache's block size, once configure() has seen the vLLM config
_CURRENT: dict = {}   # (environment, block size) -> Settings: parsed once (current())
MAX_SETTING_INT = (1 << 31) - 1


def _bad(source: str, key: str, value, why: str):
    once(logging.WARNING, "splitkv: %s %s=%r ignored (%s); using the default %r", source, key, value, why,
         getattr(DEFAULTS, key))
    return getattr(DEFAULTS, key)


def _parse(key: str, value, source: str):
    default = getattr(DEFAULTS, key)
    if isinstance(default, bool):
        if isinstance(value, bool):
            return value
        text = str(value).strip().lower()
        if text in TRUE:
            return True
        if text in FALSE:
            return False
        return _bad(source, key, value, "expected true/false")
    if key == "impl":
        text = str(value).strip().lower() or "auto"
        return text if text in IMPLS else _bad(source, key, value, f"expected one of {IMPLS}")
    if key == "shared_prefix":
        if isinstance(value, bool):   # additional_config {"shared_prefix": true}
            return "on" if value else "off"
        text = str(value).strip().lower() or default
        return text if text in SHARED_PREFIX_MODES else _bad(source, key, value, f"expected one of {SHARED_PREFIX_MODES}")
    if key == "error_check_steps":   # 0: never
        try:
            v = int(str(value).strip())
        except (TypeError, ValueError):
            return _bad(source, key, value, "expected an integer >= 0")
        return v if 0 <= v <= MAX_SETTING_INT else _bad(source, key, value, f"expected 0 .. {MAX_SETTING_INT}")
    if key in ("graph_max_splits", "graph_max_work_items", "split_tokens"):
        if value is None or (isinstance(value, str) and not value.strip()):
            return default
        try:
            v = int(value)
        except (TypeError, ValueError):
            return _bad(source, key, value, "expected a positive integer")
        if v > MAX_SETTING_INT:
            return _bad(source, key, value, f"over the limit {MAX_SETTING_INT} (int32)")
        return v if v > 0 else _bad(source, key, value, "expected a positive integer")
    if key == "policy":
        text = str(value).strip() or default
        try:
            pol = SplitPolicy.parse(text)
        except ValueError as e:
            return _bad(source, key, value, str(e))
        page = _BLOCK_SIZE[0]
        if pol.kind == "fixed_size" and page and pol.value % page:
            return _bad(source, key, value, f"a split of {pol.value} tokens is not a multiple of the block size {page}")
        return text
    if key == "stats_dir":
        return str(value) if value else None
    return str(value).strip() or default


def _block_size(vllm_config) -> int:
    """The KV cache's block size of ``vllm_config`` (0 when unknown)."""
    try:
        v = int(getattr(getattr(vllm_config, "cache_config", None), "block_size", 0) or 0)
    except (TypeError, ValueError):
        return 0
    return v if v > 0 else 0


def configure(vllm_config=None) -> dict:
    """Read ``additional_config["splitkv"]`` from ``vllm_config`` (default: vLLM's current config, if
    vLLM is imported and has one). Returns the dict read (empty when none). Never raises."""
    if vllm_config is None:
        try:
            import sys

            if "vllm" not in sys.modules:
                return dict(_CONFIG)
            from vllm.config import get_current_vllm_config

            vllm_config = get_current_vllm_config()
        except Exception:  # noqa: BLE001
            return dict(_CONFIG)
    page = _block_size(vllm_config)
    if page and page != _BLOCK_SIZE[0]:
        _BLOCK_SIZE[0] = page
        _CURRENT.clear()
    extra = getattr(vllm_config, "additional_config", None) or {}
    section = extra.get(CONFIG_KEY, {}) if isinstance(extra, dict) else {}
    if not isinstance(section, dict):
        _bad("additional_config", CONFIG_KEY, section, "expected a mapping")
        section = {}
    unknown = sorted(set(section) - {f.name for f in fields(Settings)})
    if unknown:
        once(logging.WARNING, "splitkv: additional_config.splitkv: unknown keys %s ignored", unknown)
    if section or not _CONFIG_SEEN[0]:
        _CURRENT.clear()
        _CONFIG.clear()
        _CONFIG.update({k: v for k, v in section.items() if k not in unknown})
        _CONFIG_SEEN[0] = bool(section) or _CONFIG_SEEN[0]
    return dict(_CONFIG)


def reset() -> None:
    """Forget the configuration read by :func:`configure` (tests)."""
    _CONFIG.clear()
    _CONFIG_SEEN[0] = False
    _BLOCK_SIZE[0] = 0
    _CURRENT.clear()


def env_set(key: str) -> bool:
    """Whether the environment variable of ``key`` is set (it then overrides additional_config)."""
    return ENV[key] in os.environ


def current() -> Settings:
    """The settings now: defaults, then ``additional_config["splitkv"]``, then set environment variables.

    Parsed once per configuration (the routed steps call this): a malformed value is logged once and
    replaced by its default here, at start-up, never raised in a step (a ``policy`` that does not
    parse, or a ``size:N`` that is not a multiple of the KV block size once ``configure()`` has seen
    the vLLM config). Cost per call: reading the ``SPLITKV_VLLM_*`` environment variables and one
    dict lookup."""
    key = (tuple(os.environ.get(v) for v in ENV.values()), _BLOCK_SIZE[0])
    hit = _CURRENT.get(key)
    if hit is not None:
        return hit
    if len(_CURRENT) > 16:
        _CURRENT.clear()
    _CURRENT[key] = s = _parse_all()
    return s


def _parse_all() -> Settings:
    s = DEFAULTS
    values = {}
    for key, value in _CONFIG.items():
        values[key] = _parse(key, value, "additional_config.splitkv")
    for key, var in ENV.items():
        if var in os.environ:
            values[key] = _parse(key, os.environ[var], var)
    return replace(s, **values)


def as_dict(s: Settings | None = None) -> dict:
    s = s or current()
    return {f.name: getattr(s, f.name) for f in fields(s)}
