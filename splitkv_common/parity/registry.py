"""The backend registry of the parity harness.

A backend is a :class:`Backend`: a name, an availability check that says in words why it cannot
run here, an optional per-case support check, and one entry point ``run(inputs, plan) -> (out,
lse)``. Backends are found through the ``splitkv.backends`` entry-point group (so a backend can live
in another package) and through :func:`register` (tests, notebooks). The backends that ship with
``splitkv_common`` are also named here (:data:`BUILTIN_BACKENDS`, ``"module:attr"`` like an entry
point), so a source tree that was not installed still finds them; this module imports none of them.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from importlib import metadata
from typing import Callable

import numpy as np

from ..inputs import DecodeInputs
from ..optional import missing_reason
from ..plan_layout import Plan

ENTRY_POINT_GROUP = "splitkv.backends"

BUILTIN_BACKENDS = {
    "numpy": "splitkv_common.parity.backends:numpy_backend",
    "torch": "splitkv_common.parity.backends:torch_backend",
}
"""The backends of ``splitkv_common`` itself, by name (the same ``"module:attr"`` as their entry points)."""


def _always() -> str | None:
    return None


def _any_case(inputs: DecodeInputs) -> str | None:
    return None


@dataclass(frozen=True)
class Backend:
    """One implementation the harness can run.

    Attributes:
        name: the ``--backend`` name.
        run: ``run(inputs, plan) -> (out, lse)``: ``out`` ``[T, Hq, D]`` and ``lse`` ``[T, Hq]`` as
            NumPy float32 (``out`` holding values of ``inputs.dtype``, lse natural-log). ``plan``
            was made by the harness with ``device`` as the profile.
        unavailable: ``() -> None`` when the backend can run here, else the reason in words.
        unsupported: ``(inputs) -> None`` when the backend handles the case, else the reason
            (e.g. a head dim it was not built for). Unsupported cases are reported, never passed.
        device: the device profile its plans are made for (``h200``, ``910b2``, ``cpu``...).
        description: one line for listings.
    """

    name: str
    run: Callable[[DecodeInputs, Plan], tuple[np.ndarray, np.ndarray]]
    unavailable: Callable[[], "str | None"] = _always
    unsupported: Callable[[DecodeInputs], "str | None"] = _any_case
    device: str = "cpu"
    description: str = ""
    extra: dict = field(default_factory=dict, compare=False)


_REGISTERED: dict[str, Backend] = {}



def unavailable_reason(backend: Backend) -> str | None:
    """``backend.unavailable()``, with a missing optional dependency turned into the reason (an
    availability check may import torch, Triton or torch_npu; a NumPy-only install has none)."""
    try:
        return backend.unavailable()
    except ImportError as e:
        return missing_reason(e)


def register(backend: Backend) -> Backend:
    """Add (or replace) a backend by name; returns it."""
    _REGISTERED[backend.name] = backend
    return backend


def discover() -> dict[str, Backend]:
    """Every backend: entry points of ``splitkv.backends`` first, then :func:`register` ones.

    A broken entry point is kept as a backend that is unavailable with the import error as reason.
    """
    found: dict[str, Backend] = {}
    for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
        try:
            obj = ep.load()
            found[obj.name] = obj
        except Exception as e:  # keep it visible, with why
            found[ep.name] = _broken(ep.name, f"entry point {ep.value} failed to load: {type(e).__name__}: {e}")
    found.update(_REGISTERED)
    for name, spec in BUILTIN_BACKENDS.items():  # running from a source tree that was not installed
        if name not in found:
            try:
                found[name] = load_backend(spec)
            except Exception as e:  # noqa: BLE001
                found[name] = _broken(name, f"built-in backend {spec} failed to load: {type(e).__name__}: {e}")
    return found


def load_backend(spec: str) -> Backend:
    """The backend an entry-point style ``"module:attr"`` string names (the module is imported)."""
    module, _, attr = spec.partition(":")
    obj = importlib.import_module(module)
    for part in attr.split(".") if attr else ():
        obj = getattr(obj, part)
    return obj


def _broken(name: str, msg: str) -> Backend:
    """A backend that could not be loaded: unavailable with ``msg`` as the reason."""

    def _run(inputs, plan, _m=msg):
        raise RuntimeError(_m)
    return Backend(name, _run, unavailable=lambda _m=msg: _m)


def get_backend(name: str) -> Backend:
    """A backend by name; unknown names raise ``ValueError`` listing the known ones."""
    known = discover()
    if name not in known:
        raise ValueError(f"backend: unknown {name!r}; known: {', '.join(sorted(known))}")
    return known[name]
