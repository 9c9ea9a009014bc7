#!/usr/bin/env python3
"""The separate merge that waits for all of stage 1 against the merge that polls its row's counter
(``KernelConfig.merge_poll``), side by side on a CUDA GPU, with stage 1 alone and the SDPA peers.

Per point (bf16, page 16, shuffled pages; ``--points`` as ``bench_decode.py``'s): the ``auto`` plan
with the default stage-1 configuration, (a) merge waiting in ``griddepcontrol.wait`` (the default),
(b) merge polling, (c) stage 1 alone; cuDNN and flash SDPA on a contiguous copy. Each captured in a
CUDA graph, then timed in ``--passes`` interleaved passes (``bench_decode.Timer``: a 10 ms warm-up,
``--iters`` replays each after a read flush of the L2, median); the table gives each variant's fastest
pass and lists all. Checked per point: both outputs against SDPA's math backend, the two merges'
outputs bitwise equal, and the polling merge's counters all zero after its replays.

Outputs ``merge_poll.json`` and ``merge_poll.md`` in ``--out``.

    python scripts/bench_merge_poll.py --out OUT/poll [--points B1x2k,B16x8k] [--passes 3]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, ".."))
from splitkv_common.optional import require  # noqa: E402

torch = require("torch", "scripts/bench_merge_poll.py")
require("triton", "scripts/bench_merge_poll.py")

from bench_decode import (PAGE, Timer, contiguous_kv, interleaved, make_point, parse_points,  # noqa: E402
                          save_outputs, sdpa_peers)
from cuda_ref.launch import default_config  # noqa: E402
from cuda_ref.wrapper import DecodeWrapper  # noqa: E402
from splitkv_common.provenance import provenance, provenance_markdown  # noqa: E402

POINTS = ("B1x1k,B1x2k,B1x4k,B1x16k,B1x64k,B4x4k,B16x1k,B16x8k,B64x2k,B1x16k@64/8,B1x32k@16/2/256,"
          "B16x4k@32/8/64")
VARIANTS = ("wait", "poll", "stage 1 alone")


def name_of(B, ctx, hq, hkv, D) -> str:
    s = f"B{B}x{ctx // 1024}k"
    return s if (hq, hkv, D) == (32, 8, 128) else s + (f"@{hq}/{hkv}" if D == 128 else f"@{hq}/{hkv}/{D}")


def point(timer, B, ctx, hq, hkv, D, passes) -> dict:
    q, k, v, bt, seq = make_point(B, ctx, hq, hkv, D, torch.bfloat16)
    qsl = torch.arange(B + 1, dtype=torch.int32, device="cuda")
    kc, vc = contiguous_kv(k, bt, B, ctx), contiguous_kv(v, bt, B, ctx)
    sub = min(B, 4)
    ref = torch.nn.functional.scaled_dot_product_attention(
        q[:sub, :, None].float(), kc[:sub].float(), vc[:sub].float(), enable_gqa=True)[:, :, 0]
    replays, wrappers, err, outs = {}, {}, {}, {}
    for name in VARIANTS:
        w = DecodeWrapper(hq, hkv, D, PAGE, dtype=torch.bfloat16, device="cuda")
        plan = w.plan(seq.cpu().numpy())
        if name == "poll":  # the configuration the default would take, with the polling merge
            d = w.dplan
            w.config = dataclasses.replace(default_config(D, 2, d.config_items or d.num_items, False, d.item_tokens),
                                           merge_poll=True)
        w.merge = name != "stage 1 alone"
        fn = (lambda w=w: w.run(q, k, v, bt, seq, qsl))
        out, _ = fn()
        torch.cuda.synchronize()
        if w.merge:
            outs[name] = out.clone()
            err[name] = float((out[:sub].float() - ref).norm() / ref.norm())
        replays[name] = timer.graph(fn)
        wrappers[name] = w
    times = interleaved(timer, replays, passes=passes)
    for n, fn in sdpa_peers(timer, q, kc, vc).items():
        if not n.endswith("_error") and fn is not None:
            times[n.replace("sdpa_", "")] = [fn]
    torch.cuda.synchronize()
    wp = wrappers["poll"]
    launch = wp.last_launch
    row = dict(point=name_of(B, ctx, hq, hkv, D), B=B, ctx=ctx, hq=hq, hkv=hkv, D=D,
               items=int(wp.dplan.num_items), splits=int(wp.host_plan.max_splits), config=str(wp.config),
               polls=bool(launch.merge is not None and launch.merge.constexprs["POLL"]),
               early_launch=bool(launch.constexprs.get("LAUNCH_DEPENDENTS")),
               passes={n: [round(x, 2) for x in t] for n, t in times.items()},
               us={n: round(min(t), 2) for n, t in times.items()}, err=err,
               bitwise_equal=bool(torch.equal(outs["wait"].view(torch.int16), outs["poll"].view(torch.int16))),
               counters_zero=bool((wp._buffers["counters"] == 0).all()))
    del q, k, v, bt, seq, kc, vc, replays, wrappers
    torch.cuda.empty_cache()
    return row


def table(res) -> list:
    lines = provenance_markdown(res["provenance"]) + [
        f"{res['gpu']}, torch {res['torch']}, triton {res['triton']}, {res['date']}; {res['passes']} interleaved "
        f"passes of {res['iters']} replays after a read flush (fastest pass; all in `passes`)", "",
        "| point | items | config | merge waits µs | merge polls µs | polls / waits | stage 1 alone µs | "
        "best peer µs | best peer / polls | bitwise | counters 0 | err (poll) |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|---|---|---:|"]
    for r in res["points"]:
        u = r["us"]
        peer = min([x for x in (u.get("cudnn"), u.get("flash")) if x] or [float("nan")])
        lines.append(f"| {r['point']} | {r['items']} | {r['config']}{'' if r['early_launch'] else ' (no early launch)'} "
                     f"| {u['wait']:.2f} | {u['poll']:.2f} | {u['poll'] / u['wait']:.3f} | {u['stage 1 alone']:.2f} | "
                     f"{peer:.2f} | {peer / u['poll']:.2f} | {r['bitwise_equal']} | {r['counters_zero']} | "
                     f"{r['err'].get('poll', float('nan')):.1e} |")
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="bench_out")
    ap.add_argument("--points", default=POINTS)
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--iters", type=int, default=30)
    a = ap.parse_args(argv)
    import triton
    timer = Timer(a.iters)
    res = dict(provenance=provenance(), gpu=torch.cuda.get_device_name(), torch=torch.__version__,
               triton=triton.__version__, date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
               passes=a.passes, iters=a.iters, points=[])
    for B, ctx, hq, hkv, D, _ in parse_points(a.points):
        name = name_of(B, ctx, hq, hkv, D)
        try:
            res["points"].append(point(timer, B, ctx, hq, hkv, D, a.passes))
            print(name, res["points"][-1]["us"], flush=True)
        except Exception as e:  # noqa: BLE001 - a failing point is a result
            res.setdefault("errors", {})[name] = f"{type(e).__name__}: {str(e)[:300]}"
            print(name, res["errors"][name], flush=True)
    print(save_outputs(a.out, "merge_poll", res, table(res)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
