"""Harness backend ``atb-paged``: ATB's PagedAttention (``torch_npu._npu_paged_attention``) as a peer.

The op vLLM Ascend still calls for small decode batches in full-graph mode (FIA was slower there
before it gained split-KV decode). Its call is built by a pure function, :func:`atb_call`, so the
mapping is tested without an NPU (``tests/ascend/test_atb_paged.py``) against the op's recorded
signature and, end to end, against a fake op that checks the arguments and computes the float64
reference; only :func:`run_atb_paged` needs an NPU.

Sources (recorded, not run here):

* signature: ``Ascend/op-plugin``, ``op_plugin/ops/atb/PagedAttentionAtb.cpp`` (commit
  ``49a89f3b``): registered in the ``atb`` library, exposed as ``torch_npu._npu_paged_attention``;
  it writes ``out`` and returns nothing (no lse). The ATB parameters it sets: ``headNum``,
  ``qkScale``, ``kvHeadNum``, no mask, no quantisation, input layout BSND.
* semantics and constraints: the ``PagedAttentionOperation`` page of CANN's ATB API reference
  (ascendtb, CANN 8.0): query ``[num_tokens, num_heads, head_size]``, caches ``[num_blocks,
  block_size, kv_heads, head_size]``, ``blockTables [num_tokens, max_blocks]`` int32 with entries in
  ``[0, num_blocks)``, ``contextLens [num_tokens]`` int32 (KV tokens each query sees), output like
  the query; ``block_size % 16 == 0``, ``head_size`` in ``(0, 256]``, ``head_size * block_size <=
  128 * 128``; the scale is applied after ``Q K^T``.
* call site: vLLM Ascend's attention backend passes ``query``, the caches, ``num_kv_heads``,
  ``num_heads``, ``scale_value``, ``block_table``, ``context_lens=seq_lens`` and ``out`` by keyword,
  with ``seq_lens`` a host tensor (a public torch_npu test of the op passes ``context_lens`` from
  the CPU as well).

Mapping (ours -> ATB): one query row per request, so ``num_tokens = B``: ``query = q [B, Hq, D]``,
``key_cache``/``value_cache`` unchanged (our layout is the op's), ``block_table`` int32,
``context_lens = seq_lens`` int32 on the host, ``num_heads = Hq``, ``num_kv_heads = Hkv``,
``scale_value = scale``, ``out`` a new ``[B, Hq, D]`` tensor in q's dtype.

Not mapped (``unsupported`` says so, the harness skips the case with that reason): float32 q,
int8 KV (this binding sets no quantisation), logits soft cap and sliding window (the op has
neither), multi-query rows (one query per request: no causal tail), requests with no KV token
(undocumented), page sizes not a multiple of 16 or with ``page * D > 16384``, head dims over 256.
The op returns no lse: the harness judges ``out`` only for this backend.
"""

from __future__ import annotations

import numpy as np

from splitkv_common.inputs import DecodeInputs
from splitkv_common.npu_probe import npu_device, npu_op_unavailable
from splitkv_common.plan_layout import Plan
from splitkv_common.parity.registry import Backend

from .support import DEFAULT_PROFILE

#: The op's schema as registered (``TORCH_LIBRARY_FRAGMENT(atb, m)``), recorded from the source above.
ATB_SCHEMA_SOURCE = "Ascend/op-plugin @ 49a89f3b, op_plugin/ops/atb/PagedAttentionAtb.cpp"
ATB_SCHEMA = ("_npu_paged_attention(Tensor query, Tensor key_cache, Tensor value_cache, int num_kv_heads, "
              "int num_heads, float scale_value, Tensor block_table, Tensor context_lens, Tensor(a!) out) -> ()")
#: ``head_size * block_size`` must not exceed this (ATB PagedAttentionOperation, "hardware limit").
MAX_HEAD_TIMES_BLOCK = 128 * 128
MAX_HEAD_DIM = 256


