#!/usr/bin/env python3
"""Decode-attention benchmark on a CUDA GPU: our Triton split-KV kernels against the peers.

Per point (batch, context, Hq/Hkv, head dim, dtype; page size 16, one query per request):

* ours with the ``auto`` plan, with no split, and with every fixed split size of a sweep (the best
  is reported as "best fixed"); the auto plan's stage 1 alone gives the share of time in the merge;
* PyTorch SDPA with the cuDNN and the flash backends, and compiled Flex attention, on a contiguous
  ``[B, H, L, D]`` copy of the same KV (GQA native: ``enable_gqa``);
* a device-to-device copy of a large buffer as the bandwidth ceiling (bytes read + written).

Timing: each implementation is captured in a CUDA graph; every timed replay follows an L2 flush
(a write of a buffer larger than the L2), is bracketed by CUDA events, and the median is kept.

Outputs (``--out DIR``): ``bench.json`` (every number), ``bench.md`` (the table), ``bench.png``
(KV-read bandwidth against context, one line per implementation, for the headline configuration).

    python scripts/bench_decode.py --out results            # the full sweep
    python scripts/bench_decode.py --quick --out results     # a few points
    python scripts/h200_perf_check.py --out results          # kernel variants at the key points
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

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from splitkv_common.optional import require  # noqa: E402

torch = require("torch", "scripts/bench_decode.py")
require("triton", "scripts/bench_decode.py")

from cuda_ref.wrapper import DecodeWrapper  # noqa: E402

PAGE = 16
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
FLUSH_BYTES = 256 << 20


class Timer:
    """Median time (µs) of CUDA-graph replays, each after an L2 flush.

    ``flush``: ``"read"`` (default) reads a buffer larger than the L2 before each replay, leaving
    the L2 full of clean lines of other data, as in a model where the previous layer read its own
    KV and weights; ``"write"`` zeroes that buffer instead (``triton.testing.do_bench``'s flush),
    leaving the L2 full of dirty lines that the timed kernel must first write back, up to the L2's
    size in extra traffic (measured in docs/perf-notes.md); ``"none"`` flushes nothing (hot L2)."""

    def __init__(self, iters: int = 20, warmup_s: float = 0.01, flush: str = "read"):
        if flush not in ("read", "write", "none"):
            raise ValueError(f"flush: must be 'read', 'write' or 'none', got {flush!r}")
        self.iters, self.warmup_s, self.flush_mode = iters, warmup_s, flush
        self.flush = torch.zeros(FLUSH_BYTES // 4, dtype=torch.float32, device="cuda")

    def _flush(self):
        if self.flush_mode == "read":
            self.flush.sum()
        elif self.flush_mode == "write":
            self.flush.zero_()

    def graph(self, fn):
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(2):
                fn()
        torch.cuda.current_stream().wait_stream(s)
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            fn()
        torch.cuda.synchronize()
        return g.replay

    def __call__(self, fn, use_graph: bool = True) -> float:
        run = self.graph(fn) if use_graph else fn
        # keep the GPU busy for warmup_s first: after host-side work the clocks are down, and a
        # fixed count of warm-up calls left the first implementation timed at a point slow
        # (docs/perf-notes.md, "A slow first timing")
        t_end, n = time.perf_counter() + self.warmup_s, 0
        while n < 3 or time.perf_counter() < t_end:
            run()
            n += 1
            if n % 8 == 0:
                torch.cuda.synchronize()
        ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(self.iters)]
        for a, b in ev:
            self._flush()
            a.record()
            run()
            b.record()
        torch.cuda.synchronize()
        return float(np.median([a.elapsed_time(b) for a, b in ev]) * 1e3)


def batch_lengths(point: str, seed) -> tuple:
    """``"BxL"`` (every request ``L`` tokens) or ``"rBxL"`` (lengths drawn uniformly in [512, L) by
    ``numpy.random.default_rng(seed)``): ``(B, L, ragged, lengths [B] int64)``."""
    b, _, n = point.partition("x")
    ragged, B, L = b.startswith("r"), int(b.lstrip("r")), int(n)
    return B, L, ragged, np.random.default_rng(seed).integers(512, L, B) if ragged else np.full(B, L)


def interleaved(timer: Timer, runs: dict, passes: int = 3) -> dict:
    """``{name: [µs of each pass]}``: each of ``runs`` (name -> callable, e.g. a graph's replay from
    :meth:`Timer.graph`) timed by ``timer`` in turn, ``passes`` times, so that a drift of the GPU's
    or the host's speed falls on all of them alike."""
    out = {n: [] for n in runs}
    for _ in range(passes):
        for n, fn in runs.items():
            out[n].append(timer(fn, use_graph=False))
    return out


def save_outputs(out_dir: str, stem: str, res: dict, lines: list) -> str:
    """``res`` as ``OUT_DIR/STEM.json`` and ``lines`` as ``OUT_DIR/STEM.md`` (the directory made if
    missing); returns the Markdown text."""
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, f"{stem}.json"), "w") as f:
        json.dump(res, f, indent=1)
    text = "\n".join(lines)
    with open(os.path.join(out_dir, f"{stem}.md"), "w") as f:
        f.write(text + "\n")
    return text


