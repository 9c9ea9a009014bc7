"""PyTorch custom ops: ``torch.ops.splitkv.decode_attention`` and ``torch.ops.splitkv.merge_states``.

Both are functional (they allocate their outputs), have fake implementations so ``torch.compile``
traces them without running a kernel, and pass ``torch.library.opcheck``. For allocation-free,
graph-captured decoding use :class:`cuda_ref.wrapper.DecodeWrapper` (``plan()`` / ``run()``).

* ``decode_attention(q, k_cache, v_cache, block_table, seq_lens, query_start_loc, plan_data,
  plan_shape, scale, soft_cap, window_left, k_scale, v_scale, k_offset, v_offset) -> (out, lse)``:
  ``plan_data`` is a :class:`~cuda_ref.plan_upload.DevicePlan`'s int32 buffer and ``plan_shape`` its sizes
  (:func:`plan_args` gives both); ``out [T, Hq, D]`` in q's dtype, ``lse [T, Hq]`` float32 natural log.
  ``plan_shape``'s optional ninth entry is the plan's most query rows per request (``0``: unknown):
  with ``1`` the kernel leaves out the loop for tiles whose rows see different positions (fewer
  registers; run 12, B64 x 2k: 131 against 163 µs), known from the host plan without a host sync. A
  plan whose requests have more rows than it says gets wrong results there (never a wild access).
  The optional tenth is the work-item count the kernel configuration is chosen for (``0``: the
  plan's items): a graph-stable plan's valid items rather than its padded capacity, as
  :class:`~cuda_ref.wrapper.DecodeWrapper` chooses (``DevicePlan.config_items``).
  Before the launch the real kernel checks every argument's metadata and the plan's sizes against
  the tensors (:func:`check_decode_op`: no host sync, cached per signature); the fake kernel checks
  nothing. The plan's values are not read on the host: the kernels bound every address by the
  tensors' sizes whatever they are (a wrong plan gives a wrong result, never a wild access).
* ``merge_states(o, lse) -> (out, lse)``: states of any backend stacked on the first axis,
  ``o [S, N, H, D]`` (any float dtype), ``lse [S, N, H]`` natural log (``-inf`` or ``+inf`` = empty);
  returns float32 ``out [N, H, D]`` and ``lse [N, H]`` (the rule of ``splitkv_common.merge``).
"""

from __future__ import annotations

from typing import Optional

import torch

from . import INTERPRET
from .checks import SignatureCache, call_guard, check_launch
from .launch import launch_decode, launch_merge
from .plan_upload import DevicePlan
from splitkv_common.merge import check_merge_inputs

_checked = SignatureCache(256)
# the last call that passed: (a call_guard of its tensors and scalars, plan_shape with its types); a call
# that passes both is the same signature, without building its key
_last: "tuple | None" = None


def check_decode_op(q, k_cache, v_cache, block_table, seq_lens, query_start_loc, plan_data, plan_shape, scale,
                    soft_cap=None, window_left=None, k_scale=None, v_scale=None, k_offset=None,
                    v_offset=None) -> None:
    """The real kernel's checks before any allocation or launch (metadata only, remembered per
    signature; a call like the last that passed costs one :func:`cuda_ref.checks.call_guard` of its
    tensors and scalars): :func:`cuda_ref.checks.check_launch`, ``plan_shape`` = ``[items, B, T, slots,
    max_splits, block_m, row_blocks, graph_stable[, max_q_len]]`` matching the tensors (``T`` q's rows, ``B``
    block_table's), ``plan_data`` a contiguous int32 buffer of exactly the plan's size on q's
    device. Raises ``TypeError`` / ``ValueError`` naming the argument."""
    global _last
    tensors = (q, k_cache, v_cache, block_table, seq_lens, query_start_loc, plan_data, k_scale, v_scale, k_offset,
               v_offset)
    try:
        shape = tuple((type(e), e) for e in plan_shape)
    except TypeError:   # plan_shape not a sequence: the checks below name it
        shape = None
    last = _last
    if last is not None and last[0](*tensors, scale, soft_cap, window_left) and last[1] == shape:
        return
    try:
        key = SignatureCache.key(tensors, (scale, soft_cap, window_left, tuple(plan_shape)))
    except (AttributeError, TypeError):
        key = None
    if key is not None and key in _checked:
        return
    check_launch(q, k_cache, v_cache, block_table, seq_lens, query_start_loc, k_scale=k_scale, v_scale=v_scale,
                 k_offset=k_offset, v_offset=v_offset, scale=scale, soft_cap=soft_cap, window_left=window_left)
    if scale is None:
        raise ValueError("scale: required by decode_attention, got None")
    if len(plan_shape) not in (8, 9, 10) or any(int(x) < 0 for x in plan_shape):
        raise ValueError(f"plan_shape: must be 8 to 10 sizes >= 0 (plan_args), got {list(plan_shape)}")
    n_items, B, T, n_slots, max_splits, block_m, row_blocks, stable = (int(x) for x in plan_shape[:8])
    if T != q.shape[0]:
        raise ValueError(f"q: the plan is for {T} query rows, q has {q.shape[0]}")
    if B != block_table.shape[0]:
        raise ValueError(f"block_table: the plan is for {B} requests, block_table has {block_table.shape[0]} rows")
    if block_m not in (16, 32, 64, 128) or row_blocks < 1:
        raise ValueError(f"plan_shape: block_m must be 16, 32, 64 or 128 and row_blocks >= 1, got {block_m}, "
                         f"{row_blocks}")
    if not isinstance(plan_data, torch.Tensor) or plan_data.dtype != torch.int32 or plan_data.dim() != 1 \
            or plan_data.device != q.device or (plan_data.numel() > 1 and plan_data.stride(0) != 1):
        raise ValueError("plan_data: must be a contiguous 1-D int32 tensor on q's device (plan_args)")
    need = sum(DevicePlan.sizes(n_items, B, T))
    if plan_data.numel() != need:
        raise ValueError(f"plan_data: {plan_data.numel()} entries, plan_shape {list(plan_shape)} needs {need}")
    if key is not None:
        _checked.add(key)
    if shape is not None:
        _last = (call_guard(len(tensors), *tensors, scale, soft_cap, window_left), shape)


