"""Shared-prefix decode against the plain split-KV step, side by side, and the planner's choice.

For each point ``B x prefix x tail`` (every request: the shared prefix, then its own tail; one
query row a request; Hq 32, Hkv 8, D 128, bf16, pages of 16) it

* on a CUDA GPU: checks parity first (the shared-prefix catalog on the ``triton`` backend against
  the float64 reference; at each point the shared output against the plain one), then times, each
  in a CUDA graph, with a read flush of the L2 before each replay and the median of
  ``--iters`` replays over ``--passes`` interleaved passes: the plain step (``DecodeWrapper``, policy
  ``auto``), the shared-prefix step (``SharedPrefixWrapper``, mode ``on``), what ``auto`` picks, and
  the shared step with ``concurrent_stages=True`` (the prefix stage on a second stream beside the
  tails; its output compared bit for bit with the shared step's);
* on any machine (``--model-only``): the cost model's estimates for ``--profiles`` (e.g. the
  910B's, whose figures are unmeasured placeholders: no NPU ran them).

Bytes: ``plain`` reads every request's whole history; ``shared`` each group's prefix once per block of
packed rows plus the tails; ``unique`` is the floor (the prefix once, each tail once).

Writes ``OUT_DIR/bench_shared_prefix.json`` and ``.md``::

    python -m splitkv_bench shared-prefix --out OUT_DIR               # GPU: parity, timings, model
    python -m splitkv_bench shared-prefix --model-only --out OUT_DIR  # the cost model alone
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from splitkv_common.provenance import provenance
from splitkv_common.shared_prefix import SharedPrefix, plan_shared_prefix

from .output import save_outputs

HQ, HKV, D, PAGE = 32, 8, 128, 16
BATCHES = (16, 64, 256)
PREFIXES = (1024, 4096, 16384)
TAILS = (64, 256, 2048)


def points(args):
    for B in args.batches:
        for P in args.prefixes:
            for t in args.tails:
                yield B, P, t


def model_row(B, P, tail, profile):
    seq = np.full(B, P + tail)
    sp = plan_shared_prefix(seq, np.arange(B + 1), SharedPrefix.single(P, batch_size=B), num_kv_heads=HKV,
                            page_size=PAGE, num_q_heads=HQ, head_dim=D, device=profile)
    on = plan_shared_prefix(seq, np.arange(B + 1), SharedPrefix.single(P, batch_size=B), num_kv_heads=HKV,
                            page_size=PAGE, num_q_heads=HQ, head_dim=D, device=profile, mode="on")
    e = on.estimates_us
    return {"B": B, "prefix": P, "tail": tail, "profile": profile, "auto_shared": sp.use_shared,
            "plain_est_us": e["plain_us"], "shared_est_us": e["shared_us"],
            "plain_mb": e["plain_bytes"] / 1e6, "shared_mb": e["shared_bytes"] / 1e6,
            "unique_mb": e["unique_bytes"] / 1e6, "reason": sp.reason}


def make_batch(B, P, tail, seed=0):
    """A bf16 paged cache holding the prefix once and each request's tail; block tables that map the
    prefix's pages first. Random normal values (never zeros)."""
    import torch
    g = torch.Generator(device="cuda").manual_seed(seed)
    n_pre, n_tail = P // PAGE, -(-tail // PAGE)
    num_pages = n_pre + B * n_tail + 1
    k = torch.randn(num_pages, PAGE, HKV, D, device="cuda", dtype=torch.bfloat16, generator=g)
    v = torch.randn(num_pages, PAGE, HKV, D, device="cuda", dtype=torch.bfloat16, generator=g)
    perm = torch.randperm(num_pages - 1, device="cuda", generator=g).to(torch.int32) + 1
    bt = torch.empty(B, n_pre + n_tail, dtype=torch.int32, device="cuda")
    bt[:, :n_pre] = perm[:n_pre]
    bt[:, n_pre:] = perm[n_pre:].reshape(B, n_tail)
    q = torch.randn(B, HQ, D, device="cuda", dtype=torch.bfloat16, generator=g)
    seq = torch.full((B,), P + tail, dtype=torch.int32, device="cuda")
    qsl = torch.arange(B + 1, dtype=torch.int32, device="cuda")
    return q, k, v, bt, seq, qsl


