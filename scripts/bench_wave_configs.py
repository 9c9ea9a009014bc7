#!/usr/bin/env python3
"""Stage-1 configurations against the work items' count and length (GPU): which one is fastest
where, and what ``default_config`` chooses there; and the default against the choice before it at
serving-like batches.

Per point (Hq 32 / Hkv 8 / D 128, bf16, page 16, shuffled pages): ``size:T`` plans of uniform
requests of ``4 T`` tokens, so ``N`` work items of ``T`` tokens each (``B = N / 32``), each of the
configurations run eagerly in a CUDA graph. The compiled kernels' registers and shared memory are
listed after the table (the programs an SM holds at once follow from them).

``--ab POLICY:BxL,...`` (``r`` before ``B``: lengths drawn in [512, L)): the default configuration
against the one chosen before the choice by waves (``previous_config``: "few" items n64w4s5; more,
``auto`` n32w2s5 and batch-invariant plans n64w4s7), the same plan, with the outputs compared.

Timing: ``bench_decode.Timer`` (a 10 ms warm-up, then ``--reps`` replays each after a read flush of
the L2, CUDA events, median) in interleaved passes (two for the sweep, three for ``--ab``), and their
median. Outputs: ``wave_configs.json`` and ``wave_configs.md`` in ``--out``.

    python scripts/bench_wave_configs.py --out OUT/waves
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, ".."))
from splitkv_common.optional import require  # noqa: E402

torch = require("torch", "scripts/bench_wave_configs.py")
require("triton", "scripts/bench_wave_configs.py")

from bench_decode import PAGE, Timer, batch_lengths, interleaved, make_point, save_outputs  # noqa: E402
from cuda_ref import kernels  # noqa: E402
from cuda_ref.launch import KernelConfig, default_config  # noqa: E402
from cuda_ref.wrapper import DecodeWrapper  # noqa: E402
from splitkv_common.provenance import provenance, provenance_markdown  # noqa: E402

HQ, HKV, D, SPLITS = 32, 8, 128, 4
CONFIGS = (KernelConfig(32, 2, 5), KernelConfig(32, 4, 5), KernelConfig(64, 4, 5), KernelConfig(64, 4, 7))
AB = ",".join([f"auto:{p}" for p in ("3x65536", "5x65536", "10x32768", "10x65536", "12x16384", "6x16384", "40x8192",
                                      "96x2048", "160x2048", "16x16384", "64x2048", "128x1024", "r40x8192", "r96x4096",
                                      "r160x2048", "r64x8192")]
              + [f"size:4096:{p}" for p in ("12x16384", "20x16384", "24x16384", "16x16384")])


def point(timer, N: int, T: int) -> dict:
    B = N // (HKV * SPLITS)
    seq = np.full(B, SPLITS * T)
    args = make_point(B, SPLITS * T, HQ, HKV, D, torch.bfloat16)
    replays, keep = {}, []   # keep: the wrappers own the buffers their graphs write
    for c in CONFIGS:
        w = DecodeWrapper(HQ, HKV, D, PAGE, dtype=torch.bfloat16, device="cuda", policy=f"size:{T}", config=c)
        if w.plan(seq).num_items != N:
            raise RuntimeError(f"{N} items expected at B {B}")
        replays[str(c)] = timer.graph(lambda w=w: w.run(*args))
        keep.append(w)
    passes = interleaved(timer, replays, passes=2)
    row = dict(items=N, item_tokens=T, batch=B, us={n: round(statistics.median(x), 1) for n, x in passes.items()})
    best = min(row["us"], key=row["us"].get)
    row["best"] = best
    row["default_auto"] = str(default_config(D, 2, N, False, T))
    row["default_batch_invariant"] = str(default_config(D, 2, N, True, T))
    row["default_auto_over_best"] = round(row["us"][row["default_auto"]] / row["us"][best], 3)
    return row


def previous_config(num_items: int, batch_invariant: bool) -> KernelConfig:
    """``default_config`` at 16-bit D 128 before the choice by waves."""
    if 0 < num_items <= 2 * 132:
        return KernelConfig(64, 4, 5)
    return KernelConfig(64, 4, 7) if batch_invariant else KernelConfig(32, 2, 5)


def ab_point(timer, spec: str) -> dict:
    """The default configuration against :func:`previous_config` for ``POLICY:BxL``."""
    policy, _, pt = spec.rpartition(":")
    B = int(pt.partition("x")[0].lstrip("r"))
    _, _, _, seq = batch_lengths(pt, B)   # ragged lengths drawn with the batch size as the seed
    q, k, v, bt, _ = make_point(B, -(-int(seq.max()) // PAGE) * PAGE, HQ, HKV, D, torch.bfloat16)
    args = (q, k, v, bt, torch.tensor(seq, dtype=torch.int32, device="cuda"))
    row = dict(policy=policy, point=pt)
    replays, outs, keep = {}, {}, []   # keep: the wrappers own the buffers their graphs write
    config = None   # the default's
    for name in ("default", "previous"):
        w = DecodeWrapper(HQ, HKV, D, PAGE, dtype=torch.bfloat16, device="cuda", policy=policy, config=config)
        plan = w.plan(seq)
        got = []   # run() returns the wrapper's own output buffer, which the replays write
        replays[name] = timer.graph(lambda w=w, got=got: got.append(w.run(*args)[0]))
        outs[name] = got[-1]
        cx = w.last_launch.constexprs
        row[name] = dict(config=f"n{cx['BLOCK_N']}w{cx['num_warps']}s{cx['num_stages']}")
        row["items"] = int(plan.num_items)
        keep.append(w)
        config = previous_config(plan.num_items, policy != "auto")
    for n, passes in interleaved(timer, replays).items():
        row[n]["us"] = round(statistics.median(passes), 1)
        row[n]["passes_us"] = [round(x, 1) for x in passes]
    row["default_over_previous"] = round(row["default"]["us"] / row["previous"]["us"], 3)
    a, c = outs["default"].float(), outs["previous"].float()
    row["bits_equal"] = bool(torch.equal(outs["default"], outs["previous"]))
    row["rel_diff"] = float((a - c).norm() / c.norm())
    return row


def compiled_kernels() -> list:
    """Warps, stages, registers a thread, spills and shared memory of each compiled stage-1 kernel."""
    out = []
    for cache in getattr(kernels.split_kv_kernel, "device_caches", {}).values():
        for ck in cache[0].values():
            md = ck.metadata
            out.append(dict(num_warps=md.num_warps, num_stages=md.num_stages, registers=ck.n_regs,
                            spills=ck.n_spills, shared_bytes=md.shared))
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--items", default="256,384,512,640,768,1024,1280", help="work-item counts (multiples of 32)")
    ap.add_argument("--item-tokens", default="1024,2048,4096,8192")
    ap.add_argument("--ab", default=AB, help="POLICY:BxL points of the default against the choice before; '' for none")
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--out", default="wave_configs_out")
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("error: bench_wave_configs.py times CUDA graphs: no GPU here")
    timer = Timer(iters=a.reps)
    rows = []
    for T in (int(x) for x in a.item_tokens.split(",")):
        for N in (int(x) for x in a.items.split(",")):
            rows.append(point(timer, N, T))
            print(json.dumps(rows[-1]), flush=True)
            torch.cuda.empty_cache()
    ab = []
    for spec in filter(None, a.ab.split(",")):
        ab.append(ab_point(timer, spec))
        print(json.dumps(ab[-1]), flush=True)
        torch.cuda.empty_cache()
    res = dict(provenance=provenance(), rows=rows, ab=ab, kernels=compiled_kernels())
    names = [str(c) for c in CONFIGS]
    lines = ["# Stage-1 configurations by work items (GPU)", ""] + provenance_markdown(res["provenance"]) + [
        "", "Replay µs (median of two interleaved passes, read flush) of `size:T` plans with N items of T tokens; "
        "`default`: what `default_config` chooses for an `auto` plan of N items, and its time over the fastest.", "",
        "| T | N | B | " + " | ".join(names) + " | fastest | default | default / fastest |",
        "|---:|---:|---:|" + "---:|" * len(names) + "---|---|---:|"]
    for r in rows:
        lines.append(f"| {r['item_tokens']} | {r['items']} | {r['batch']} | "
                     + " | ".join(str(r["us"][n]) for n in names)
                     + f" | {r['best']} | {r['default_auto']} | {r['default_auto_over_best']} |")
    if ab:
        lines += ["", "The default against the configuration chosen before (`previous_config`), the same plan, "
                  "three interleaved passes:", "",
                  "| policy | point | items | default | µs | before | µs | default / before | bits equal | rel. diff |",
                  "|---|---|---:|---|---:|---|---:|---:|---|---:|"]
        lines += [f"| {r['policy']} | {r['point']} | {r['items']} | {r['default']['config']} | {r['default']['us']} | "
                  f"{r['previous']['config']} | {r['previous']['us']} | {r['default_over_previous']} | {r['bits_equal']} | "
                  f"{r['rel_diff']:.1e} |" for r in ab]
    lines += ["", "Compiled stage-1 kernels:", "", "| warps | stages | registers | spills | shared bytes |",
              "|---:|---:|---:|---:|---:|"]
    lines += [f"| {k['num_warps']} | {k['num_stages']} | {k['registers']} | {k['spills']} | {k['shared_bytes']} |"
              for k in res["kernels"]]
    print(save_outputs(a.out, "wave_configs", res, lines))

if __name__ == "__main__":
    main()
