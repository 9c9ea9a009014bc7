"""Triton kernels of split-KV decode attention (see ``docs/triton.md``).

Two kernels, each readable top to bottom:

* :func:`split_kv_kernel` (stage 1): one program per work item of the shared plan and block of
  packed query rows. A work item is (request, KV head, ``[start, end)`` range of logical KV
  positions); its program packs every query row of the request times every query head of the KV
  head's GQA group into the ``M`` dimension of a ``tl.dot`` tile, walks the range in tiles of
  ``BLOCK_N`` tokens through the block table (one table entry per token, so a tile may span
  several pages), and keeps an online softmax in float32:

      s = scale * q.k   (then cap * tanh(s / cap) with a soft cap)
      m' = max(m, max_n s);  l' = l * exp(m - m') + sum_n exp(s - m');  u' = u * exp(m - m') + exp(s - m') v

  It writes the split's state ``o = u / l``, ``lse = m + log(l)`` (natural log) to the partial slot
  ``row_slot_start[t] + split``, or, when the request has a single split, the final output row
  directly. A row with no visible position gets ``o = 0, lse = -inf``; the exponentials use a finite
  reference ``m`` so ``exp(-inf - -inf)`` is never computed.

  With ``FUSE_MERGE`` the program that finishes last among the splits of a (request, KV head, row
  block) merges them in slot order (so the result does not depend on which program is last) and
  resets its counter to zero, leaving the counters ready for the next launch or graph replay.

* :func:`merge_kernel` (stage 2): one program per (output row, block of heads); merges the row's
  partial states in slot order with the exact rule of ``splitkv_common.merge``
  (``m = max lse``, ``w = exp(lse - m)``, ``out = sum w o / sum w``, ``lse = m + log sum w``).
  ``lse = +inf`` on input is read as empty. Rows with a single split are skipped when stage 1 wrote
  them directly.

All scores are kept in base 2 inside the loop (``exp2`` is the fast instruction); lse is converted to
natural log when stored.
"""

from __future__ import annotations

import triton
import triton.language as tl

LOG2E = tl.constexpr(1.4426950408889634)
LN2 = tl.constexpr(0.6931471805599453)


@triton.jit
def _load_tile(ptr, page, pos, end, head_off, stride_p, stride_t, offs_d, d_ok, PAGE: tl.constexpr):
    """Raw ``[BLOCK_N, BLOCK_D]`` tile of K or V: token ``pos`` lives in ``page`` at slot ``pos % PAGE``."""
    tok = page * stride_p + (pos % PAGE).to(tl.int64) * stride_t + head_off
    mask = (pos < end)[:, None] & d_ok[None, :]
    return tl.load(ptr + tok[:, None] + offs_d[None, :], mask=mask, other=0)


@triton.jit
def _dequant(x, scale_ptr, offset_ptr, s_stride_d, offs_d, d_ok,
             KV_INT8: tl.constexpr, HAS_OFFSET: tl.constexpr, UPCAST: tl.constexpr):
    """int8 -> float32 as ``(x - offset) * scale`` (per KV head: ``s_stride_d = 0``; or per channel);
    float tiles stay as they are (float32 in the interpreter)."""
    if KV_INT8:
        sc = tl.load(scale_ptr + offs_d * s_stride_d, mask=d_ok, other=0.0)
        xf = x.to(tl.float32)
        if HAS_OFFSET:
            off = tl.load(offset_ptr + offs_d * s_stride_d, mask=d_ok, other=0.0)
            xf = xf - off[None, :]
        x = xf * sc[None, :]
    elif UPCAST:
        x = x.to(tl.float32)
    return x


