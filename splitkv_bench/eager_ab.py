"""Eager ``DecodeWrapper.run()`` host time, this tree against another, in one process, call by call.

A GPU host's timings drift by tens of percent within minutes, more than a host-side change moves
them, so two benchmark runs one after the other do not compare. This loads another tree's
``cuda_ref`` (``--old DIR``: the root of a checkout or ``git archive`` of another commit) beside this
one as ``cuda_ref_old``, launching this tree's kernels module (the comparison is of the host side:
the trees' kernels must take the same arguments), and alternates the two call by call (which one
goes first swaps each time), the GPU idle before each call (Hq 32 / Hkv 8, D 128, bf16, page 16):

* at each point (``--points``), one plan, ``run()`` repeated: the separate merge (default) and the
  fused one (``fuse_merge=True``, one launch less); median host µs of each tree, outputs compared
  bitwise between the trees;
* a new batch every step (1 to 64 requests drawn at random, lengths 512-8192, one cache and one
  block table of 512 columns; the same batches for both trees): ``plan()`` then ``run()``, p50 and
  p90 host µs of ``run()`` and p50 of ``plan()``;
* a batch of fixed size (``--fixed-batches``, e.g. 1,16,64) whose lengths change every step (512-8192,
  as a steady decode batch), or of a size drawn every step (``1-64``): ``plan()`` then ``run()``, p50
  of each. Without a GPU only this part runs, ``plan()`` alone (the host side: the planner, the
  upload into CPU tensors, the buffers).

Writes ``eager_ab.json`` (with provenance) and ``eager_ab.md`` to ``--out``.

    mkdir OLD && git archive REV | tar -x -C OLD
    python -m splitkv_bench eager-ab --old OLD --out OUT [--rounds 2]
    python -m splitkv_bench eager-ab --old OLD --out OUT --fixed-batches 1,16,64    # also on the CPU
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time

import numpy as np

from splitkv_common.optional import require

torch = require("torch", "python -m splitkv_bench eager-ab")
require("triton", "python -m splitkv_bench eager-ab")

import cuda_ref.kernels  # noqa: E402
from splitkv_bench.gpu import PAGE, make_point, random_batches  # noqa: E402
from splitkv_bench.output import save_outputs  # noqa: E402
from cuda_ref.wrapper import DecodeWrapper  # noqa: E402
from splitkv_common.provenance import provenance  # noqa: E402

POINTS = {"B1x2k": (1, 2048), "B1x16k": (1, 16384), "B64x2k": (64, 2048)}


def load_old(root: str):
    """The other tree's ``DecodeWrapper`` (its ``cuda_ref`` copied as ``cuda_ref_old``), launching this
    tree's kernels."""
    pkg = tempfile.mkdtemp(prefix="splitkv_ab_")
    shutil.copytree(os.path.join(root, "cuda_ref"), os.path.join(pkg, "cuda_ref_old"))
    sys.path.insert(0, pkg)
    import cuda_ref_old.launch
    import cuda_ref_old.wrapper
    cuda_ref_old.launch.kernels = cuda_ref.kernels
    return cuda_ref_old.wrapper.DecodeWrapper


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def alternate(calls: dict, n: int, warmup: int = 20) -> dict:
    """Median host µs of each of ``calls`` (name -> function), called in turn ``n`` times, the order
    swapped each round, a synchronize before each call."""
    ts = {k: [] for k in calls}
    names = list(calls)
    for i in range(n + warmup):
        for k in (names if i % 2 else names[::-1]):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            calls[k]()
            t1 = time.perf_counter()
            if i >= warmup:
                ts[k].append((t1 - t0) * 1e6)
    torch.cuda.synchronize()
    return {k: float(np.median(v)) for k, v in ts.items()}


def same(a, b) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b))


def repeated(Old, name: str, n: int) -> list:
    B, ctx = POINTS[name]
    q, k, v, bt, seq = make_point(B, ctx, 32, 8, 128, torch.bfloat16)
    qsl = torch.arange(B + 1, dtype=torch.int32, device="cuda")
    rows = []
    for fuse in (None, True):
        ws = {t: cls(32, 8, 128, PAGE, dtype=torch.bfloat16, fuse_merge=fuse) for t, cls in (("old", Old),
                                                                                             ("new", DecodeWrapper))}
        for w in ws.values():
            w.plan(seq.cpu().numpy())
        calls = {t: (lambda w=w: w.run(q, k, v, bt, seq, qsl)) for t, w in ws.items()}
        outs = {t: [x.clone() for x in f()] for t, f in calls.items()}
        us = alternate(calls, n)
        rows.append(dict(point=name, merge="fused" if fuse else "separate", old_us=us["old"], new_us=us["new"],
                         bitwise=same(outs["old"], outs["new"]),
                         fast=[ws[t].last_launch.fast["fast"] for t in ("old", "new")]))
    return rows


