"""The parity harness: run the case catalog on backends and judge them against the float64 reference.

For every case the inputs are built once, validated once (the shared rules), and the float64
reference and the plain-dtype computation are made once; each available backend then gets the
plan made for its own device profile and returns ``(out, lse)``, judged by
:func:`splitkv_common.parity.accuracy.check`. Unavailable backends are reported with their reason;
unsupported cases are reported per backend, never counted as passes.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

import numpy as np

from .accuracy import Accuracy, check
from .cases import Case
from ..provenance import provenance, provenance_markdown
from ..reference import dense_attention, plain_attention
from .registry import Backend, unavailable_reason

PASS, FAIL, ERROR, UNSUPPORTED = "pass", "fail", "error", "unsupported"


@dataclass
class CaseResult:
    backend: str
    case: str
    status: str
    seconds: float = 0.0
    accuracy: Accuracy | None = None
    plan: str = ""
    message: str = ""

    def as_dict(self) -> dict:
        d = {"backend": self.backend, "case": self.case, "status": self.status, "seconds": round(self.seconds, 4),
             "plan": self.plan, "message": self.message}
        if self.accuracy is not None:
            d["accuracy"] = self.accuracy.as_dict()
        return d


@dataclass
class ParityReport:
    results: list[CaseResult] = field(default_factory=list)
    unavailable: dict[str, str] = field(default_factory=dict)
    provenance: dict = field(default_factory=dict)  # splitkv_common.provenance: date, commit, versions, device

    @property
    def ok(self) -> bool:
        """True when no case failed or errored on any backend that ran (unsupported is not a failure
        of correctness, but is listed)."""
        return all(r.status in (PASS, UNSUPPORTED) for r in self.results) and bool(self.results)

    def counts(self) -> dict[str, dict[str, int]]:
        out: dict[str, dict[str, int]] = {}
        for r in self.results:
            out.setdefault(r.backend, {PASS: 0, FAIL: 0, ERROR: 0, UNSUPPORTED: 0})[r.status] += 1
        return out

    def to_markdown(self) -> str:
        lines = ["# splitkv parity report", ""]
        if self.provenance:
            lines += provenance_markdown(self.provenance)
        lines += ["| backend | pass | fail | error | unsupported |", "|---|---|---|---|---|"]
        for b, c in self.counts().items():
            lines.append(f"| {b} | {c[PASS]} | {c[FAIL]} | {c[ERROR]} | {c[UNSUPPORTED]} |")
        for b, why in self.unavailable.items():
            lines.append(f"| {b} | unavailable: {why} | | | |")
        lines += ["", "| case | backend | status | out max err | out tol | lse max err | plain err | s | plan / message |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for r in self.results:
            a = r.accuracy
            nums = (f"{a.out_max:.2e} | {a.out_tol:.2e} | {a.lse_max:.2e} | {a.plain_max:.2e}" if a else " | | | ")
            msg = r.message if r.status != PASS else r.plan
            lines.append(f"| {r.case} | {r.backend} | {r.status} | {nums} | {r.seconds:.3f} | {msg} |")
        return "\n".join(lines) + "\n"

    def to_json(self) -> str:
        return json.dumps({"provenance": self.provenance, "ok": self.ok, "counts": self.counts(), "unavailable": self.unavailable,
                           "results": [r.as_dict() for r in self.results]}, indent=1, default=float)

    def write(self, path: str) -> None:
        text = self.to_json() if str(path).endswith(".json") else self.to_markdown()
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)


class _NoBar:
    def set_postfix_str(self, *_):
        pass

    def update(self, *_):
        pass

    def close(self):
        pass


def _progress(total: int, enabled: bool):
    """A tqdm progress bar when tqdm is installed (``splitkv[progress]``), else nothing: NumPy stays
    the only hard dependency."""
    if enabled:
        try:
            from tqdm.auto import tqdm
        except ImportError:
            return _NoBar()
        return tqdm(total=total, unit="run", desc="parity")
    return _NoBar()


def run_case(backend: Backend, case: Case, reference=None) -> CaseResult:
    """Run one case on one (available) backend and judge it."""
    inputs = case.build()
    inputs.validate()
    if reference is None:
        ref_out, ref_lse = dense_attention(inputs)
        reference = (ref_out, ref_lse, plain_attention(inputs))
    ref_out, ref_lse, plain = reference
    why = backend.unsupported(inputs)
    if why:
        return CaseResult(backend.name, case.name, UNSUPPORTED, message=why)
    plan = inputs.plan(case.policy, device=backend.device, **case.plan_kwargs)
    plan_txt = f"{plan.policy}: splits {plan.num_splits.tolist()[:8]}{'...' if plan.batch_size > 8 else ''}"
    t0 = time.perf_counter()
    try:
        out, lse = backend.run(inputs, plan)
    except Exception as e:  # noqa: BLE001 - reported, not raised: one backend must not stop the run
        return CaseResult(backend.name, case.name, ERROR, time.perf_counter() - t0, plan=plan_txt,
                          message=f"{type(e).__name__}: {e}")
    dt = time.perf_counter() - t0
    acc = check(np.asarray(out), np.asarray(lse), ref_out, ref_lse, plain, inputs.dtype)
    return CaseResult(backend.name, case.name, PASS if acc.passed else FAIL, dt, acc, plan_txt,
                      "" if acc.passed else acc.reason)


def run_parity(backends: list[Backend], cases: list[Case], progress: bool = True) -> ParityReport:
    """Run every case on every available backend (see module docstring)."""
    report = ParityReport(provenance=provenance())
    ready = []
    for b in backends:
        why = unavailable_reason(b)
        if why:
            report.unavailable[b.name] = why
        else:
            ready.append(b)
    bar = _progress(len(cases) * len(ready), enabled=progress and bool(ready))
    for case in cases:
        inputs = case.build()
        inputs.validate()
        ref_out, ref_lse = dense_attention(inputs)
        reference = (ref_out, ref_lse, plain_attention(inputs))
        for b in ready:
            bar.set_postfix_str(f"{b.name} {case.name}"[:48])
            report.results.append(run_case(b, case, reference))
            bar.update()
    bar.close()
    return report