def plan_args(dplan: DevicePlan) -> tuple[torch.Tensor, list[int]]:
    """``(plan_data, plan_shape)`` for :func:`decode_attention` from a device plan."""
    return dplan.data, [dplan.num_items, dplan.batch_size, dplan.num_rows, dplan.num_slots, dplan.max_splits,
                        dplan.block_m, dplan.row_blocks, int(dplan.graph_stable), dplan.max_q_len, dplan.config_items]


@torch.library.custom_op("splitkv::decode_attention", mutates_args=())
def decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_table: torch.Tensor,
                     seq_lens: torch.Tensor, query_start_loc: torch.Tensor, plan_data: torch.Tensor,
                     plan_shape: list[int], scale: float, soft_cap: Optional[float] = None,
                     window_left: Optional[int] = None, k_scale: Optional[torch.Tensor] = None,
                     v_scale: Optional[torch.Tensor] = None, k_offset: Optional[torch.Tensor] = None,
                     v_offset: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor]:
    check_decode_op(q, k_cache, v_cache, block_table, seq_lens, query_start_loc, plan_data, plan_shape, scale,
                    soft_cap, window_left, k_scale, v_scale, k_offset, v_offset)
    n_items, B, T, n_slots, max_splits, block_m, row_blocks, stable = plan_shape[:8]
    max_q_len = plan_shape[8] if len(plan_shape) > 8 else 0  # 0: unknown, the kernel handles several rows
    config_items = plan_shape[9] if len(plan_shape) > 9 else 0   # 0: n_items
    _, Hq, D = q.shape
    Hkv = k_cache.shape[2]
    dplan = DevicePlan(plan_data, n_items, B, T, n_slots, max_splits, block_m, row_blocks, bool(stable), max_q_len,
                       config_items=config_items)
    out = torch.empty_like(q)
    lse = torch.empty(q.shape[:2], dtype=torch.float32, device=q.device)
    part_o = torch.empty((max(n_slots, 1), Hq, D), dtype=torch.float32, device=q.device)
    part_lse = torch.empty((max(n_slots, 1), Hq), dtype=torch.float32, device=q.device)
    counters = torch.zeros(max(B * Hkv * row_blocks, 1), dtype=torch.int32, device=q.device)
    launch_decode(q, k_cache, v_cache, block_table, seq_lens, query_start_loc, dplan, out, lse, part_o, part_lse,
                  counters, scale=scale, soft_cap=soft_cap, window_left=window_left, k_scale=k_scale,
                  v_scale=v_scale, k_offset=k_offset, v_offset=v_offset, interpret=INTERPRET)
    return out, lse


@decode_attention.register_fake
def _(q, k_cache, v_cache, block_table, seq_lens, query_start_loc, plan_data, plan_shape, scale, soft_cap=None,
      window_left=None, k_scale=None, v_scale=None, k_offset=None, v_offset=None):
    return torch.empty_like(q), q.new_empty(q.shape[:2], dtype=torch.float32)


@torch.library.custom_op("splitkv::merge_states", mutates_args=())
def merge_states(o: torch.Tensor, lse: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    if o.dim() != 4:
        raise ValueError(f"o: must be [S, N, H, D] (states on axis 0), got shape {tuple(o.shape)}")
    check_merge_inputs(o.shape, lse.shape, 0, str(o.dtype), str(lse.dtype))   # the merges' shared contract
    S, N, H, D = o.shape
    if lse.device != o.device:
        raise ValueError(f"lse: on {lse.device}, expected {o.device} (o's device)")
    po = o.reshape(S * N, H, D)
    if po.stride(-1) != 1:
        po = po.contiguous()
    pl = lse.to(torch.float32).reshape(S * N, H)
    out = torch.empty((N, H, D), dtype=torch.float32, device=o.device)
    out_lse = torch.empty((N, H), dtype=torch.float32, device=o.device)
    rows = torch.arange(N, dtype=torch.int32, device=o.device)
    counts = torch.full((N,), S, dtype=torch.int32, device=o.device)
    launch_merge(po, pl, out, out_lse, rows, counts, slot_step=N)
    return out, out_lse


@merge_states.register_fake
def _(o, lse):
    S, N, H, D = o.shape
    return o.new_empty((N, H, D), dtype=torch.float32), o.new_empty((N, H), dtype=torch.float32)
