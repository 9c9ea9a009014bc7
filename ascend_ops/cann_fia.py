"""Harness backend ``cann-fia``: CANN's own FusedInferAttentionScore as a parity and speed peer.

Runs a case through ``torch_npu.npu_fused_infer_attention_score`` (the op vLLM Ascend's decode
calls) and converts its layouts and conventions to ours. The call is built by a pure function,
:func:`fia_call`, so its mapping is tested without an NPU (``tests/ascend/test_cann_fia.py``)
against the op's recorded signature and, end to end, against a torch emulation of the op's
documented semantics (both in ``tests/ascend/fia_emulation.py``); only :func:`run_cann_fia` needs
an NPU.

Sources (recorded, not run here):

* signature: ``op_plugin/config/op_plugin_functions.yaml`` of ``Ascend/op-plugin`` (the commit
  is recorded with the signature in ``tests/ascend/fia_emulation.py``); output shapes from its meta registration
  (``op_plugin/python/meta/_meta_registrations.py``: out like the query layout, lse
  ``[B, N, S, 1]``, or ``[T, N, 1]`` for TND);
* semantics: ``aclnnFusedInferAttentionScoreV4.md`` of ``hicann/ops-transformer`` (layouts,
  ``block_table`` ``[B, >= max blocks]`` int32, ``block_size`` <= 512 and a multiple of 16 for 16-bit
  KV, ``actual_seq_lengths_kv`` per request under paged KV, ``sparse_mode`` 3 = right-down causal,
  4 = band with ``pre_tokens``/``next_tokens``, the ``(2048, 2048)`` compressed mask, query dtype
  float16/bfloat16/int8, D a multiple of 16, TND with D = 128, lse "inf marks invalid rows").

Mapping (ours -> FIA):

* every request has one query row and no window: ``BSND``, query ``[B, 1, Hq, D]``, no mask,
  ``sparse_mode=0``; otherwise ``TND`` (vLLM Ascend's layout): query ``[T, Hq, D]``,
  ``actual_seq_lengths`` = cumulative query ends, ``sparse_mode=3`` (our causal tail) or ``4`` with
  ``pre_tokens = window_left``, ``next_tokens = 0`` (window), and the compressed causal mask.
* paged KV: ``key``/``value`` as ``[num_pages, page_size, Hkv * D]`` (BnBsH, as vLLM Ascend passes
  them), ``block_table`` int32, ``block_size = page_size``, ``actual_seq_lengths_kv = seq_lens``.
* ``num_heads = Hq``, ``num_key_value_heads = Hkv``, ``scale``, ``softmax_lse_flag=True``.
* outputs: ``out`` -> ``[T, Hq, D]``; ``lse`` -> ``[T, Hq]`` natural log; rows FIA marks invalid
  (lse ``+-inf`` or ``|lse| >= 3e38``, IFA's ``-3.4e38``) and rows of empty requests become ours:
  ``out = 0``, ``lse = -inf``.

Not mapped (``unsupported`` says so): float32 queries, logits soft cap, int8 KV (FIA's antiquant
form is not checked against our ``(x - offset) * scale`` yet), page sizes over 512 or not a multiple
of 16, head dims not a multiple of 16, and TND cases (multi-query rows or a window) with D != 128.
"""

from __future__ import annotations

import numpy as np

from splitkv_common.inputs import DecodeInputs
from splitkv_common.npu_probe import npu_device, npu_op_unavailable
from splitkv_common.plan_layout import Plan
from splitkv_common.parity.registry import Backend

from .support import DEFAULT_PROFILE

MAX_BLOCK_SIZE = 512
MASK_SIZE = 2048          # sparse_mode 2/3/4 take this compressed (2048, 2048) mask
INVALID_LSE = 3.0e38      # |lse| at or above this (IFA writes -3.4e38; FIA docs: inf) is an empty row


# ---------------------------------------------------------------------------------------------
# What FIA can compute (documented constraints)
# ---------------------------------------------------------------------------------------------

def _needs_tnd(q_lens: np.ndarray, window_left) -> bool:
    return bool((q_lens != 1).any()) or window_left is not None


def fia_unsupported(inputs: DecodeInputs) -> str | None:
    d = int(inputs.q.shape[-1])
    page = int(inputs.k_cache.shape[1])
    if inputs.dtype not in ("float16", "bfloat16"):
        return f"q dtype {inputs.dtype}: FIA takes float16 / bfloat16 (or int8) queries"
    if inputs.soft_cap is not None:
        return "logits soft cap: FIA has none"
    if inputs.kv_dtype == "int8":
        return "int8 KV: FIA's antiquant form is not mapped to (x - offset) * scale yet"
    if page > MAX_BLOCK_SIZE or page % 16:
        return f"page size {page}: FIA's paged KV needs block_size <= {MAX_BLOCK_SIZE}, a multiple of 16"
    if d % 16:
        return f"head dim {d}: FIA needs D a multiple of 16 for 16-bit inputs"
    hq, hkv = inputs.q.shape[1], inputs.k_cache.shape[2]
    if hq > 256 or hq // hkv > 64:
        return f"heads {hq}/{hkv}: FIA takes N <= 256 and Hq/Hkv <= 64"
    if _needs_tnd(inputs.q_lens, inputs.window_left) and d != 128:
        return f"head dim {d}: multi-query rows or a window need FIA's TND layout, which takes D = 128 only"
    return None


