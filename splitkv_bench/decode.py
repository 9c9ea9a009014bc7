"""Decode-attention benchmark on a CUDA GPU: our Triton split-KV kernels against the peers.

Per point (batch, context, Hq/Hkv, head dim, dtype; page size 16, one query per request):

* ours with the ``auto`` plan, with no split, and with every fixed split size of a sweep (the best
  is reported as "best fixed"); the auto plan's stage 1 alone gives the share of time in the merge;
* PyTorch SDPA with the cuDNN and the flash backends, and compiled Flex attention, on a contiguous
  ``[B, H, L, D]`` copy of the same KV (GQA native: ``enable_gqa``);
* a device-to-device copy of a large buffer as the bandwidth ceiling (bytes read + written).

Timing: each implementation is captured in a CUDA graph; every timed replay follows an L2 flush
(``--flush``: a read of a buffer larger than the L2 by default), is bracketed by CUDA events, and the
median is kept (``splitkv_bench.gpu.Timer``).

Outputs (``--out DIR``): ``bench.json`` (every number), ``bench.md`` (the table), ``bench.png``
(KV-read bandwidth against context, one line per implementation, for the headline configuration).

    python -m splitkv_bench decode --out results            # the full sweep
    python -m splitkv_bench decode --quick --out results    # a few points
    python -m splitkv_bench perf-check --out results        # kernel variants at the key points
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import platform
import sys
import time

from splitkv_bench.gpu import (DTYPES, PAGE, Timer, contiguous_kv, copy_ceiling, kv_bytes, make_point, ours,
                               parse_points, sdpa_peers, torch)
from cuda_ref.wrapper import DecodeWrapper
from splitkv_bench.output import save_outputs


def split_sizes(ctx: int, max_splits: int = 64) -> list[int]:
    out, s = [], 64
    while s < ctx:
        if math.ceil(ctx / s) <= max_splits:
            out.append(s)
        s *= 2
    return out


def check_ours_once(q, k, v, bt, seq, kc, vc) -> float:
    """Relative error of the auto plan against SDPA math on the contiguous copy (sanity of the bench)."""
    w = DecodeWrapper(q.shape[1], k.shape[2], q.shape[2], PAGE, dtype=q.dtype)
    w.plan(seq.cpu().numpy())
    out, _ = w.run(q, k, v, bt, seq)
    B = q.shape[0]
    sub = min(B, 4)
    ref = torch.nn.functional.scaled_dot_product_attention(
        q[:sub, :, None].float(), kc[:sub].float(), vc[:sub].float(), enable_gqa=True)[:, :, 0]
    return float((out[:sub].float() - ref).norm() / ref.norm())


@functools.lru_cache(maxsize=None)
def _compiled_flex():
    from torch.nn.attention.flex_attention import flex_attention
    return torch.compile(flex_attention)


def flex_peer(timer, q, kc, vc) -> dict:
    """Compiled Flex attention on the contiguous copy (recompiles for every shape: slow)."""
    try:
        fx, q4 = _compiled_flex(), q[:, :, None, :]
        fx(q4, kc, vc, enable_gqa=True)
        return {"flex": timer(lambda: fx(q4, kc, vc, enable_gqa=True))}
    except Exception as e:  # noqa: BLE001
        return {"flex": None, "flex_error": f"{type(e).__name__}: {str(e)[:120]}"}


def sweep_points(args):
    if getattr(args, "points", None):
        return parse_points(args.points)
    pts = []
    if args.quick:
        for B, ctx in ((1, 4096), (1, 16384), (1, 65536), (16, 8192), (64, 2048)):
            pts.append((B, ctx, 32, 8, 128, "bf16"))
        return pts
    for dt in ("bf16", "fp16"):
        for hq, hkv in ((32, 8), (64, 8), (32, 32)):
            for B in (1, 4, 16, 64, 128):
                for ctx in (1024, 4096, 16384, 65536, 131072):
                    pts.append((B, ctx, hq, hkv, 128, dt))
    for D in (64, 256):
        for B, ctx in ((1, 16384), (16, 4096), (64, 4096)):
            pts.append((B, ctx, 32, 8, D, "bf16"))
    return pts


def flex_wanted(B, ctx, hq, hkv, D, dt, spent, budget=90.0):
    """Flex recompiles for every shape (tens of seconds each): headline configuration only, within a budget."""
    return (dt == "bf16" and (hq, hkv, D) == (32, 8, 128) and B in (1, 16, 64) and spent < budget
            and B * ctx <= 64 * 16384)


def headline(timer, q, k, v, bt, seq, kc, vc):
    """``({auto_us, sdpa_cudnn, sdpa_flash}, plan, workspace bytes)`` at one point."""
    us, plan, ws = ours(timer, q, k, v, bt, seq, "auto")
    return dict(auto_us=us, **sdpa_peers(timer, q, kc, vc)), plan, ws


def run_bench(args):
    from tqdm import tqdm
    timer = Timer(args.iters, flush=args.flush)
    other = Timer(args.iters, flush=args.also_flush) if args.also_flush else None
    ceiling = copy_ceiling(timer)
    pts = [p for p in sweep_points(args) if kv_bytes(p[0], p[1], p[3], p[4], p[5]) <= args.max_kv_gb * 1e9]
    skipped = [p for p in sweep_points(args) if p not in pts]
    rows, flex_spent = [], 0.0
    bar = tqdm(pts, unit="pt")
    for (B, ctx, hq, hkv, D, dt) in bar:
        bar.set_postfix_str(f"B{B} ctx{ctx} {hq}/{hkv} D{D} {dt}")
        q, k, v, bt, seq = make_point(B, ctx, hq, hkv, D, DTYPES[dt])
        kc, vc = contiguous_kv(k, bt, B, ctx), contiguous_kv(v, bt, B, ctx)
        nbytes = kv_bytes(B, ctx, hkv, D, dt)
        r = dict(B=B, ctx=ctx, hq=hq, hkv=hkv, D=D, dtype=dt, kv_bytes=nbytes)

        # The headline numbers (auto plan, SDPA peers) twice, first and last at the point, keeping
        # the faster of each: the first round follows the previous point's work, after which the
        # GPU can run slower for a while (docs/benchmarks.md, method).
        first, plan, ws = headline(timer, q, k, v, bt, seq, kc, vc)
        r.update(auto_plan=str(plan.policy) + f" split={plan.split_tokens or 'none'}",
                 auto_splits=int(plan.max_splits), auto_items=plan.num_valid_items, workspace_bytes=ws)
        # stage 1 alone (merge launch left out): the share of time in the merge
        s1 = ours(timer, q, k, v, bt, seq, "auto", stage1_only=True)[0] if plan.max_splits > 1 else None
        if other is not None:  # the auto plan and the SDPA peers under the other flush method too
            r["other_flush"] = dict(method=args.also_flush, auto_us=ours(other, q, k, v, bt, seq, "auto")[0],
                                    **{n: t for n, t in sdpa_peers(other, q, kc, vc).items()
                                       if not n.endswith("_error")})
        r["none_us"] = ours(timer, q, k, v, bt, seq, "none")[0]
        fixed = {}
        for s in split_sizes(ctx):
            fixed[s] = ours(timer, q, k, v, bt, seq, f"size:{s}")[0]
        r["fixed_us"] = {str(s): t for s, t in fixed.items()}
        for m in args.auto_min_split or ():  # auto with another shortest split than the profile's
            t, p, _ = ours(timer, q, k, v, bt, seq, "auto", min_split=m)
            r.setdefault("auto_min_split", {})[str(m)] = dict(us=t, split_tokens=int(p.split_tokens))
        best_s = min(fixed, key=fixed.get) if fixed else None
        r["best_fixed_size"] = best_s
        r["best_fixed_us"] = fixed[best_s] if fixed else r["none_us"]
        r["rel_err_vs_sdpa_math"] = check_ours_once(q, k, v, bt, seq, kc, vc)
        t0 = time.time()
        if flex_wanted(B, ctx, hq, hkv, D, dt, flex_spent, args.flex_budget) and not args.no_flex:
            r.update(flex_peer(timer, q, kc, vc))
            flex_spent += time.time() - t0
        second = headline(timer, q, k, v, bt, seq, kc, vc)[0]
        for n, t in first.items():
            r[n] = min(t, second[n]) if isinstance(t, float) and isinstance(second.get(n), float) else t
        r["headline_rounds_us"] = {n: [first[n], second.get(n)] for n in ("auto_us", "sdpa_cudnn", "sdpa_flash")}
        r["auto_stage1_us"] = s1 if s1 is not None else r["auto_us"]
        r["merge_share"] = max(0.0, 1 - s1 / r["auto_us"]) if s1 is not None else 0.0
        del k, v, kc, vc, q, bt, seq
        torch.cuda.empty_cache()
        peer_t = [r[n] for n in ("sdpa_cudnn", "sdpa_flash", "flex") if r.get(n)]
        r["best_peer_us"] = min(peer_t) if peer_t else None
        best_ours = r["auto_us"]
        r["gbps"] = nbytes / (best_ours * 1e-6) / 1e9
        r["pct_ceiling"] = 100 * r["gbps"] / ceiling
        r["ratio_to_best_peer"] = (r["best_peer_us"] / best_ours) if r["best_peer_us"] else None
        r["auto_vs_best_fixed"] = best_ours / min(r["best_fixed_us"], r["none_us"])
        rows.append(r)
        if args.partial:
            with open(args.partial, "w") as f:
                json.dump(dict(ceiling_gbps=ceiling, rows=rows, meta=meta(args), partial=True), f)
    return dict(ceiling_gbps=ceiling, rows=rows, skipped=[list(p) for p in skipped], flex_seconds=flex_spent,
                meta=meta(args))


def meta(args):
    import triton
    from splitkv_common.provenance import provenance

    return dict(provenance=provenance(), gpu=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
                cuda=torch.version.cuda, cudnn=torch.backends.cudnn.version(), python=platform.python_version(),
                date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), iters=args.iters, flush=args.flush,
                also_flush=getattr(args, "also_flush", None),
                sms=torch.cuda.get_device_properties(0).multi_processor_count)


def fmt(x, nd=1):
    return "-" if x is None else f"{x:.{nd}f}"


def to_markdown(res) -> str:
    from splitkv_common.provenance import provenance_markdown

    m = res["meta"]
    other = m.get("also_flush")
    lines = provenance_markdown(m["provenance"]) if "provenance" in m else []
    lines += [f"Machine: {m['gpu']} ({m['sms']} SMs); torch {m['torch']}, triton {m['triton']}, CUDA {m['cuda']}, "
              f"cuDNN {m['cudnn']}; {m['date']}. Copy ceiling {res['ceiling_gbps']:.0f} GB/s (read + write). "
              f"Times are medians of {m['iters']} CUDA-graph replays, each after an L2 flush "
              f"({m.get('flush', 'write')}: see the method in docs/benchmarks.md).", "",
              "| B | ctx | Hq/Hkv | D | dtype | auto µs | plan | none µs | best fixed µs (size) | cuDNN µs | flash µs | "
              "Flex µs | GB/s | % ceiling | best peer / ours | auto / best fixed | merge share | workspace KiB |"
             + (" auto / cuDNN µs, other flush |" if other else ""),
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|" + ("---|" if other else "")]
    for r in res["rows"]:
        o = r.get("other_flush", {})
        lines.append(
            f"| {r['B']} | {r['ctx']} | {r['hq']}/{r['hkv']} | {r['D']} | {r['dtype']} | {fmt(r['auto_us'])} | "
            f"{r['auto_splits']} splits | {fmt(r['none_us'])} | {fmt(r['best_fixed_us'])} ({r['best_fixed_size']}) | "
            f"{fmt(r.get('sdpa_cudnn'))} | {fmt(r.get('sdpa_flash'))} | {fmt(r.get('flex'))} | {r['gbps']:.0f} | "
            f"{r['pct_ceiling']:.0f} | {fmt(r['ratio_to_best_peer'], 2)} | {r['auto_vs_best_fixed']:.3f} | "
            f"{100 * r['merge_share']:.0f}% | {r['workspace_bytes'] / 1024:.0f} |"
            + (f" {fmt(o.get('auto_us'))} / {fmt(o.get('sdpa_cudnn'))} |" if other else ""))
    if other:
        lines += ["", f"Other flush: {other} (see docs/benchmarks.md, method)."]
    alt = [r for r in res["rows"] if r.get("auto_min_split")]
    if alt:
        lines += ["", "`auto` with another shortest split than the profile's (`--auto-min-split`; µs, its split length):",
                  "", "| B | ctx | Hq/Hkv | D | auto µs (split) | " + " | ".join(
                      f"min split {m} µs (split)" for m in alt[0]["auto_min_split"]) + " | cuDNN µs |",
                  "|---|---|---|---|---|" + "---|" * len(alt[0]["auto_min_split"]) + "---|"]
        for r in alt:
            lines.append(f"| {r['B']} | {r['ctx']} | {r['hq']}/{r['hkv']} | {r['D']} | {fmt(r['auto_us'])} "
                         f"({r['auto_plan'].rpartition('=')[2]}) | "
                         + " | ".join(f"{fmt(a['us'])} ({a['split_tokens'] or 'none'})"
                                      for a in r["auto_min_split"].values())
                         + f" | {fmt(r.get('sdpa_cudnn'))} |")
    if res.get("skipped"):
        lines += ["", "Skipped (KV over the size limit of the run): " +
                  ", ".join(f"B{p[0]}/ctx{p[1]}/{p[2]}-{p[3]}/D{p[4]}/{p[5]}" for p in res["skipped"])]
    return "\n".join(lines) + "\n"


def plot(res, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rows = [r for r in res["rows"] if (r["hq"], r["hkv"], r["D"], r["dtype"]) == (32, 8, 128, "bf16")]
    batches = sorted({r["B"] for r in rows})
    fig, axes = plt.subplots(1, len(batches), figsize=(4 * len(batches), 3.6), sharey=True, squeeze=False)
    impls = [("auto_us", "ours (auto)"), ("best_fixed_us", "ours (best fixed)"), ("none_us", "ours (no split)"),
             ("sdpa_cudnn", "SDPA cuDNN"), ("sdpa_flash", "SDPA flash"), ("flex", "Flex (compiled)")]
    for ax, B in zip(axes[0], batches):
        rb = sorted((r for r in rows if r["B"] == B), key=lambda r: r["ctx"])
        for key, label in impls:
            xs = [r["ctx"] for r in rb if r.get(key)]
            ys = [r["kv_bytes"] / (r[key] * 1e-6) / 1e9 for r in rb if r.get(key)]
            if xs:
                ax.plot(xs, ys, marker="o", label=label)
        ax.axhline(res["ceiling_gbps"], color="gray", ls="--", label="copy ceiling")
        ax.set_xscale("log", base=2)
        ax.set_title(f"batch {B}")
        ax.set_xlabel("context (tokens)")
    axes[0][0].set_ylabel("KV read GB/s")
    handles = {}
    for ax in axes[0]:  # one legend for all panels (Flex runs at some batches only)
        for h, lab in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(lab, h)
    fig.legend(handles.values(), handles.keys(), loc="lower center", ncol=len(handles), fontsize=8)
    fig.suptitle(f"Decode attention, bf16, Hq 32 / Hkv 8, D 128, page 16 — {res['meta']['gpu']}")
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    fig.savefig(path, dpi=110)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="bench_out")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--points", default=None,
                    help="only these points, bf16: B<batch>x<context>[@hq/hkv[/D]] comma-separated, e.g. "
                         "B1x16k,B1x16k@64/8,B1x32k@16/2/256 (heads 32 / 8 and D 128 unless given)")
    ap.add_argument("--no-flex", action="store_true")
    ap.add_argument("--auto-min-split", type=int, nargs="+", default=None, metavar="N",
                    help="also time auto with these shortest split lengths (tokens) instead of the profile's")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--flush", default="read", choices=("read", "write", "none"),
                    help="L2 flush before each timed replay (see Timer)")
    ap.add_argument("--also-flush", default=None, choices=("read", "write", "none"),
                    help="time the auto plan and the SDPA peers under this flush method as well")
    ap.add_argument("--max-kv-gb", type=float, default=36.0)
    ap.add_argument("--partial", default=None, help="rewrite this JSON after every point")
    ap.add_argument("--flex-budget", type=float, default=90.0, help="seconds of Flex compiles and timing")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("splitkv_bench decode: needs a CUDA GPU", file=sys.stderr)
        return 2
    res = run_bench(args)
    md = save_outputs(args.out, "bench", res, to_markdown(res))
    plot(res, os.path.join(args.out, "bench.png"))
    print(md)
    return 0
