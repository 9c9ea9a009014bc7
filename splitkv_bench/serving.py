"""Serving-loop benchmark: split-KV decode inside a continuous-batching trace, step by step.

A step-clocked trace (the same trace on every machine for the same seed): requests arrive (Poisson
with a mean concurrency set by Little's law, or a fixed concurrency), each with a prompt length and a
number of tokens to decode drawn from stated distributions, decode one token a step (with ``--spec K``
each request has K + 1 query rows and advances by 1 + Binomial(K, accept) tokens) and leave. The
batch is packed every step (requests beyond ``--max-batch`` wait). Per step it measures, on the host:

* ``make_plan_us``: the shared planner (``PlanSpec.make``) for the graph-stable wrapper (the batch
  padded with ``seq_len = 0`` requests to the captured size, as vLLM pads);
* ``upload_us``: the plan into the wrapper (``DecodeWrapper.set_plan``: ``DevicePlan.from_plan``, the
  plan refreshed in place on the device, and the buffer checks); ``plan_us = make_plan_us +
  upload_us`` is what ``DecodeWrapper.plan()`` does;
* ``copy_us``: the new lengths (and query offsets) copied into the graph's device inputs;
* ``replay_us``: the captured graph replayed (CUDA events; GPU only);
* ``step_us``: plan + upload + copy + replay, wall time from the plan's start to the replay's end
  (a host sync closes it); ``step_over_kernel = step_us / replay_us``;
* the eager path for comparison: ``eager_make_plan_us`` / ``eager_upload_us`` (a plain wrapper
  planned at the real batch), ``eager_kernel_us`` (``run()`` between CUDA events),
  ``eager_launch_us`` (the host time of the ``run()`` call; ``eager_fast_launch``: whether that call
  took the launch fast path of ``cuda_ref.fast_launch``, on unless ``SPLITKV_FAST_LAUNCH=0``) and
  ``eager_again_us`` (the host time of one more ``run()`` of the same batch: each later layer of the
  step; with ``eager_launch_us`` for the first, a model of L layers pays ``launch + (L - 1) x again``).

Reports p50 / p99 of each, overall and per batch-size bin (powers of two), as JSON (with
``splitkv_common.provenance``), a Markdown table and a plot (step time and its parts against batch
size). On a machine without a CUDA GPU only the host parts run (the "device" is the CPU; graph and
kernel columns are empty); ``--cpu-kernels`` runs the eager kernels in the Triton interpreter (tiny
sizes only: it is slow).

``--fixed-batches 1,16,64,256`` replaces the trace by fixed batches (lengths uniform 512-8192, every
length + 1 each step) and prints one table per batch: the host-planned graph (one step = ``plan()``
(``make_plan`` + ``upload``) + copy lengths + graph replay, a graph-stable wrapper captured at that
batch; the upload split into its parts, ``upload_parts``: ``PlanUploader.last_parts`` and the rest of
``set_plan()``), the device-planned graph (``DecodeWrapper(device_plan=True, policy="size:S")``, ``S``
from ``--device-split``; one step = copy lengths and query offsets, one copy through
``cuda_ref.wrapper.StepInputs``, + replay, no plan; on a GPU also with that copy captured in the
graph, ``StepInputs(in_graph=True)``, against one bare replay of the same graph), on a GPU the
host-planned graph with its copy captured too (``DecodeWrapper(plan_in_graph=True)``: one step =
``plan()``, which packs the plan and the batch's lengths into pinned memory, + one replay, whose one
copy carries both; the kernels read ``planned_seq_lens``), also issued back to back (the same
steps with no synchronize between them, each ``plan()`` made while the previous replay runs: wall
time a step), and the
eager path (``run()``'s host time with its
launches right after ``plan()`` and once more with the same plan, the steps that prepared a new launch
and whether its first call reused a checked compiled kernel, and the Python side alone with the
launches stubbed out). Each step on a GPU also times one torch launch with the GPU idle
(``torch_launch_us``): the host's speed at that step, which moves everything a step does on the host;
and the captured host-planned step's ``plan()`` in its parts (``DecodeWrapper.refresh_parts``: the wait
for the last replay's copy, the C planner, the rest).

``--points B1x16k,B16x8k,B64x2k`` compares, at fixed lengths, the host-planned graph (``--policy`` and
``size:S``) with the device-planned graph (``size:S``): step and replay.

    python -m splitkv_bench serving --out results/serving                 # trace (GPU: everything)
    python -m splitkv_bench serving --fixed-batches 1,16,64,256 --out results/fixed
    python -m splitkv_bench serving --all --out results/serving           # both, one run
    python -m splitkv_bench serving --quick --out results/smoke            # smoke test (seconds on a CPU)
    python -m splitkv_bench serving --fixed-batches 1,16,64,256 --points B1x16k,B16x8k,B64x2k --out results/r
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time

import numpy as np


import cuda_ref  # noqa: E402,F401  (first: selects the Triton interpreter on a machine without a GPU)
import torch  # noqa: E402

from cuda_ref.wrapper import DecodeWrapper, StepInputs  # noqa: E402
from splitkv_common.provenance import provenance  # noqa: E402
from splitkv_bench.output import save_outputs  # noqa: E402

# named workloads: prompt and decode-length distributions (see parse_dist)
PRESETS = {
    "default": ("loguniform:512:8192", "loguniform:64:1024"),
    "chat": ("loguniform:128:4096", "loguniform:32:1024"),
    "long": ("loguniform:8192:65536", "loguniform:128:2048"),
}
QUANTITIES = ("make_plan_us", "upload_us", "plan_us", "copy_us", "replay_us", "step_us", "step_over_kernel",
              "eager_make_plan_us", "eager_upload_us", "eager_kernel_us", "eager_launch_us", "eager_again_us")
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


# --- the trace ----------------------------------------------------------------------------------


def parse_dist(text: str):
    """``loguniform:A:B``, ``uniform:A:B`` or ``fixed:N`` -> a sampler ``f(rng, n) -> int64 [n]``."""
    kind, *vals = text.split(":")
    try:
        v = [int(x) for x in vals]
    except ValueError:
        raise SystemExit(f"distribution {text!r}: the bounds must be integers") from None
    if kind == "fixed" and len(v) == 1 and v[0] >= 0:
        return lambda rng, n: np.full(n, v[0], np.int64)
    if kind in ("uniform", "loguniform") and len(v) == 2 and 1 <= v[0] <= v[1]:
        lo, hi = v
        if kind == "uniform":
            return lambda rng, n: rng.integers(lo, hi + 1, n)
        return lambda rng, n: np.minimum(np.exp(rng.uniform(np.log(lo), np.log(hi + 1), n)).astype(np.int64), hi)
    raise SystemExit(f"distribution {text!r}: use loguniform:A:B, uniform:A:B or fixed:N (1 <= A <= B)")


def make_trace(*, loads, steps_per_phase, arrival, prompt, decode, max_batch, spec, accept, seed, max_len):
    """The batches of every step: a list of ``(seq_lens int64 [B], q_lens int64 [B])``, B <= max_batch.

    Phases run one after the other, one per entry of ``loads``: ``arrival == "fixed"`` keeps exactly
    that many requests (a leaving request is replaced the next step); ``"poisson"`` draws
    Poisson(load / mean decode length) arrivals a step, so the mean concurrency is the load (a phase
    under its load starts with the missing requests already part-way through their decode)."""
    rng = np.random.default_rng(seed)
    mean_decode = float(decode(np.random.default_rng(seed + 1), 20000).mean())
    active = []   # [prompt, decoded, target]
    queue = []
    steps = []
    for load in loads:
        if arrival == "poisson" and len(active) + len(queue) < load:
            # start the phase near its steady state: requests already part-way through their decode
            k = load - len(active) - len(queue)
            p, d = prompt(rng, k), decode(rng, k)
            queue += [[int(a), int(rng.integers(0, max(1, int(b)))), max(1, int(b))] for a, b in zip(p, d)]
        for _ in range(steps_per_phase):
            if arrival == "poisson":
                k = int(rng.poisson(load / mean_decode))
            else:
                k = max(0, load - len(active) - len(queue))
            if k:
                p, d = prompt(rng, k), decode(rng, k)
                queue += [[int(a), 0, max(1, int(b))] for a, b in zip(p, d)]
            while queue and len(active) < max_batch:
                active.append(queue.pop(0))
            if not active:
                steps.append((np.zeros(0, np.int64), np.zeros(0, np.int64)))
                continue
            seq = np.array([min(a[0] + a[1] + spec + 1, max_len) for a in active], np.int64)
            steps.append((seq, np.full(len(active), spec + 1, np.int64)))
            adv = 1 + (rng.binomial(spec, accept, len(active)) if spec else np.zeros(len(active), np.int64))
            for a, n in zip(active, adv.tolist()):
                a[1] += n
            active = [a for a in active if a[1] < a[2] and a[0] + a[1] + spec + 1 < max_len]
    return steps


# --- one wrapper and its graph --------------------------------------------------------------------


class Rig:
    """The shared inputs (paged KV cache, block table, queries) for batches up to ``max_batch``."""

    def __init__(self, args, device, max_batch, max_len, with_kv=True):
        self.args, self.device = args, device
        self.dtype = DTYPES[args.dtype]
        self.rows_per_req = args.spec + 1
        page = args.page
        pages_per_req = -(-max_len // page)
        elem = torch.empty(0, dtype=self.dtype).element_size()
        page_bytes = page * args.hkv * args.head_dim * elem * 2
        want = max_batch * pages_per_req
        pool = max(pages_per_req, min(want, int(args.kv_pool_gb * 2**30) // page_bytes))
        self.pool_pages = pool
        gen = torch.Generator().manual_seed(args.seed)
        # each batch position's pages, drawn from the pool (pages may repeat when the pool is smaller
        # than max_batch x max_len: the timing reads them all the same)
        bt = torch.randint(0, pool, (max_batch, pages_per_req), generator=gen, dtype=torch.int32)
        self.block_table = bt.to(device)
        self.max_batch = max_batch
        self.k = self.v = self.q = None
        if not with_kv:   # host parts only: no kernel reads them
            return
        dgen = torch.Generator(device=device).manual_seed(args.seed)   # drawn where they live (GBs on a GPU)
        kv_shape = (pool, page, args.hkv, args.head_dim)
        self.k = torch.randn(kv_shape, generator=dgen, device=device, dtype=self.dtype)
        self.v = torch.randn(kv_shape, generator=dgen, device=device, dtype=self.dtype)
        self.q = torch.randn((max_batch * self.rows_per_req, args.hq, args.head_dim), generator=dgen, device=device,
                             dtype=self.dtype)

    def wrapper(self, graph_stable, plan_in_graph=False):
        a = self.args
        return DecodeWrapper(a.hq, a.hkv, a.head_dim, a.page, dtype=self.dtype, device=self.device,
                             profile=a.profile, policy=a.policy, graph_stable=graph_stable,
                             plan_in_graph=plan_in_graph)


def capture(run, copy=None) -> "torch.cuda.CUDAGraph":
    """``run`` (and ``copy`` before it, when given) captured in a CUDA graph, after two calls outside the
    capture (compile and warm up)."""
    for _ in range(2):
        run()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        if copy is not None:
            copy()
        run()
    torch.cuda.synchronize()
    return graph


class Graphed:
    """A graph-stable wrapper captured at batch ``size``: device inputs refreshed in place each step.
    ``in_graph``: the copy goes into the graph (``DecodeWrapper(plan_in_graph=True)``'s ``copy_plan()``,
    which copies the lengths and offsets with the plan: ``planned_seq_lens``): a step is ``plan()``
    (the planner, then packing into pinned memory) and one replay."""

    def __init__(self, rig: Rig, size: int, use_graph: bool, in_graph: bool = False):
        self.rig, self.size = rig, size
        r = rig.rows_per_req
        self.in_graph = in_graph and use_graph
        self.w = rig.wrapper(True, plan_in_graph=self.in_graph)
        dev = rig.device
        self.seq_host = torch.zeros(size, dtype=torch.int32, pin_memory=dev.type == "cuda")
        self.qsl_host = torch.arange(0, (size + 1) * r, r, dtype=torch.int32)
        if dev.type == "cuda":
            self.qsl_host = self.qsl_host.pin_memory()
        self.seq = self.seq_host.to(dev)
        self.qsl = self.qsl_host.to(dev)
        self.bt = rig.block_table[:size]
        self.q = rig.q[:size * r] if rig.q is not None else None
        self.graph = None
        # plan a full batch first: the wrapper's buffers are allocated now (not in a timed step) and
        # the capture sees the plan's fixed shapes
        lens = np.full(size, 1024, np.int64)
        self.w.plan(lens, q_lens=np.full(size, r))
        if self.in_graph:   # the lengths and offsets the wrapper copies with the plan
            self.seq, self.qsl = self.w.planned_seq_lens, self.w.planned_query_start_loc
        if use_graph:
            if not self.in_graph:
                self.seq.copy_(torch.from_numpy(lens.astype(np.int32)))
            self.graph = capture(self.run, self.w.copy_plan if self.in_graph else None)

    def run(self):
        return self.w.run(self.q, self.rig.k, self.rig.v, self.bt, self.seq, self.qsl)

    def step_in_graph(self, seq, ql) -> tuple[float, bool, float]:
        """``in_graph``: ``plan()`` (made and packed with the batch's lengths; one C call when the
        wrapper refreshes its captured plan), replay, sync: ``(plan() µs, refreshed in one call, end clock)``."""
        n = self.w.plan_refreshes
        t0 = time.perf_counter()
        self.w.plan(seq, q_lens=ql)
        t1 = time.perf_counter()
        self.graph.replay()
        torch.cuda.synchronize()
        return (t1 - t0) * 1e6, self.w.plan_refreshes > n, time.perf_counter()

    def back_to_back(self, seqs, ql) -> float:
        """``in_graph``: the steps issued as a serving loop with asynchronous scheduling issues them,
        each ``plan()`` made while the previous replay runs (it waits only for that replay's copy of the
        plan), no synchronize between steps: wall µs a step over ``len(seqs)`` steps."""
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for s in seqs:
            self.w.plan(s, q_lens=ql)
            self.graph.replay()
        torch.cuda.synchronize()
        return (time.perf_counter() - t0) * 1e6 / len(seqs)

    def pad(self, seq, ql):
        """The batch padded to ``size`` with ``seq_len = 0`` requests (their query rows kept, as vLLM's
        padded rows are: the graph's shapes do not change)."""
        B = seq.shape[0]
        s = np.zeros(self.size, np.int64)
        s[:B] = seq
        q = np.full(self.size, self.rig.rows_per_req, np.int64)
        q[:B] = ql
        return s, q


class DeviceGraphed:
    """A device-planned wrapper (``device_plan=True``, ``size:S``) captured at batch ``size``: a step
    copies the lengths and query offsets into the graph's inputs and replays; nothing is planned.
    ``in_graph``: the copy is captured in the graph (``StepInputs(in_graph=True)``): a step writes the
    pinned host buffer and replays."""

    def __init__(self, rig: Rig, size: int, split: int, use_graph: bool, in_graph: bool = False):
        self.rig, self.size = rig, size
        r = rig.rows_per_req
        a = rig.args
        self.w = DecodeWrapper(a.hq, a.hkv, a.head_dim, a.page, dtype=rig.dtype, device=rig.device,
                               policy=f"size:{split}", device_plan=True, max_q_len=r)
        # the step's inputs: one device buffer, one copy a step (StepInputs)
        self.in_graph = in_graph and use_graph
        self.inputs = StepInputs(size, rig.device, in_graph=self.in_graph)
        self.inputs.update(np.zeros(size, np.int64), np.arange(0, (size + 1) * r, r))
        self.seq, self.qsl = self.inputs.seq_lens, self.inputs.query_start_loc
        self.bt = rig.block_table[:size]
        self.q = rig.q[:size * r] if rig.q is not None else None
        self.graph = None
        if use_graph:
            self.seq.fill_(1024)
            self.graph = capture(self.run, self.inputs.copy if self.in_graph else None)

    def run(self):
        return self.w.run(self.q, self.rig.k, self.rig.v, self.bt, self.seq, self.qsl)

    def step_in_graph(self, seq, qsl) -> tuple[float, float]:
        """``in_graph``: write this step's lengths and offsets, replay (the copy inside), sync
        (``StepInputs.replay``, in its two parts): the host clocks after the write and at the end."""
        self.inputs.write(seq, qsl)
        t1 = time.perf_counter()
        self.graph.replay()
        torch.cuda.synchronize()
        return t1, time.perf_counter()

    def step(self, seq, qsl) -> tuple[float, float | None, float]:
        """Copy this step's lengths and query offsets (one copy: :class:`StepInputs`), replay: ``(copy µs,
        replay µs or None, end clock)``."""
        t0 = time.perf_counter()
        self.inputs.update(seq, qsl)
        t1 = time.perf_counter()
        return replay_after_copy(self.graph, t0, t1)


def sizes_for(kind: str, max_batch: int) -> list[int]:
    """The captured batch sizes: ``max`` (one graph at the largest batch), ``vllm`` (1, 2, 4, then
    multiples of 8) or a comma-separated list."""
    if kind == "max":
        return [max_batch]
    if kind == "vllm":
        return sorted({x for x in [1, 2, 4] + list(range(8, max_batch + 8, 8)) if x <= max_batch} | {max_batch})
    return sorted(int(x) for x in kind.split(","))


# --- measuring ----------------------------------------------------------------------------------


def copy_and_replay(g: Graphed, seq) -> tuple[float, float | None, float]:
    """Copy this step's lengths into the graph's buffer, then replay the graph (when captured):
    ``(copy µs, replay µs by CUDA events or None, host clock at the end)``."""
    t0 = time.perf_counter()
    g.seq_host.copy_(torch.from_numpy(seq.astype(np.int32)))
    g.seq.copy_(g.seq_host, non_blocking=True)
    t1 = time.perf_counter()
    return replay_after_copy(g.graph, t0, t1)


def replay_after_copy(graph, t0: float, t1: float) -> tuple[float, float | None, float]:
    """A copy that ran from host clock ``t0`` to ``t1``, then ``graph`` replayed (when captured) and
    waited for: ``(copy µs, replay µs by CUDA events or None, host clock at the end)``."""
    if graph is None:
        return (t1 - t0) * 1e6, None, t1
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    graph.replay()
    e1.record()
    e1.synchronize()
    return (t1 - t0) * 1e6, e0.elapsed_time(e1) * 1e3, time.perf_counter()


def torch_launch_us(x) -> float:
    """Host µs of one torch launch (``x.add_(1)``) with the GPU idle before it: the host's speed."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    x.add_(1)
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) * 1e6


def replay_wall_us(graph) -> float:
    """Wall µs of one replay with nothing else (inputs unchanged), from the call to the end of a sync:
    the least a replayed step costs on this host."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    graph.replay()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) * 1e6


def measure_step(g: Graphed, eager, seq, ql, *, on_gpu, cpu_kernels, rig, flush=None):
    """One step's timings (µs) for the batch ``seq`` / ``ql`` (see the module docstring)."""
    rec = dict(batch=int(seq.shape[0]), rows=int(ql.sum()), padded_batch=g.size)
    s_pad, q_pad = g.pad(seq, ql)
    if flush is not None:
        flush.sum()   # a read flush: the L2 left clean, as after other layers' reads
    if on_gpu:
        torch.cuda.synchronize()
    # graph path: plan (make_plan + upload), copy lengths, replay
    t0 = time.perf_counter()
    plan = g.w.make_plan(s_pad, q_lens=q_pad)
    t1 = time.perf_counter()
    g.w.set_plan(plan, validate=False)  # fresh from the planner, as plan() does
    t2 = time.perf_counter()
    copy_us, replay_us, t4 = copy_and_replay(g, s_pad)
    rec.update(make_plan_us=(t1 - t0) * 1e6, upload_us=(t2 - t1) * 1e6, plan_us=(t2 - t0) * 1e6,
               copy_us=copy_us, replay_us=replay_us, step_us=(t4 - t0) * 1e6)
    rec["step_over_kernel"] = rec["step_us"] / replay_us if replay_us else None
    # eager path: a plain wrapper planned at the real batch, run() outside any graph
    rec.update(eager_make_plan_us=None, eager_upload_us=None, eager_kernel_us=None, eager_launch_us=None,
               eager_again_us=None)
    B = rec["batch"]
    if eager is not None and B:
        t0 = time.perf_counter()
        plan = eager.make_plan(seq, q_lens=ql)
        t1 = time.perf_counter()
        eager.set_plan(plan, validate=False)
        t2 = time.perf_counter()
        rec.update(eager_make_plan_us=(t1 - t0) * 1e6, eager_upload_us=(t2 - t1) * 1e6)
        if on_gpu or cpu_kernels:
            launch_us, kernel_us = eager_run(rig, eager, B, seq, ql, on_gpu)
            rec["eager_launch_us"] = launch_us
            rec["eager_fast_launch"] = eager.last_launch.fast["fast"] if eager.last_launch is not None else None
            rec["eager_kernel_us"] = kernel_us if on_gpu else launch_us
            # the same batch once more: what each later layer of the step costs the host
            rec["eager_again_us"] = eager_run(rig, eager, B, seq, ql, on_gpu)[0]
    return rec


def pct(xs, p):
    xs = [x for x in xs if x is not None]
    return float(np.percentile(xs, p)) if xs else None


def summarize(recs):
    """p50 / p99 / mean / count of every quantity."""
    out = {"steps": len(recs)}
    for k in QUANTITIES:
        xs = [r[k] for r in recs if r.get(k) is not None]
        out[k] = dict(p50=pct(xs, 50), p99=pct(xs, 99), mean=float(np.mean(xs)) if xs else None, n=len(xs))
    return out


def bin_of(B: int) -> str:
    if B <= 1:
        return "1"
    hi = 1 << (B - 1).bit_length()
    return str(hi) if hi == 2 else f"{hi // 2 + 1}-{hi}"


def fmt(x, digits=1):
    if x is None:
        return "-"
    return f"{x:,.{digits}f}" if abs(x) < 1e4 else f"{x:,.0f}"


def progress(it, total, desc):
    """tqdm when stderr is a terminal, else the iterable as it is."""
    if sys.stderr.isatty():
        try:
            from tqdm import tqdm
            return tqdm(it, total=total, desc=desc, unit="step", leave=False)
        except ImportError:
            pass
    return it


# --- the two modes ------------------------------------------------------------------------------


def run_trace(args, device, on_gpu):
    prompt_s, decode_s = PRESETS[args.workload]
    prompt = parse_dist(args.prompt or prompt_s)
    decode = parse_dist(args.decode or decode_s)
    loads = [int(x) for x in args.loads.split(",")]
    max_batch = args.max_batch or max(8, int(max(loads) * 1.25))
    max_len = args.max_len or (int((args.prompt or prompt_s).split(":")[-1])
                               + int((args.decode or decode_s).split(":")[-1]) + args.spec + 1)
    trace = make_trace(loads=loads, steps_per_phase=args.steps, arrival=args.arrival, prompt=prompt,
                       decode=decode, max_batch=max_batch, spec=args.spec, accept=args.accept, seed=args.seed,
                       max_len=max_len)
    rig = Rig(args, device, max_batch, max_len, with_kv=on_gpu or args.cpu_kernels)
    graphs = {s: Graphed(rig, s, on_gpu) for s in sizes_for(args.graph_sizes, max_batch)}
    eager = rig.wrapper(False) if not args.no_eager else None
    flush = torch.empty(64 * 2**20, dtype=torch.int32, device=device) if (args.flush_l2 and on_gpu) else None
    recs = []
    for i, (seq, ql) in enumerate(progress(trace, len(trace), "trace")):
        B = seq.shape[0]
        if B == 0:
            continue
        g = graphs[min(s for s in graphs if s >= B)]
        rec = measure_step(g, eager, seq, ql, on_gpu=on_gpu, cpu_kernels=args.cpu_kernels, rig=rig, flush=flush)
        rec["step"] = i
        if i >= args.warmup:
            recs.append(rec)
    bins = {}
    for r in recs:
        bins.setdefault(bin_of(r["batch"]), []).append(r)
    order = sorted(bins, key=lambda b: int(b.split("-")[-1]))
    config = dict(mode="trace", workload=args.workload, prompt=args.prompt or prompt_s,
                  decode=args.decode or decode_s, arrival=args.arrival, loads=loads, steps_per_phase=args.steps,
                  warmup=args.warmup, max_batch=max_batch, max_len=max_len, graph_sizes=sorted(graphs),
                  kv_pool_pages=rig.pool_pages, spec=args.spec, accept=args.accept, seed=args.seed,
                  flush_l2=bool(flush is not None))
    return dict(config=config, overall=summarize(recs),
                bins=[dict(bin=b, batch_min=min(r["batch"] for r in bins[b]),
                           batch_max=max(r["batch"] for r in bins[b]), **summarize(bins[b])) for b in order],
                steps=recs)


def eager_python_us(rig: Rig, B: int, seq, ql, reps: int = 300) -> float:
    """The Python side of an eager ``run()`` (checks, prepared launch arguments) with the two kernel
    launches replaced by no-ops: median µs over ``reps`` calls of one planned wrapper."""
    from cuda_ref import kernels

    class _NoLaunch:
        def __getitem__(self, grid):
            return lambda *a, **k: None

    r = rig.rows_per_req
    w = rig.wrapper(False)
    w.plan(seq, q_lens=ql)
    dev = rig.device
    q = rig.q[:B * r] if rig.q is not None else torch.zeros(B * r, rig.args.hq, rig.args.head_dim, dtype=rig.dtype)
    kv = rig.k if rig.k is not None else torch.zeros(1, rig.args.page, rig.args.hkv, rig.args.head_dim,
                                                     dtype=rig.dtype)
    seq_d = torch.from_numpy(seq.astype(np.int32)).to(dev)
    qsl_d = torch.arange(0, (B + 1) * r, r, dtype=torch.int32).to(dev)
    args = (q, kv, kv, rig.block_table[:B], seq_d, qsl_d)
    saved = kernels.split_kv_kernel, kernels.merge_kernel
    kernels.split_kv_kernel = kernels.merge_kernel = _NoLaunch()
    try:
        xs = []
        for i in range(reps + 20):
            t0 = time.perf_counter()
            w.run(*args)
            if i >= 20:
                xs.append((time.perf_counter() - t0) * 1e6)
    finally:
        kernels.split_kv_kernel, kernels.merge_kernel = saved
    return float(np.median(xs))


def eager_run(rig: Rig, w, B: int, seq, ql, on_gpu) -> tuple[float, float | None]:
    """One eager ``run()`` of a wrapper planned for the batch: ``(host µs of the call, kernel µs by
    CUDA events or None)``, the device idle before it."""
    r = rig.rows_per_req
    seq_d = torch.from_numpy(seq.astype(np.int32)).to(rig.device)
    qsl_d = torch.arange(0, (B + 1) * r, r, dtype=torch.int32).to(rig.device)
    args = (rig.q[:B * r], rig.k, rig.v, rig.block_table[:B], seq_d, qsl_d)
    if on_gpu:
        torch.cuda.synchronize()
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
    t0 = time.perf_counter()
    w.run(*args)
    host_us = (time.perf_counter() - t0) * 1e6
    if not on_gpu:
        return host_us, None
    e1.record()
    e1.synchronize()
    return host_us, e0.elapsed_time(e1) * 1e3


FIXED_QUANTITIES = ("make_plan_us", "upload_us", "plan_us", "copy_us", "replay_us", "step_us", "step_over_kernel",
                    "dev_copy_us", "dev_replay_us", "dev_step_us", "dev_step_over_kernel", "dev_step_over_host_replay",
                    "eager_run_us", "eager_kernel_us", "eager_again_us", "dev_in_graph_step_us", "replay_wall_us",
                    "dev_in_graph_over_replay_wall", "dev_in_graph_write_us", "dev_in_graph_replay_us",
                    "dev_in_graph_replay_over_bare", "hig_plan_us", "hig_step_us",
                    "hig_step_over_kernel", "hig_step_over_replay_wall", "torch_launch_us",
                    "hig_wait_us", "hig_c_plan_us", "hig_rest_us")
# the upload's parts (PlanUploader.last_parts) and the rest of set_plan() ("other": the plan's page count,
# the wrapper's bookkeeping)
UPLOAD_PARTS = ("prepare", "wait", "pack", "copy", "record", "other")


def run_fixed(args, device, on_gpu):
    """Fixed batch sizes: the host-planned graph (graph-stable wrapper captured at B; one step = plan()
    + copy lengths + replay), the device-planned graph (one step = copy lengths and offsets + replay)
    and the eager run()."""
    batches = [int(x) for x in args.fixed_batches.split(",")]
    lo, hi = 512, 8192
    steps = args.fixed_steps
    max_len = hi + steps + args.warmup + args.spec + 2
    rig = Rig(args, device, max(batches), max_len, with_kv=on_gpu)
    rows = []
    for B in batches:
        g = Graphed(rig, B, on_gpu)
        dg = DeviceGraphed(rig, B, args.device_split, on_gpu)
        dgi = DeviceGraphed(rig, B, args.device_split, on_gpu, in_graph=True) if on_gpu else None
        gi = Graphed(rig, B, on_gpu, in_graph=True) if on_gpu else None
        eager = rig.wrapper(False)
        ping = torch.zeros(1, device=device) if on_gpu else None
        seq0 = np.random.default_rng(B).integers(lo, hi + 1, B)
        ql = np.full(B, args.spec + 1, np.int64)
        qsl = np.concatenate([[0], np.cumsum(ql)]).astype(np.int32)
        recs = []
        seen = {}   # the eager wrapper's prepared launches so far, by id
        for i in progress(range(args.warmup + steps), args.warmup + steps, f"B {B}"):
            seq = seq0 + i
            if on_gpu:
                torch.cuda.synchronize()
            # host-planned graph: plan() (the planner, then the upload), copy lengths, replay
            t0 = time.perf_counter()
            plan = g.w.make_plan(seq, q_lens=ql)
            t1 = time.perf_counter()
            g.w.set_plan(plan, validate=False)   # what plan() does after the planner
            t2 = time.perf_counter()
            parts = dict(g.w.upload_parts)
            copy_us, replay_us, t3 = copy_and_replay(g, seq)
            rec = dict(batch=B, make_plan_us=(t1 - t0) * 1e6, upload_us=(t2 - t1) * 1e6, plan_us=(t2 - t0) * 1e6,
                       copy_us=copy_us, replay_us=replay_us, step_us=(t3 - t0) * 1e6)
            parts["other"] = rec["upload_us"] - sum(parts.values())
            rec.update({f"upload_{k}_us": parts.get(k) for k in UPLOAD_PARTS})
            rec["step_over_kernel"] = rec["step_us"] / replay_us if replay_us else None
            # device-planned graph: copy lengths and query offsets, replay
            if on_gpu:
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            dcopy, dreplay, t3 = dg.step(seq, qsl)
            rec.update(dev_copy_us=dcopy, dev_replay_us=dreplay, dev_step_us=(t3 - t0) * 1e6)
            rec["dev_step_over_kernel"] = rec["dev_step_us"] / dreplay if dreplay else None
            rec["dev_step_over_host_replay"] = rec["dev_step_us"] / replay_us if replay_us else None
            # the same with the copy captured in the graph, and a bare replay (the floor of any step)
            rec.update(dev_in_graph_step_us=None, replay_wall_us=None, dev_in_graph_over_replay_wall=None,
                       dev_in_graph_write_us=None, dev_in_graph_replay_us=None, dev_in_graph_replay_over_bare=None)
            # (the step and its bare replay in turn first, by step: the one timed second finds the
            # graph's host-side state warm, so a fixed order would favour the bare replay)
            bare_first = i % 2 == 1
            if on_gpu:
                if bare_first:
                    rec["replay_wall_us"] = replay_wall_us(dgi.graph)
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                t1, t2 = dgi.step_in_graph(seq, qsl)
                rec["dev_in_graph_step_us"] = (t2 - t0) * 1e6
                # the write of the lengths and offsets (what a serving loop writes for any backend) and
                # the replay after it, against the bare replay
                rec["dev_in_graph_write_us"], rec["dev_in_graph_replay_us"] = (t1 - t0) * 1e6, (t2 - t1) * 1e6
                if not bare_first:
                    rec["replay_wall_us"] = replay_wall_us(dgi.graph)
                rec["dev_in_graph_over_replay_wall"] = rec["dev_in_graph_step_us"] / rec["replay_wall_us"]
                rec["dev_in_graph_replay_over_bare"] = rec["dev_in_graph_replay_us"] / rec["replay_wall_us"]
            # the host-planned graph with its copies captured (plan_in_graph): plan() packs, one replay
            rec.update(hig_plan_us=None, hig_refreshed=None, hig_step_us=None, hig_step_over_kernel=None,
                       hig_step_over_replay_wall=None, torch_launch_us=None, hig_wait_us=None, hig_c_plan_us=None,
                       hig_rest_us=None)
            if on_gpu:
                # the host's speed at this step: one torch launch with the GPU idle (hosts of one machine
                # kind were measured up to 3x apart, and so is everything a step does on the host)
                rec["torch_launch_us"] = torch_launch_us(ping)
                bare = replay_wall_us(gi.graph) if bare_first else None
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                rec["hig_plan_us"], rec["hig_refreshed"], t3 = gi.step_in_graph(seq, ql)
                rec["hig_step_us"] = (t3 - t0) * 1e6
                if rec["hig_refreshed"]:   # plan()'s parts: the wait for the last copy, the C call, the rest
                    parts = gi.w.refresh_parts
                    rec["hig_wait_us"], rec["hig_c_plan_us"] = parts["wait"], parts["plan"]
                    rec["hig_rest_us"] = rec["hig_plan_us"] - parts["wait"] - parts["plan"]
                rec["hig_step_over_kernel"] = rec["hig_step_us"] / replay_us
                if bare is None:
                    bare = replay_wall_us(gi.graph)
                rec["hig_step_over_replay_wall"] = rec["hig_step_us"] / bare
            # eager: a plain wrapper planned at the batch, run() outside any graph
            rec.update(eager_run_us=None, eager_kernel_us=None, eager_again_us=None, eager_new_launch=None)
            if on_gpu:
                eager.plan(seq, q_lens=ql)
                rec["eager_run_us"], rec["eager_kernel_us"] = eager_run(rig, eager, B, seq, ql, on_gpu)
                # a new prepared launch this step (plan sizes not seen before), and whether its first
                # call found the compiled kernel that another launch had checked
                prep = eager.last_launch
                rec["eager_new_launch"] = id(prep) not in seen
                seen[id(prep)] = prep
                rec["eager_reused_kernel"] = bool(prep.stage1 is not None and prep.stage1.reused)
                # the same plan once more: run()'s cost when nothing is new (every later layer of a step)
                rec["eager_again_us"] = eager_run(rig, eager, B, seq, ql, on_gpu)[0]
            if i >= args.warmup:
                recs.append(rec)
        s = {k: summarize_keys(recs, k) for k in FIXED_QUANTITIES}
        s["upload_parts"] = {k: summarize_keys(recs, f"upload_{k}_us")["p50"] for k in UPLOAD_PARTS}
        launch = eager.last_launch.fast if on_gpu and eager.last_launch is not None else None
        new = [r for r in recs if r.get("eager_new_launch")]
        s["hig_refreshed"] = f"{sum(1 for r in recs if r.get('hig_refreshed'))} / {len(recs)}" if on_gpu else None
        s["hig_back_to_back_us"] = s["hig_back_to_back_over_kernel"] = None
        if on_gpu:   # the same steps again, back to back (median of three passes)
            seqs = [seq0 + i for i in range(args.warmup, args.warmup + steps)]
            b2b = statistics.median(gi.back_to_back(seqs, ql) for _ in range(3))
            s["hig_back_to_back_us"] = round(b2b, 2)
            k = s["replay_us"]["p50"]
            s["hig_back_to_back_over_kernel"] = round(b2b / k, 3) if k else None
        s["eager_new_launch_steps"] = len(new) if on_gpu else None
        s["eager_new_launch_run_us"] = summarize_keys(new, "eager_run_us")
        s["eager_reused_kernel_steps"] = sum(1 for r in new if r.get("eager_reused_kernel"))
        rows.append(dict(batch=B, steps=len(recs), eager_python_us=eager_python_us(rig, B, seq0, ql),
                         eager_launch=launch, **s))
        del g, dg, dgi, gi
    config = dict(mode="fixed", batches=batches, lengths=f"uniform {lo}-{hi}, + 1 each step", steps=steps,
                  warmup=args.warmup, spec=args.spec, device_split=args.device_split,
                  block_table_tokens=rig.block_table.shape[1] * args.page)
    return dict(config=config, rows=rows)


def parse_point(text: str) -> tuple[int, int]:
    """``B16x8k`` -> ``(16, 8192)``."""
    b, _, n = text.strip().upper().lstrip("B").partition("X")
    mult = 1024 if n.endswith("K") else 1
    return int(b), int(n.rstrip("K")) * mult


def run_points(args, device, on_gpu):
    """At fixed lengths ``BxL`` (every request L tokens + the step index): the host-planned graph with
    ``--policy`` and with ``size:S``, and the device-planned graph (``size:S``); the block table as wide
    as the longest request of the run (the device-planned grid covers it)."""
    points = [parse_point(p) for p in args.points.split(",")]
    steps = args.fixed_steps
    out = []
    for B, L in points:
        max_len = L + steps + args.warmup + args.spec + 2
        rig = Rig(args, device, B, max_len, with_kv=on_gpu)
        ql = np.full(B, args.spec + 1, np.int64)
        qsl = np.concatenate([[0], np.cumsum(ql)]).astype(np.int32)
        row = dict(point=f"B{B}x{L}", batch=B, seq_len=L, block_table_tokens=rig.block_table.shape[1] * args.page)
        policy = args.policy
        for name, pol in (("host", policy), ("host_size", f"size:{args.device_split}")):
            args.policy = pol
            g = Graphed(rig, B, on_gpu)
            recs = []
            for i in range(args.warmup + steps):
                seq = np.full(B, L + i, np.int64)
                if on_gpu:
                    torch.cuda.synchronize()
                t0 = time.perf_counter()
                g.w.plan(seq, q_lens=ql)
                _, replay_us, t3 = copy_and_replay(g, seq)
                if i >= args.warmup:
                    recs.append(dict(step_us=(t3 - t0) * 1e6, replay_us=replay_us))
            row[name] = dict(policy=pol, step_us=summarize_keys(recs, "step_us"),
                             replay_us=summarize_keys(recs, "replay_us"))
            del g
        args.policy = policy
        dg = DeviceGraphed(rig, B, args.device_split, on_gpu)
        recs = []
        for i in range(args.warmup + steps):
            seq = np.full(B, L + i, np.int64)
            if on_gpu:
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            _, replay_us, t3 = dg.step(seq, qsl)
            if i >= args.warmup:
                recs.append(dict(step_us=(t3 - t0) * 1e6, replay_us=replay_us))
        row["device"] = dict(policy=f"size:{args.device_split}", step_us=summarize_keys(recs, "step_us"),
                             replay_us=summarize_keys(recs, "replay_us"))
        out.append(row)
        del dg, rig
        if on_gpu:
            torch.cuda.empty_cache()
    return dict(config=dict(mode="points", steps=steps, warmup=args.warmup, spec=args.spec,
                            device_split=args.device_split, policy=args.policy), rows=out)


def summarize_keys(recs, k):
    xs = [r[k] for r in recs if r.get(k) is not None]
    return dict(p25=pct(xs, 25), p50=pct(xs, 50), p75=pct(xs, 75), p99=pct(xs, 99),
                mean=float(np.mean(xs)) if xs else None, n=len(xs))


# --- reports ------------------------------------------------------------------------------------


def fixed_table(res) -> list[str]:
    p = lambda r, k, d=1: fmt(r[k]["p50"], d)  # noqa: E731
    lines = ["Host-planned graph (policy as set) and device-planned graph (`size:S`), p50:", "",
             "| B | make_plan µs | upload µs | plan() µs | copy µs | replayed kernel µs | step µs | step / kernel "
             "| device-planned: copy µs | replay µs | step µs | step / its kernel | step / host-planned replay |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in res["rows"]:
        lines.append(f"| {r['batch']} | {p(r, 'make_plan_us')} | {p(r, 'upload_us')} | {p(r, 'plan_us')} | "
                     f"{p(r, 'copy_us')} | {p(r, 'replay_us')} | {p(r, 'step_us')} | {p(r, 'step_over_kernel', 2)} | "
                     f"{p(r, 'dev_copy_us')} | {p(r, 'dev_replay_us')} | {p(r, 'dev_step_us')} | "
                     f"{p(r, 'dev_step_over_kernel', 2)} | {p(r, 'dev_step_over_host_replay', 2)} |")
    lines += ["", "Device-planned graph with the copy of lengths and offsets captured in it (`StepInputs(in_graph=True)`: "
                  "a step writes the pinned buffer and replays), against one bare replay of the same graph "
                  "(wall time to the end of a sync, inputs unchanged; the step and the bare replay timed first in "
                  "turn, step by step), p50:", "",
              "| B | step µs (copy in the graph) | bare replay µs (wall) | step / bare replay | step / host-planned "
              "replayed kernel | step's write of the lengths µs | step's replay µs | step's replay / bare replay "
              "| bare replay p25-p75 µs |", "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in res["rows"]:
        a, k = r["dev_in_graph_step_us"]["p50"], r["replay_us"]["p50"]
        bare = r["replay_wall_us"]
        lines.append(f"| {r['batch']} | {p(r, 'dev_in_graph_step_us')} | {p(r, 'replay_wall_us')} | "
                     f"{p(r, 'dev_in_graph_over_replay_wall', 2)} | {fmt(a / k if a and k else None, 2)} | "
                     f"{p(r, 'dev_in_graph_write_us')} | {p(r, 'dev_in_graph_replay_us')} | "
                     f"{p(r, 'dev_in_graph_replay_over_bare', 2)} | {fmt(bare.get('p25'))}-{fmt(bare.get('p75'))} |")
    lines += ["", "Host-planned graph with its copies captured in it (`DecodeWrapper(plan_in_graph=True)`: `plan()` "
                  "makes the plan and packs it with the batch's lengths and offsets into pinned memory, one C call "
                  "once the wrapper refreshes its captured plan; `copy_plan()` in the graph copies both, and the "
                  "kernels read the lengths from there, `planned_seq_lens`): a step is `plan()` and one replay, p50:",
              "",
              "| B | plan() µs | steps planned in one C call | step µs | step / host-planned replayed kernel "
              "| step / its bare replay | back to back: step µs | step / kernel "
              "| a torch launch µs (the host's speed) "
              "| plan(): wait for the last copy µs | C planner µs | the rest µs |",
              "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in res["rows"]:
        lines.append(f"| {r['batch']} | {p(r, 'hig_plan_us')} | {r.get('hig_refreshed') or '-'} | {p(r, 'hig_step_us')} | "
                     f"{p(r, 'hig_step_over_kernel', 2)} | {p(r, 'hig_step_over_replay_wall', 2)} | "
                     f"{fmt(r.get('hig_back_to_back_us'))} | {fmt(r.get('hig_back_to_back_over_kernel'), 2)} | "
                     f"{p(r, 'torch_launch_us')} | {p(r, 'hig_wait_us')} | {p(r, 'hig_c_plan_us')} | "
                     f"{p(r, 'hig_rest_us')} |")
    lines += ["", "Back to back: the same steps issued with no synchronize between them, as a loop that schedules "
                  "the next step while the GPU runs this one (each `plan()` waits only for the previous replay's "
                  "copy of the plan), wall time over the steps, median of three passes."]
    lines += ["", "Upload parts (`set_plan()` of the host-planned graph: `PlanUploader.upload`'s parts and the "
                  "rest), p50 µs:", "", "| B | upload µs | " + " | ".join(UPLOAD_PARTS) + " |",
              "|---:|---:|" + "---:|" * len(UPLOAD_PARTS)]
    for r in res["rows"]:
        up = r.get("upload_parts") or {}
        lines.append(f"| {r['batch']} | {p(r, 'upload_us')} | " + " | ".join(fmt(up.get(k)) for k in UPLOAD_PARTS) + " |")
    lines += ["", "Eager `run()` (a wrapper planned at the batch), p50:", "",
              "| B | run() host µs right after plan() (launches included) | the same plan again µs | its kernel µs "
              "| run() Python side µs (launches stubbed) | steps with a new prepared launch (its kernel reused) "
              "| their run() µs |",
              "|---:|---:|---:|---:|---:|---:|---:|"]
    for r in res["rows"]:
        nl = r.get("eager_new_launch_steps")
        lines.append(f"| {r['batch']} | {p(r, 'eager_run_us')} | {p(r, 'eager_again_us')} | {p(r, 'eager_kernel_us')} | "
                     f"{fmt(r['eager_python_us'])} | {nl if nl is not None else '-'} "
                     f"({r.get('eager_reused_kernel_steps', '-')}) | "
                     f"{fmt((r.get('eager_new_launch_run_us') or {}).get('p50'))} |")
    return lines


def points_table(res) -> list[str]:
    c = res["config"]
    lines = [f"| point | block table tokens | host `{c['policy']}`: step / replay µs | host `size:{c['device_split']}`: "
             f"step / replay µs | device `size:{c['device_split']}`: step / replay µs | device step / host "
             f"`{c['policy']}` replay |", "|---|---:|---:|---:|---:|---:|"]
    for r in res["rows"]:
        cell = lambda k: f"{fmt(r[k]['step_us']['p50'])} / {fmt(r[k]['replay_us']['p50'])}"  # noqa: E731
        hr = r["host"]["replay_us"]["p50"]
        ratio = r["device"]["step_us"]["p50"] / hr if hr else None
        lines.append(f"| {r['point']} | {r['block_table_tokens']:,} | {cell('host')} | {cell('host_size')} | "
                     f"{cell('device')} | {fmt(ratio, 2)} |")
    return lines


def trace_table(res) -> list[str]:
    cols = [("make_plan_us", "make_plan"), ("upload_us", "upload"), ("plan_us", "plan()"), ("copy_us", "copy"),
            ("replay_us", "replay"), ("step_us", "step"), ("step_over_kernel", "step/kernel"),
            ("eager_make_plan_us", "eager make_plan"), ("eager_kernel_us", "eager kernel"),
            ("eager_launch_us", "eager launch"), ("eager_again_us", "eager again")]
    head = "| B bin | steps | " + " | ".join(f"{c} p50 / p99" for _, c in cols) + " |"
    lines = [head, "|---|---:|" + "---:|" * len(cols)]
    for b in res["bins"] + [dict(bin="all", **res["overall"])]:
        cells = []
        for k, _ in cols:
            d = 2 if k == "step_over_kernel" else 1
            cells.append(f"{fmt(b[k]['p50'], d)} / {fmt(b[k]['p99'], d)}")
        lines.append(f"| {b['bin']} | {b['steps']} | " + " | ".join(cells) + " |")
    return lines


def plot(res, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    bins = res["bins"]
    xs = [math.sqrt(b["batch_min"] * b["batch_max"]) for b in bins]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for k, label, style in (("step_us", "step (plan + upload + copy + replay)", "k-o"),
                            ("make_plan_us", "make_plan", "C0--s"), ("upload_us", "upload (set_plan)", "C1--^"),
                            ("copy_us", "copy lengths", "C2--v"), ("replay_us", "graph replay (kernel)", "C3-D"),
                            ("eager_kernel_us", "eager run() (kernel)", "C4:x")):
        ys = [b[k]["p50"] for b in bins]
        if any(y is not None for y in ys):
            ax.plot([x for x, y in zip(xs, ys) if y is not None], [y for y in ys if y is not None], style,
                    label=label)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("batch size (requests; bin's geometric centre)")
    ax.set_ylabel("µs per step (p50)")
    c = res["config"]
    ax.set_title(f"serving trace: {c['workload']}, {res['shape']}", fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", help="directory for bench_serving.json / .md / .png")
    ap.add_argument("--quick", action="store_true", help="smoke test: small shapes, few steps")
    ap.add_argument("--all", action="store_true", help="the trace and the fixed batches (1,16,64,256), one run")
    ap.add_argument("--fixed-batches", help="fixed-batch mode, e.g. 1,16,64,256 (no trace)")
    ap.add_argument("--fixed-steps", type=int, default=200, help="timed steps per fixed batch (default 200)")
    ap.add_argument("--device-split", type=int, default=512,
                    help="split length S of the device-planned graph (policy size:S; default 512)")
    ap.add_argument("--points", help="fixed-length comparison of host- and device-planned graphs, e.g. "
                                     "B1x16k,B16x8k,B64x2k")
    # trace
    ap.add_argument("--workload", choices=sorted(PRESETS), default="default",
                    help="named prompt / decode distributions: " + "; ".join(
                        f"{k}: prompt {p}, decode {d}" for k, (p, d) in PRESETS.items()))
    ap.add_argument("--prompt", help="prompt lengths: loguniform:A:B, uniform:A:B or fixed:N (overrides --workload)")
    ap.add_argument("--decode", help="tokens decoded per request, same syntax (overrides --workload)")
    ap.add_argument("--arrival", choices=["poisson", "fixed"], default="poisson",
                    help="poisson: Poisson arrivals whose mean concurrency is the load; fixed: exactly the load")
    ap.add_argument("--loads", default="1,4,16,64,256",
                    help="mean concurrency of each phase, run in order (default 1,4,16,64,256)")
    ap.add_argument("--steps", type=int, default=400, help="decode steps per phase (default 400)")
    ap.add_argument("--warmup", type=int, default=20, help="leading steps not recorded (default 20)")
    ap.add_argument("--max-batch", type=int, help="most requests in a step (default 1.25 x the largest load)")
    ap.add_argument("--max-len", type=int, help="longest context (default: the largest prompt + decode)")
    ap.add_argument("--graph-sizes", default="max",
                    help="captured batch sizes: max (one graph at --max-batch), vllm (1, 2, 4, multiples of 8) "
                         "or a list")
    ap.add_argument("--spec", type=int, default=0, help="speculative tokens K: K + 1 query rows per request")
    ap.add_argument("--accept", type=float, default=0.7, help="acceptance rate of a speculative token")
    ap.add_argument("--no-eager", action="store_true", help="skip the eager wrapper")
    ap.add_argument("--flush-l2", action="store_true", help="read 256 MiB before each step (GPU; default: no flush)")
    ap.add_argument("--kv-pool-gb", type=float, default=16.0, help="KV cache pool size (default 16 GiB)")
    # shapes
    ap.add_argument("--hq", type=int, default=32)
    ap.add_argument("--hkv", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--page", type=int, default=16)
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    ap.add_argument("--policy", default="auto")
    ap.add_argument("--profile", default="h200", help="the planner's device profile")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--cpu-kernels", action="store_true",
                    help="without a GPU: run the eager kernels in the Triton interpreter (tiny sizes)")
    args = ap.parse_args(argv)

    on_gpu = torch.cuda.is_available()
    device = torch.device("cuda" if on_gpu else "cpu")
    if not on_gpu:
        # the CPU "device": one thread, as a server's host loop is (torch's thread pool turns a
        # 200 KB copy into milliseconds on a busy 2-core machine)
        torch.set_num_threads(1)
    if args.cpu_kernels and on_gpu:
        raise SystemExit("--cpu-kernels: only without a GPU")
    if args.quick:
        args.steps, args.warmup, args.fixed_steps = min(args.steps, 30), min(args.warmup, 3), min(args.fixed_steps, 10)
        args.loads = args.loads if "--loads" in (argv or sys.argv) else "1,4,16"
        args.kv_pool_gb = min(args.kv_pool_gb, 0.05)
        if args.fixed_batches is None and args.all:
            args.fixed_batches = "1,4"
    if args.cpu_kernels:   # the interpreter: tiny shapes
        args.hq, args.hkv, args.head_dim = min(args.hq, 4), min(args.hkv, 2), min(args.head_dim, 32)
        args.prompt = args.prompt or "uniform:16:256"
        args.decode = args.decode or "uniform:4:16"
        args.loads = "1,2" if not args.quick or "--loads" not in (argv or sys.argv) else args.loads
        args.max_batch = min(args.max_batch or 4, 4)
        args.kv_pool_gb = min(args.kv_pool_gb, 0.01)
    if args.all and args.fixed_batches is None:
        args.fixed_batches = "1,16,64,256"
    shape = (f"Hq {args.hq} / Hkv {args.hkv} / D {args.head_dim} / {args.dtype} / page {args.page}, "
             f"policy {args.policy}, profile {args.profile}" + (f", spec K {args.spec}" if args.spec else ""))
    result = dict(provenance=provenance(argv if argv is None else [sys.argv[0], *argv]), shape=shape,
                  on_gpu=on_gpu, torch_threads=torch.get_num_threads(), cpu_kernels=args.cpu_kernels,
                  note=None if on_gpu else "no GPU: host parts only (plan, upload to a CPU 'device', copy); "
                                            "no graphs" + ("; eager kernels in the Triton interpreter"
                                                           if args.cpu_kernels else "; no kernels"))
    t_start = time.perf_counter()
    if (args.fixed_batches is None and not args.points) or args.all:
        result["trace"] = run_trace(args, device, on_gpu)
    if args.fixed_batches is not None:
        result["fixed"] = run_fixed(args, device, on_gpu)
    if args.points:
        result["points"] = run_points(args, device, on_gpu)
    result["wall_s"] = time.perf_counter() - t_start

    md = [f"# Serving-loop benchmark ({'GPU' if on_gpu else 'CPU, host parts only'})", "",
          f"- device: {result['provenance']['device']}", f"- command: `{result['provenance']['command']}`",
          f"- commit: {(result['provenance']['git'] or {}).get('commit')}", f"- shape: {shape}",
          f"- wall time: {result['wall_s']:.0f} s"]
    if result["note"]:
        md.append(f"- {result['note']}")
    if "trace" in result:
        c = result["trace"]["config"]
        md += ["", f"## Trace: {c['workload']} (prompt {c['prompt']}, decode {c['decode']}), {c['arrival']} "
                   f"arrivals, loads {c['loads']} x {c['steps_per_phase']} steps, max batch {c['max_batch']}, "
                   f"graphs at {c['graph_sizes']}", "", "µs unless stated; p50 / p99 per batch-size bin.", ""]
        md += trace_table(result["trace"])
    if "fixed" in result:
        md += ["", "## Fixed batches (graph-stable, lengths uniform 512-8192; p50 over "
                   f"{result['fixed']['config']['steps']} steps; device-planned `size:"
                   f"{result['fixed']['config']['device_split']}`, block table "
                   f"{result['fixed']['config']['block_table_tokens']:,} tokens)", ""] + fixed_table(result["fixed"])
    if "points" in result:
        md += ["", f"## Host- and device-planned graphs at fixed lengths (p50 over {result['points']['config']['steps']}"
                   " steps; step = plan + copy + replay, device-planned: copy + replay)", ""]
        md += points_table(result["points"])
    text = "\n".join(md) + "\n"
    print(text)
    if args.out:
        save_outputs(args.out, "bench_serving", result, text)
        if "trace" in result and result["trace"]["bins"]:
            plot(dict(result["trace"], shape=shape), os.path.join(args.out, "bench_serving.png"))
        print(f"wrote {args.out}/bench_serving.{{json,md,png}}", file=sys.stderr)
    return 0
