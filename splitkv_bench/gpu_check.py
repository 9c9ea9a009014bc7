"""Correctness of the Triton backend on a CUDA GPU (run on the H200; see docs/triton.md).

1. parity: the whole catalog (small + full) through the harness, separate and fused merge;
2. graph: every catalog case planned graph-stable, ``run()`` captured in a CUDA graph once, then
   replayed with new lengths (plan refreshed in place, outputs poisoned with NaN before each
   replay) and judged against the float64 reference each time; captured with the launch fast path
   (``cuda_ref.fast_launch``) unless ``SPLITKV_FAST_LAUNCH=0``, each line says which path it was;
3. batch invariance: with a fixed split size, a request's output rows are bitwise identical
   whatever the rest of the batch is (alone, first, last, among other lengths).

4. hostile inputs (``--hostile``, alone): out-of-range and negative page ids (masked, counted,
   other requests bitwise unchanged; eager, fused and graph-replayed), page ids whose offsets pass
   2^31 elements, device lengths / row offsets the plan was not made for, corrupt plans through the
   op, strided index tensors (refused). Run under ``compute-sanitizer --tool memcheck``: 0 errors
   expected (``scripts/gpu_checks.sh OUT hostile``). Without CUDA it runs small in the interpreter.

    python -m splitkv_bench gpu-check --out DIR [--quick]
    compute-sanitizer --tool memcheck --error-exitcode 3 python -m splitkv_bench gpu-check --out DIR --hostile
Exit status 0 only when every check passed.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import time
from functools import partial

import numpy as np

from splitkv_common.optional import require

torch = require("torch", "python -m splitkv_bench gpu-check")
import cuda_ref  # noqa: E402,F401  (without CUDA: selects the interpreter before triton is imported)
require("triton", "python -m splitkv_bench gpu-check")

from cuda_ref import backend as tb  # noqa: E402
from cuda_ref.wrapper import DecodeWrapper  # noqa: E402
from splitkv_common.parity import accuracy, cases  # noqa: E402
from splitkv_common.parity.harness import run_parity  # noqa: E402
from splitkv_common.provenance import provenance  # noqa: E402
from splitkv_common.reference import dense_attention, plain_attention  # noqa: E402
from splitkv_common.torch_io import to_torch  # noqa: E402


def catalog(sizes, pattern, shard=(0, 1)):
    """The catalog's cases, every ``shard[1]``-th from ``shard[0]`` (parallel processes share a GPU)."""
    return cases.catalog(sizes, pattern)[shard[0]::shard[1]]


def parity(sizes, pattern, out_dir, shard=(0, 1)):
    fused = dataclasses.replace(tb.triton_backend, name="triton-fused", run=partial(tb.run, fuse_merge=True))
    rep = run_parity([tb.triton_backend, fused], catalog(sizes, pattern, shard), progress=False)
    rep.write(os.path.join(out_dir, f"parity_{shard[0]}of{shard[1]}.md"))
    print(rep.to_markdown().split("\n\n")[0])
    bad = [r for r in rep.results if r.status not in ("pass", "unsupported")]
    for r in bad:
        print("PARITY FAIL", r.backend, r.case, r.status, r.message[:300])
    return rep.ok, rep.counts()


LAUNCH_PATHS: dict = {}  # (case, fuse) -> the captured run()'s launch path (DecodeLaunch.fast)


