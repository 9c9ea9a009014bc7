#!/usr/bin/env python3
"""Stage-1 configurations of the Triton kernels at the key decode points, against cuDNN SDPA and the
copy ceiling, in one run on a CUDA GPU (see docs/perf-notes.md).

For each point (bf16, Hq 32 / Hkv 8, D 128, page 16, one query per request): the default
configuration and a grid of others (tile, warps, pipeline stages x fused / separate merge), stage 1
alone (for the merge share), a few fixed split sizes, optionally a baseline package (an earlier
copy of ``cuda_ref`` importable under another name, ``--baseline``), and PyTorch SDPA with the cuDNN
and flash backends on a contiguous copy. Every configuration's output is also checked against
SDPA's math backend. Method as ``bench_decode.py``: CUDA-graph replay after an L2 flush, median.

    python scripts/h200_perf_check.py --out DIR [--baseline cuda_ref_v2] [--points B1x16k,B64x2k]
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_decode import PAGE, Timer, contiguous_kv, copy_ceiling, kv_bytes, make_point, peers  # noqa: E402
from cuda_ref.launch import KernelConfig  # noqa: E402

POINTS = {"B1x4k": (1, 4096), "B1x16k": (1, 16384), "B1x64k": (1, 65536), "B1x128k": (1, 131072),
          "B16x8k": (16, 8192), "B64x2k": (64, 2048), "B128x1k": (128, 1024)}
GRID = [KernelConfig(64, 4, 3), KernelConfig(64, 4, 5), KernelConfig(64, 4, 7), KernelConfig(32, 4, 5),
        KernelConfig(32, 4, 7), KernelConfig(64, 8, 5), KernelConfig(64, 8, 7), KernelConfig(128, 8, 5)]


def run_ours(timer, mod, q, k, v, bt, seq, policy="auto", config=None, fuse=None, merge=True, ref=None):
    B = bt.shape[0]
    w = mod.DecodeWrapper(q.shape[1], k.shape[2], q.shape[2], PAGE, dtype=q.dtype, policy=policy, config=config,
                          fuse_merge=fuse)
    plan = w.plan(seq.cpu().numpy())
    w.merge = merge
    qsl = torch.arange(B + 1, dtype=torch.int32, device="cuda")
    err = None
    if ref is not None:
        out, _ = w.run(q, k, v, bt, seq, qsl)
        sub = ref.shape[0]
        err = float((out[:sub].float() - ref).norm() / ref.norm())
    us = timer(lambda: w.run(q, k, v, bt, seq, qsl))
    return us, plan, w._fused(), err


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="perf_out")
    ap.add_argument("--baseline", default=None, help="module name of an earlier cuda_ref copy to time too")
    ap.add_argument("--points", default=",".join(POINTS))
    ap.add_argument("--iters", type=int, default=20)
    a = ap.parse_args(argv)
    os.makedirs(a.out, exist_ok=True)
    timer = Timer(a.iters)
    res = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__,
               triton=importlib.import_module("triton").__version__,
               date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), ceiling_gbps=copy_ceiling(timer), points=[])
    ours_mod = importlib.import_module("cuda_ref.wrapper")
    base_mod = importlib.import_module(a.baseline + ".wrapper") if a.baseline else None
    if base_mod is not None:
        base_cfg = importlib.import_module(a.baseline + ".launch").KernelConfig
    t0 = time.time()
    for name in a.points.split(","):
        B, ctx = POINTS[name]
        q, k, v, bt, seq = make_point(B, ctx, 32, 8, 128, torch.bfloat16)
        nbytes = kv_bytes(B, ctx, 8, 128, "bf16")
        kc, vc = contiguous_kv(k, bt, B, ctx), contiguous_kv(v, bt, B, ctx)
        sub = min(B, 4)
        ref = torch.nn.functional.scaled_dot_product_attention(
            q[:sub, :, None].float(), kc[:sub].float(), vc[:sub].float(), enable_gqa=True)[:, :, 0]
        r = dict(point=name, B=B, ctx=ctx, kv_bytes=nbytes, variants={})
        us, plan, fused, err = run_ours(timer, ours_mod, q, k, v, bt, seq, ref=ref)
        r.update(default_us=us, splits=int(plan.max_splits), items=int(plan.num_valid_items), fused=fused,
                 default_err=err)
        if plan.max_splits > 1:
            r["stage1_us"] = run_ours(timer, ours_mod, q, k, v, bt, seq, fuse=False, merge=False)[0]
            r["separate_us"] = run_ours(timer, ours_mod, q, k, v, bt, seq, fuse=False)[0]
            r["fused_us"] = run_ours(timer, ours_mod, q, k, v, bt, seq, fuse=True)[0]
        for cfg in GRID:
            for fuse in ((False, True) if plan.max_splits > 1 else (None,)):
                try:
                    us, _, fz, err = run_ours(timer, ours_mod, q, k, v, bt, seq, config=cfg, fuse=fuse, ref=ref)
                    r["variants"][f"{cfg}{' fused' if fz else ''}"] = dict(us=us, err=err)
                except Exception as e:  # noqa: BLE001 - e.g. out of shared memory
                    r["variants"][f"{cfg} fuse={fuse}"] = dict(error=f"{type(e).__name__}: {str(e)[:100]}")
        fixed = {}
        for s in (512, 1024, 2048, 4096, 8192, 16384, 32768):
            if 4 <= ctx // s <= 64:
                fixed[s] = run_ours(timer, ours_mod, q, k, v, bt, seq, policy=f"size:{s}")[0]
        fixed["none"] = run_ours(timer, ours_mod, q, k, v, bt, seq, policy="none")[0]
        r["fixed_us"] = {str(kk): vv for kk, vv in fixed.items()}
        if base_mod is not None:
            r["baseline_us"], _, r["baseline_fused"], r["baseline_err"] = run_ours(timer, base_mod, q, k, v, bt, seq,
                                                                                ref=ref)
            r["baseline_v1cfg_us"] = run_ours(timer, base_mod, q, k, v, bt, seq, fuse=False,
                                              config=base_cfg(64, 4, 2, prefetch=False))[0]
        r.update({k.replace("sdpa_", ""): v for k, v in peers(timer, q, kc, vc, want_flex=False).items()})
        ok = [(vv["us"], kk) for kk, vv in r["variants"].items() if "us" in vv]
        r["best_variant"] = min(ok) if ok else None
        r["pct_ceiling"] = 100 * nbytes / (r["default_us"] * 1e-6) / 1e9 / res["ceiling_gbps"]
        res["points"].append(r)
        del q, k, v, bt, seq, kc, vc
        torch.cuda.empty_cache()
        with open(os.path.join(a.out, "perf.json"), "w") as f:
            json.dump(res, f, indent=1)
        print(f"{name}: default {r['default_us']:.1f} us ({r['pct_ceiling']:.0f}%) cudnn {r.get('cudnn')} "
              f"best {r['best_variant']} [{time.time() - t0:.0f}s]", flush=True)
    print(summary(res))
    with open(os.path.join(a.out, "perf.md"), "w") as f:
        f.write(summary(res) + "\n")
    return 0


def summary(res) -> str:
    c = res["ceiling_gbps"]
    lines = [f"{res['gpu']}, torch {res['torch']}, triton {res['triton']}, {res['date']}, copy ceiling {c:.0f} GB/s",
             "| point | splits | ours µs | % ceil | stage 1 µs | merge share | best variant µs | baseline µs | "
             "cuDNN µs | flash µs | best peer / ours | err |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in res["points"]:
        peer = min([x for x in (r.get("cudnn"), r.get("flash")) if x] or [float("nan")])
        s1 = r.get("stage1_us")
        share = f"{100 * max(0.0, 1 - s1 / r['default_us']):.0f}%" if s1 else "0%"
        bv = r["best_variant"]
        lines.append(f"| {r['point']} | {r['splits']} | {r['default_us']:.1f} | {r['pct_ceiling']:.0f} | "
                     f"{s1 or r['default_us']:.1f} | {share} | {bv[0]:.1f} ({bv[1]}) | "
                     f"{r.get('baseline_us', float('nan')):.1f} | {r.get('cudnn') or float('nan'):.1f} | "
                     f"{r.get('flash') or float('nan'):.1f} | {peer / r['default_us']:.2f} | {r['default_err']:.1e} |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