def gpu_rows(args, log):
    import torch

    from .gpu import Timer

    timer = Timer(args.iters)
    rows = []
    t_stop = time.perf_counter() + args.budget_s
    for B, P, tail in points(args):
        if time.perf_counter() > t_stop:
            log(f"B{B} prefix {P} tail {tail}: skipped (--budget-s {args.budget_s} spent)")
            rows.append({"B": B, "prefix": P, "tail": tail, "skipped": True})
            continue
        try:
            rows.append(gpu_point(args, timer, B, P, tail, log))
        except Exception as e:  # noqa: BLE001 - recorded: one point must not lose the others
            log(f"B{B} prefix {P} tail {tail}: {type(e).__name__}: {e}")
            rows.append({"B": B, "prefix": P, "tail": tail, "error": f"{type(e).__name__}: {e}"})
        torch.cuda.empty_cache()
    return rows


def gpu_point(args, timer, B, P, tail, log):
    import torch

    from .gpu import interleaved
    from cuda_ref.shared_prefix import SharedPrefixWrapper
    from cuda_ref.wrapper import DecodeWrapper

    q, k, v, bt, seq, qsl = make_batch(B, P, tail)
    seq_h, qsl_h, bt_h = seq.cpu().numpy(), qsl.cpu().numpy(), bt.cpu().numpy()
    sp = SharedPrefix.single(P, batch_size=B)
    plain = DecodeWrapper(HQ, HKV, D, PAGE, dtype=torch.bfloat16, profile=args.profile)
    plain.plan(seq_h)
    shared = SharedPrefixWrapper(HQ, HKV, D, PAGE, dtype=torch.bfloat16, profile=args.profile, mode="on")
    splan = shared.plan(seq_h, qsl_h, shared_prefix=sp, block_table=bt_h)
    auto = SharedPrefixWrapper(HQ, HKV, D, PAGE, dtype=torch.bfloat16, profile=args.profile, mode="auto")
    aplan = auto.plan(seq_h, qsl_h, shared_prefix=sp, block_table=bt_h)
    # the shared step with the prefix stage on a stream of its own beside the tails (concurrent_stages)
    both = SharedPrefixWrapper(HQ, HKV, D, PAGE, dtype=torch.bfloat16, profile=args.profile, mode="on",
                               concurrent_stages=True)
    both.plan(seq_h, qsl_h, shared_prefix=sp, block_table=bt_h)
    o_plain = torch.empty(B, HQ, D, dtype=torch.bfloat16, device="cuda")
    o_shared, o_auto, o_both = torch.empty_like(o_plain), torch.empty_like(o_plain), torch.empty_like(o_plain)
    l_shared = torch.empty(B, HQ, dtype=torch.float32, device="cuda")
    l_auto, l_both = torch.empty_like(l_shared), torch.empty_like(l_shared)

    def run_plain():
        o_plain.copy_(plain.run(q, k, v, bt, seq, qsl)[0])

    def run_shared():
        shared.run(q, k, v, bt, seq, qsl, out=o_shared, lse=l_shared)

    def run_auto():
        auto.run(q, k, v, bt, seq, qsl, out=o_auto, lse=l_auto)

    def run_both():
        both.run(q, k, v, bt, seq, qsl, out=o_both, lse=l_both)

    run_plain(); run_shared(); run_auto(); run_both()
    torch.cuda.synchronize()
    # parity at the point: the shared step against the plain step, and against float32 torch math
    err = float((o_shared.float() - o_plain.float()).abs().max())
    err_auto = float((o_auto.float() - o_plain.float()).abs().max())
    same_both = bool(torch.equal(o_both, o_shared) and torch.equal(l_both, l_shared))
    nan = bool(torch.isnan(o_shared).any())
    graphs = {n: timer.graph(f) for n, f in (("plain", run_plain), ("shared", run_shared), ("auto", run_auto),
                                             ("concurrent", run_both))}
    times = interleaved(timer, graphs, args.passes)
    med = {n: float(np.median(t)) for n, t in times.items()}
    m = model_row(B, P, tail, args.profile)
    row = {**m, "plain_us": med["plain"], "shared_us": med["shared"], "auto_us": med["auto"],
           "concurrent_us": med["concurrent"], "concurrent_bitwise_same": same_both,
           "speedup": med["plain"] / med["shared"], "auto_picked_shared": aplan.use_shared,
           "faster_measured": "shared" if med["shared"] < med["plain"] else "plain",
           "max_abs_diff_shared_vs_plain": err, "max_abs_diff_auto_vs_plain": err_auto, "nan": nan,
           "passes": {n: t for n, t in times.items()}, "prefix_splits": int(splan.prefix.max_splits),
           "plain_gbps": m["plain_mb"] * 1e3 / med["plain"], "shared_gbps": m["shared_mb"] * 1e3 / med["shared"]}
    log(f"B{B} prefix {P} tail {tail}: plain {med['plain']:.1f} us, shared {med['shared']:.1f} us "
        f"(x{row['speedup']:.2f}), auto {med['auto']:.1f} us ({'shared' if aplan.use_shared else 'plain'}), "
        f"concurrent stages {med['concurrent']:.1f} us (bitwise the shared step's: {same_both}), "
        f"max |shared - plain| {err:.3g}")
    return row


