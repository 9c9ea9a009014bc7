"""Shared-prefix decode with stock torch ops (any torch device): the ``torch`` route of
:mod:`splitkv_common.shared_prefix`.

Three steps, as every backend does them: the prefix stage (per group and work item of the prefix
plan, one batched matrix product of all the group's query rows x GQA heads against the item's K/V
range), the tails (:func:`splitkv_common.torch_eager.decode_attention` of the shifted batch, its
float32 partials kept), then each row's tail and prefix partials merged at once by the torch merge
(:func:`splitkv_common.torch_eager.merge_states`, the rule of :mod:`splitkv_common.merge`).

Importing this module requires torch; ``splitkv_common`` itself does not.
"""

from __future__ import annotations

import numpy as np
import torch

from . import torch_eager
from .shared_prefix import SharedPrefixPlan, check_shared_prefix, groups_as_shared_prefix


def tail_block_table(block_table: torch.Tensor, request_prefix, page_size: int) -> torch.Tensor:
    """``[B, max_pages]``: row ``b`` from column ``request_prefix[b] / page_size`` on, -1 padded; a
    gather on ``block_table``'s device (no host sync). ``request_prefix``: host ints ``[B]``."""
    B, W = block_table.shape
    shift = torch.as_tensor(np.asarray(request_prefix, np.int64) // page_size, device=block_table.device)
    col = torch.arange(W, device=block_table.device)[None, :] + shift[:, None]
    got = block_table.long().gather(1, col.clamp(max=max(W - 1, 0)))
    return torch.where(col < W, got, torch.full_like(got, -1)).to(block_table.dtype)


def decode_attention(q, k_cache, v_cache, block_table, seq_lens, query_start_loc, *, splan: SharedPrefixPlan,
                     scale: float | None = None, soft_cap: float | None = None, window_left: int | None = None,
                     k_scale=None, v_scale=None, k_offset=None, v_offset=None, validate="auto"):
    """Shared-prefix decode attention (see the module doc); the plain path when ``splan`` says so.

    Args:
        q ``[T, Hq, D]``, k_cache / v_cache ``[num_pages, page_size, Hkv, D]`` (q's dtype or int8 with
            ``k_scale`` / ``v_scale`` ``[Hkv]`` or ``[Hkv, D]``), block_table ``[B, max_pages]``,
            seq_lens ``[B]``, query_start_loc ``[B + 1]``: the batch, as :func:`torch_eager.decode_attention`.
        splan: the planner's :class:`~splitkv_common.shared_prefix.SharedPrefixPlan` for this batch.
        validate: as :func:`torch_eager.decode_attention`; on the host (``"auto"`` with CPU tensors, or
            ``True``) also :func:`~splitkv_common.shared_prefix.check_shared_prefix` against the block table.

    Returns ``out [T, Hq, D]`` in q's dtype and ``lse [T, Hq]`` float32 (natural log).
    """
    if not isinstance(splan, SharedPrefixPlan):
        raise TypeError(f"splan: expected a SharedPrefixPlan, got {type(splan).__name__}")
    quant = dict(k_scale=k_scale, v_scale=v_scale, k_offset=k_offset, v_offset=v_offset)
    scal = dict(scale=scale, soft_cap=soft_cap, window_left=window_left)
    if not splan.use_shared:
        return torch_eager.decode_attention(q, k_cache, v_cache, block_table, seq_lens, query_start_loc,
                                            plan=splan.plain, validate=validate, **scal, **quant)
    page = k_cache.shape[1]
    on_host = all(x.device.type == "cpu" for x in (q, block_table, seq_lens, query_start_loc))
    if validate is True or (validate == "auto" and on_host):
        check_shared_prefix(groups_as_shared_prefix(splan, page), seq_lens.cpu().numpy(),
                            query_start_loc.cpu().numpy(), page, block_table.cpu().numpy(), k_cache.shape[0])
    if block_table.shape[0] != splan.plain.batch_size or q.shape[0] != splan.plain.num_rows:
        raise ValueError(f"splan: made for {splan.plain.batch_size} requests and {splan.plain.num_rows} rows, the "
                         f"batch has {block_table.shape[0]} and {q.shape[0]}")
    dev = q.device
    req_prefix = torch.as_tensor(splan.groups.request_prefix, device=dev)
    bt_tail = tail_block_table(block_table.to(dev), splan.groups.request_prefix, page)
    seq_tail = (seq_lens.to(dev).long() - req_prefix).to(seq_lens.dtype)
    _, _, (to, tl) = torch_eager.decode_attention(q, k_cache, v_cache, bt_tail, seq_tail, query_start_loc,
                                                  plan=splan.tail, return_partials=True, validate=validate,
                                                  **scal, **quant)
    window_left = None if window_left is None or window_left < 0 else int(window_left)
    scale = float(q.shape[-1] ** -0.5) if scale is None else float(scale)
    po, pl = prefix_partials(q, k_cache, v_cache, splan, seq_lens, query_start_loc, scale=scale, soft_cap=soft_cap,
                             window_left=window_left, **quant)
    T, Hq, D = q.shape
    if T == 0:
        return torch.zeros(0, Hq, D, dtype=q.dtype, device=dev), torch.zeros(0, Hq, device=dev)
    # each row: its tail slots, then its prefix slots (-inf where it has none), one exact merge
    tp = splan.tail
    St = max(int(tp.row_num_splits.max(initial=1)), 1)
    j = torch.arange(St, device=dev)
    rs = torch.as_tensor(tp.row_slot_start.astype(np.int64), device=dev)
    rn = torch.as_tensor(tp.row_num_splits.astype(np.int64), device=dev)
    ok = j[None, :] < rn[:, None]
    idx = torch.where(ok, rs[:, None] + j[None, :], torch.zeros_like(j)[None, :])
    go = to[idx] if tp.num_slots else torch.zeros(T, St, Hq, D, device=dev)
    gl = torch.where(ok[..., None], tl[idx], torch.full_like(tl[idx], float("-inf"))) if tp.num_slots else \
        torch.full((T, St, Hq), float("-inf"), device=dev)
    Sp = po.shape[1]
    ao = torch.zeros(T, Sp, Hq, D, device=dev)
    al = torch.full((T, Sp, Hq), float("-inf"), device=dev)
    rows = torch.as_tensor(splan.prefix_rows.astype(np.int64), device=dev)
    ao[rows] = po
    al[rows] = pl
    out, lse = torch_eager.merge_states(torch.cat([go, ao], 1), torch.cat([gl, al], 1), dim=1)
    return out.to(q.dtype), lse


def prefix_partials(q, k_cache, v_cache, splan: SharedPrefixPlan, seq_lens, query_start_loc, *, scale: float,
                    soft_cap=None, window_left=None, k_scale=None, v_scale=None, k_offset=None, v_offset=None):
    """The prefix stage: float32 ``o [Tp, S, Hq, D]``, ``lse [Tp, S, Hq]`` for the prefix plan's rows
    (global rows ``splan.prefix_rows``), ``S = prefix.max_splits`` (unused slots ``0, -inf``).

    Per group, its work items at once: ``q`` of all the group's rows x the item's GQA heads against
    the item's K/V range (``[W, R, G, D] x [W, L, D]``). Positions a row cannot see (past the item,
    before its window) are selected away; NaN or inf in a row's q or in a position it sees makes it NaN."""
    pp, groups = splan.prefix, splan.groups
    dev = q.device
    T, Hq, D = q.shape
    num_pages, page, Hkv, _ = k_cache.shape
    G = Hq // Hkv
    Tp = int(pp.query_start_loc[-1])
    S = max(int(pp.row_num_splits.max(initial=1)), 1)
    po = torch.zeros(Tp, S, Hq, D, device=dev)
    pl = torch.full((Tp, S, Hq), float("-inf"), device=dev)
    qpos_all = None
    if window_left is not None:   # each row's position, on the device (no host sync)
        req = torch.as_tensor(splan.plain.row_request().astype(np.int64), device=dev)
        qsl = query_start_loc.to(dev).long()
        qpos_all = (seq_lens.to(dev).long()[req] - (qsl[1:] - qsl[:-1])[req]
                    + torch.arange(T, device=dev) - qsl[req])
    n = pp.num_valid_items
    pages_t = torch.as_tensor(groups.pages.astype(np.int64), device=dev)
    for g in range(groups.num_groups):
        sel = np.flatnonzero((pp.item_request[:n] == g) & (pp.item_kv_end[:n] > pp.item_kv_start[:n]))
        p0, p1 = int(pp.query_start_loc[g]), int(pp.query_start_loc[g + 1])
        if sel.size == 0 or p1 == p0:
            continue
        head = torch.as_tensor(pp.item_kv_head[sel].astype(np.int64), device=dev)
        split = torch.as_tensor(pp.item_split[sel].astype(np.int64), device=dev)
        start = torch.as_tensor(pp.item_kv_start[sel].astype(np.int64), device=dev)
        lens = torch.as_tensor((pp.item_kv_end[sel] - pp.item_kv_start[sel]).astype(np.int64), device=dev)
        W, L = sel.size, int(lens.max())
        lane = torch.arange(L, device=dev)
        in_range = lane[None, :] < lens[:, None]
        pos = start[:, None] + torch.where(in_range, lane[None, :], torch.zeros_like(lane)[None, :])   # [W, L]
        pages = pages_t[g][pos // page]
        hidx = head[:, None].expand(W, L)
        k = torch_eager._dequant(k_cache[pages, pos % page, hidx], k_scale, k_offset, head)             # [W, L, D]
        v = torch_eager._dequant(v_cache[pages, pos % page, hidx], v_scale, v_offset, head)
        bad_kv = ~(torch.isfinite(k).all(-1) & torch.isfinite(v).all(-1))
        k = torch.where(torch.isfinite(k), k, torch.zeros_like(k))
        v = torch.where(torch.isfinite(v), v, torch.zeros_like(v))
        rows = torch.as_tensor(splan.prefix_rows[p0:p1].astype(np.int64), device=dev)                  # [R]
        heads = head[:, None] * G + torch.arange(G, device=dev)[None, :]                                # [W, G]
        qw = q[rows[None, :, None], heads[:, None, :]].float()                                          # [W, R, G, D]
        bad_q = ~torch.isfinite(qw).all(-1)
        qw = torch.where(torch.isfinite(qw), qw, torch.zeros_like(qw))
        s = torch.einsum("wrgd,wld->wrgl", qw, k) * scale
        if soft_cap is not None:
            s = soft_cap * torch.tanh(s / soft_cap)
        vis = in_range[:, None, :].expand(W, rows.shape[0], L)                                          # [W, R, L]
        if window_left is not None:
            vis = vis & (pos[:, None, :] >= (qpos_all[rows][None, :, None] - window_left))
        vis_g = vis[:, :, None, :].expand_as(s)
        any_vis = vis_g.any(-1)
        m = torch.where(vis_g, s, torch.full_like(s, float("-inf"))).amax(-1)
        m = torch.where(any_vis, m, torch.zeros_like(m))
        e = torch.where(vis_g, torch.exp(torch.where(vis_g, s, m[..., None]) - m[..., None]), torch.zeros_like(s))
        l_safe = torch.where(any_vis, e.sum(-1), torch.ones_like(m))
        o = torch.where(any_vis[..., None], torch.einsum("wrgl,wld->wrgd", e, v) / l_safe[..., None],
                        torch.zeros(1, device=dev))
        lse = torch.where(any_vis, m + torch.log(l_safe), torch.full_like(m, float("-inf")))
        poisoned = any_vis & (bad_q | (vis & bad_kv[:, None, :]).any(-1)[:, :, None])
        o = torch.where(poisoned[..., None], torch.full_like(o, float("nan")), o)
        lse = torch.where(poisoned, torch.full_like(lse, float("nan")), lse)
        r = torch.arange(p0, p1, device=dev)
        po[r[None, :, None], split[:, None, None], heads[:, None, :]] = o
        pl[r[None, :, None], split[:, None, None], heads[:, None, :]] = lse
    return po, pl

