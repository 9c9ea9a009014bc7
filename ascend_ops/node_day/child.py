"""What a watchdog child runs: ``python -m ascend_ops.node_day.child JOB.json RESULT.json``.

The job (a JSON object) names its ``kind``: ``identify``, ``smoke``, ``determinism``, ``probe``; and,
for the watchdog's own tests, ``sleep`` (``seconds``) and ``raise`` (``message``). The result file
gets ``{"ok": true, "item": ...}`` or ``{"ok": false, "message": ..., "traceback": ...}``; the exit
status is 0 or 1 accordingly. Anything the job prints goes to the job's log.
"""

from __future__ import annotations

import json
import sys
import time
import traceback
from pathlib import Path


def run_job(job: dict) -> dict:
    kind = job.get("kind")
    mode = job.get("mode", "twin")
    if kind == "identify":
        from .identify import identify_npu, identify_twin

        return identify_twin(job["chip"]) if mode == "twin" else identify_npu()
    if kind in ("smoke", "determinism"):
        from . import smoke

        runner = smoke.make_runner(mode, job.get("profile"))
        if kind == "smoke":
            return smoke.run_smoke(job["case"], runner)
        return smoke.run_determinism(job["case"], runner, int(job["repeats"]), tuple(job.get("block_counts",
                                                                                      (1, 2, 8, "all"))),
                                     tuple(job.get("orders", (0,))))
    if kind == "probe":
        from . import probes

        L = probes.launcher(mode, job.get("profile") or "910b2", Path(job["lib"]) if job.get("lib") else None)
        s = probes.Settings(**job["settings"])
        return probes.get_probe(job["probe"]).run(L, s, job.get("results") or {})
    if kind == "sleep":
        time.sleep(float(job["seconds"]))
        return {"slept": float(job["seconds"])}
    if kind == "raise":
        raise RuntimeError(job.get("message", "planted error"))
    raise ValueError(f"job kind: unknown {kind!r}")


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        print("usage: python -m ascend_ops.node_day.child JOB.json RESULT.json", file=sys.stderr)
        return 2
    job = json.loads(Path(argv[0]).read_text())
    try:
        res = {"ok": True, "item": run_job(job)}
    except Exception as e:  # noqa: BLE001 - reported in the result, the parent decides
        traceback.print_exc()
        res = {"ok": False, "message": f"{type(e).__name__}: {e}"[:4000], "traceback": traceback.format_exc()[-8000:]}
    Path(argv[1]).write_text(json.dumps(res, indent=1, default=float))
    return 0 if res["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
