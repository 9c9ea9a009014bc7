"""Stage-1 configurations at points of any shape, side by side in one process on a CUDA GPU: which
tile, warps and pipeline depth is fastest for a point's plan, against what ``default_config`` takes.

Per point (``splitkv_bench/decode.py``'s syntax, e.g. ``B1x16k@32/8/64``; bf16, page 16, shuffled pages) and
policy (``--policies``, default ``auto``): the plan once, then the whole call (stage 1 and the merge)
with the default configuration and with each of ``--configs`` (``BLOCK_N/WARPS/STAGES[/c]``), each captured
in a CUDA graph; cuDNN / flash SDPA on a contiguous copy for reference. Timing: ``splitkv_bench.gpu.Timer``
(``--iters`` replays each after a read flush of the L2, median) in ``--passes`` interleaved passes; the
table gives each variant's fastest pass, the JSON all. Each variant's output is checked against SDPA's
math backend (a configuration that fails to compile, e.g. out of shared memory, is reported as such).

Writes ``config_grid.json`` (with provenance) and ``config_grid.md`` to ``--out``.

    python -m splitkv_bench config-grid --points B1x16k@32/8/64,B16x4k@32/8/64 --out OUT
"""

from __future__ import annotations

import argparse

from splitkv_common.optional import require

torch = require("torch", "python -m splitkv_bench config-grid")
require("triton", "python -m splitkv_bench config-grid")

from splitkv_bench.gpu import PAGE, Timer  # noqa: E402
from splitkv_bench.output import save_outputs  # noqa: E402
from splitkv_bench.kernels_ab import Point, each_point, run_header  # noqa: E402
from cuda_ref.launch import KernelConfig  # noqa: E402
from cuda_ref.wrapper import DecodeWrapper  # noqa: E402
from splitkv_common.provenance import provenance_markdown  # noqa: E402

CONFIGS = "32/2/5,32/2/7,64/2/5,64/2/7,64/4/5,64/4/7,64/8/5,128/4/4,128/4/5,128/8/5,128/8/6"


def parse_configs(text: str) -> list[KernelConfig]:
    """``"64/4/5,128/8/6/c"`` -> KernelConfigs (tokens a tile / warps / stages, ``/c``: the row sum kept
    per tile column, ``KernelConfig.column_sum``). Raises ``ValueError``."""
    out = []
    for item in text.split(","):
        parts = item.strip().split("/")
        column_sum = len(parts) == 4 and parts[3] == "c"
        if column_sum:
            parts = parts[:3]
        if len(parts) != 3 or not all(p.isdigit() for p in parts):
            raise ValueError(f"--configs: {item!r} is not BLOCK_N/WARPS/STAGES[/c]")
        out.append(KernelConfig(*map(int, parts), column_sum=column_sum))
    return out


def name_of(c: KernelConfig) -> str:
    return str(c)


def point(timer, text, B, ctx, hq, hkv, D, policy, configs, passes) -> dict:
    pt = Point(B, ctx, hq, hkv, D)
    replays, keep, err, default = {}, [], {}, None
    for c in [None] + configs:
        label = "default" if c is None else name_of(c)
        try:
            w = DecodeWrapper(hq, hkv, D, PAGE, dtype=torch.bfloat16, device="cuda", policy=policy, config=c)
            plan = w.plan(pt.seq.cpu().numpy())
            fn = pt.runner(w)
            out, _ = fn()
            torch.cuda.synchronize()
            if c is None:
                cx = w.last_launch.constexprs
                default = f"n{cx['BLOCK_N']}w{cx['num_warps']}s{cx['num_stages']}" + ("c" if cx["COLUMN_SUM"] else "")
            err[label] = pt.rel_err(out)
            replays[label] = timer.graph(fn)
            keep.append(w)
        except Exception as e:  # noqa: BLE001 - a configuration that does not compile is a result
            err[label] = f"{type(e).__name__}: {str(e)[:120]}"
    row = dict(point=text, policy=policy, B=B, ctx=ctx, hq=hq, hkv=hkv, D=D, items=int(plan.num_items),
               split=int(plan.split_tokens), default=default, **pt.timed(timer, replays, passes), err=err)
    del pt, replays, keep
    torch.cuda.empty_cache()
    return row


def table(res) -> list:
    lines = provenance_markdown(res["provenance"]) + [
        f"{res['gpu']}, torch {res['torch']}, triton {res['triton']}, {res['date']}; {res['passes']} interleaved "
        f"passes of {res['iters']} replays after a read flush (fastest pass; all in the JSON)", "",
        "| point | policy | items | split | default | default µs | fastest | fastest µs | fastest / default | "
        "best peer µs | others (µs) |", "|---|---|---:|---:|---|---:|---|---:|---:|---:|---|"]
    for r in res["points"]:
        u = r["us"]
        best = min(u, key=u.get)
        peer = min(r["peers"].values(), default=float("nan"))
        others = ", ".join(f"{n} {t:.1f}" for n, t in sorted(u.items(), key=lambda kv: kv[1]) if n != "default")
        bad = [n for n, e in r["err"].items() if isinstance(e, str) or e > 1e-2]
        lines.append(f"| {r['point']} | {r['policy']} | {r['items']} | {r['split']} | {r['default']} | {u['default']:.2f} "
                     f"| {best} | {u[best]:.2f} | {u[best] / u['default']:.3f} | {peer:.2f} | {others}"
                     + (f"; failed: {', '.join(bad)}" if bad else "") + " |")
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--points", required=True)
    ap.add_argument("--policies", default="auto")
    ap.add_argument("--configs", default=CONFIGS, help="BLOCK_N/WARPS/STAGES[/c],...")
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--out", default="bench_out")
    a = ap.parse_args(argv)
    configs = parse_configs(a.configs)
    timer = Timer(a.iters)
    res = run_header(a)
    each_point(res, a.points, a.policies, lambda text, B, ctx, hq, hkv, D, policy: point(
        timer, text, B, ctx, hq, hkv, D, policy, configs, a.passes))
    print(save_outputs(a.out, "config_grid", res, table(res)))
    return 0
