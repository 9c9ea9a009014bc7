"""The watchdog: every launch of the node day runs in a child process with a time limit.

A hang (a cross-core wait nobody satisfies, a SyncAll past the device's cores, a stuck aicore)
becomes a recorded ``timeout`` after ``timeout`` seconds, not a stuck terminal: the child's whole
process group is killed. On a node, a timeout or a crash then collects the device's logs (the
runtime's plog directory) next to the report and runs CANN's error analyser ``msaicerr`` on them
where it is installed.

A job is a JSON object run by :mod:`ascend_ops.node_day.child`; it writes its result as JSON.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

#: Device log directories, first found: the runtime's own setting, then CANN's default.
def device_log_dirs() -> list[Path]:
    dirs = []
    if os.environ.get("ASCEND_PROCESS_LOG_PATH"):
        dirs.append(Path(os.environ["ASCEND_PROCESS_LOG_PATH"]))
    dirs.append(Path.home() / "ascend" / "log")
    return [d for d in dirs if d.is_dir()]


def run_child(job: dict, *, name: str, out_dir: Path, timeout: float, on_npu: bool = False,
              env: dict | None = None) -> dict:
    """Run ``job`` in a child interpreter under a ``timeout`` (seconds).

    Returns ``{"status": "ok" | "error" | "timeout" | "crash", "result": the child's JSON or None,
    "seconds", "returncode", "log": path of its stdout + stderr relative to out_dir, "message",
    "device_log": collected directory or None, "msaicerr": its output file or None}``."""
    out_dir = Path(out_dir)
    jobs = out_dir / "jobs"
    logs = out_dir / "logs"
    jobs.mkdir(parents=True, exist_ok=True)
    logs.mkdir(parents=True, exist_ok=True)
    job_file, result_file, log_file = jobs / f"{name}.json", jobs / f"{name}.result.json", logs / f"{name}.log"
    job_file.write_text(json.dumps(job, indent=1))
    if result_file.exists():
        result_file.unlink()
    cmd = [sys.executable, "-m", "ascend_ops.node_day.child", str(job_file), str(result_file)]
    child_env = dict(os.environ, **(env or {}))
    root = str(Path(__file__).resolve().parents[2])
    child_env["PYTHONPATH"] = os.pathsep.join(p for p in (root, child_env.get("PYTHONPATH", "")) if p)
    t0 = time.monotonic()
    since = time.time()
    with open(log_file, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=child_env, start_new_session=True)
        try:
            rc = proc.wait(timeout=timeout)
            status = None
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            rc, status = None, "timeout"
    seconds = time.monotonic() - t0
    result = None
    if result_file.exists():
        try:
            result = json.loads(result_file.read_text())
        except json.JSONDecodeError:
            result = None
    if status is None:
        if rc == 0 and result is not None:
            status = "ok"
        elif result is not None:
            status = "error"
        else:
            status = "crash"
    tail = _tail(log_file)
    if status == "timeout":
        message = f"watchdog: no answer in {timeout:g} s, the child was killed (a hang)"
    elif status == "crash":
        message = f"the child died (exit status {rc}) without a result: {tail}"
    elif status == "error":
        message = (result or {}).get("message") or tail
    else:
        message = ""
    out = {"status": status, "result": result, "seconds": round(seconds, 3), "returncode": rc,
           "log": os.path.relpath(log_file, out_dir), "message": message, "device_log": None, "msaicerr": None}
    if on_npu and status in ("timeout", "crash", "error") and (status != "error" or _looks_like_device_error(tail)):
        out.update(collect_device_log(out_dir / "device-log" / name, since))
        out = {k: (os.path.relpath(v, out_dir) if k in ("device_log", "msaicerr") and v else v) for k, v in out.items()}
    return out


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        proc.kill()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        pass


def _tail(path: Path, chars: int = 1500) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return " ".join(text[-chars:].split())


_DEVICE_ERROR_WORDS = ("aicore", "AICORE", "EZ9999", "EE9999", "aclrt", "ACL_ERROR", "rtStream", "device error",
                       "exception", "timeout")


def _looks_like_device_error(text: str) -> bool:
    return any(w in text for w in _DEVICE_ERROR_WORDS)


def collect_device_log(dest: Path, since: float) -> dict:
    """Copy the device log files written since ``since`` (epoch seconds, minus a minute) into
    ``dest``; run ``msaicerr -p dest`` when CANN's error analyser is installed. Returns
    ``{"device_log": dest or None, "msaicerr": its output file or None}``."""
    found = []
    for d in device_log_dirs():
        for p in d.rglob("*"):
            try:
                if p.is_file() and p.stat().st_mtime >= since - 60:
                    found.append((d, p))
            except OSError:
                continue
    if not found:
        return {"device_log": None, "msaicerr": None}
    dest.mkdir(parents=True, exist_ok=True)
    for root, p in found[:2000]:
        target = dest / root.name / p.relative_to(root)
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            shutil.copy2(p, target)
        except OSError:
            continue
    out = {"device_log": dest, "msaicerr": None}
    tool = msaicerr_command()
    if tool:
        res_file = dest / "msaicerr.txt"
        try:
            r = subprocess.run([*tool, "-p", str(dest)], capture_output=True, text=True, timeout=600)
            res_file.write_text(r.stdout + r.stderr)
        except (OSError, subprocess.SubprocessError) as e:
            res_file.write_text(f"msaicerr did not finish: {type(e).__name__}: {e}\n")
        out["msaicerr"] = res_file
    return out


def msaicerr_command() -> list[str] | None:
    """CANN's AI core error analyser: ``msaicerr`` on PATH, else ``msaicerr.py`` in the toolkit."""
    exe = shutil.which("msaicerr")
    if exe:
        return [exe]
    home = os.environ.get("ASCEND_HOME_PATH")
    if home:
        for rel in ("tools/msaicerr/msaicerr.py", "toolkit/tools/msaicerr/msaicerr.py"):
            p = Path(home) / rel
            if p.is_file():
                return [sys.executable, str(p)]
    return None
