"""The NumPy reference decode attention.

* :func:`dense_attention`: float64, all visible positions of a row at once: the ground truth.
* :func:`split_attention`: executes a :class:`~splitkv_common.plan.Plan` the way the kernels do
  (float32 partial states per work item, the seed's ``(m, l, u)`` then ``(o, lse)``, then the exact
  merge): the ``numpy`` parity backend.
* :func:`plain_attention`: the dense computation with every step rounded to the case's dtype, whose
  error sets the accuracy bound (see :mod:`splitkv_common.parity.accuracy`).

All lse are natural-log, float32 outputs except the float64 ground truth.
"""

from __future__ import annotations

import numpy as np

from .dtypes import round_to
from .inputs import DecodeInputs
from .merge import merge_rows
from .plan_layout import Plan
from .states import mlu_to_state


def gather_kv(cache: np.ndarray, block_table: np.ndarray, b: int, start: int, end: int) -> np.ndarray:
    """Rows ``[start, end)`` of request ``b``'s logical KV: ``[end - start, Hkv, D]``, via the block table."""
    page = cache.shape[1]
    pos = np.arange(start, end)
    return cache[block_table[b, pos // page], pos % page]


def visible(seq_len: int, q_len: int, positions: np.ndarray, window_left: int | None) -> np.ndarray:
    """``[q_len, n]`` bool: query ``i`` sees ``p <= seq_len - q_len + i`` and ``p >= that - window_left``."""
    qpos = seq_len - q_len + np.arange(q_len)[:, None]
    ok = positions[None, :] <= qpos
    if window_left is not None:
        ok &= positions[None, :] >= qpos - window_left
    return ok


def _scores(q, k, scale, soft_cap, group, dtype=np.float64):
    """``q [nq, Hq, D]``, ``k [n, Hkv, D]`` -> scaled (capped) scores ``[nq, Hq, n]``."""
    k = np.repeat(k.astype(dtype), group, axis=1)
    s = np.einsum("qhd,nhd->qhn", q.astype(dtype), k) * dtype(scale)
    if soft_cap is not None:
        s = dtype(soft_cap) * np.tanh(s / dtype(soft_cap))
    return s


def _finite(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(x with non-finite values replaced by 0, [...] True where the last axis holds one)``: a
    value at a position a row cannot see must never enter the arithmetic (0 * NaN is NaN)."""
    fin = np.isfinite(x)
    return np.where(fin, x, 0).astype(x.dtype, copy=False), ~fin.all(-1)


def _poisoned(bad_q: np.ndarray, bad_kv: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """``[nq, H]``: rows whose q (``bad_q [nq, H]``) or a visible position (``bad_kv [n, H]`` or
    ``[n, 1]``, ``mask [nq, 1, n]``) holds NaN or inf, among the rows that see something."""
    sees_bad = (mask & bad_kv.T[None, :, :]).any(-1)
    return (bad_q | sees_bad) & mask.any(-1)


def _request_scores(inp: DecodeInputs, K: np.ndarray, V: np.ndarray, dtype):
    """For each request with rows and history: ``(r0, r1, s, mask, v, bad)``, its rows ``[r0, r1)``,
    scores ``s [nq, Hq, n]`` in ``dtype``, visibility ``mask [nq, 1, n]``, values ``v [n, Hq, D]``
    (non-finite values zeroed) and ``bad [nq, Hq]``: rows that see a NaN / inf (or have one in q)."""
    group = inp.q.shape[1] // inp.k_cache.shape[2]
    qsl = inp.query_start_loc
    for b, sl in enumerate(np.asarray(inp.seq_lens, np.int64)):
        r0, r1, n = int(qsl[b]), int(qsl[b + 1]), int(sl)
        if r1 == r0 or n == 0:
            continue
        k, bad_k = _finite(gather_kv(K, inp.block_table, b, 0, n))
        v, bad_v = _finite(gather_kv(V, inp.block_table, b, 0, n))
        v = np.repeat(v, group, axis=1)
        q, bad_q = _finite(np.asarray(inp.q[r0:r1]))
        s = _scores(q, k, inp.scale, inp.soft_cap, group, dtype)
        mask = visible(n, r1 - r0, np.arange(n), inp.window_left)[:, None, :]
        bad = _poisoned(bad_q, np.repeat(bad_k | bad_v, group, axis=1), mask)
        yield r0, r1, s, mask, v, bad


def dense_attention(inp: DecodeInputs) -> tuple[np.ndarray, np.ndarray]:
    """float64 ground truth: ``out [T, Hq, D]`` float64, ``lse [T, Hq]`` float64 (natural log).

    The inputs are checked first (the shared rules: a page id a row would read outside
    ``[0, num_pages)`` is refused, never read as NumPy's "last page")."""
    inp.validate()
    T, Hq, D = inp.q.shape
    out = np.zeros((T, Hq, D))
    lse = np.full((T, Hq), -np.inf)
    for r0, r1, s, mask, v, bad in _request_scores(inp, *inp.dequantized_kv(), np.float64):
        any_vis = mask.any(-1)
        m = np.where(any_vis, np.max(np.where(mask, s, -np.inf), axis=-1), 0.0)
        p = np.where(mask, np.exp(np.where(mask, s, m[..., None]) - m[..., None]), 0.0)
        l = np.where(any_vis, p.sum(-1), 1.0)
        out[r0:r1] = np.where(bad[..., None], np.nan,
                              np.where(any_vis[..., None], np.einsum("qhn,nhd->qhd", p, v) / l[..., None], 0.0))
        lse[r0:r1] = np.where(bad, np.nan, np.where(any_vis, m + np.log(l), -np.inf))
    return out, lse


def partial_state(s: np.ndarray, v: np.ndarray, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One split's state, float32, the seed's way: ``m``, ``l``, ``u``, then ``(o, lse)``.

    Args:
        s: scores ``[..., n]``; v: values ``[..., n, D]`` (broadcastable); mask: ``[..., n]`` visible.
    A fully masked row gives ``o = 0, lse = -inf`` without computing ``exp(-inf - -inf)``.
    """
    s = s.astype(np.float32)
    any_vis = mask.any(-1)
    m = np.where(any_vis, np.max(np.where(mask, s, np.float32(-np.inf)), axis=-1, initial=np.float32(-np.inf)),
                 np.float32(0))
    # masked lanes compute exp(m - m) = 1 (then dropped), never exp(-m) that overflows for very negative m
    p = np.where(mask, np.exp(np.where(mask, s, m[..., None]) - m[..., None]), np.float32(0)).astype(np.float32)
    l = p.sum(-1, dtype=np.float32)
    u = np.einsum("...n,...nd->...d", p, v.astype(np.float32)).astype(np.float32)
    return mlu_to_state(np.where(any_vis, m, -np.inf), np.where(any_vis, l, 0), u)


def split_partials(inp: DecodeInputs, plan: Plan) -> tuple[np.ndarray, np.ndarray]:
    """Stage 1: every valid work item's partial states, float32 ``o [num_slots, Hq, D]``, ``lse [num_slots, Hq]``.

    Slots no work item writes stay empty (``0, -inf``).
    """
    T, Hq, D = inp.q.shape
    Hkv = inp.k_cache.shape[2]
    group = Hq // Hkv
    K, V = (x.astype(np.float32) for x in inp.dequantized_kv())
    po = np.zeros((plan.num_slots, Hq, D), np.float32)
    pl = np.full((plan.num_slots, Hq), -np.inf, np.float32)
    qsl = plan.query_start_loc
    for w in range(plan.num_valid_items):
        b, h, j = int(plan.item_request[w]), int(plan.item_kv_head[w]), int(plan.item_split[w])
        a, e = int(plan.item_kv_start[w]), int(plan.item_kv_end[w])
        r0, r1 = int(qsl[b]), int(qsl[b + 1])
        heads = slice(h * group, (h + 1) * group)
        slots = plan.row_slot_start[r0:r1] + j
        if e <= a or r1 == r0:
            continue  # empty split: the slot keeps (0, -inf)
        k, bad_k = _finite(gather_kv(K, inp.block_table, b, a, e)[:, h:h + 1])   # [n, 1, D]
        v, bad_v = _finite(gather_kv(V, inp.block_table, b, a, e)[:, h])         # [n, D]
        q, bad_q = _finite(np.asarray(inp.q[r0:r1, heads], np.float32))          # [nq, G, D]
        s = _scores(q, k, inp.scale, inp.soft_cap, group, np.float32)            # [nq, G, n]
        mask = visible(int(inp.seq_lens[b]), r1 - r0, np.arange(a, e), inp.window_left)[:, None, :]
        o, lse = partial_state(s, v[None, None], np.broadcast_to(mask, s.shape))
        bad = _poisoned(bad_q, (bad_k | bad_v[:, None]), mask)                  # [nq, G]
        po[slots, heads] = np.where(bad[..., None], np.float32(np.nan), o)
        pl[slots, heads] = np.where(bad, np.float32(np.nan), lse)
    return po, pl


def split_attention(inp: DecodeInputs, plan: Plan | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Split-then-merge by a plan (default: ``auto`` for ``cpu``): ``out [T, Hq, D]`` float32 holding
    values of ``inp.dtype``, ``lse [T, Hq]`` float32 (natural log)."""
    inp.validate()
    if plan is None:
        plan = inp.plan("auto", device="cpu")
    else:
        plan.validate(inp.seq_lens, inp.query_start_loc, window_left=inp.window_left,
                      num_kv_heads=inp.k_cache.shape[2])
    po, pl = split_partials(inp, plan)
    out, lse = merge_rows(po, pl, plan.row_slot_start, plan.row_num_splits)
    return round_to(out, inp.dtype), lse


def plain_attention(inp: DecodeInputs) -> np.ndarray:
    """The dense computation with each step rounded to ``inp.dtype``: float32 ``out [T, Hq, D]``.

    Scores are accumulated in float32 then rounded; probabilities are rounded before the product
    with V; the output is rounded. Its error against :func:`dense_attention` is what a plain
    implementation in that dtype gets, the yardstick of the accuracy rule.
    """
    dt = inp.dtype
    out = np.zeros(inp.q.shape, np.float32)
    K, V = (round_to(x.astype(np.float32), dt) for x in inp.dequantized_kv())
    inp.validate()
    for r0, r1, s, mask, v, bad in _request_scores(inp, K, V, np.float32):
        s = round_to(s, dt)
        any_vis = mask.any(-1)
        m = np.where(any_vis, np.max(np.where(mask, s, -np.inf), axis=-1), 0.0).astype(np.float32)
        p = round_to(np.where(mask, np.exp(np.where(mask, s, m[..., None]) - m[..., None]), 0.0), dt)
        l = p.sum(-1, dtype=np.float32)
        o = np.einsum("qhn,nhd->qhd", p, v).astype(np.float32) / np.where(any_vis, l, 1.0)[..., None]
        out[r0:r1] = np.where(bad[..., None], np.nan, np.where(any_vis[..., None], round_to(o, dt), 0.0))
    return out
