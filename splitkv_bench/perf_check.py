"""Variants of the Triton kernels at the key decode points, against SDPA and the copy ceiling, in one
run on a CUDA GPU, under each L2-flush method of the timer (see docs/perf-notes.md).

For each point (bf16, Hq 32 / Hkv 8, D 128, page 16, one query per request) and each flush method:
the default (``auto`` plan, separate merge by programmatic dependent launch where the GPU has it),
the same with a plain merge launch, with the merge fused into stage 1, stage 1 alone (for the merge
share), the same cache laid out head-major within each page ("HND"), fixed split sizes, a grid of stage-1 configurations, and PyTorch SDPA with the cuDNN and
flash backends on a contiguous copy. Every configuration's output is checked against SDPA's math
backend. Method as ``splitkv_bench/decode.py``: CUDA-graph replay after an L2 flush, median.

    python -m splitkv_bench perf-check --out DIR [--points B1x16k,B64x2k] [--flush read,write]
    python -m splitkv_bench perf-check --eager-once B1x16k     # one eager call of each (for ncu)
    python -m splitkv_bench perf-check --out DIR --overhead B1x16k,B64x2k   # cost of the safety checks
    python -m splitkv_bench perf-check --out DIR --eager B1x4k,B1x16k,B64x2k  # eager run(): launch fast path on / off
    python -m splitkv_bench perf-check ... --variants default,n32w4s5       # only these variants (and the peers)
    python -m splitkv_bench perf-check ... --kernels-from OLD/kernels.py    # another version of cuda_ref/kernels.py

``--kernels-from`` runs everything with the kernels of another file (e.g. ``git show REV:cuda_ref/kernels.py``,
same kernel signatures) in place of ``cuda_ref/kernels.py``: the before / after of a kernel change in one run.
(Run 12 timed the kernels of bd22d80 this way, before ``split_kv_kernel`` took ``MIXED_TILES``: versions without
that parameter no longer launch from the current ``launch.py``.)

``--overhead`` writes ``DIR/overhead.json``: per point, the replayed graph of ``run()`` with the
kernels' bounds masks (the default) and without them (``launch.KERNEL_BOUNDS = False``, the
previous kernel), the host time of ``run()``'s metadata checks on a repeated signature (the cached
path) and uncached, and eager ``run()`` against an eager launch with no checks at all; each cost as
a percentage of the default graph's decode time (target: at most 1 %); ``DIR/overhead.md`` the
tables. Each point also times the host check path by part on its tensors (:func:`check_path_us`:
the guard of the last call, new views of the same tensors, the Python guard, the signature path,
uncached), and again on CPU tensors of the same shapes; ``--overhead POINTS --cpu`` times only those
(no GPU needed):

    python -m splitkv_bench perf-check --out DIR --overhead B1x16k,B64x2k --cpu

``--eager`` writes ``DIR/eager.json`` and ``DIR/eager.md``: per point, eager ``DecodeWrapper.run()``
with the launch fast path (``cuda_ref.fast_launch``) on and off (``SPLITKV_FAST_LAUNCH``, a fresh
wrapper each): which path ran (and why), the host time of one call with the GPU idle (each call timed
alone after a synchronize; median of 200 after warm-up), back-to-back eager calls, the GPU span of one
eager call (CUDA events), a CUDA-graph replay captured with that path, and whether the outputs (eager
and replayed) are bitwise equal between the two paths; the same point with the fused merge (one
launch: host time of a call and back-to-back, and whether its output equals the separate merge's);
and the host time of ``run()`` right after ``plan()`` of other sizes (two plans alternating, the GPU
idle before each call): with a new prepared launch every call (the wrapper's launch cache emptied:
the first-call path, which with the fast path on reuses the compiled kernel checked before) and with
the wrapper's cache kept (plans of one batch whose sizes change only the grid share one prepared
launch: ``cuda_ref.launch.plan_launch_key``). Once per run, ``run()`` right after ``plan()`` of a new
batch every step (1-64 requests at random over one cache: an eager serving step,
:func:`eager_new_batches`). A failing step is recorded, never raised.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import os
import time

from splitkv_common.optional import require

torch = require("torch", "python -m splitkv_bench perf-check")

from splitkv_bench.gpu import (PAGE, Timer, contiguous_kv, copy_ceiling, kv_bytes, make_point,  # noqa: E402
                               random_batches, sdpa_peers)
from cuda_ref.launch import KernelConfig, default_config  # noqa: E402
from splitkv_bench.output import save_outputs  # noqa: E402
from cuda_ref.wrapper import DecodeWrapper  # noqa: E402
from splitkv_common.provenance import provenance, provenance_markdown  # noqa: E402

POINTS = {"B1x1k": (1, 1024), "B1x2k": (1, 2048), "B16x1k": (16, 1024), "B4x1k": (4, 1024), "B16x2k": (16, 2048),
          "B16x4k": (16, 4096), "B32x1k": (32, 1024), "B1x4k": (1, 4096), "B1x16k": (1, 16384), "B1x64k": (1, 65536), "B1x128k": (1, 131072),
          "B16x8k": (16, 8192), "B64x2k": (64, 2048), "B128x1k": (128, 1024)}
GRID = [KernelConfig(64, 4, 3), KernelConfig(64, 4, 5), KernelConfig(64, 4, 7), KernelConfig(32, 4, 5),
        KernelConfig(32, 4, 7), KernelConfig(64, 8, 5), KernelConfig(64, 8, 7), KernelConfig(128, 8, 5),
        KernelConfig(32, 4, 4), KernelConfig(32, 2, 5), KernelConfig(16, 4, 7)]

NO_SPLIT_GRID = [KernelConfig(64, 4, 7), KernelConfig(64, 8, 7), KernelConfig(128, 8, 5), KernelConfig(128, 4, 4),
                 KernelConfig(32, 4, 7), KernelConfig(128, 8, 3), KernelConfig(128, 8, 4), KernelConfig(128, 8, 6),
                 KernelConfig(128, 4, 5), KernelConfig(64, 8, 5)]


def make_runner(q, k, v, bt, seq, policy="auto", config=None, fuse=None, merge=True, pdl=None, merge_warps=None):
    """``(run, plan, wrapper)``: ``run()`` launches our kernels for the point (planned once here)."""
    B = bt.shape[0]
    w = DecodeWrapper(q.shape[1], k.shape[2], q.shape[2], PAGE, dtype=q.dtype, policy=policy, config=config,
                      fuse_merge=fuse)
    plan = w.plan(seq.cpu().numpy())
    if merge_warps is not None:  # the default stage-1 configuration with another merge width
        w.config = dataclasses.replace(default_config(q.shape[2], k.element_size(), plan.num_items,
                                                      plan.policy.kind in ("fixed_size", "none")),
                                       merge_warps=merge_warps)
    w.merge, w.pdl = merge, pdl
    qsl = torch.arange(B + 1, dtype=torch.int32, device="cuda")
    return (lambda: w.run(q, k, v, bt, seq, qsl)), plan, w


def rel_err(run, ref) -> float:
    out, _ = run()
    sub = ref.shape[0]
    return float((out[:sub].float() - ref).norm() / ref.norm())


def variants(ctx, B):
    """name -> make_runner keyword arguments."""
    v = {"default": {}, "plain merge launch": dict(pdl=False), "fused merge": dict(fuse=True),
         "stage 1 alone": dict(merge=False), "no split": dict(policy="none"),
         "HND cache": dict(layout="HND"), "HND cache, stage 1 alone": dict(layout="HND", merge=False),
         "pages in order": dict(layout="NHD in order"),
         "pages in order, stage 1 alone": dict(layout="NHD in order", merge=False),
         "HND cache, pages in order, stage 1 alone": dict(layout="HND in order", merge=False)}
    for w in (1, 2, 8):  # warps of the merge kernel (the stage-1 configuration as by default)
        v[f"merge {w} warps"] = dict(merge_warps=w)
    if B == 1:
        for s in (128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768):
            if 4 <= ctx // s <= 64:
                v[f"size:{s}"] = dict(policy=f"size:{s}")
                v[f"size:{s} plain merge launch"] = dict(policy=f"size:{s}", pdl=False)
    else:
        for s in (ctx // 2, ctx // 4):
            v[f"size:{s}"] = dict(policy=f"size:{s}")
        for cfg in NO_SPLIT_GRID:   # one item per (request, KV head): no merge, one program an SM or so
            v[f"no split {cfg}"] = dict(policy="none", config=cfg)
    for cfg in GRID:
        v[str(cfg)] = dict(config=cfg)
    return v


def load_kernels(path: str):
    """The module of ``path`` (another version of ``cuda_ref/kernels.py``)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("cuda_ref_kernels_alt", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def use_kernels_from(path: str) -> None:
    """Launch the kernels of ``path`` (a version of ``cuda_ref/kernels.py``) from here on."""
    from cuda_ref import launch
    launch.kernels = load_kernels(path)


def measure_point(name, timers, ceiling, only=None):
    B, ctx = POINTS[name]
    q, k, v, bt, seq = make_point(B, ctx, 32, 8, 128, torch.bfloat16)
    nbytes = kv_bytes(B, ctx, 8, 128, "bf16")
    kc, vc = contiguous_kv(k, bt, B, ctx), contiguous_kv(v, bt, B, ctx)
    sub = min(B, 4)
    ref = torch.nn.functional.scaled_dot_product_attention(
        q[:sub, :, None].float(), kc[:sub].float(), vc[:sub].float(), enable_gqa=True)[:, :, 0]
    # the same cache with each page's heads apart ([P, Hkv, page, D] in memory, FlashInfer's "HND"),
    # seen through a [P, page, Hkv, D] view: a head's page is one contiguous block; and both layouts
    # with the pages stored in logical order (block table 0, 1, 2, ...: each head's KV one stream)
    hnd = lambda x: x.permute(0, 2, 1, 3).contiguous().permute(0, 2, 1, 3)  # noqa: E731
    order = bt.reshape(-1).long()
    ks, vs = k[order], v[order]
    in_order = torch.arange(order.numel(), dtype=torch.int32, device="cuda").view_as(bt)
    caches = {"NHD": (k, v, bt), "HND": (hnd(k), hnd(v), bt), "NHD in order": (ks, vs, in_order),
              "HND in order": (hnd(ks), hnd(vs), in_order)}
    r = dict(point=name, B=B, ctx=ctx, kv_bytes=nbytes, us={}, err={}, splits={})
    for vname, kw in variants(ctx, B).items():
        if only and vname not in only:
            continue
        try:
            kw = dict(kw)
            kk, vv, bb = caches[kw.pop("layout", "NHD")]
            run, plan, _ = make_runner(q, kk, vv, bb, seq, **kw)
            if kw.get("merge", True):
                r["err"][vname] = rel_err(run, ref)
            r["splits"][vname] = int(plan.max_splits)
            for fl, timer in timers.items():
                r["us"].setdefault(fl, {})[vname] = timer(run)
        except Exception as e:  # noqa: BLE001 - e.g. out of shared memory: a result
            r["err"][vname] = f"{type(e).__name__}: {str(e)[:100]}"
    for fl, timer in timers.items():
        r["us"][fl].update({kk.replace("sdpa_", ""): vv for kk, vv in sdpa_peers(timer, q, kc, vc).items()
                            if not kk.endswith("_error")})
    del q, k, v, bt, seq, kc, vc, caches, ks, vs
    torch.cuda.empty_cache()
    r["pct_ceiling"] = {fl: 100 * nbytes / (u["default"] * 1e-6) / 1e9 / ceiling for fl, u in r["us"].items()}
    return r


def _host_us(fn, n=2000) -> float:
    """Median over 5 rounds of the mean host time of ``fn()`` (µs)."""
    rounds = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        rounds.append((time.perf_counter() - t0) / n * 1e6)
    return sorted(rounds)[2]


def _eager_us(fn, n=300) -> float:
    """Wall time per call of ``n`` back-to-back eager calls, then one synchronize (µs)."""
    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / n * 1e6


def overhead(names, timer):
    """The cost of the always-on checks at each point (see the module docstring)."""
    from cuda_ref import launch as L
    out = []
    for name in names.split(","):
        B, ctx = POINTS[name]
        q, k, v, bt, seq = make_point(B, ctx, 32, 8, 128, torch.bfloat16)
        run, plan, w = make_runner(q, k, v, bt, seq)
        qsl = torch.arange(B + 1, dtype=torch.int32, device="cuda")
        r = dict(point=name, B=B, ctx=ctx, splits=int(plan.max_splits))
        r["graph_us"] = timer(run)
        L.KERNEL_BOUNDS = False
        try:
            run_u, _, w_u = make_runner(q, k, v, bt, seq)
            r["graph_unbounded_kernel_us"] = timer(run_u)
            out_u = w_u.run(q, k, v, bt, seq, qsl)[0].clone()
        finally:
            L.KERNEL_BOUNDS = True
        r["bitwise_same_as_unbounded"] = bool(torch.equal(run()[0], out_u))
        w.check(q, k, v, bt, seq, qsl)
        r["host_checks_cached_us"] = _host_us(run_guard(w, (q, k, v, bt, seq, qsl)))
        r["check_method_cached_us"] = _host_us(lambda: w.check(q, k, v, bt, seq, qsl))

        def uncached():
            w.forget_checks()
            w.check(q, k, v, bt, seq, qsl)
        r["host_checks_uncached_us"] = _host_us(uncached, 300)
        r["check_path"] = check_path_us(w, q, k, v, bt, seq, qsl)
        w.check(q, k, v, bt, seq, qsl)
        b = w._buffers

        def bare():  # what run() launches, without any check
            L.launch_decode(q, k, v, bt, seq, qsl, w.dplan, b["out"], b["lse"], b["part_o"], b["part_lse"],
                            b["counters"], scale=128 ** -0.5, config=w.config, fuse_merge=False,
                            batch_invariant=False, errors=b["errors"])
        r["eager_run_us"] = _eager_us(run)
        r["eager_bare_launch_us"] = _eager_us(bare)
        d = r["graph_us"]
        r["pct"] = {"kernel_bounds": 100 * (d - r["graph_unbounded_kernel_us"]) / r["graph_unbounded_kernel_us"],
                    "host_checks_cached": 100 * r["host_checks_cached_us"] / d,
                    "eager_run_vs_bare": 100 * (r["eager_run_us"] - r["eager_bare_launch_us"]) / r["eager_bare_launch_us"]}
        print(f"{name}: graph {d:.2f} us (no bounds {r['graph_unbounded_kernel_us']:.2f}), host checks "
              f"{r['host_checks_cached_us']:.2f} us cached / {r['host_checks_uncached_us']:.1f} uncached, eager run "
              f"{r['eager_run_us']:.1f} vs bare {r['eager_bare_launch_us']:.1f} us; "
              + ", ".join(f"{kk} {vv:+.2f}%" for kk, vv in r["pct"].items()), flush=True)
        out.append(r)
        del q, k, v, bt, seq, w, w_u
        torch.cuda.empty_cache()
    return out


def run_guard(w, args: tuple):
    """What ``run()`` executes of the checks for a call like the last that passed
    (:meth:`cuda_ref.wrapper.DecodeWrapper.run`: :meth:`~cuda_ref.call_checks.CallChecks.check`'s
    guard inline, the same expression), as a function of no arguments (whose own call is timed with
    it: an upper bound). ``args``: the call's six tensors; the last call that passed must be theirs."""
    slots = (*args, None, None, None, None, None, None, None)

    def inline():
        last = w._last_call
        return last is not None and last[0](*slots) and w._plan_pages <= last[1]
    if inline() is not True:
        raise RuntimeError("run_guard: the last call that passed is not this one (call check() with it first)")
    return inline


def check_path_us(w, q, k, v, bt, seq, qsl) -> dict:
    """Host µs of ``w.check()`` (``run()``'s metadata checks) on this call's tensors, by path and part
    (:meth:`DecodeWrapper.check`; median of 5 rounds, :func:`_host_us`):

    * ``run_guard_us``: what ``run()`` executes of the checks for a repeated call (:func:`run_guard`);
    * ``check_us``: ``check()`` for a repeated call (the method around the same guard);
    * ``check_new_views_us``: new tensor objects of the same metadata each call (one model's layers;
      with the loop picking them, ``check_new_views_loop_us`` alone);
    * ``check_torch_guard_us`` / ``check_python_guard_us``: the same as ``check_us`` with torch's
      ``TensorGuards`` (where it works) / the Python guard, the fallbacks where the C++ one does not build;
    * ``guard_us`` / ``torch_guard_us`` / ``python_guard_us``: the guard alone
      (:func:`cuda_ref.checks.call_guard` of the call's ten tensor slots and three scalars);
    * ``signature_us``: the path past the guard for a signature that passed before (building it, one
      set lookup: the per-call path before the guard);
    * ``uncached_us``: every check (the first call of a signature).
    ``guard``: which guard the default path took (``"native"``, ``"torch"`` or ``"python"``)."""
    from cuda_ref import checks as C
    from cuda_ref import call_checks as W
    args = (q, k, v, bt, seq, qsl)
    slots = (*args, None, None, None, None, None, None, None)
    n_views = 64
    views = [tuple(t[:] for t in args) for _ in range(n_views)]
    r = dict(guard=C.call_guard_kind())
    w.forget_checks()
    w.check(*args)
    _host_us(lambda: w.check(*args))   # warm-up (the first point's first timing ran high without it)
    r["check_us"] = _host_us(lambda: w.check(*args))
    r["run_guard_us"] = _host_us(run_guard(w, args))
    it = [0]

    def layers():
        i = it[0] = (it[0] + 1) % n_views
        w.check(*views[i])
    r["check_new_views_us"] = _host_us(layers)
    r["check_new_views_loop_us"] = _host_us(lambda: (it.__setitem__(0, (it[0] + 1) % n_views), views[it[0]]))
    g = C.call_guard(10, *slots)
    r["guard_us"] = _host_us(lambda: g(*slots))
    real = W.call_guard
    for kind in ("torch", "python") if C.tensor_guard_kind() == "torch" else ("python",):
        g = C.call_guard(10, *slots, kind=kind)
        r[f"{kind}_guard_us"] = _host_us(lambda: g(*slots))
        W.call_guard = lambda *a, kind=kind: real(*a, kind=kind)
        try:
            w.forget_checks()
            w.check(*args)
            r[f"check_{kind}_guard_us"] = _host_us(lambda: w.check(*args))
        finally:
            W.call_guard = real
            w.forget_checks()
    w.check(*args)
    sig = w._check_signature
    r["signature_us"] = _host_us(lambda: sig(*args, None, None, None, None, None, None, None))

    def uncached():
        w.forget_checks()
        w.check(*args)
    r["uncached_us"] = _host_us(uncached, 300)
    w.forget_checks()
    return r


def cpu_check_path(names, page=PAGE) -> list:
    """:func:`check_path_us` at each point with CPU tensors (the decode's shapes: bf16, Hq 32, Hkv 8,
    D 128, ``page`` tokens a page; no GPU needed, nothing launched): the host side of the checks alone."""
    out = []
    for name in names.split(","):
        B, ctx = POINTS[name]
        pages = -(-ctx // page)
        q = torch.empty(B, 32, 128, dtype=torch.bfloat16)
        k = torch.empty(B * pages, page, 8, 128, dtype=torch.bfloat16)
        v = torch.empty_like(k)
        bt = torch.arange(B * pages, dtype=torch.int32).view(B, pages)
        seq = torch.full((B,), ctx, dtype=torch.int32)
        qsl = torch.arange(B + 1, dtype=torch.int32)
        w = DecodeWrapper(32, 8, 128, page, dtype=torch.bfloat16, device="cpu")
        w.plan(seq.numpy())
        r = dict(point=name, B=B, ctx=ctx, page=page, **check_path_us(w, q, k, v, bt, seq, qsl))
        print(f"{name} (CPU tensors): check {r['check_us']:.2f} us ({r['guard']} guard {r['guard_us']:.2f}), new views "
              f"{r['check_new_views_us']:.2f}, Python guard {r['check_python_guard_us']:.2f}, signature path "
              f"{r['signature_us']:.2f}, uncached {r['uncached_us']:.1f}", flush=True)
        out.append(r)
    return out


CHECK_PATH_COLUMNS = [("run_guard_us", "run()'s guard µs"), ("check_us", "check() µs"), ("check_new_views_us", "new views µs"),
                      ("guard_us", "guard alone µs"), ("check_torch_guard_us", "check() with torch's guard µs"),
                      ("torch_guard_us", "torch's guard alone µs"),
                      ("check_python_guard_us", "check() with the Python guard µs"),
                      ("python_guard_us", "Python guard alone µs"), ("signature_us", "signature path µs"),
                      ("uncached_us", "uncached µs")]


def overhead_summary(res) -> str:
    """The Markdown of ``--overhead``: the decode and the checks' costs per point (GPU), and the host
    check path by part (:func:`check_path_us`)."""
    lines = provenance_markdown(res["provenance"]) if "provenance" in res else []
    lines += [f"{res.get('gpu', 'CPU only')}, torch {res['torch']}, {res['date']}; the cost of the always-on "
              "checks (target: at most 1 % of the decode)", ""]
    gpu = [r for r in res["points"] if "graph_us" in r]
    if gpu:
        lines += ["| point | graph µs | no kernel bounds µs | host checks µs (run()'s guard) | % of the graph | "
                  "check() µs | uncached µs | eager run µs | bare launch µs |", "|---|---|---|---|---|---|---|---|---|"]
        for r in gpu:
            method = r.get("check_method_cached_us")
            lines.append(f"| {r['point']} | {r['graph_us']:.2f} | {r['graph_unbounded_kernel_us']:.2f} | "
                         f"{r['host_checks_cached_us']:.2f} | {r['pct']['host_checks_cached']:.2f} | "
                         f"{'-' if method is None else f'{method:.2f}'} | "
                         f"{r['host_checks_uncached_us']:.1f} | {r['eager_run_us']:.1f} | "
                         f"{r['eager_bare_launch_us']:.1f} |")
        lines.append("")
    rows = [(r["point"] + (" (GPU tensors)" if "graph_us" in r else " (CPU tensors)"), r.get("check_path", r))
            for r in res["points"] + res.get("cpu_points", [])]
    rows = [(n, c) for n, c in rows if c and "check_us" in c]
    if rows:
        lines += ["Host check path by part (`splitkv_bench.perf_check.check_path_us`; median of 5 rounds):", "",
                  "| point | guard | " + " | ".join(t for _, t in CHECK_PATH_COLUMNS) + " |",
                  "|---|---|" + "---|" * len(CHECK_PATH_COLUMNS)]
        for n, c in rows:
            lines.append(f"| {n} | {c['guard']} | " + " | ".join("-" if c.get(k) is None else f"{c[k]:.2f}" for k, _ in CHECK_PATH_COLUMNS) + " |")
    return "\n".join(lines)


def _idle_host_us(fn, n=200, warmup=20) -> float:
    """Median host time (µs) of one ``fn()`` call with the GPU idle: a synchronize before each call."""
    for _ in range(warmup):
        fn()
    ts = []
    for _ in range(n):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    torch.cuda.synchronize()
    return sorted(ts)[n // 2] * 1e6


def _event_us(fn, n=50) -> float:
    """Median GPU span (µs) of one eager ``fn()`` call: CUDA events around it, the GPU idle before."""
    ts = []
    for _ in range(n):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        a.record()
        fn()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b) * 1e3)
    return sorted(ts)[n // 2]


def _eager_mode(q, k, v, bt, seq, fast: bool, timer) -> dict:
    """One wrapper with the fast path ``fast``: its path, times and outputs (see ``--eager``)."""
    from cuda_ref import fast_launch
    os.environ[fast_launch.ENV] = "1" if fast else "0"
    r: dict = {}
    try:
        run, plan, w = make_runner(q, k, v, bt, seq)
        r["splits"] = int(plan.max_splits)
        run()
        run()   # the first call sets the fast path up (where it is on); the second takes it
        torch.cuda.synchronize()
        r["path"] = w.last_launch.fast
        out, lse = run()
        torch.cuda.synchronize()
        r["_out"] = (out.clone(), lse.clone())
        r["host_us"] = _idle_host_us(run)
        r["loop_us"] = _eager_us(run)
        r["gpu_event_us"] = _event_us(run)
        r["path_after"] = w.last_launch.fast  # slow_calls: calls after the first that fell back
        r.update(_replan_us(q, k, v, bt, seq))
    except Exception as e:  # recorded, the other mode and points still run
        r["error"] = f"{type(e).__name__}: {e}"
        return r
    try:
        r["graph_us"] = timer(run)
        out, lse = run()   # eager again after the capture
        torch.cuda.synchronize()
        r["_graph_out"] = (out.clone(), lse.clone())
    except Exception as e:
        r["graph_error"] = f"{type(e).__name__}: {e}"
    return r


def _replan_us(q, k, v, bt, seq, n=100, warmup=10) -> dict:
    """Host µs of ``run()`` right after ``plan()`` of other sizes, the GPU idle before each call (median
    of ``n``): two plans alternating (the point's lengths and a third of them), with the wrapper's
    prepared launches emptied before each call (``new_plan_us``: a new prepared launch, its first
    call, which adopts the previous launch's launchers), the same without a previous launch to adopt
    from (``new_plan_keyed_us``: the launchers found by the specialization key) and kept
    (``seen_plan_us``: as the wrapper runs; plans whose sizes change only the grid share one prepared
    launch). ``new_plan_reused``: whether that first call set the fast path up from a
    kernel checked before (adopted or found by the key)."""
    B = bt.shape[0]
    w = DecodeWrapper(q.shape[1], k.shape[2], q.shape[2], PAGE, dtype=q.dtype)
    qsl = torch.arange(B + 1, dtype=torch.int32, device="cuda")
    seq_b = torch.clamp(seq // 3, min=1)
    dev = [seq, seq_b]
    lens = [t.cpu().numpy() for t in dev]
    sizes = []
    for x in lens:
        p = w.plan(x)
        sizes.append((int(p.num_items), int(p.num_slots), int(p.max_splits)))
    out = {"replan_sizes": sizes}
    # (name, prepared launches emptied, no previous launch to adopt from)
    for name, clear, alone in (("new_plan_us", True, False), ("new_plan_keyed_us", True, True),
                               ("seen_plan_us", False, False)):
        ts = []
        for i in range(n + warmup):
            j = i % 2
            w.plan(lens[j])
            if clear:
                w._launches.clear()
            if alone:
                w.last_launch = None
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            w.run(q, k, v, bt, dev[j], qsl)
            if i >= warmup:
                ts.append(time.perf_counter() - t0)
        torch.cuda.synchronize()
        out[name] = sorted(ts)[n // 2] * 1e6
        if clear and not alone:
            st = w.last_launch.stage1
            out["new_plan_reused"] = bool(st is not None and (st.reused or st.adopted))
    return out


def _same(a, b) -> "bool | None":
    if a is None or b is None:
        return None
    return bool(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]))


def eager(names, timer):
    """Eager ``run()`` with the launch fast path on and off at each point (see ``--eager``)."""
    from cuda_ref import fast_launch
    before = os.environ.get(fast_launch.ENV)
    out = []
    try:
        for name in names.split(","):
            B, ctx = POINTS[name]
            q, k, v, bt, seq = make_point(B, ctx, 32, 8, 128, torch.bfloat16)
            r = dict(point=name, B=B, ctx=ctx)
            # off first: its results are the reference even if a fast launch went wrong, and the fast
            # path's first call then finds the kernels compiled (set up from Triton's cache)
            for mode, fast in (("off", False), ("on", True)):
                r[mode] = _eager_mode(q, k, v, bt, seq, fast, timer)
            r["fused"] = _eager_fused(q, k, v, bt, seq)
            on, off = r["on"], r["off"]
            r["fused_bitwise_equal"] = _same(on.get("_out"), r["fused"].pop("_out", None))
            r["bitwise_equal"] = _same(on.pop("_out", None), off.pop("_out", None))
            r["bitwise_equal_after_graph"] = _same(on.pop("_graph_out", None), off.pop("_graph_out", None))
            print(eager_line(r), flush=True)
            out.append(r)
            del q, k, v, bt, seq
            torch.cuda.empty_cache()
    finally:
        if before is None:
            os.environ.pop(fast_launch.ENV, None)
        else:
            os.environ[fast_launch.ENV] = before
    return out


def _eager_fused(q, k, v, bt, seq) -> dict:
    """The fused merge (``fuse_merge=True``: one launch) at the point, fast path on: host µs of one call
    with the GPU idle, back-to-back µs a call, and its output (compared with the separate merge's)."""
    try:
        run, _, _ = make_runner(q, k, v, bt, seq, fuse=True)
        run(), run()
        out, lse = run()
        torch.cuda.synchronize()
        return dict(_out=(out.clone(), lse.clone()), host_us=_idle_host_us(run), loop_us=_eager_us(run))
    except Exception as e:  # recorded, the other points still run
        return dict(error=f"{type(e).__name__}: {e}")


def eager_new_batches(max_batch: int = 64, steps: int = 300, warmup: int = 20, seed: int = 0) -> dict:
    """Eager ``run()`` right after ``plan()`` of a new batch every step, as a serving step with the
    batch changing (one wrapper, one cache, a block table of 512 columns; each step 1 to ``max_batch``
    requests drawn at random, lengths 512-8192; the GPU idle before each ``run()``): host µs of
    ``run()`` and of ``plan()``, p50 and p90 over ``steps`` steps."""
    import numpy as np
    q, k, v, bt, seq = make_point(max_batch, 8192, 32, 8, 128, torch.bfloat16)
    w = DecodeWrapper(32, 8, 128, PAGE, dtype=torch.bfloat16)
    run_us, plan_us = [], []
    for i, (B, lens, sd, qsl) in enumerate(random_batches(max_batch, steps + warmup, seed)):
        t0 = time.perf_counter()
        w.plan(lens)
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        w.run(q[:B], k, v, bt[:B], sd, qsl)
        t3 = time.perf_counter()
        torch.cuda.synchronize()
        if i >= warmup:
            run_us.append((t3 - t2) * 1e6)
            plan_us.append((t1 - t0) * 1e6)
    return dict(max_batch=max_batch, steps=steps, run_us_p50=float(np.median(run_us)),
                run_us_p90=float(np.percentile(run_us, 90)), plan_us_p50=float(np.median(plan_us)))


def eager_line(r) -> str:
    def f(x, key):
        v = x.get(key)
        return "-" if v is None else f"{v:.1f}"
    on, off = r["on"], r["off"]
    path = on.get("path") or {}
    return (f"{r['point']}: fast path {'ON' if path.get('fast') else 'OFF'} ({path.get('reason', on.get('error'))}); "
            f"host {f(on, 'host_us')} vs {f(off, 'host_us')} us a call, back-to-back {f(on, 'loop_us')} vs "
            f"{f(off, 'loop_us')}, GPU span {f(on, 'gpu_event_us')} vs {f(off, 'gpu_event_us')}, graph "
            f"{f(on, 'graph_us')} vs {f(off, 'graph_us')}; run() after a new plan {f(on, 'new_plan_us')} vs "
            f"{f(off, 'new_plan_us')} (kernel reused {on.get('new_plan_reused')}), launches kept "
            f"{f(on, 'seen_plan_us')} vs {f(off, 'seen_plan_us')}; bitwise equal {r['bitwise_equal']} "
            f"(after graph {r['bitwise_equal_after_graph']}); fused merge host {f(r['fused'], 'host_us')}, "
            f"back-to-back {f(r['fused'], 'loop_us')} (bitwise equal to the separate merge {r['fused_bitwise_equal']})"
            + "".join(f"; {m} {k}: {r[m][k]}" for m in ("on", "off") for k in ("error", "graph_error") if k in r[m]))


def eager_summary(res) -> str:
    lines = provenance_markdown(res["provenance"]) if "provenance" in res else []
    lines += [f"{res['gpu']}, torch {res['torch']}, triton {res['triton']}, {res['date']}; eager "
              "`DecodeWrapper.run()`, launch fast path on / off (target: host ≤ 40 µs a call at B1)", "",
              "| point | path (on) | host µs on | host µs off | back-to-back µs on / off | GPU span µs on / off | "
              "graph µs on / off | run() after a plan of other sizes, new prepared launch µs on / off | the same "
              "without adopting (by key) µs on | run() after a plan of other sizes, launches kept µs on / off "
              "| bitwise equal (eager, after graph) | fused merge (one launch): host µs / back-to-back µs "
              "(bitwise equal to the separate merge) |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|"]

    def f(x, key):
        v = x.get(key)
        return "-" if v is None else f"{v:.1f}"
    for r in res["points"]:
        on, off = r["on"], r["off"]
        path = on.get("path") or {}
        where = ("fast" if path.get("fast") else f"normal: {path.get('reason', on.get('error', '?'))}")
        if path.get("fast") and (on.get("path_after") or {}).get("slow_calls"):
            where += f" ({on['path_after']['slow_calls']} calls fell back)"
        lines.append(f"| {r['point']} | {where} | {f(on, 'host_us')} | {f(off, 'host_us')} | {f(on, 'loop_us')} / "
                     f"{f(off, 'loop_us')} | {f(on, 'gpu_event_us')} / {f(off, 'gpu_event_us')} | "
                     f"{f(on, 'graph_us')} / {f(off, 'graph_us')} | {f(on, 'new_plan_us')} / {f(off, 'new_plan_us')}"
                     f"{' (kernel reused)' if on.get('new_plan_reused') else ''} | {f(on, 'new_plan_keyed_us')} | "
                     f"{f(on, 'seen_plan_us')} / "
                     f"{f(off, 'seen_plan_us')} | {r['bitwise_equal']}, "
                     f"{r['bitwise_equal_after_graph']} | {f(r['fused'], 'host_us')} / {f(r['fused'], 'loop_us')} "
                     f"({r['fused_bitwise_equal']}) |")
    nb = res.get("new_batches")
    if nb:
        lines += ["", f"`run()` right after `plan()` of a new batch every step (1-{nb['max_batch']} requests drawn at "
                  f"random, lengths 512-8192, one cache and block table, GPU idle before each call; {nb['steps']} "
                  f"steps): `run()` p50 {nb['run_us_p50']:.1f} µs, p90 {nb['run_us_p90']:.1f}; `plan()` p50 "
                  f"{nb['plan_us_p50']:.1f} µs"]
    return "\n".join(lines)


def eager_once(names):
    """One eager call of each implementation at each point (for a profiler such as ncu)."""
    for name in names.split(","):
        _eager_once(name)


def _eager_once(name):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    B, ctx = POINTS[name]
    q, k, v, bt, seq = make_point(B, ctx, 32, 8, 128, torch.bfloat16)
    kc, vc = contiguous_kv(k, bt, B, ctx), contiguous_kv(v, bt, B, ctx)
    for kw in (dict(pdl=False), dict(), dict(fuse=True)):
        run = make_runner(q, k, v, bt, seq, **kw)[0]
        run()
    for be in (SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION):
        with sdpa_kernel([be]):
            torch.nn.functional.scaled_dot_product_attention(q[:, :, None], kc, vc, enable_gqa=True)
    torch.cuda.synchronize()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="perf_out")
    ap.add_argument("--points", default=",".join(POINTS))
    ap.add_argument("--flush", default="read,write", help="comma-separated flush methods (splitkv_bench.gpu.Timer)")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--eager-once", default=None, metavar="POINTS")
    ap.add_argument("--overhead", default=None, metavar="POINTS",
                    help="the cost of the safety checks at these points (e.g. B1x16k,B64x2k): DIR/overhead.json")
    ap.add_argument("--cpu", action="store_true",
                    help="with --overhead: only the host check path, on CPU tensors (no GPU needed)")
    ap.add_argument("--eager", default=None, metavar="POINTS",
                    help="eager run() with the launch fast path on / off at these points: DIR/eager.json, eager.md")
    ap.add_argument("--variants", default=None, help="comma-separated variant names to time (default: all)")
    ap.add_argument("--kernels-from", default=None, metavar="FILE",
                    help="use this version of cuda_ref/kernels.py (same kernel signatures)")
    a = ap.parse_args(argv)
    if a.kernels_from:
        use_kernels_from(a.kernels_from)
    if a.eager_once:
        eager_once(a.eager_once)
        return 0
    os.makedirs(a.out, exist_ok=True)
    if a.eager:
        timer = Timer(a.iters, flush=a.flush.split(",")[0])
        res = dict(provenance=provenance(), gpu=torch.cuda.get_device_name(), torch=torch.__version__,
                   triton=importlib.import_module("triton").__version__, flush=timer.flush_mode,
                   date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), points=eager(a.eager, timer),
                   new_batches=eager_new_batches())
        print(save_outputs(a.out, "eager", res, eager_summary(res), default=str))
        return 0
    if a.overhead and a.cpu:
        res = dict(provenance=provenance(), torch=torch.__version__,
                   date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), points=[],
                   cpu_points=cpu_check_path(a.overhead))
        print(save_outputs(a.out, "overhead", res, overhead_summary(res)))
        return 0
    if a.overhead:
        timer = Timer(a.iters, flush=a.flush.split(",")[0])
        res = dict(provenance=provenance(), gpu=torch.cuda.get_device_name(), torch=torch.__version__,
                   triton=importlib.import_module("triton").__version__, flush=timer.flush_mode,
                   kernels_from=a.kernels_from and os.path.basename(a.kernels_from),
                   date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), points=overhead(a.overhead, timer))
        res["cpu_points"] = cpu_check_path(a.overhead)
        print(save_outputs(a.out, "overhead", res, overhead_summary(res)))
        return 0
    timers = {fl: Timer(a.iters, flush=fl) for fl in a.flush.split(",")}
    res = dict(provenance=provenance(), gpu=torch.cuda.get_device_name(), torch=torch.__version__,
               triton=importlib.import_module("triton").__version__,
               kernels_from=a.kernels_from and os.path.basename(a.kernels_from),
               date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
               ceiling_gbps=copy_ceiling(next(iter(timers.values()))), points=[])
    t0 = time.time()
    for name in a.points.split(","):
        r = measure_point(name, timers, res["ceiling_gbps"], a.variants.split(",") if a.variants else None)
        res["points"].append(r)
        with open(os.path.join(a.out, "perf.json"), "w") as f:
            json.dump(res, f, indent=1)
        print(f"{name}: " + ", ".join(f"{fl} {u['default']:.1f} us (cuDNN {u.get('cudnn') or float('nan'):.1f})"
                                      for fl, u in r["us"].items()) + f" [{time.time() - t0:.0f}s]", flush=True)
    print(save_outputs(a.out, "perf", res, summary(res)))
    return 0


