"""Time our Ascend operator against CANN's FIA and ATB's PagedAttention on the same decode shapes.

On an NPU node (after ``scripts/build_ascend.sh``; ``scripts/npu_bench.sh`` runs the build, the
parity catalog and this):

    python -m splitkv_bench npu [--set main,small] [--backends ascend,cann-fia,atb-paged]
                                [--warmup 10] [--iters 50] [--out-json F] [--out-md F]

Each (shape, backend) is warmed up, then timed call by call with the NPU's own event timer
(``torch.npu.Event(enable_timing=True)`` around each call on the current stream, one synchronise
at the end): the median, mean and minimum per call in microseconds. Every backend gets the same
tensors (q, paged K/V cache, block table, lengths); each call is the backend's device work only
(our operator: ``AscendDecodeWrapper.run`` after a ``plan`` outside the timed loop; FIA and ATB:
the op call built once). The HBM floor column is the KV bytes over ``--hbm-gbps`` (a placeholder
bandwidth, not measured) so the table also shows "x floor".

Shapes (``--set``): ``main`` is the issue's grid, B1 16k, B1 64k, B16 8k, B64 2k at GQA 4 (Hq 32 /
Hkv 8) and GQA 8 (Hq 64 / Hkv 8); ``small`` is small batches (B 1-8 at 1k and 4k, GQA 4), where
vLLM Ascend still takes ATB's op; ``hkv4`` is the main grid's batches and contexts at Hq 32 /
Hkv 4. All bf16, D 128, page 128, one query row per request.

Without torch_npu or an NPU it stops at once (exit 2) with the reason; ``--list`` prints the
shapes and exits anywhere. The timing loop, the shape list and the writers take a timer and
runner factories as arguments, so ``tests/test_npu_bench.py`` drives them with fakes.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable


BACKENDS = ("ascend", "cann-fia", "atb-paged")
#: HBM bandwidth of the floor column, bytes/s: a placeholder (910B2 ~1.6 TB/s is not published).
DEFAULT_HBM_GBPS = 1600.0


@dataclass(frozen=True)
class Shape:
    """One decode batch: ``batch`` requests of ``context`` KV tokens, one query row each."""

    name: str
    batch: int
    context: int
    hq: int
    hkv: int = 8
    head_dim: int = 128
    page: int = 128
    dtype: str = "bfloat16"

    @property
    def kv_bytes(self) -> int:
        """K and V bytes the call must read (2 bytes per element)."""
        return self.batch * self.context * self.hkv * self.head_dim * 2 * 2


def shape_sets() -> dict[str, list[Shape]]:
    """The named shape sets (``--set``)."""
    main = [Shape(f"B{b} {c // 1024}k, Hq{hq}/Hkv8", b, c, hq)
            for hq in (32, 64) for b, c in ((1, 16384), (1, 65536), (16, 8192), (64, 2048))]
    small = [Shape(f"B{b} {c // 1024}k, Hq32/Hkv8", b, c, 32) for c in (1024, 4096) for b in (1, 2, 4, 8)]
    # the main grid's batches and contexts at Hkv 4 (Hq 32: GQA 8); the node day times main and hkv4
    hkv4 = [Shape(f"B{b} {c // 1024}k, Hq32/Hkv4", b, c, 32, hkv=4)
            for b, c in ((1, 16384), (1, 65536), (16, 8192), (64, 2048))]
    return {"main": main, "small": small, "hkv4": hkv4}


def select_shapes(sets: str, names: str | None = None) -> list[Shape]:
    """The shapes of the comma-separated ``sets``, optionally only those whose name contains one of ``names``."""
    known = shape_sets()
    out = []
    for s in sets.split(","):
        if s not in known:
            raise ValueError(f"--set: unknown {s!r}; known: {', '.join(known)}")
        out += known[s]
    if names:
        keys = [n.strip() for n in names.split(",") if n.strip()]
        out = [sh for sh in out if any(k in sh.name for k in keys)]
    if not out:
        raise ValueError("no shape selected")
    return out


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--set", default="main,small", help="shape sets: main, small, hkv4 (comma-separated)")
    ap.add_argument("--shapes", default=None, help="only shapes whose name contains one of these (comma-separated)")
    ap.add_argument("--backends", default=",".join(BACKENDS), help=f"comma-separated, of {', '.join(BACKENDS)}")
    ap.add_argument("--warmup", type=int, default=10, help="untimed calls per (shape, backend) first")
    ap.add_argument("--iters", type=int, default=50, help="timed calls per (shape, backend)")
    ap.add_argument("--hbm-gbps", type=float, default=DEFAULT_HBM_GBPS, help="bandwidth of the floor column")
    ap.add_argument("--profile", default=None, help="planner profile for our operator (default: 910b2)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out-json", type=Path, default=None)
    ap.add_argument("--out-md", type=Path, default=None)
    ap.add_argument("--list", action="store_true", help="print the selected shapes and exit")
    a = ap.parse_args(argv)
    a.backend_list = [b.strip() for b in a.backends.split(",") if b.strip()]
    for b in a.backend_list:
        if b not in BACKENDS:
            ap.error(f"--backends: unknown {b!r}; known: {', '.join(BACKENDS)}")
    if a.warmup < 0 or a.iters < 1:
        ap.error("--warmup must be >= 0 and --iters >= 1")
    try:
        a.shape_list = select_shapes(a.set, a.shapes)
    except ValueError as e:
        ap.error(str(e))
    return a


# ---------------------------------------------------------------------------------------------
# Timing

class NpuTimer:
    """The NPU's own event timer: ``event()`` -> ``torch.npu.Event(enable_timing=True)``."""

    def __init__(self):
        import torch
        import torch_npu  # noqa: F401

        self._npu = torch.npu

    def event(self):
        return self._npu.Event(enable_timing=True)

    def synchronize(self) -> None:
        self._npu.synchronize()


