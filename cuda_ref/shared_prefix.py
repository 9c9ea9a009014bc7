"""Shared-prefix decode on the Triton kernels (the semantics: :mod:`splitkv_common.shared_prefix`).

One step is three launches into fixed buffers (graph-capturable: no allocation that depends on the
values, no host sync):

1. :func:`prefix_stage_kernel`: one program per (prefix work item, block of ``BLOCK_M`` packed rows).
   A prefix work item is (group, KV head, split, ``[start, end)`` of the prefix); its rows are all
   the group's query rows times the KV head's GQA group, the ``M`` of a ``tl.dot`` against one K/V
   stream (``[BLOCK_N, D]`` tiles through the prefix's pages), so a group's prefix is read once per
   row block instead of once per request. Splits of the prefix give the parallelism. It writes
   the split's float32 state to the row's prefix slots.
2. the existing split kernel (:func:`cuda_ref.kernels.split_kv_kernel`) on the tails: the batch with
   block-table rows shifted past each request's prefix and lengths ``seq_len - prefix_len``, every
   split writing a partial (never the final row) into the row's tail slots.
3. the existing merge kernel over each row's tail slots then prefix slots: the exact merge.

:class:`SharedPrefixWrapper` is the ``plan()`` / ``run()`` API (``plan(..., shared_prefix=...)``);
:func:`decode_with_common_prefix` the vLLM-style entry (``common_prefix_len``).
"""

from __future__ import annotations

import numpy as np
import torch
import triton
import triton.language as tl

from splitkv_common.plan_layout import with_fields
from splitkv_common.shared_prefix import (
    PREFIX_BLOCK_M, SharedPrefix, SharedPrefixPlan, check_shared_prefix, groups_as_shared_prefix, plan_shared_prefix,
    row_positions)
from splitkv_common.torch_io import as_torch_dtype
from splitkv_common.validation import check_gqa, check_scalars, host, normalize_window

from . import INTERPRET
from .kernels import _dequant, _load_kv_scales, _pv, _seen_values, _split_state, _tile_scores
from .launch import PlanUploader, launch_decode, launch_merge

PREFIX_BLOCK_N = 64
PREFIX_NUM_STAGES = 2
PREFIX_NUM_WARPS = None  # None: 4 for blocks of up to 64 packed rows, else 8