def new_batches(Old, steps: int, max_batch: int = 64, warmup: int = 20, seed: int = 0) -> dict:
    q, k, v, bt, seq = make_point(max_batch, 8192, 32, 8, 128, torch.bfloat16)
    ws = {"old": Old(32, 8, 128, PAGE, dtype=torch.bfloat16), "new": DecodeWrapper(32, 8, 128, PAGE, dtype=torch.bfloat16)}
    full = torch.arange(max_batch + 1, dtype=torch.int32, device="cuda")
    for w in ws.values():   # the largest batch first: the wrappers' buffers hold every later one
        w.plan(np.full(max_batch, 8192))
        w.run(q, k, v, bt, seq, full)
    ts = {"old": [], "new": []}
    tp = {"old": [], "new": []}
    bitwise = True
    for i, (B, lens, sd, qsl) in enumerate(random_batches(max_batch, steps + warmup, seed)):
        outs = {}
        for t in (("old", "new") if i % 2 else ("new", "old")):
            torch.cuda.synchronize()
            tq = time.perf_counter()
            ws[t].plan(lens)
            tr = time.perf_counter()
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            out = ws[t].run(q[:B], k, v, bt[:B], sd, qsl)
            t1 = time.perf_counter()
            torch.cuda.synchronize()
            outs[t] = [x.clone() for x in out]
            if i >= warmup:
                ts[t].append((t1 - t0) * 1e6)
                tp[t].append((tr - tq) * 1e6)
        bitwise = bitwise and same(outs["old"], outs["new"])
    return dict(steps=steps, max_batch=max_batch, bitwise=bitwise,
                **{f"{t}_p50": float(np.median(x)) for t, x in ts.items()},
                **{f"{t}_p90": float(np.percentile(x, 90)) for t, x in ts.items()},
                **{f"{t}_plan_p50": float(np.median(x)) for t, x in tp.items()})


def fixed_batches(Old, steps: int, batches: list, warmup: int = 20, seed: int = 0) -> list:
    """Per batch size ``(lo, hi)`` (one size where ``lo == hi``; else drawn in ``[lo, hi]`` every step):
    both trees' wrappers ``plan()`` a batch of that size with new lengths every step (the same for
    both), then, on a GPU, ``run()``; p50 host µs of each, the order swapped each step, outputs
    compared bitwise."""
    gpu = torch.cuda.is_available()
    rows = []
    for lo, hi in batches:
        ws = {"old": Old(32, 8, 128, PAGE, dtype=torch.bfloat16), "new": DecodeWrapper(32, 8, 128, PAGE,
                                                                                       dtype=torch.bfloat16)}
        if gpu:
            q, k, v, bt, seq = make_point(hi, 8192, 32, 8, 128, torch.bfloat16)
            qsl = torch.arange(hi + 1, dtype=torch.int32, device="cuda")
        rng = np.random.default_rng(seed + hi)
        tp = {"old": [], "new": []}
        tr = {"old": [], "new": []}
        bitwise = True
        for i in range(steps + warmup):
            B = int(rng.integers(lo, hi + 1))
            lens = rng.integers(512, 8193, B)
            sd = torch.from_numpy(lens.astype(np.int32)).cuda() if gpu else None
            outs = {}
            for t in (("old", "new") if i % 2 else ("new", "old")):
                sync()
                t0 = time.perf_counter()
                ws[t].plan(lens)
                t1 = time.perf_counter()
                if gpu:
                    sync()
                    t2 = time.perf_counter()
                    out = ws[t].run(q[:B], k, v, bt[:B], sd, qsl[:B + 1])
                    t3 = time.perf_counter()
                    sync()
                    outs[t] = [x.clone() for x in out]
                    if i >= warmup:
                        tr[t].append((t3 - t2) * 1e6)
                if i >= warmup:
                    tp[t].append((t1 - t0) * 1e6)
            if gpu:
                bitwise = bitwise and same(outs["old"], outs["new"])
        rows.append(dict(batch=str(lo) if lo == hi else f"{lo}-{hi}", steps=steps, bitwise=bitwise if gpu else None,
                         **{f"{t}_plan_p50": float(np.median(x)) for t, x in tp.items()},
                         **{f"{t}_run_p50": float(np.median(x)) if x else None for t, x in tr.items()}))
    return rows


