#!/usr/bin/env python3
"""Graph-stable ``auto`` replays (GPU): the default work-item capacity against another one, and the
eager plan, at the same batches.

A graph-stable plan's grid is its capacity (``splitkv_common.plan.graph_capacity``), and where the
policy leaves the split to the planner (``auto`` on a GPU profile) the capacity also bounds ``auto``'s
choice. Per point (Hq 32 / Hkv 8 / D 128, bf16, page 16, shuffled pages): three wrappers planned for
the same lengths, each captured in a CUDA graph around ``run()`` alone (the plan copied before):

* ``default``: graph-stable with the default capacity;
* ``against``: graph-stable with ``--against`` work items per unit (``max_work_items =
  min(B x Hkv x max_splits, max(2 x B x Hkv, N x units))``; 16 was the default until the plan's copy
  per step was measured);
* ``eager``: the plan made without a capacity.

Timing: each replay after a read of a 512 MiB buffer (an L2 flush), bracketed by CUDA events; three
interleaved passes of ``--reps`` replays each, median. Outputs: ``graph_capacity.json`` and
``graph_capacity.md`` in ``--out``.

    python scripts/bench_graph_capacity.py --out OUT/capacity
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
from splitkv_common.optional import require  # noqa: E402

torch = require("torch", "scripts/bench_graph_capacity.py")
require("triton", "scripts/bench_graph_capacity.py")

from cuda_ref.wrapper import DecodeWrapper  # noqa: E402
from splitkv_common.devices import get_profile  # noqa: E402
from splitkv_common.provenance import provenance, provenance_markdown  # noqa: E402

HQ, HKV, D, PAGE = 32, 8, 128, 16
# B x L uniform, or "r<B>" ragged lengths drawn in [512, L): where a capacity of 4 or 8 per unit changes
# auto's choice (B 2-24 at 16k-512k tokens) and where it changes only the padding
POINTS = "1x16384,16x8192,32x8192,3x65536,6x32768,12x16384,24x16384,16x131072,8x262144,2x524288," \
         "r16x131072,r12x32768,r8x32768,r24x16384,r32x8192"


def parse(point: str):
    b, _, n = point.partition("x")
    ragged = b.startswith("r")
    return int(b.lstrip("r")), int(n), ragged


def capacity(B: int, per_unit: int) -> int:
    prof = get_profile("h200")
    return min(B * HKV * prof.max_splits, max(2 * B * HKV, per_unit * prof.units))


def measure(B: int, L: int, ragged: bool, per_unit: int, reps: int, flush, sink) -> dict:
    dev = flush.device
    seq = np.random.default_rng(0).integers(512, L, B) if ragged else np.full(B, L)
    pages = -(-int(seq.max()) // PAGE)
    k = torch.randn((B * pages, PAGE, HKV, D), device=dev, dtype=torch.bfloat16)
    v = torch.randn_like(k)
    bt = torch.randperm(B * pages, device=dev, dtype=torch.int32).reshape(B, pages)
    q = torch.randn((B, HQ, D), device=dev, dtype=torch.bfloat16)
    seq_d = torch.tensor(seq, dtype=torch.int32, device=dev)
    qsl = torch.arange(B + 1, dtype=torch.int32, device=dev)
    row = dict(batch=B, context=L, ragged=ragged)
    graphs, outs, keep = {}, {}, []
    for name, stable, mwi in (("default", True, None), ("against", True, capacity(B, per_unit)),
                              ("eager", False, None)):
        w = DecodeWrapper(HQ, HKV, D, PAGE, dtype=torch.bfloat16, device=dev, policy="auto", graph_stable=stable,
                          max_work_items=mwi)
        plan = w.plan(seq)
        for _ in range(2):   # compile and warm up outside the capture
            w.run(q, k, v, bt, seq_d, qsl)
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            out, _ = w.run(q, k, v, bt, seq_d, qsl)
        g.replay()
        torch.cuda.synchronize()
        outs[name] = out.clone()
        graphs[name] = g
        keep.append(w)
        row[name] = dict(items=int(plan.num_items), valid_items=int(plan.num_valid_items),
                         split_tokens=int(plan.split_tokens))
    times = {n: [] for n in graphs}
    for _ in range(3):   # interleaved passes
        for name, g in graphs.items():
            xs = []
            for _ in range(reps):
                torch.sum(flush, dim=0, out=sink)
                e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                e0.record()
                g.replay()
                e1.record()
                e1.synchronize()
                xs.append(e0.elapsed_time(e1) * 1e3)
            times[name].append(xs)
    for name, passes in times.items():
        row[name]["us"] = round(statistics.median(x for p in passes for x in p), 2)
        row[name]["passes_us"] = [round(statistics.median(p), 1) for p in passes]
    row["default_over_against"] = round(row["default"]["us"] / row["against"]["us"], 3)
    row["default_bits_equal_eager"] = bool(torch.equal(outs["default"], outs["eager"]))
    return row


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--points", default=POINTS, help="B x L, comma-separated; r<B>x<L>: lengths drawn in [512, L)")
    ap.add_argument("--against", type=int, default=16, help="work items per unit of the other capacity")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--out", default="graph_capacity_out")
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("error: bench_graph_capacity.py times CUDA graphs: no GPU here")
    dev = torch.device("cuda")
    flush = torch.ones(512 * 2**20 // 4, dtype=torch.float32, device=dev)
    sink = torch.empty((), dtype=torch.float32, device=dev)
    rows = []
    for p in a.points.split(","):
        rows.append(measure(*parse(p), a.against, a.reps, flush, sink))
        print(json.dumps(rows[-1]), flush=True)
        torch.cuda.empty_cache()
    res = dict(provenance=provenance(), against_per_unit=a.against, rows=rows)
    lines = ["# Graph-stable capacity (GPU)", ""] + provenance_markdown(res["provenance"]) + [
        "", f"Replay µs (median of three interleaved passes of {a.reps}, read flush), work items (capacity) and "
        f"`auto`'s split tokens; `against`: {a.against} work items per unit.", "",
        "| B | context | default µs | items, split | passes | against µs | items, split | passes | eager µs | "
        "split | default / against | default bits = eager |",
        "|---|---:|---:|---|---|---:|---|---|---:|---:|---:|---|"]
    for r in rows:
        d, o, e = r["default"], r["against"], r["eager"]
        lines.append(f"| {r['batch']}{' ragged' if r['ragged'] else ''} | {r['context']:,} | {d['us']} | "
                     f"{d['items']}, {d['split_tokens']} | {d['passes_us']} | {o['us']} | {o['items']}, "
                     f"{o['split_tokens']} | {o['passes_us']} | {e['us']} | {e['split_tokens']} | "
                     f"{r['default_over_against']} | {r['default_bits_equal_eager']} |")
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "graph_capacity.json"), "w") as f:
        json.dump(res, f, indent=1)
    text = "\n".join(lines)
    with open(os.path.join(a.out, "graph_capacity.md"), "w") as f:
        f.write(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
