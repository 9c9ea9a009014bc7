"""The plugin's logger: a child of vLLM's ``vllm`` logger, so its lines go where vLLM's go.

vLLM configures handlers on the ``vllm`` logger only (``vllm.logger``); a logger outside that tree
(such as a plain ``splitkv_vllm``) has no handler and its INFO lines are dropped. The plugin logs as
``vllm.splitkv_vllm``: through ``vllm.logger.init_logger`` when vLLM is imported (it adds vLLM's
``*_once`` helpers), else as a plain child of ``vllm`` (the same logger object either way).
Importing this module never imports vLLM.
"""

from __future__ import annotations

import logging
import sys

LOGGER_NAME = "vllm.splitkv_vllm"

logger = logging.getLogger(LOGGER_NAME)


def attach_vllm() -> logging.Logger:
    """Hand the logger to ``vllm.logger.init_logger`` if vLLM is already imported (never imports it)."""
    if "vllm" not in sys.modules:
        return logger
    try:
        from vllm.logger import init_logger
    except Exception:  # noqa: BLE001 - a vLLM without init_logger: the plain child logger still propagates
        return logger
    try:
        init_logger(LOGGER_NAME)
    except Exception:  # noqa: BLE001
        pass
    return logger


_ONCE: set = set()


def once(level: int, msg: str, *args) -> None:
    """Log ``msg % args`` at ``level`` the first time this exact line comes up in this process."""
    try:
        key = (level, msg % args if args else msg)
    except Exception:  # noqa: BLE001 - a malformed format still logs once
        key = (level, msg, repr(args))
    if key in _ONCE:
        return
    _ONCE.add(key)
    logger.log(level, msg, *args)
