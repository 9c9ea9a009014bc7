"""The node-day report: one directory with ``report.json``, ``report.md``, the raw logs and a tarball.

The report is rewritten after every stage (and after every smoke case), so that whatever stops the
run (a hang the watchdog could not end, a killed terminal) leaves what was found so far on disk.

``report.json`` (schema ``splitkv-node-day/1``, checked by :func:`validate_report`)::

    {"schema", "mode": "npu" | "twin", "measured": bool, "honesty": str, "verdict", "exit_code",
     "started", "finished", "seconds", "command", "out_dir",
     "identity": {...stage 1's findings...},
     "stages": [{"id": 1..7, "name", "status", "seconds", "summary", "items": [...], "logs": [...],
                 "notes": [...]}],
     "artifacts": {name: path relative to the report directory}}

``measured`` is true only for a run on an NPU (``mode`` npu); a twin run's times are meaningless and
every number from it says so. Stage and item statuses are those of :data:`STAGE_STATUSES` /
:data:`ITEM_STATUSES`.
"""

from __future__ import annotations

import datetime
import json
import os
import tarfile
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

SCHEMA = "splitkv-node-day/1"
STAGES = ((1, "identify"), (2, "build"), (3, "smoke"), (4, "determinism"), (5, "parity"), (6, "probes"),
          (7, "timing"))
#: pass: everything ran and passed; fail: something failed (the stage stopped at it); refused: the
#: chip or the setup is not one the kernels are built for; skipped: not run, with the reason (not
#: selected, not possible in this mode, or blocked by an earlier stage); not-run: never reached.
STAGE_STATUSES = ("pass", "fail", "refused", "skipped", "not-run")
#: per item: error (an exception), timeout (the watchdog ended a hang), not-run (the stage had stopped
#: before it), info (a record, no verdict).
ITEM_STATUSES = ("pass", "fail", "error", "timeout", "skipped", "not-run", "info")
VERDICTS = ("pass", "fail", "refused", "running")
HONESTY = {
    "npu": "Run on an Ascend NPU: times are device measurements of this run; estimates are labelled as estimates.",
    "twin": ("CPU twin run: NOTHING HERE RAN ON AN NPU. The kernels ran on the CPU twin (a test double); "
             "every time in this report is the host's clock and MEANINGLESS as a device time; only the "
             "plumbing and the twin's checks are real."),
}


def utc_now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


@dataclass
class Stage:
    id: int
    name: str
    status: str = "not-run"
    seconds: float = 0.0
    summary: str = ""
    items: list = field(default_factory=list)
    logs: list = field(default_factory=list)
    notes: list = field(default_factory=list)


class Report:
    """The report being built; :meth:`write` puts it on disk (atomically) at any moment."""

    def __init__(self, out_dir: Path, mode: str, command: str):
        self.out_dir = Path(out_dir)
        self.mode = mode
        self.command = command
        self.started = utc_now()
        self._t0 = datetime.datetime.now(datetime.timezone.utc)
        self.finished: str | None = None
        self.identity: dict = {}
        self.stages = [Stage(i, n) for i, n in STAGES]
        self.artifacts: dict = {}
        self.verdict = "running"
        self.exit_code: int | None = None

    def stage(self, sid: int) -> Stage:
        return self.stages[sid - 1]

    def rel(self, path: Path) -> str:
        return os.path.relpath(Path(path), self.out_dir)

    def as_dict(self) -> dict:
        end = datetime.datetime.now(datetime.timezone.utc)
        return {"schema": SCHEMA, "mode": self.mode, "measured": self.mode == "npu", "honesty": HONESTY[self.mode],
                "verdict": self.verdict, "exit_code": self.exit_code, "started": self.started,
                "finished": self.finished, "seconds": round((end - self._t0).total_seconds(), 3),
                "command": self.command, "out_dir": str(self.out_dir), "identity": self.identity,
                "stages": [asdict(s) for s in self.stages], "artifacts": dict(self.artifacts)}

    def write(self) -> dict:
        d = self.as_dict()
        _atomic_write(self.out_dir / "report.json", json.dumps(d, indent=1, default=_json_default) + "\n")
        _atomic_write(self.out_dir / "report.md", to_markdown(d))
        return d

    def finish(self, verdict: str, exit_code: int) -> dict:
        self.verdict, self.exit_code, self.finished = verdict, int(exit_code), utc_now()
        return self.write()

    def tarball(self) -> Path:
        """``<dir>.tar.gz`` next to the report directory, holding all of it."""
        out = self.out_dir.parent / f"{self.out_dir.name}.tar.gz"
        with tarfile.open(out, "w:gz") as tar:
            tar.add(self.out_dir, arcname=self.out_dir.name)
        return out


def _json_default(x):
    try:
        return float(x)
    except (TypeError, ValueError):
        return str(x)


def _atomic_write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".node-day-", suffix=".tmp", dir=path.parent)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)