@triton.jit
def split_kv_kernel(
    Q, K, V, BLOCK_TABLE, SEQ_LENS, QUERY_START,
    ITEM_REQ, ITEM_HEAD, ITEM_SPLIT, ITEM_START, ITEM_END,
    NUM_SPLITS, ROW_SLOT,
    PART_O, PART_LSE, OUT, OUT_LSE, COUNTERS,
    K_SCALE, V_SCALE, K_OFFSET, V_OFFSET,
    qk_scale, soft_cap, window_left,
    stride_qt, stride_qh,
    stride_kp, stride_kt, stride_kh,
    stride_vp, stride_vt, stride_vh,
    stride_bt,
    stride_ps, stride_ph, stride_ls, stride_lh,
    stride_ot, stride_oh, stride_lot, stride_loh,
    stride_sh, stride_sd,
    NUM_KV_HEADS,
    GROUP: tl.constexpr, PAGE: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    KV_INT8: tl.constexpr, HAS_OFFSET: tl.constexpr, SOFT_CAP: tl.constexpr, HAS_WINDOW: tl.constexpr,
    DOT_IEEE: tl.constexpr, UPCAST: tl.constexpr, FUSE_MERGE: tl.constexpr, PREFETCH: tl.constexpr,
):
    item = tl.program_id(0)
    mblock = tl.program_id(1)
    b = tl.load(ITEM_REQ + item)
    if b < 0:  # padding item of a graph-stable plan
        return
    h = tl.load(ITEM_HEAD + item)
    split = tl.load(ITEM_SPLIT + item)
    start = tl.load(ITEM_START + item)
    end = tl.load(ITEM_END + item)
    seq_len = tl.load(SEQ_LENS + b)
    r0 = tl.load(QUERY_START + b)
    q_len = tl.load(QUERY_START + b + 1) - r0
    n_split = tl.load(NUM_SPLITS + b)
    if mblock * BLOCK_M >= q_len * GROUP:  # this request has fewer packed rows than the grid
        return

    # -- packed query rows: m -> (query row i, head g of the group) --------------------------
    offs_m = mblock * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    i = offs_m // GROUP
    g = offs_m % GROUP
    row_ok = i < q_len
    t = r0 + i
    hq = h * GROUP + g
    d_ok = offs_d < HEAD_DIM
    q_ptr = Q + t.to(tl.int64)[:, None] * stride_qt + hq[:, None] * stride_qh + offs_d[None, :]
    q = tl.load(q_ptr, mask=row_ok[:, None] & d_ok[None, :], other=0.0)
    if UPCAST or KV_INT8 or DOT_IEEE:
        q = q.to(tl.float32)
    q_pos = seq_len - q_len + i  # logical position of each query row: it sees p <= q_pos

    k_scale_ptr = K_SCALE + h * stride_sh
    v_scale_ptr = V_SCALE + h * stride_sh
    k_off_ptr = K_OFFSET + h * stride_sh
    v_off_ptr = V_OFFSET + h * stride_sh

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    bt_row = BLOCK_TABLE + b.to(tl.int64) * stride_bt

    # The block-table entries of a tile are loaded one tile ahead, so the K / V gather of a tile never
    # waits on its own page lookup. With PREFETCH the K / V tiles are also loaded one tile ahead (in
    # registers: more bytes in flight, more registers); without it a tile's K and V loads are issued
    # together at the top of the iteration.
    k_head = h.to(tl.int64) * stride_kh
    v_head = h.to(tl.int64) * stride_vh
    pos = start + offs_n
    page = tl.load(bt_row + pos // PAGE, mask=pos < end, other=0).to(tl.int64)
    if PREFETCH:
        k_raw = _load_tile(K, page, pos, end, k_head, stride_kp, stride_kt, offs_d, d_ok, PAGE)
        v_raw = _load_tile(V, page, pos, end, v_head, stride_vp, stride_vt, offs_d, d_ok, PAGE)
    pos_next = pos + BLOCK_N
    page_next = tl.load(bt_row + pos_next // PAGE, mask=pos_next < end, other=0).to(tl.int64)

    for n0 in range(start, end, BLOCK_N):
        # -- issue the loads: this tile's K / V (or the next one's with PREFETCH), next page ids ---
        if PREFETCH:
            k_nxt = _load_tile(K, page_next, pos_next, end, k_head, stride_kp, stride_kt, offs_d, d_ok, PAGE)
            v_nxt = _load_tile(V, page_next, pos_next, end, v_head, stride_vp, stride_vt, offs_d, d_ok, PAGE)
            pos_after = pos_next + BLOCK_N
            page_after = tl.load(bt_row + pos_after // PAGE, mask=pos_after < end, other=0).to(tl.int64)
        else:
            k_raw = _load_tile(K, page, pos, end, k_head, stride_kp, stride_kt, offs_d, d_ok, PAGE)
            v_raw = _load_tile(V, page, pos, end, v_head, stride_vp, stride_vt, offs_d, d_ok, PAGE)
            page = page_next
            page_next = tl.load(bt_row + (pos + 2 * BLOCK_N) // PAGE, mask=pos + 2 * BLOCK_N < end,
                                other=0).to(tl.int64)
        # -- scores (base 2), soft cap, visibility ------------------------------------------
        k = _dequant(k_raw, k_scale_ptr, k_off_ptr, stride_sd, offs_d, d_ok, KV_INT8, HAS_OFFSET, UPCAST)
        if DOT_IEEE:
            s = tl.dot(q, tl.trans(k), input_precision="ieee")
        else:
            s = tl.dot(q, tl.trans(k))
        if SOFT_CAP:
            x = s * (qk_scale / soft_cap)  # tanh(x) = 1 - 2 / (exp(2x) + 1), exact at both ends
            s = soft_cap * LOG2E * (1.0 - 2.0 / (tl.exp2(x * (2.0 * LOG2E)) + 1.0))
        else:
            s = s * (qk_scale * LOG2E)
        visible = (pos < end)[None, :] & (pos[None, :] <= q_pos[:, None])
        if HAS_WINDOW:
            visible = visible & (pos[None, :] >= q_pos[:, None] - window_left)
        s = tl.where(visible, s, float("-inf"))
        # -- online softmax with a finite reference max ---------------------------------------
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_ref)
        p = tl.exp2(s - m_ref[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = _dequant(v_raw, v_scale_ptr, v_off_ptr, stride_sd, offs_d, d_ok, KV_INT8, HAS_OFFSET, UPCAST)
        if DOT_IEEE:
            pv = tl.dot(p, v.to(tl.float32), input_precision="ieee")
        else:
            pv = tl.dot(p.to(v.dtype), v)
        acc = acc * alpha[:, None] + pv
        m_i = m_new
        # -- rotate the prefetch registers ---------------------------------------------------
        if PREFETCH:
            k_raw, v_raw, pos, page_next, pos_next = k_nxt, v_nxt, pos_next, page_after, pos_after
        else:
            pos = pos + BLOCK_N

    # -- the split's state: o = u / l, lse = m + log l (natural log); empty -> 0, -inf ----------
    empty = l_i == 0.0
    l_safe = tl.where(empty, 1.0, l_i)
    o = acc / l_safe[:, None]
    lse = tl.where(empty, float("-inf"), (m_i + tl.log2(l_safe)) * LN2)
    out_mask = row_ok[:, None] & d_ok[None, :]
    if n_split == 1:  # the only split of its rows: write the final output directly
        tl.store(OUT + t.to(tl.int64)[:, None] * stride_ot + hq[:, None] * stride_oh + offs_d[None, :],
                 o.to(OUT.dtype.element_ty), mask=out_mask)
        tl.store(OUT_LSE + t * stride_lot + hq * stride_loh, lse, mask=row_ok)
    else:
        slot_id = (tl.load(ROW_SLOT + t, mask=row_ok, other=0) + split).to(tl.int64)
        tl.store(PART_O + slot_id[:, None] * stride_ps + hq[:, None] * stride_ph + offs_d[None, :], o, mask=out_mask)
        tl.store(PART_LSE + slot_id * stride_ls + hq * stride_lh, lse, mask=row_ok)
        if FUSE_MERGE:
            # the last of the request's splits to finish merges them (in slot order)
            tl.debug_barrier()
            counter = COUNTERS + (b * NUM_KV_HEADS + h) * tl.num_programs(1) + mblock
            done = tl.atomic_add(counter, 1, sem="acq_rel")
            if done == n_split - 1:
                tl.debug_barrier()
                first = tl.load(ROW_SLOT + t, mask=row_ok, other=0).to(tl.int64)
                mm = tl.full([BLOCK_M], float("-inf"), tl.float32)
                ll = tl.zeros([BLOCK_M], tl.float32)
                uu = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
                for j in range(0, n_split):
                    sid = first + j
                    lse_j = tl.load(PART_LSE + sid * stride_ls + hq * stride_lh, mask=row_ok,
                                    other=float("-inf"), cache_modifier=".cg")
                    o_j = tl.load(PART_O + sid[:, None] * stride_ps + hq[:, None] * stride_ph + offs_d[None, :],
                                  mask=out_mask, other=0.0, cache_modifier=".cg")
                    mm, ll, uu = _merge_step(mm, ll, uu, lse_j, o_j)
                o, lse = _merge_finish(ll, mm, uu)
                tl.store(OUT + t.to(tl.int64)[:, None] * stride_ot + hq[:, None] * stride_oh + offs_d[None, :],
                         o.to(OUT.dtype.element_ty), mask=out_mask)
                tl.store(OUT_LSE + t * stride_lot + hq * stride_loh, lse, mask=row_ok)
                tl.atomic_xchg(counter, 0)


@triton.jit
def _merge_step(m, l, u, lse_j, o_j):
    """Fold one state (natural-log ``lse_j``, ``o_j``) into the running (max, weight sum, weighted sum)."""
    empty = (lse_j == float("inf")) | (lse_j == float("-inf"))
    lse_j = tl.where(empty, float("-inf"), lse_j)
    o_j = tl.where(empty[:, None], 0.0, o_j)
    m_new = tl.maximum(m, lse_j)
    m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
    a = tl.exp(m - m_ref)
    w = tl.exp(lse_j - m_ref)
    return m_new, l * a + w, u * a[:, None] + w[:, None] * o_j


@triton.jit
def _merge_finish(l, m, u):
    empty = l == 0.0
    l_safe = tl.where(empty, 1.0, l)
    o = tl.where(empty[:, None], 0.0, u / l_safe[:, None])
    lse = tl.where(empty, float("-inf"), m + tl.log(l_safe))
    return o, lse


@triton.jit
def merge_kernel(
    PART_O, PART_LSE, OUT, OUT_LSE, ROW_SLOT, ROW_NS,
    stride_ps, stride_ph, stride_ls, stride_lh,
    stride_ot, stride_oh, stride_lot, stride_loh,
    slot_step, num_heads,
    HEAD_DIM: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr, SKIP_SINGLE: tl.constexpr,
):
    """Row ``t`` merges slots ``row_slot[t] + j * slot_step`` for ``j < row_ns[t]``."""
    t = tl.program_id(0)
    offs_h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_D)
    n = tl.load(ROW_NS + t)
    if SKIP_SINGLE and n == 1:  # stage 1 wrote this row directly
        return
    h_ok = offs_h < num_heads
    mask = h_ok[:, None] & (offs_d < HEAD_DIM)[None, :]
    first = tl.load(ROW_SLOT + t).to(tl.int64)
    m = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l = tl.zeros([BLOCK_H], tl.float32)
    u = tl.zeros([BLOCK_H, BLOCK_D], tl.float32)
    for j in range(0, n):
        sid = first + j * slot_step
        lse_j = tl.load(PART_LSE + sid * stride_ls + offs_h * stride_lh, mask=h_ok, other=float("-inf"))
        o_j = tl.load(PART_O + sid * stride_ps + offs_h[:, None] * stride_ph + offs_d[None, :], mask=mask, other=0.0)
        m, l, u = _merge_step(m, l, u, lse_j.to(tl.float32), o_j.to(tl.float32))
    o, lse = _merge_finish(l, m, u)
    tl.store(OUT + t.to(tl.int64) * stride_ot + offs_h[:, None] * stride_oh + offs_d[None, :],
             o.to(OUT.dtype.element_ty), mask=mask)
    tl.store(OUT_LSE + t * stride_lot + offs_h * stride_loh, lse, mask=h_ok)
