"""This tree's Triton kernels against another version of ``cuda_ref/kernels.py`` (or against this tree
with a wrapper attribute set, ``--old-attr``), side by side in one process on a CUDA GPU: the before /
after of a kernel change.

Two runs of a benchmark one after the other differ by 1-2 % on the same code, as much as many kernel
changes move; here both versions are captured in CUDA graphs in one process and timed in interleaved
passes, so a drift falls on both alike. Per point (bf16, page 16, shuffled pages; ``--points`` as
``splitkv_bench/decode.py``'s) and per policy (``--policies``, default ``auto``; ``device:size:S``: the kernels
plan on the device, for one query row a request): the whole call (stage 1 and the separate merge) and
stage 1 alone, of each version (``launch.kernels`` set to the version while its wrapper prepares and
captures its launch; the other file must take this tree's launch arguments), and cuDNN / flash SDPA on a
contiguous copy. Timing: ``splitkv_bench.gpu.Timer`` (a 10 ms warm-up, ``--iters`` replays each after a read
flush of the L2, median) in ``--passes`` interleaved passes; the table gives each variant's fastest
pass, the JSON all. Checked per point: each version's output against SDPA's math backend and whether the
two versions' outputs are bitwise equal.

Writes ``kernels_ab.json`` (with provenance) and ``kernels_ab.md`` to ``--out``.

    git show REV:cuda_ref/kernels.py > OLD.py
    python -m splitkv_bench kernels-ab --old OLD.py --out OUT [--points B1x2k,B16x1k] [--policies auto,size:512]
    python -m splitkv_bench kernels-ab --old-attr index_items=False --out OUT   # "old": the attribute set
"""

from __future__ import annotations

import argparse
import ast
import os
import time

from splitkv_common.optional import require

torch = require("torch", "python -m splitkv_bench kernels-ab")
require("triton", "python -m splitkv_bench kernels-ab")

from splitkv_bench.gpu import (PAGE, Timer, contiguous_kv, interleaved, make_point, parse_points,  # noqa: E402
                               sdpa_peers)
from splitkv_bench.output import save_outputs  # noqa: E402
from splitkv_bench.perf_check import load_kernels  # noqa: E402
from cuda_ref import launch  # noqa: E402
from cuda_ref.wrapper import DecodeWrapper  # noqa: E402
from splitkv_common.provenance import provenance, provenance_markdown  # noqa: E402

POINTS = "B1x1k,B1x2k,B1x4k,B1x16k,B1x128k,B4x1k,B16x1k,B16x4k,B16x8k,B64x2k,B128x1k,B1x16k@64/8,B4x1k@32/32," \
         "B1x32k@16/2/256,B16x4k@32/8/64"


class Point:
    """One point's inputs (``make_point``: bf16, page 16, shuffled pages), ``qsl`` (one row a request),
    the contiguous copies the peers read, and SDPA math on the first ``sub`` requests (``ref``)."""

    def __init__(self, B, ctx, hq, hkv, D):
        self.q, self.k, self.v, self.bt, self.seq = make_point(B, ctx, hq, hkv, D, torch.bfloat16)
        self.qsl = torch.arange(B + 1, dtype=torch.int32, device="cuda")
        self.kc, self.vc = contiguous_kv(self.k, self.bt, B, ctx), contiguous_kv(self.v, self.bt, B, ctx)
        self.sub = min(B, 4)
        self.ref = torch.nn.functional.scaled_dot_product_attention(
            self.q[:self.sub, :, None].float(), self.kc[:self.sub].float(), self.vc[:self.sub].float(),
            enable_gqa=True)[:, :, 0]

    def runner(self, w):
        """``run()`` of wrapper ``w`` (planned) on this point's tensors."""
        return lambda: w.run(self.q, self.k, self.v, self.bt, self.seq, self.qsl)

    def rel_err(self, out) -> float:
        return float((out[:self.sub].float() - self.ref).norm() / self.ref.norm())

    def timed(self, timer, replays: dict, passes: int) -> dict:
        """``replays`` (name -> graph replay) timed in ``passes`` interleaved passes, and the SDPA peers:
        ``{"passes": all passes, "us": the fastest, "peers": cuDNN / flash µs}``."""
        times = interleaved(timer, replays, passes=passes)
        peers = {n.replace("sdpa_", ""): t for n, t in sdpa_peers(timer, self.q, self.kc, self.vc).items()
                 if not n.endswith("_error") and t is not None}
        return dict(passes={n: [round(x, 2) for x in t] for n, t in times.items()},
                    us={n: round(min(t), 2) for n, t in times.items()}, peers=peers)


def run_header(a) -> dict:
    """The results' header of a run with ``--passes`` / ``--iters``: provenance, GPU, versions, date."""
    import triton
    return dict(provenance=provenance(), gpu=torch.cuda.get_device_name(), torch=torch.__version__,
                triton=triton.__version__, date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                passes=a.passes, iters=a.iters, points=[])


