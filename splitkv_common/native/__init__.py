"""The planner's C fast path (``plan_fast.c``), built on first use with the system C compiler.

A decode step plans its batch on the host, and in serving that plan sits between the steps' kernels.
For the common case (no window; ``auto`` on a GPU or an Ascend profile, ``size:N`` or ``none``; inputs
within the limits) ``plan_fast.c`` makes the NumPy planner's plans bit for bit in one call, packs a
plan into the device layout in another (:class:`splitkv_common.plan_spec.NativePlanner` and
``cuda_ref.launch.DevicePlan.pack_into`` use them), and writes an Ascend plan's words with the AI
cores' balance in a third (``ascend_ops.tiling.TilingBuilder``); its ``Refresher`` makes a captured
plan's ``plan()`` in one call with its bookkeeping (:meth:`NativePlanner.refresher`, for
``cuda_ref.wrapper.DecodeWrapper(plan_in_graph=True)``), its ``LengthsWriter`` a device-planned
step's lengths write (``cuda_ref.wrapper.StepInputs(in_graph=True).write``). Everything else, and every error, stays with the
NumPy planner, which is also the oracle the C code is tested against (``tests/test_native_plan.py``).

The module is compiled like Triton's own launchers: ``$CC`` (default ``cc``) with Python's headers
and, where found, NumPy's (NumPy arrays are then read through their fields, not NumPy's buffer
export, which with cold caches costs a few µs a plan), into ``$SPLITKV_CACHE_DIR`` (default
``~/.cache/splitkv``), once per source, NumPy and Python version.
``SPLITKV_NATIVE=0`` turns it off; without a compiler or headers the NumPy planner plans
everything (:func:`status` says why). :func:`load_extension` builds and caches other native modules
the same way (``cuda_ref/call_guard.cpp``, C++ against torch's headers).
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

_SOURCE = Path(__file__).with_name("plan_fast.c")
_NAME = "_splitkv_plan"
_FLAGS = ["-O3", "-shared", "-fPIC", "-ffp-contract=off", "-fno-fast-math", "-std=c11",
          "-Werror=incompatible-pointer-types"]

_module = None
_status = "not loaded yet"
_tried = False


def cache_dir() -> Path:
    return Path(os.environ.get("SPLITKV_CACHE_DIR") or Path.home() / ".cache" / "splitkv")


def _numpy_include() -> "str | None":
    """NumPy's C headers (the module then reads arrays through NumPy's C API), or None (through the
    buffer protocol only)."""
    try:
        import numpy
        include = numpy.get_include()
    except Exception:   # noqa: BLE001 - no headers: the buffer protocol serves
        return None
    return include if Path(include, "numpy", "arrayobject.h").exists() else None


def _compile_args() -> list:
    """The compiler's arguments besides the source and output: the flags, Python's headers and,
    where found, NumPy's."""
    args = [*_FLAGS, f"-I{sysconfig.get_paths()['include']}"]
    np_include = _numpy_include()
    if np_include is not None:
        args += ["-DSPLITKV_NUMPY", f"-I{np_include}"]
    return args


def extension_path(source: Path, name: str, args: list, key: bytes = b"") -> Path:
    """Where a module built from ``source`` with compiler arguments ``args`` lives in the cache: one
    file per source, arguments, Python version and ``key`` (the versions of what it is built against)."""
    digest = hashlib.sha256(source.read_bytes() + " ".join(args).encode() + sys.version.encode() + key).hexdigest()[:16]
    return cache_dir() / f"{name}-{digest}{sysconfig.get_config_var('EXT_SUFFIX') or '.so'}"


def build_extension(source: Path, target: Path, args: list, compiler: str) -> None:
    """Compile ``source`` into the extension module ``target`` with ``compiler`` (a command name, found
    on PATH) and ``args`` (flags, include and library paths after the source); atomic, so a
    concurrent build leaves one complete file. ``RuntimeError`` says why it could not."""
    if shutil.which(compiler) is None:
        raise RuntimeError(f"no compiler ({compiler!r} not found)")
    include = sysconfig.get_paths()["include"]
    if not Path(include, "Python.h").exists():
        raise RuntimeError(f"no Python headers (Python.h not in {include})")
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=target.suffix, dir=target.parent)
    os.close(fd)
    try:
        proc = subprocess.run([compiler, str(source), "-o", tmp, *args], capture_output=True, text=True)
        if proc.returncode:
            raise RuntimeError(f"{compiler} failed: {proc.stderr.strip()[-500:]}")
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def load_extension(name: str, source: Path, args: list, compiler: str, key: bytes = b""):
    """The module ``name`` built from ``source`` (:func:`build_extension` on first use, then from the
    cache), loaded."""
    target = extension_path(source, name, args, key)
    if not target.exists():
        build_extension(source, target, args, compiler)
    loader = importlib.machinery.ExtensionFileLoader(name, str(target))
    spec = importlib.util.spec_from_file_location(name, str(target), loader=loader)
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod, target


def load():
    """The compiled module (``plan``, ``pack``), or None (the NumPy planner plans; :func:`status`)."""
    global _module, _status, _tried
    if _tried:
        return _module
    _tried = True
    if os.environ.get("SPLITKV_NATIVE", "1") == "0":
        _status = "off (SPLITKV_NATIVE=0)"
        return None
    try:
        import numpy
        mod, target = load_extension(_NAME, _SOURCE, _compile_args(), os.environ.get("CC") or "cc",
                                     numpy.__version__.encode())
    except Exception as e:   # no compiler, no headers, a read-only cache: plan with NumPy
        _status = f"unavailable: {e}"
        return None
    _module, _status = mod, f"loaded from {target}"
    return _module


def status() -> str:
    """Whether the C planner is in use, and if not, why."""
    load()
    return _status


def reset() -> None:
    """Forget the loaded module's state so that the next :func:`load` looks again (tests)."""
    global _module, _status, _tried
    _module, _status, _tried = None, "not loaded yet", False
