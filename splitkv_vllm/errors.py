"""The kernels' error counts, read without a host sync per layer.

The Ascend route's wrappers count into their workspace's error section
(:meth:`ascend_ops.AscendDecodeWrapper.check_errors`): :func:`attach_ascend` registers each, and
:func:`poll` asks every registered one on the device (a wrapper sharing a workspace with others
reads their counts too, once). The Triton route:

Every Triton ``DecodeWrapper`` the vLLM side makes (the eager route's, one a call; the full-graph
wrappers) writes its error counts into one shared int32 buffer per device (:func:`shared_buffer`,
installed by :func:`attach` before the wrapper's first plan, so a captured graph keeps its address).
The kernels only add to it (atomics, on an error only): nothing is read per layer. :func:`poll` reads
it, one host sync, at a cheap point: the eager route every ``error_check_steps`` routed calls, full
graphs every ``error_check_steps`` refreshed steps (the metadata builder's step, before the replay);
``error_check_steps = 0`` never. What it finds is logged once per kind of error (with the first
request and page seen, :func:`cuda_ref.checks.describe_errors`) and the buffer is cleared; with the
``strict`` setting it raises ``RuntimeError`` instead.
"""

from __future__ import annotations

import logging

from . import settings
from .log import once

_BUFFERS: dict = {}   # device -> int32 [ERROR_SLOTS] on it
_ASCEND: dict = {}    # device -> [AscendDecodeWrapper] whose workspaces count errors
_CALLS: dict = {}     # device -> routed calls (or steps) since the last poll
_NUM_PAGES: dict = {}


def shared_buffer(device):
    """The device's shared error buffer (allocated once, zeroed)."""
    import torch

    from cuda_ref.checks import ERROR_SLOTS

    key = str(device)
    buf = _BUFFERS.get(key)
    if buf is None:
        buf = _BUFFERS[key] = torch.zeros(ERROR_SLOTS, dtype=torch.int32, device=device)
    return buf


def attach(wrapper, num_pages: int | None = None) -> None:
    """Make a Triton ``DecodeWrapper`` count into its device's shared buffer (call before its first
    ``plan()`` / ``set_plan()``: the wrapper allocates its own buffer only where none is set)."""
    wrapper._buffers["errors"] = shared_buffer(wrapper.device)
    if num_pages is not None:
        _NUM_PAGES[str(wrapper.device)] = int(num_pages)


def attach_ascend(wrapper, device) -> None:
    """Have :func:`poll` read an ``AscendDecodeWrapper``'s error section (its ``check_errors()``)."""
    ws = _ASCEND.setdefault(str(device), [])
    if not any(w is wrapper for w in ws):
        ws.append(wrapper)


def tick(device, steps: int = 1) -> None:
    """Count routed calls or steps on ``device``; every ``error_check_steps`` of them, :func:`poll`.
    Cost: a dict update, and one host sync every ``error_check_steps`` calls."""
    key = str(device)
    n = _CALLS.get(key, 0) + steps
    every = settings.current().error_check_steps
    if every and n >= every:
        _CALLS[key] = 0
        poll(device)
    else:
        _CALLS[key] = n


def poll(device=None) -> str | None:
    """Read the shared buffer of ``device`` (every device: None): one host sync. Logs (``strict``:
    raises ``RuntimeError``) what the kernels counted since the last poll and clears it; returns the
    message, or None when there was nothing."""
    from cuda_ref.checks import describe_errors

    keys = [str(device)] if device is not None else sorted(set(_BUFFERS) | set(_ASCEND))
    msgs = []
    for key in keys:
        buf = _BUFFERS.get(key)
        if buf is not None:
            vals = buf.tolist()
            msg = describe_errors(vals, _NUM_PAGES.get(key, 0))
            if msg:
                buf.zero_()
                msgs.append(f"{key}: {msg}")
        for w in _ASCEND.get(key, ()):
            try:
                w.check_errors()
            except RuntimeError as e:   # counted and reset by the wrapper
                msgs.append(f"{key}: {e}")
    if not msgs:
        return None
    text = "; ".join(msgs)
    if settings.current().strict:
        raise RuntimeError(f"splitkv: the kernels met values they could not honour: {text}")
    once(logging.ERROR, "splitkv: the kernels met values they could not honour (rows may be wrong): %s", text)
    return text


def reset() -> None:
    """Forget the buffers and counts (tests)."""
    _BUFFERS.clear()
    _ASCEND.clear()
    _CALLS.clear()
    _NUM_PAGES.clear()
