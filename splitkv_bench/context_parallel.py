"""Context-parallel decode benchmark: one request (B1) over 1 vs N GPUs (NCCL), or gloo on the CPU.

Per (GPU count W, context L): rank ``r`` holds a contiguous page range of the request's KV
(``splitkv_common.cp_sharding``, balanced), runs the Triton ``cuda_ref`` decode on its shard (the
local view with the ``auto`` plan: exact for one query row without a window), packs its float32
``(o, lse)`` state, all-gathers it into a ``[W, T, Hq, D + 1]`` buffer (one NCCL call) and merges
(``splitkv_common.context_parallel``). Reported per point (median of ``--iters``, CUDA events,
each timed repetition after a read of a 256 MiB buffer that evicts the L2):

* ``step``: the whole step (states + pack + collective + merge), the slowest rank's median;
* ``decode``: the rank's decode alone (slowest rank); ``collective``: the all-gather alone, timed
  after a barrier so that no rank waits for another; its share of the step;
* bytes the collective moves per rank (``comm_bytes``), KV bytes read, effective KV bandwidth
  (all ranks' KV bytes / step time), and the speed-up over one GPU at the same context;
* a correctness check (rank 0 regenerates the whole KV and computes a float32 dense reference).

One command spawns its own processes (one per GPU, ``torch.multiprocessing``):

    python -m splitkv_bench context-parallel --gpus 1,2 --out results/cp
    python -m splitkv_bench context-parallel --cpu --out OUT         # gloo, tiny sizes (smoke test)

Writes ``DIR/bench_context_parallel.json`` (every number, provenance) and
``DIR/bench_context_parallel.md`` (the table), and prints the table.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

from splitkv_common.optional import require

torch = require("torch", "python -m splitkv_bench context-parallel")

from splitkv_common.parity.accuracy import LSE_ATOL, LSE_RTOL, OUT_BOUND  # noqa: E402
from splitkv_bench.output import save_outputs  # noqa: E402

PRIME = 2147483647  # 2^31 - 1: products of two residues stay below 2^62 (no int64 overflow)
FLUSH_BYTES = 256 << 20
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
NAMES = {v: k for k, v in DTYPES.items()}


# -- deterministic data: any rank can generate any position range --------------------------------

def hash_uniform(idx: "torch.Tensor", salt: int) -> "torch.Tensor":
    """Pseudo-random float32 in [-1, 1) from int64 indices in [0, 2^31): two multiplicative
    rounds modulo 2^31 - 1. Reproducible on any device for any sub-range of indices."""
    x = (idx % PRIME * 1103515245 + 12345 + salt) % PRIME
    x = (x * 48271 + 2 * salt + 1) % PRIME
    x = (x * 69621 + 7) % PRIME
    return x.to(torch.float32) * (2.0 / PRIME) - 1.0


def kv_range(start: int, end: int, hkv: int, d: int, dtype, device, chunk: int = 8192):
    """K and V of global positions ``[start, end)`` as ``[end - start, Hkv, D]`` (``dtype``)."""
    k = torch.empty(end - start, hkv, d, dtype=dtype, device=device)
    v = torch.empty_like(k)
    inner = torch.arange(hkv * d, device=device, dtype=torch.int64).view(1, hkv, d)
    for a in range(start, end, chunk):
        e = min(end, a + chunk)
        idx = torch.arange(a, e, device=device, dtype=torch.int64).view(-1, 1, 1) * (hkv * d) + inner
        k[a - start:e - start] = hash_uniform(idx, 1).to(dtype)
        v[a - start:e - start] = hash_uniform(idx, 2).to(dtype)
    return k, v


def make_q(hq: int, d: int, dtype, device):
    idx = torch.arange(hq * d, device=device, dtype=torch.int64).view(1, hq, d)
    return (hash_uniform(idx, 3) * 2.0).to(dtype)  # one query row


def dense_reference(q, L: int, hkv: int, d: int, dtype, device, chunk: int = 65536):
    """float32 dense attention of the single row over positions ``[0, L)`` (one softmax)."""
    hq = q.shape[1]
    g = hq // hkv
    qf = q[0].float().view(hkv, g, d)
    scale = d ** -0.5
    s = torch.empty(hkv, g, L, dtype=torch.float32, device=device)
    for a in range(0, L, chunk):
        k, _ = kv_range(a, min(L, a + chunk), hkv, d, dtype, device)
        s[:, :, a:a + k.shape[0]] = torch.einsum("hgd,nhd->hgn", qf, k.float()) * scale
    m = s.amax(-1, keepdim=True)
    p = torch.exp(s - m)
    l = p.sum(-1)
    out = torch.zeros(hkv, g, d, dtype=torch.float32, device=device)
    for a in range(0, L, chunk):
        _, v = kv_range(a, min(L, a + chunk), hkv, d, dtype, device)
        out += torch.einsum("hgn,nhd->hgd", p[:, :, a:a + v.shape[0]], v.float())
    out = out / l[..., None]
    lse = m[..., 0] + torch.log(l)
    return out.reshape(1, hq, d), lse.reshape(1, hq)


# -- timing ----------------------------------------------------------------------------------------

class Timer:
    """Median µs of ``fn`` over ``iters`` repetitions: CUDA events on a GPU (each after an L2 flush,
    enqueued back to back so the host runs ahead of the device), ``perf_counter`` on the CPU."""

    def __init__(self, device, iters: int, flush: bool = True):
        self.cuda = device.type == "cuda"
        self.iters = iters
        self.buf = torch.empty(FLUSH_BYTES // 4, dtype=torch.float32, device=device) if (self.cuda and flush) else None

    def __call__(self, fn, before=None) -> float:
        if not self.cuda:
            ts = []
            for _ in range(self.iters):
                if before is not None:
                    before()
                t0 = time.perf_counter()
                fn()
                ts.append((time.perf_counter() - t0) * 1e6)
            return statistics.median(ts)
        evs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(self.iters)]
        for e0, e1 in evs:
            if before is not None:
                before()
            if self.buf is not None:
                self.buf.sum()
            e0.record()
            fn()
            e1.record()
        torch.cuda.synchronize()
        return statistics.median(e0.elapsed_time(e1) * 1e3 for e0, e1 in evs)


def capture(fn):
    """``(graph, result)``: ``fn`` warmed up on a side stream, then captured in a CUDA graph."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        result = fn()
    torch.cuda.synchronize()
    return g, result


