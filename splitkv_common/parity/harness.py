"""The parity harness: run the case catalog on backends and judge them against the float64 reference.

For every case the inputs are built once, validated once (the shared rules), and the float64
reference and the plain-dtype computation are made once; each available backend then gets the
plan made for its own device profile and returns ``(out, lse)``, judged by
:func:`splitkv_common.parity.accuracy.check`. Unavailable backends are reported with their reason;
unsupported cases are reported per backend, never counted as passes.
"""

from __future__ import annotations

import json
import os
import tempfile
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

    def write(self, path: str, force: bool = False) -> None:
        """Write the report (JSON for ``.json``, Markdown for ``.md``) atomically: a temporary file in
        the same directory, then ``os.replace``, so a reader never sees half a report and a failed
        write loses nothing. An existing file is kept (``FileExistsError``) unless ``force``."""
        path = check_report_path(path, force)
        text = self.to_json() if str(path).endswith(".json") else self.to_markdown()
        d = os.path.dirname(path)
        fd, tmp = tempfile.mkstemp(prefix=".splitkv-report-", suffix=".tmp", dir=d)
        try:
            os.fchmod(fd, _umask_mode())   # the mode a plain open() would give, not mkstemp's 0600
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
            if force:
                os.replace(tmp, path)
            else:
                os.link(tmp, path)  # fails if the file appeared meanwhile: never overwrite without force
                os.unlink(tmp)
        except FileExistsError:
            os.unlink(tmp)
            raise FileExistsError(f"report: {path} exists; pass --force (force=True) to replace it") from None
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise


REPORT_SUFFIXES = (".md", ".json")


def _umask_mode() -> int:
    """``0o666`` less the process's umask: the mode ``open(path, "w")`` gives a new file."""
    mask = os.umask(0o022)
    os.umask(mask)
    return 0o666 & ~mask


def check_report_path(path, force: bool = False) -> str:
    """Refuse a report path before any work, and return where it will be written: the suffix is
    ``.md`` or ``.json``; the directory, with every link resolved (``os.path.realpath``: ``link/..``
    is where the link points, not the lexical parent), exists and takes a new file (a probe file is
    created and removed there: permissions, a read-only file system, the name's length); the file
    does not exist unless ``force`` (then it must be a regular file, or a link to one, which is
    replaced by the report)."""
    p = str(path)
    if not p.endswith(REPORT_SUFFIXES):
        raise ValueError(f"report: {p} must end in .md or .json")
    name = os.path.basename(p)
    if not name or "\0" in p:
        raise ValueError(f"report: {p!r} is not a file name")
    d = os.path.realpath(os.path.dirname(p) or ".")
    if not os.path.isdir(d):
        raise FileNotFoundError(f"report: directory {d} does not exist (create it first)")
    if not os.access(d, os.W_OK | os.X_OK):
        raise PermissionError(f"report: directory {d} is not writable")
    target = os.path.join(d, name)
    if os.path.lexists(target):
        if not force:
            raise FileExistsError(f"report: {p} exists; pass --force (force=True) to replace it")
        if not os.path.isfile(target):
            raise IsADirectoryError(f"report: {p} exists and is not a regular file")
    try:
        max_name = os.pathconf(d, "PC_NAME_MAX")
    except (OSError, ValueError):
        max_name = 255
    if len(os.fsencode(name)) > max_name:
        raise ValueError(f"report: file name {name[:40]}... is longer than {max_name} bytes")
    try:   # what write() does first: a temporary file in that directory
        fd, probe = tempfile.mkstemp(prefix=".splitkv-report-", suffix=".probe", dir=d)
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise PermissionError(f"report: cannot create a file in {d}: {e.strerror or e}") from None
    return target


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


def run_case(backend: Backend, case: Case, reference=None, plan=None) -> CaseResult:
    """Run one case on one (available) backend and judge it. ``plan`` (default: the case's policy
    for the backend's device profile) is checked with :meth:`Plan.validate` before the run."""
    inputs = case.build()
    inputs.validate()
    if reference is None:
        ref_out, ref_lse = dense_attention(inputs)
        reference = (ref_out, ref_lse, plain_attention(inputs))
    ref_out, ref_lse, plain = reference
    why = backend.unsupported(inputs)
    if why:
        return CaseResult(backend.name, case.name, UNSUPPORTED, message=why)
    if plan is None:
        plan = inputs.plan(case.policy, device=backend.device, **case.plan_kwargs)
    plan.validate(inputs.seq_lens, inputs.query_start_loc, window_left=inputs.window_left,
                  num_kv_heads=inputs.k_cache.shape[2])
    plan_txt = f"{plan.policy}: splits {plan.num_splits.tolist()[:8]}{'...' if plan.batch_size > 8 else ''}"
    t0 = time.perf_counter()
    try:
        out, lse = backend.run(inputs, plan)
    except Exception as e:  # noqa: BLE001 - reported, not raised: one backend must not stop the run
        return CaseResult(backend.name, case.name, ERROR, time.perf_counter() - t0, plan=plan_txt,
                          message=f"{type(e).__name__}: {e}")
    dt = time.perf_counter() - t0
    acc = check(np.asarray(out), None if lse is None else np.asarray(lse), ref_out, ref_lse, plain, inputs.dtype)
    return CaseResult(backend.name, case.name, PASS if acc.passed else FAIL, dt, acc, plan_txt,
                      "" if acc.passed else acc.reason)


def available_backends(backends: list[Backend], report: ParityReport) -> list[Backend]:
    """The backends that can run here; each other one is recorded in ``report.unavailable`` with why."""
    ready = []
    for b in backends:
        why = unavailable_reason(b)
        if why:
            report.unavailable[b.name] = why
        else:
            ready.append(b)
    return ready


def run_parity(backends: list[Backend], cases: list[Case], progress: bool = True) -> ParityReport:
    """Run every case on every available backend (see module docstring)."""
    report = ParityReport(provenance=provenance())
    ready = available_backends(backends, report)
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
