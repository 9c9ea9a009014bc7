"""Where the Ascend operator's sources are (the tests read and compile them), and the host compiler."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BINDING = ROOT / "ascend_ops" / "csrc" / "binding.cpp"
OFFLINE = ROOT / "ascend_ops" / "csrc" / "offline"
LAUNCH = ROOT / "ascend_ops" / "csrc" / "launch"
TILING_H = ROOT / "ascend_ops" / "kernel" / "splitkv_tiling.h"
KERNELS = ("splitkv_split", "splitkv_combine")

HAS_CXX = bool(os.environ.get("CXX") or shutil.which("g++") or shutil.which("clang++"))
