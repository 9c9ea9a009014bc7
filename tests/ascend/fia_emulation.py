"""FusedInferAttentionScore without an NPU: its recorded signature and a torch emulation of its semantics.

Test helpers for the ``cann-fia`` backend (:mod:`ascend_ops.cann_fia`), whose call is built by the
pure function :func:`ascend_ops.cann_fia.fia_call`:

* :data:`FIA_SCHEMA`: ``torch_npu.npu_fused_infer_attention_score``'s signature, recorded from
  ``op_plugin/config/op_plugin_functions.yaml`` of ``Ascend/op-plugin`` at
  :data:`FIA_SCHEMA_SOURCE`; :func:`check_call` says whether a call binds to it.
* :func:`fake_fia`: what the docs (``aclnnFusedInferAttentionScoreV4.md`` of
  ``hicann/ops-transformer``) say FIA computes, for the paged BSND / TND cases ``fia_call`` builds;
  ``cann_fia.run_with(fake_fia, inputs)`` runs the whole mapping through it.
"""

from __future__ import annotations

import re

from ascend_ops.cann_fia import MASK_SIZE

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
INT_MAX = 2147483647


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


def fake_fia(query, key, value, *, atten_mask=None, actual_seq_lengths=None, actual_seq_lengths_kv=None,
             block_table=None, num_heads=1, scale=1.0, pre_tokens=INT_MAX, next_tokens=INT_MAX, input_layout="BSH",
             num_key_value_heads=0, sparse_mode=0, block_size=0, softmax_lse_flag=False, **unused):
    """What the docs say FIA computes, for the paged BSND / TND cases ``cann_fia.fia_call`` builds.

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
