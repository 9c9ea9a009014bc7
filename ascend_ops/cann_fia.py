"""Harness backend ``cann-fia``: CANN's own FusedInferAttentionScore as a parity and speed peer.

Runs a case through ``torch_npu.npu_fused_infer_attention_score`` (the op vLLM Ascend's decode
calls) and converts its layouts and conventions to ours. The call is built by a pure function,
:func:`fia_call`, so its mapping is tested here against the op's recorded signature
(:data:`FIA_SCHEMA`) and, end to end, against :func:`fake_fia`, a torch emulation of the op's
documented semantics; only :func:`run_cann_fia` needs an NPU.

Sources (recorded, not run here):

* signature: ``op_plugin/config/op_plugin_functions.yaml`` of ``Ascend/op-plugin`` at
  :data:`FIA_SCHEMA_SOURCE`; output shapes from its meta registration
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

import re

import numpy as np

from splitkv_common.inputs import DecodeInputs
from splitkv_common.plan import Plan
from splitkv_common.parity.registry import Backend

FIA_SCHEMA_SOURCE = "Ascend/op-plugin @ 517f2e7d (2026-08-21), op_plugin/config/op_plugin_functions.yaml"
FIA_SCHEMA = (
    "npu_fused_infer_attention_score(Tensor query, Tensor key, Tensor value, *, Tensor? pse_shift=None, "
    "Tensor? atten_mask=None, SymInt[]? actual_seq_lengths=None, SymInt[]? actual_seq_lengths_kv=None, "
    "Tensor? dequant_scale1=None, Tensor? quant_scale1=None, Tensor? dequant_scale2=None, "
    "Tensor? quant_scale2=None, Tensor? quant_offset2=None, Tensor? antiquant_scale=None, "
    "Tensor? antiquant_offset=None, Tensor? key_antiquant_scale=None, Tensor? key_antiquant_offset=None, "
    "Tensor? value_antiquant_scale=None, Tensor? value_antiquant_offset=None, Tensor? block_table=None, "
    "Tensor? query_padding_size=None, Tensor? kv_padding_size=None, Tensor? key_shared_prefix=None, "
    "Tensor? value_shared_prefix=None, SymInt[]? actual_shared_prefix_len=None, Tensor? query_rope=None, "
    "Tensor? key_rope=None, Tensor? key_rope_antiquant_scale=None, int num_heads=1, float scale=1.0, "
    "int pre_tokens=2147483647, int next_tokens=2147483647, str input_layout=\"BSH\", "
    "int num_key_value_heads=0, int sparse_mode=0, int inner_precise=0, int block_size=0, "
    "int antiquant_mode=0, int key_antiquant_mode=0, int value_antiquant_mode=0, "
    "bool softmax_lse_flag=False) -> (Tensor, Tensor)"
)
MAX_BLOCK_SIZE = 512
MASK_SIZE = 2048          # sparse_mode 2/3/4 take this compressed (2048, 2048) mask
INT_MAX = 2147483647
INVALID_LSE = 3.0e38      # |lse| at or above this (IFA writes -3.4e38; FIA docs: inf) is an empty row


def parse_schema(schema: str = FIA_SCHEMA) -> dict[str, dict]:
    """``{name: {"type", "default", "kwarg_only"}}`` of an ATen-style schema string."""
    args = schema[schema.index("(") + 1: schema.rindex(") ->")]
    out, kw_only = {}, False
    for part in re.split(r",\s*(?![^\[]*\])", args):
        part = part.strip()
        if part == "*":
            kw_only = True
            continue
        decl, _, default = part.partition("=")
        typ, name = decl.rsplit(" ", 1)
        out[name] = {"type": typ.strip(), "default": default.strip() or None, "kwarg_only": kw_only}
    return out


def _check_value(name: str, typ: str, value) -> str | None:
    import torch

    if value is None:
        return None if typ.endswith("?") else f"{name}: {typ} cannot be None"
    base = typ.rstrip("?")
    ok = {"Tensor": lambda v: isinstance(v, torch.Tensor),
          "SymInt[]": lambda v: isinstance(v, (list, tuple)) and all(isinstance(x, int) for x in v),
          "int": lambda v: isinstance(v, int) and not isinstance(v, bool),
          "float": lambda v: isinstance(v, float),
          "str": lambda v: isinstance(v, str),
          "bool": lambda v: isinstance(v, bool)}[base](value)
    return None if ok else f"{name}: expected {typ}, got {type(value).__name__}"


def check_call(args: tuple, kwargs: dict, schema: str = FIA_SCHEMA) -> list[str]:
    """Problems of a call against the schema (empty list: it binds)."""
    params = parse_schema(schema)
    positional = [n for n, p in params.items() if not p["kwarg_only"]]
    problems = []
    if len(args) != len(positional):
        problems.append(f"expected {len(positional)} positional arguments, got {len(args)}")
    for n, v in zip(positional, args):
        problems += [p for p in [_check_value(n, params[n]["type"], v)] if p]
    for n, v in kwargs.items():
        if n not in params or not params[n]["kwarg_only"]:
            problems.append(f"{n}: not a keyword argument of the op")
        else:
            problems += [p for p in [_check_value(n, params[n]["type"], v)] if p]
    return problems


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
# A torch emulation of the documented semantics (tests run the mapping through it)
# ---------------------------------------------------------------------------------------------

def fake_fia(query, key, value, *, atten_mask=None, actual_seq_lengths=None, actual_seq_lengths_kv=None,
             block_table=None, num_heads=1, scale=1.0, pre_tokens=INT_MAX, next_tokens=INT_MAX, input_layout="BSH",
             num_key_value_heads=0, sparse_mode=0, block_size=0, softmax_lse_flag=False, **unused):
    """What the docs say FIA computes, for the paged BSND / TND cases :func:`fia_call` builds.

    Visibility of query ``i`` of a request with ``q`` rows and ``kv`` keys: ``sparse_mode`` 0
    without mask: all ``kv``; 3 (right-down causal): ``p <= kv - q + i``; 4 (band, right-down
    aligned): ``kv - q + i - pre_tokens <= p <= kv - q + i + next_tokens``. Rows with nothing
    visible: out 0, lse ``+inf`` (the docs' "inf marks invalid data").
    """
    import torch

    if any(v is not None for k, v in unused.items() if k.endswith(("scale", "offset", "rope", "prefix", "_size"))):
        raise NotImplementedError(f"fake_fia: unsupported arguments {sorted(unused)}")
    if block_table is None or not block_size:
        raise NotImplementedError("fake_fia: paged KV only")
    hkv = num_key_value_heads or num_heads
    g = num_heads // hkv
    P, page, H = key.shape
    d = H // hkv
    kc, vc = key.reshape(P, page, hkv, d).float(), value.reshape(P, page, hkv, d).float()
    if input_layout == "BSND":
        B = query.shape[0]
        q = query.reshape(B, num_heads, d)
        qsl = list(range(B + 1))
    elif input_layout == "TND":
        ends = list(actual_seq_lengths)
        B = len(ends)
        qsl = [0] + ends
        q = query
    else:
        raise NotImplementedError(f"fake_fia: layout {input_layout}")
    if sparse_mode in (2, 3, 4) and (atten_mask is None or tuple(atten_mask.shape[-2:]) != (MASK_SIZE, MASK_SIZE)):
        raise ValueError("sparse_mode 2/3/4 need the (2048, 2048) compressed mask")
    out = torch.zeros(q.shape, dtype=query.dtype)
    lse = torch.full((q.shape[0], num_heads), float("inf"))
    for b in range(B):
        kv = int(actual_seq_lengths_kv[b])
        rows = range(qsl[b], qsl[b + 1])
        nq = len(rows)
        if kv == 0 or nq == 0:
            continue
        pos = torch.arange(kv)
        pages = block_table[b, pos // page].long()
        k = kc[pages, pos % page]                      # [kv, hkv, d]
        v = vc[pages, pos % page]
        for i, t in enumerate(rows):
            diag = kv - nq + i
            if sparse_mode == 0:
                vis = torch.ones(kv, dtype=torch.bool)
            elif sparse_mode == 3:
                vis = pos <= diag
            elif sparse_mode == 4:
                vis = (pos >= diag - pre_tokens) & (pos <= diag + next_tokens)
            else:
                raise NotImplementedError(f"fake_fia: sparse_mode {sparse_mode}")
            if not vis.any():
                continue
            for h in range(num_heads):
                s = (k[:, h // g] @ q[t, h].float()) * scale
                s = s.masked_fill(~vis, float("-inf"))
                m = s.max()
                e = torch.exp(s - m)
                out[t, h] = ((e @ v[:, h // g]) / e.sum()).to(query.dtype)
                lse[t, h] = m + torch.log(e.sum())
    if input_layout == "BSND":
        out = out.reshape(B, 1, num_heads, d)
        lse = lse.reshape(B, num_heads, 1, 1)
    else:
        lse = lse.reshape(-1, num_heads, 1)
    if not softmax_lse_flag:
        lse = torch.zeros(1)
    return out, lse


# ---------------------------------------------------------------------------------------------
# The backend
# ---------------------------------------------------------------------------------------------

def run_with(op, inputs: DecodeInputs, device="cpu"):
    """Run a case through ``op`` (the real FIA or :func:`fake_fia`); NumPy ``(out, lse)``."""
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

    from .ops import npu_device

    return run_with(torch_npu.npu_fused_infer_attention_score, inputs, npu_device())


def cann_fia_unavailable() -> str | None:
    try:
        from .ops import npu_unavailable
    except Exception as e:  # noqa: BLE001
        return f"torch is not usable ({type(e).__name__}: {e})"
    why = npu_unavailable()
    if why:
        return why
    import torch_npu

    if not hasattr(torch_npu, "npu_fused_infer_attention_score"):
        return "this torch_npu has no npu_fused_infer_attention_score"
    return None


cann_fia_backend = Backend(
    "cann-fia", run_cann_fia, unavailable=cann_fia_unavailable, unsupported=fia_unsupported, device="910b2",
    description="CANN FusedInferAttentionScore through torch_npu (vLLM Ascend's decode op), converted to ours")
