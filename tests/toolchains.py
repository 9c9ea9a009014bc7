"""Toolchain helpers of the tests that build native code under other compilers or the sanitizers
(``ascend/test_twin_toolchains.py``, ``test_call_guard_sanitizers.py``)."""

from __future__ import annotations

import os
import subprocess

import pytest


def missing(reason: str):
    """Skip for a toolchain this machine lacks, unless ``SPLITKV_TWIN_TOOLCHAINS=required`` (CI, which
    installs them): then fail."""
    if os.environ.get("SPLITKV_TWIN_TOOLCHAINS") == "required":
        pytest.fail(f"SPLITKV_TWIN_TOOLCHAINS=required: {reason}")
    pytest.skip(reason)


def sanitizer_runtime(cxx: str, name: str) -> str | None:
    """The path of a sanitizer runtime the compiler ships (``libasan.so``), or None."""
    try:
        out = subprocess.run([cxx, f"-print-file-name={name}"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    path = out.strip()
    return path if os.path.isabs(path) and os.path.exists(path) else None
