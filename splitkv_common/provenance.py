"""Where a report came from: date, code, software and device, so that any number can be traced.

:func:`provenance` returns a plain dict that every report (parity, benchmarks, checks) embeds as
its ``"provenance"`` entry, and :func:`provenance_markdown` renders it as the lines a Markdown
report starts with. NumPy is the only requirement: torch, Triton, torch_npu and CANN are recorded
when they are importable (or, for torch, already imported), never imported for their own sake when
``probe_optional=False``.
"""

from __future__ import annotations

import datetime
import os
import platform
import shlex
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

import numpy as np

from . import __version__

_REPO = Path(__file__).resolve().parent.parent


@lru_cache(maxsize=1)
def git_state(repo: str | os.PathLike = _REPO) -> dict:
    """``{"commit": sha or None, "dirty": bool or None}`` of the checkout holding this package
    (``None`` when it is not a git checkout, e.g. an installed wheel, or git is missing)."""
    def git(*args: str) -> str | None:
        try:
            r = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.SubprocessError):
            return None
        return r.stdout.strip() if r.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    if commit is None:
        return {"commit": None, "dirty": None}
    status = git("status", "--porcelain", "--untracked-files=no")
    return {"commit": commit, "dirty": None if status is None else bool(status)}


def _module_version(name: str, import_it: bool) -> str | None:
    mod = sys.modules.get(name)
    if mod is None and import_it:
        try:
            mod = __import__(name)
        except Exception:  # noqa: BLE001 - absent or broken: recorded as absent
            return None
    return None if mod is None else str(getattr(mod, "__version__", "unknown"))


def _cann_version() -> str | None:
    """CANN's version from the toolkit ``ASCEND_HOME_PATH`` points at (its version.cfg / info file)."""
    home = os.environ.get("ASCEND_HOME_PATH")
    if not home:
        return None
    for rel in ("version.cfg", "ascend_toolkit_install.info", "compiler/version.info"):
        f = Path(home) / rel
        if f.is_file():
            for line in f.read_text(errors="replace").splitlines():
                key, _, value = line.partition("=")
                if key.strip().lower() in ("version", "toolkit_installed_version") and value.strip():
                    return value.strip().strip('"[]')
    return f"unknown ({home})"


def _device_name(torch_version: str | None) -> str:
    """The accelerator torch sees (CUDA GPU or Ascend NPU), else the CPU."""
    torch = sys.modules.get("torch") if torch_version else None
    try:
        if torch is not None and torch.cuda.is_available():
            return torch.cuda.get_device_name()
        npu = getattr(torch, "npu", None) if torch is not None else None
        if npu is not None and npu.is_available():
            return npu.get_device_name()
    except Exception:  # noqa: BLE001 - a device that cannot be queried is reported as the CPU
        pass
    model = platform.processor()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.partition(":")[2].strip()
                break
    except OSError:
        pass
    return f"CPU {platform.machine()}, {os.cpu_count()} cores ({model or 'model unknown'})"


def _program(path: str) -> str:
    """The program as a reader can rerun it: relative to the repository when inside it, else its name."""
    p = Path(path)
    if p.parent.name == "bin":  # a console script such as `splitkv`
        return p.name
    try:
        return str(p.resolve().relative_to(_REPO))
    except (ValueError, OSError):
        return p.name or path


def provenance(argv: list[str] | None = None, *, probe_optional: bool = True) -> dict:
    """What a report records about its run.

    Args:
        argv: the command line (default ``sys.argv``), recorded as one shell-quoted string.
        probe_optional: import torch / Triton / torch_npu to record their versions when they are
            installed (``False``: record only those already imported).

    Returns:
        ``date`` (UTC, ISO 8601), ``command``, ``splitkv``, ``git`` (``commit``, ``dirty``),
        ``python``, ``numpy``, ``torch``, ``triton``, ``torch_npu``, ``cann`` (``None`` when absent),
        ``platform`` and ``device``.
    """
    argv = sys.argv if argv is None else argv
    torch_v = _module_version("torch", probe_optional)
    # torch_npu is only ever read if something imported it: importing it un-asked can break torch.
    info = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": shlex.join([_program(argv[0]), *argv[1:]]) if argv else "",
        "splitkv": __version__,
        "git": git_state(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "torch": torch_v,
        "triton": _module_version("triton", probe_optional and torch_v is not None),
        "torch_npu": _module_version("torch_npu", False),
        "cann": _cann_version(),
        "platform": platform.platform(),
    }
    info["device"] = _device_name(torch_v)
    return info


def provenance_markdown(info: dict) -> list[str]:
    """The lines a Markdown report starts with (one bullet list, then a blank line)."""
    git = info.get("git") or {}
    commit = git.get("commit") or "not a git checkout"
    if git.get("dirty"):
        commit += " (with uncommitted changes)"
    soft = ", ".join(f"{k} {info[k]}" for k in ("python", "numpy", "torch", "triton", "torch_npu", "cann")
                     if info.get(k))
    return [f"- date: {info['date']}", f"- command: `{info['command']}`", f"- commit: {commit}",
            f"- software: splitkv {info['splitkv']}, {soft}", f"- device: {info['device']}", ""]