def atb_unsupported(inputs: DecodeInputs) -> str | None:
    """None when ATB's PagedAttention computes this case as our conventions define it, else why not."""
    d = int(inputs.q.shape[-1])
    page = int(inputs.k_cache.shape[1])
    if inputs.dtype not in ("float16", "bfloat16"):
        return f"q dtype {inputs.dtype}: ATB PagedAttention takes float16 / bfloat16"
    if inputs.kv_dtype != inputs.dtype:
        return f"KV dtype {inputs.kv_dtype}: _npu_paged_attention sets no KV quantisation"
    if inputs.soft_cap is not None:
        return "logits soft cap: ATB PagedAttention has none"
    if inputs.window_left is not None:
        return "sliding window: ATB PagedAttention has none"
    if (np.asarray(inputs.q_lens) != 1).any():
        return "multi-query rows: ATB PagedAttention takes one query per request (no causal tail)"
    if (np.asarray(inputs.seq_lens) == 0).any():
        return "a request with no KV token: ATB PagedAttention's result is not documented"
    if page % 16:
        return f"page size {page}: ATB PagedAttention needs block_size % 16 == 0"
    if not 0 < d <= MAX_HEAD_DIM:
        return f"head dim {d}: ATB PagedAttention takes head_size in (0, {MAX_HEAD_DIM}]"
    if d * page > MAX_HEAD_TIMES_BLOCK:
        return f"head dim {d} x page size {page}: ATB PagedAttention needs head_size * block_size <= 16384"
    return None


def atb_call(q, k_cache, v_cache, block_table, seq_lens, *, scale: float, out=None) -> tuple[tuple, dict]:
    """``(args, kwargs)`` for ``_npu_paged_attention(*args, **kwargs)`` (keywords as vLLM Ascend passes them).

    ``q [B, Hq, D]`` (one row per request); caches ``[P, page, Hkv, D]``; ``block_table [B,
    max_pages]``; ``seq_lens`` host ints ``[B]``; ``out`` ``[B, Hq, D]`` in q's dtype (allocated
    when None). ``context_lens`` is an int32 CPU tensor, as vLLM Ascend passes it.
    """
    import torch

    T, hq, d = q.shape
    hkv = int(k_cache.shape[2])
    context_lens = torch.as_tensor(np.asarray(seq_lens, np.int64).reshape(-1), dtype=torch.int32)
    if out is None:
        out = torch.empty((T, hq, d), dtype=q.dtype, device=q.device)
    kw = dict(query=q, key_cache=k_cache, value_cache=v_cache, num_kv_heads=hkv, num_heads=int(hq),
              scale_value=float(scale),
              block_table=block_table if block_table.dtype == torch.int32 else block_table.to(torch.int32),
              context_lens=context_lens, out=out)
    return (), kw


def run_with(op, inputs: DecodeInputs, device="cpu"):
    """Run a case through ``op`` (the real op, or the tests' fake); NumPy ``(out [T, Hq, D] float32, None)``."""
    from splitkv_common.torch_io import to_torch

    why = atb_unsupported(inputs)
    if why:
        raise ValueError(f"atb-paged: {why}")
    t = to_torch(inputs, device)
    args, kwargs = atb_call(t["q"], t["k_cache"], t["v_cache"], t["block_table"], inputs.seq_lens, scale=inputs.scale)
    op(*args, **kwargs)
    return kwargs["out"].detach().float().cpu().numpy(), None


def run_atb_paged(inputs: DecodeInputs, plan: Plan):
    """The harness's ``run``: the op plans its own work, so ``plan`` is not used. No lse."""
    import torch_npu

    return run_with(torch_npu._npu_paged_attention, inputs, npu_device())


def atb_paged_unavailable() -> str | None:
    return npu_op_unavailable("_npu_paged_attention", "this torch_npu has no _npu_paged_attention (ATB ops not built in)")


atb_paged_backend = Backend(
    "atb-paged", run_atb_paged, unavailable=atb_paged_unavailable, unsupported=atb_unsupported,
    device=DEFAULT_PROFILE, extra={"lse": False},
    description="ATB PagedAttention through torch_npu._npu_paged_attention (vLLM Ascend's small-batch op; no lse)")
