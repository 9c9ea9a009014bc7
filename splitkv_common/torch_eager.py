"""Plain PyTorch eager split-then-merge decode attention, on any torch device.

No custom op and no kernel of ours: only stock tensor operations, so it runs wherever torch runs
(CPU here; an Ascend NPU through torch_npu without any extension; CUDA). It executes the shared
:class:`~splitkv_common.plan.Plan` vectorised over work items: gather each item's KV range through
the block table, compute the float32 partial state of every (query row, head) of the item, write
it to its slot, then merge each row's slots by the shared rule (:mod:`splitkv_common.merge`).

Importing this module requires torch; ``splitkv_common`` itself does not.
"""

from __future__ import annotations

import numpy as np
import torch

from .merge import check_merge_inputs
from .plan_layout import Plan

def _dequant(x: torch.Tensor, scale, offset, head: torch.Tensor) -> torch.Tensor:
    """Gathered cache rows ``[W, L, D]`` of KV heads ``head [W]`` -> float32; int8 uses
    ``(x - offset) * scale`` with scale/offset ``[Hkv]`` or ``[Hkv, D]``."""
    x = x.float()
    if scale is None:
        return x
    d = x.shape[-1]
    s = scale.to(x.device).float().reshape(scale.shape[0], -1).expand(-1, d)[head][:, None, :]
    if offset is not None:
        x = x - offset.to(x.device).float().reshape(offset.shape[0], -1).expand(-1, d)[head][:, None, :]
    return x * s