def each_point(res: dict, points: str, policies: str, measure) -> None:
    """``measure(text, B, ctx, hq, hkv, D, policy)`` for every point and policy, its row appended to
    ``res["points"]`` (a failing point recorded in ``res["errors"]``)."""
    for text, (B, ctx, hq, hkv, D, _) in zip(points.split(","), parse_points(points)):
        for policy in policies.split(","):
            name = f"{text.strip()} {policy}"
            try:
                res["points"].append(measure(text.strip(), B, ctx, hq, hkv, D, policy))
                print(name, res["points"][-1]["us"], flush=True)
            except Exception as e:  # noqa: BLE001 - a failing point is a result
                res.setdefault("errors", {})[name] = f"{type(e).__name__}: {str(e)[:300]}"
                print(name, res["errors"][name], flush=True)


def point(timer, versions: dict, name: str, B, ctx, hq, hkv, D, policy, passes) -> dict:
    pt = Point(B, ctx, hq, hkv, D)
    replays, keep, outs, err = {}, [], {}, {}
    saved = launch.kernels
    try:
        for vname, (mod, attrs) in versions.items():
            launch.kernels = mod   # the launches prepared (and captured) now launch this version
            for stage1_only in (False, True):
                on_device = policy.startswith("device:")   # device:size:S, a plan made by the kernels
                w = DecodeWrapper(hq, hkv, D, PAGE, dtype=torch.bfloat16, device="cuda",
                                  policy=policy.removeprefix("device:"), device_plan=on_device,
                                  max_q_len=1 if on_device else None)   # the points' one query row a request
                for attr, value in attrs.items():
                    setattr(w, attr, value)
                if not on_device:
                    splits = int(w.plan(pt.seq.cpu().numpy()).max_splits)
                w.merge = not stage1_only
                fn = pt.runner(w)
                label = vname + (" stage 1" if stage1_only else "")
                out, _ = fn()
                torch.cuda.synchronize()
                if not stage1_only:
                    outs[vname] = out.clone()
                    err[vname] = pt.rel_err(out)
                replays[label] = timer.graph(fn)
                keep.append(w)
    finally:
        launch.kernels = saved
    a, b = outs["new"], outs["old"]
    row = dict(point=name, policy=policy, B=B, ctx=ctx, hq=hq, hkv=hkv, D=D,
               items=int(keep[0].dplan.num_items), splits=None if policy.startswith("device:") else splits,
               **pt.timed(timer, replays, passes),
               err=err, bitwise_equal=bool(torch.equal(a.view(torch.int16), b.view(torch.int16))))
    del pt, replays, keep
    torch.cuda.empty_cache()
    return row


def table(res) -> list:
    lines = provenance_markdown(res["provenance"]) + [
        f"{res['gpu']}, torch {res['torch']}, triton {res['triton']}, {res['date']}; old kernels: `{res['old']}`; "
        f"{res['passes']} interleaved passes of {res['iters']} replays after a read flush (fastest pass; all in "
        "the JSON)", "",
        "| point | policy | items | old µs | new µs | new / old | old stage 1 µs | new stage 1 µs | best peer µs | "
        "best peer / new | bitwise | err (new) |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|"]
    for r in res["points"]:
        u = r["us"]
        peer = min(r["peers"].values(), default=float("nan"))
        lines.append(f"| {r['point']} | {r['policy']} | {r['items']} | {u['old']:.2f} | {u['new']:.2f} | "
                     f"{u['new'] / u['old']:.3f} | {u['old stage 1']:.2f} | {u['new stage 1']:.2f} | {peer:.2f} | "
                     f"{peer / u['new']:.2f} | {r['bitwise_equal']} | {r['err']['new']:.1e} |")
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    old = ap.add_mutually_exclusive_group(required=True)
    old.add_argument("--old", metavar="FILE", help="another version of cuda_ref/kernels.py")
    old.add_argument("--old-attr", metavar="NAME=VALUE", action="append",
                     help="'old' is this tree with this DecodeWrapper attribute set (a Python literal)")
    ap.add_argument("--out", default="bench_out")
    ap.add_argument("--points", default=POINTS)
    ap.add_argument("--policies", default="auto")
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--iters", type=int, default=30)
    a = ap.parse_args(argv)
    attrs = {n: ast.literal_eval(v) for n, v in (x.split("=", 1) for x in a.old_attr or [])}
    versions = {"new": (launch.kernels, {}), "old": (load_kernels(a.old) if a.old else launch.kernels, attrs)}
    timer = Timer(a.iters)
    res = run_header(a)
    res["old"] = os.path.basename(a.old) if a.old else "this tree, " + ", ".join(a.old_attr)
    each_point(res, a.points, a.policies, lambda text, B, ctx, hq, hkv, D, policy: point(
        timer, versions, text, B, ctx, hq, hkv, D, policy, a.passes))
    print(save_outputs(a.out, "kernels_ab", res, table(res)))
    return 0
