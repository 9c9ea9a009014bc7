"""``python -m ascend_ops.node_day`` (``scripts/npu_node_day.sh``): the stages in order, the report.

    scripts/npu_node_day.sh [--out DIR] [--stages 1-7] [--repeats 50] [--timeout 300] [--cases PATTERN]
                            [--routes cmake,bisheng] [--parity-size small,full] [--probe-iters 2000]
    scripts/npu_node_day.sh --twin [--chip 910b2] [--repeats 3] ...   # the CPU twin: stages 1, 3-6

Each stage stops at its first failure and says so; the report (``report.json``, ``report.md``) is
rewritten after every step, the raw logs sit in ``logs/`` and ``jobs/``, and a tarball of the whole
directory is written next to it at the end. What runs after a failure: a refused chip (stage 1) ends
the run (exit 2); a failed identify or default build skips the stages that need the operator
(3, 4, 5, 7; the probes need only their own library); stage 4 runs the smoke cases that passed
stage 3; stages 5, 6 and 7 run whatever came before. Exit status: 0 every stage that ran passed,
1 a stage failed, 2 refused or bad arguments.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

from . import probes as probes_mod
from . import smoke
from .constants_file import write_constants
from .report import STAGES, Report
from .watchdog import run_child

ROOT = Path(__file__).resolve().parents[2]
TWIN_STAGES = (1, 3, 4, 5, 6)
NPU_ONLY = {2: "needs CANN and an NPU (twin mode: the build is the twin's own)",
            7: "needs an NPU (twin mode: there are no device times to take)"}
LAUNCH_SYMBOLS = ("aclrtlaunch_splitkv_split", "aclrtlaunch_splitkv_combine", "aclrtlaunch_splitkv_attention_mix")
INJECT = ("wrong-output", "hang")


def _stage_list(text: str) -> list[int]:
    out = set()
    for part in text.replace(" ", "").split(","):
        if not part:
            continue
        a, _, b = part.partition("-")
        try:
            lo, hi = int(a), int(b or a)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected stage numbers such as 1-7 or 1,3,4, got {text!r}") from None
        if not (1 <= lo <= hi <= 7):
            raise argparse.ArgumentTypeError(f"stages are 1..7, got {part!r}")
        out.update(range(lo, hi + 1))
    if not out:
        raise argparse.ArgumentTypeError("no stage given")
    return sorted(out)


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="scripts/npu_node_day.sh", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--twin", action="store_true", help="run on the CPU twin (stages 1, 3-6; nothing on an NPU)")
    ap.add_argument("--out", type=Path, help="report directory (default reports/node-day[-twin]-<UTC time>)")
    ap.add_argument("--force", action="store_true", help="write into --out even when it holds files")
    ap.add_argument("--stages", type=_stage_list, help="stages to run, e.g. 1-7 or 1,3,4 (default: all the mode has)")
    ap.add_argument("--chip", default="910b2", help="twin only: the profile to emulate (default 910b2)")
    ap.add_argument("--repeats", type=int, help="stage 4: launches of each case as planned (default 50; twin 3)")
    ap.add_argument("--timeout", type=float, help="seconds a launch may take before the watchdog ends it "
                                                  "(default 300; twin 120); a determinism child gets 4 times that")
    ap.add_argument("--cases", help="smoke cases: comma-separated substrings of their names (default: all)")
    ap.add_argument("--routes", default="cmake,bisheng", help="stage 2: build routes, the default (cmake) first")
    ap.add_argument("--soc", help="stage 2: SoC for the build (default: the detected chip)")
    ap.add_argument("--parity-size", default=None, help="stage 5: small, full or small,full (default small,full; "
                                                        "twin small)")
    ap.add_argument("--parity-cases", help="stage 5: only catalog cases matching this filter")
    ap.add_argument("--probe-iters", type=int, help="stage 6: loop count of the timed probes (default 2000; twin 4)")
    ap.add_argument("--bench-args", default="--set main,hkv4", help="stage 7: arguments for python -m splitkv_bench npu")
    ap.add_argument("--inject", choices=INJECT, help="plant a failing smoke case (tests of the report): "
                                                     "wrong-output or hang")
    ap.add_argument("--no-tarball", action="store_true", help="do not write the tarball")
    a = ap.parse_args(argv)
    if not a.twin and a.chip != "910b2":
        ap.error("--chip: only with --twin (on a node the chip is the device's own)")
    if a.repeats is not None and a.repeats < 1:
        ap.error(f"--repeats: must be >= 1, got {a.repeats}")
    if a.timeout is not None and a.timeout <= 0:
        ap.error(f"--timeout: must be > 0 seconds, got {a.timeout}")
    if a.probe_iters is not None and a.probe_iters < 1:
        ap.error(f"--probe-iters: must be >= 1, got {a.probe_iters}")
    a.repeats = a.repeats or (3 if a.twin else 50)
    a.timeout = a.timeout or (120.0 if a.twin else 300.0)
    a.probe_iters = a.probe_iters or (4 if a.twin else 2000)
    sizes = a.parity_size or ("small" if a.twin else "small,full")
    a.parity_sizes = [s.strip() for s in sizes.split(",") if s.strip()]
    bad = [s for s in a.parity_sizes if s not in ("small", "full")]
    if bad or not a.parity_sizes:
        ap.error(f"--parity-size: small, full or small,full, got {sizes!r}")
    a.route_list = [r.strip() for r in a.routes.split(",") if r.strip()]
    if not a.route_list or any(r not in ("cmake", "bisheng") for r in a.route_list):
        ap.error(f"--routes: cmake and/or bisheng, got {a.routes!r}")
    try:
        a.case_list = smoke.select(a.cases)
    except ValueError as e:
        ap.error(str(e))
    return a


class Run:
    """One node day: the arguments, the report and what the stages learnt."""

    def __init__(self, args, report: Report):
        self.args = args
        self.report = report
        self.mode = "twin" if args.twin else "npu"
        self.out = report.out_dir
        self.identity: dict = {}
        self.blocked: dict[int, str] = {}   # stage -> why it cannot run
        self.smoke_passed: list[str] | None = None
        self.probe_lib: Path | None = None

    @property
    def profile(self) -> str | None:
        return self.identity.get("profile") or (self.args.chip if self.mode == "twin" else None)

    def child(self, job: dict, name: str, timeout: float | None = None) -> dict:
        job = dict(job, mode=self.mode, profile=self.profile)
        return run_child(job, name=name, out_dir=self.out, timeout=timeout or self.args.timeout,
                         on_npu=self.mode == "npu")


def _item_from(res: dict, name: str, **extra) -> dict:
    """A report item from a watchdog result: the child's item when it gave one, else the failure."""
    if res["status"] == "ok":
        it = dict(res["result"]["item"])
    else:
        it = {"name": name, "status": "timeout" if res["status"] == "timeout" else "error",
              "message": res["message"] or f"the child ended with status {res['status']}"}
    for k, v in extra.items():
        it.setdefault(k, v)
    it.setdefault("seconds", res["seconds"])
    it["log"] = res["log"]
    for k in ("device_log", "msaicerr"):
        if res.get(k):
            it[k] = res[k]
    return it


