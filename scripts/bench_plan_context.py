#!/usr/bin/env python3
"""A captured host plan's ``plan()`` between other host work, on the CPU: does the Python around the C
planner slow down when other work runs between two steps? And the device-planned step's one host
call, the write of the batch's lengths (``StepInputs(in_graph=True).write()``), in C and in Python.

``DecodeWrapper(plan_in_graph=True, graph_stable=True)`` on the CPU (the "device" is the CPU: the
plan's copy is a memcpy, there is no event to query), refreshed by one C call per ``plan()``
(``DecodeWrapper.refresh_parts``). Per batch size, the median host µs of ``plan()`` and of its C
planner over ``--reps`` steps (lengths uniform 512-8192, new every step), with between two steps:

* ``nothing`` (a tight loop: every cache warm);
* ``torch ops``: 200 small torch additions on the CPU (the Python and dispatcher work of a model's
  layers between two decode steps);
* ``64 MiB read``: a 64 MiB NumPy sum (every cache level, and the TLB, flushed: the worst case).

After the same work again, each step also times the lengths write of a ``StepInputs(B, in_graph=True)``:
by its C ``LengthsWriter`` and by its Python path (``StepInputs._write``), in alternate steps.

Writes ``plan_context.json`` (with provenance) and ``plan_context.md`` to ``--out``.

    python scripts/bench_plan_context.py --out results/plan_context
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, ".."))
from splitkv_common.optional import require  # noqa: E402
from splitkv_common.provenance import provenance, provenance_markdown  # noqa: E402

torch = require("torch", "scripts/bench_plan_context.py")

from bench_decode import save_outputs  # noqa: E402


def between_steps(kind: str):
    """The work run before each timed ``plan()``."""
    if kind == "nothing":
        return lambda: None
    if kind == "torch ops":
        xs = [torch.ones(64) for _ in range(8)]

        def ops():
            a = xs[0]
            for j in range(200):
                a = a + xs[j % 8]
        return ops
    if kind == "64 MiB read":
        junk = np.ones(8 << 20)
        return lambda: junk.sum()
    raise ValueError(kind)


KINDS = ("nothing", "torch ops", "64 MiB read")


def measure(B: int, kind: str, reps: int) -> dict:
    from cuda_ref.wrapper import DecodeWrapper, StepInputs

    w = DecodeWrapper(32, 8, 128, 16, dtype=torch.bfloat16, device="cpu", profile="h200", policy="auto",
                      graph_stable=True, plan_in_graph=True)
    ql = np.ones(B, np.int64)
    rng = np.random.default_rng(B)
    seqs = [rng.integers(512, 8193, B) for _ in range(16)]
    work = between_steps(kind)
    inputs = StepInputs(B, "cpu", in_graph=True)
    qsl = np.arange(B + 1, dtype=np.int32)
    write = {"C": inputs.write if inputs._writer is not None else None, "Python": inputs._write}
    write_us: dict = {"C": [], "Python": []}
    plan_us, c_us, refreshed = [], [], 0
    for i in range(reps + 20):
        work()
        n = w.plan_refreshes
        t0 = time.perf_counter()
        w.plan(seqs[i % 16], q_lens=ql)
        t1 = time.perf_counter()
        w.copy_plan()
        if i >= 20 and w.plan_refreshes > n:
            refreshed += 1
            plan_us.append((t1 - t0) * 1e6)
            c_us.append(w.refresh_parts["plan"])
        way = ("C", "Python")[i % 2]
        if write[way] is not None:
            work()
            t0 = time.perf_counter()
            write[way](seqs[i % 16], qsl)
            t1 = time.perf_counter()
            if i >= 20:
                write_us[way].append((t1 - t0) * 1e6)
    med = lambda xs: statistics.median(xs) if xs else None  # noqa: E731
    return dict(batch=B, between=kind, steps=reps, refreshed=refreshed, plan_us=med(plan_us), c_plan_us=med(c_us),
                write_c_us=med(write_us["C"]), write_python_us=med(write_us["Python"]))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 16, 64])
    ap.add_argument("--reps", type=int, default=300)
    ap.add_argument("--out", default="bench_out/plan_context")
    a = ap.parse_args(argv)
    if a.reps < 1 or min(a.batch) < 1:
        ap.error("--reps and every --batch must be at least 1")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        rows = [measure(B, kind, a.reps) for B in a.batch for kind in KINDS]
    finally:
        torch.set_num_threads(threads)
    info = provenance()
    fmt = lambda x: "-" if x is None else f"{x:.2f}"  # noqa: E731
    lines = ["# A captured plan's plan() between other host work (CPU)", ""] + provenance_markdown(info) + [
        f"Median host µs over {a.reps} steps, `DecodeWrapper(plan_in_graph=True)` on the CPU, Hq 32 / Hkv 8 / "
        "D 128, page 16, `auto`, lengths uniform 512-8192.", "",
        "| B | between two steps | steps refreshed in one C call | plan() µs | of which the C planner µs | "
        "lengths write µs, C | lengths write µs, Python |",
        "|---:|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['batch']} | {r['between']} | {r['refreshed']} / {r['steps']} | {fmt(r['plan_us'])} | "
                     f"{fmt(r['c_plan_us'])} | {fmt(r['write_c_us'])} | {fmt(r['write_python_us'])} |")
    print(save_outputs(a.out, "plan_context", dict(meta=info, rows=rows), lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
