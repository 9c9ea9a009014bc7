"""Settle vLLM Ascend's sliding-window convention on a node: which keys does its FIA call let a query see?

vLLM's ``sliding_window = W`` lets the query at position ``p`` see ``p - W + 1 .. p`` (W keys), and its
sliding-window KV manager frees blocks before ``num_computed - W + 1``. vLLM Ascend calls FIA with
``sparse_mode = 4``, ``pre_tokens = W``, ``next_tokens = 0`` (the 2048 x 2048 causal int8 mask, TND,
paged K/V), which by the band rule of FIA's documentation keeps ``p - W .. p``: W + 1 keys, the extra
key ``p - W`` possibly in a freed block. The plugin copies that (``window_left = W``, opt-in:
``route_window_layers``) until this check settles it.

The check (NOT RUN YET: it needs an NPU): one request of ``L = p + 1`` keys, K = 0 (every visible key
scores the same: the softmax is uniform over the visible keys), V one-hot per channel at chosen key
positions, so that the last query row's output in channel ``c`` is ``1 / n`` when channel ``c``'s key is
visible (``n`` visible keys) and 0 when not:

* channel 0: key ``p - W`` (the key in question), channel 1: key ``p`` (always visible: gives ``n``),
  channel 2: key ``p - W + 1`` (visible either way), channel 3: key ``p - W - 1`` (never visible);
* ``p - W`` is the last key of a 128-token block (``(p - W + 1) % 128 == 0``): exactly where vLLM's
  manager may already have freed it;
* decode (one query row) and prefill with a cache (4 rows ending at ``p``), FIA with
  ``pre_tokens`` W and W - 1, W in {128, 256, 1000}; and our op with ``window_left`` W and W - 1.

Verdict: if FIA with ``pre_tokens = W`` sees key ``p - W`` at decode, vLLM Ascend serves W + 1 keys (an
upstream bug to file: ``pre_tokens = W - 1``, as its DSA path does) and the plugin's ``window_left = W``
matches it; if it does not, the plugin must use ``W - 1`` before window layers can be routed.

``python -m splitkv_vllm.window_check [--out reports/vllm-ascend-window.json]`` on the node
(``scripts/vllm_ascend_e2e.sh`` runs it).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

BLOCK = 128
WINDOWS = (128, 256, 1000)
CHANNELS = {"p-W": 0, "p": 1, "p-W+1": 2, "p-W-1": 3}


def make_case(W: int, q_rows: int, *, num_heads: int = 8, num_kv_heads: int = 1, head_dim: int = 128) -> dict:
    """The inputs of one case (NumPy, float32 values exact in float16): ``q [q_rows, Hq, D]``,
    ``k_cache`` / ``v_cache`` ``[num_blocks, BLOCK, Hkv, D]``, ``block_table`` int32 ``[1, num_blocks]``,
    ``seq_len`` ``L``, ``p = L - 1``; ``p - W`` is the last key of a block."""
    p = W + BLOCK - 1
    L = p + 1
    nb = -(-L // BLOCK)
    v = np.zeros((nb * BLOCK, num_kv_heads, head_dim), np.float32)
    for name, ch in CHANNELS.items():
        pos = {"p-W": p - W, "p": p, "p-W+1": p - W + 1, "p-W-1": p - W - 1}[name]
        v[pos, :, ch] = 1.0
    g = np.random.default_rng(W)
    return dict(W=W, p=p, L=L, q=g.standard_normal((q_rows, num_heads, head_dim)).astype(np.float32),
                k_cache=np.zeros((nb, BLOCK, num_kv_heads, head_dim), np.float32),
                v_cache=v.reshape(nb, BLOCK, num_kv_heads, head_dim), block_table=np.arange(nb, dtype=np.int32)[None])


def visible(last_row: np.ndarray) -> dict:
    """What the last query row saw, from its output ``[Hq, D]`` (or ``[D]``): which of the marked keys,
    and ``n`` visible keys in all (``1 / out[channel of key p]``)."""
    o = np.asarray(last_row, np.float64).reshape(-1, last_row.shape[-1]).mean(axis=0)
    n = int(round(1.0 / o[CHANNELS["p"]])) if o[CHANNELS["p"]] > 0 else 0
    return {"keys": n, **{name: bool(o[ch] > 0.5 / max(n, 1)) for name, ch in CHANNELS.items()}}


def splitkv(case: dict, window_left: int, device="cpu") -> dict:
    """Our op (:class:`ascend_ops.AscendDecodeWrapper`; the CPU kernel off the NPU) with ``window_left``."""
    import torch

    from ascend_ops import AscendDecodeWrapper

    dt = torch.float16
    q = torch.from_numpy(case["q"]).to(dt).to(device)
    T, Hq, D = q.shape
    k, v = (torch.from_numpy(case[n]).to(dt).to(device) for n in ("k_cache", "v_cache"))
    bt = torch.from_numpy(case["block_table"]).to(device)
    w = AscendDecodeWrapper(Hq, k.shape[2], D, BLOCK, dtype=dt, device=device)
    w.plan(np.array([case["L"]], np.int32), query_start_loc=np.array([0, T], np.int32), window_left=window_left,
           max_pages=int(bt.shape[1]), num_pages=int(k.shape[0]))
    out, _ = w.run(q, k, v, bt)
    return visible(out[-1].float().cpu().numpy())


def fia(case: dict, pre_tokens: int) -> dict:
    """vLLM Ascend's sliding-window FIA call (``attention_v1.py``: TND, paged K/V viewed ``[nb, BLOCK,
    Hkv * D]``, the 2048 causal int8 mask, ``sparse_mode = 4``, ``next_tokens = 0``) with ``pre_tokens``."""
    import torch
    import torch_npu

    dt, dev = torch.float16, "npu"
    q = torch.from_numpy(case["q"]).to(dt).to(dev)
    T, Hq, D = q.shape
    nb, _, Hkv, _ = case["k_cache"].shape
    k, v = (torch.from_numpy(case[n]).to(dt).to(dev).view(nb, BLOCK, Hkv * D) for n in ("k_cache", "v_cache"))
    mask = torch.triu(torch.ones(2048, 2048), diagonal=1).to(torch.int8).to(dev)
    out, _ = torch_npu.npu_fused_infer_attention_score(
        query=q, key=k, value=v, atten_mask=mask, block_table=torch.from_numpy(case["block_table"]).to(dev),
        input_layout="TND", block_size=BLOCK, actual_seq_lengths=[T], actual_seq_lengths_kv=[case["L"]],
        num_key_value_heads=Hkv, num_heads=Hq, scale=D ** -0.5, pre_tokens=pre_tokens, next_tokens=0, sparse_mode=4)
    return visible(out[-1].float().cpu().numpy())


def run(on_npu: bool) -> dict:
    """Every case: ``{"W=..,rows=..": {"fia pre_tokens=W": ..., "splitkv window_left=W": ...}}``."""
    report = {}
    for W in WINDOWS:
        for rows in (1, 4):
            case = make_case(W, rows)
            r = {}
            if on_npu:
                for pre in (W - 1, W):
                    r[f"fia pre_tokens={'W' if pre == W else 'W-1'}"] = fia(case, pre)
            for wl in (W - 1, W):
                r[f"splitkv window_left={'W' if wl == W else 'W-1'}"] = splitkv(case, wl, "npu" if on_npu else "cpu")
            report[f"W={W},rows={rows}"] = r
    return report


def verdict(report: dict) -> str:
    """One line: what vLLM Ascend's ``pre_tokens = W`` keeps at decode, and what the plugin should use."""
    seen = [r["fia pre_tokens=W"]["p-W"] for k, r in report.items() if "fia pre_tokens=W" in r and "rows=1" in k]
    if not seen:
        return "no FIA result (not on an NPU): nothing settled"
    if all(seen):
        return ("FIA pre_tokens=W keeps W + 1 keys at decode (key p - W seen): vLLM Ascend's off-by-one is "
                "confirmed; the plugin's window_left = W matches it (file upstream: pre_tokens = W - 1)")
    if not any(seen):
        return ("FIA pre_tokens=W keeps W keys at decode: vLLM Ascend matches vLLM; the plugin must use "
                "window_left = W - 1 before window layers are routed")
    return "FIA pre_tokens=W differs between windows: inspect the report"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="reports/vllm-ascend-window.json")
    ap.add_argument("--cpu", action="store_true", help="our op's CPU kernel only (no FIA): checks the method")
    args = ap.parse_args(argv)
    report = run(on_npu=not args.cpu)
    summary = {"report": report, "verdict": verdict(report)}
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(summary, f, indent=1)
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
