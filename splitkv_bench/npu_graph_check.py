"""aclgraph capture and replay of the Ascend operator on an NPU node (docs/npu.md, "Plan, run and aclgraph").

For every catalog case: a graph-stable ``AscendDecodeWrapper`` is planned, run once eagerly,
captured in a ``torch.npu.NPUGraph`` once, then replayed for shorter and shorter lengths (the plan
refreshed in place by ``plan()``, ``out``/``lse`` poisoned with NaN before each replay) and each
result is judged against the float64 reference by the shared accuracy rule. ``--mode device``
(graph mode without host tiling per step) captures a wrapper with ``device_split_tokens`` fixed at
capture instead: before each replay only the device ``seq_lens`` tensor is rewritten (no ``plan()``),
and the kernels derive their ranges from it. ``--mode both`` (the default) runs both. ``--bench``
also times eager ``run()`` against replay on one production-like batch (measured on the node;
nothing here has run on an NPU before).

    python -m splitkv_bench npu-graph-check [--size small|full|all] [--cases PATTERN] [--mode host|device|both]
                                      [--bench] [--out FILE.json]

Exit status: 0 every replay passed, 1 a failure, 2 the operator cannot run here (with the reason).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

import numpy as np


import ascend_ops  # noqa: E402
from ascend_ops import support  # noqa: E402
from splitkv_common.parity import accuracy, cases  # noqa: E402
from splitkv_common.devices import get_profile  # noqa: E402
from splitkv_common.optional import require
from splitkv_common.provenance import provenance  # noqa: E402
from splitkv_common.reference import dense_attention, plain_attention  # noqa: E402

require("torch", "python -m splitkv_bench npu-graph-check")


def shrink_steps(seq_lens: np.ndarray, page: int) -> list[np.ndarray]:
    """The planned lengths, then shorter ones (by one token, by a page and a half, by half)."""
    out = [seq_lens]
    for cut in (lambda s: s - 1, lambda s: s - (3 * page) // 2, lambda s: s // 2):
        out.append(np.maximum(cut(seq_lens), 0).astype(np.int32))
    return out


def device_split_size(inputs, policy: str, profile: str) -> int:
    """The split size a graph-mode capture fixes: the policy's for the capture's lengths, else one
    page-rounded split of the longest request."""
    page = int(inputs.k_cache.shape[1])
    plan = inputs.plan(policy, device=profile)
    longest = int(np.max(inputs.seq_lens, initial=1))
    return int(plan.split_tokens) or max(page, -(-longest // page) * page)


def graph_case(case, profile: str, device_ranges: bool = False) -> dict:
    import torch

    from splitkv_common.torch_io import to_torch

    inputs = case.build()
    t = to_torch(inputs, "npu")
    q, k = t["q"], t["k_cache"]
    prof = get_profile(profile)
    mode = {}
    if device_ranges:
        mode = dict(device_split_tokens=device_split_size(inputs, case.policy, profile), policy="auto")
    w = ascend_ops.AscendDecodeWrapper(q.shape[1], k.shape[2], q.shape[2], k.shape[1], dtype=q.dtype,
                                       kv_dtype=k.dtype, profile=profile, graph_stable=True,
                                       max_splits=prof.max_splits, **{"policy": case.policy, **mode},
                                       **{k_: v for k_, v in case.plan_kwargs.items() if k_ == "min_split_tokens"})
    const = dict(scale=inputs.scale, soft_cap=inputs.soft_cap, window_left=inputs.window_left)
    pages = dict(max_pages=t["block_table"].shape[1], num_pages=k.shape[0])
    quant = dict(k_scale=t["k_scale"], v_scale=t["v_scale"], k_offset=t["k_offset"], v_offset=t["v_offset"])
    w.plan(inputs.seq_lens, query_start_loc=inputs.query_start_loc, **const, **pages)
    lens_dev = torch.as_tensor(np.asarray(inputs.seq_lens, np.int32)).to(q.device)

    def step():
        extra = dict(seq_lens=lens_dev) if device_ranges else {}
        return w.run(t["q"], t["k_cache"], t["v_cache"], t["block_table"], **quant, **extra)

    step()  # warm-up, eager
    torch.npu.synchronize()
    g = torch.npu.NPUGraph()
    with torch.npu.graph(g):
        out, lse = step()
    results = []
    for lens in shrink_steps(inputs.seq_lens, inputs.k_cache.shape[1]):
        if device_ranges:   # graph mode: only the device lengths change, no host tiling
            lens_dev.copy_(torch.as_tensor(lens.astype(np.int32)).to(q.device))
        else:
            w.plan(lens, query_start_loc=inputs.query_start_loc, **const)
        out.fill_(float("nan"))
        lse.fill_(float("nan"))
        g.replay()
        torch.npu.synchronize()
        ref_in = dataclasses.replace(inputs, seq_lens=lens)
        ref_out, ref_lse = dense_attention(ref_in)
        acc = accuracy.check(out.float().cpu().numpy(), lse.cpu().numpy(), ref_out, ref_lse,
                             plain_attention(ref_in), inputs.dtype)
        results.append({"seq_lens": lens.tolist()[:8], "passed": acc.passed, "out_max": acc.out_max,
                        "reason": acc.reason})
    return {"case": case.name, "mode": "device" if device_ranges else "host", "kernel": w.kernel_reason,
            "passed": all(r["passed"] for r in results), "replays": results}


def bench(profile: str, iters: int = 50) -> dict:
    """Eager run() vs graph replay on B=32 requests of 4096 tokens, 32/8 heads, D=128, bf16, pages of 128."""
    import torch

    B, L, Hq, Hkv, D, page = 32, 4096, 32, 8, 128, 128
    dev = "npu"
    pages_per = L // page
    q = torch.randn(B, Hq, D, dtype=torch.bfloat16, device=dev)
    k = torch.randn(B * pages_per, page, Hkv, D, dtype=torch.bfloat16, device=dev)
    v = torch.randn_like(k)
    bt = torch.arange(B * pages_per, dtype=torch.int32, device=dev).reshape(B, pages_per)
    lens = np.full(B, L, np.int32)
    w = ascend_ops.AscendDecodeWrapper(Hq, Hkv, D, page, dtype=torch.bfloat16, profile=profile, graph_stable=True,
                                       max_splits=get_profile(profile).max_splits)
    w.plan(lens, max_pages=pages_per, num_pages=k.shape[0])
    w.run(q, k, v, bt)
    torch.npu.synchronize()

    def timed(fn) -> float:
        start, end = torch.npu.Event(enable_timing=True), torch.npu.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            fn()
        end.record()
        torch.npu.synchronize()
        return start.elapsed_time(end) * 1e3 / iters  # µs

    eager_us = timed(lambda: w.run(q, k, v, bt))
    g = torch.npu.NPUGraph()
    with torch.npu.graph(g):
        w.run(q, k, v, bt)
    replay_us = timed(g.replay)
    kv_bytes = B * L * Hkv * D * 2 * 2
    return {"config": f"B={B} L={L} Hq/Hkv={Hq}/{Hkv} D={D} bf16 page={page}", "plan": w.host_plan.describe(),
            "eager_run_us": round(eager_us, 1), "graph_replay_us": round(replay_us, 1),
            "kv_gbps_at_replay": round(kv_bytes / (replay_us * 1e3), 1), "measured": "on this node"}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", choices=("small", "full", "all"), default="small")
    ap.add_argument("--cases", default=None, help="filter: glob or substring of case names, comma-separated")
    ap.add_argument("--profile", default=support.profile())
    ap.add_argument("--mode", choices=("host", "device", "both"), default="both",
                    help="host: plan() before each replay; device: split size fixed at capture, lengths from a "
                         "device tensor (no host tiling per step); both (default)")
    ap.add_argument("--bench", action="store_true", help="also time eager run() against graph replay")
    ap.add_argument("--out", help="write the results as JSON")
    args = ap.parse_args(argv)
    why = ascend_ops.runtime_unavailable()
    if why:
        print(f"error: the Ascend operator cannot run here: {why}", file=sys.stderr)
        return 2
    sizes = {"small": ("small",), "full": ("full",), "all": ("small", "full")}[args.size]
    report = {"provenance": provenance(), "graph": [], "bench": None}
    for case in cases.catalog(sizes, args.cases):
        why = support.unsupported_reason(case.build().q.shape[-1], case.build().dtype, case.build().kv_dtype)
        if why:
            report["graph"].append({"case": case.name, "passed": True, "skipped": why})
            continue
        for device_ranges in {"host": (False,), "device": (True,), "both": (False, True)}[args.mode]:
            try:
                r = graph_case(case, args.profile, device_ranges)
            except Exception as e:  # noqa: BLE001 - reported per case
                r = {"case": case.name, "mode": "device" if device_ranges else "host", "passed": False,
                     "error": f"{type(e).__name__}: {e}"}
            report["graph"].append(r)
            print(f"{'pass' if r['passed'] else 'FAIL'}  {case.name} ({r['mode']})  {r.get('error', '')}")
    if args.bench:
        report["bench"] = bench(args.profile)
        print(json.dumps(report["bench"], indent=1))
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(report, f, indent=1, default=float)
    failed = [r["case"] for r in report["graph"] if not r["passed"]]
    print(f"{len(report['graph']) - len(failed)} of {len(report['graph'])} cases passed every replay")
    return 1 if failed else 0
