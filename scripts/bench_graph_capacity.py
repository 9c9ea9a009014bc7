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

Timing: ``bench_decode.Timer`` (a 10 ms warm-up, then ``--reps`` replays each after a read flush of
the L2, CUDA events, median) in three interleaved passes, and their median. Outputs:
``graph_capacity.json`` and ``graph_capacity.md`` in ``--out``.

    python scripts/bench_graph_capacity.py --out OUT/capacity
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, ".."))
from splitkv_common.optional import require  # noqa: E402

torch = require("torch", "scripts/bench_graph_capacity.py")
require("triton", "scripts/bench_graph_capacity.py")

from bench_decode import PAGE, Timer, batch_lengths, interleaved, make_point, save_outputs  # noqa: E402
from cuda_ref.wrapper import DecodeWrapper  # noqa: E402
from splitkv_common.devices import get_profile  # noqa: E402
from splitkv_common.provenance import provenance, provenance_markdown  # noqa: E402

HQ, HKV, D = 32, 8, 128
# B x L uniform, or "r<B>" ragged lengths drawn in [512, L): where a capacity of 4 or 8 per unit changes
# auto's choice (B 2-24 at 16k-512k tokens) and where it changes only the padding
POINTS = "1x16384,16x8192,32x8192,3x65536,6x32768,12x16384,24x16384,16x131072,8x262144,2x524288," \
         "r16x131072,r12x32768,r8x32768,r24x16384,r32x8192"


def capacity(B: int, per_unit: int) -> int:
    prof = get_profile("h200")
    return min(B * HKV * prof.max_splits, max(2 * B * HKV, per_unit * prof.units))


def measure(timer, point: str, per_unit: int) -> dict:
    B, L, ragged, seq = batch_lengths(point, 0)
    q, k, v, bt, _ = make_point(B, -(-int(seq.max()) // PAGE) * PAGE, HQ, HKV, D, torch.bfloat16)
    args = (q, k, v, bt, torch.tensor(seq, dtype=torch.int32, device="cuda"))
    row = dict(batch=B, context=L, ragged=ragged)
    replays, outs, keep = {}, {}, []   # keep: the wrappers own the buffers their graphs write
    for name, stable, mwi in (("default", True, None), ("against", True, capacity(B, per_unit)),
                              ("eager", False, None)):
        w = DecodeWrapper(HQ, HKV, D, PAGE, dtype=torch.bfloat16, device="cuda", policy="auto", graph_stable=stable,
                          max_work_items=mwi)
        plan = w.plan(seq)
        got = []   # run() returns the wrapper's own output buffer, which the replays write
        replays[name] = timer.graph(lambda w=w, got=got: got.append(w.run(*args)[0]))
        outs[name] = got[-1]
        keep.append(w)
        row[name] = dict(items=int(plan.num_items), valid_items=int(plan.num_valid_items),
                         split_tokens=int(plan.split_tokens))
    for name, passes in interleaved(timer, replays).items():
        row[name]["us"] = round(statistics.median(passes), 2)
        row[name]["passes_us"] = [round(x, 1) for x in passes]
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
    timer = Timer(iters=a.reps)
    rows = []
    for p in a.points.split(","):
        rows.append(measure(timer, p, a.against))
        print(json.dumps(rows[-1]), flush=True)
        torch.cuda.empty_cache()
    res = dict(provenance=provenance(), against_per_unit=a.against, rows=rows)
    lines = ["# Graph-stable capacity (GPU)", ""] + provenance_markdown(res["provenance"]) + [
        "", f"Replay µs (median of three interleaved passes, each the median of {a.reps}, read flush), work items "
        f"(capacity) and `auto`'s split tokens; `against`: {a.against} work items per unit.", "",
        "| B | context | default µs | items, split | passes | against µs | items, split | passes | eager µs | "
        "split | default / against | default bits = eager |",
        "|---|---:|---:|---|---|---:|---|---|---:|---:|---:|---|"]
    for r in rows:
        d, o, e = r["default"], r["against"], r["eager"]
        lines.append(f"| {r['batch']}{' ragged' if r['ragged'] else ''} | {r['context']:,} | {d['us']} | "
                     f"{d['items']}, {d['split_tokens']} | {d['passes_us']} | {o['us']} | {o['items']}, "
                     f"{o['split_tokens']} | {o['passes_us']} | {e['us']} | {e['split_tokens']} | "
                     f"{r['default_over_against']} | {r['default_bits_equal_eager']} |")
    print(save_outputs(a.out, "graph_capacity", res, lines))


if __name__ == "__main__":
    main()
