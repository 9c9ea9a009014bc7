"""Time the split planner: ``make_plan`` per decode step, over batch sizes, policies and graph stability.

Times the package's planner and, when ``tests/planner_oracle.py`` exists (the previous loop planner,
kept as the tests' reference), the old one side by side. Shapes: Hq 32 / Hkv 8 / D 128, page 16,
lengths drawn uniformly from 512-8192 (a fixed seed per batch size), device profile h200.

Each point runs the planner in blocks of calls for about ``--seconds``; the median (and the minimum)
of the per-call times of the blocks is taken, as wall time and as this process's CPU time (on a
shared machine the CPU time is the less disturbed figure). The sweep over all points is repeated
``--repeat`` times (the old planner once) and the table shows the median over the sweeps. For
graph-stable points the table also shows the memory floor: the time to allocate and fill the padded
work-item arrays alone (5 x ``B * Hkv * max_splits`` int32, request -1 and zeros), which any planner
producing that plan pays, and the steady state of a graph-stable stream: ``make_plan(..., reuse=the
previous plan)`` (the previous step's buffer rewritten where it changes; what the wrappers' ``plan()``
does), column ``reuse µs``, and the C planner (``splitkv_common.native``, through ``NativePlanner.make``;
graph-stable: into the previous call's plan), column ``C µs``, where it plans the point.

    python -m splitkv_bench plan --out plan_times.json
    python -m splitkv_bench plan --batch 1 64 --policy auto --seconds 0.5
    python -m splitkv_bench plan --no-old --baseline HEAD~1     # against an earlier revision, interleaved
    python -m splitkv_bench plan --no-old --ascend 910b2         # plus the Ascend tiling of each plan

``--ascend PROFILE`` plans for that NPU profile and also times the Ascend tiling of each plan
(``ascend_ops.tiling``): ``build_buffers`` (one call, as the wrapper makes it) and ``TilingBuilder.build``
(the per-step builder of a stream of plans with the same settings), bf16, max pages 8192 / 16 + 1,
and the whole host side of a step, ``AscendDecodeWrapper.plan()`` (planner, builder, the one upload into
CPU tensors; needs torch).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

from splitkv_common.devices import get_profile  # noqa: E402
from splitkv_common.plan import NativePlanner, PlanSpec, make_plan  # noqa: E402

SHAPE = dict(num_kv_heads=8, num_q_heads=32, head_dim=128, page_size=16, device="h200")


def load_oracle():
    """The previous loop planner from the tests, or None when the file is not there."""
    path = os.path.join(ROOT, "tests", "planner_oracle.py")
    if not os.path.exists(path):
        return None
    import importlib.util

    spec = importlib.util.spec_from_file_location("planner_oracle", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.make_plan


def load_baseline(rev: str):
    """``make_plan`` of the package as it was at git revision ``rev`` (extracted to a temporary
    directory as the package ``splitkv_base``), to time it beside the current one in the same sweep."""
    import importlib
    import tarfile
    import tempfile

    tmp = tempfile.mkdtemp(prefix="splitkv_base_")
    archive = subprocess.run(["git", "archive", rev, "splitkv_common"], cwd=ROOT, capture_output=True, check=True)
    tar_path = os.path.join(tmp, "src.tar")
    with open(tar_path, "wb") as f:
        f.write(archive.stdout)
    with tarfile.open(tar_path) as t:
        t.extractall(tmp)
    os.rename(os.path.join(tmp, "splitkv_common"), os.path.join(tmp, "splitkv_base"))
    sys.path.insert(0, tmp)
    return importlib.import_module("splitkv_base.plan").make_plan


def git_state():
    """``(commit, dirty)`` of the repository, or ``(None, None)`` outside git."""
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                                check=True).stdout.strip()
        dirty = bool(subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                                    capture_output=True, text=True, check=True).stdout.strip())
        return commit, dirty
    except (OSError, subprocess.CalledProcessError):
        return None, None


def time_call(fn, seconds: float, min_blocks: int = 7):
    """Per-call times (µs) of ``fn``: blocks of calls sized to about 2 ms, for ``seconds`` in all.
    Returns median and minimum of the blocks, wall and CPU."""
    fn()
    t0 = time.perf_counter()
    fn()
    one = max(time.perf_counter() - t0, 1e-7)
    per_block = max(1, int(0.002 / one))
    wall, cpu = [], []
    deadline = time.perf_counter() + seconds
    while len(wall) < min_blocks or time.perf_counter() < deadline:
        w0, c0 = time.perf_counter(), time.process_time()
        for _ in range(per_block):
            fn()
        wall.append((time.perf_counter() - w0) / per_block * 1e6)
        cpu.append((time.process_time() - c0) / per_block * 1e6)
        if len(wall) >= 10000:
            break
    return dict(median_us=statistics.median(wall), min_us=min(wall), cpu_median_us=statistics.median(cpu),
                blocks=len(wall), calls_per_block=per_block)


def padding_floor(B: int, seconds: float):
    """The time (µs) to allocate and fill the five padded work-item arrays of a graph-stable plan."""
    size = B * SHAPE["num_kv_heads"] * get_profile(SHAPE["device"]).max_splits

    def fill():
        buf = np.empty((5, size), np.int32)
        buf[0] = -1
        buf[1:] = 0
        return buf

    return time_call(fill, seconds)


def reusing(seq, kw):
    """A call that plans ``seq`` into the previous call's plan (``make_plan``'s ``reuse``): the
    steady state of a graph-stable step."""
    last = [make_plan(seq, **kw)]

    def step():
        last[0] = make_plan(seq, reuse=last[0], **kw)

    return step


def native_call(seq, kw):
    """The C planner's call for these settings (``NativePlanner.make``; graph-stable: into the previous
    call's plan, as a wrapper's ``plan()`` makes it), or None where it does not plan them."""
    spec = PlanSpec(kw["num_q_heads"], kw["num_kv_heads"], kw["head_dim"], kw["page_size"], policy=kw["policy"],
                    device=kw["device"], graph_stable=kw["graph_stable"])
    nat = NativePlanner.for_spec(spec)
    if nat is None or nat.make(seq) is None:
        return None
    last = [nat.make(seq)]

    def step():
        last[0] = nat.make(seq, reuse=last[0] if kw["graph_stable"] else None)
    return step


def time_wrapper_plan(seq, profile: str, policy: str, graph_stable: bool, seconds: float):
    """The whole host side of an Ascend decode step: ``AscendDecodeWrapper.plan()`` (the planner, the
    tiling builder and the one upload, here into CPU tensors), bf16, SHAPE; None without torch."""
    try:
        import torch
        from ascend_ops.wrapper import AscendDecodeWrapper
    except ImportError:
        return None
    w = AscendDecodeWrapper(SHAPE["num_q_heads"], SHAPE["num_kv_heads"], SHAPE["head_dim"], SHAPE["page_size"],
                            dtype=torch.bfloat16, device="cpu", profile=profile, policy=policy, graph_stable=graph_stable)
    pages = dict(max_pages=8192 // SHAPE["page_size"] + 1, num_pages=1 << 20)
    return time_call(lambda: w.plan(seq, **pages), seconds)


def time_tiling(seq, plan, profile: str, seconds: float):
    """``(build_buffers, TilingBuilder.build)`` timings of ``plan``'s Ascend tiling (bf16, SHAPE)."""
    from ascend_ops import tiling as tl

    s = dict(num_q_heads=SHAPE["num_q_heads"], head_dim=SHAPE["head_dim"], page_size=SHAPE["page_size"],
             max_pages=8192 // SHAPE["page_size"] + 1, dtype="bfloat16", kv_dtype="bfloat16",
             scale=SHAPE["head_dim"] ** -0.5, profile=profile)
    builder = tl.TilingBuilder(**s)
    one = time_call(lambda: tl.build_buffers(plan, seq_lens=seq, num_pages=1 << 20, **s), seconds)
    steady = time_call(lambda: builder.build(plan, seq, 1 << 20), seconds)
    return one, steady


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 16, 64, 256, 1024])
    ap.add_argument("--policy", nargs="+", default=["auto", "size:256"])
    ap.add_argument("--graph-stable", choices=["both", "on", "off"], default="both")
    ap.add_argument("--seconds", type=float, default=1.0, help="time per point and planner (default 1)")
    ap.add_argument("--old-seconds", type=float, default=None,
                    help="time per point for the old planner (default: --seconds)")
    ap.add_argument("--no-old", action="store_true", help="skip the old planner")
    ap.add_argument("--repeat", type=int, default=3,
                    help="sweeps of the new planner; the table shows the median over them (default 3)")
    ap.add_argument("--baseline", metavar="REV",
                    help="also time the planner of git revision REV in every sweep, interleaved with the current "
                         "one (a fair comparison on a busy machine)")
    ap.add_argument("--ascend", metavar="PROFILE",
                    help="plan for this NPU profile (e.g. 910b2) and time the Ascend tiling of each plan too")
    ap.add_argument("--out", help="write the results as JSON here")
    args = ap.parse_args(argv)
    if args.ascend:
        SHAPE["device"] = args.ascend

    old = None if args.no_old else load_oracle()
    base = load_baseline(args.baseline) if args.baseline else None
    graph = {"both": [False, True], "on": [True], "off": [False]}[args.graph_stable]
    commit, dirty = git_state()
    meta = dict(date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                commit=commit, dirty=dirty, python=platform.python_version(), numpy=np.__version__,
                machine=f"{platform.machine()}, {os.cpu_count()} CPUs, {platform.processor() or platform.system()}",
                command=" ".join(sys.argv), shape=SHAPE,
                lengths="uniform 512-8192, seed = batch size", old_planner=old is not None,
                baseline=args.baseline)
    points = [(B, pol, gs) for B in args.batch for pol in args.policy for gs in graph]
    runs = {p: [] for p in points}       # one result per sweep
    floors = {B: [] for B in args.batch}
    for rep in range(args.repeat):
        for B in args.batch:
            seq = np.random.default_rng(B).integers(512, 8193, B)
            if True in graph:
                floors[B].append(padding_floor(B, min(args.seconds, 0.5)))
            for pol in args.policy:
                for gs in graph:
                    kw = dict(SHAPE, policy=pol, graph_stable=gs)
                    new = time_call(lambda: make_plan(seq, **kw), args.seconds)
                    reuse = time_call(reusing(seq, kw), args.seconds) if gs else None
                    c = native_call(seq, kw)
                    c = time_call(c, args.seconds) if c is not None else None
                    b = time_call(lambda: base(seq, **kw), args.seconds) if base is not None else None
                    o = None
                    if old is not None and rep == 0:   # the old planner is slow and far apart: one sweep
                        o = time_call(lambda: old(seq, **kw), args.old_seconds or args.seconds, min_blocks=3)
                    t1 = t2 = t3 = None
                    if args.ascend:
                        t1, t2 = time_tiling(seq, make_plan(seq, **kw), args.ascend, args.seconds)
                        t3 = time_wrapper_plan(seq, args.ascend, pol, gs, args.seconds)
                    runs[(B, pol, gs)].append(dict(new=new, reuse=reuse, c=c, old=o, base=b, tiling=t1, builder=t2,
                                                   wrapper=t3))
        print(f"sweep {rep + 1}/{args.repeat} done", file=sys.stderr, flush=True)

    def med(xs, key):
        return statistics.median(x[key] for x in xs)

    rows = []
    hdr = (f"{'B':>5} {'policy':>9} {'graph':>5} | {'new µs':>9} {'cpu µs':>9} {'pad floor':>9} {'reuse µs':>9} "
           f"{'C µs':>8} | "
           f"{'old µs':>10} {'speed-up':>8}" + (f" | {'base µs':>9} {'base cpu':>9}" if base else "")
           + (f" | {'tiling µs':>9} {'builder µs':>10} {'plan() µs':>9}" if args.ascend else ""))
    print(hdr)
    print("-" * len(hdr))
    for B, pol, gs in points:
        sweeps = runs[(B, pol, gs)]
        new = [r["new"] for r in sweeps]
        o = sweeps[0]["old"]
        row = dict(batch=B, policy=pol, graph_stable=gs, new_median_us=med(new, "median_us"),
                   new_cpu_median_us=med(new, "cpu_median_us"), new_sweeps=new, old=o,
                   padding_floor_median_us=med(floors[B], "median_us") if gs else None,
                   reuse_median_us=med([r["reuse"] for r in sweeps], "median_us") if gs else None,
                   c_median_us=med([r["c"] for r in sweeps], "median_us") if sweeps[0]["c"] else None)
        if base is not None:
            bs = [r["base"] for r in sweeps]
            row.update(base_median_us=med(bs, "median_us"), base_cpu_median_us=med(bs, "cpu_median_us"),
                       base_sweeps=bs)
        if args.ascend:
            wr = [r["wrapper"] for r in sweeps if r["wrapper"] is not None]
            row.update(tiling_median_us=med([r["tiling"] for r in sweeps], "median_us"),
                       builder_median_us=med([r["builder"] for r in sweeps], "median_us"),
                       wrapper_plan_median_us=med(wr, "median_us") if wr else None)
        rows.append(row)
        pad = (f"{row['padding_floor_median_us']:>9.1f} {row['reuse_median_us']:>9.1f}" if gs
               else f"{'-':>9} {'-':>9}")
        cc = f"{row['c_median_us']:>8.1f}" if row["c_median_us"] is not None else f"{'-':>8}"
        print(f"{B:>5} {pol:>9} {str(gs):>5} | {row['new_median_us']:>9.1f} {row['new_cpu_median_us']:>9.1f} {pad} {cc} | "
              + (f"{o['median_us']:>10.1f} {o['median_us'] / row['new_median_us']:>7.0f}x" if o else
                 f"{'-':>10} {'-':>8}")
              + (f" | {row['base_median_us']:>9.1f} {row['base_cpu_median_us']:>9.1f}" if base else "")
              + (f" | {row['tiling_median_us']:>9.1f} {row['builder_median_us']:>10.1f} "
                 f"{row['wrapper_plan_median_us'] or float('nan'):>9.1f}" if args.ascend else ""))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(dict(meta=meta, results=rows), f, indent=1)
        print(f"wrote {args.out}")