def time_calls(fn: Callable[[], object], timer, warmup: int, iters: int) -> dict:
    """Warm ``fn`` up, then time each of ``iters`` calls between two recorded events.

    Events are read after one synchronise at the end (no host sync inside the loop). Returns
    microseconds per call: ``median_us``, ``mean_us``, ``min_us`` and ``iters``."""
    for _ in range(warmup):
        fn()
    timer.synchronize()
    pairs = []
    for _ in range(iters):
        start, end = timer.event(), timer.event()
        start.record()
        fn()
        end.record()
        pairs.append((start, end))
    timer.synchronize()
    us = [s.elapsed_time(e) * 1e3 for s, e in pairs]  # elapsed_time is in milliseconds
    return {"median_us": statistics.median(us), "mean_us": statistics.fmean(us), "min_us": min(us), "iters": iters}


# ---------------------------------------------------------------------------------------------
# The backends' calls (built once per shape, outside the timed loop)

def _torch_dtype(name: str):
    import torch

    return {"bfloat16": torch.bfloat16, "float16": torch.float16}[name]


def make_inputs(shape: Shape, device: str, seed: int = 0) -> dict:
    """Random decode inputs on ``device``: q ``[B, Hq, D]``, caches ``[pages, page, Hkv, D]``, a
    shuffled block table ``[B, ceil(context / page)]`` int32, host ``seq_lens`` / ``query_start_loc``."""
    import numpy as np
    import torch

    g = torch.Generator().manual_seed(seed)
    per = -(-shape.context // shape.page)
    pages = shape.batch * per
    dt = _torch_dtype(shape.dtype)
    q = torch.randn(shape.batch, shape.hq, shape.head_dim, generator=g).to(dt)
    k = torch.randn(pages, shape.page, shape.hkv, shape.head_dim, generator=g).to(dt)
    v = torch.randn(pages, shape.page, shape.hkv, shape.head_dim, generator=g).to(dt)
    bt = torch.randperm(pages, generator=g).to(torch.int32).reshape(shape.batch, per)
    return {"q": q.to(device), "k_cache": k.to(device), "v_cache": v.to(device), "block_table": bt.to(device),
            "seq_lens": np.full(shape.batch, shape.context, np.int32),
            "query_start_loc": np.arange(shape.batch + 1, dtype=np.int32), "scale": shape.head_dim ** -0.5}


def _small_case(shape: Shape):
    """A tiny :class:`DecodeInputs` with the shape's dtype, heads, head dim and page size: what the
    backends' ``unsupported`` rules read (they look at those, not at the length)."""
    from splitkv_common.parity.cases import random_inputs

    return random_inputs(0, [min(shape.context, 2 * shape.page)], num_q_heads=shape.hq, num_kv_heads=shape.hkv,
                         head_dim=shape.head_dim, page_size=shape.page, dtype=shape.dtype)


def ascend_call(shape: Shape, t: dict, profile: str | None):
    """Our operator: the wrapper planned once; the timed call is ``run`` (device work only)."""
    import ascend_ops

    w = ascend_ops.AscendDecodeWrapper(shape.hq, shape.hkv, shape.head_dim, shape.page,
                                       dtype=t["q"].dtype, device=t["q"].device,
                                       profile=profile or ascend_ops.support.profile())
    w.plan(t["seq_lens"], query_start_loc=t["query_start_loc"], scale=t["scale"],
           max_pages=t["block_table"].shape[1], num_pages=t["k_cache"].shape[0])
    return lambda: w.run(t["q"], t["k_cache"], t["v_cache"], t["block_table"])


def fia_call(shape: Shape, t: dict, profile: str | None):
    """CANN FIA with the mapping of the ``cann-fia`` backend, built once."""
    import torch_npu

    from ascend_ops import cann_fia

    args, kw, _ = cann_fia.fia_call(t["q"], t["k_cache"], t["v_cache"], t["block_table"], t["seq_lens"],
                                    t["query_start_loc"], scale=t["scale"])
    op = torch_npu.npu_fused_infer_attention_score
    return lambda: op(*args, **kw)


def atb_call(shape: Shape, t: dict, profile: str | None):
    """ATB PagedAttention with the mapping of the ``atb-paged`` backend, built once (``out`` reused)."""
    import torch_npu

    from ascend_ops import atb_paged

    args, kw = atb_paged.atb_call(t["q"], t["k_cache"], t["v_cache"], t["block_table"], t["seq_lens"],
                                  scale=t["scale"])
    op = torch_npu._npu_paged_attention
    return lambda: op(*args, **kw)


RUNNERS = {"ascend": ascend_call, "cann-fia": fia_call, "atb-paged": atb_call}


def unsupported(backend: str, shape: Shape) -> str | None:
    """The backend's own ``unsupported`` rule on this shape (None: it takes it)."""
    if backend == "cann-fia":
        from ascend_ops.cann_fia import fia_unsupported as rule
    elif backend == "atb-paged":
        from ascend_ops.atb_paged import atb_unsupported as rule
    else:
        from ascend_ops.support import unsupported_reason

        case = _small_case(shape)
        return unsupported_reason(shape.head_dim, case.dtype, case.kv_dtype)
    return rule(_small_case(shape))


# ---------------------------------------------------------------------------------------------
# The run and its writers

def run_bench(shapes, backends, *, timer, runners=RUNNERS, make=make_inputs, device: str = "npu", warmup: int = 10,
              iters: int = 50, hbm_gbps: float = DEFAULT_HBM_GBPS, profile: str | None = None, seed: int = 0,
              rule=unsupported, log=print) -> list[dict]:
    """One row per (shape, backend): ``status`` ``ok`` (with the timings), ``unsupported`` or ``error``
    (with ``reason``); ``floor_us`` is ``kv_bytes / hbm_gbps`` and ``x_floor`` the median over it."""
    rows = []
    for sh in shapes:
        t = make(sh, device, seed)
        floor_us = sh.kv_bytes / (hbm_gbps * 1e9) * 1e6
        for b in backends:
            row = {"shape": sh.name, **{k: v for k, v in asdict(sh).items() if k != "name"}, "backend": b,
                   "floor_us": floor_us}
            why = rule(b, sh)
            if why:
                row.update(status="unsupported", reason=why)
            else:
                try:
                    row.update(status="ok", **time_calls(runners[b](sh, t, profile), timer, warmup, iters))
                    row["x_floor"] = row["median_us"] / floor_us
                except Exception as e:  # noqa: BLE001 - one backend must not stop the others
                    row.update(status="error", reason=f"{type(e).__name__}: {e}")
            log(f"{sh.name:24s} {b:10s} " + (f"{row['median_us']:10.1f} us" if row["status"] == "ok"
                                              else f"{row['status']}: {row.get('reason', '')}"))
            rows.append(row)
    return rows


def to_markdown(rows: list[dict], backends) -> str:
    """One line per shape: each backend's median (µs), ours over each peer, and the HBM floor."""
    shapes = list(dict.fromkeys(r["shape"] for r in rows))
    by = {(r["shape"], r["backend"]): r for r in rows}
    peers = [b for b in backends if b != "ascend"]
    head = (["shape"] + [f"{b} median (µs)" for b in backends]
            + ([f"ascend / {p}" for p in peers] if "ascend" in backends else []) + ["HBM floor (µs)", "ascend x floor"])
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]

    def cell(r):
        if r is None:
            return "-"
        return f"{r['median_us']:,.1f}" if r["status"] == "ok" else r["status"]

    for s in shapes:
        ours = by.get((s, "ascend"))
        line = [s] + [cell(by.get((s, b))) for b in backends]
        if "ascend" in backends:
            for p in peers:
                peer = by.get((s, p))
                ok = ours and peer and ours["status"] == peer["status"] == "ok"
                line.append(f"{ours['median_us'] / peer['median_us']:.2f}" if ok else "-")
        any_row = next(r for r in rows if r["shape"] == s)
        line.append(f"{any_row['floor_us']:,.1f}")
        line.append(f"{ours['x_floor']:.2f}" if ours and ours["status"] == "ok" else "-")
        out.append("| " + " | ".join(line) + " |")
    notes = [f"- {r['shape']} / {r['backend']}: {r['status']}: {r['reason']}" for r in rows if r["status"] != "ok"]
    return "\n".join(out + ([""] + notes if notes else [])) + "\n"