def summary(res) -> str:
    c = res["ceiling_gbps"]
    lines = provenance_markdown(res["provenance"]) if "provenance" in res else []
    lines += [f"{res['gpu']}, torch {res['torch']}, triton {res['triton']}, {res['date']}, "
              f"copy ceiling {c:.0f} GB/s",
              "", "| point | flush | splits | ours µs | % ceil | stage 1 µs | merge share | plain launch µs | fused µs | "
              "best variant µs | cuDNN µs | flash µs | best peer / ours | err |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    nan = float("nan")
    for r in res["points"]:
        for fl, u in r["us"].items():
            ours = u["default"]
            s1 = u.get("stage 1 alone", ours)
            peer = min([x for x in (u.get("cudnn"), u.get("flash")) if x] or [nan])
            mine = {kk: vv for kk, vv in u.items() if kk not in ("cudnn", "flash", "stage 1 alone")}
            best = min(mine, key=mine.get)
            err = r["err"].get("default")
            lines.append(
                f"| {r['point']} | {fl} | {r['splits'].get('default')} | {ours:.1f} | {r['pct_ceiling'][fl]:.0f} | "
                f"{s1:.1f} | {100 * max(0.0, 1 - s1 / ours):.0f}% | {u.get('plain merge launch', nan):.1f} | "
                f"{u.get('fused merge', nan):.1f} | {mine[best]:.1f} ({best}) | {u.get('cudnn') or nan:.1f} | "
                f"{u.get('flash') or nan:.1f} | {peer / ours:.2f} | "
                f"{err if isinstance(err, str) else format(err, '.1e')} |")
    return "\n".join(lines)
