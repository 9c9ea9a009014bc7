"""Optional dependencies: which extra installs each, and a one-line refusal when one is missing.

NumPy is the only hard dependency of ``splitkv_common``; torch, Triton, torch_npu and tqdm come
with extras (``pyproject.toml``). Scripts call :func:`require` instead of importing them directly,
so that a machine without them gets one line saying what to install, not a traceback.
"""

from __future__ import annotations

import importlib
import sys
from types import ModuleType

EXTRAS = {"torch": "torch", "triton": "triton", "torch_npu": "npu", "tqdm": "progress", "matplotlib": "bench"}
"""Missing module -> the extra that installs it (``pip install 'splitkv[EXTRA]'``)."""


def missing_reason(error: ImportError) -> str:
    """The reason a missing optional module gives, in words: ``"torch is not installed (pip ...)"``."""
    name = (error.name or "").split(".")[0]
    if name in EXTRAS:
        return f"{name} is not installed (pip install 'splitkv[{EXTRAS[name]}]')"
    return f"{type(error).__name__}: {error}"


def require(module: str, who: str) -> ModuleType:
    """Import ``module``, or exit (status 2) with one line naming ``who`` needs it and how to install it."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        print(f"error: {who} needs {module}: {missing_reason(e)}", file=sys.stderr)
        raise SystemExit(2) from None
