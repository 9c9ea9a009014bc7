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

from .plan import Plan

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
    ``-inf`` lse is an empty state. Returns float32 ``(out, lse)`` without the split axis.
    """
    lse = lse.float()
    dim = dim % lse.dim()  # counted on lse: a negative dim must not land on o's last (D) axis
    empty = torch.isinf(lse)
    lse_m = lse.masked_fill(empty, float("-inf"))
    m = lse_m.amax(dim=dim, keepdim=True)
    all_empty = torch.isinf(m)
    m_safe = m.masked_fill(all_empty, 0.0)
    w = torch.exp((lse_m - m_safe).masked_fill(empty, 0.0)).masked_fill(empty, 0.0)
    total = w.sum(dim=dim, keepdim=True)
    total_safe = total.masked_fill(all_empty, 1.0)
    o = o.float().masked_fill(empty.unsqueeze(-1), 0.0)
    out = (w.unsqueeze(-1) * o).sum(dim=dim) / total_safe.squeeze(dim).unsqueeze(-1)
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


def decode_attention(q, k_cache, v_cache, block_table, seq_lens, query_start_loc, *, plan: Plan,
                     scale: float | None = None, soft_cap: float | None = None, window_left: int | None = None,
                     k_scale=None, v_scale=None, k_offset=None, v_offset=None,
                     return_partials: bool = False):
    """Split-then-merge decode attention with stock torch ops.

    Args:
        q: ``[T, Hq, D]`` fp16/bf16/fp32. k_cache, v_cache: ``[num_pages, page_size, Hkv, D]``, q's
            dtype or int8 (then ``k_scale``/``v_scale`` float32 ``[Hkv]`` or ``[Hkv, D]``, offsets alike).
        block_table: int ``[B, max_pages]``; seq_lens: int ``[B]``; query_start_loc: int ``[B + 1]``.
        plan: the shared plan for this batch. scale defaults to ``1/sqrt(D)``.

    Returns:
        ``out [T, Hq, D]`` in q's dtype and ``lse [T, Hq]`` float32 (natural log); with
        ``return_partials`` also the float32 partials ``(o [num_slots, Hq, D], lse [num_slots, Hq])``.
    """
    dev = q.device
    T, Hq, D = q.shape
    _, page, Hkv, _ = k_cache.shape
    G = Hq // Hkv
    scale = float(D ** -0.5) if scale is None else float(scale)
    p = plan_tensors(plan, dev)
    W = plan.num_valid_items
    po = torch.zeros(plan.num_slots, Hq, D, dtype=torch.float32, device=dev)
    pl = torch.full((plan.num_slots, Hq), float("-inf"), dtype=torch.float32, device=dev)
    qsl = query_start_loc.to(dev).long()
    if W:
        req, head, split = p["request"], p["kv_head"], p["split"]
        lens = (p["end"] - p["start"]).clamp(min=0)
        L = max(int(lens.max()), 1)
        q_lens = qsl[1:] - qsl[:-1]
        qmax = max(int(q_lens.max()), 1) if q_lens.numel() else 1
        pos = p["start"][:, None] + torch.arange(L, device=dev)[None, :]            # [W, L]
        in_range = torch.arange(L, device=dev)[None, :] < lens[:, None]
        pos_c = torch.where(in_range, pos, torch.zeros_like(pos))
        bt = block_table.to(dev).long()
        pages = bt[req[:, None], pos_c // page]                                     # [W, L]
        pages = torch.where(in_range, pages, torch.zeros_like(pages))
        offs = pos_c % page
        hidx = head[:, None].expand(W, L)
        k = _dequant(k_cache[pages, offs, hidx], k_scale, k_offset, head)            # [W, L, D] float32
        v = _dequant(v_cache[pages, offs, hidx], v_scale, v_offset, head)
        i = torch.arange(qmax, device=dev)
        row_ok = i[None, :] < q_lens[req][:, None]                                  # [W, Q]
        rows = torch.where(row_ok, qsl[req][:, None] + i[None, :], torch.zeros_like(i)[None, :])
        heads = head[:, None] * G + torch.arange(G, device=dev)[None, :]            # [W, G]
        qw = q[rows[:, :, None], heads[:, None, :]].float()                         # [W, Q, G, D]
        s = torch.einsum("wqgd,wld->wqgl", qw, k) * scale
        if soft_cap is not None:
            s = soft_cap * torch.tanh(s / soft_cap)
        sl = seq_lens.to(dev).long()[req]
        qpos = sl[:, None] - q_lens[req][:, None] + i[None, :]                      # [W, Q]
        vis = in_range[:, None, :] & (pos[:, None, :] <= qpos[:, :, None]) & row_ok[:, :, None]
        if window_left is not None and window_left >= 0:
            vis &= pos[:, None, :] >= (qpos[:, :, None] - window_left)
        vis = vis[:, :, None, :].expand_as(s)                                       # [W, Q, G, L]
        any_vis = vis.any(-1)
        m = torch.where(vis, s, torch.full_like(s, float("-inf"))).amax(-1)
        m = torch.where(any_vis, m, torch.zeros_like(m))                            # never -inf - -inf
        e = torch.where(vis, torch.exp(torch.where(vis, s, torch.zeros_like(s)) - m[..., None]), torch.zeros_like(s))
        l = e.sum(-1)
        u = torch.einsum("wqgl,wld->wqgd", e, v)
        l_safe = torch.where(any_vis, l, torch.ones_like(l))
        o = torch.where(any_vis[..., None], u / l_safe[..., None], torch.zeros_like(u))
        lse_w = torch.where(any_vis, m + torch.log(l_safe), torch.full_like(m, float("-inf")))
        slots = p["row_slot_start"][rows] + split[:, None]                          # [W, Q]
        sel = row_ok.nonzero(as_tuple=True)
        po[slots[sel][:, None], heads[sel[0]]] = o[sel]
        pl[slots[sel][:, None], heads[sel[0]]] = lse_w[sel]
    # merge: row t reads slots row_slot_start[t] + j, j < row_num_splits[t]
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
