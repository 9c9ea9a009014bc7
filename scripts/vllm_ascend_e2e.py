#!/usr/bin/env python3
"""On an Ascend NPU node: a small model in vLLM Ascend with the splitkv plugin off, then on.

NOT RUN YET (no NPU where it was written). Each mode runs in its own process (the plugin is read
at vLLM start-up), greedy, the same prompts; the script then compares:

* tokens: the greedy continuations must be identical, or, where they diverge, the logprobs of the
  first diverging position must be within ``--logprob-tol`` (default 0.05 nats: fp16/bf16
  rounding of two different but correct kernels can flip a near-tie);
* decode throughput: output tokens per second of a long-decode batch, off vs on.

It also checks that the plugin was active in the "on" run (``splitkv_vllm.plugin.status()``) and
inactive in the "off" run. Usage (see docs/vllm-ascend.md)::

    python scripts/vllm_ascend_e2e.py --model Qwen/Qwen2.5-0.5B-Instruct --out reports/vllm-ascend-e2e.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

PROMPTS = [
    "The capital of France is",
    "Write a haiku about the sea:",
    "def fibonacci(n):",
    "Explain split-KV decode attention in one paragraph.",
    "List the first ten prime numbers:",
    "Once upon a time, in a village by the mountains,",
]


def worker(args) -> dict:
    """Runs inside one mode's process: generate, time, report."""
    from vllm import LLM, SamplingParams

    from splitkv_vllm import plugin

    llm = LLM(model=args.model, dtype=args.dtype, max_model_len=args.max_model_len, enforce_eager=args.eager,
              gpu_memory_utilization=0.8, seed=0)
    greedy = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, logprobs=1)
    outs = llm.generate(PROMPTS, greedy)
    result = {"plugin": plugin.status(), "samples": []}
    for o in outs:
        c = o.outputs[0]
        lps = [next(iter(lp.values())).logprob if lp else None for lp in (c.logprobs or [])]
        result["samples"].append({"tokens": list(c.token_ids), "logprobs": lps})
    # decode throughput: many requests, short prompts, long outputs (decode-dominated)
    batch = [f"Count slowly from {i}:" for i in range(args.batch)]
    sp = SamplingParams(temperature=0.0, max_tokens=args.decode_tokens, ignore_eos=True)
    llm.generate(batch[:4], SamplingParams(temperature=0.0, max_tokens=8))  # warm-up
    t0 = time.perf_counter()
    res = llm.generate(batch, sp)
    dt = time.perf_counter() - t0
    result["decode_tokens_per_s"] = sum(len(r.outputs[0].token_ids) for r in res) / dt
    return result


def run_mode(args, on: bool) -> dict:
    env = dict(os.environ, SPLITKV_VLLM_ENABLE="1" if on else "0", SPLITKV_VLLM_STRICT="1" if on else "0")
    cmd = [sys.executable, __file__, "--worker", *sys.argv[1:]]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if p.returncode:
        raise SystemExit(f"mode {'on' if on else 'off'} failed:\n{p.stdout[-3000:]}\n{p.stderr[-5000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def compare(off: dict, on: dict, tol: float) -> dict:
    report = {"identical": 0, "diverged_within_tol": 0, "failed": []}
    for i, (a, b) in enumerate(zip(off["samples"], on["samples"])):
        if a["tokens"] == b["tokens"]:
            report["identical"] += 1
            continue
        k = next(j for j, (x, y) in enumerate(zip(a["tokens"] + [None], b["tokens"] + [None])) if x != y)
        la, lb = a["logprobs"][k], b["logprobs"][k]
        diff = abs(la - lb) if la is not None and lb is not None else float("inf")
        (report["failed"].append({"prompt": i, "position": k, "logprob_diff": diff}) if diff > tol
         else report.__setitem__("diverged_within_tol", report["diverged_within_tol"] + 1))
    return report


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="Qwen/Qwen2.5-0.5B-Instruct")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--max-model-len", type=int, default=4096)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--decode-tokens", type=int, default=512)
    ap.add_argument("--eager", action="store_true", help="enforce_eager (no aclgraph)")
    ap.add_argument("--logprob-tol", type=float, default=0.05)
    ap.add_argument("--out", default="reports/vllm-ascend-e2e.json")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(worker(args)))
        return 0
    off, on = run_mode(args, False), run_mode(args, True)
    if off["plugin"]["active"] or not on["plugin"]["active"]:
        print(f"plugin state wrong: off={off['plugin']}, on={on['plugin']}")
        return 1
    cmp = compare(off, on, args.logprob_tol)
    from splitkv_common.provenance import provenance

    summary = {"provenance": provenance(), "model": args.model, "dtype": args.dtype, "eager": args.eager, "tokens": cmp,
               "decode_tokens_per_s": {"off": off["decode_tokens_per_s"], "on": on["decode_tokens_per_s"]}}
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(summary, f, indent=1)
    print(json.dumps(summary, indent=1))
    return 1 if cmp["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