def merge_states(o: torch.Tensor, lse: torch.Tensor, dim: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Torch version of :func:`splitkv_common.merge.merge_states` (same rule, natural-log lse).

    ``o [..., S, ..., D]`` and ``lse`` with the split axis ``dim`` (counted on lse); ``+inf`` or
    ``-inf`` lse is an empty state (its ``o`` is ignored). A NaN lse, or a NaN / inf ``o`` of a
    non-empty state, makes the merged row NaN (as the NumPy merge). Returns float32 ``(out, lse)``
    without the split axis.
    """
    dim = check_merge_inputs(o.shape, lse.shape, dim, str(o.dtype), str(lse.dtype))  # the shared contract
    lse = lse.float()
    empty = torch.isinf(lse)
    lse_m = lse.masked_fill(empty, float("-inf"))
    m = lse_m.amax(dim=dim, keepdim=True)
    all_empty = torch.isinf(m)
    m_safe = m.masked_fill(all_empty, 0.0)
    w = torch.exp((lse_m - m_safe).masked_fill(empty, 0.0)).masked_fill(empty, 0.0)
    total = w.sum(dim=dim, keepdim=True)
    total_safe = total.masked_fill(all_empty, 1.0)
    o = o.float().masked_fill(empty.unsqueeze(-1), 0.0)  # an empty state's o never enters (NaN there is ignored)
    bad_o = (~torch.isfinite(o)).any(dim=dim)
    o = torch.where(torch.isfinite(o), o, torch.zeros_like(o))
    out = (w.unsqueeze(-1) * o).sum(dim=dim) / total_safe.squeeze(dim).unsqueeze(-1)
    out = out.masked_fill(bad_o, float("nan"))
    out_lse = (m_safe + torch.log(total_safe)).squeeze(dim).masked_fill(all_empty.squeeze(dim), float("-inf"))
    return out, out_lse


def plan_tensors(plan: Plan, device) -> dict[str, torch.Tensor]:
    """The plan's arrays as int64 tensors on ``device`` (valid work items only)."""
    n = plan.num_valid_items
    arrays = {
        "request": plan.item_request[:n], "kv_head": plan.item_kv_head[:n], "split": plan.item_split[:n],
        "start": plan.item_kv_start[:n], "end": plan.item_kv_end[:n],
        "row_slot_start": plan.row_slot_start, "row_num_splits": plan.row_num_splits,
        "query_start_loc": plan.query_start_loc,
    }
    return {k: torch.as_tensor(np.asarray(v, np.int64), device=device) for k, v in arrays.items()}


def _check_call(q, k_cache, v_cache, block_table, seq_lens, query_start_loc, plan: Plan, scale, soft_cap,
                window_left, quant: dict, validate) -> None:
    """The checks before any computation: scalars and the plan always (host data, cheap); the full
    shared checks (:func:`~splitkv_common.validation.check_decode_args`: shapes, dtypes, page ids
    a row would read, lengths) when the batch is on the host (``validate="auto"``) or when asked."""
    from .guards import check_validate
    from .validation import check_decode_args, check_scalars

    check_validate(validate)
    check_scalars(scale, soft_cap, window_left)
    tensors = dict(q=q, k_cache=k_cache, v_cache=v_cache, block_table=block_table, seq_lens=seq_lens,
                   query_start_loc=query_start_loc, **quant)
    for name, x in tensors.items():
        if x is not None and not isinstance(x, torch.Tensor):
            raise TypeError(f"{name}: expected a torch tensor, got {type(x).__name__}")
    on_host = all(x is None or x.device.type == "cpu" for x in tensors.values())
    if validate is True or (validate == "auto" and on_host):
        check_decode_args(q, k_cache, v_cache, block_table, seq_lens, query_start_loc, scale=scale, soft_cap=soft_cap,
                          window_left=window_left, backend="torch", **quant)
        plan.validate(seq_lens.cpu().numpy(), query_start_loc.cpu().numpy(), window_left=window_left,
                      num_kv_heads=k_cache.shape[2])
    elif validate is False:
        # internal callers (context-parallel shards): a partial plan and an upcast q are legal; the
        # plan's structure is still checked and out-of-range page ids are masked below
        plan.validate(window_left=window_left, num_kv_heads=k_cache.shape[2], batch_size=block_table.shape[0],
                      coverage=False)
    else:
        devs = {x.device for x in tensors.values() if x is not None}
        if len(devs) > 1:
            raise ValueError(f"q, k_cache, v_cache, block_table, seq_lens, query_start_loc: must be on one device, "
                             f"got {sorted(map(str, devs))}")
        if q.dim() != 3 or k_cache.dim() != 4 or tuple(v_cache.shape) != tuple(k_cache.shape):
            raise ValueError(f"q, k_cache, v_cache: must be [T, Hq, D] and [num_pages, page_size, Hkv, D] (equal), "
                             f"got {tuple(q.shape)}, {tuple(k_cache.shape)}, {tuple(v_cache.shape)}")
        plan.validate(window_left=window_left, num_kv_heads=k_cache.shape[2], batch_size=block_table.shape[0])
    if q.shape[0] != plan.num_rows:
        raise ValueError(f"plan: made for {plan.num_rows} query rows, q has {q.shape[0]}")
    if block_table.shape[0] != plan.batch_size:
        raise ValueError(f"plan: made for {plan.batch_size} requests, block_table has {block_table.shape[0]}")
    if k_cache.shape[1] != plan.page_size:
        raise ValueError(f"plan: made for page_size {plan.page_size}, k_cache has {k_cache.shape[1]}")


def decode_attention(q, k_cache, v_cache, block_table, seq_lens, query_start_loc, *, plan: Plan,
                     scale: float | None = None, soft_cap: float | None = None, window_left: int | None = None,
                     k_scale=None, v_scale=None, k_offset=None, v_offset=None,
                     return_partials: bool = False, validate="auto"):
    """Split-then-merge decode attention with stock torch ops.

    Args:
        q: ``[T, Hq, D]`` fp16/bf16/fp32. k_cache, v_cache: ``[num_pages, page_size, Hkv, D]``, q's
            dtype or int8 (then ``k_scale``/``v_scale`` float32 ``[Hkv]`` or ``[Hkv, D]``, offsets alike).
        block_table: int ``[B, max_pages]``; seq_lens: int ``[B]``; query_start_loc: int ``[B + 1]``.
        plan: the shared plan for this batch (checked with :meth:`Plan.validate`). scale defaults
            to ``1/sqrt(D)``.
        validate: ``"auto"`` (default): the full shared checks when every tensor is on the CPU (the
            data is on the host: an out-of-range page id a row would read is refused), metadata,
            scalar and plan checks only on a device (no host sync; there an out-of-range page id
            is masked: its positions count as invisible); ``True``: always the full checks;
            ``False`` (internal callers: context-parallel shards, whose plan covers part of each
            request and whose q may be upcast; the Ascend operator's CPU kernel, whose caller
            checked the arguments): the scalars and the plan's structure only.

    Isolation (``docs/conventions.md``): a lane only reads positions of its own request's
    ``[start, end)`` range, and values at positions a row cannot see never enter its arithmetic
    (selected away with ``torch.where``, not multiplied by 0). NaN or inf in the row's ``q`` or in
    a position it can see makes that row's ``out`` and ``lse`` NaN.

    Returns:
        ``out [T, Hq, D]`` in q's dtype and ``lse [T, Hq]`` float32 (natural log); with
        ``return_partials`` also the float32 partials ``(o [num_slots, Hq, D], lse [num_slots, Hq])``.
    """
    quant = dict(k_scale=k_scale, v_scale=v_scale, k_offset=k_offset, v_offset=v_offset)
    _check_call(q, k_cache, v_cache, block_table, seq_lens, query_start_loc, plan, scale, soft_cap, window_left,
                quant, validate)
    window_left = None if window_left is None or window_left < 0 else int(window_left)
    dev = q.device
    T, Hq, D = q.shape
    num_pages, page, Hkv, _ = k_cache.shape
    G = Hq // Hkv
    scale = float(D ** -0.5) if scale is None else float(scale)
    p = plan_tensors(plan, dev)
    po = torch.zeros(plan.num_slots, Hq, D, dtype=torch.float32, device=dev)
    pl = torch.full((plan.num_slots, Hq), float("-inf"), dtype=torch.float32, device=dev)
    qsl = query_start_loc.to(dev).long()
    q_lens = qsl[1:] - qsl[:-1]
    # only items with KV positions and query rows compute; the rest leave their slots empty (0, -inf).
    # Sizes come from the host plan: no host sync on a device.
    n = plan.num_valid_items
    h_len = (plan.item_kv_end[:n].astype(np.int64) - plan.item_kv_start[:n])
    h_ql = np.diff(plan.query_start_loc.astype(np.int64))[plan.item_request[:n]]
    h_live = (h_len > 0) & (h_ql > 0)
    W = int(h_live.sum())
    if W:
        live = torch.as_tensor(np.flatnonzero(h_live), device=dev)
        req, head, split = p["request"][live], p["kv_head"][live], p["split"][live]
        start, end = p["start"][live], p["end"][live]
        lens = end - start
        L = int(h_len[h_live].max())
        qmax = int(h_ql[h_live].max())
        lane = torch.arange(L, device=dev)
        in_range = lane[None, :] < lens[:, None]                                    # [W, L]
        # padding lanes read the item's own first position: never another request's page
        pos = start[:, None] + torch.where(in_range, lane[None, :], torch.zeros_like(lane)[None, :])
        bt = block_table.to(dev).long()
        pages = bt[req[:, None], pos // page]                                       # [W, L]
        page_ok = (pages >= 0) & (pages < num_pages)                                # refused on the host; masked here
        pages = torch.where(page_ok, pages, torch.zeros_like(pages))
        lane_ok = in_range & page_ok
        offs = pos % page
        hidx = head[:, None].expand(W, L)
        k = _dequant(k_cache[pages, offs, hidx], k_scale, k_offset, head)            # [W, L, D] float32
        v = _dequant(v_cache[pages, offs, hidx], v_scale, v_offset, head)
        bad_kv = ~(torch.isfinite(k).all(-1) & torch.isfinite(v).all(-1))           # [W, L]
        k = torch.where(torch.isfinite(k), k, torch.zeros_like(k))                  # invisible values never enter
        v = torch.where(torch.isfinite(v), v, torch.zeros_like(v))
        i = torch.arange(qmax, device=dev)
        row_ok = i[None, :] < q_lens[req][:, None]                                  # [W, Q]
        rows = torch.where(row_ok, qsl[req][:, None] + i[None, :], torch.zeros_like(i)[None, :])
        heads = head[:, None] * G + torch.arange(G, device=dev)[None, :]            # [W, G]
        qw = q[rows[:, :, None], heads[:, None, :]].float()                         # [W, Q, G, D]
        bad_q = ~torch.isfinite(qw).all(-1)                                         # [W, Q, G]
        qw = torch.where(torch.isfinite(qw), qw, torch.zeros_like(qw))
        s = torch.einsum("wqgd,wld->wqgl", qw, k) * scale
        if soft_cap is not None:
            s = soft_cap * torch.tanh(s / soft_cap)
        sl = seq_lens.to(dev).long()[req]
        qpos = sl[:, None] - q_lens[req][:, None] + i[None, :]                      # [W, Q]
        vis = lane_ok[:, None, :] & (pos[:, None, :] <= qpos[:, :, None]) & row_ok[:, :, None]
        if window_left is not None:
            vis &= pos[:, None, :] >= (qpos[:, :, None] - window_left)
        vis_rows = vis                                                              # [W, Q, L]
        vis = vis[:, :, None, :].expand_as(s)                                       # [W, Q, G, L]
        any_vis = vis.any(-1)
        m = torch.where(vis, s, torch.full_like(s, float("-inf"))).amax(-1)
        m = torch.where(any_vis, m, torch.zeros_like(m))                            # never -inf - -inf
        e = torch.where(vis, torch.exp(torch.where(vis, s, m[..., None]) - m[..., None]), torch.zeros_like(s))
        l = e.sum(-1)
        u = torch.einsum("wqgl,wld->wqgd", e, v)
        l_safe = torch.where(any_vis, l, torch.ones_like(l))
        o = torch.where(any_vis[..., None], u / l_safe[..., None], torch.zeros_like(u))
        lse_w = torch.where(any_vis, m + torch.log(l_safe), torch.full_like(m, float("-inf")))
        # NaN or inf in the row's q or in a position it sees: the row is NaN (docs/conventions.md)
        poisoned = any_vis & (bad_q | (vis_rows & bad_kv[:, None, :]).any(-1)[:, :, None])
        o = torch.where(poisoned[..., None], torch.full_like(o, float("nan")), o)
        lse_w = torch.where(poisoned, torch.full_like(lse_w, float("nan")), lse_w)
        slots = p["row_slot_start"][rows] + split[:, None]                          # [W, Q]
        sel = row_ok.nonzero(as_tuple=True)
        po[slots[sel][:, None], heads[sel[0]]] = o[sel]
        pl[slots[sel][:, None], heads[sel[0]]] = lse_w[sel]
    # merge: row t reads slots row_slot_start[t] + j, j < row_num_splits[t]
    if T == 0:
        out = torch.zeros(0, Hq, D, dtype=q.dtype, device=dev)
        lse = torch.zeros(0, Hq, dtype=torch.float32, device=dev)
        return (out, lse, (po, pl)) if return_partials else (out, lse)
    smax = max(int(plan.row_num_splits.max(initial=0)), 1)
    j = torch.arange(smax, device=dev)
    valid = j[None, :] < p["row_num_splits"][:, None]                               # [T, S]
    idx = torch.where(valid, p["row_slot_start"][:, None] + j[None, :], torch.zeros_like(j)[None, :])
    go = po[idx] if plan.num_slots else torch.zeros(T, smax, Hq, D, device=dev)
    gl = pl[idx] if plan.num_slots else torch.full((T, smax, Hq), float("-inf"), device=dev)
    gl = torch.where(valid[..., None], gl, torch.full_like(gl, float("-inf")))
    out, lse = merge_states(go, gl, dim=1)
    out = out.to(q.dtype)
    if return_partials:
        return out, lse, (po, pl)
    return out, lse
