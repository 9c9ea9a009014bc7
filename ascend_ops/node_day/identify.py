"""Stage 1: what this machine is, and whether the kernels are built for its chip.

:func:`identify_npu` runs in a watchdog child on a node (it imports torch_npu); :func:`identify_twin`
describes the CPU twin's run. Both return a flat dict (``chip``, ``profile``, ``aic``, ``aiv``,
``hbm_gib``, ``cann``, ``driver``, ``torch``, ``torch_npu``, ``python``, ``numpy``, ``commit``,
``dirty``, ``host``, ``devices``, ``supported``, ``refusal``); ``supported`` is False with the
reason in ``refusal`` when the chip has no profile among the dav-c220 chips the kernels target.
"""

from __future__ import annotations

import os
import platform
import socket
from pathlib import Path

from splitkv_common.devices import PROFILES, get_profile


def supported_profiles() -> list[str]:
    """The profiles of the chips the Ascend kernels are built for (dav-c220: cube and vector cores,
    192 KiB UB)."""
    return sorted(n for n, p in PROFILES.items() if p.cube_units > 0 and p.ub_bytes == 192 * 1024)


def refusal(chip: str) -> str | None:
    """None when ``chip`` (a runtime name such as ``Ascend910B2`` or a profile name) is one the
    kernels are built for, else the sentence the node day refuses with."""
    try:
        prof = get_profile(chip)
    except ValueError:
        prof = None
    if prof is None or prof.name not in supported_profiles():
        return (f"chip {chip!r} is not one the kernels are built for (dav-c220, 910B / 910_93 chips); supported "
                f"profiles: {', '.join(supported_profiles())}. Nothing was built or launched.")
    return None


def _common() -> dict:
    import numpy as np

    from splitkv_common.provenance import _cann_version, git_state

    git = git_state()
    try:
        import torch

        torch_v = torch.__version__
    except Exception:  # noqa: BLE001 - absent or broken torch: recorded as absent
        torch_v = None
    return {"host": socket.gethostname(), "platform": platform.platform(), "python": platform.python_version(),
            "numpy": np.__version__, "torch": torch_v, "commit": git.get("commit"), "dirty": git.get("dirty"),
            "cann": _cann_version(), "driver": driver_version()}


def driver_version() -> str | None:
    """The NPU driver's version from its install info (CANN's default driver location), else None."""
    for p in (Path("/usr/local/Ascend/driver/version.info"),):
        if p.is_file():
            for line in p.read_text(errors="replace").splitlines():
                k, _, v = line.partition("=")
                if k.strip().lower() == "version" and v.strip():
                    return v.strip()
    return None


def identify_twin(chip: str) -> dict:
    """The twin run's identity: the emulated chip is the profile ``chip``."""
    info = _common()
    why = refusal(chip)
    prof = None if why else get_profile(chip)
    info.update(chip=f"CPU twin emulating {chip}", profile=prof.name if prof else None,
                aic=prof.cube_units if prof else None, aiv=prof.units if prof else None, hbm_gib=None,
                torch_npu=None, devices=0, supported=why is None, refusal=why)
    return info


def identify_npu() -> dict:  # pragma: no cover - needs an NPU (NOT RUN)
    """NPU 0's identity through torch_npu, and ``npu-smi info``'s text under ``npu_smi``."""
    import subprocess

    import torch
    import torch_npu

    from ..support import npu_cores

    info = _common()
    info["torch_npu"] = getattr(torch_npu, "__version__", "unknown")
    n = torch.npu.device_count()
    info["devices"] = n
    if n == 0:
        info.update(chip=None, supported=False, refusal="torch_npu imports but no NPU device is visible "
                    "(check npu-smi info and ASCEND_RT_VISIBLE_DEVICES)")
        return info
    chip = torch.npu.get_device_name(0)
    props = torch.npu.get_device_properties(0)
    why = refusal(chip)
    aic, aiv = npu_cores(0)
    info.update(chip=chip, profile=None if why else get_profile(chip).name, aic=aic, aiv=aiv,
                hbm_gib=round(getattr(props, "total_memory", 0) / 2 ** 30, 2), supported=why is None, refusal=why)
    try:
        r = subprocess.run(["npu-smi", "info"], capture_output=True, text=True, timeout=60)
        info["npu_smi"] = r.stdout[-4000:]
    except (OSError, subprocess.SubprocessError):
        info["npu_smi"] = None
    info["visible_devices"] = os.environ.get("ASCEND_RT_VISIBLE_DEVICES")
    return info
