"""Shared-prefix ("cascade") decode for the plugin's eager steps.

vLLM's scheduler finds the tokens every running request shares (``common_prefix_len``, a multiple of
the block size, at most every request's computed tokens; its FlashAttention backend then runs
cascade attention). The plugin reads it from the step's metadata (an attribute ``common_prefix_len``
where the metadata has one, else the value vLLM passed to the metadata builder's ``build``, which
:class:`splitkv_vllm.backend.SplitKVAscendMetadataBuilder` records on the metadata) and, when the
``shared_prefix`` setting (``SPLITKV_VLLM_SHARED_PREFIX``: ``auto``, ``on``, ``off``; default ``off``
until measured on a node) allows it, runs the decode batch through the Ascend operator's shared-prefix
route (``AscendDecodeWrapper.plan(..., shared_prefix=...)``, :mod:`ascend_ops.shared_prefix_op`): the
planner decides (``auto``: the cost model for the device profile; ``on``: shared whenever a prefix
is left), and its reason is logged once.

The prefix the route gets (:func:`shared_prefix_of`): requests ``[0, n)``, ``n`` the real requests
(``num_decodes``; the runner's padding request shares nothing), ``common_prefix_len`` rounded down
to the KV block (page) size and to what precedes every real request's query rows, so a step is never
refused for it. Its pages are each request's first block-table entries, read on the device by the
route: no host read of the block table, no host sync added per step.

Only the eager Ascend path takes it: full graphs, sliding-window layers (the Ascend route has no
window) and the ``torch`` / ``triton`` implementations keep the plain decode (said once in the log).
"""

from __future__ import annotations

import logging

import numpy as np

from splitkv_common.shared_prefix import SharedPrefix

from . import settings
from .log import once

ATTR = "_splitkv_common_prefix_len"


def common_prefix_len(meta) -> int:
    """The step's ``common_prefix_len`` (0 when the metadata says none)."""
    v = getattr(meta, "common_prefix_len", None)
    if v is None:
        v = getattr(meta, ATTR, 0)
    try:
        return max(0, int(v or 0))
    except (TypeError, ValueError):
        return 0


def record(meta, value) -> None:
    """Keep ``build``'s ``common_prefix_len`` on the metadata it made (where it has no attribute of its own)."""
    try:
        v = int(value or 0)
    except (TypeError, ValueError):
        return
    if v > 0 and getattr(meta, "common_prefix_len", None) is None:
        try:
            setattr(meta, ATTR, v)
        except AttributeError:   # a metadata type that takes no new attributes: nothing shared
            pass


def shared_prefix_of(meta, query_start_loc: np.ndarray, seq_lens: np.ndarray, page_size: int) -> "SharedPrefix | None":
    """The :class:`SharedPrefix` of a step (see the module doc), None when nothing is left to share."""
    cpl = common_prefix_len(meta)
    B = int(seq_lens.shape[0])
    if cpl <= 0 or B == 0:
        return None
    n = int(getattr(meta, "num_decodes", 0) or 0)
    n = B if n <= 0 else min(n, B)
    hist = seq_lens[:n].astype(np.int64) - np.diff(query_start_loc.astype(np.int64))[:n]
    L = min(cpl, int(hist.min())) // page_size * page_size
    return SharedPrefix.single(L, 0, n) if L > 0 else None


def shared_mode(layer, impl: str) -> "str | None":
    """The planner's mode for this layer's eager step (None: the plain decode)."""
    mode = settings.current().shared_prefix
    if mode == "off":
        return None
    if impl != "ascend":
        once(logging.INFO, "splitkv: shared_prefix=%s: the shared-prefix route runs on the Ascend operator only; "
             "impl %s keeps the plain decode", mode, impl)
        return None
    if layer.window_left is not None:
        once(logging.INFO, "splitkv: shared_prefix=%s: sliding-window layers keep the plain decode", mode)
        return None
    return mode


def plan_step(w, layer, batch, meta, key_cache, mode: str) -> bool:
    """Plan the step on the layer's eager wrapper ``w`` with its shared prefix, once per step (the
    layers of these constants share ``w``). Returns False when the step shares nothing (then the
    caller plans the plain decode)."""
    if getattr(w, "_splitkv_shared_step", None) is batch:
        return True
    page = int(key_cache.shape[1])
    qsl = batch.query_start_loc.numpy()
    sp = shared_prefix_of(meta, qsl, batch.host_seq_lens, page)
    if sp is None:
        return False
    splan = w.plan(batch.host_seq_lens, query_start_loc=qsl, window_left=layer.window_left, scale=layer.scale,
                   soft_cap=layer.soft_cap, max_pages=int(batch.block_table.shape[1]), num_pages=int(key_cache.shape[0]),
                   shared_prefix=sp, shared_prefix_mode=mode)
    w._splitkv_shared_step = batch
    once(logging.INFO, "splitkv: shared_prefix=%s: first decision: %s", mode, splan.reason)
    return True
