"""``torch.ops.splitkv_ascend.decode_attention``: schema, registration, fake and CPU kernels, the call.

The operator is the kernels' contract, nothing more: the tensors the two Ascend C kernels read and
write, plus the host-side ``block_dim`` (see :data:`SCHEMA`). Everything decided per batch (the
shared :class:`~splitkv_common.plan.Plan`, scale, soft cap, window, tile sizes) travels in two
device buffers built on the host by :mod:`ascend_ops.tiling`: ``plan`` (int32 words) and
``tiling`` (one ``SplitKVTiling``, ``ascend_ops/kernel/splitkv_tiling.h``).

Kernels registered for the op:

* ``PrivateUse1`` (the ``npu`` device): **C++**, ``ascend_ops/csrc/binding.cpp``, in the library
  ``scripts/build_ascend.sh`` builds; :func:`ascend_ops.runtime.load_extension` loads it. It
  enqueues the split and combine kernels on the current NPU stream.
* ``CPU``: :func:`_cpu_kernel`, the same contract computed with stock torch ops
  (:func:`splitkv_common.torch_eager.decode_attention`) from the same ``plan``/``tiling`` bytes,
  and writing the partials in the kernels' workspace layout. It is the op's executable
  specification (tests, ``torch.library.opcheck``), not an NPU implementation.
* Fake (meta): checks shapes and dtypes, writes nothing, for ``torch.compile`` and aclgraph tracing.

The schema lives here only. The C++ library implements it without restating it; when it is loaded
the dispatcher checks its C++ signature against this schema.

Python API (the same as :mod:`cuda_ref`'s), in :mod:`ascend_ops.wrapper`: ``decode_attention``
(one call: validate, plan, run) and ``AscendDecodeWrapper`` (``plan()`` on the host, ``run()`` on
the device without host sync, aclgraph-capturable); this module imports neither. What is missing to run on an NPU, the
library and the device: :mod:`ascend_ops.runtime`. What the kernels take: :mod:`ascend_ops.support`.
"""

from __future__ import annotations

import numpy as np
import torch

from splitkv_common.device_errors import merge_records
from splitkv_common.plan_layout import Plan
from splitkv_common.torch_io import TORCH_DTYPES, torch_dtype_name

from .support import KV_QUANT_DTYPE, Q_DTYPES

NAMESPACE = "splitkv_ascend"
OP_NAME = "decode_attention"
QUALNAME = f"{NAMESPACE}::{OP_NAME}"

#: The operator's schema, the single definition (binding.cpp implements it).
SCHEMA = (
    "decode_attention(Tensor q, Tensor k_cache, Tensor v_cache, Tensor block_table, Tensor? kv_quant, "
    "Tensor plan, Tensor tiling, Tensor(a!) workspace, Tensor(b!) out, Tensor(c!) lse, int block_dim, "
    "int kernel=0) -> ()"
)
#: ``kernel``: which launch the tiling was built for (its ``kernelKind``): the vector-only split stage
#: then the combine on ``block_dim`` vector cores (two launches), or the fused mixed AIC + AIV launch
#: ``splitkv_attention_mix`` on ``block_dim`` AI cores (split, SyncAll, combine).
KERNEL_VECTOR, KERNEL_MIX = 0, 1

_Q_TORCH_DTYPES = tuple(TORCH_DTYPES[n] for n in Q_DTYPES)


# ---------------------------------------------------------------------------------------------
# The operator: definition, fake kernel, CPU kernel
# ---------------------------------------------------------------------------------------------

_LIB = torch.library.Library(NAMESPACE, "DEF")
_LIB.define(SCHEMA)


