#!/usr/bin/env python3
"""On an Ascend NPU node: a small model in vLLM Ascend, stock (FIA; optionally paged attention) vs the splitkv plugin.

NOT RUN YET (no NPU where it was written). Each run has its own process (the plugin is read when
vLLM starts), greedy, the same prompts, in one cudagraph mode (``--graph-mode``; passed to vLLM
explicitly), optionally with speculative decoding (``--speculative-config``) and tensor parallelism
(``--tp``). Runs: ``fia`` (plugin off: vLLM Ascend's FIA), ``pa`` (``--baselines fia,pa``, plugin off,
``FULL_DECODE_ONLY`` only: vLLM Ascend's ``_npu_paged_attention`` through ``pa_shape_list``), ``on``.
The script then checks:

* that the plugin ran in the model's processes: the counters are collected from vLLM's workers
  (``llm.collective_rpc(splitkv_vllm.stats.worker_stats)``, else the per-worker stats files), not in
  this driver. The ``on`` run must show routed steps > 0; in FULL_DECODE_ONLY / FULL_AND_PIECEWISE,
  graph captures > 0 and **replays of our graphs counted at replay** (a device counter inside each
  captured graph, read after the runs) > 0 and equal to the uniform-decode steps of captured sizes
  the builder refreshed (the steps vLLM replays); in plain FULL no capture. The stock runs must show
  nothing routed. Any of these failing fails the run (exit 1), whatever the tokens say;
* accuracy: the greedy continuations of ``on`` against ``fia`` must be identical, or, where they
  diverge, the logprobs of the first diverging position must be within ``--logprob-tol`` (default
  0.05 nats: fp16/bf16 rounding of two correct kernels can flip a near-tie);
* decode throughput: output tokens per second of a long-decode batch at each ``--batch-sizes``, per run.

Usage (see docs/vllm-ascend.md)::

    python scripts/vllm_ascend_e2e.py --model Qwen/Qwen2.5-0.5B-Instruct --graph-mode FULL_DECODE_ONLY \
        --baselines fia,pa --batch-sizes 1,16,64,256
    python scripts/vllm_ascend_e2e.py --graph-mode FULL_AND_PIECEWISE --tp 2 \
        --speculative-config '{"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 4}'
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

PROMPTS = [
    "The capital of France is",
    "Write a haiku about the sea:",
    "def fibonacci(n):",
    "Explain split-KV decode attention in one paragraph.",
    "List the first ten prime numbers:",
    "Once upon a time, in a village by the mountains,",
]
GRAPH_MODES = ("eager", "PIECEWISE", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE", "FULL")
FULL_ROUTED = ("FULL_DECODE_ONLY", "FULL_AND_PIECEWISE")
RUNS = ("fia", "pa", "on")


def llm_kwargs(args, run: str, stats_dir: str) -> dict:
    """The ``LLM(...)`` arguments of one run (``fia`` / ``pa`` / ``on``): the graph mode given explicitly,
    the plugin and vLLM Ascend's ``pa_shape_list`` through ``additional_config`` (as vLLM Ascend's own
    switches are given), tensor parallelism and speculative decoding as asked."""
    on = run == "on"
    extra = {"splitkv": {"enable": on, "strict": on, "stats_dir": stats_dir}}
    if run == "pa":   # vLLM Ascend takes _npu_paged_attention for the decode graphs of these sizes
        extra["pa_shape_list"] = list(range(1, args.max_num_seqs * args.query_rows + 1))
    kw = dict(model=args.model, dtype=args.dtype, max_model_len=args.max_model_len, gpu_memory_utilization=0.8,
              seed=0, max_num_seqs=args.max_num_seqs, tensor_parallel_size=args.tp, additional_config=extra)
    if args.speculative_config:
        kw["speculative_config"] = json.loads(args.speculative_config)
    if args.graph_mode == "eager":
        kw["enforce_eager"] = True
    else:
        kw["enforce_eager"] = False
        kw["compilation_config"] = {"cudagraph_mode": args.graph_mode}
    return kw


def collect_stats(llm, stats_dir: str) -> dict:
    """The plugin's counters from the model's processes: collective_rpc first, the stats files else."""
    from splitkv_vllm import stats

    try:
        per_worker = list(llm.collective_rpc(stats.worker_stats))
        source = "collective_rpc"
    except Exception as e:  # noqa: BLE001 - an executor that cannot send a callable
        per_worker, source = stats.read_dir(stats_dir), f"stats files ({type(e).__name__} from collective_rpc)"
    return {"source": source, "per_worker": per_worker, "total": stats.total(per_worker)}


def worker(args) -> dict:
    """Runs inside one mode's process: generate, time, collect the workers' counters."""
    from vllm import LLM, SamplingParams

    run = os.environ["SPLITKV_E2E_RUN"]
    stats_dir = os.environ["SPLITKV_VLLM_STATS_DIR"]
    llm = LLM(**llm_kwargs(args, run, stats_dir))
    greedy = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, logprobs=1)
    outs = llm.generate(PROMPTS, greedy)
    result = {"samples": []}
    for o in outs:
        c = o.outputs[0]
        lps = [next(iter(lp.values())).logprob if lp else None for lp in (c.logprobs or [])]
        result["samples"].append({"tokens": list(c.token_ids), "logprobs": lps})
    # decode throughput per batch size: short prompts, long outputs (decode-dominated)
    sp = SamplingParams(temperature=0.0, max_tokens=args.decode_tokens, ignore_eos=True)
    llm.generate(PROMPTS[:4], SamplingParams(temperature=0.0, max_tokens=8))  # warm-up
    result["decode_tokens_per_s"] = {}
    for b in args.batch_sizes:
        batch = [f"Count slowly from {i}:" for i in range(b)]
        t0 = time.perf_counter()
        res = llm.generate(batch, sp)
        dt = time.perf_counter() - t0
        result["decode_tokens_per_s"][str(b)] = sum(len(r.outputs[0].token_ids) for r in res) / dt
    result["stats"] = collect_stats(llm, stats_dir)
    return result


def run_mode(args, run: str) -> dict:
    """One run (``fia`` / ``pa`` / ``on``) in its own process (the plugin and vLLM read their settings
    at start-up)."""
    stats_dir = tempfile.mkdtemp(prefix=f"splitkv-e2e-{run}-")
    env = dict(os.environ, SPLITKV_E2E_RUN=run, SPLITKV_VLLM_STATS_DIR=stats_dir,
               VLLM_ALLOW_INSECURE_SERIALIZATION="1")  # collective_rpc sends worker_stats by reference
    for var in ("SPLITKV_VLLM_ENABLE", "SPLITKV_VLLM_STRICT"):  # the run's additional_config decides
        env.pop(var, None)
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", *args.argv]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if p.returncode:
        raise SystemExit(f"run {run} failed:\n{p.stdout[-3000:]}\n{p.stderr[-5000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def routing_problems(stock: dict, on: dict, graph_mode: str) -> list[str]:
    """Why the runs do not show the plugin doing what the mode promises (empty: they do). ``stock``:
    run name -> result of the runs with the plugin off."""
    problems = []
    t_on = on.get("stats", {}).get("total", {})
    if not t_on.get("workers"):
        problems.append("on: no worker reported its splitkv counters (neither collective_rpc nor stats files)")
    if graph_mode == "FULL":
        if t_on.get("graph_captures", 0):
            problems.append(f"on: {t_on['graph_captures']} graph captures in FULL mode (the plugin must leave them "
                            "to vLLM Ascend)")
    elif graph_mode in FULL_ROUTED:
        if t_on.get("routed_steps", 0) <= 0:
            problems.append("on: 0 routed steps (the eager warm-up of each graph size is a routed step)")
        if t_on.get("graph_captures", 0) <= 0:
            problems.append(f"on: 0 graph captures on splitkv in {graph_mode}")
        replays, uniform = t_on.get("graph_replays"), t_on.get("uniform_graph_steps", 0)
        if replays is None:
            problems.append("on: the workers did not read the replays of our graphs (collective_rpc needed)")
        elif replays <= 0:
            problems.append(f"on: 0 replays of a splitkv graph in {graph_mode} (counted at replay)")
        elif replays != uniform:
            problems.append(f"on: {replays} replays of our graphs for {uniform} uniform-decode steps of captured "
                            "sizes: some decode steps did not go through our graphs")
    elif t_on.get("routed_steps", 0) <= 0:
        problems.append(f"on: 0 routed steps in {graph_mode} mode: the plugin did not route anything")
    for name, res in stock.items():
        t = res.get("stats", {}).get("total", {})
        if any(t.get(k, 0) for k in ("routed_steps", "graph_captures")):
            problems.append(f"{name}: the plugin routed work while switched off ({t})")
    return problems


def compare(off: dict, on: dict, tol: float) -> dict:
    report = {"identical": 0, "diverged_within_tol": 0, "failed": []}
    if len(off["samples"]) != len(on["samples"]):
        report["failed"].append({"samples": [len(off["samples"]), len(on["samples"])]})
    for i, (a, b) in enumerate(zip(off["samples"], on["samples"])):
        if a["tokens"] == b["tokens"]:
            report["identical"] += 1
            continue
        k = next(j for j, (x, y) in enumerate(zip(a["tokens"] + [None], b["tokens"] + [None])) if x != y)
        la = a["logprobs"][k] if k < len(a["logprobs"]) else None
        lb = b["logprobs"][k] if k < len(b["logprobs"]) else None
        diff = abs(la - lb) if la is not None and lb is not None else float("inf")
        if diff > tol:
            report["failed"].append({"prompt": i, "position": k, "logprob_diff": diff})
        else:
            report["diverged_within_tol"] += 1
    return report


def parse(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="Qwen/Qwen2.5-0.5B-Instruct")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--max-model-len", type=int, default=4096)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--batch-sizes", default="1,16,64,256", help="decode throughput at each batch size")
    ap.add_argument("--decode-tokens", type=int, default=512)
    ap.add_argument("--max-num-seqs", type=int, default=256)
    ap.add_argument("--tp", type=int, default=1, help="tensor_parallel_size")
    ap.add_argument("--speculative-config", default="", help="vLLM's speculative_config as JSON")
    ap.add_argument("--baselines", default="fia", help="stock runs: fia, or fia,pa (pa: FULL_DECODE_ONLY only)")
    ap.add_argument("--graph-mode", choices=GRAPH_MODES, default="FULL_DECODE_ONLY",
                    help="eager (enforce_eager) or the cudagraph_mode vLLM is given")
    ap.add_argument("--logprob-tol", type=float, default=0.05)
    ap.add_argument("--out", default="reports/vllm-ascend-e2e.json")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    args.argv = [a for a in argv if a != "--worker"]
    args.batch_sizes = [int(b) for b in args.batch_sizes.split(",") if b]
    args.baselines = [b for b in args.baselines.split(",") if b]
    if "fia" not in args.baselines or set(args.baselines) - {"fia", "pa"}:
        ap.error("--baselines: fia, or fia,pa")
    if "pa" in args.baselines and args.graph_mode != "FULL_DECODE_ONLY":
        ap.error("--baselines pa: vLLM Ascend takes paged attention in FULL_DECODE_ONLY graphs only")
    spec = json.loads(args.speculative_config) if args.speculative_config else {}
    args.query_rows = 1 + int(spec.get("num_speculative_tokens", 0) or 0)
    return args


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse(argv)
    if args.worker:
        print(json.dumps(worker(args)))
        return 0
    stock = {name: run_mode(args, name) for name in args.baselines}
    on = run_mode(args, "on")
    problems = routing_problems(stock, on, args.graph_mode)
    cmp = compare(stock["fia"], on, args.logprob_tol)
    from splitkv_common.provenance import provenance

    summary = {"provenance": provenance(), "model": args.model, "dtype": args.dtype, "graph_mode": args.graph_mode,
               "tp": args.tp, "speculative_config": args.speculative_config or None,
               "routing": {"problems": problems, "on": on.get("stats"),
                           **{name: res.get("stats") for name, res in stock.items()}},
               "tokens_vs_fia": cmp,
               "decode_tokens_per_s": {name: res.get("decode_tokens_per_s") for name, res in {**stock, "on": on}.items()}}
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(summary, f, indent=1)
    print(json.dumps(summary, indent=1))
    for p in problems:
        print(f"FAIL: {p}", file=sys.stderr)
    return 1 if problems or cmp["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