# ---------------------------------------------------------------------------------------------
# The call, built without running it
# ---------------------------------------------------------------------------------------------

def causal_mask(device=None):
    """The compressed mask of sparse modes 2-4: ``(2048, 2048)`` bool, True above the diagonal (masked)."""
    import torch

    return torch.triu(torch.ones(MASK_SIZE, MASK_SIZE, dtype=torch.bool, device=device), diagonal=1)


def fia_call(q, k_cache, v_cache, block_table, seq_lens, query_start_loc, *, scale: float, window_left=None,
             mask=None) -> tuple[tuple, dict, dict]:
    """``(args, kwargs, layout)`` for ``npu_fused_infer_attention_score(*args, **kwargs)``.

    ``q [T, Hq, D]``; caches ``[P, page, Hkv, D]``; ``block_table [B, max_pages]``; ``seq_lens``
    and ``query_start_loc`` host int arrays. ``layout`` carries what :func:`convert_outputs`
    needs (``input_layout``, ``B``, ``T``).
    """
    import torch

    qsl = np.asarray(query_start_loc, np.int64)
    sl = [int(x) for x in np.asarray(seq_lens).reshape(-1)]
    q_lens = np.diff(qsl)
    T, hq, d = q.shape
    P, page, hkv, _ = k_cache.shape
    B = len(sl)
    kw = dict(
        block_table=block_table if block_table.dtype == torch.int32 else block_table.to(torch.int32),
        actual_seq_lengths_kv=sl, num_heads=int(hq), scale=float(scale), num_key_value_heads=int(hkv),
        block_size=int(page), softmax_lse_flag=True)
    key = k_cache.reshape(P, page, hkv * d)
    value = v_cache.reshape(P, page, hkv * d)
    if _needs_tnd(q_lens, window_left):
        kw.update(input_layout="TND", actual_seq_lengths=[int(x) for x in qsl[1:]],
                  atten_mask=causal_mask(q.device) if mask is None else mask)
        if window_left is not None:
            kw.update(sparse_mode=4, pre_tokens=int(window_left), next_tokens=0)
        else:
            kw.update(sparse_mode=3)
        query = q
    else:
        kw.update(input_layout="BSND", sparse_mode=0)
        query = q.reshape(B, 1, hq, d)
    return (query, key, value), kw, {"input_layout": kw["input_layout"], "B": B, "T": T, "qsl": qsl}


def convert_outputs(out, lse, layout: dict, seq_lens):
    """FIA's ``(out, lse)`` -> ours: ``out [T, Hq, D]``, ``lse [T, Hq]`` float32, empty rows 0 / -inf."""
    import torch

    T = layout["T"]
    if layout["input_layout"] == "BSND":       # out [B, 1, N, D], lse [B, N, 1, 1]
        out = out.reshape(T, out.shape[-2], out.shape[-1])
        lse = lse.reshape(T, -1)
        row_len = torch.as_tensor(np.asarray(seq_lens), device=out.device)
    else:                                       # TND: out [T, N, D], lse [T, N, 1]
        lse = lse.reshape(T, -1)
        row_len = torch.as_tensor(np.repeat(np.asarray(seq_lens), np.diff(layout["qsl"])), device=out.device)
    lse = lse.float()
    invalid = ~torch.isfinite(lse) | (lse.abs() >= INVALID_LSE)
    invalid |= (row_len == 0)[:, None]
    lse = lse.masked_fill(invalid, float("-inf"))
    out = out.masked_fill(invalid[..., None], 0)
    return out, lse


# ---------------------------------------------------------------------------------------------
# The backend
# ---------------------------------------------------------------------------------------------

def run_with(op, inputs: DecodeInputs, device="cpu"):
    """Run a case through ``op`` (the real FIA, or the tests' emulation of it); NumPy ``(out, lse)``."""
    from splitkv_common.torch_io import from_torch, to_torch

    t = to_torch(inputs, device)
    args, kwargs, layout = fia_call(t["q"], t["k_cache"], t["v_cache"], t["block_table"], inputs.seq_lens,
                                    inputs.query_start_loc, scale=inputs.scale, window_left=inputs.window_left)
    out, lse = op(*args, **kwargs)
    out, lse = convert_outputs(out, lse, layout, inputs.seq_lens)
    return from_torch(out, lse)


def run_cann_fia(inputs: DecodeInputs, plan: Plan):
    """The harness's ``run``: FIA plans its own split, so ``plan`` is not used."""
    import torch_npu

    return run_with(torch_npu.npu_fused_infer_attention_score, inputs, npu_device())


def cann_fia_unavailable() -> str | None:
    return npu_op_unavailable("npu_fused_infer_attention_score", "this torch_npu has no npu_fused_infer_attention_score")


cann_fia_backend = Backend(
    "cann-fia", run_cann_fia, unavailable=cann_fia_unavailable, unsupported=fia_unsupported, device=DEFAULT_PROFILE,
    description="CANN FusedInferAttentionScore through torch_npu (vLLM Ascend's decode op), converted to ours")
