#!/usr/bin/env python3
"""Probe: stage 1 with Hopper's bulk tensor copies (TMA), one copy per KV page, against our stage 1.

A measurement, not a backend: before building page-granular tensor copies into ``cuda_ref/kernels.py``
(docs/perf-notes.md, "Next steps"), this asks whether they move the KV faster at the points that
trail the peers. The probe kernel covers the one case those points share: one query row per request,
16-bit K / V in the NHD page layout ``[P, PAGE, Hkv, D]`` (contiguous), no window, no soft cap, a
fixed split length, and no bounds reporting (a tensor copy fills coordinates outside the cache
with zeros, so an out-of-range page id reads zeros; the probe does not report it).

Each program takes one (request, KV head, split): the GQA group's query rows padded to 16, then per
iteration ``PPI`` pages, each page's K and V one tensor copy ``[PAGE, D]`` from a descriptor over
the cache seen as ``[P * PAGE, Hkv * D]`` (a page's rows for one head are one box: ``PAGE`` rows of
``D`` elements, ``Hkv * D`` apart). Scores of the ``PPI`` pages (1, 2 or 4) share one online-softmax step; each page's two dots
are their own (no tile is assembled from the pages).
Output: the split's partial state (normalised rows and base-2 lse), as our stage 1 writes it.

On a GPU: each variant checked against SDPA's math backend on a contiguous copy (the partial states
merged on the host by ``splitkv_common.merge.merge_states``), then timed as ``bench_decode.py`` times (graph replay after a read flush,
median), beside our stage 1 alone (``DecodeWrapper`` with the merge off) with the same split::

    python scripts/h200_tma_probe.py --out DIR [--points B1x16k/256,B16x1k]   # name: B, context, split (POINTS)

On the CPU (``TRITON_INTERPRET=1``, small case): ``--check`` runs the correctness check only.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from splitkv_common.optional import require  # noqa: E402

torch = require("torch", "scripts/h200_tma_probe.py")
import cuda_ref  # noqa: E402,F401  (without a GPU: Triton's interpreter, set before the kernels below)
import numpy as np  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from triton.tools.tensor_descriptor import TensorDescriptor  # noqa: E402

from splitkv_common.merge import merge_states  # noqa: E402
from splitkv_common.parity.cases import random_inputs  # noqa: E402
from splitkv_common.reference import dense_attention  # noqa: E402
from splitkv_common.torch_io import to_torch  # noqa: E402

LOG2E = 1.4426950408889634


@triton.jit
def _page(q, k_desc, v_desc, bt_row, col, c_end, h, end, qk_scale, PAGE: tl.constexpr, D: tl.constexpr,
          UPCAST: tl.constexpr):
    """Block-table column ``col``'s page: K and V each one tensor copy ``[PAGE, D]``; returns the
    scores ``[BLOCK_M, PAGE]`` (base 2, -inf from ``end`` on) and V."""
    pg = tl.load(bt_row + col, mask=col < c_end, other=0)
    k = k_desc.load([pg * PAGE, h * D])
    v = v_desc.load([pg * PAGE, h * D])
    if UPCAST:
        k, v = k.to(tl.float32), v.to(tl.float32)
    s = tl.dot(q, tl.trans(k)) * qk_scale
    s = tl.where((col * PAGE + tl.arange(0, PAGE))[None, :] < end, s, float("-inf"))
    return s, v


@triton.jit
def tma_stage1(Q, k_desc, v_desc, BT, SEQ, PART_O, PART_LSE, qk_scale, NSPLIT, stride_qb, stride_qh, stride_bt,
               SPLIT: tl.constexpr, HKV: tl.constexpr, G: tl.constexpr, D: tl.constexpr, PAGE: tl.constexpr,
               BLOCK_M: tl.constexpr, PPI: tl.constexpr, UPCAST: tl.constexpr, WS: tl.constexpr = False):
    """Program ``(split, KV head, request)`` flattened: the partial state of one split. ``UPCAST``:
    16-bit values to float32 after each load (the CPU interpreter's dot needs it). ``WS``: the KV loop
    warp-specialized by Triton (``tl.range(..., warp_specialize=True)``: copies issued by a producer
    warp group ahead of the math)."""
    pid = tl.program_id(0)
    split = pid % NSPLIT
    bh = pid // NSPLIT
    h = bh % HKV
    b = bh // HKV
    seq = tl.load(SEQ + b)
    start = split * SPLIT
    end = tl.minimum(start + SPLIT, seq)
    rows = tl.arange(0, BLOCK_M)
    row_ok = rows < G
    offs_d = tl.arange(0, D)
    q = tl.load(Q + b * stride_qb + (h * G + rows)[:, None] * stride_qh + offs_d[None, :], mask=row_ok[:, None],
                other=0.0)
    if UPCAST:
        q = q.to(tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    bt_row = BT + b.to(tl.int64) * stride_bt
    c0 = start // PAGE
    c_end = (end + PAGE - 1) // PAGE
    for c in tl.range(c0, c_end, PPI, warp_specialize=WS):
        s0, v0 = _page(q, k_desc, v_desc, bt_row, c, c_end, h, end, qk_scale, PAGE, D, UPCAST)
        mx = tl.max(s0, 1)
        if PPI >= 2:
            s1, v1 = _page(q, k_desc, v_desc, bt_row, c + 1, c_end, h, end, qk_scale, PAGE, D, UPCAST)
            mx = tl.maximum(mx, tl.max(s1, 1))
        if PPI >= 4:
            s2, v2 = _page(q, k_desc, v_desc, bt_row, c + 2, c_end, h, end, qk_scale, PAGE, D, UPCAST)
            s3, v3 = _page(q, k_desc, v_desc, bt_row, c + 3, c_end, h, end, qk_scale, PAGE, D, UPCAST)
            mx = tl.maximum(mx, tl.maximum(tl.max(s2, 1), tl.max(s3, 1)))
        m_new = tl.maximum(m_i, mx)
        m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_ref)
        p0 = tl.exp2(s0 - m_ref[:, None])
        l_i = l_i * alpha + tl.sum(p0, 1)
        acc = acc * alpha[:, None] + tl.dot(p0.to(v0.dtype), v0)
        if PPI >= 2:
            p1 = tl.exp2(s1 - m_ref[:, None])
            l_i += tl.sum(p1, 1)
            acc += tl.dot(p1.to(v1.dtype), v1)
        if PPI >= 4:
            p2 = tl.exp2(s2 - m_ref[:, None])
            p3 = tl.exp2(s3 - m_ref[:, None])
            l_i += tl.sum(p2, 1) + tl.sum(p3, 1)
            acc += tl.dot(p2.to(v2.dtype), v2)
            acc += tl.dot(p3.to(v3.dtype), v3)
        m_i = m_new
    l_safe = tl.where(l_i > 0, l_i, 1.0)
    o = acc / l_safe[:, None]
    lse = tl.where(l_i > 0, m_i + tl.log2(l_safe), float("-inf"))
    slot = (b * HKV * G + h * G + rows) * NSPLIT + split   # [request, head, split] partial slots
    tl.store(PART_O + slot.to(tl.int64)[:, None] * D + offs_d[None, :], o, mask=row_ok[:, None])
    tl.store(PART_LSE + slot, lse, mask=row_ok)


def probe_runner(q, k, v, bt, seq, split: int, ppi: int = 1, num_warps: int = 4, num_stages: int = 3,
                 ws: bool = False):
    """``(run, nsplit)``: ``run()`` launches the probe into buffers made here, returns ``(part_o, part_lse)``
    ``[B, Hq, nsplit, D]`` float32 and ``[B, Hq, nsplit]`` (base-2 lse)."""
    P, PAGE, hkv, D = k.shape
    B, hq, _ = q.shape
    G = hq // hkv
    nsplit = -(-bt.shape[1] * PAGE // split)
    k2, v2 = k.view(P * PAGE, hkv * D), v.view(P * PAGE, hkv * D)
    kd = TensorDescriptor.from_tensor(k2, [PAGE, D])
    vd = TensorDescriptor.from_tensor(v2, [PAGE, D])
    part_o = torch.empty(B, hq, nsplit, D, dtype=torch.float32, device=q.device)
    part_lse = torch.empty(B, hq, nsplit, dtype=torch.float32, device=q.device)
    scale = LOG2E / math.sqrt(D)
    grid = (B * hkv * nsplit,)

    def run():
        tma_stage1[grid](q, kd, vd, bt, seq, part_o, part_lse, scale, nsplit, q.stride(0), q.stride(1), bt.stride(0),
                         SPLIT=split, HKV=hkv, G=G, D=D, PAGE=PAGE, BLOCK_M=max(16, triton.next_power_of_2(G)),
                         PPI=ppi, UPCAST=not q.is_cuda, WS=ws, num_warps=num_warps, num_stages=num_stages)
        return part_o, part_lse
    return run, nsplit


def merged(part_o, part_lse) -> np.ndarray:
    """The probe's partial states merged exactly on the host (:func:`splitkv_common.merge.merge_states`,
    the lse from base 2 to natural): float32 ``[B, Hq, D]``."""
    return merge_states(part_o.float().cpu().numpy(), part_lse.cpu().numpy() / LOG2E, axis=2)[0]


def rel_err(got: np.ndarray, ref: np.ndarray) -> float:
    return float(np.linalg.norm(got - ref) / np.linalg.norm(ref))


def check(device: str, ppi: int = 1, ws: bool = False) -> float:
    """Relative error of the probe against the NumPy reference (:func:`splitkv_common.reference.dense_attention`)
    on a small ragged batch with shuffled pages and partial last pages (bf16, Hq 8 / Hkv 2, D 64, split 64)."""
    inp = random_inputs(0, [200, 193, 186], num_q_heads=8, num_kv_heads=2, head_dim=64, page_size=16,
                        dtype="bfloat16")
    x = to_torch(inp, device)
    run, _ = probe_runner(x["q"], x["k_cache"], x["v_cache"], x["block_table"], x["seq_lens"], 64, ppi, ws=ws)
    return rel_err(merged(*run()), dense_attention(inp)[0])


# (pages an iteration, warps, stages, warp-specialized loop)
PROBE_VARIANTS = [(ppi, nw, ns, False) for ppi in (2, 4) for nw, ns in ((4, 4), (4, 6), (2, 4), (2, 6))] + \
    [(ppi, nw, ns, True) for ppi in (2, 4) for nw, ns in ((4, 3), (4, 4), (8, 3))]
POINTS = {"B1x2k": (1, 2048, 128), "B1x2k/64": (1, 2048, 64), "B1x16k": (1, 16384, 512),
          "B1x16k/256": (1, 16384, 256), "B1x16k/128": (1, 16384, 128), "B16x1k": (16, 1024, 1024),
          "B16x1k/512": (16, 1024, 512), "B16x1k/256": (16, 1024, 256), "B16x8k": (16, 8192, 8192),
          "B16x8k/1024": (16, 8192, 1024), "B64x2k": (64, 2048, 2048), "B4x1k": (4, 1024, 1024),
          "B4x1k/256": (4, 1024, 256)}   # name -> (B, context, split length)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="tma_probe_out")
    ap.add_argument("--points", default=",".join(POINTS))
    ap.add_argument("--check", action="store_true", help="correctness only (small case; the CPU interpreter)")
    args = ap.parse_args(argv)
    if args.check or not torch.cuda.is_available():
        for ppi in (1, 2, 4):
            for ws in (False, True):
                err = check("cuda" if torch.cuda.is_available() else "cpu", ppi=ppi, ws=ws)
                print(f"PPI {ppi}{' warp-specialized' if ws else ''}: relative error against the NumPy reference "
                      f"{err:.2e}")
                assert err < 1e-2, err
        return 0
    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device="cuda"))
    from bench_decode import Timer, contiguous_kv, kv_bytes, make_point
    from h200_perf_check import make_runner
    from splitkv_common.provenance import provenance
    os.makedirs(args.out, exist_ok=True)
    timer = Timer(iters=40, flush="read")
    res = dict(provenance=provenance(), points={})
    for name in args.points.split(","):
        B, ctx, split = POINTS[name]
        q, k, v, bt, seq = make_point(B, ctx, 32, 8, 128, torch.bfloat16)
        kc, vc = contiguous_kv(k, bt, B, ctx), contiguous_kv(v, bt, B, ctx)   # SDPA math on a contiguous copy
        ref = torch.nn.functional.scaled_dot_product_attention(
            q[:, :, None].float(), kc.float(), vc.float(), enable_gqa=True)[:, :, 0].cpu().numpy()
        row = {}
        ours, _, _ = make_runner(q, k, v, bt, seq, policy=f"size:{split}", merge=False)
        row["ours stage 1 alone"] = timer(ours)
        ours_full, _, _ = make_runner(q, k, v, bt, seq, policy=f"size:{split}")
        row["ours with merge"] = timer(ours_full)
        ours_auto, plan, _ = make_runner(q, k, v, bt, seq)
        row["ours auto"] = timer(ours_auto)
        row["ours auto split"] = int(plan.split_tokens)
        for ppi, nw, ns, ws in PROBE_VARIANTS:
            key = f"tma ppi{ppi} w{nw} s{ns}" + (" ws" if ws else "")
            try:
                run, _ = probe_runner(q, k, v, bt, seq, split, ppi, nw, ns, ws)
                err = rel_err(merged(*run()), ref)
                row[key] = timer(run)
                row[key + " err"] = err
            except Exception as e:   # a configuration that does not compile: recorded
                row[key] = f"{type(e).__name__}: {str(e)[:200]}"
        row["kv GB"] = kv_bytes(B, ctx, 8, 128, "bf16") / 1e9
        res["points"][name] = row
        print(name, json.dumps(row, indent=1), flush=True)
    with open(os.path.join(args.out, "tma_probe.json"), "w") as f:
        json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