# -- one rank --------------------------------------------------------------------------------------

def rank_main(rank: int, world: int, cfg: dict) -> list[dict]:
    """Every context of ``cfg`` on this rank; returns one dict per context."""
    import dataclasses

    import numpy as np
    import torch.distributed as dist

    from splitkv_common.context_parallel import (ContextParallelDecode, comm_bytes,
                                                 make_batch, torch_shard_backend)
    from cuda_ref.context_parallel import TritonShardBackend
    from splitkv_common.cp_sharding import shard

    cpu = cfg["cpu"]
    device = torch.device("cpu") if cpu else torch.device("cuda", torch.cuda.current_device())
    dtype = DTYPES[cfg["dtype"]]
    hq, hkv, d, page = cfg["hq"], cfg["hkv"], cfg["head_dim"], cfg["page"]
    timer = Timer(device, cfg["iters"], flush=not cfg["no_flush"])
    sync = (lambda: None) if cpu else torch.cuda.synchronize
    q = make_q(hq, d, dtype, device)
    rows = []
    for L in cfg["contexts"]:
        n_pages = -(-L // page)
        s = shard(np.arange(n_pages, dtype=np.int32).reshape(1, -1), [L], rank, world, "contiguous", page_size=page)
        k_pages = -(-int(s.seq_lens[0]) // page)
        first = int(s.logical_pages[0, 0]) * page if k_pages else 0
        n_local = int(s.seq_lens[0])
        # this rank's pages only, generated in place: local page i holds global page logical_pages[i]
        k_cache = torch.zeros(max(k_pages, 1) * page, hkv, d, dtype=dtype, device=device)
        v_cache = torch.zeros_like(k_cache)
        if n_local:
            k_cache[:n_local], v_cache[:n_local] = kv_range(first, first + n_local, hkv, d, dtype, device)
        k_cache = k_cache.view(-1, page, hkv, d)
        v_cache = v_cache.view(-1, page, hkv, d)
        local_bt = np.where(s.block_table >= 0, np.arange(s.block_table.shape[1]), -1).astype(np.int32)
        s = dataclasses.replace(s, block_table=local_bt)
        backend = torch_shard_backend if cfg["backend"] == "torch" else TritonShardBackend(policy=cfg["policy"],
                                                                                            profile="h200")
        cp = ContextParallelDecode(backend)
        batch = make_batch(s, q, k_cache, v_cache)
        cp.prepare(batch)
        view = getattr(backend, "view", "global")
        for _ in range(3):  # warm-up (Triton compiles on the first launch)
            out, lse = cp.run(batch)
        barrier_kw = {} if cpu else {"device_ids": [device.index]}
        sync()
        dist.barrier(**barrier_kw)
        o_state, l_state = cp.states(batch)
        send = cp.pack(o_state, l_state)

        def barrier():
            sync()
            dist.barrier(**({} if cpu else {"device_ids": [device.index]}))

        # The rank-local work (states + pack, and the merge) is replayed from CUDA graphs so that the
        # host's launch cost (Triton launches, the torch merge's small kernels) does not show in the
        # device time; the collective stays an eager NCCL call between them (a collective is never
        # captured: a capture failing on one rank alone would leave the others waiting).
        graph_note = "off (CPU)" if cpu else ("off (--no-graph)" if cfg["no_graph"] else None)
        run_states, run_step = (lambda: cp.states(batch)), (lambda: cp.run(batch))
        if graph_note is None:
            try:
                g_states, _ = capture(lambda: cp.states(batch))
                g_local, send_g = capture(lambda: cp.pack(*cp.states(batch)))
                # the static receive buffer the eager collective fills
                _, recv = cp.buffers(send_g.shape[0], send_g.shape[1], send_g.shape[2] - 1, send_g.device)
                g_merge, merged = capture(lambda: cp.merge(recv))

                def run_states():
                    g_states.replay()

                def run_step():
                    g_local.replay()
                    cp.communicate(send_g)
                    g_merge.replay()
                    return merged

                graph_note = "on (states + pack and merge replayed, collective eager)"
            except Exception as e:  # noqa: BLE001 - recorded, the eager path is timed instead
                graph_note = f"off (capture failed: {type(e).__name__}: {e})"[:300]
                sync()

        t_decode = timer(run_states)
        barrier()
        t_coll = timer(lambda: cp.communicate(send), before=barrier)
        barrier()
        t_step = timer(run_step)
        barrier()
        out, lse = run_step()
        sync()
        out, lse = out.clone(), lse.clone()
        row = dict(context=L, rank=rank, world=world, local_tokens=n_local, view=view, graph=graph_note,
                   decode_us=t_decode, collective_us=t_coll, step_us=t_step,
                   kv_bytes=n_local * hkv * d * 2 * torch.empty(0, dtype=dtype).element_size(),
                   comm=comm_bytes(1, hq, d, world), workspace_bytes=None,
                   # what the collective was actually given: the packed state and the receive buffer
                   send_tensor_bytes=send.numel() * send.element_size(),
                   recv_tensor_bytes=cp.buffers(*send.shape[:2], send.shape[2] - 1, send.device)[1].numel() * 4)
        if row["send_tensor_bytes"] != row["comm"]["state_bytes"] or row["recv_tensor_bytes"] != row["comm"]["buffer"]:
            raise AssertionError(f"comm_bytes {row['comm']} disagrees with the tensors the collective moved "
                                 f"({row['send_tensor_bytes']}, {row['recv_tensor_bytes']})")
        if hasattr(backend, "wrapper") and backend.wrapper is not None:
            row["workspace_bytes"] = backend.wrapper.workspace_bytes()
            row["splits"] = int(backend.wrapper.host_plan.max_splits)
        if rank == 0 and cfg["check"]:
            ref_o, ref_l = dense_reference(q, L, hkv, d, dtype, device)
            unit = max(1.0, float(ref_o.abs().max()))
            err = float((out.float() - ref_o).abs().max()) / unit
            lse_err = float((lse - ref_l).abs().max())
            lse_tol = LSE_ATOL[_acc_name(dtype)] + LSE_RTOL[_acc_name(dtype)] * float(ref_l.abs().max())
            row["check"] = dict(out_err=err, out_bound=OUT_BOUND[_acc_name(dtype)], lse_err=lse_err, lse_tol=lse_tol,
                                passed=bool(err <= OUT_BOUND[_acc_name(dtype)] and lse_err <= lse_tol
                                            and not torch.isnan(out).any()))
        rows.append(row)
        del k_cache, v_cache, cp, batch, backend
        if not cpu:
            torch.cuda.empty_cache()
    return rows


def _acc_name(dtype) -> str:
    return {torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float32: "float32"}[dtype]


# -- the driver ------------------------------------------------------------------------------------

def summarize(per_rank: list[list[dict]]) -> list[dict]:
    """One row per context from every rank's rows: the slowest rank's medians."""
    out = []
    for i, r0 in enumerate(per_rank[0]):
        rs = [pr[i] for pr in per_rank]
        step = max(r["step_us"] for r in rs)
        coll = max(r["collective_us"] for r in rs)
        kv_total = sum(r["kv_bytes"] for r in rs)
        row = dict(world=r0["world"], context=r0["context"], step_us=step, decode_us=max(r["decode_us"] for r in rs),
                   collective_us=coll, collective_share=coll / step if step else None,
                   comm_send_bytes_per_rank=r0["comm"]["send_per_rank"],
                   comm_recv_bytes_per_rank=r0["comm"]["recv_per_rank"], comm_buffer_bytes=r0["comm"]["buffer"],
                   kv_bytes_total=kv_total, kv_bytes_per_rank=max(r["kv_bytes"] for r in rs),
                   eff_kv_gbps=kv_total / (step * 1e3) if step else None,
                   rank_decode_kv_gbps=[r["kv_bytes"] / (r["decode_us"] * 1e3) if r["decode_us"] else None for r in rs],
                   views=[r["view"] for r in rs], graph=[r["graph"] for r in rs], splits=[r.get("splits") for r in rs],
                   check=r0.get("check"),
                   per_rank=rs)
        out.append(row)
    return out


def markdown(result: dict) -> list[str]:
    lines = []
    try:
        from splitkv_common.provenance import provenance_markdown
        lines += provenance_markdown(result["provenance"])
    except ImportError:
        lines += [f"- command: `{result['command']}`", ""]
    c = result["config"]
    lines += [f"B1, Hq {c['hq']} / Hkv {c['hkv']}, D {c['head_dim']}, {c['dtype']}, page {c['page']}, {c['backend']} per rank, "
              f"contiguous page ranges, all_gather of float32 (o, lse); median of {c['iters']}; "
              f"{'gloo on the CPU (smoke test, not a measurement of interest)' if c['cpu'] else 'NCCL, CUDA events'}.",
              "",
              f"CUDA graphs: {'; '.join(sorted({g for r in result['results'] for g in r['graph']}))}. "
              f"Each rank's view of its shard: {', '.join(sorted({v for r in result['results'] for v in r['views']}))}.",
              "",
              "| GPUs | context | step µs | decode µs (slowest rank) | collective µs | collective share | "
              "bytes sent / rank | KV GB/s (all ranks) | speed-up vs 1 | check |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    base = {r["context"]: r["step_us"] for r in result["results"] if r["world"] == 1}
    for r in result["results"]:
        sp = base.get(r["context"])
        chk = r.get("check")
        chk_s = "-" if not chk else (f"ok ({chk['out_err']:.1e})" if chk["passed"] else f"FAIL ({chk['out_err']:.1e})")
        lines.append(f"| {r['world']} | {r['context']} | {r['step_us']:.1f} | {r['decode_us']:.1f} | "
                     f"{r['collective_us']:.1f} | {100 * r['collective_share']:.0f}% | {r['comm_send_bytes_per_rank']} | "
                     f"{r['eff_kv_gbps']:.3g} | {sp / r['step_us']:.2f} | {chk_s} |" if sp else
                     f"| {r['world']} | {r['context']} | {r['step_us']:.1f} | {r['decode_us']:.1f} | "
                     f"{r['collective_us']:.1f} | {100 * r['collective_share']:.0f}% | {r['comm_send_bytes_per_rank']} | "
                     f"{r['eff_kv_gbps']:.3g} | - | {chk_s} |")
    return lines


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gpus", default="1,2", help="process counts to compare, comma-separated (default 1,2)")
    p.add_argument("--contexts", default=None,
                   help="context lengths, comma-separated (default 131072,262144,524288,1048576; --cpu: 256,1024)")
    p.add_argument("--heads", default=None, help="Hq/Hkv (default 32/8; --cpu: 4/2)")
    p.add_argument("--head-dim", type=int, default=None, help="default 128 (--cpu: 16)")
    p.add_argument("--dtype", default=None, choices=sorted(DTYPES), help="default bf16 (--cpu: fp32)")
    p.add_argument("--page", type=int, default=16)
    p.add_argument("--iters", type=int, default=None, help="timed repetitions (default 50; --cpu: 3)")
    p.add_argument("--policy", default="auto", help="split policy of each rank's Triton plan (default auto)")
    p.add_argument("--no-check", action="store_true", help="skip the dense float32 reference check")
    p.add_argument("--no-flush", action="store_true", help="no L2 flush before each timed repetition")
    p.add_argument("--no-graph", action="store_true", help="time the eager calls (default: the rank-local work "
                   "replayed from CUDA graphs, the collective eager)")
    p.add_argument("--cpu", action="store_true", help="gloo on the CPU with tiny sizes (smoke test)")
    p.add_argument("--backend", choices=["triton", "torch"], default=None,
                   help="each rank's decode: the Triton kernels (default on a GPU; the interpreter with --cpu) or "
                        "stock torch ops (default with --cpu)")
    p.add_argument("--timeout", type=float, default=600.0, help="process-group timeout, seconds")
    p.add_argument("--out", required=True, help="output directory")
    return p.parse_args(argv)


def main(argv=None) -> int:
    a = parse_args(argv)
    try:
        gpus = sorted({int(x) for x in a.gpus.split(",") if x.strip()})
        contexts = [int(x) for x in (a.contexts or ("256,1024" if a.cpu else "131072,262144,524288,1048576")).split(",")]
        hq, hkv = (int(x) for x in (a.heads or ("4/2" if a.cpu else "32/8")).split("/"))
    except ValueError as e:
        print(f"error: --gpus, --contexts, --heads: {e}", file=sys.stderr)
        return 2
    if not gpus or min(gpus) < 1 or min(contexts, default=0) < 1 or hq % hkv:
        print("error: --gpus and --contexts must be positive, Hq a multiple of Hkv", file=sys.stderr)
        return 2
    if a.cpu:
        backend = "gloo"
    else:
        if not torch.cuda.is_available():
            print("error: no CUDA device (run with --cpu for the gloo smoke test)", file=sys.stderr)
            return 2
        if torch.cuda.device_count() < max(gpus):
            print(f"error: --gpus asks for {max(gpus)} GPUs, {torch.cuda.device_count()} visible", file=sys.stderr)
            return 2
        require("triton", "python -m splitkv_bench context-parallel")
        import torch.distributed as dist
        if not dist.is_nccl_available():
            print("error: this torch build has no NCCL", file=sys.stderr)
            return 2
        backend = "nccl"
    cfg = dict(cpu=a.cpu, contexts=contexts, hq=hq, hkv=hkv, head_dim=a.head_dim or (16 if a.cpu else 128),
               dtype=a.dtype or ("fp32" if a.cpu else "bf16"), page=a.page, iters=a.iters or (3 if a.cpu else 50),
               policy=a.policy, check=not a.no_check, no_flush=a.no_flush, no_graph=a.no_graph,
               backend=a.backend or ("torch" if a.cpu else "triton"))
    os.makedirs(a.out, exist_ok=True)
    from splitkv_common.context_parallel import launch_local

    results = []
    for w in gpus:
        print(f"# {w} process(es), {backend}: contexts {contexts}", file=sys.stderr, flush=True)
        try:
            per_rank = launch_local(rank_main, w, cfg, backend=backend, timeout_s=a.timeout)
        except Exception as e:  # noqa: BLE001 - a rank failed: its traceback is in the message
            print(f"error: {w} process(es), {backend}: a rank failed:\n{e}", file=sys.stderr)
            return 1
        results += summarize(per_rank)
    try:
        from splitkv_common.provenance import provenance
        prov = provenance()
    except ImportError:
        prov = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "torch": torch.__version__}
    result = dict(provenance=prov, command=" ".join([os.path.basename(sys.argv[0])] + (argv or sys.argv[1:])),
                  process_group_backend=backend, config=cfg, results=results)
    print(save_outputs(a.out, "bench_context_parallel", result, markdown(result)))
    failed = [r for r in results if r.get("check") and not r["check"]["passed"]]
    if failed:
        print(f"error: the correctness check failed at {[(r['world'], r['context']) for r in failed]}", file=sys.stderr)
        return 1
    return 0
