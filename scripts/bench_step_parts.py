#!/usr/bin/env python3
"""What a captured decode step's parts cost on this host (GPU): graph nodes, host calls, and the
host-planned step in a tight loop.

1. **Graph nodes**: one CUDA graph per variant around the same ~20 µs of GPU work (a 2048^3 bf16
   matmul), with host-to-device copy nodes from pinned memory (40 B, 10 KB, 42 KB: the lengths, and a
   graph-stable plan at B 1 and B 16) and external event-record nodes; the wall time of a replay and
   a synchronize. Host calls beside them: an event query and record, a write of 16 ints into pinned
   memory (each with one synchronize, which ``sync`` times alone).
2. **The captured host-planned step** (``DecodeWrapper(plan_in_graph=True)`` over
   ``planned_seq_lens``, the graphs of ``bench_serving.py``): ``plan()`` and one replay, a bare replay,
   ``plan()`` alone, in a tight loop (nothing else between steps, so the host's caches stay warm;
   ``bench_serving.py --fixed-batches`` runs other graphs between steps). Lengths uniform 512-8192.

Medians of ``--reps`` after a warm-up; ``--out DIR`` gets ``step_parts.json`` and ``step_parts.md``.

    python scripts/bench_step_parts.py --out OUT/parts
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

torch = require("torch", "scripts/bench_step_parts.py")
require("triton", "scripts/bench_step_parts.py")

import bench_serving  # noqa: E402
from bench_decode import save_outputs  # noqa: E402
from splitkv_common.provenance import provenance, provenance_markdown  # noqa: E402

NODES = {   # variant -> its nodes before the work: ("copy", int32 entries) or ("event",)
    "work alone": [],
    "copy 40 B": [("copy", 10)],
    "copy 10 KB": [("copy", 2572)],
    "copy 42 KB": [("copy", 10600)],
    "copy 10 KB + event": [("copy", 2572), ("event",)],
    "copy 10 KB + copy 40 B": [("copy", 2572), ("copy", 10)],
    "copy 10 KB + event + copy 40 B + event": [("copy", 2572), ("event",), ("copy", 10), ("event",)],
}


def median_us(fn, reps: int, warmup: int = 20) -> float:
    """Median wall µs of ``fn(i)`` followed by a synchronize."""
    xs = []
    for i in range(warmup + reps):
        torch.cuda.synchronize()
        t = time.perf_counter()
        fn(i)
        torch.cuda.synchronize()
        if i >= warmup:
            xs.append((time.perf_counter() - t) * 1e6)
    return round(statistics.median(xs), 1)


def graph_nodes(reps: int) -> dict:
    dev = torch.device("cuda")
    x = torch.randn(2048, 2048, device=dev, dtype=torch.bfloat16)
    out = {}
    for name, nodes in NODES.items():
        copies = [(torch.zeros(n[1], dtype=torch.int32, pin_memory=True), torch.empty(n[1], dtype=torch.int32,
                   device=dev)) for n in nodes if n[0] == "copy"]
        events = [torch.cuda.Event(external=True) for n in nodes if n[0] == "event"]

        def body():
            c = iter(copies)
            e = iter(events)
            for n in nodes:
                if n[0] == "copy":
                    h, d = next(c)
                    d.copy_(h, non_blocking=True)
                else:
                    next(e).record()
            torch.mm(x, x)

        body()
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            body()
        out[name] = median_us(lambda i: g.replay(), reps)
    ev = torch.cuda.Event()
    ev.record()
    torch.cuda.synchronize()
    pinned = torch.zeros(64, dtype=torch.int32, pin_memory=True).numpy()
    vals = np.arange(16, dtype=np.int32)
    out["host: sync"] = median_us(lambda i: None, reps)
    out["host: event query + sync"] = median_us(lambda i: ev.query(), reps)
    out["host: event record + sync"] = median_us(lambda i: ev.record(), reps)
    out["host: 16 ints into pinned memory + sync"] = median_us(lambda i: pinned.__setitem__(slice(0, 16), vals), reps)
    return out


def captured_steps(batches, reps: int) -> dict:
    args = argparse.Namespace(spec=0, kv_pool_gb=4.0, hq=32, hkv=8, head_dim=128, page=16, dtype="bf16",
                              policy="auto", profile="h200", seed=0)
    rig = bench_serving.Rig(args, torch.device("cuda"), max(batches), 9000)
    out = {}
    for B in batches:
        gi = bench_serving.Graphed(rig, B, True, in_graph=True)
        rng = np.random.default_rng(B)
        seqs = [rng.integers(512, 8192, B) for _ in range(16)]
        ql = np.ones(B, np.int64)
        w, g = gi.w, gi.graph
        r = out[B] = {}
        r["step"] = median_us(lambda i: (w.plan(seqs[i % 16], q_lens=ql), g.replay()), reps)
        r["bare replay"] = median_us(lambda i: g.replay(), reps)
        r["plan() + sync"] = median_us(lambda i: w.plan(seqs[i % 16], q_lens=ql), reps)
        r["step / bare replay"] = round(r["step"] / r["bare replay"], 3)
        r["plans in one C call"] = w.plan_refreshes
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", default="1,16,64,256")
    ap.add_argument("--reps", type=int, default=300)
    ap.add_argument("--out", default="step_parts_out")
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("error: bench_step_parts.py times CUDA graphs: no GPU here")
    res = dict(provenance=provenance(), graph_nodes=graph_nodes(a.reps),
               captured_step=captured_steps([int(b) for b in a.batches.split(",")], a.reps))
    lines = ["# A captured step's parts (GPU)", ""] + provenance_markdown(res["provenance"]) + [
        "", "## Graph nodes around ~20 µs of work, and host calls (wall µs with one synchronize, median)", "",
        "| variant | µs |", "|---|---:|"]
    lines += [f"| {k} | {v} |" for k, v in res["graph_nodes"].items()]
    lines += ["", "## The captured host-planned step in a tight loop (µs, median)", "",
              "| B | plan() + replay | bare replay | plan() + sync | step / bare replay | plans in one C call |",
              "|---:|---:|---:|---:|---:|---:|"]
    for B, r in res["captured_step"].items():
        lines.append(f"| {B} | {r['step']} | {r['bare replay']} | {r['plan() + sync']} | {r['step / bare replay']} | "
                     f"{r['plans in one C call']} |")
    print(save_outputs(a.out, "step_parts", res, lines))

if __name__ == "__main__":
    main()