def _check_meta(q, k_cache, v_cache, block_table, kv_quant, plan, tiling, workspace, out, lse, block_dim,
                kernel=KERNEL_VECTOR):
    """Metadata checks shared by the fake and CPU kernels (binding.cpp makes the same ones)."""
    from . import tiling as tl

    if q.dim() != 3:
        raise ValueError(f"q: must be [T, Hq, D], got {tuple(q.shape)}")
    if k_cache.dim() != 4 or v_cache.shape != k_cache.shape or k_cache.shape[3] != q.shape[2]:
        raise ValueError(f"k_cache, v_cache: must be [num_pages, page_size, Hkv, {q.shape[2]}], "
                         f"got {tuple(k_cache.shape)} and {tuple(v_cache.shape)}")
    if q.dtype not in _Q_TORCH_DTYPES:
        raise TypeError(f"q: dtype must be float32, float16 or bfloat16, got {q.dtype}")
    if k_cache.dtype != v_cache.dtype or k_cache.dtype not in (q.dtype, TORCH_DTYPES[KV_QUANT_DTYPE]):
        raise TypeError(f"k_cache, v_cache: dtype must be q's or int8, got {k_cache.dtype}, {v_cache.dtype}")
    if k_cache.dtype == torch.int8 and kv_quant is None:
        raise ValueError("kv_quant: required with an int8 KV cache")
    if kv_quant is not None and (kv_quant.dtype != torch.float32
                                 or tuple(kv_quant.shape) != (4, k_cache.shape[2], q.shape[2])):
        raise ValueError(f"kv_quant: must be float32 [4, Hkv, D], got {kv_quant.dtype} {tuple(kv_quant.shape)}")
    if block_table.dtype != torch.int32 or block_table.dim() != 2:
        raise TypeError(f"block_table: must be int32 [B, max_pages], "
                        f"got {block_table.dtype} {tuple(block_table.shape)}")
    if plan.dtype != torch.int32 or plan.dim() != 1:
        raise TypeError(f"plan: must be 1-D int32 words, got {plan.dtype} {tuple(plan.shape)}")
    if tiling.dtype != torch.uint8 or tiling.numel() != tl.TILING_BYTES:
        raise TypeError(f"tiling: must be {tl.TILING_BYTES} uint8 bytes, got {tiling.dtype} x {tiling.numel()}")
    if workspace.dtype != torch.float32:
        raise TypeError(f"workspace: dtype must be float32, got {workspace.dtype}")
    if out.shape != q.shape or out.dtype != q.dtype:
        raise ValueError(f"out: must be {tuple(q.shape)} {q.dtype}, got {tuple(out.shape)} {out.dtype}")
    if lse.dtype != torch.float32 or tuple(lse.shape) != tuple(q.shape[:2]):
        raise ValueError(f"lse: must be float32 {tuple(q.shape[:2])}, got {lse.dtype} {tuple(lse.shape)}")
    if kv_quant is not None and k_cache.dtype != torch.int8:
        raise ValueError(f"kv_quant: only with an int8 KV cache (k_cache is {k_cache.dtype})")
    if not isinstance(block_dim, int) or isinstance(block_dim, bool) or not 0 < block_dim <= 65535:
        raise ValueError(f"block_dim: must be an int in [1, 65535], got {block_dim!r}")
    if kernel not in (KERNEL_VECTOR, KERNEL_MIX) or isinstance(kernel, bool):
        raise ValueError(f"kernel: must be {KERNEL_VECTOR} (vector split + combine) or {KERNEL_MIX} (fused mixed "
                         f"launch), got {kernel!r}")
    if kernel == KERNEL_MIX and (q.dtype not in (torch.float16, torch.bfloat16)
                                 or k_cache.dtype not in (q.dtype, torch.int8)):
        raise ValueError(f"kernel: the fused mixed launch takes float16 / bfloat16 q with KV of the same dtype or "
                         f"int8, got {q.dtype} / {k_cache.dtype}")
    named = dict(q=q, k_cache=k_cache, v_cache=v_cache, block_table=block_table, kv_quant=kv_quant, plan=plan,
                 tiling=tiling, workspace=workspace, out=out, lse=lse)
    for name, x in named.items():
        if x is None:
            continue
        if x.device != q.device:
            raise ValueError(f"{name}: on {x.device}, must be on q's device {q.device}")
        if not x.is_contiguous():
            raise ValueError(f"{name}: must be contiguous (the kernels address it densely)")


