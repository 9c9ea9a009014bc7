#!/usr/bin/env python3
"""Where an eager ``DecodeWrapper.run()`` spends its host time, on one CUDA GPU: variants side by side.

Each variant is one planned wrapper whose ``run()`` is called with the GPU idle before each call
(median host µs of 300 calls, as ``h200_perf_check.py --eager``), then profiled (``cProfile``, 300
calls: each function's own µs a call, the kernel launchers being the built-in calls). The variants
separate what a batch-1 call pays besides the Python side: the number of launches (the separate
merge, the fused one, no split), programmatic dependent launch (PDL) of the merge, and the batch.
A torch launch of the same process (``x.add_(1)`` on a 1-element tensor) gives the host's cost of
one plain launch. Writes ``eager_parts.json`` and ``eager_parts.md`` to ``--out``.

    python scripts/h200_eager_parts.py --out OUT
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, ".."))
from splitkv_common.optional import require  # noqa: E402

torch = require("torch", "scripts/h200_eager_parts.py")
require("triton", "scripts/h200_eager_parts.py")

from bench_decode import PAGE, make_point  # noqa: E402
from cuda_ref.wrapper import DecodeWrapper  # noqa: E402
from splitkv_common.provenance import provenance, provenance_markdown  # noqa: E402

# name: (batch, context, wrapper settings, attributes set after construction)
VARIANTS = {
    "B1x16k separate merge (default)": (1, 16384, {}, {}),
    "B1x16k separate merge, no PDL": (1, 16384, {}, {"pdl": False}),
    "B1x16k fused merge": (1, 16384, {"fuse_merge": True}, {}),
    "B1x16k no split (policy none)": (1, 16384, {"policy": "none"}, {}),
    "B1x2k separate merge (default)": (1, 2048, {}, {}),
    "B64x2k (default: no split)": (64, 2048, {}, {}),
}


def idle_host_us(fn, n: int = 300, warmup: int = 30) -> float:
    """Median host µs of one ``fn()`` with the GPU idle before it."""
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
    args = ap.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    res = dict(provenance=provenance(sys.argv), gpu=torch.cuda.get_device_name(), variants=[])
    x = torch.zeros(1, device="cuda")
    res["torch_add_us"] = idle_host_us(lambda: x.add_(1))
    for name, (B, ctx, kw, attrs) in VARIANTS.items():
        q, k, v, bt, seq = make_point(B, ctx, 32, 8, 128, torch.bfloat16)
        w = DecodeWrapper(32, 8, 128, PAGE, dtype=torch.bfloat16, **kw)
        for a, val in attrs.items():
            setattr(w, a, val)
        plan = w.plan(seq.cpu().numpy())
        qsl = torch.arange(B + 1, dtype=torch.int32, device="cuda")

        def run():
            return w.run(q, k, v, bt, seq, qsl)
        host = idle_host_us(run)
        top = profile(run)
        prep = w.last_launch
        launches = int(prep.stage1 is not None) + int(prep.merge is not None)
        r = dict(variant=name, items=int(plan.num_items), launches=launches, host_us=host,
                 profile=[dict(function=f, own_us=t, calls=c) for f, t, c in top])
        res["variants"].append(r)
        print(f"{name}: {plan.num_items} items, {launches} launch(es), host {host:.1f} µs; "
              + "; ".join(f"{f} {t:.1f}" for f, t, _ in top[:5]), flush=True)
        del q, k, v, bt, seq, w
        torch.cuda.empty_cache()
    with open(os.path.join(args.out, "eager_parts.json"), "w") as f:
        json.dump(res, f, indent=1)
    lines = provenance_markdown(res["provenance"]) + [
        "", f"{res['gpu']}; one plain torch launch (`x.add_(1)`, 1 element): {res['torch_add_us']:.1f} µs host",
        "", "| variant | work items | launches | host µs a call | the five largest own times under cProfile, µs a call |",
        "|---|---:|---:|---:|---|"]
    for r in res["variants"]:
        prof = "; ".join(f"`{p['function']}` {p['own_us']:.1f}" for p in r["profile"][:5])
        lines.append(f"| {r['variant']} | {r['items']} | {r['launches']} | {r['host_us']:.1f} | {prof} |")
    with open(os.path.join(args.out, "eager_parts.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines[-len(res['variants']) - 2:]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
