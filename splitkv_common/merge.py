"""The exact merge of partial attention states (never an average of outputs).

For states ``(o_i, lse_i)`` of the same query row and head over disjoint KV ranges::

    m   = max_i lse_i
    w_i = exp(lse_i - m)          (0 for an empty state, never exp(-inf - -inf))
    lse = m + log(sum_i w_i)
    out = sum_i w_i o_i / sum_i w_i

All states empty: ``out = 0, lse = -inf``. lse is natural-log; ``+inf`` on input means empty (its
``o`` is ignored, whatever it holds). NaN propagates: a NaN lse gives ``out = lse = NaN``, a NaN or
inf ``o`` of a non-empty state gives ``out = NaN`` (the torch merge and the op do the same).
The inputs' contract (axis range, shapes, at least one state, float dtypes) is
:func:`check_merge_inputs`, shared by the three merges.
The merge is commutative and associative up to rounding, not bitwise order-independent.
"""

from __future__ import annotations

import numpy as np

from .states import canonical_lse


MERGE_FLOAT_DTYPES = ("float16", "bfloat16", "float32", "float64")


def check_merge_inputs(o_shape, lse_shape, axis, o_dtype: str, lse_dtype: str) -> int:
    """The one contract of the three merges (this NumPy merge, ``torch_eager.merge_states`` and the
    ``splitkv::merge_states`` op), checked before any arithmetic; returns ``axis`` made non-negative.

    * ``lse`` has a split axis (at least one dimension) and ``axis`` (an int, counted on lse) is in
      ``[-lse.ndim, lse.ndim)``: never wrapped (axis 3 of a 3-D lse is an error, not axis 0);
    * ``o.shape == lse.shape + (D,)`` exactly (an lse of another shape is never broadcast);
    * at least one state on the split axis;
    * float dtypes (``float16``, ``bfloat16``, ``float32``, ``float64``) for both.

    Raises ``ValueError`` (``TypeError`` for a dtype or a non-int axis) naming the argument.
    Cost: a few tuple comparisons (shapes and dtype names only, no data read)."""
    o_shape, lse_shape = tuple(int(s) for s in o_shape), tuple(int(s) for s in lse_shape)
    for name, dt in (("o", o_dtype), ("lse", lse_dtype)):
        if str(dt).replace("torch.", "") not in MERGE_FLOAT_DTYPES:
            raise TypeError(f"{name}: dtype must be one of {MERGE_FLOAT_DTYPES}, got {dt}")
    if len(lse_shape) == 0:
        raise ValueError("lse: needs a split axis (at least one dimension)")
    if not isinstance(axis, (int, np.integer)) or isinstance(axis, (bool, np.bool_)):
        raise TypeError(f"axis: must be an int, got {type(axis).__name__} {axis!r}")
    n = len(lse_shape)
    if not -n <= int(axis) < n:
        raise ValueError(f"axis: {int(axis)} is out of range for lse of {n} dimensions (shape {lse_shape}); "
                         f"expected -{n} <= axis < {n}")
    if len(o_shape) != n + 1 or o_shape[:-1] != lse_shape:
        raise ValueError(f"o: shape {o_shape} must be lse.shape {lse_shape} + (D,)")
    axis = int(axis) % n
    if lse_shape[axis] == 0:
        raise ValueError("o, lse: the split axis is empty; at least one state is needed")
    return axis


def merge_states(o, lse, axis: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Merge any number of states stacked along ``axis``.

    Args:
        o: ``[..., S, ..., D]`` partial outputs (any float dtype), the split axis at ``axis`` of lse.
        lse: ``[..., S, ...]`` natural-log lse (``o.shape[:-1] == lse.shape``).
        axis: the split axis, counted on ``lse``.

    Returns:
        ``(out, lse)``: float32 ``o.shape`` without the split axis, float32 ``lse.shape`` without it.
    """
    o = np.asarray(o)
    lse = np.asarray(lse)
    axis = check_merge_inputs(o.shape, lse.shape, axis, o.dtype.name, lse.dtype.name)
    lse = canonical_lse(lse, allow_nan=True)
    lse64 = np.moveaxis(lse.astype(np.float64), axis, 0)
    o64 = np.moveaxis(o.astype(np.float64), axis, 0)
    empty = np.isinf(lse64)
    m = np.max(np.where(empty, -np.inf, lse64), axis=0)
    all_empty = np.isinf(m)
    m_safe = np.where(all_empty, 0.0, m)
    w = np.where(empty, 0.0, np.exp(np.where(empty, 0.0, lse64 - m_safe)))
    total = w.sum(axis=0)
    total_safe = np.where(all_empty, 1.0, total)
    o_ok = np.where(empty[..., None], 0.0, o64)
    bad_o = (~empty[..., None] & ~np.isfinite(o64)).any(axis=0)
    with np.errstate(invalid="ignore", over="ignore"):
        out = (w[..., None] * np.where(np.isfinite(o_ok), o_ok, 0.0)).sum(axis=0) / total_safe[..., None]
    out = np.where(all_empty[..., None], 0.0, np.where(bad_o, np.nan, out))
    out_lse = np.where(all_empty, -np.inf, m_safe + np.log(total_safe))
    return out.astype(np.float32), out_lse.astype(np.float32)


def merge_pair(o_a, lse_a, o_b, lse_b) -> tuple[np.ndarray, np.ndarray]:
    """Merge two states of equal shape (cascade / context-parallel building block)."""
    return merge_states(np.stack([np.asarray(o_a), np.asarray(o_b)]), np.stack([lse_a, lse_b]))


def merge_rows(partial_o, partial_lse, row_slot_start, row_num_splits) -> tuple[np.ndarray, np.ndarray]:
    """Merge the partials of a plan: row ``t`` merges slots ``row_slot_start[t] + j``, ``j < row_num_splits[t]``.

    Args:
        partial_o: float32 ``[P, H, D]``; partial_lse: float32 ``[P, H]`` (natural log).
        row_slot_start, row_num_splits: int ``[T]`` (see :class:`splitkv_common.plan.Plan`).

    Returns:
        ``(out [T, H, D], lse [T, H])`` float32. A row with no slot is empty (``0, -inf``).
    """
    start = np.asarray(row_slot_start, dtype=np.int64)
    count = np.asarray(row_num_splits, dtype=np.int64)
    partial_o = np.asarray(partial_o)
    partial_lse = np.asarray(partial_lse)
    H, D = partial_o.shape[1], partial_o.shape[2]
    T = start.shape[0]
    smax = int(count.max(initial=0))
    if T == 0:
        return np.zeros((0, H, D), np.float32), np.zeros((0, H), np.float32)
    if smax == 0:
        return np.zeros((T, H, D), np.float32), np.full((T, H), -np.inf, np.float32)
    j = np.arange(smax)
    valid = j[None, :] < count[:, None]                       # [T, S]
    idx = np.where(valid, start[:, None] + j[None, :], 0)     # [T, S]
    o = np.where(valid[..., None, None], partial_o[idx], 0.0)  # [T, S, H, D]
    lse = np.where(valid[..., None], partial_lse[idx], -np.inf)
    return merge_states(o, lse, axis=1)


def naive_average(o, axis: int = 0) -> np.ndarray:
    """The wrong merge the seed warns against: an unweighted mean of split outputs.

    Kept only as the counterexample (seed section 03: 3.976 instead of 4.9).
    """
    return np.asarray(o, dtype=np.float64).mean(axis=axis).astype(np.float32)