@triton.jit
def prefix_stage_kernel(
    Q, K, V, PAGES, ITEM_GROUP, ITEM_HEAD, ITEM_SPLIT, ITEM_START, ITEM_END, GROUP_ROWS, PREFIX_ROWS,
    ROW_PREFIX_SLOT, ROW_POS, PART_O, PART_LSE, K_SCALE, V_SCALE, K_OFFSET, V_OFFSET,
    qk_scale, soft_cap, window_left,
    stride_qt, stride_qh, stride_kp, stride_kt, stride_kh, stride_vp, stride_vt, stride_vh, stride_pg,
    stride_ps, stride_ph, stride_ls, stride_lh, stride_sh,
    NUM_GROUPS, NUM_PAGES, NUM_ROWS, NUM_SLOTS,
    GROUP: tl.constexpr, PAGE: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, KV_INT8: tl.constexpr, HAS_OFFSET: tl.constexpr,
    SOFT_CAP: tl.constexpr, HAS_WINDOW: tl.constexpr, DOT_IEEE: tl.constexpr, UPCAST: tl.constexpr,
    SCALE_PER_CHANNEL: tl.constexpr,
):
    """The prefix stage, one program per (work item, row block): load the item, its packed query rows
    (``m -> (group row m // GROUP, head h * GROUP + m % GROUP)``), walk ``[start, end)`` in tiles of
    ``BLOCK_N`` tokens with the online softmax (base 2 inside, as the split kernel), store the state
    ``o = u / l``, ``lse = m + log l`` (natural log) to slot ``ROW_PREFIX_SLOT[t] + split``.

    Visibility: every position of the prefix is history for every row of its group; with a window,
    row ``t`` sees ``p >= ROW_POS[t] - window_left`` only. Values a row cannot see are selected away
    (``where``), never multiplied by 0; a non-finite score or V value a row sees makes it NaN. A page id
    outside ``[0, NUM_PAGES)`` masks its tokens; items of a group outside ``[0, NUM_GROUPS)`` (the
    padding of a graph-stable plan: -1) and rows or slots outside the buffers are skipped."""
    item = tl.program_id(0)
    mblock = tl.program_id(1)
    g = tl.load(ITEM_GROUP + item)
    if (g < 0) | (g >= NUM_GROUPS):
        return
    h = tl.load(ITEM_HEAD + item)
    split = tl.load(ITEM_SPLIT + item)
    start = tl.load(ITEM_START + item)
    end = tl.load(ITEM_END + item)
    p0 = tl.load(GROUP_ROWS + g)
    n_rows = tl.load(GROUP_ROWS + g + 1) - p0
    if mblock * BLOCK_M >= n_rows * GROUP:
        return

    # -- the packed query rows of the group --------------------------------------------------
    offs_m = mblock * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    i = offs_m // GROUP
    row_ok = i < n_rows
    t = tl.load(PREFIX_ROWS + p0 + i, mask=row_ok, other=0)
    row_ok = row_ok & ((t >= 0) & (t < NUM_ROWS))
    hq = h * GROUP + offs_m % GROUP
    d_ok = offs_d < HEAD_DIM
    q = tl.load(Q + t.to(tl.int64)[:, None] * stride_qt + hq.to(tl.int64)[:, None] * stride_qh + offs_d[None, :],
                mask=row_ok[:, None] & d_ok[None, :], other=0.0)
    if (UPCAST or KV_INT8) or DOT_IEEE:
        q = q.to(tl.float32)
    if HAS_WINDOW:
        lo_row = tl.load(ROW_POS + t, mask=row_ok, other=0) - window_left
    k_sc, v_sc, k_of, v_of = _load_kv_scales(K_SCALE, V_SCALE, K_OFFSET, V_OFFSET, h, stride_sh, offs_d, d_ok,
                                             KV_INT8, HAS_OFFSET, SCALE_PER_CHANNEL)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    k_base = K + h.to(tl.int64) * stride_kh
    v_base = V + h.to(tl.int64) * stride_vh
    pages_row = PAGES + g.to(tl.int64) * stride_pg

    # -- one K/V stream for all the rows: s = q k^T, online softmax, acc += p v ------------------
    for n0 in range(start, end, BLOCK_N):
        pos = n0 + offs_n
        in_item = pos < end
        page = tl.load(pages_row + pos // PAGE, mask=in_item, other=-1)
        tok_ok = in_item & ((page >= 0) & (page < NUM_PAGES))
        page = tl.where(tok_ok, page, 0).to(tl.int64)
        tile_ok = tok_ok[:, None] & d_ok[None, :]
        k_raw = tl.load(k_base + (page * stride_kp + (pos % PAGE) * stride_kt)[:, None] + offs_d[None, :],
                        mask=tile_ok, other=0)
        v_raw = tl.load(v_base + (page * stride_vp + (pos % PAGE) * stride_vt)[:, None] + offs_d[None, :],
                        mask=tile_ok, other=0)
        s = _tile_scores(q, k_raw, k_sc, k_of, qk_scale, soft_cap, KV_INT8, HAS_OFFSET, UPCAST, DOT_IEEE, SOFT_CAP)
        visible = tok_ok[None, :] & row_ok[:, None]
        if HAS_WINDOW:
            visible = visible & (pos[None, :] >= lo_row[:, None])
        s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_ref)
        p = tl.exp2(s - m_ref[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = _dequant(v_raw, v_sc, v_of, KV_INT8, HAS_OFFSET, UPCAST)
        v, l_i = _seen_values(v, visible, l_i)   # a V value a row sees and is not finite poisons it
        acc = acc * alpha[:, None] + _pv(p, v, DOT_IEEE)
        m_i = m_new

    o, lse = _split_state(acc, m_i, l_i)
    slot = tl.load(ROW_PREFIX_SLOT + t, mask=row_ok, other=-1).to(tl.int64) + split
    ok = row_ok & ((slot >= split) & (slot < NUM_SLOTS))
    hq64 = hq.to(tl.int64)
    tl.store(PART_O + slot[:, None] * stride_ps + hq64[:, None] * stride_ph + offs_d[None, :], o,
             mask=ok[:, None] & d_ok[None, :])
    tl.store(PART_LSE + slot * stride_ls + hq64 * stride_lh, lse, mask=ok)


# --- host side ---------------------------------------------------------------------------------------

_PREFIX_FIELDS = ("item_group", "item_head", "item_split", "item_start", "item_end", "group_rows", "prefix_rows",
                  "pages", "row_prefix_slot", "row_pos", "row_slot_start", "row_num_splits", "request_prefix")


def pack_prefix_plan(splan: SharedPrefixPlan, seq_lens, query_start_loc) -> tuple[np.ndarray, dict]:
    """The prefix stage's arrays and the merged slot layout as one int32 buffer (each array on a
    16-byte boundary) and ``{name: (offset, length)}``: one host-to-device copy a step."""
    pp = splan.prefix
    arrays = {
        "item_group": pp.item_request, "item_head": pp.item_kv_head, "item_split": pp.item_split,
        "item_start": pp.item_kv_start, "item_end": pp.item_kv_end, "group_rows": pp.query_start_loc,
        "prefix_rows": splan.prefix_rows, "pages": splan.groups.pages.reshape(-1),
        "row_prefix_slot": splan.row_prefix_slot, "row_pos": row_positions(seq_lens, query_start_loc),
        "row_slot_start": splan.row_slot_start, "row_num_splits": splan.row_num_splits,
        "request_prefix": splan.groups.request_prefix,
    }
    layout, off = {}, 0
    for f in _PREFIX_FIELDS:
        n = int(np.asarray(arrays[f]).shape[0])
        layout[f] = (off, n)
        off += (n + 3) & ~3
    buf = np.zeros(max(off, 4), np.int32)
    for f in _PREFIX_FIELDS:
        o, n = layout[f]
        buf[o:o + n] = arrays[f]
    return buf, layout


def tail_plan_for_kernels(splan: SharedPrefixPlan):
    """The tail plan as the split kernel is to run it here: on each request's own block-table row and
    length, its work items' ranges moved past the request's prefix (``[P_b + a, P_b + e)`` for the
    tail's ``[a, e)``), so the step needs no shifted copy of the block table or the lengths (no device
    op before the kernels); every split writes a partial (a request's split count at least 2, so no
    row is written final) into the merged layout's tail slots. Positions are the request's own, so the
    causal rule and a window need no change."""
    tp = splan.tail
    req = np.asarray(tp.item_request)
    shift = np.where(req >= 0, np.asarray(splan.groups.request_prefix, np.int64)[np.maximum(req, 0)], 0)
    return with_fields(tp, num_splits=np.maximum(tp.num_splits, 2).astype(np.int32),
                       item_kv_start=(tp.item_kv_start + shift).astype(np.int32),
                       item_kv_end=(tp.item_kv_end + shift).astype(np.int32),
                       row_slot_start=splan.row_slot_start, num_slots=int(splan.num_slots))


class SharedPrefixWrapper:
    """Decode attention with shared prefixes: ``plan()`` on the host (the planner decides shared or
    plain, per device profile), ``run()`` on the device (no allocation that depends on values, no host
    sync: graph-capturable with ``graph_stable=True``).

    Args:
        num_q_heads, num_kv_heads, head_dim, page_size: the model's shape.
        dtype, kv_dtype: q's / the output's dtype and the cache's (default ``dtype``; or int8).
        device: default the current CUDA device (the CPU and the interpreter without one).
        profile: the planner's device profile; policy: the split policy of every stage's plan.
        mode: ``auto`` (the cost model), ``on`` (shared whenever a prefix is given), ``off``.
        graph_stable: fixed-shape plans for replay; the route of the first ``plan()`` (shared or
            plain) holds for every later one (a captured graph launches its kernels), and a later
            batch that cannot take it is refused.
        block_m: packed rows (query rows x GQA group) of one prefix program, >= 16.
        prefix_policy: the prefix plan's split policy (None: ``policy``, the model's own length under ``auto``:
            :func:`~splitkv_common.shared_prefix_cost.prefix_split`).
        concurrent_stages: on a CUDA device, launch the prefix stage on a second stream, forked from
            and joined back to the caller's around the tail stage, so the two stages (which write
            disjoint partial slots) can share the SMs; a captured graph gets them as parallel branches.
            Off by default until measured on a GPU; ignored elsewhere (one stream).

    Usage::

        w.plan(seq_lens, query_start_loc, shared_prefix=SharedPrefix.single(4096, batch_size=64),
               block_table=block_table)        # host arrays
        out, lse = w.run(q, k_cache, v_cache, block_table, seq_lens, query_start_loc)

    ``run()`` refuses, naming the argument, a batch other than the plan's (requests, rows) and a
    ``window_left`` other than the plan's; ``validate=True`` adds the host checks of the lengths and of
    the block table against the prefix (a host sync)."""

    def __init__(self, num_q_heads: int, num_kv_heads: int, head_dim: int, page_size: int, *,
                 dtype=torch.bfloat16, kv_dtype=None, device=None, profile: str = "h200", policy: str = "auto",
                 mode: str = "auto", graph_stable: bool = False, block_m: int = PREFIX_BLOCK_M,
                 prefix_policy=None, concurrent_stages: bool = False):
        check_gqa(num_q_heads, num_kv_heads)
        if not isinstance(block_m, int) or block_m < 16 or block_m & (block_m - 1):
            raise ValueError(f"block_m: must be a power of two >= 16 (the dot's smallest M), got {block_m!r}")
        self.Hq, self.Hkv, self.D, self.page = int(num_q_heads), int(num_kv_heads), int(head_dim), int(page_size)
        self.dtype = as_torch_dtype(dtype)
        self.kv_dtype = self.dtype if kv_dtype is None else as_torch_dtype(kv_dtype)
        self.device = torch.device(device if device is not None else ("cpu" if INTERPRET else "cuda"))
        self.profile, self.policy, self.mode, self.graph_stable = profile, policy, mode, bool(graph_stable)
        self.block_m = block_m
        self.prefix_policy = prefix_policy
        if not isinstance(concurrent_stages, bool):
            raise TypeError(f"concurrent_stages: must be True or False, got {concurrent_stages!r}")
        self.concurrent_stages = concurrent_stages
        # the prefix stage's stream (concurrent_stages on a CUDA device), made here: never during a capture
        self._side = torch.cuda.Stream(self.device) if concurrent_stages and self.device.type == "cuda" \
            and not INTERPRET else None
        self.splan: "SharedPrefixPlan | None" = None
        self._window = None
        self._plain = None
        self._uploader = PlanUploader(self.device)
        self._buf: "torch.Tensor | None" = None
        self._layout: dict = {}
        self._views: dict = {}
        self._tail_dplan = None
        self._parts: "tuple | None" = None
        self._prefix_rows_most = 1

    # -- host side -----------------------------------------------------------------------------
    def plan(self, seq_lens, query_start_loc=None, *, shared_prefix: "SharedPrefix | None" = None,
             block_table=None, window_left=None) -> SharedPrefixPlan:
        """Plan a batch (host ``seq_lens [B]``, ``query_start_loc [B + 1]``, default one row each) with
        ``shared_prefix`` (a :class:`~splitkv_common.shared_prefix.SharedPrefix` or None); the
        ``block_table`` (host) gives the prefix's pages where a group does not. Copies the plan to the
        device. A refused plan leaves the previous one in use."""
        seq = host(seq_lens)
        qsl = np.arange(seq.shape[0] + 1) if query_start_loc is None else host(query_start_loc)
        win = normalize_window(window_left)
        mode = self.mode
        if self.graph_stable and self.splan is not None:
            # a captured step keeps its route: the decision of the first plan holds for the graph's life
            mode = "on" if self.splan.use_shared else "off"
        splan = plan_shared_prefix(seq, qsl, shared_prefix, num_kv_heads=self.Hkv, page_size=self.page,
                                   num_q_heads=self.Hq, head_dim=self.D,
                                   kv_elem_bytes=torch.empty(0, dtype=self.kv_dtype).element_size(),
                                   device=self.profile, policy=self.policy, window_left=win,
                                   block_table=None if block_table is None else host(block_table),
                                   mode=mode, graph_stable=self.graph_stable, block_m=self.block_m,
                                   prefix_policy=self.prefix_policy)
        if mode == "on" and not splan.use_shared:
            raise ValueError(f"shared_prefix: this graph-stable wrapper runs the shared route (its first plan's), "
                             f"but the batch shares nothing ({splan.reason}); make a new wrapper and capture again")
        if splan.use_shared:
            g = splan.groups
            if any((g.pages[k, :int(L) // self.page] < 0).any() for k, L in enumerate(g.prefix_len)):
                raise ValueError("block_table: plan() needs it where a group gives no prefix_pages")
            buf, layout = pack_prefix_plan(splan, seq, qsl)
            host_t = torch.from_numpy(buf)
            in_place = self.graph_stable and self._buf is not None
            if in_place and (self._buf.numel() != buf.size or layout != self._layout):
                raise ValueError(f"plan: shapes changed under a graph-stable plan (the prefix plan and layout take "
                                 f"{buf.size} int32, the captured ones {self._buf.numel()}: groups, their rows or "
                                 f"prefix pages differ); make a new wrapper and capture again")
            # the tail plan first: a refused upload (shapes changed) leaves everything as it was
            self._tail_dplan = self._uploader.upload(tail_plan_for_kernels(splan), self.Hq // self.Hkv,
                                                     out=self._tail_dplan if in_place else None)
            if in_place:
                self._buf.copy_(host_t)          # in place: a captured graph keeps reading it
            else:
                self._buf = host_t.to(self.device)
            self._layout = layout
            # the prefix stage's longest group (rows), made once here rather than on every run()
            self._prefix_rows_most = int(np.diff(splan.prefix.query_start_loc).max(initial=1))
            self._views = {f: self._buf[o:o + n] for f, (o, n) in layout.items()}
            self._plain = None
        else:
            from .wrapper import DecodeWrapper
            if self._plain is None:
                self._plain = DecodeWrapper(self.Hq, self.Hkv, self.D, self.page, dtype=self.dtype,
                                            kv_dtype=self.kv_dtype, device=self.device, profile=self.profile,
                                            policy=self.policy, graph_stable=self.graph_stable)
            # the plain wrapper plans the batch itself: the same plan (its spec is this wrapper's), with
            # its launch preparations (work items from the index where they allow)
            self._plain.plan(seq, query_start_loc=qsl, window_left=win)
        self.splan, self._window = splan, win
        return splan

    def _partials(self, T: int):
        n = max(int(self.splan.num_slots), 1)
        if self._parts is None or self._parts[0].shape[0] < n:
            self._parts = (torch.empty(n, self.Hq, self.D, dtype=torch.float32, device=self.device),
                           torch.empty(n, self.Hq, dtype=torch.float32, device=self.device))
        return self._parts

    # -- device side ---------------------------------------------------------------------------
    def run(self, q, k_cache, v_cache, block_table, seq_lens, query_start_loc=None, *, scale=None, soft_cap=None,
            window_left=None, k_scale=None, v_scale=None, k_offset=None, v_offset=None, out=None, lse=None,
            validate: bool = False):
        """``out [T, Hq, D]`` (q's dtype), ``lse [T, Hq]`` float32 natural log, by the current plan.

        Shapes as :meth:`cuda_ref.wrapper.DecodeWrapper.run`; ``out`` / ``lse`` may be given
        (graph capture)."""
        if self.splan is None:
            raise RuntimeError("plan: call plan() before run()")
        for name, x, shape in (("out", out, tuple(q.shape)), ("lse", lse, tuple(q.shape[:2]))):
            if x is not None and (tuple(x.shape) != shape or x.device != q.device):
                raise ValueError(f"{name}: must be {list(shape)} on {q.device}, got {list(x.shape)} on {x.device}")
        check_scalars(scale, soft_cap, window_left)
        if normalize_window(window_left) != self._window:
            raise ValueError(f"window_left: the plan was made for {self._window}, run() got {window_left}")
        splan = self.splan
        T, Hq, D = q.shape
        if (Hq, D) != (self.Hq, self.D) or k_cache.shape[1:] != (self.page, self.Hkv, self.D):
            raise ValueError(f"q, k_cache: shapes {tuple(q.shape)}, {tuple(k_cache.shape)} are not the wrapper's "
                             f"(Hq {self.Hq}, Hkv {self.Hkv}, D {self.D}, page {self.page})")
        if q.dtype != self.dtype or k_cache.dtype != self.kv_dtype or v_cache.dtype != self.kv_dtype:
            raise TypeError(f"q, k_cache, v_cache: dtypes must be {self.dtype}, {self.kv_dtype}")
        if (k_cache.dtype == torch.int8) != (k_scale is not None and v_scale is not None):
            raise ValueError("k_scale, v_scale: required with an int8 KV cache and only then")
        if query_start_loc is None:
            query_start_loc = torch.arange(block_table.shape[0] + 1, dtype=torch.int32, device=q.device)
        if block_table.shape[0] != splan.plain.batch_size or T != splan.plain.num_rows:
            raise ValueError(f"q, block_table: the plan was made for {splan.plain.batch_size} requests and "
                             f"{splan.plain.num_rows} rows, got {block_table.shape[0]} and {T}")
        if validate:
            splan.plain.check_batch(host(seq_lens), host(query_start_loc))
            if splan.use_shared:
                check_shared_prefix(groups_as_shared_prefix(splan, self.page), host(seq_lens), host(query_start_loc),
                                    self.page, host(block_table), k_cache.shape[0])
        if not splan.use_shared:
            o, l = self._plain.run(q, k_cache, v_cache, block_table, seq_lens, query_start_loc, scale=scale,
                                   soft_cap=soft_cap, window_left=window_left, k_scale=k_scale, v_scale=v_scale,
                                   k_offset=k_offset, v_offset=v_offset)
            if out is None and lse is None:
                return o, l
            out = torch.empty_like(o) if out is None else out
            lse = torch.empty_like(l) if lse is None else lse
            out.copy_(o)
            lse.copy_(l)
            return out, lse
        scale = float(D ** -0.5) if scale is None else float(scale)
        out = torch.empty(T, Hq, D, dtype=q.dtype, device=q.device) if out is None else out
        lse = torch.empty(T, Hq, dtype=torch.float32, device=q.device) if lse is None else lse
        if T == 0:
            return out, lse
        part_o, part_lse = self._partials(T)
        vw = self._views
        quant = dict(k_scale=k_scale, v_scale=v_scale, k_offset=k_offset, v_offset=v_offset)
        win = normalize_window(window_left)
        side = self._side_stream(q.device)
        if side is not None:   # fork: the prefix stage on the side stream, after what the caller queued
            cur = torch.cuda.current_stream(q.device)
            side.wait_stream(cur)
            with torch.cuda.stream(side):
                self._launch_prefix(q, k_cache, v_cache, part_o, part_lse, scale, soft_cap, win, **quant)
        launch_decode(q, k_cache, v_cache, block_table, seq_lens, query_start_loc, self._tail_dplan, out, lse, part_o,
                      part_lse, scale=scale, soft_cap=soft_cap, window_left=win, interpret=INTERPRET, merge=False,
                      **quant)
        if side is None:
            self._launch_prefix(q, k_cache, v_cache, part_o, part_lse, scale, soft_cap, win, **quant)
        else:                  # join: the merge, and all the caller queues next, after both stages
            cur.wait_stream(side)
        launch_merge(part_o, part_lse, out, lse, vw["row_slot_start"], vw["row_num_splits"])
        return out, lse

    def _side_stream(self, device: torch.device) -> "torch.cuda.Stream | None":
        """The prefix stage's own stream where ``concurrent_stages`` applies (tensors on the wrapper's
        CUDA device), else None (one stream)."""
        side = self._side
        return side if side is not None and side.device == device else None

    def _launch_prefix(self, q, k_cache, v_cache, part_o, part_lse, scale, soft_cap, window_left, k_scale=None,
                       v_scale=None, k_offset=None, v_offset=None):
        splan, vw = self.splan, self._views
        pp = splan.prefix
        T = q.shape[0]
        G = self.Hq // self.Hkv
        most = T if self.graph_stable else self._prefix_rows_most
        grid = (pp.num_items, max(1, -(-most * G // self.block_m)))
        kv_int8 = k_cache.dtype == torch.int8
        sh = 0 if k_scale is None else k_scale.stride(0)
        dummy = part_lse
        prefix_stage_kernel[grid](
            q, k_cache, v_cache, vw["pages"], vw["item_group"], vw["item_head"], vw["item_split"], vw["item_start"],
            vw["item_end"], vw["group_rows"], vw["prefix_rows"], vw["row_prefix_slot"], vw["row_pos"],
            part_o, part_lse,
            dummy if k_scale is None else k_scale, dummy if v_scale is None else v_scale,
            dummy if k_offset is None else k_offset, dummy if v_offset is None else v_offset,
            scale, float(soft_cap if soft_cap is not None else 1.0), 0 if window_left is None else int(window_left),
            q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
            v_cache.stride(0), v_cache.stride(1), v_cache.stride(2), splan.groups.pages.shape[1],
            part_o.stride(0), part_o.stride(1), part_lse.stride(0), part_lse.stride(1), sh,
            pp.batch_size, k_cache.shape[0], T, part_o.shape[0],
            GROUP=G, PAGE=self.page, HEAD_DIM=self.D, BLOCK_D=max(16, 1 << (self.D - 1).bit_length()),
            BLOCK_M=self.block_m, BLOCK_N=PREFIX_BLOCK_N, KV_INT8=kv_int8, HAS_OFFSET=k_offset is not None,
            SOFT_CAP=soft_cap is not None, HAS_WINDOW=window_left is not None,
            DOT_IEEE=q.dtype == torch.float32 or kv_int8, UPCAST=INTERPRET,
            SCALE_PER_CHANNEL=k_scale is not None and k_scale.dim() == 2,
            num_warps=PREFIX_NUM_WARPS or (4 if self.block_m <= 64 else 8), num_stages=PREFIX_NUM_STAGES)


def decode_with_common_prefix(q, k_cache, v_cache, block_table, seq_lens, query_start_loc, common_prefix_len: int,
                              *, scale=None, soft_cap=None, window_left=None, k_scale=None, v_scale=None,
                              k_offset=None, v_offset=None, profile: str = "h200", mode: str = "auto",
                              policy: str = "auto"):
    """vLLM's convention (its FlashAttention backend's cascade attention): the whole batch shares its
    first ``common_prefix_len`` tokens (a multiple of the page size; pages
    ``block_table[0, :common_prefix_len // page_size]``; 0: nothing shared). A one-off call: plans
    on the host (reads ``seq_lens``, ``query_start_loc`` and ``block_table``) and runs; ``mode``
    ``auto`` lets the planner take the plain path where the shared one would not pay. Returns
    ``out [T, Hq, D]`` and ``lse [T, Hq]`` (natural log). A step that repeats keeps a
    :class:`SharedPrefixWrapper` instead."""
    B = block_table.shape[0]
    w = SharedPrefixWrapper(q.shape[1], k_cache.shape[2], q.shape[2], k_cache.shape[1], dtype=q.dtype,
                            kv_dtype=k_cache.dtype, device=q.device, profile=profile, policy=policy, mode=mode)
    qsl = torch.arange(B + 1, dtype=torch.int32) if query_start_loc is None else query_start_loc
    w.plan(seq_lens, qsl, shared_prefix=SharedPrefix.from_common_prefix_len(int(common_prefix_len), B),
           block_table=block_table, window_left=window_left)
    return w.run(q, k_cache, v_cache, block_table, seq_lens, qsl.to(q.device), scale=scale, soft_cap=soft_cap,
                 window_left=window_left, k_scale=k_scale, v_scale=v_scale, k_offset=k_offset, v_offset=v_offset,
                 validate=True)