# ---------------------------------------------------------------------------------------------
# Markdown

def _num(x) -> str:
    if x is None:
        return "-"
    if isinstance(x, (int, float)):
        x = float(x)
        if x != x:
            return "nan"
        if x in (float("inf"), float("-inf")):
            return str(x)
        return f"{x:.3g}" if abs(x) >= 1e-3 or x == 0 else f"{x:.2e}"
    return str(x)


def _cell(text) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")[:300]


def _rounded(x):
    """``x`` with its floats at 4 significant digits (for the Markdown's detail column)."""
    if isinstance(x, float):
        return float(f"{x:.4g}")
    if isinstance(x, dict):
        return {k: _rounded(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_rounded(v) for v in x]
    return x


def to_markdown(d: dict) -> str:
    """``report.md``: the verdict, the identity, one line per stage, then each stage's items."""
    ident = {k: ("-" if v is None else v) for k, v in (d.get("identity") or {}).items()}
    lines = [f"# splitkv node day: {d['verdict'].upper()}", "",
             f"> {d['honesty']}", "",
             f"- mode: {d['mode']} ({'measured on an NPU' if d['measured'] else 'not measured'})",
             f"- chip: {ident.get('chip', '-')} (AIC {ident.get('aic', '-')}, AIV {ident.get('aiv', '-')}, "
             f"HBM {ident.get('hbm_gib', '-')} GiB)",
             f"- commit: {ident.get('commit', '-')}{' (with uncommitted changes)' if ident.get('dirty') else ''}",
             f"- software: CANN {ident.get('cann', '-')}, driver {ident.get('driver', '-')}, "
             f"torch {ident.get('torch', '-')}, torch_npu {ident.get('torch_npu', '-')}, python {ident.get('python', '-')}",
             f"- started {d['started']}, {d['seconds']:.0f} s; exit code {d['exit_code']}",
             f"- command: `{d['command']}`", "",
             "| stage | status | seconds | summary |", "|---|---|---|---|"]
    for s in d["stages"]:
        lines.append(f"| {s['id']}. {s['name']} | {s['status']} | {s['seconds']:.1f} | {_cell(s['summary'])} |")
    for s in d["stages"]:
        if not s["items"] and not s["notes"]:
            continue
        lines += ["", f"## {s['id']}. {s['name']}: {s['status']}", ""]
        lines += [f"- {_cell(n)}" for n in s["notes"]]
        if s["notes"]:
            lines.append("")
        render = _RENDER.get(s["name"], _render_generic)
        lines += render(s["items"])
        if s["logs"]:
            lines += ["", "logs: " + ", ".join(f"`{p}`" for p in s["logs"])]
    if d.get("artifacts"):
        lines += ["", "## files", ""] + [f"- {k}: `{v}`" for k, v in d["artifacts"].items()]
    return "\n".join(lines) + "\n"


def _errs(e: dict | None) -> list[str]:
    if not e:
        return ["-"] * 4
    return [_num(e.get(k)) for k in ("out_abs", "out_rel", "lse_abs", "lse_rel")]


def _render_smoke(items) -> list[str]:
    out = ["| case | feature | kernel | status | out abs | out rel | lse abs | lse rel | vs vector: out abs | "
           "out rel | lse abs | lse rel | s | message |", "|" + "---|" * 14]
    for it in items:
        out.append("| " + " | ".join([it["name"], _cell(it.get("feature", "")), it.get("kernel", "-"), it["status"],
                                      *_errs(it.get("vs_reference")), *_errs(it.get("vs_vector")),
                                      f"{it.get('seconds', 0):.1f}", _cell(it.get("message", ""))]) + " |")
    return out


def _render_determinism(items) -> list[str]:
    out = ["| case | status | launches | block counts | block orders | message |", "|---|---|---|---|---|---|"]
    for it in items:
        out.append(f"| {it['name']} | {it['status']} | {it.get('launches', '-')} | "
                   f"{_cell(it.get('block_counts', '-'))} | {_cell(it.get('block_orders', '-'))} | "
                   f"{_cell(it.get('message', ''))} |")
    return out


def _render_probes(items) -> list[str]:
    out = ["| probe | status | value | unit | what | detail |", "|---|---|---|---|---|---|"]
    for it in items:
        value = _num(it.get("value"))
        if it.get("meaningful") is False:
            value += " (meaningless: twin)"
        detail = json.dumps(_rounded(it.get("detail", {})), default=str) if it.get("detail") else ""
        out.append(f"| {it['name']} | {it['status']} | {value} | {it.get('unit', '')} | "
                   f"{_cell(it.get('what') or it.get('message', ''))} | {_cell(detail)} |")
    return out


def _render_identify(items) -> list[str]:
    out = ["| what | value |", "|---|---|"]
    for it in items:
        out.append(f"| {it['name']} | {_cell('-' if it.get('value') is None else it.get('value'))} |")
    return out


def _render_generic(items) -> list[str]:
    out = ["| item | status | message |", "|---|---|---|"]
    for it in items:
        out.append(f"| {_cell(it['name'])} | {it['status']} | {_cell(it.get('message', ''))} |")
    return out


_RENDER = {"identify": _render_identify, "smoke": _render_smoke, "determinism": _render_determinism, "probes": _render_probes}


# ---------------------------------------------------------------------------------------------
# Validation

_TOP = {"schema": str, "mode": str, "measured": bool, "honesty": str, "verdict": str, "started": str,
        "seconds": (int, float), "command": str, "out_dir": str, "identity": dict, "stages": list,
        "artifacts": dict}
_STAGE = {"id": int, "name": str, "status": str, "seconds": (int, float), "summary": str, "items": list,
          "logs": list, "notes": list}
_ERR_KEYS = ("out_abs", "out_rel", "lse_abs", "lse_rel")


def validate_report(d: dict, out_dir: Path | None = None) -> list[str]:
    """Every way ``d`` (a parsed ``report.json``) departs from the schema, in words; [] when valid.
    With ``out_dir``, the logs and artifacts it names must exist there."""
    errs = []

    def typed(obj, spec, where):
        for k, t in spec.items():
            if k not in obj:
                errs.append(f"{where}: missing {k!r}")
            elif not isinstance(obj[k], t) or (t is int and isinstance(obj[k], bool)):
                errs.append(f"{where}.{k}: {type(obj[k]).__name__}, expected {t}")

    if not isinstance(d, dict):
        return ["report: not a JSON object"]
    typed(d, _TOP, "report")
    if errs:
        return errs
    if d["schema"] != SCHEMA:
        errs.append(f"report.schema: {d['schema']!r}, expected {SCHEMA!r}")
    if d["mode"] not in HONESTY:
        errs.append(f"report.mode: {d['mode']!r}")
    elif d["measured"] != (d["mode"] == "npu"):
        errs.append("report.measured: true only for mode npu")
    elif d["honesty"] != HONESTY[d["mode"]]:
        errs.append("report.honesty: not the statement of its mode")
    if d["verdict"] not in VERDICTS:
        errs.append(f"report.verdict: {d['verdict']!r}")
    if d["verdict"] != "running" and not isinstance(d.get("exit_code"), int):
        errs.append("report.exit_code: an int once the run finished")
    ids = [s.get("id") for s in d["stages"] if isinstance(s, dict)]
    if ids != [i for i, _ in STAGES]:
        errs.append(f"report.stages: ids {ids}, expected 1..7 in order")
    for s in d["stages"]:
        if not isinstance(s, dict):
            errs.append("report.stages: an entry is not an object")
            continue
        where = f"stage {s.get('id')}"
        typed(s, _STAGE, where)
        if s.get("status") not in STAGE_STATUSES:
            errs.append(f"{where}.status: {s.get('status')!r}")
        if isinstance(s.get("id"), int) and 1 <= s["id"] <= 7 and s.get("name") != STAGES[s["id"] - 1][1]:
            errs.append(f"{where}.name: {s.get('name')!r}")
        if s.get("status") in ("skipped", "refused", "fail") and not s.get("summary"):
            errs.append(f"{where}: a {s.get('status')} stage says why in its summary")
        for it in s.get("items") or []:
            if not isinstance(it, dict) or not isinstance(it.get("name"), str):
                errs.append(f"{where}: an item without a name")
                continue
            iw = f"{where} item {it['name']!r}"
            if it.get("status") not in ITEM_STATUSES:
                errs.append(f"{iw}.status: {it.get('status')!r}")
            if it.get("status") in ("fail", "error", "timeout") and not it.get("message"):
                errs.append(f"{iw}: a {it['status']} item says what happened in its message")
            for k in ("vs_reference", "vs_vector"):
                e = it.get(k)
                if e is not None and (not isinstance(e, dict) or any(not isinstance(e.get(x), (int, float))
                                                                     for x in _ERR_KEYS)):
                    errs.append(f"{iw}.{k}: needs numbers {', '.join(_ERR_KEYS)}")
            if it.get("kind") == "probe" and it.get("status") == "pass":
                if not isinstance(it.get("value"), (int, float)) or not isinstance(it.get("unit"), str):
                    errs.append(f"{iw}: a passed probe has a numeric value and a unit")
                if d["mode"] == "twin" and it.get("meaningful") is not False:
                    errs.append(f"{iw}: a twin probe's value must be marked meaningful: false")
        if out_dir is not None:
            for p in s.get("logs") or []:
                if not (Path(out_dir) / p).exists():
                    errs.append(f"{where}: log {p} does not exist")
    if out_dir is not None:
        for k, p in d["artifacts"].items():
            if not (Path(out_dir) / p).exists():
                errs.append(f"artifact {k}: {p} does not exist")
    return errs
