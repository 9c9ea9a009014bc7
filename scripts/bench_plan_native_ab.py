#!/usr/bin/env python3
"""A captured plan's ``plan()``: this tree's C planner against another version of ``plan_fast.c``,
in one process, step by step.

A host's timings drift between processes by more than a host-side change moves them (the serving
benchmark's ``plan()`` at B 16 has measured 9 and 19 µs for one tree in one lease), so this builds
the other source (``--old-source FILE``, e.g. ``git show REV:splitkv_common/native/plan_fast.c``) with
this tree's compiler arguments beside this tree's module and alternates the two in one wrapper's
refresh (``DecodeWrapper(graph_stable=True, plan_in_graph=True)``, Hq 32 / Hkv 8, D 128, page 16,
policy ``auto``, lengths uniform 512-8192). A module with a ``Refresher`` refreshes through it (made
from the wrapper's state before each step); one without (sources before it) through the Python refresh
around its ``plan`` that the wrapper had then (:class:`PythonRefresh`). Before every step the host sums
``--evict-mb`` MB (its caches emptied, as between two decode steps of a model) and synchronizes. Per
batch size: the median host µs of ``plan()`` of each module and, on a CUDA GPU, of the step
(``plan()``, the graph's replay, a synchronize). On the CPU only ``plan()`` is timed (no graph).

Writes ``plan_native_ab.json`` (with provenance) and ``plan_native_ab.md`` to ``--out``.

    git show REV:splitkv_common/native/plan_fast.c > OLD.c
    python scripts/bench_plan_native_ab.py --old-source OLD.c --out OUT
"""

from __future__ import annotations

import argparse
import copy
import importlib.machinery
import importlib.util
import os
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, ".."))
from splitkv_common.optional import require  # noqa: E402

torch = require("torch", "scripts/bench_plan_native_ab.py")
require("triton", "scripts/bench_plan_native_ab.py")

from bench_decode import save_outputs  # noqa: E402
from cuda_ref.launch import packed_limit  # noqa: E402
from splitkv_common import native  # noqa: E402
from splitkv_common.plan import _plan_reason, query_rows_arg  # noqa: E402
from splitkv_common.provenance import provenance  # noqa: E402


def build_other(source: str):
    """The C planner module built from ``source`` with this tree's compiler arguments."""
    out = os.path.join(tempfile.mkdtemp(prefix="splitkv_native_ab_"),
                       "_splitkv_plan" + (sysconfig.get_config_var("EXT_SUFFIX") or ".so"))
    proc = subprocess.run([os.environ.get("CC") or "cc", *native._compile_args(), source, "-o", out],
                          capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"error: --old-source: the compiler failed: {proc.stderr.strip()[-500:]}")
    loader = importlib.machinery.ExtensionFileLoader("_splitkv_plan", out)
    mod = importlib.util.module_from_spec(importlib.util.spec_from_file_location("_splitkv_plan", out, loader=loader))
    loader.exec_module(mod)
    return mod


