#!/usr/bin/env python3
"""Where an eager ``DecodeWrapper.run()`` spends its host time, on one CUDA GPU: variants side by side.

Each variant is one planned wrapper whose ``run()`` is called with the GPU idle before each call (as
``h200_perf_check.py --eager``), all variants interleaved round by round (a GPU host's timings drift
within minutes), the median over the rounds; then each is profiled (``cProfile``, 300 calls: each
function's own µs a call, the kernel launchers being the built-in calls). The variants
separate what a batch-1 call pays besides the Python side: the number of launches (the separate
merge, the fused one, no split, stage 1 alone), programmatic dependent launch (PDL) of the merge, and
the batch. A torch launch of the same process (``x.add_(1)`` on a 1-element tensor) and a Triton
kernel of one pointer through the same launch fast path give the host's floor for one launch; kernels
that do the same with more arguments (stage 1's count of pointers and integers, and fewer) give what
an argument adds. The default calls and those kernels are timed twice: with the fast path's launch
by the CUDA driver (:mod:`cuda_ref.driver_launch`) and, suffixed ", Triton's launcher", with the
compiled kernel's own launcher (``SPLITKV_FAST_LAUNCH=triton`` at their first call); the report ends
with each variant's launch path. Two more time a serving step's first call: ``plan()`` of other sizes,
then ``run()``, and ``plan()`` alone. ``--old FILE`` (another version of ``cuda_ref/kernels.py`` taking this tree's launch
arguments) adds the default batch-1 call with those kernels. Writes ``eager_parts.json`` and
``eager_parts.md`` to ``--out``.

    python scripts/h200_eager_parts.py --out OUT [--old OLD_KERNELS.py]
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import json
import os
import pstats
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, ".."))
from splitkv_common.optional import require  # noqa: E402

torch = require("torch", "scripts/h200_eager_parts.py")
require("triton", "scripts/h200_eager_parts.py")

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from bench_decode import PAGE, make_point  # noqa: E402
from h200_perf_check import _idle_host_us as idle_host_us, load_kernels  # noqa: E402
from cuda_ref import launch  # noqa: E402
from cuda_ref import fast_launch  # noqa: E402
from cuda_ref.fast_launch import FastLaunch  # noqa: E402
from cuda_ref.wrapper import DecodeWrapper  # noqa: E402
from splitkv_common.provenance import provenance, provenance_markdown  # noqa: E402

# name: (batch, context, wrapper settings, attributes set after construction)
VARIANTS = {
    "B1x16k separate merge (default)": (1, 16384, {}, {}),
    "B1x16k stage 1 only (merge left out)": (1, 16384, {}, {"merge": False}),
    "B1x16k separate merge, no PDL": (1, 16384, {}, {"pdl": False}),
    "B1x16k fused merge": (1, 16384, {"fuse_merge": True}, {}),
    "B1x16k no split (policy none)": (1, 16384, {"policy": "none"}, {}),
    "B1x2k separate merge (default)": (1, 2048, {}, {}),
    "B64x2k (default: no split)": (64, 2048, {}, {}),
}
# the same calls with the compiled kernel's own launcher in place of the launch by the CUDA driver
TRITON = ", Triton's launcher"
VARIANTS.update({name + TRITON: VARIANTS[name] for name in (
    "B1x16k separate merge (default)", "B1x16k fused merge", "B1x2k separate merge (default)",
    "B64x2k (default: no split)")})


@triton.jit
def _store_one(X):
    tl.store(X, 1.0)


# (pointers, integers) of the kernels that time a launch's arguments: stage 1 passes 23 tensors and
# 29 other values, 18 of them strides
ARG_COUNTS = ((23, 29), (23, 11), (12, 11))


def arg_kernels() -> dict:
    """``{(pointers, integers): kernel}``: Triton kernels that store one value through their first
    pointer and take the others unused (written to a module in a temporary folder: Triton reads a
    kernel's source from its file)."""
    import importlib.util
    import tempfile
    src = ["import triton", "import triton.language as tl", ""]
    for p, i in ARG_COUNTS:
        names = [f"P{j}" for j in range(p)] + [f"I{j}" for j in range(i)]
        src += ["@triton.jit", f"def k_{p}_{i}({', '.join(names)}):", "    tl.store(P0, 1.0)", ""]
    path = os.path.join(tempfile.mkdtemp(), "eager_parts_arg_kernels.py")
    with open(path, "w") as f:
        f.write("\n".join(src))
    spec = importlib.util.spec_from_file_location("eager_parts_arg_kernels", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return {(p, i): getattr(mod, f"k_{p}_{i}") for p, i in ARG_COUNTS}


@contextlib.contextmanager
def launch_mode(mode: str):
    """``SPLITKV_FAST_LAUNCH`` set to ``mode`` while the launches made inside take their first call."""
    before = os.environ.get(fast_launch.ENV)
    os.environ[fast_launch.ENV] = mode
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(fast_launch.ENV, None)
        else:
            os.environ[fast_launch.ENV] = before


def first_call(make, args, mode: str = "1") -> FastLaunch:
    """``make()``'s launch after its first two calls with ``args`` under launch ``mode``."""
    with launch_mode(mode):
        fl = make()
        fl(*args)
        fl(*args)
    return fl


def profile(fn, n: int = 300, top: int = 10) -> list:
    """``[(function, own µs a call, calls a call)]`` of ``fn`` under cProfile, the largest first."""
    pr = cProfile.Profile()
    for _ in range(n):
        torch.cuda.synchronize()
        pr.enable()
        fn()
        pr.disable()
    torch.cuda.synchronize()
    st = pstats.Stats(pr)
    rows = []
    for (path, line, name), (cc, nc, tt, ct, _) in st.stats.items():
        where = name if path == "~" else f"{os.path.basename(path)}:{line}({name})"
        rows.append((where, tt / n * 1e6, nc / n))
    rows.sort(key=lambda r: -r[1])
    return rows[:top]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--rounds", type=int, default=15, help="rounds of every variant, interleaved (default 15)")
    ap.add_argument("--old", metavar="FILE", help="another version of cuda_ref/kernels.py: its default B1x16k call too")
    args = ap.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    res = dict(provenance=provenance(sys.argv), gpu=torch.cuda.get_device_name(), rounds=args.rounds, variants=[],
               old=args.old and os.path.basename(args.old))
    x = torch.zeros(1, device="cuda")
    # the floor of a launch on this host: a torch op, and a Triton kernel of one pointer through the
    # same fast path as ours
    one = first_call(lambda: FastLaunch(_store_one, (1,), (None,), (0,), {}), (x,))
    one_t = first_call(lambda: FastLaunch(_store_one, (1,), (None,), (0,), {}), (x,), fast_launch.TRITON)
    calls = {"torch `x.add_(1)`": (lambda: x.add_(1), None, 1),
             "Triton kernel of one pointer (fast path)": (lambda: one(x), None, 1),
             "Triton kernel of one pointer (fast path)" + TRITON: (lambda: one_t(x), None, 1)}
    paths = {name: f.reason for name, f in (("Triton kernel of one pointer (fast path)", one),
                                             ("Triton kernel of one pointer (fast path)" + TRITON, one_t))}
    ints = torch.zeros(64, dtype=torch.int32, device="cuda")  # distinct pointers, like stage 1's tensors
    for (p, i), fn in arg_kernels().items():
        ptrs = (x,) + tuple(ints[j:j + 1] for j in range(p - 1))
        for mode, suffix in (("1", ""), (fast_launch.TRITON, TRITON)):
            fl = first_call(lambda: FastLaunch(fn, (1,), (None,) * p + tuple(range(1000, 1000 + i)), tuple(range(p)),
                                               {}), ptrs, mode)
            name = f"Triton kernel of {p} pointers and {i} integers (fast path){suffix}"
            calls[name] = (lambda fl=fl, a=ptrs: fl(*a), None, 1)
            paths[name] = fl.reason
    variants = dict(VARIANTS)
    if args.old:
        variants["B1x16k separate merge (default), old kernels"] = (1, 16384, {}, {})
    saved = launch.kernels
    for name, (B, ctx, kw, attrs) in variants.items():
        launch.kernels = load_kernels(args.old) if name.endswith("old kernels") else saved
        q, k, v, bt, seq = make_point(B, ctx, 32, 8, 128, torch.bfloat16)
        w = DecodeWrapper(32, 8, 128, PAGE, dtype=torch.bfloat16, **kw)
        for a, val in attrs.items():
            setattr(w, a, val)
        plan = w.plan(seq.cpu().numpy())
        qsl = torch.arange(B + 1, dtype=torch.int32, device="cuda")
        run = (lambda w=w, a=(q, k, v, bt, seq, qsl): w.run(*a))
        with launch_mode(fast_launch.TRITON if name.endswith(TRITON) else "1"):
            run()
            run()   # the first call of each launch sets its fast path up
        launch.kernels = saved
        prep = w.last_launch
        calls[name] = (run, int(plan.num_items), int(prep.stage1 is not None) + int(prep.merge is not None))
        paths[name] = prep.fast["reason"]
        if not calls.get("B1x16k: the checks alone") and not kw and not attrs and B == 1:
            # the default call's parts: its metadata checks (cached), and stage 1's launch alone
            # (the prepared fast path with this call's 23 tensors)
            b = w._buffers
            tensors = prep.tensors(q, k, v, bt, seq, qsl, w.dplan, b["out"], b["lse"], b["part_o"], b["part_lse"],
                                   b["counters"], errors=b["errors"])
            calls["B1x16k: the checks alone"] = (lambda w=w, a=(q, k, v, bt, seq, qsl): w.check(*a), None, 0)
            calls["B1x16k: stage 1's launch alone"] = (lambda p=prep.stage1, t=tensors: p(*t), None, 1)
            # a serving step's first call: plan() of other sizes (two plans alternating, their launches
            # kept), then run(); and plan() alone, so that the difference is run() after a new plan
            w2 = DecodeWrapper(32, 8, 128, PAGE, dtype=torch.bfloat16)
            seq_b = torch.clamp(seq // 3, min=1)
            alt = [(s_.cpu().numpy(), s_) for s_ in (seq, seq_b)]
            for lens, dev in alt:
                w2.plan(lens)
                w2.run(q, k, v, bt, dev, qsl)
                w2.run(q, k, v, bt, dev, qsl)
            turn = [0]

            def replan(run_too, w2=w2, a=(q, k, v, bt), qsl=qsl):
                lens, dev = alt[turn[0]]
                turn[0] ^= 1
                w2.plan(lens)
                if run_too:
                    w2.run(*a, dev, qsl)
            calls["B1x16k: plan() of other sizes, then run()"] = (lambda: replan(True), int(plan.num_items), 2)
            calls["B1x16k: plan() of other sizes alone"] = (lambda: replan(False), int(plan.num_items), 0)
    torch.cuda.synchronize()
    # interleaved: every variant once a round, the host's drift spread over all of them
    times = {name: [] for name in calls}
    for _ in range(args.rounds):
        for name, (fn, _, _) in calls.items():
            times[name].append(idle_host_us(fn, n=60, warmup=5))
    for name, (fn, items, launches) in calls.items():
        top = profile(fn) if items is not None else []
        r = dict(variant=name, items=items, launches=launches, path=paths.get(name), host_us=float(np.median(times[name])),
                 host_us_rounds=times[name], profile=[dict(function=f, own_us=t, calls=c) for f, t, c in top])
        res["variants"].append(r)
        print(f"{name}: {items} items, {launches} launch(es), host {r['host_us']:.1f} µs (rounds "
              f"{min(times[name]):.1f}-{max(times[name]):.1f})", flush=True)
    with open(os.path.join(args.out, "eager_parts.json"), "w") as f:
        json.dump(res, f, indent=1)
    lines = provenance_markdown(res["provenance"]) + [
        "", f"{res['gpu']}; host µs a call, the GPU idle before each: median over {args.rounds} rounds (each the "
            "median of 60 calls), the variants interleaved round by round",
        "", "| variant | work items | launches | host µs a call | rounds' range | the five largest own times under "
            "cProfile, µs a call |",
        "|---|---:|---:|---:|---|---|"]
    for r in res["variants"]:
        prof = "; ".join(f"`{p['function']}` {p['own_us']:.1f}" for p in r["profile"][:5])
        lines.append(f"| {r['variant']} | {'-' if r['items'] is None else r['items']} | {r['launches']} | "
                     f"{r['host_us']:.1f} | {min(r['host_us_rounds']):.1f}-{max(r['host_us_rounds']):.1f} | {prof} |")
    lines += ["", "Launch path of each variant (the fast path's reason):", ""]
    lines += [f"- {name}: {path}" for name, path in paths.items()]
    with open(os.path.join(args.out, "eager_parts.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines[-len(res['variants']) - 2:]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
