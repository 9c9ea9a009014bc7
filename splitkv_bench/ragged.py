"""Ragged decode batches on a CUDA GPU: one batch, every way our wrapper can run it, side by side.

Per point (batch size, KV lengths drawn uniformly from a range; Hq 32 / Hkv 8, D 128, bf16, page 16,
one query per request, pages shuffled) the kernels' time, each captured in a CUDA graph and timed
after an L2 read flush (``splitkv_bench.gpu.Timer``), in interleaved rounds (median over rounds):

* ``auto``, eager plan: the planner's item order (plans of more than 4 items per unit put the
  longest requests first) and the same plan in batch order (its items stably sorted by request);
* ``auto``, graph-stable plan (padded to its capacity, ``splitkv_common.plan.graph_capacity``: what a
  captured decode step replays);
* ``size:S``, eager and graph-stable; ``size:S`` planned on the device (``device_plan=True``).

Outputs are checked bitwise between the orders and between eager and graph-stable ``auto``
(``same_bits``). Writes ``ragged.json`` (with provenance) and ``ragged.md`` (the table) to ``--out``.

    python -m splitkv_bench ragged --out OUT
    python -m splitkv_bench ragged --points 128:512-8192,256:128-2048 --rounds 3 --out OUT
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

from splitkv_common.optional import require

torch = require("torch", "python -m splitkv_bench ragged")
require("triton", "python -m splitkv_bench ragged")

from splitkv_bench.gpu import PAGE, Timer  # noqa: E402
from splitkv_bench.output import save_outputs  # noqa: E402
from cuda_ref.wrapper import DecodeWrapper  # noqa: E402
from splitkv_common.provenance import provenance  # noqa: E402

HQ, HKV, D = 32, 8, 128
DEFAULT_POINTS = "16:512-8192,64:512-8192,128:512-8192,256:512-8192,128:128-2048,256:128-2048"
VARIANTS = ("auto", "auto batch order", "auto graph-stable", "size eager", "size graph-stable", "size device-planned")


def parse_points(text: str) -> list[tuple[int, int, int]]:
    """``B:lo-hi,...`` -> ``[(B, lo, hi)]`` (lengths uniform in ``[lo, hi]``)."""
    out = []
    for part in text.split(","):
        b, rng = part.split(":")
        lo, hi = rng.split("-")
        out.append((int(b), int(lo), int(hi)))
    return out


def batch_order(plan) -> None:
    """Put ``plan``'s valid items in batch order (a stable sort by request), in place."""
    W = plan.num_valid_items
    it = plan.items
    it[:, :W] = it[:, np.argsort(it[0, :W], kind="stable")]


def runner(variant: str, lens, split: int, tensors):
    """``(run, wrapper)`` of one variant for the batch ``lens`` (host) and its device tensors."""
    q, k, v, bt, seq, qsl = tensors
    kw = dict(dtype=torch.bfloat16)
    if variant.startswith("auto"):
        w = DecodeWrapper(HQ, HKV, D, PAGE, graph_stable=variant.endswith("graph-stable"), **kw)
    elif variant == "size device-planned":
        w = DecodeWrapper(HQ, HKV, D, PAGE, policy=f"size:{split}", device_plan=True, max_q_len=1, **kw)
    else:
        w = DecodeWrapper(HQ, HKV, D, PAGE, policy=f"size:{split}", graph_stable=variant.endswith("graph-stable"),
                          **kw)
    if not w.device_plan:
        plan = w.make_plan(lens)
        if variant == "auto batch order":
            batch_order(plan)
        w.set_plan(plan, validate=True)
    return (lambda: w.run(q, k, v, bt, seq, qsl)), w


def measure(B: int, lo: int, hi: int, split: int, rounds: int, timer: Timer, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    lens = rng.integers(lo, hi + 1, B)
    pages = -(-hi // PAGE)
    g = torch.Generator(device="cuda").manual_seed(seed)
    k = torch.randn((B * pages, PAGE, HKV, D), generator=g, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    bt = torch.randperm(B * pages, generator=g, device="cuda").to(torch.int32).view(B, pages)
    q = torch.randn((B, HQ, D), generator=g, device="cuda", dtype=torch.bfloat16)
    seq = torch.tensor(lens, dtype=torch.int32, device="cuda")
    qsl = torch.arange(B + 1, dtype=torch.int32, device="cuda")
    tensors = (q, k, v, bt, seq, qsl)
    times = {name: [] for name in VARIANTS}
    outs, info = {}, {}
    for _ in range(rounds):
        for name in VARIANTS:
            run, w = runner(name, lens, split, tensors)
            out, _ = run()
            outs.setdefault(name, out.clone())
            times[name].append(timer(run))
            p = w.host_plan
            info[name] = dict(items=None if p is None else p.num_valid_items,
                              grid=None if w.last_launch is None or w.last_launch.stage1 is None
                              else w.last_launch.stage1.grid[0],
                              split=None if p is None else p.split_tokens)
    same = {"orders": bool(torch.equal(outs["auto"], outs["auto batch order"])),
            "graph_stable": bool(torch.equal(outs["auto"], outs["auto graph-stable"])),
            "size": bool(torch.equal(outs["size eager"], outs["size graph-stable"]))}
    return dict(batch=B, lens=[lo, hi], split=split, rounds=rounds, same_bits=same, plans=info,
                us={n: float(np.median(t)) for n, t in times.items()}, all_us=times)


def table(res: list[dict]) -> str:
    head = "| B | lengths | " + " | ".join(VARIANTS) + " | items (auto) | bits equal |"
    lines = [head, "|" + "---|" * (len(VARIANTS) + 4)]
    for r in res:
        lo, hi = r["lens"]
        cells = " | ".join(f"{r['us'][n]:,.1f}" for n in VARIANTS)
        eq = "yes" if all(r["same_bits"].values()) else "NO: " + str(r["same_bits"])
        lines.append(f"| {r['batch']} | {lo}-{hi} | {cells} | {r['plans']['auto']['items']} | {eq} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--points", default=DEFAULT_POINTS, help="B:lo-hi,... (default: %(default)s)")
    ap.add_argument("--split", type=int, default=512, help="the size:S policy's split (default 512)")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds per point (median kept)")
    ap.add_argument("--iters", type=int, default=40, help="timed replays per measurement")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("splitkv_bench ragged: needs a CUDA GPU", file=sys.stderr)
        return 2
    timer = Timer(iters=args.iters)
    res = []
    for i, (B, lo, hi) in enumerate(parse_points(args.points)):
        r = measure(B, lo, hi, args.split, args.rounds, timer, args.seed + i)
        res.append(r)
        print(f"B {B} {lo}-{hi}: " + ", ".join(f"{n} {r['us'][n]:.1f}" for n in VARIANTS), flush=True)
    prov = provenance(argv if argv is None else [sys.argv[0], *argv])
    md = ["# Ragged decode batches (GPU)", "",
          f"- device: {prov['device']}", f"- command: `{prov['command']}`",
          f"- commit: {(prov['git'] or {}).get('commit')}",
          f"- Hq {HQ} / Hkv {HKV} / D {D} / bf16 / page {PAGE}; kernel µs, median of {args.rounds} interleaved "
          f"rounds, each a median of {args.iters} graph replays after an L2 read flush; `size` = size:{args.split}",
          "", table(res), ""]
    print(save_outputs(args.out, "ragged", dict(provenance=prov, points=res,
                                                shape=dict(hq=HQ, hkv=HKV, head_dim=D, page=PAGE, dtype="bf16")), md))
    return 0