def _run_cmd(cmd: list[str], log: Path, timeout: float, env: dict | None = None) -> tuple[int | None, str]:
    """Run ``cmd`` into ``log`` under a time limit (its process group killed at the limit): (status, tail)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as f:
        f.write("+ " + shlex.join(cmd) + "\n")
        f.flush()
        p = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT, env=dict(os.environ, **(env or {})),
                             start_new_session=True)
        try:
            rc = p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            from .watchdog import _kill_group

            _kill_group(p)
            rc = None
    return rc, _last_lines(log)


def _last_lines(log: Path, n: int = 3) -> str:
    """The last ``n`` non-empty lines of a log, joined: where a traceback or a tool says what went wrong."""
    lines = [x.strip() for x in log.read_text(errors="replace").splitlines() if x.strip()]
    return " | ".join(lines[-n:])[-1500:]


# ---------------------------------------------------------------------------------------------
# Stage 1

def stage_identify(run: Run, st) -> None:
    res = run.child({"kind": "identify", "chip": run.args.chip}, "identify", timeout=max(120.0, run.args.timeout))
    if res["status"] != "ok":
        st.status, st.summary = "fail", f"identify did not finish: {res['message']}"
        st.logs.append(res["log"])
        return
    info = res["result"]["item"]
    smi = info.pop("npu_smi", None)
    if smi:
        p = run.out / "logs" / "npu-smi.txt"
        p.write_text(smi)
        st.logs.append(run.report.rel(p))
    run.identity = info
    run.report.identity = info
    st.logs.append(res["log"])
    for k in ("chip", "profile", "aic", "aiv", "hbm_gib", "cann", "driver", "torch", "torch_npu", "python", "commit"):
        st.items.append({"name": k, "status": "info", "value": info.get(k)})
    if not info.get("supported"):
        st.status, st.summary = "refused", info.get("refusal") or "this chip is not supported"
        return
    st.status = "pass"
    st.summary = (f"{info['chip']}: {info['aic']} AIC / {info['aiv']} AIV, profile {info['profile']}, "
                  f"commit {str(info.get('commit'))[:12]}")


# ---------------------------------------------------------------------------------------------
# Stage 2 (a node only)

def exported_symbols(lib: Path) -> set[str]:
    """Defined symbols of a shared library (``nm -D``, else the full table): names only."""
    names = set()
    for flags in (["-D", "--defined-only"], ["--defined-only"]):
        try:
            r = subprocess.run(["nm", *flags, str(lib)], capture_output=True, text=True, timeout=120)
        except (OSError, subprocess.SubprocessError):
            continue
        for line in r.stdout.splitlines():
            parts = line.split()
            if len(parts) >= 3:
                names.add(parts[2])
    return names


def stage_build(run: Run, st) -> None:
    from .. import build

    lib = build.LIB_DIR / build.LIB_FILE
    saved = None
    soc = ["--soc", run.args.soc] if run.args.soc else []
    for i, route in enumerate(run.args.route_list):
        d = run.out / "build" / route
        log = run.out / "logs" / f"build-{route}.log"
        rc, tail = _run_cmd([sys.executable, "-m", "ascend_ops.build", "--route", route, "--build-dir", str(d), *soc],
                            log, 3600)
        st.logs.append(run.report.rel(log))
        if rc == 2 and route != "cmake" and re.search(r"route bisheng: CANN \d+\.\d+", tail):
            st.items.append({"name": f"route {route}", "status": "skipped", "message": tail[-400:]})
            continue
        if rc != 0:
            st.items.append({"name": f"route {route}", "status": "fail",
                             "message": f"build exit status {rc}: {tail[-600:]}"})
            st.status, st.summary = "fail", f"route {route} failed (see {run.report.rel(log)})"
            if i == 0:
                run.blocked.update({s: f"the default build route ({route}) failed" for s in (3, 4, 5, 7)})
            break
        libs = [lib] + ([build.LIB_DIR / build.KERNELS_LIB_FILE] if route == "bisheng" else [])
        syms = set().union(*(exported_symbols(p) for p in libs if p.is_file()))
        missing = [s for s in LAUNCH_SYMBOLS if s not in syms]
        blob = lib.read_bytes()
        mix_parts = [t for t in (b"splitkv_attention_mix_mix_aic", b"splitkv_attention_mix_mix_aiv") if t in blob]
        it = {"name": f"route {route}", "status": "fail" if missing else "pass", "library": str(lib),
              "symbols_found": [s for s in LAUNCH_SYMBOLS if s in syms],
              "message": (f"the library does not export {', '.join(missing)}" if missing else
                          f"exports {', '.join(LAUNCH_SYMBOLS)}"),
              "mixed_binary_hint": (f"found {', '.join(t.decode() for t in mix_parts)}" if mix_parts else
                                    "no *_mix_aic / *_mix_aiv names in the library (a heuristic only: a vector-only "
                                    "build of the mixed kernel would hang at its first cross-core wait)")}
        st.items.append(it)
        if missing:
            st.status, st.summary = "fail", f"route {route}: {it['message']}"
            if i == 0:
                run.blocked.update({s: f"the default build route ({route}) lacks launch symbols" for s in (3, 4, 5, 7)})
            break
        if i == 0:
            saved = run.out / "build" / f"{build.LIB_FILE}.{route}"
            saved.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(lib, saved)
    if saved is not None:  # the default route's library is the one the stages load
        shutil.copy2(saved, lib)
    if st.status == "fail":
        return
    log = run.out / "logs" / "build-probes.log"
    rc, tail = _run_cmd([sys.executable, "-m", "ascend_ops.build", "--probes", "--build-dir",
                         str(run.out / "build" / "probes"), *soc], log, 3600)
    st.logs.append(run.report.rel(log))
    plib = build.LIB_DIR / probes_mod.PROBE_LIB_FILE
    want = [f"aclrtlaunch_{k}" for k in probes_mod.PROBE_KERNELS]
    missing = [] if rc != 0 or not plib.is_file() else [s for s in want if s not in exported_symbols(plib)]
    if rc != 0 or missing:
        st.items.append({"name": "probe library", "status": "fail",
                         "message": f"exit status {rc}: {tail[-500:]}" if rc else f"missing {', '.join(missing)}"})
        st.status, st.summary = "fail", "the probe library did not build (stage 6 cannot run)"
        run.blocked[6] = "the probe library did not build"
        return
    run.probe_lib = plib
    st.items.append({"name": "probe library", "status": "pass", "message": f"exports {len(want)} probe launches"})
    st.status = "pass"
    st.summary = f"routes {', '.join(run.args.route_list)} and the probe library built; launch symbols present"


# ---------------------------------------------------------------------------------------------
# Stages 3 and 4

def stage_smoke(run: Run, st) -> None:
    names = list(run.args.case_list)
    if run.args.inject:
        names.insert(min(2, len(names)), smoke.PLANTED[run.args.inject].name)
        st.notes.append(f"--inject {run.args.inject}: the planted case {smoke.PLANTED[run.args.inject].name} is "
                        "part of this run on purpose")
    passed = []
    for i, name in enumerate(names):
        res = run.child({"kind": "smoke", "case": name}, f"smoke-{name}")
        it = _item_from(res, name, feature=smoke.get_case(name).feature)
        st.items.append(it)
        st.logs.append(res["log"])
        run.report.write()
        if it["status"] != "pass":
            for rest in names[i + 1:]:
                st.items.append({"name": rest, "feature": smoke.get_case(rest).feature, "status": "not-run",
                                 "message": f"the stage stopped at {name}"})
            st.status = "fail"
            st.summary = f"{name}: {it['status']}: {it.get('message', '')[:300]}"
            break
        passed.append(name)
    else:
        st.status = "pass"
        worst = max((it["vs_reference"]["out_abs"] for it in st.items if it.get("vs_reference")), default=0.0)
        st.summary = f"{len(passed)} cases pass the accuracy rule; worst out error vs float64 {worst:.2e}"
    run.smoke_passed = [n for n in passed if n in smoke.CASE_NAMES]


def stage_determinism(run: Run, st) -> None:
    names = run.smoke_passed if run.smoke_passed is not None else list(run.args.case_list)
    if run.smoke_passed is not None and len(names) < len(run.args.case_list):
        st.notes.append("only the smoke cases that passed stage 3 are run")
    if not names:
        st.status, st.summary = "skipped", "no smoke case passed stage 3"
        return
    orders = [0, 1, 2026] if run.mode == "twin" else [0]
    for i, name in enumerate(names):
        res = run.child({"kind": "determinism", "case": name, "repeats": run.args.repeats,
                         "block_counts": [1, 2, 8, "all"], "orders": orders}, f"determinism-{name}",
                        timeout=4 * run.args.timeout)
        it = _item_from(res, name)
        st.items.append(it)
        st.logs.append(res["log"])
        run.report.write()
        if it["status"] != "pass":
            for rest in names[i + 1:]:
                st.items.append({"name": rest, "status": "not-run", "message": f"the stage stopped at {name}"})
            st.status, st.summary = "fail", f"{name}: {it['status']}: {it.get('message', '')[:300]}"
            return
    st.status = "pass"
    st.summary = (f"{len(names)} cases, each launched {run.args.repeats}x as planned and at block counts 1, 2, 8, all"
                  + (f" in block orders {orders}" if len(orders) > 1 else "") + ": the same bits every time")


# ---------------------------------------------------------------------------------------------
# Stage 5

def stage_parity(run: Run, st) -> None:
    ours = "ascend-sim" if run.mode == "twin" else "ascend"
    backends = [ours, "numpy"] if run.mode == "twin" else [ours, "cann-fia", "atb-paged", "numpy"]
    for size in run.args.parity_sizes:
        md, js = run.out / f"parity-{size}.md", run.out / f"parity-{size}.json"
        cmd = [sys.executable, "-m", "splitkv_common.cli", "parity", *[x for b in backends for x in ("--backend", b)],
               "--size", size, "--force", "--no-progress", "--report", str(md), "--report", str(js)]
        if run.args.parity_cases:
            cmd += ["--cases", run.args.parity_cases]
        log = run.out / "logs" / f"parity-{size}.log"
        limit = 1800 if run.mode == "twin" or size == "small" else 7200
        rc, tail = _run_cmd(cmd, log, limit)
        st.logs.append(run.report.rel(log))
        data = json.loads(js.read_text()) if js.is_file() else {}
        counts = data.get("counts", {})
        unavailable = data.get("unavailable", {})
        it = {"name": f"catalog {size}", "status": "timeout" if rc is None else "fail",
              "counts": counts, "unavailable": unavailable, "report": run.report.rel(md) if md.is_file() else None}
        bad = [r for r in data.get("results", []) if r.get("status") in ("fail", "error")]
        ours_bad = [r for r in bad if r.get("backend") == ours]
        peers_bad = [r for r in bad if r.get("backend") != ours]
        c = counts.get(ours, {})
        if ours in unavailable:
            it["status"] = "fail"
            it["message"] = f"our backend {ours} could not run: {unavailable[ours]}"
        elif rc is None:
            it["message"] = f"no answer in {limit} s (killed)"
        elif ours_bad or not js.is_file() or ours not in counts:
            it["status"] = "fail"
            it["message"] = ("; ".join(f"{r['case']}: {r['status']}: {r.get('message', '')[:120]}" for r in ours_bad[:6])
                             or f"exit status {rc}: {tail[-300:]}")
        else:  # our backend passed; a peer's failure is recorded, not ours
            it["status"] = "pass"
            it["message"] = (f"{ours}: {c.get('pass', 0)} pass, {c.get('unsupported', 0)} unsupported"
                             + (f"; unavailable peers: {', '.join(unavailable)}" if unavailable else "")
                             + (f"; peers failed {len(peers_bad)} case(s): "
                                + ", ".join(f"{r['backend']} {r['case']}" for r in peers_bad[:6]) if peers_bad else ""))
        st.items.append(it)
        run.report.write()
        if it["status"] != "pass":
            st.status, st.summary = "fail", f"catalog {size}: {it['message'][:300]}"
            return
    st.status = "pass"
    st.summary = "; ".join(it["message"] for it in st.items)


# ---------------------------------------------------------------------------------------------
# Stage 6

def estimate_options() -> list[str] | None:
    """The options that run ``python -m splitkv_bench npu-estimate`` on a constants file: ``--constants`` and, where
    the script has it, ``--model critical-path`` (the model the constants calibrate); None when the
    script takes no ``--constants``."""
    try:
        r = subprocess.run([sys.executable, "-m", "splitkv_bench", "npu-estimate", "--help"], capture_output=True,
                           text=True, timeout=300, cwd=ROOT)
    except (OSError, subprocess.SubprocessError):
        return None
    if "--constants" not in r.stdout:
        return None
    return ["--model", "critical-path"] if "critical-path" in r.stdout else []


def stage_probes(run: Run, st) -> None:
    twin = run.mode == "twin"
    settings = probes_mod.Settings.twin(run.args.probe_iters) if twin else probes_mod.Settings.node(run.args.probe_iters)
    lib = None if twin else str(run.probe_lib or (ROOT / "ascend_ops" / "_lib" / probes_mod.PROBE_LIB_FILE))
    if twin:
        st.notes.append(probes_mod.MEANINGLESS)
    results: dict = {}
    failed = None
    for i, p in enumerate(probes_mod.PROBES):
        res = run.child({"kind": "probe", "probe": p.name, "lib": lib, "settings": settings.__dict__,
                         "results": results}, f"probe-{p.name}")
        it = _item_from(res, p.name, kind="probe")
        if res["status"] == "ok":
            it["status"] = "pass"
            it["meaningful"] = not twin
            results[p.name] = res["result"]["item"]
        it["name"] = p.name
        st.items.append(it)
        st.logs.append(res["log"])
        run.report.write()
        if it["status"] != "pass":
            failed = p.name
            for rest in probes_mod.PROBES[i + 1:]:
                st.items.append({"name": rest.name, "kind": "probe", "status": "not-run",
                                 "message": f"the stage stopped at {p.name}"})
            break
    date = datetime.date.today().isoformat()
    chip = str(run.identity.get("chip") or run.profile or "unknown chip")
    const_file = run.out / ("constants.twin.json" if twin else "constants.json")
    summary = write_constants(results, chip=chip, date=date, measured=not twin, out=const_file)
    run.report.artifacts["constants"] = run.report.rel(const_file)
    st.items.append({"name": "constants file", "status": "info", "file": run.report.rel(const_file),
                     "message": (f"replaced {', '.join(summary['replaced']) or 'nothing'}; kept the paper values of "
                                 f"{len(summary['kept'])}" + ("; NOT MEASURED (twin)" if twin else "")
                                 + ("; " + "; ".join(summary["unconverted"]) if summary["unconverted"] else ""))})
    est = _estimate(run, const_file)
    st.items.append(est)
    if failed:
        st.status = "fail"
        bad = next(it for it in st.items if it["name"] == failed)
        st.summary = f"probe {failed}: {bad['status']}: {bad.get('message', '')[:300]}"
    elif est["status"] in ("fail", "error", "timeout"):
        st.status, st.summary = "fail", f"the estimate with the new constants failed: {est['message'][:300]}"
    else:
        st.status = "pass"
        st.summary = (f"{len(results)} probes ran" + (" on the twin (values meaningless)" if twin else "")
                      + f"; constants file {run.report.rel(const_file)}; {est['message'][:200]}")


def _estimate(run: Run, const_file: Path) -> dict:
    opts = estimate_options()
    if opts is None:
        return {"name": "estimate", "status": "skipped",
                "message": "estimate skipped: --constants not available in splitkv_bench npu-estimate"}
    js, md = run.out / "estimate.json", run.out / "estimate.md"
    log = run.out / "logs" / "estimate.log"
    rc, tail = _run_cmd([sys.executable, "-m", "splitkv_bench", "npu-estimate", *opts, "--constants", str(const_file),
                         "--out-json", str(js), "--out-md", str(md)], log, 1800)
    label = "ESTIMATE (paper model" + (", twin plumbing constants: meaningless" if run.mode == "twin" else
                                      ", with the measured constants") + ")"
    if rc != 0:
        return {"name": "estimate", "status": "timeout" if rc is None else "error",
                "message": f"{label}: exit status {rc}: {tail[-400:]}", "log": run.report.rel(log)}
    run.report.artifacts["estimate"] = run.report.rel(md if md.is_file() else js)
    return {"name": "estimate", "status": "pass", "message": f"{label} written to {run.report.rel(js)}",
            "log": run.report.rel(log)}


# ---------------------------------------------------------------------------------------------
# Stage 7 (a node only)

def stage_timing(run: Run, st) -> None:  # pragma: no cover - needs an NPU (NOT RUN)
    js, md = run.out / "timing.json", run.out / "timing.md"
    log = run.out / "logs" / "timing.log"
    cmd = [sys.executable, "-m", "splitkv_bench", "npu", *shlex.split(run.args.bench_args), "--out-json", str(js),
           "--out-md", str(md)]
    rc, tail = _run_cmd(cmd, log, 3 * 3600)
    st.logs.append(run.report.rel(log))
    st.items.append({"name": "npu_bench", "status": "pass" if rc == 0 else ("timeout" if rc is None else "fail"),
                     "message": f"MEASURED medians per call in {run.report.rel(md)}" if rc == 0 else
                     f"exit status {rc}: {tail[-400:]}"})
    st.notes.append("splitkv_bench npu's sets main and hkv4 by default: Hkv 8 and 4, B1 to B64, 2k to 64k, bf16; "
                    "int8 KV shapes are not in splitkv_bench npu yet (the int8 smoke and parity cases cover correctness)")
    if rc == 0:
        run.report.artifacts["timing"] = run.report.rel(md)
    if shutil.which("msprof"):
        mlog = run.out / "logs" / "msprof.log"
        mrc, mtail = _run_cmd(["msprof", f"--output={run.out / 'msprof'}", "--aic-metrics=PipeUtilization",
                               sys.executable, "-m", "splitkv_bench", "npu", "--set", "main", "--warmup", "2", "--iters", "5"],
                              mlog, 3600)
        _run_cmd(["msprof", "--export=on", f"--output={run.out / 'msprof'}"], run.out / "logs" / "msprof-export.log",
                 1800)
        st.logs.append(run.report.rel(mlog))
        st.items.append({"name": "msprof", "status": "pass" if mrc == 0 else "fail",
                         "message": "pipe utilisation per kernel under msprof/" if mrc == 0 else
                         f"exit status {mrc}: {mtail[-300:]}"})
    else:
        st.items.append({"name": "msprof", "status": "skipped", "message": "msprof not on PATH"})
    bad = [it for it in st.items if it["status"] in ("fail", "timeout")]
    st.status = "fail" if bad else "pass"
    st.summary = bad[0]["message"][:300] if bad else f"timing table {run.report.rel(md)}"


STAGE_FUNCS = {1: stage_identify, 2: stage_build, 3: stage_smoke, 4: stage_determinism, 5: stage_parity,
               6: stage_probes, 7: stage_timing}


# ---------------------------------------------------------------------------------------------

def default_out(twin: bool) -> Path:
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return ROOT / "reports" / f"node-day{'-twin' if twin else ''}-{stamp}"


def prerequisites(mode: str) -> str | None:
    """What a node run lacks before anything starts (None in twin mode or when all is there)."""
    if mode == "twin":
        from ..sim_backend import compiler_missing

        return compiler_missing()
    if not os.environ.get("ASCEND_HOME_PATH"):
        return ("ASCEND_HOME_PATH is not set: this runs on an Ascend NPU node; source CANN's set_env.sh first "
                "(CANN's default: /usr/local/Ascend/ascend-toolkit/set_env.sh), or pass --twin for the CPU twin")
    from splitkv_common.npu_probe import torch_npu_unavailable

    try:
        import torch  # noqa: F401
    except Exception as e:  # noqa: BLE001
        return f"torch does not import ({type(e).__name__}: {e}); install torch and the matching torch-npu wheel"
    return torch_npu_unavailable()


def main(argv=None) -> int:
    args = parse_args(argv)
    mode = "twin" if args.twin else "npu"
    why = prerequisites(mode)
    if why:
        print(f"error: {why}", file=sys.stderr)
        return 2
    out = Path(args.out or default_out(args.twin)).resolve()
    if out.exists() and any(out.iterdir()) and not args.force:
        print(f"error: --out: {out} exists and holds files; pass --force or another directory", file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    entry = os.environ.get("SPLITKV_NODE_DAY_ENTRY", "python -m ascend_ops.node_day")
    report = Report(out, mode, " ".join([entry, *map(shlex.quote, sys.argv[1:] if argv is None else argv)]))
    run = Run(args, report)
    wanted = args.stages or (list(TWIN_STAGES) if args.twin else list(range(1, 8)))
    report.write()
    print(f"node day ({mode}): report in {out}", flush=True)
    refused = False
    for sid, name in STAGES:
        st = report.stage(sid)
        if refused:
            st.status, st.summary = "skipped", "stage 1 refused this machine"
        elif sid not in wanted:
            st.status = "skipped"
            st.summary = NPU_ONLY[sid] if args.twin and sid in NPU_ONLY else "not selected (--stages)"
        elif sid in run.blocked:
            st.status, st.summary = "skipped", f"blocked: {run.blocked[sid]}"
        else:
            t0 = time.monotonic()
            print(f"[{sid}/7] {name} ...", flush=True)
            try:
                STAGE_FUNCS[sid](run, st)
            except Exception as e:  # noqa: BLE001 - the report must be written whatever happened
                import traceback

                log = out / "logs" / f"stage-{sid}-internal-error.log"
                log.parent.mkdir(parents=True, exist_ok=True)
                log.write_text(traceback.format_exc())
                st.logs.append(report.rel(log))
                st.status, st.summary = "fail", f"internal error of the node day: {type(e).__name__}: {e}"[:400]
            st.seconds = round(time.monotonic() - t0, 3)
            print(f"[{sid}/7] {name}: {st.status}: {st.summary}", flush=True)
            if sid == 1 and st.status == "refused":
                refused = True
            elif sid == 1 and st.status != "pass":
                run.blocked.update({s: "stage 1 (identify) failed" for s in range(2, 8)})
        report.write()
    statuses = [s.status for s in report.stages]
    if refused:
        verdict, code = "refused", 2
    elif "fail" in statuses:
        verdict, code = "fail", 1
    else:
        verdict, code = "pass", 0
    if not args.no_tarball:
        report.artifacts["tarball"] = os.path.relpath(out.parent / f"{out.name}.tar.gz", out)
    report.finish(verdict, code)
    if not args.no_tarball:
        report.tarball()
    print(f"node day ({mode}): {verdict.upper()} (exit {code}); {out / 'report.md'}", flush=True)
    return code
