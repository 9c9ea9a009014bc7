"""The floor of ``splitkv_bench/decode.py``'s method: what a kernel that only *reads* a point's KV bytes takes,
beside our call and cuDNN's (GPU only; a measurement, not a backend).

The issue's batch-1 target (B1 x 16k at 70 % of the copy ceiling, i.e. 22.5 µs on a 4.28 TB/s
H200) is a share of a 2 GiB copy's bandwidth, but a point's 67 MB are read by kernels that ramp up,
drain and are timed through a graph replay after a flush. This times, in the same ``Timer`` (one CUDA
graph a call, a read flush before each timed replay, median):

* ``empty``: one kernel that stores one value (the method's launch floor), ``empty2``: two in a row;
* ``read``: a Triton kernel that reads the point's K and V bytes once from two contiguous buffers
  (no page table, no math beyond a sum) at each of several grids and tile shapes, and the fastest
  of them (``read_best``): the best a streaming read reached at this size in this method;
* ``torch_sum``: ``k.sum()`` then ``v.sum()`` of the same buffers; ``copy``: a copy of half the bytes
  (read + written = the point's bytes, the ceiling's own operation at this size);
* ours (``auto``; stage 1 alone; and ``--variants`` of split policy and stage-1 configuration) and
  cuDNN on the bench's paged / contiguous data.

Each is also given as a share of the 2 GiB copy ceiling (``copy_ceiling``) measured in the same run::

    python -m splitkv_bench read-floor --out DIR [--points B1x2k,B1x16k] \\
        [--variants size:384/n64w4s5,size:1024/n128w8s6c]

Writes ``read_floor.json`` and ``read_floor.md`` to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time

from splitkv_common.optional import require

torch = require("torch", "python -m splitkv_bench read-floor")
triton = require("triton", "python -m splitkv_bench read-floor")
import triton.language as tl  # noqa: E402

from splitkv_bench.gpu import (Timer, contiguous_kv, copy_ceiling, interleaved, kv_bytes, make_point,  # noqa: E402
                               ours, parse_points, sdpa_peers)
from splitkv_bench.output import save_outputs  # noqa: E402

# (programs per SM, elements a load, loads in flight a thread's iteration, warps, stages)
READ_GRID = [(p, blk, u, w, s) for p in (1, 2, 4, 8) for blk, w in ((2048, 4), (4096, 8)) for u in (2, 4)
             for s in (1, 3)]


@triton.jit
def _empty_kernel(OUT):
    tl.store(OUT, 1.0)


@triton.jit
def _read_kernel(K, V, OUT, per_prog, BLOCK: tl.constexpr, UNROLL: tl.constexpr):
    """Program ``p`` sums ``K`` and ``V`` (bf16, flat) over ``[p * per_prog, (p + 1) * per_prog)``
    (``per_prog`` a multiple of ``BLOCK * UNROLL``), ``UNROLL`` loads of ``BLOCK`` elements of each
    issued before they are added; stores the float32 sum to ``OUT[p]``."""
    pid = tl.program_id(0)
    base = pid.to(tl.int64) * per_prog
    offs = tl.arange(0, BLOCK)
    acc = tl.zeros([BLOCK], tl.float32)
    for i in range(0, per_prog, BLOCK * UNROLL):
        for u in tl.static_range(UNROLL):
            o = base + i + u * BLOCK + offs
            acc += tl.load(K + o).to(tl.float32) + tl.load(V + o).to(tl.float32)
    tl.store(OUT + pid, tl.sum(acc, 0))


def read_launch(k, v, sms: int, per_sm: int, block: int, unroll: int, warps: int, stages: int):
    """A callable that reads all of ``k`` and ``v`` (flat bf16, same length) once with
    ``sms * per_sm`` programs (fewer where the length does not split so), or None when no grid of
    whole ``block * unroll`` steps covers it; returns ``(callable, programs)``."""
    n, step = k.numel(), block * unroll
    if n % step:
        return None, 0
    steps = n // step
    progs = min(sms * per_sm, steps)
    while steps % progs:
        progs -= 1
    out = torch.empty(progs, dtype=torch.float32, device=k.device)
    per = n // progs

    def run():
        _read_kernel[(progs,)](k, v, out, per, BLOCK=block, UNROLL=unroll, num_warps=warps, num_stages=stages)
        return out
    return run, progs


def parse_variants(text: str) -> list[tuple]:
    """``size:384/n64w4s5,auto/n128w8s6c`` -> ``[(policy, KernelConfig), ...]``; raises ``ValueError``
    naming the variant it cannot read."""
    from cuda_ref.launch import KernelConfig
    out = []
    for item in filter(None, (x.strip() for x in text.split(","))):
        policy, _, cfg = item.partition("/")
        m = re.fullmatch(r"n(\d+)w(\d+)s(\d+)(c?)", cfg)
        if not policy or not m:
            raise ValueError(f"--variants: {item!r} is not POLICY/n<tokens>w<warps>s<stages>[c], e.g. size:384/n64w4s5")
        out.append((policy, KernelConfig(block_n=int(m[1]), num_warps=int(m[2]), num_stages=int(m[3]),
                                         column_sum=bool(m[4]))))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--points", default="B1x2k,B1x4k,B1x16k,B1x64k,B16x1k")
    ap.add_argument("--variants", default="", help="extra runs of ours: POLICY/CONFIG,... (e.g. size:384/n64w4s5)")
    ap.add_argument("--max-splits", type=int, default=None,
                    help="the variants' cap on splits a request (default: the profile's, 64)")
    ap.add_argument("--iters", type=int, default=40)
    args = ap.parse_args(argv)
    variants = parse_variants(args.variants)
    os.makedirs(args.out, exist_ok=True)
    timer = Timer(iters=args.iters, flush="read")
    ceiling = copy_ceiling(timer)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    one = torch.empty(1, dtype=torch.float32, device="cuda")
    g1 = timer.graph(lambda: _empty_kernel[(1,)](one))
    g2 = timer.graph(lambda: (_empty_kernel[(1,)](one), _empty_kernel[(1,)](one)))
    t = interleaved(timer, {"empty": g1, "empty2": g2})
    floor = {n: min(x) for n, x in t.items()}
    rows = []
    for B, ctx, hq, hkv, D, dt in parse_points(args.points):
        nbytes = kv_bytes(B, ctx, hkv, D, dt)
        q, k, v, bt, seq = make_point(B, ctx, hq, hkv, D, torch.bfloat16)
        kc, vc = contiguous_kv(k, bt, B, ctx), contiguous_kv(v, bt, B, ctx)
        kf, vf = k.reshape(-1), v.reshape(-1)
        row = dict(point=f"B{B}x{ctx // 1024}k" + ("" if (hq, hkv, D) == (32, 8, 128) else f"@{hq}/{hkv}/{D}"),
                   kv_bytes=nbytes, **{f"{n}_us": x for n, x in floor.items()})
        want = float(kf.float().sum() + vf.float().sum())
        reads = {}
        for p, blk, u, w, s in READ_GRID:
            fn, progs = read_launch(kf, vf, sms, p, blk, u, w, s)
            if fn is None:
                continue
            got = float(fn().sum())
            if abs(got - want) > 1e-3 * max(1.0, abs(want)) + 1e-2 * (nbytes / 2) ** 0.5:
                raise SystemExit(f"read kernel {p, blk, u, w, s}: sum {got} against {want}")
            reads[f"read_p{progs}_b{blk}_u{u}_w{w}_s{s}"] = timer.graph(fn)
        half = torch.empty(nbytes // 4, dtype=torch.bfloat16, device="cuda")
        src = kf[: half.numel()]
        named = dict(reads, torch_sum=timer.graph(lambda: (kf.sum(), vf.sum())),
                     copy=timer.graph(lambda: half.copy_(src)))
        t = {n: min(x) for n, x in interleaved(timer, named, passes=2).items()}
        row["reads_us"] = {n: x for n, x in t.items() if n.startswith("read_")}
        best = min(row["reads_us"], key=row["reads_us"].get)
        row["read_best"], row["read_best_us"] = best, row["reads_us"][best]
        row["torch_sum_us"], row["copy_us"] = t["torch_sum"], t["copy"]
        row["ours_us"] = min(ours(timer, q, k, v, bt, seq, "auto")[0] for _ in range(2))
        row["ours_stage1_us"] = ours(timer, q, k, v, bt, seq, "auto", stage1_only=True)[0]
        for policy, cfg in variants:
            try:
                us, plan, _ = ours(timer, q, k, v, bt, seq, policy, config=cfg, max_splits=args.max_splits)
                row[f"ours {policy}/{cfg}_us"], row[f"ours {policy}/{cfg}_items"] = us, int(plan.num_valid_items)
            except Exception as e:  # noqa: BLE001 - a configuration that does not compile here is a result
                row[f"ours {policy}/{cfg}_error"] = f"{type(e).__name__}: {str(e)[:160]}"
        row.update({(n if n.endswith("_error") else n + "_us"): x for n, x in sdpa_peers(timer, q, kc, vc).items()})
        for key in [x for x in row if x.endswith("_us") and isinstance(row[x], float) and not x.startswith("empty")]:
            row[key[:-3] + "_pct"] = 100 * nbytes / (row[key] * 1e-6) / (ceiling * 1e9)
        rows.append(row)
        print(json.dumps({x: y for x, y in row.items() if x != "reads_us"}), flush=True)
        del q, k, v, kc, vc, kf, vf, half, src, named, reads
        torch.cuda.empty_cache()
    res = dict(device=torch.cuda.get_device_name(), ceiling_gbps=ceiling, rows=rows,
               command=" ".join(sys.argv[:1] + (argv if argv is not None else sys.argv[1:])))
    cols = ["empty", "empty2", "read_best", "torch_sum", "copy", "ours", "ours_stage1", "sdpa_cudnn"] + \
        [f"ours {p}/{c}" for p, c in variants]
    lines = [f"# The method's floor ({res['device']})", "", f"- command: `{res['command']}`",
             f"- date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}", "",
             f"µs (and % of the {ceiling:.0f} GB/s copy ceiling for the point's KV bytes), median of graph replays "
             "after a read flush; read_best: the fastest streaming read of the same bytes (grid in the JSON)", "",
             "| point | MB | " + " | ".join(cols) + " | read_best grid |", "|" + "---|" * (len(cols) + 3)]
    for r in rows:
        cells = [r["point"], f"{r['kv_bytes'] / 1e6:.0f}"]
        for c in cols:
            us = r.get(f"{c}_us")
            pct = r.get(c + "_pct")
            cells.append("-" if us is None else f"{us:.1f}" + ("" if pct is None else f" ({pct:.0f} %)"))
        cells.append(r["read_best"])
        lines.append("| " + " | ".join(cells) + " |")
    print(save_outputs(args.out, "read_floor", res, lines))
    return 0