def report(rows: list[dict], args: argparse.Namespace, provenance: dict | None = None) -> dict:
    return {"kind": "MEASURED on an NPU with torch.npu.Event timing (median per call)",
            "provenance": provenance or {}, "warmup": args.warmup, "iters": args.iters,
            "hbm_gbps_for_floor": args.hbm_gbps, "backends": args.backend_list, "rows": rows}


def write_outputs(rows, args, provenance=None) -> str:
    md = to_markdown(rows, args.backend_list)
    if args.out_json:
        args.out_json.parent.mkdir(parents=True, exist_ok=True)
        args.out_json.write_text(json.dumps(report(rows, args, provenance), indent=1, default=float))
    if args.out_md:
        args.out_md.parent.mkdir(parents=True, exist_ok=True)
        args.out_md.write_text(md)
    return md


def npu_missing() -> str | None:
    """Why this machine cannot run the bench (torch, torch_npu, an NPU, our built library), else None."""
    try:
        import torch  # noqa: F401
    except Exception as e:  # noqa: BLE001
        return f"torch does not import ({type(e).__name__}: {e})"
    from splitkv_common.npu_probe import npu_unavailable

    why = npu_unavailable()
    if why:
        return why
    import ascend_ops

    return ascend_ops.runtime_unavailable()


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.list:
        for sh in args.shape_list:
            print(f"{sh.name:24s} B {sh.batch:3d}  context {sh.context:6d}  Hq {sh.hq}  Hkv {sh.hkv}  D {sh.head_dim}  "
                  f"page {sh.page}  {sh.dtype}")
        return 0
    why = npu_missing()
    if why:
        print(f"error: splitkv_bench npu needs an Ascend NPU with torch_npu and the built operator: {why}", file=sys.stderr)
        return 2
    from splitkv_common.npu_probe import npu_device
    from splitkv_common.provenance import provenance

    rows = run_bench(args.shape_list, args.backend_list, timer=NpuTimer(), device=npu_device(), warmup=args.warmup,
                     iters=args.iters, hbm_gbps=args.hbm_gbps, profile=args.profile, seed=args.seed)
    print(write_outputs(rows, args, provenance(sys.argv)))
    return 1 if any(r["status"] == "error" for r in rows) else 0