def graph_case(case, fuse, replays=4, seed=0):
    """Capture once, replay with changed lengths; returns a list of (replay, passed, message)."""
    inp = case.build()
    T, Hq, D = inp.q.shape
    _, page, Hkv, _ = inp.k_cache.shape
    kvd = "int8" if inp.kv_dtype == "int8" else inp.dtype
    policy = case.policy if not case.policy.startswith("count") else case.policy
    w = DecodeWrapper(Hq, Hkv, D, page, dtype=inp.dtype, kv_dtype=kvd, policy=policy, graph_stable=True,
                      max_splits=16, fuse_merge=fuse,
                      min_split_tokens=case.plan_kwargs.get("min_split_tokens"))
    x = to_torch(inp, "cuda")
    kw = dict(scale=inp.scale, soft_cap=inp.soft_cap, window_left=inp.window_left)
    w.plan(inp.seq_lens, query_start_loc=inp.query_start_loc, window_left=inp.window_left)
    out, lse = w.run(**x, **kw)  # warm up (compile) outside the capture
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out, lse = w.run(**x, **kw)  # the launch fast path (cuda_ref.fast_launch) unless SPLITKV_FAST_LAUNCH=0
    LAUNCH_PATHS[(case.name, fuse)] = w.last_launch.fast if w.last_launch is not None else None
    rng = np.random.default_rng(seed)
    results = []
    for r in range(replays):
        lens = inp.seq_lens.copy() if r == 0 else rng.integers(0, inp.seq_lens + 1).astype(np.int32)
        new = dataclasses.replace(inp, seq_lens=lens)
        w.plan(lens, query_start_loc=inp.query_start_loc, window_left=inp.window_left)
        x["seq_lens"].copy_(torch.from_numpy(lens))
        out.fill_(float("nan"))
        lse.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        ro, rl = dense_attention(new)
        acc = accuracy.check(out.float().cpu().numpy(), lse.cpu().numpy(), ro, rl, plain_attention(new), new.dtype)
        results.append((r, acc.passed, acc.reason, lens.tolist()[:6]))
    return results


def graph_checks(sizes, pattern, shard=(0, 1)):
    ok, lines = True, []
    for case in catalog(sizes, pattern, shard):
        if tb.triton_backend.unsupported(case.build()):
            continue
        for fuse in (False, True):
            try:
                res = graph_case(case, fuse)
            except Exception as e:  # noqa: BLE001
                ok = False
                lines.append(f"GRAPH ERROR {case.name} fuse={fuse}: {type(e).__name__}: {str(e)[:200]}")
                continue
            for r, passed, reason, lens in res:
                if not passed:
                    ok = False
                    lines.append(f"GRAPH FAIL {case.name} fuse={fuse} replay {r} lens {lens}: {reason[:200]}")
            path = LAUNCH_PATHS.get((case.name, fuse)) or {}
            how = "fast launch" if path.get("fast") else f"normal launch ({path.get('reason')})"
            lines.append(f"graph {case.name} fuse={fuse}: {sum(p for _, p, _, _ in res)}/{len(res)} replays pass"
                         f", captured with the {how}")
    return ok, lines


def invariance_check(target=5000, others=([], [1], [123, 7000], [16384, 0, 31, 4097], [900] * 7, [900] * 40),
                     heads=(32, 8), split=512):
    """Bitwise batch invariance under a fixed split size (bf16, Hq 32 / Hkv 8, D 128); the last batch
    has enough rows for the merge to take more heads per program than with one row."""
    outs = []
    for j, extra in enumerate(others):
        for first in (True, False):
            lens = [target] + list(extra) if first else list(extra) + [target]
            inp = cases.random_inputs(7 + j, lens, num_q_heads=heads[0], num_kv_heads=heads[1], head_dim=128,
                                      dtype="bfloat16")
            # the target request's pages, q and KV values are the same in every batch: copy them in
            if not outs:
                base = inp
            else:
                inp = _transplant(base, inp, 0, lens.index(target) if first else len(lens) - 1)
            for fuse in (False, True):
                plan = inp.plan(f"size:{split}", device="h200")
                o, l = tb.run(inp, plan, fuse_merge=fuse)
                row = 0 if first else len(lens) - 1
                outs.append((j, first, fuse, o[row].copy(), l[row].copy()))
    ref_o, ref_l = outs[0][3], outs[0][4]
    same = all(np.array_equal(o.view(np.uint32), ref_o.view(np.uint32)) and
               np.array_equal(l.view(np.uint32), ref_l.view(np.uint32)) for _, _, _, o, l in outs)
    return same, len(outs)


