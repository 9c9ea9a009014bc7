#!/usr/bin/env python3
"""Probe: the batch-1 merge inside a thread-block cluster, against a second kernel (GPU only).

A measurement, not a backend. At batch 1 and short contexts our call trails the best peer by about
the separate merge's 1.7-1.9 µs (docs/perf-notes.md: stage 1 alone is ahead of the peer's whole
call from 1k to 16k; no way of moving the merge earlier inside Triton has paid). Triton cannot place
the splits of one (request, KV head) in one thread-block cluster; CUDA can, and then the splits'
states meet in distributed shared memory after one cluster barrier. This asks what that saves
before anyone writes a CUDA stage 1 for it.

``scripts/probes/cluster_merge.cu`` (built here with nvcc) holds one plain CUDA-core stage 1 (one
query row, GQA 4, D 128, bf16, page 16) with two endings: ``separate`` (float32 partial states to
global memory, then a merge kernel as a programmatic dependent launch: the Triton backend's shape)
and ``cluster`` (the splits of a (request, KV head) one cluster, merged through distributed shared
memory; one launch). Both against float32 attention on a contiguous copy (relative error), every
output poisoned first; then timed as ``bench_decode.py`` times (one CUDA graph a call, a read flush
before each timed replay, median), beside our call (``auto``), our stage 1 alone and the SDPA
peers (cuDNN, flash), at each point and split count::

    python scripts/h200_cluster_merge_probe.py --out DIR [--points B1x1k,B1x2k,B1x4k] [--splits 8,16,32]

Writes ``cluster_merge.json`` and ``cluster_merge.md`` to ``--out``.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import math
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, ".."))
from splitkv_common.optional import require  # noqa: E402

torch = require("torch", "scripts/h200_cluster_merge_probe.py")
from bench_decode import PAGE, Timer, contiguous_kv, make_point, ours, sdpa_peers  # noqa: E402

SOURCE = os.path.join(HERE, "probes", "cluster_merge.cu")
HQ, HKV, D = 32, 8, 128
LOG2E = 1.4426950408889634


class Params(ctypes.Structure):
    """``Params`` of cluster_merge.cu, field for field."""
    _fields_ = [(n, ctypes.c_void_p) for n in ("q", "k", "v", "block_table", "seq_lens", "part_o", "part_lse",
                                              "out", "lse")] + \
               [(n, ctypes.c_int32) for n in ("bt_stride", "hkv", "nsplit", "split")] + [("scale_log2", ctypes.c_float)]


def build(out_dir: str) -> tuple:
    """nvcc the probe into ``out_dir`` and load it: ``(the library, ptxas's resource report)``."""
    so = os.path.join(out_dir, "cluster_merge.so")
    cmd = ["nvcc", "-O3", "-arch=sm_90a", "-shared", "-Xcompiler", "-fPIC", "-Xptxas", "-v", "-o", so, SOURCE]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode:
        raise RuntimeError(f"nvcc failed:\n{res.stderr}")
    lib = ctypes.CDLL(so)
    lib.probe_separate.argtypes = [ctypes.POINTER(Params), ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
    lib.probe_cluster.argtypes = [ctypes.POINTER(Params), ctypes.c_void_p, ctypes.c_int]
    lib.probe_max_clusters.argtypes = [ctypes.POINTER(Params), ctypes.c_int]
    if lib.probe_param_bytes() != ctypes.sizeof(Params):
        raise RuntimeError(f"Params: {ctypes.sizeof(Params)} bytes here, {lib.probe_param_bytes()} in the probe")
    return lib, res.stderr


class Probe:
    """One point's buffers and launches for ``nsplit`` splits of ``ceil(ctx / nsplit)`` tokens
    (rounded up to a page)."""

    def __init__(self, lib, q, k, v, bt, seq, ctx: int, nsplit: int):
        B = q.shape[0]
        self.lib, self.B, self.nsplit = lib, B, nsplit
        split = math.ceil(math.ceil(ctx / nsplit) / PAGE) * PAGE
        self.part_o = torch.empty(B, HQ, nsplit, D, dtype=torch.float32, device="cuda")
        self.part_lse = torch.empty(B, HQ, nsplit, dtype=torch.float32, device="cuda")
        self.out = torch.empty(B, HQ, D, dtype=q.dtype, device="cuda")
        self.lse = torch.empty(B, HQ, dtype=torch.float32, device="cuda")
        self.keep = (q, k, v, bt, seq)
        self.p = Params(q.data_ptr(), k.data_ptr(), v.data_ptr(), bt.data_ptr(), seq.data_ptr(),
                        self.part_o.data_ptr(), self.part_lse.data_ptr(), self.out.data_ptr(), self.lse.data_ptr(),
                        bt.stride(0), HKV, nsplit, split, D ** -0.5 * LOG2E)

    def separate(self, merge: int = 2):
        """Stage 1 then the merge kernel (``merge`` 2: a dependent launch; 1: a plain one; 0: none)."""
        rc = self.lib.probe_separate(ctypes.byref(self.p), torch.cuda.current_stream().cuda_stream, self.B, merge)
        if rc:
            raise RuntimeError(f"probe_separate: CUDA error {rc}")

    def stage1(self):
        self.separate(0)

    def cluster(self):
        rc = self.lib.probe_cluster(ctypes.byref(self.p), torch.cuda.current_stream().cuda_stream, self.B)
        if rc:
            raise RuntimeError(f"probe_cluster: CUDA error {rc}")

    def max_clusters(self) -> int:
        return self.lib.probe_max_clusters(ctypes.byref(self.p), self.B)


def rel_err(probe: Probe, launch, ref_o, ref_lse) -> tuple[float, float]:
    """``(‖out - ref‖ / ‖ref‖, max |lse - ref lse|)`` after one launch into poisoned outputs."""
    probe.out.fill_(float("nan"))
    probe.lse.fill_(float("nan"))
    launch()
    torch.cuda.synchronize()
    o = probe.out.float()
    return float((o - ref_o).norm() / ref_o.norm()), float((probe.lse - ref_lse).abs().max())


def reference(q, kc, vc):
    """float32 attention on the contiguous copy (the GQA group's K / V repeated): ``(out [B, Hq, D],
    lse [B, Hq])`` (natural log)."""
    B = q.shape[0]
    qf = q.float()
    kf = kc.float().repeat_interleave(HQ // HKV, dim=1)   # [B, Hq, ctx, D]
    vf = vc.float().repeat_interleave(HQ // HKV, dim=1)
    s = torch.einsum("bhd,bhtd->bht", qf, kf) * D ** -0.5
    lse = torch.logsumexp(s, -1)
    o = torch.einsum("bht,bhtd->bhd", torch.softmax(s, -1), vf)
    return o.view(B, HQ, D), lse


def timed(timer, fn, row: dict, key: str) -> None:
    """``row[key]``: µs of ``fn`` replayed in a graph, or ``row[key + "_error"]`` where that failed."""
    try:
        row[key] = timer(fn)
    except Exception as e:  # noqa: BLE001 - a failed capture is a result of the probe
        row[key] = None
        row[key + "_error"] = f"{type(e).__name__}: {str(e)[:200]}"


def parse_points(text: str) -> list[tuple[int, int]]:
    out = []
    for tok in text.split(","):
        b, c = tok.strip().lstrip("B").split("x")
        ctx = int(c[:-1]) * 1024 if c.endswith("k") else int(c)
        out.append((int(b), ctx))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--points", default="B1x1k,B1x2k,B1x4k,B4x1k,B1x8k")
    ap.add_argument("--splits", default="8,16,32", help="split counts a (request, KV head) (cluster: up to 16)")
    ap.add_argument("--iters", type=int, default=40)
    args = ap.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    lib, ptxas = build(tempfile.mkdtemp())
    timer = Timer(iters=args.iters, flush="read")
    rows = []
    for B, ctx in parse_points(args.points):
        q, k, v, bt, seq = make_point(B, ctx, HQ, HKV, D, torch.bfloat16)
        kc, vc = contiguous_kv(k, bt, B, ctx), contiguous_kv(v, bt, B, ctx)
        ref_o, ref_lse = reference(q, kc, vc)
        row = dict(point=f"B{B}x{ctx // 1024}k" if ctx % 1024 == 0 else f"B{B}x{ctx}", batch=B, ctx=ctx)
        row["ours_us"] = ours(timer, q, k, v, bt, seq, "auto")[0]
        row["ours_stage1_us"] = ours(timer, q, k, v, bt, seq, "auto", stage1_only=True)[0]
        peers = sdpa_peers(timer, q, kc, vc)
        row.update(peers)
        best = [x for x in (peers.get("sdpa_cudnn"), peers.get("sdpa_flash")) if x]
        row["best_peer_us"] = min(best) if best else None
        for n in (int(x) for x in args.splits.split(",")):
            pr = Probe(lib, q, k, v, bt, seq, ctx, n)
            e, le = rel_err(pr, pr.separate, ref_o, ref_lse)
            row[f"separate{n}_err"], row[f"separate{n}_lse_err"] = e, le
            if e < 2e-2:
                timed(timer, pr.separate, row, f"separate{n}_us")
                timed(timer, pr.stage1, row, f"stage1_{n}_us")
            if n <= 16:
                row[f"cluster{n}_max_active"] = fits = pr.max_clusters()
                if fits > 0:
                    try:
                        e, le = rel_err(pr, pr.cluster, ref_o, ref_lse)
                        row[f"cluster{n}_err"], row[f"cluster{n}_lse_err"] = e, le
                        if e < 2e-2:
                            timed(timer, pr.cluster, row, f"cluster{n}_us")
                    except RuntimeError as exc:
                        row[f"cluster{n}_error"] = str(exc)
        rows.append(row)
        print(json.dumps(row), flush=True)
    res = dict(device=torch.cuda.get_device_name(), command="scripts/h200_cluster_merge_probe.py " + " ".join(
        argv if argv is not None else sys.argv[1:]), ptxas=ptxas, rows=rows)
    with open(os.path.join(args.out, "cluster_merge.json"), "w") as f:
        json.dump(res, f, indent=1)
    splits = [int(x) for x in args.splits.split(",")]
    head = ["point", "ours", "ours stage 1", "cuDNN", "flash"] + [f"stage 1 alone {n}" for n in splits] + \
        [f"separate {n}" for n in splits] + [f"cluster {n}" for n in splits if n <= 16]
    lines = [f"# Cluster-merge probe ({res['device']})", "", "µs, median of graph replays after a read flush; "
             "probe rows: the CUDA-core stage 1 of probes/cluster_merge.cu with n splits a (request, KV head), "
             "alone, with its merge a second kernel (PDL), or with the merge inside the cluster; "
             "error: rel. to float32 attention", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]

    def f(x):
        return "-" if x is None else f"{x:.1f}"
    for r in rows:
        cells = [r["point"], f(r["ours_us"]), f(r["ours_stage1_us"]), f(r.get("sdpa_cudnn")), f(r.get("sdpa_flash"))]
        cells += [f(r.get(f"stage1_{n}_us")) for n in splits]
        cells += [f"{f(r.get(f'separate{n}_us'))} ({r.get(f'separate{n}_err', float('nan')):.0e})" for n in splits]
        cells += [f"{f(r.get(f'cluster{n}_us'))} ({r.get(f'cluster{n}_err', float('nan')):.0e})" for n in splits
                  if n <= 16]
        lines.append("| " + " | ".join(cells) + " |")
    text = "\n".join(lines) + "\n"
    with open(os.path.join(args.out, "cluster_merge.md"), "w") as fh:
        fh.write(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