def table(res) -> str:
    lines = [f"Eager `run()` host µs, `{res['old']}` (old) against this tree (new), alternating call by call in one "
             f"process ({res['gpu']}, torch {res['torch']}, {res['date']})"]
    if any("repeated" in rnd for rnd in res["rounds"]):
        lines += ["", "| round | point | merge | old µs | new µs | new / old | bitwise equal |",
                  "|---|---|---|---:|---:|---:|---|"]
        for k, rnd in enumerate(res["rounds"]):
            for r in rnd["repeated"]:
                lines.append(f"| {k + 1} | {r['point']} | {r['merge']} | {r['old_us']:.1f} | {r['new_us']:.1f} | "
                             f"{r['new_us'] / r['old_us']:.3f} | {r['bitwise']} |")
        lines += ["", "A new batch every step (1-64 requests at random, lengths 512-8192), `run()` right after `plan()`:",
                  "", "| round | old p50 µs | new p50 µs | old p90 µs | new p90 µs | `plan()` p50 µs old / new | "
                  "bitwise equal |", "|---|---:|---:|---:|---:|---:|---|"]
        for k, rnd in enumerate(res["rounds"]):
            nb = rnd["new_batches"]
            lines.append(f"| {k + 1} | {nb['old_p50']:.1f} | {nb['new_p50']:.1f} | {nb['old_p90']:.1f} | "
                         f"{nb['new_p90']:.1f} | {nb['old_plan_p50']:.1f} / {nb['new_plan_p50']:.1f} | {nb['bitwise']} |")
    if any(rnd.get("fixed") for rnd in res["rounds"]):
        lines += ["", "A batch of one size (or of a size drawn every step, LO-HI), new lengths every step (512-8192): "
                  "`plan()`, then `run()` (GPU only), p50:",
                  "", "| round | B | `plan()` µs old | new | new / old | `run()` µs old | new | bitwise equal |",
                  "|---|---:|---:|---:|---:|---:|---:|---|"]

        def f(x):
            return "-" if x is None else f"{x:.1f}"
        for k, rnd in enumerate(res["rounds"]):
            for r in rnd.get("fixed") or []:
                lines.append(f"| {k + 1} | {r['batch']} | {r['old_plan_p50']:.1f} | {r['new_plan_p50']:.1f} | "
                             f"{r['new_plan_p50'] / r['old_plan_p50']:.3f} | {f(r['old_run_p50'])} | "
                             f"{f(r['new_run_p50'])} | {'-' if r['bitwise'] is None else r['bitwise']} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--old", required=True, help="root of the other tree (a checkout of another commit)")
    ap.add_argument("--old-label", default=None, help="its name in the table (default: the folder's name)")
    ap.add_argument("--out", default="eager_ab_out")
    ap.add_argument("--points", default=",".join(POINTS))
    ap.add_argument("--calls", type=int, default=300, help="timed calls of each tree per point (default 300)")
    ap.add_argument("--steps", type=int, default=400, help="timed steps of the new-batch loop (default 400)")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--fixed-batches", default="",
                    help="batch sizes of the fixed-size loop, e.g. 1,16,64, or LO-HI for a size drawn every step "
                         "(the only part without a GPU)")
    a = ap.parse_args(argv)
    gpu = torch.cuda.is_available()
    fixed = [tuple(int(y) for y in x.split("-")) if "-" in x else (int(x), int(x))
             for x in a.fixed_batches.split(",") if x]
    if not gpu and not fixed:
        raise SystemExit("splitkv_bench/eager_ab.py: needs a CUDA GPU (it times eager launches); on the CPU, "
                         "--fixed-batches times plan() alone")
    Old = load_old(os.path.abspath(a.old))
    res = dict(provenance=provenance(argv if argv is None else [sys.argv[0], *argv]), old=a.old_label or os.path.basename(
        os.path.abspath(a.old)), gpu=torch.cuda.get_device_name() if gpu else "CPU, plan() alone",
        torch=torch.__version__, date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), rounds=[])
    for _ in range(a.rounds):
        rnd = {}
        if gpu:
            rnd["repeated"] = [r for name in a.points.split(",") for r in repeated(Old, name, a.calls)]
            rnd["new_batches"] = new_batches(Old, a.steps)
        if fixed:
            rnd["fixed"] = fixed_batches(Old, a.steps, fixed)
        res["rounds"].append(rnd)
    print(save_outputs(a.out, "eager_ab", res, table(res)))
    return 0