class PythonRefresh:
    """A captured plan's refresh as ``DecodeWrapper`` made it before the C ``Refresher``: Python around
    one call of a module's ``plan`` (its 12-argument form), the benchmark's baseline for sources without
    a ``Refresher``."""

    def __init__(self, w, mod):
        d, group = w.dplan, w.num_q_heads // w.num_kv_heads
        most = 1 if d.max_q_len == 1 else packed_limit(d.block_m * d.row_blocks, group)
        self.w, self.plan_c, self.settings, self.fixed = w, mod.plan, w._native._settings, w._native._fixed
        self.B, self.T, self.most, self.size, self.packed = d.batch_size, d.num_rows, most, d.data.numel(), \
            w._uploader._host[0][1]

    def refresh(self, seq_lens, q_lens, query_start_loc):
        w = self.w
        spare, cur = w._spare, w._mine
        if spare is None or cur is None or type(seq_lens) is not np.ndarray:
            return None
        d = spare.__dict__
        small = d.get("_small")
        if small is None:
            return None
        kind, q = query_rows_arg(q_lens, query_start_loc)
        up = w._uploader
        up.wait_for_copy()
        last = up._layout[0]
        r = self.plan_c(self.settings, seq_lens, kind, q, d["items"], small, d["num_valid_items"], self.packed,
                        -1 if last is None else last[2], self.B, self.T, self.most)
        if r is None or not r[8]:
            return None
        W, _, split, num_slots, B, _, max_q, max_end, _ = r
        d["num_valid_items"], d["split_tokens"], d["num_slots"], d["_max_q"], d["_max_end"], d["_kind"] = \
            W, split, num_slots, max_q, max_end, kind
        if self.fixed is None:
            if "reason" in d:
                del d["reason"], d["estimates_us"]
            d["_why"] = (_plan_reason, (w._native.spec, d["items"], d["_small"], W, B, kind))
        up._layout[0] = (r[1], self.size, W)
        up.pending, up.copied_in_capture = True, False
        w._spare, w._mine, w._made = cur, spare, spare
        w.host_plan = spare
        w._plan_pages = -(-max_end // w.page_size)
        w.plan_refreshes += 1
        return spare


def refresher_for(w, mod):
    """``w``'s refresh through ``mod``: its ``Refresher`` made from the wrapper's state now, or, for a
    module without one, :class:`PythonRefresh`."""
    if not hasattr(mod, "Refresher"):
        return PythonRefresh(w, mod)
    nat, w._native = w._native, copy.copy(w._native)
    w._native._mod = mod
    try:
        return w._refresher(w._mine)
    finally:
        w._native = nat


def captured(B: int, on_gpu: bool):
    """``(wrapper, replay or None)``: a ``plan_in_graph`` wrapper at ``B`` requests (its graph captured on
    a GPU), planned four times so that its refresh is in place."""
    if on_gpu:
        import bench_serving as bs
        args = argparse.Namespace(spec=0, kv_pool_gb=4.0, hq=32, hkv=8, head_dim=128, page=16, dtype="bf16",
                                  policy="auto", profile="h200", seed=0)
        g = bs.Graphed(bs.Rig(args, torch.device("cuda"), B, 9000), B, True, in_graph=True)
        w, replay = g.w, g.graph.replay
    else:
        from cuda_ref.wrapper import DecodeWrapper
        w, replay = DecodeWrapper(32, 8, 128, 16, graph_stable=True, plan_in_graph=True, device="cpu"), None
    rng = np.random.default_rng(B)
    for _ in range(4):
        w.plan(rng.integers(512, 8193, B), q_lens=np.ones(B, np.int64))
        if replay is not None:
            replay()
    if w._refresh_with is None:
        raise SystemExit("error: the wrapper does not refresh its plan in one C call here (C planner: "
                         f"{native.status()})")
    return w, replay


def run(args) -> dict:
    on_gpu = torch.cuda.is_available()
    mods = {"other": build_other(args.old_source), "this tree": native.load()}
    junk = np.ones(args.evict_mb << 18, np.float32)
    rows = []
    for B in [int(x) for x in args.batches.split(",")]:
        w, replay = captured(B, on_gpu)
        base = w._refresh_with
        rec = {name: {"plan_us": [], "step_us": []} for name in mods}
        rng = np.random.default_rng(B + 1)
        ql = np.ones(B, np.int64)
        for i in range(args.warmup + args.steps):
            name = ("other", "this tree")[i % 2]
            w._refresh_with = refresher_for(w, mods[name])
            seq = rng.integers(512, 8193, B)
            junk.sum()
            if on_gpu:
                torch.cuda.synchronize()
            n = w.plan_refreshes
            t0 = time.perf_counter()
            w.plan(seq, q_lens=ql)
            t1 = time.perf_counter()
            if replay is not None:
                replay()
                torch.cuda.synchronize()
            t2 = time.perf_counter()
            if w.plan_refreshes != n + 1:
                raise SystemExit(f"error: B {B}: a step was not refreshed in one C call")
            if i >= args.warmup:
                rec[name]["plan_us"].append((t1 - t0) * 1e6)
                rec[name]["step_us"].append((t2 - t0) * 1e6)
        w._refresh_with = base
        row = {"batch": B}
        for name, r in rec.items():
            row[name] = {k: round(statistics.median(v), 2) for k, v in r.items() if on_gpu or k == "plan_us"}
        rows.append(row)
        print(row, flush=True)
    return dict(provenance=provenance(), on_gpu=on_gpu, old_source=os.path.basename(args.old_source),
                numpy_api={name: getattr(m, "NUMPY_API", None) for name, m in mods.items()},
                config=dict(steps=args.steps, warmup=args.warmup, evict_mb=args.evict_mb), rows=rows)


def to_markdown(res: dict) -> list:
    gpu = res["on_gpu"]
    cols = ["B", "plan() µs, other", "plan() µs, this tree"] + (["step µs, other", "step µs, this tree"] if gpu else [])
    lines = ["# A captured plan's plan(): this tree's C planner against another source", "",
             f"- on: {'a CUDA GPU (step: plan(), replay, synchronize)' if gpu else 'the CPU (plan() only)'}",
             f"- other: `{res['old_source']}`; NumPy C API (1) or buffer protocol (0 / None): {res['numpy_api']}",
             f"- {res['config']['steps']} alternating steps after {res['config']['warmup']}, each after a "
             f"{res['config']['evict_mb']} MB host sum; medians", "",
             "| " + " | ".join(cols) + " |", "|" + "---:|" * len(cols)]
    for r in res["rows"]:
        vals = [r["batch"], r["other"]["plan_us"], r["this tree"]["plan_us"]]
        if gpu:
            vals += [r["other"]["step_us"], r["this tree"]["step_us"]]
        lines.append("| " + " | ".join(str(v) for v in vals) + " |")
    return lines


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--old-source", required=True, help="another version of splitkv_common/native/plan_fast.c")
    ap.add_argument("--batches", default="1,16,64,256")
    ap.add_argument("--steps", type=int, default=360, help="timed steps (alternating: half each)")
    ap.add_argument("--warmup", type=int, default=40)
    ap.add_argument("--evict-mb", type=int, default=64, help="MB the host sums before each step")
    ap.add_argument("--out", default="plan_native_ab_out")
    args = ap.parse_args()
    if native.load() is None:
        raise SystemExit(f"error: this tree's C planner: {native.status()}")
    res = run(args)
    print(save_outputs(args.out, "plan_native_ab", res, to_markdown(res)))


if __name__ == "__main__":
    main()
