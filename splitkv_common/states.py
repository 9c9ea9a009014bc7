"""Partial attention states and the converters between the formats users meet.

The canonical state of one split (a range of one request's KV positions) for one query row and
head is ``(o, lse)``:

* ``o``: float32 ``[..., D]``, the split's normalized output ``u / l``;
* ``lse``: float32 ``[...]``, **natural-log** log-sum-exp of the scaled (and capped) scores over the
  split's visible positions, ``lse = m + log(l)``.

An empty or fully masked split is ``o = 0, lse = -inf``. On input, ``lse = +inf`` is also read as
empty (the FlashAttention 2 / vLLM sentinel); :func:`canonical_lse` maps it to ``-inf``.

Other formats (see ``docs/state-formats.md``):

* the seed's ``(m, l, u)``: max score, sum of ``exp(s - m)``, un-normalized ``sum exp(s - m) v``;
* base-2 lse (FlashInfer, PyTorch Flex): ``lse2 = lse / ln 2``;
* IFA-style normalized output with separate ``(max, sum)`` (CANN IncreFlashAttention workspace):
  ``o`` normalized, ``max = m``, ``sum = l``; an empty split has ``sum = 0``;
* un-normalized accumulators ``(acc, m, l)`` with ``acc = u`` (same as the seed's, named as kernels do).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

LN2 = math.log(2.0)
LOG2E = 1.0 / LN2


class MLU(NamedTuple):
    """The seed's state: ``m`` ``[...]``, ``l`` ``[...]``, ``u`` ``[..., D]`` (natural base)."""

    m: np.ndarray
    l: np.ndarray
    u: np.ndarray


class IFAState(NamedTuple):
    """CANN IFA-style state: normalized ``o`` ``[..., D]``, row ``max`` and ``sum`` ``[...]``."""

    o: np.ndarray
    max: np.ndarray
    sum: np.ndarray


def canonical_lse(lse, allow_nan: bool = False) -> np.ndarray:
    """Return float32 lse with the ``+inf`` empty sentinel mapped to ``-inf``. NaN is rejected
    unless ``allow_nan`` (the merge propagates a computed NaN: docs/conventions.md)."""
    lse = np.asarray(lse, dtype=np.float32)
    if not allow_nan and np.isnan(lse).any():
        raise ValueError("lse: NaN is not a valid log-sum-exp (empty splits are -inf or +inf)")
    return np.where(np.isposinf(lse), np.float32(-np.inf), lse)


def empty_mask(lse) -> np.ndarray:
    """True where a state is empty (``lse`` is ``-inf`` or the ``+inf`` sentinel)."""
    return np.isinf(np.asarray(lse))


def mlu_to_state(m, l, u) -> tuple[np.ndarray, np.ndarray]:
    """Seed ``(m, l, u)`` -> ``(o, lse)``. ``l == 0`` (empty) gives ``o = 0, lse = -inf``."""
    m = np.asarray(m, dtype=np.float64)
    l = np.asarray(l, dtype=np.float64)
    u = np.asarray(u, dtype=np.float64)
    empty = ~(l > 0)
    safe_l = np.where(empty, 1.0, l)
    o = np.where(empty[..., None], 0.0, u / safe_l[..., None])
    with np.errstate(divide="ignore"):
        lse = np.where(empty, -np.inf, np.where(empty, 0.0, m) + np.log(safe_l))
    return o.astype(np.float32), lse.astype(np.float32)


def state_to_mlu(o, lse, m=None) -> MLU:
    """``(o, lse)`` -> seed ``(m, l, u)``.

    The max ``m`` is not recoverable from ``(o, lse)``; any reference point gives an equivalent
    state. By default ``m = lse`` (so ``l = 1``); pass ``m`` to re-express against a given max.
    Empty states give ``m = -inf, l = 0, u = 0``.
    """
    o = np.asarray(o, dtype=np.float64)
    lse = canonical_lse(lse).astype(np.float64)
    empty = np.isinf(lse)
    m = lse if m is None else np.asarray(m, dtype=np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        l = np.where(empty, 0.0, np.exp(np.where(empty, 0.0, lse - np.where(empty, 0.0, m))))
    u = l[..., None] * np.where(empty[..., None], 0.0, o)
    return MLU(np.where(empty, -np.inf, m), l, u)


def lse_to_base2(lse) -> np.ndarray:
    """Natural-log lse -> base-2 lse (FlashInfer, Flex). Infinities are kept."""
    return (np.asarray(lse, dtype=np.float64) * LOG2E).astype(np.float32)


def lse_from_base2(lse2) -> np.ndarray:
    """Base-2 lse -> natural-log lse. Infinities are kept (``+inf`` still means empty)."""
    return (np.asarray(lse2, dtype=np.float64) * LN2).astype(np.float32)


def ifa_to_state(o, row_max, row_sum) -> tuple[np.ndarray, np.ndarray]:
    """IFA ``(normalized o, max, sum)`` -> ``(o, lse)``; ``sum <= 0`` is an empty split.

    CANN writes ``max = -3.4e38`` (float32 lowest) for an empty row: any ``sum == 0`` is empty
    whatever its max.
    """
    row_max = np.asarray(row_max, dtype=np.float64)
    row_sum = np.asarray(row_sum, dtype=np.float64)
    o = np.asarray(o, dtype=np.float64)
    empty = ~(row_sum > 0)
    with np.errstate(divide="ignore"):
        lse = np.where(empty, -np.inf, np.where(empty, 0.0, row_max) + np.log(np.where(empty, 1.0, row_sum)))
    return np.where(empty[..., None], 0.0, o).astype(np.float32), lse.astype(np.float32)


def state_to_ifa(o, lse) -> IFAState:
    """``(o, lse)`` -> IFA ``(o, max, sum)`` with ``max = lse, sum = 1``; empty: ``max = -3.4e38, sum = 0``."""
    lse = canonical_lse(lse)
    empty = np.isinf(lse)
    lowest = np.float32(np.finfo(np.float32).min)
    o = np.where(empty[..., None], 0.0, np.asarray(o, dtype=np.float32)).astype(np.float32)
    return IFAState(o, np.where(empty, lowest, lse).astype(np.float32), np.where(empty, 0.0, 1.0).astype(np.float32))


def accumulator_to_state(acc, m, l) -> tuple[np.ndarray, np.ndarray]:
    """Un-normalized kernel accumulators ``(acc = sum exp(s - m) v, m, l)`` -> ``(o, lse)``."""
    return mlu_to_state(m, l, acc)


def state_to_accumulator(o, lse) -> MLU:
    """``(o, lse)`` -> un-normalized ``(m, l, acc)`` (as :func:`state_to_mlu`)."""
    return state_to_mlu(o, lse)