def _check_tiling(t: dict, q, k_cache, block_table, plan, workspace) -> None:
    """Where the tiling is on the host (the CPU kernel): the tensors agree with the sizes the kernels
    would trust (rows, heads, pages, buffer lengths). The NPU binding cannot read the device tiling
    without a sync: there the wrapper's checks against its host plan stand in."""
    from . import tiling as tl

    T, Hq, D = (int(x) for x in q.shape)
    P, page, Hkv, _ = (int(x) for x in k_cache.shape)
    B, max_pages = (int(x) for x in block_table.shape)
    for field, want, have, name in (("numRows", T, t["numRows"], "q"), ("numQHeads", Hq, t["numQHeads"], "q"),
                                    ("headDim", D, t["headDim"], "q"), ("numKVHeads", Hkv, t["numKVHeads"], "k_cache"),
                                    ("pageSize", page, t["pageSize"], "k_cache"), ("numPages", P, t["numPages"], "k_cache"),
                                    ("batch", B, t["batch"], "block_table"),
                                    ("maxPages", max_pages, t["maxPages"], "block_table")):
        if int(have) != want:
            raise ValueError(f"{name}: has {field} = {want}, the plan/tiling buffers were built for {int(have)} "
                             f"(plan again for this batch)")
    if t["qDtype"] != tl.DTYPE_CODES[torch_dtype_name(q.dtype)]:
        raise TypeError(f"q: dtype {q.dtype} is not the one the tiling was built for")
    need = 0
    for key, n in (("itemsOffset", 5 * int(t["numItems"])), ("qslOffset", B + 1), ("seqLensOffset", B),
                   ("rowSlotOffset", T), ("rowNumOffset", T)):
        need = max(need, int(t[key]) + n)
    if plan.numel() < need:
        raise ValueError(f"plan: {plan.numel()} words, the tiling's offsets need {need}")
    if workspace.numel() * 4 < int(t["workspaceBytes"]):
        raise ValueError(f"workspace: {workspace.numel() * 4} bytes, the tiling needs {int(t['workspaceBytes'])}")


@torch.library.register_fake(QUALNAME, lib=_LIB)
def _fake_kernel(q, k_cache, v_cache, block_table, kv_quant, plan, tiling, workspace, out, lse, block_dim,
                 kernel=KERNEL_VECTOR):
    _check_meta(q, k_cache, v_cache, block_table, kv_quant, plan, tiling, workspace, out, lse, block_dim, kernel)