def _transplant(src, dst, src_req, dst_req):
    """Give request ``dst_req`` of ``dst`` the query and KV of request ``src_req`` of ``src``."""
    L = int(src.seq_lens[src_req])
    assert int(dst.seq_lens[dst_req]) == L
    page = src.k_cache.shape[1]
    n = -(-L // page)
    q = dst.q.copy()
    q[dst.query_start_loc[dst_req]] = src.q[src.query_start_loc[src_req]]
    k, v = dst.k_cache.copy(), dst.v_cache.copy()
    k[dst.block_table[dst_req, :n]] = src.k_cache[src.block_table[src_req, :n]]
    v[dst.block_table[dst_req, :n]] = src.v_cache[src.block_table[src_req, :n]]
    return dataclasses.replace(dst, q=q, k_cache=k, v_cache=v)


INT32_MAX = 2 ** 31 - 1


def _hostile_setup(dev, fuse=False, lens=None, graph_stable=False):
    """A small ragged batch on ``dev`` (GPU: bf16 Hq 8 / Hkv 2 D 128 page 16; CPU: interpreter-sized)."""
    gpu = dev == "cuda"
    lens = lens or ([300, 1000, 77, 513] if gpu else [20, 13, 9])
    kw = dict(num_q_heads=8, num_kv_heads=2, head_dim=128, page_size=16, dtype="bfloat16") if gpu else \
        dict(num_q_heads=4, num_kv_heads=2, head_dim=16, page_size=4, dtype="float32")
    inp = cases.random_inputs(5, lens, **kw)
    T, Hq, D = inp.q.shape
    _, page, Hkv, _ = inp.k_cache.shape
    w = DecodeWrapper(Hq, Hkv, D, page, dtype=inp.dtype, device=dev, policy=f"size:{4 * page}", fuse_merge=fuse,
                      graph_stable=graph_stable, max_splits=64 if graph_stable else None)
    w.plan(inp.seq_lens)
    return inp, w, to_torch(inp, dev)


def _sync(dev):
    if dev == "cuda":
        torch.cuda.synchronize()


def _expect_raise(exc, pattern, fn):
    import re
    try:
        fn()
    except exc as e:
        return bool(re.search(pattern, str(e))), f"{type(e).__name__}: {str(e)[:160]}"
    return False, "did not raise"


def hostile_checks(dev):
    """Hostile inputs that reach a kernel (see the module docstring); returns ``(ok, lines)``."""
    from cuda_ref import ops
    from cuda_ref.launch import DevicePlan
    results = []

    def record(name, ok, msg=""):
        results.append((name, bool(ok), msg))

    for fuse in (False, True):
        inp, w, x = _hostile_setup(dev, fuse)
        out0, lse0 = (t.clone() for t in w.run(**x))
        P = inp.k_cache.shape[0]
        for bad in (-1, P, P + 1, 10 ** 6, INT32_MAX, -INT32_MAX - 1):
            xb = dict(x, block_table=x["block_table"].clone())
            xb["block_table"][1, 1] = bad
            out, lse = (t.clone() for t in w.run(**xb))
            _sync(dev)
            others = [r for r in range(len(inp.seq_lens)) if r != 1]
            iso = all(torch.equal(out[r], out0[r]) and torch.equal(lse[r], lse0[r]) for r in others)
            fin = bool(torch.isfinite(out.float()).all() and torch.isfinite(lse).all())
            ok_msg, msg = _expect_raise(RuntimeError, rf"request 1, logical page 1, page id {bad}\b", w.check_errors)
            record(f"page id {bad} fuse={fuse}", iso and fin and ok_msg,
                   f"others bitwise {iso}, finite {fin}, check_errors: {msg}")
        xb = dict(x, block_table=torch.full_like(x["block_table"], -5))  # every page of every request
        out, lse = w.run(**xb)
        _sync(dev)
        record(f"all page ids bad fuse={fuse}", bool((out == 0).all() and torch.isneginf(lse).all())
               and _expect_raise(RuntimeError, "page id -5", w.check_errors)[0])

    # graph replay: captured with a clean table, replayed with bad entries copied in
    if dev == "cuda":
        inp, w, x = _hostile_setup(dev, graph_stable=True)
        out0 = w.run(**x)[0].clone()
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            out, lse = w.run(**x)
        bt = x["block_table"].clone()
        bt[2, 0] = 10 ** 6
        bt[0, 3] = -1
        x["block_table"].copy_(bt)
        g.replay()
        torch.cuda.synchronize()
        same = torch.equal(out[1], out0[1]) and torch.equal(out[3], out0[3])
        ok_msg, msg = _expect_raise(RuntimeError, r"request [02], logical page [03], page id (1000000|-1)\b",
                                    w.check_errors)
        record("graph replay with bad page ids", same and ok_msg, msg)

    # page ids whose element offsets pass 2^31 (64-bit address arithmetic): the same batch in a
    # cache of 600k pages (two ~4.9 GB buffers) with its pages moved to the top, bitwise as the small one
    if dev == "cuda":
        inp, w, x = _hostile_setup(dev)
        out0 = w.run(**x)[0].clone()
        P = 600_000
        big_k = torch.empty((P,) + tuple(x["k_cache"].shape[1:]), dtype=x["k_cache"].dtype, device=dev)
        big_v = torch.empty_like(big_k)
        n = x["k_cache"].shape[0]
        big_k[P - n:] = x["k_cache"]
        big_v[P - n:] = x["v_cache"]
        out = w.run(**dict(x, k_cache=big_k, v_cache=big_v, block_table=x["block_table"] + (P - n)))[0]
        torch.cuda.synchronize()
        record("page offsets past 2^31 elements", torch.equal(out, out0) and
               int(x["block_table"].max() + P - n) * big_k.stride(0) > INT32_MAX)
        w.check_errors()
        del big_k, big_v
        torch.cuda.empty_cache()

    # device lengths and row offsets the plan was not made for (validate=False): no wild access
    inp, w, x = _hostile_setup(dev)
    B = len(inp.seq_lens)
    xs = dict(x, seq_lens=torch.tensor([INT32_MAX, -5] + [10 ** 6] * (B - 2), dtype=torch.int32, device=dev),
              query_start_loc=torch.tensor([0, 10 ** 6, -(10 ** 6)] + [INT32_MAX] * (B - 2), dtype=torch.int32,
                                           device=dev))
    for fuse in (False, True):
        w.fuse_merge = fuse
        w.run(**xs)
        _sync(dev)
        record(f"huge and negative device lengths / row offsets fuse={fuse}", True)
    w.fuse_merge = False

    # corrupt plans through the op (whose plan values are never read on the host)
    dp = DevicePlan.from_plan(inp.plan("size:16"), inp.q.shape[1] // inp.k_cache.shape[2], dev)
    data, shape = ops.plan_args(dp)
    for field, value in (("item_request", 10 ** 6), ("item_kv_head", -3), ("item_kv_end", INT32_MAX),
                         ("item_split", 10 ** 6), ("row_slot_start", 10 ** 6), ("row_slot_start", -(10 ** 6)),
                         ("row_num_splits", INT32_MAX), ("num_splits", 10 ** 6)):
        bad = DevicePlan(data.clone(), *shape[:7], bool(shape[7]))
        bad.view(field)[:] = value
        torch.ops.splitkv.decode_attention(x["q"], x["k_cache"], x["v_cache"], x["block_table"], x["seq_lens"],
                                           x["query_start_loc"], bad.data, shape, 0.1)
        _sync(dev)
        record(f"op with plan {field} = {value}", True)

    # strided index tensors and short q: refused before any launch
    for name in ("block_table", "seq_lens", "query_start_loc"):
        t = x[name]
        wide = torch.zeros(t.shape[:-1] + (2 * t.shape[-1],), dtype=t.dtype, device=dev)
        wide[..., ::2] = t
        ok, msg = _expect_raise(ValueError, "stride 1", lambda: w.run(**dict(x, **{name: wide[..., ::2]})))
        record(f"strided {name} refused", ok, msg)
    ok, msg = _expect_raise(ValueError, "q: the plan is for", lambda: torch.ops.splitkv.decode_attention(
        x["q"][:1], x["k_cache"], x["v_cache"], x["block_table"], x["seq_lens"], x["query_start_loc"], data, shape,
        0.1))
    record("op with q shorter than the plan refused", ok, msg)
    lines = [f"hostile {'ok  ' if ok else 'FAIL'} {name}{': ' + msg if msg and not ok else ''}"
             for name, ok, msg in results]
    return all(ok for _, ok, _ in results), lines


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="check_out")
    ap.add_argument("--quick", action="store_true", help="small catalog only, no graph/invariance (sanitizer runs)")
    ap.add_argument("--cases", default=None)
    ap.add_argument("--no-parity", action="store_true", help="graph replay and invariance only")
    ap.add_argument("--graph-small", action="store_true", help="graph replay on the small catalog only")
    ap.add_argument("--short-invariance", action="store_true", help="3 batch compositions instead of 5")
    ap.add_argument("--shard", default="0/1", help="K/N: every N-th case from the K-th (parallel processes)")
    ap.add_argument("--no-graph", action="store_true", help="parity only")
    ap.add_argument("--no-invariance", action="store_true")
    ap.add_argument("--hostile", action="store_true", help="the hostile-input checks alone (run under memcheck)")
    args = ap.parse_args(argv)
    if args.hostile:
        os.makedirs(args.out, exist_ok=True)
        dev = "cuda" if torch.cuda.is_available() else "cpu"
        ok, lines = hostile_checks(dev)
        print("\n".join(lines))
        print(f"hostile ok={ok} ({sum(ln.startswith('hostile ok') for ln in lines)}/{len(lines)} on {dev})")
        with open(os.path.join(args.out, "hostile.json"), "w") as f:
            json.dump({"provenance": provenance(), "device": dev, "ok": ok, "lines": lines}, f, indent=1)
        return 0 if ok else 1
    shard = tuple(int(x) for x in args.shard.split("/"))
    os.makedirs(args.out, exist_ok=True)
    sizes = ("small",) if args.quick else ("small", "full")
    t0 = time.time()
    summary = {"provenance": provenance(), "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu (interpreter)",
               "torch": torch.__version__}
    ok = True
    if not args.no_parity:
        ok_p, counts = parity(sizes, args.cases, args.out, shard)
        summary["parity_ok"], summary["parity_counts"] = ok_p, counts
        print(f"parity ok={ok_p} {counts} ({time.time() - t0:.0f}s)")
        ok = ok_p
    if not args.quick and not args.no_graph:
        ok_g, lines = graph_checks(("small",) if args.graph_small else sizes, args.cases, shard)
        summary["graph_ok"], summary["graph_log"] = ok_g, lines
        print("\n".join(lines[-80:]))
        print(f"graph ok={ok_g} ({time.time() - t0:.0f}s)", flush=True)
        ok = ok and ok_g
    if not args.quick and not args.no_invariance:
        kw = dict(others=([], [123, 7000], [16384, 0, 31, 4097])) if args.short_invariance else {}
        same, n = invariance_check(**kw)
        summary["batch_invariant_bitwise"], summary["invariance_runs"] = same, n
        print(f"batch invariance bitwise={same} over {n} runs ({time.time() - t0:.0f}s)")
        ok = ok and same
    summary["ok"] = ok
    with open(os.path.join(args.out, f"check_{shard[0]}of{shard[1]}.json"), "w") as f:
        json.dump(summary, f, indent=1)
    return 0 if ok else 1
