"""Shared-prefix parity: the shared-prefix cases (:data:`~splitkv_common.parity.cases.SHARED_PREFIX_CATALOG`)
on every backend that has a shared-prefix route, judged by the accuracy rule against the plain float64
reference (the two-level decode computes the same attention).

A backend offers its route as ``backend.extra["shared_prefix"]``: ``run(inputs, shared_prefix, *,
mode, policy) -> (out, lse)`` (NumPy float32, lse natural-log), planning for its own device profile.
"""

from __future__ import annotations

import time

from ..reference import dense_attention, plain_attention
from .accuracy import check
from .cases import SHARED_PREFIX_CATALOG, SharedPrefixCase
from .harness import ERROR, FAIL, PASS, UNSUPPORTED, CaseResult, ParityReport, available_backends
from .registry import Backend
from ..provenance import provenance


def run_shared_prefix_case(backend: Backend, case: SharedPrefixCase, reference=None) -> CaseResult:
    """One shared-prefix case on one (available) backend: its route, then the accuracy rule."""
    inputs, sp = case.build()
    inputs.validate()
    if reference is None:
        reference = (*dense_attention(inputs), plain_attention(inputs))
    ref_out, ref_lse, plain = reference
    route = backend.extra.get("shared_prefix")
    if route is None:
        return CaseResult(backend.name, case.name, UNSUPPORTED, message="no shared-prefix route")
    why = backend.unsupported(inputs)
    if why:
        return CaseResult(backend.name, case.name, UNSUPPORTED, message=why)
    t0 = time.perf_counter()
    try:
        out, lse = route(inputs, sp, mode=case.mode, policy=case.policy)
    except Exception as e:  # noqa: BLE001 - reported: one backend must not stop the run
        return CaseResult(backend.name, case.name, ERROR, time.perf_counter() - t0, message=f"{type(e).__name__}: {e}")
    dt = time.perf_counter() - t0
    acc = check(out, lse, ref_out, ref_lse, plain, inputs.dtype)
    return CaseResult(backend.name, case.name, PASS if acc.passed else FAIL, dt, acc, f"shared prefix {case.mode}",
                      "" if acc.passed else acc.reason)


def run_shared_prefix_parity(backends: list, cases=None) -> ParityReport:
    """Every shared-prefix case on every available backend (the reference computed once a case)."""
    cases = SHARED_PREFIX_CATALOG if cases is None else cases
    report = ParityReport(provenance=provenance())
    ready = available_backends(backends, report)
    for case in cases:
        inputs, _ = case.build()
        reference = (*dense_attention(inputs), plain_attention(inputs))
        for b in ready:
            report.results.append(run_shared_prefix_case(b, case, reference))
    return report