def copy_ceiling(timer: Timer, nbytes: int = 2 << 30) -> float:
    """GB/s of a device-to-device copy, counting bytes read plus bytes written."""
    src = torch.randn(nbytes // 2, dtype=torch.bfloat16, device="cuda")
    dst = torch.empty_like(src)
    t_end = time.time() + 1.0  # bring the clocks up before the first timing
    while time.time() < t_end:
        dst.copy_(src)
    torch.cuda.synchronize()
    us = min(timer(lambda: dst.copy_(src), use_graph=False), timer(lambda: dst.copy_(src)))
    return 2 * nbytes / (us * 1e-6) / 1e9


def make_point(B, ctx, hq, hkv, D, dtype, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    pages_per = ctx // PAGE
    P = B * pages_per
    k = torch.randn((P, PAGE, hkv, D), generator=g, device="cuda", dtype=dtype)
    v = torch.randn((P, PAGE, hkv, D), generator=g, device="cuda", dtype=dtype)
    bt = torch.randperm(P, generator=g, device="cuda").to(torch.int32).view(B, pages_per)
    q = torch.randn((B, hq, D), generator=g, device="cuda", dtype=dtype)
    seq = torch.full((B,), ctx, dtype=torch.int32, device="cuda")
    return q, k, v, bt, seq


def random_batches(max_batch: int, n: int, seed: int = 0, lo: int = 512, hi: int = 8192) -> list:
    """``n`` decode batches as a serving step sees them, the batch changing every step: each of 1 to
    ``max_batch`` requests (drawn at random) with lengths uniform in ``[lo, hi]``, as ``(B, lens int64
    [B] (host), seq_lens int32 [B], query_start_loc int32 [B + 1] (one row each; CUDA))`` (the first
    ``B`` rows of a :func:`make_point` of ``max_batch`` requests and ``hi`` tokens serve them all)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        B = int(rng.integers(1, max_batch + 1))
        lens = rng.integers(lo, hi + 1, B)
        out.append((B, lens, torch.from_numpy(lens.astype(np.int32)).cuda(),
                    torch.arange(B + 1, dtype=torch.int32, device="cuda")))
    return out


def contiguous_kv(k, bt, B, ctx):
    """``[B, Hkv, ctx, D]`` contiguous copy of a paged cache (the peers' layout)."""
    x = k[bt.long()]  # [B, pages, PAGE, Hkv, D]
    return x.view(B, ctx, k.shape[2], k.shape[3]).transpose(1, 2).contiguous()


def split_sizes(ctx: int, max_splits: int = 64) -> list[int]:
    out, s = [], 64
    while s < ctx:
        if math.ceil(ctx / s) <= max_splits:
            out.append(s)
        s *= 2
    return out


def ours(timer, q, k, v, bt, seq, policy, *, stage1_only=False, min_split=None, config=None, max_splits=None):
    B = bt.shape[0]
    w = DecodeWrapper(q.shape[1], k.shape[2], q.shape[2], PAGE, dtype=q.dtype, policy=policy,
                      min_split_tokens=min_split, config=config, max_splits=max_splits)
    plan = w.plan(seq.cpu().numpy())
    w.merge = not stage1_only
    qsl = torch.arange(B + 1, dtype=torch.int32, device="cuda")
    us = timer(lambda: w.run(q, k, v, bt, seq, qsl))
    return us, plan, w.workspace_bytes()


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


def sdpa_peers(timer, q, kc, vc) -> dict:
    """PyTorch SDPA with the cuDNN and the flash backends on the contiguous copy (µs, or None and
    the error when a backend refuses the shape)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    F = torch.nn.functional
    q4 = q[:, :, None, :]  # [B, Hq, 1, D]
    res = {}
    for name, be in (("sdpa_cudnn", SDPBackend.CUDNN_ATTENTION), ("sdpa_flash", SDPBackend.FLASH_ATTENTION)):
        def f(be=be):
            with sdpa_kernel([be]):
                return F.scaled_dot_product_attention(q4, kc, vc, enable_gqa=True)
        try:
            f()
            res[name] = timer(f)
        except Exception as e:  # noqa: BLE001 - a peer refusing a shape is a result
            res[name] = None
            res[name + "_error"] = f"{type(e).__name__}: {str(e)[:120]}"
    return res


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


def parse_points(text: str) -> list[tuple]:
    """``B1x16k,B1x32k@16/2/256,B16x4k@32/8/64`` -> ``[(B, ctx, hq, hkv, D, "bf16"), ...]`` (default heads
    32 / 8, head dim 128). Raises ``ValueError`` naming a point it cannot read."""
    pts = []
    for item in text.split(","):
        item = item.strip()
        shape, _, heads = item.partition("@")
        b, sep, n = shape.upper().lstrip("B").partition("X")
        try:
            if not sep:
                raise ValueError
            ctx = int(n[:-1]) * 1024 if n.endswith("K") else int(n)
            h = [int(x) for x in heads.split("/")] if heads else []
            if len(h) not in (0, 2, 3):
                raise ValueError
            hq, hkv, D = (h + [32, 8, 128][len(h):]) if h else (32, 8, 128)
            pts.append((int(b), ctx, hq, hkv, D, "bf16"))
        except ValueError:
            raise ValueError(f"--points: {item!r} is not B<batch>x<context>[@hq/hkv[/D]], e.g. B1x16k@64/8") from None
    return pts


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


def kv_bytes(B, ctx, hkv, D, dt):
    return 2 * B * ctx * hkv * D * torch.empty(0, dtype=DTYPES[dt]).element_size()


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
        print("bench_decode: needs a CUDA GPU", file=sys.stderr)
        return 2
    os.makedirs(args.out, exist_ok=True)
    res = run_bench(args)
    with open(os.path.join(args.out, "bench.json"), "w") as f:
        json.dump(res, f, indent=1)
    md = to_markdown(res)
    with open(os.path.join(args.out, "bench.md"), "w") as f:
        f.write(md)
    plot(res, os.path.join(args.out, "bench.png"))
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