def _cpu_kernel(q, k_cache, v_cache, block_table, kv_quant, plan, tiling, workspace, out, lse, block_dim,
                kernel=KERNEL_VECTOR):
    """The op's contract on CPU tensors, from the same ``plan`` and ``tiling`` the kernels read.

    It checks what the NPU kernel checks (:func:`_check_meta`, :func:`_check_tiling`) and the plan
    words' structure; the arguments' value checks are the caller's (``AscendDecodeWrapper.run``'s
    ``validate``), run once per call there, not again here."""
    from splitkv_common.torch_eager import decode_attention as eager

    from . import tiling as tl

    _check_meta(q, k_cache, v_cache, block_table, kv_quant, plan, tiling, workspace, out, lse, block_dim, kernel)
    t = tl.unpack_tiling(tiling.numpy().tobytes())
    _check_tiling(t, q, k_cache, block_table, plan, workspace)
    if int(t["kernelKind"]) != kernel:
        raise ValueError(f"kernel: {kernel}, but the tiling was built for kernelKind {int(t['kernelKind'])}")
    host_plan, seq_lens, qsl = plan_from_words(plan.numpy(), t)
    bad_lengths = None
    if int(t["deviceSplitTokens"]) > 0:   # graph mode: the work follows seqLens, as on the device
        seq_lens, bad_lengths = _device_lengths(t, seq_lens)
        host_plan = _graph_mode_plan(t, seq_lens, qsl)
    quant = {}
    if kv_quant is not None:
        quant = dict(k_scale=kv_quant[0], k_offset=kv_quant[1], v_scale=kv_quant[2], v_offset=kv_quant[3])
    o, lse_rows, (po, pl) = eager(q, k_cache, v_cache, block_table, torch.from_numpy(seq_lens),
                           torch.from_numpy(qsl), plan=host_plan, scale=float(t["scale"]),
                           soft_cap=float(t["softCap"]) if t["softCap"] > 0 else None,
                           window_left=int(t["windowLeft"]) if t["windowLeft"] >= 0 else None,
                           return_partials=True, validate=False, **quant)
    out.copy_(o)
    lse.copy_(lse_rows)
    # the workspace as the split stage leaves it: the error section (masked block-table reads and
    # graph mode's device lengths, counted as the kernels count them), o [numSlots, Hq, D], then
    # lse [numSlots, Hq, 8]
    ws = workspace.view(-1)
    found = [r for r in (_masked_reads(host_plan, block_table, int(t["pageSize"]), int(t["numPages"])), bad_lengths)
             if r is not None]
    if found:
        errors = ws[:tl.ERROR_SLOT_BYTES // 4].view(torch.int32)
        errors[:8].copy_(torch.tensor(merge_records([errors[:8].tolist(), *found]), dtype=torch.int32))
    o_at, n_o = tl.ERROR_BYTES // 4, po.numel()
    lse_at = int(t["lseOffsetBytes"]) // 4
    if ws.numel() >= lse_at + pl.numel() * 8 and ws.numel() >= o_at + n_o:
        ws[o_at:o_at + n_o].copy_(po.reshape(-1))
        ws[lse_at:lse_at + pl.numel() * 8].copy_(pl.unsqueeze(-1).expand(*pl.shape, 8).reshape(-1))


_LIB.impl(OP_NAME, _cpu_kernel, "CPU")


def plan_from_words(words: np.ndarray, t: dict) -> tuple[Plan, np.ndarray, np.ndarray]:
    """Rebuild ``(plan, seq_lens, query_start_loc)`` from the int32 plan buffer and its tiling fields."""
    words = np.asarray(words, np.int32)
    n_items, batch, rows = int(t["numItems"]), int(t["batch"]), int(t["numRows"])
    items = words[t["itemsOffset"]:t["itemsOffset"] + 5 * n_items].reshape(n_items, 5)
    qsl = words[t["qslOffset"]:t["qslOffset"] + batch + 1].copy()
    seq_lens = words[t["seqLensOffset"]:t["seqLensOffset"] + batch].copy()
    row_slot = words[t["rowSlotOffset"]:t["rowSlotOffset"] + rows].copy()
    row_num = words[t["rowNumOffset"]:t["rowNumOffset"] + rows].copy()
    valid = items[:, 0] >= 0
    n_valid = int(valid.sum())
    if not valid[:n_valid].all():
        raise ValueError("plan: padding items (request -1) must come after every valid item")
    counts = np.zeros(batch, np.int32)
    np.maximum.at(counts, items[valid, 0], items[valid, 2] + 1)
    p = Plan(item_request=items[:, 0].copy(), item_kv_head=items[:, 1].copy(), item_split=items[:, 2].copy(),
             item_kv_start=items[:, 3].copy(), item_kv_end=items[:, 4].copy(), num_valid_items=n_valid,
             num_splits=counts, query_start_loc=qsl, row_slot_start=row_slot, row_num_splits=row_num,
             num_slots=int(t["numSlots"]), num_kv_heads=int(t["numKVHeads"]), page_size=int(t["pageSize"]),
             policy=_policy_none(), split_tokens=0, graph_stable=n_valid < n_items, reason="rebuilt from plan words")
    return p, seq_lens, qsl


def _masked_reads(plan: Plan, block_table, page_size: int, num_pages: int) -> "list[int] | None":
    """The error record of the block-table entries outside ``[0, num_pages)`` that ``plan``'s work
    items read (one count per item and page, as the kernels count a page per tile copy of an
    item), None when there are none."""
    from splitkv_common.device_errors import ERROR_SLOTS

    bt = block_table.numpy()
    W = plan.num_valid_items
    b, a, e = (np.asarray(x[:W], np.int64) for x in (plan.item_request, plan.item_kv_start, plan.item_kv_end))
    live = e > a
    if not live.any():
        return None
    cols = [np.arange(lo // page_size, (hi - 1) // page_size + 1) for lo, hi in zip(a[live], e[live])]
    reqs = np.repeat(b[live], [c.size for c in cols])
    cols = np.concatenate(cols)
    ids = bt[reqs, cols]
    bad = np.flatnonzero((ids < 0) | (ids >= num_pages))
    if not bad.size:
        return None
    rec = [0] * ERROR_SLOTS
    k = bad[0]
    rec[0], rec[1], rec[2], rec[3] = int(bad.size), int(reqs[k]), int(cols[k]), int(ids[k])
    return rec


def _device_lengths(t: dict, seq_lens: np.ndarray) -> tuple[np.ndarray, "list[int] | None"]:
    """Graph mode's device lengths as the kernels take them: read within ``[0, min(block-table row,
    max_splits x device_split_tokens)]``, and the error record of those outside (request bits of
    ``splitkv_common.device_errors``), None when all are inside."""
    from splitkv_common.device_errors import ERROR_SLOTS

    row = int(t["maxPages"]) * int(t["pageSize"])
    plan_cap = int(t["maxSplits"]) * int(t["deviceSplitTokens"])
    lens = seq_lens.astype(np.int64)
    bits = (lens > row) * 1 | (lens < 0) * 2 | (lens > plan_cap) * 16
    bad = np.flatnonzero(bits)
    if not bad.size:
        return seq_lens, None
    rec = [0] * ERROR_SLOTS
    rec[4], rec[5], rec[6], rec[7] = int(np.bitwise_or.reduce(bits)), int(bad.size), int(bad[0]), int(bits[bad[0]])
    return np.clip(lens, 0, min(row, plan_cap)).astype(np.int32), rec


def _graph_mode_plan(t: dict, seq_lens: np.ndarray, qsl: np.ndarray) -> Plan:
    """The plan the kernels derive in graph mode (``deviceSplitTokens`` S): splits of S tokens, slots
    ``row * maxSplits + j`` (the same partials as the device grid; the window start is page-aligned
    here, which changes no output)."""
    from splitkv_common.planner import make_plan

    S, cap = int(t["deviceSplitTokens"]), int(t["maxSplits"])
    window = int(t["windowLeft"]) if t["windowLeft"] >= 0 else None
    lens = np.minimum(seq_lens.astype(np.int64), S * cap)
    return make_plan(lens, num_kv_heads=int(t["numKVHeads"]), page_size=int(t["pageSize"]), query_start_loc=qsl,
                     policy=f"size:{S}", graph_stable=True, max_splits=cap, window_left=window,
                     num_q_heads=int(t["numQHeads"]), head_dim=int(t["headDim"]),
                     max_work_items=int(t["batch"]) * int(t["numKVHeads"]) * cap)


def _policy_none():
    from splitkv_common.policies import SplitPolicy

    return SplitPolicy("none")


def decode_attention_op(q, k_cache, v_cache, block_table, kv_quant, plan, tiling, workspace, out, lse,
                        block_dim: int, kernel: int = KERNEL_VECTOR) -> None:
    """``torch.ops.splitkv_ascend.decode_attention``: fill ``out`` and ``lse`` (and ``workspace``)."""
    torch.ops.splitkv_ascend.decode_attention(q, k_cache, v_cache, block_table, kv_quant, plan, tiling, workspace,
                                              out, lse, block_dim, kernel)


def pack_kv_quant(k_scale, v_scale, k_offset=None, v_offset=None, *, num_kv_heads: int, head_dim: int,
                  device) -> "torch.Tensor | None":
    """float32 ``[4, Hkv, D]``: k scale, k offset, v scale, v offset (per head expanded per channel)."""
    if k_scale is None and v_scale is None:
        return None

    def full(x, fill):
        if x is None:
            return torch.full((num_kv_heads, head_dim), fill, dtype=torch.float32, device=device)
        return x.to(device=device, dtype=torch.float32).reshape(num_kv_heads, -1).expand(num_kv_heads, head_dim)

    return torch.stack([full(k_scale, 1.0), full(k_offset, 0.0), full(v_scale, 1.0), full(v_offset, 0.0)]).contiguous()
