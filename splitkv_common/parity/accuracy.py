"""The accuracy rule every backend is held to (``docs/conventions.md``, "Accuracy").

The reference is float64 on the CPU (:func:`~splitkv_common.reference.dense_attention`). A
backend's ``out`` passes when its error is, at once,

* within a fixed bound for its dtype (``OUT_BOUND``), and
* within ``PLAIN_MULTIPLE`` times the error of the same computation done plainly in that dtype
  (:func:`~splitkv_common.reference.plain_attention`) plus a small floor (``OUT_FLOOR``): the
  FlashAttention test idiom.

Errors are absolute, in units of ``max(1, max |ref out|)``. ``lse`` must match in its empty
pattern (``-inf`` exactly where the reference is ``-inf``) and elsewhere within
``LSE_ATOL + LSE_RTOL * |ref|``. NaN never passes. A backend whose op returns no lse (ATB's
paged attention) is judged on ``out`` alone (``lse=None``), which the report says.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

OUT_BOUND = {"float32": 1e-4, "float16": 5e-3, "bfloat16": 4e-2}
OUT_FLOOR = {"float32": 1e-5, "float16": 1e-3, "bfloat16": 8e-3}
PLAIN_MULTIPLE = 2.0
LSE_ATOL = {"float32": 1e-4, "float16": 2e-3, "bfloat16": 1.6e-2}
LSE_RTOL = {"float32": 1e-5, "float16": 1e-3, "bfloat16": 8e-3}


@dataclass(frozen=True)
class Accuracy:
    """Errors of one backend on one case, and the verdict."""

    passed: bool
    out_max: float
    out_mean: float
    lse_max: float
    lse_mean: float
    plain_max: float
    out_tol: float
    reason: str

    def as_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def check(out, lse, ref_out, ref_lse, plain_out, dtype: str) -> Accuracy:
    """Judge ``(out, lse)`` against the float64 reference and the plain-dtype computation.

    Shapes: ``out``, ``ref_out``, ``plain_out`` ``[T, Hq, D]``; ``lse``, ``ref_lse`` ``[T, Hq]``.
    ``lse=None``: the backend produces no lse; only ``out`` is judged (empty rows: ``out = 0``).
    """
    out = np.asarray(out, np.float64)
    no_lse = lse is None
    lse = np.asarray(ref_lse if no_lse else lse, np.float64)
    ref_out = np.asarray(ref_out, np.float64)
    ref_lse = np.asarray(ref_lse, np.float64)
    if out.shape != ref_out.shape:
        return Accuracy(False, np.inf, np.inf, np.inf, np.inf, 0.0, 0.0, f"out shape {out.shape} != {ref_out.shape}")
    if lse.shape != ref_lse.shape:
        return Accuracy(False, np.inf, np.inf, np.inf, np.inf, 0.0, 0.0, f"lse shape {lse.shape} != {ref_lse.shape}")
    unit = max(1.0, float(np.abs(ref_out).max(initial=0.0)))
    err = np.abs(out - ref_out) / unit
    plain = float((np.abs(np.asarray(plain_out, np.float64) - ref_out) / unit).max(initial=0.0))
    tol = min(OUT_BOUND[dtype], PLAIN_MULTIPLE * plain + OUT_FLOOR[dtype])
    ref_empty = np.isneginf(ref_lse)
    finite = ~ref_empty
    lse_err = np.abs(np.where(finite, lse, 0.0) - np.where(finite, ref_lse, 0.0))
    lse_tol = LSE_ATOL[dtype] + LSE_RTOL[dtype] * np.abs(np.where(finite, ref_lse, 0.0))
    out_max = float(err.max(initial=0.0)) if not np.isnan(out).any() else float("nan")
    out_mean = float(err.mean()) if err.size else 0.0
    lse_max = float(lse_err.max(initial=0.0)) if not np.isnan(lse).any() else float("nan")
    lse_mean = float(lse_err.mean()) if lse_err.size else 0.0
    reasons = []
    if np.isnan(out).any():
        reasons.append(f"out has {int(np.isnan(out).sum())} NaN")
    if np.isnan(lse).any():
        reasons.append(f"lse has {int(np.isnan(lse).sum())} NaN")
    if not reasons:
        if out_max > tol:
            reasons.append(f"out error {out_max:.3g} > tolerance {tol:.3g} (plain {dtype} error {plain:.3g})")
        if (np.isneginf(lse) != ref_empty).any() or np.isposinf(lse).any():
            reasons.append("lse empty pattern (-inf rows) differs from the reference")
        elif (lse_err > lse_tol).any():
            reasons.append(f"lse error {lse_max:.3g} over tolerance")
        if (out[np.broadcast_to(ref_empty[..., None], out.shape)] != 0).any():
            reasons.append("an empty row's out is not 0")
    if no_lse:
        lse_max = lse_mean = float("nan")
        return Accuracy(not reasons, out_max, out_mean, lse_max, lse_mean, plain, tol,
                        "; ".join(reasons) or "ok (out only: the backend returns no lse)")
    return Accuracy(not reasons, out_max, out_mean, lse_max, lse_mean, plain, tol, "; ".join(reasons) or "ok")