def gpu_parity(log):
    from cuda_ref.backend import triton_backend
    from splitkv_common.parity.shared_prefix import run_shared_prefix_parity

    rep = run_shared_prefix_parity([triton_backend])
    res = [{"case": r.case, "status": r.status, "message": r.message} for r in rep.results]
    log("parity (shared-prefix catalog, triton on CUDA): " +
        ", ".join(f"{r['case'].split('/')[-1]} {r['status']}" for r in res))
    return res


def markdown(res) -> list:
    lines = [f"# Shared-prefix vs plain decode", "", f"device: {res['device']}; {res['when']}", ""]
    if res.get("gpu"):
        lines += ["| B | prefix | tail | plain µs | shared µs | speedup | auto picks | auto µs | measured faster | "
                  "concurrent stages µs | plain MB | shared MB | unique MB | max abs diff |", "|---" * 14 + "|"]
        for r in res["gpu"]:
            if "plain_us" not in r:
                lines.append(f"| {r['B']} | {r['prefix']} | {r['tail']} | {r.get('error', 'skipped')} |")
                continue
            lines.append(f"| {r['B']} | {r['prefix']} | {r['tail']} | {r['plain_us']:.1f} | {r['shared_us']:.1f} | "
                         f"{r['speedup']:.2f} | {'shared' if r['auto_picked_shared'] else 'plain'} | "
                         f"{r['auto_us']:.1f} | {r['faster_measured']} | "
                         f"{'-' if r.get('concurrent_us') is None else format(r['concurrent_us'], '.1f')} | "
                         f"{r['plain_mb']:.1f} | {r['shared_mb']:.1f} | "
                         f"{r['unique_mb']:.1f} | {r['max_abs_diff_shared_vs_plain']:.2g} |")
        lines.append("")
    for prof, rows in res["model"].items():
        lines += [f"## Cost model, profile {prof} (estimates, not measurements)", "",
                  "| B | prefix | tail | plain est. µs | shared est. µs | auto | plain MB | shared MB | unique MB |",
                  "|---" * 9 + "|"]
        for r in rows:
            lines.append(f"| {r['B']} | {r['prefix']} | {r['tail']} | {r['plain_est_us']:.1f} | "
                         f"{r['shared_est_us']:.1f} | {'shared' if r['auto_shared'] else 'plain'} | {r['plain_mb']:.1f} | {r['shared_mb']:.1f} | "
                         f"{r['unique_mb']:.1f} |")
        lines.append("")
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=".", help="directory for the JSON and Markdown")
    ap.add_argument("--model-only", action="store_true", help="the cost model alone (no GPU needed)")
    ap.add_argument("--profile", default="h200", help="the GPU profile the planner uses")
    ap.add_argument("--profiles", default="h200,910b2", help="profiles of the cost-model tables")
    ap.add_argument("--batches", type=int, nargs="+", default=list(BATCHES))
    ap.add_argument("--prefixes", type=int, nargs="+", default=list(PREFIXES))
    ap.add_argument("--tails", type=int, nargs="+", default=list(TAILS))
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--no-parity", action="store_true")
    ap.add_argument("--budget-s", type=float, default=420.0, help="stop timing new points after this long")
    args = ap.parse_args(argv)
    log = lambda s: print(s, flush=True)  # noqa: E731
    res = {"when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "device": "cost model only",
           "shape": {"Hq": HQ, "Hkv": HKV, "D": D, "page": PAGE, "dtype": "bfloat16", "q_rows_per_request": 1},
           "model": {p: [model_row(B, P, t, p) for B, P, t in points(args)] for p in args.profiles.split(",")}}
    if not args.model_only:
        import torch
        if not torch.cuda.is_available():
            log("no CUDA device: use --model-only")
            return 2
        res["device"] = f"{torch.cuda.get_device_name()} (torch {torch.__version__})"
        import triton
        res["device"] += f", triton {triton.__version__}"
        log(res["device"])
        if not args.no_parity:
            res["parity"] = gpu_parity(log)
        res["gpu"] = gpu_rows(args, log)
    res["provenance"] = provenance()
    lines = markdown(res)
    save_outputs(args.out, "bench_shared_prefix", res, lines, default=float)
    print("\n".join(lines[:40 + len(res.get("gpu", []))]))
    bad = [r for r in res.get("parity", []) if r["status"] != "pass"]
    return 1 if bad or any(r.get("nan") or "error" in r for r in res.get("gpu", [])) else 0


if __name__ == "__main__":
    raise SystemExit(main())
