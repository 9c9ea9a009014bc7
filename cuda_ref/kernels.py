"""Triton kernels of split-KV decode attention (see ``docs/triton.md``).

Two kernels, each read top to bottom as a few named steps (``@triton.jit`` helpers, which Triton
inlines into the kernel: the same PTX instructions as the kernel written in one piece):

* :func:`split_kv_kernel` (stage 1): one program per work item of the shared plan and block of
  packed query rows. A work item is (request, KV head, ``[start, end)`` range of logical KV
  positions); its program packs every query row of the request times every query head of the KV
  head's GQA group into the ``M`` dimension of a ``tl.dot`` tile, walks the range in tiles of
  ``BLOCK_N`` tokens that start on page boundaries (one block-table entry per page of the tile,
  checked once and repeated over its tokens), and keeps an online softmax in float32:

      s = scale * q.k   (then cap * tanh(s / cap) with a soft cap)
      m' = max(m, max_n s);  l' = l * exp(m - m') + sum_n exp(s - m');  u' = u * exp(m - m') + exp(s - m') v

  It writes the split's state ``o = u / l``, ``lse = m + log(l)`` (natural log) to the partial slot
  ``row_slot_start[t] + split``, or, when the request has a single split, the final output row
  directly. A row with no visible position gets ``o = 0, lse = -inf``; the exponentials use a finite
  reference ``m`` so ``exp(-inf - -inf)`` is never computed. NaN or +-inf that a row sees (in its
  scores or its V rows) makes the row NaN; values a row cannot see never reach it (masked loads,
  and a ``where`` on V in the tiles whose rows see different positions).

  With ``FUSE_MERGE`` the program that finishes last among the splits of a (request, KV head, row
  block) merges them, reading the slots in a fixed order (so the result does not depend on which
  program is last), and resets its counter to zero, leaving the counters ready for the next launch
  or graph replay.

* :func:`merge_kernel` (stage 2): one program per (output row, head, 64 columns of the head dim:
  ``cuda_ref.configs.merge_d_parts``); merges the row's partial
  states with the exact rule of ``splitkv_common.merge`` (``m = max lse``, ``w = exp(lse - m)``,
  ``out = sum w o / sum w``, ``lse = m + log sum w``), up to ``CHUNK`` splits per round trip to
  memory. ``lse = +inf`` on input is read as empty. Rows with a single split are skipped when
  stage 1 wrote them directly. The fused merge and this kernel share :func:`_merge_row`.

The KV loop of stage 1 is a plain counted loop whose loads depend on the loop index alone, so
Triton's software pipeliner turns them into asynchronous copies ``num_stages`` deep on sm_80+
(``splitkv_bench/compile_check.py`` shows it). The same file lowers for Ascend through
triton-ascend (``docs/triton-ascend.md``): no chained boolean operators, no runtime-strided vector
loads, every constexpr passed explicitly.

All scores are kept in base 2 inside the loop (``exp2`` is the fast instruction); lse is converted to
natural log when stored.
"""

from __future__ import annotations

import triton
import triton.language as tl

try:  # programmatic dependent launch (sm_90+); absent from older Triton and from triton-ascend
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
except ImportError:  # pragma: no cover - only reached where the constexpr flags below stay False
    gdc_launch_dependents = gdc_wait = None

# Integer arguments that change with the plan's sizes (batch, rows, slots, the cache's pages and the block
# table's width) but only bound masks and clamps: not specialized (Triton would otherwise compile a new
# kernel for a value of 1 and treat multiples of 16 apart), so plans of other sizes share one compiled
# kernel and a prepared launch of a new plan reuses it (cuda_ref.fast_launch). The device-made plan's
# SPLIT_SIZE / MAX_SPLITS and the merge's SEARCH_STEPS (a loop count) stay specialized: fixed per wrapper.
STAGE1_DO_NOT_SPECIALIZE = ("NUM_PAGES", "KV_CAP", "NUM_ROWS", "NUM_SLOTS", "BATCH")
MERGE_DO_NOT_SPECIALIZE = ("NUM_SLOTS", "BATCH")

LOG2E = tl.constexpr(1.4426950408889634)
LN2 = tl.constexpr(0.6931471805599453)


@triton.jit
def _load_scale(ptr, offs_d, d_ok, PER_CHANNEL: tl.constexpr):
    """A KV head's int8 scale (or offset): a contiguous ``[1, BLOCK_D]`` row per channel, or one scalar
    (broadcast where used) per head (no runtime stride: triton-ascend lowers a strided vector load to a gather)."""
    if PER_CHANNEL:
        x = tl.load(ptr + offs_d, mask=d_ok, other=0.0)[None, :]
    else:
        x = tl.load(ptr)
    return x


@triton.jit
def _dequant(x, sc, off, KV_INT8: tl.constexpr, HAS_OFFSET: tl.constexpr, UPCAST: tl.constexpr):
    """int8 -> float32 as ``(x - offset) * scale`` (``sc``, ``off``: ``[1, BLOCK_D]`` rows loaded once per
    program); float tiles stay as they are (float32 in the interpreter)."""
    if KV_INT8:
        xf = x.to(tl.float32)
        if HAS_OFFSET:
            xf = xf - off
        x = xf * sc
    elif UPCAST:
        x = x.to(tl.float32)
    return x


@triton.jit
def _seen_values(v, visible, l_i):
    """``v [N, D]`` with its non-finite values set to 0 (a value a row cannot see must be 0, not
    NaN, before the ``p . v`` dot), and ``l_i [M]`` NaN for each row that sees one (``visible
    [M, N]``): the NaN rule."""
    v_fin = (v - v) == 0.0
    v = tl.where(v_fin, v, 0.0)
    v_bad = tl.max(tl.where(v_fin, 0, 1), 1)
    seen_bad = tl.max(tl.where(visible, v_bad[None, :], 0), 1)
    return v, l_i + tl.where(seen_bad > 0, float("nan"), 0.0)


@triton.jit
def _pv(p, v, DOT_IEEE: tl.constexpr):
    """``p [M, N] . v [N, D]`` in float32 (``DOT_IEEE``: full float32 products; else ``p`` in V's dtype)."""
    if DOT_IEEE:
        pv = tl.dot(p, v.to(tl.float32), input_precision="ieee")
    else:
        pv = tl.dot(p.to(v.dtype), v)
    return pv


@triton.jit
def _tile_scores(q, k_raw, k_sc, k_of, qk_scale, soft_cap, KV_INT8: tl.constexpr, HAS_OFFSET: tl.constexpr,
                 UPCAST: tl.constexpr, DOT_IEEE: tl.constexpr, SOFT_CAP: tl.constexpr):
    """A tile's scores in base 2: ``q [M, D] . k [N, D]^T * scale * log2(e)`` (through the soft cap
    ``cap * tanh(s / cap)`` when ``SOFT_CAP``), float32 ``[M, N]``; ``k_raw`` dequantized first (int8).
    A non-finite product is made NaN before the cap (which would turn ``-inf`` into a finite score)."""
    k = _dequant(k_raw, k_sc, k_of, KV_INT8, HAS_OFFSET, UPCAST)
    if DOT_IEEE:
        s = tl.dot(q, tl.trans(k), input_precision="ieee")
    else:
        s = tl.dot(q, tl.trans(k))
    s = s + s * 0.0  # +-inf -> NaN (finite scores unchanged)
    if SOFT_CAP:
        s = soft_cap * LOG2E * _tanh(s * (qk_scale / soft_cap))
    else:
        s = s * (qk_scale * LOG2E)
    return s


@triton.jit(do_not_specialize=STAGE1_DO_NOT_SPECIALIZE)
def split_kv_kernel(
    Q, K, V, BLOCK_TABLE, SEQ_LENS, QUERY_START,
    ITEM_REQ, ITEM_HEAD, ITEM_SPLIT, ITEM_START, ITEM_END,
    NUM_SPLITS, ROW_SLOT,
    PART_O, PART_LSE, OUT, OUT_LSE, COUNTERS, ERRORS,
    K_SCALE, V_SCALE, K_OFFSET, V_OFFSET,
    qk_scale, soft_cap, window_left,
    stride_qt, stride_qh,
    stride_kp, stride_kt, stride_kh,
    stride_vp, stride_vt, stride_vh,
    stride_bt,
    stride_ps, stride_ph, stride_ls, stride_lh,
    stride_ot, stride_oh, stride_lot, stride_loh,
    stride_sh,
    NUM_KV_HEADS, NUM_PAGES, KV_CAP, NUM_ROWS, NUM_SLOTS, BATCH, SPLIT_SIZE, MAX_SPLITS,
    GROUP: tl.constexpr, PAGE: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    KV_INT8: tl.constexpr, HAS_OFFSET: tl.constexpr, SOFT_CAP: tl.constexpr, HAS_WINDOW: tl.constexpr,
    DOT_IEEE: tl.constexpr, UPCAST: tl.constexpr, FUSE_MERGE: tl.constexpr,
    SCALE_PER_CHANNEL: tl.constexpr = False, MERGE_CHUNK: tl.constexpr = 16,
    LAUNCH_DEPENDENTS: tl.constexpr = False, MULTI_ROW_BLOCKS: tl.constexpr = True,
    BOUNDS: tl.constexpr = True, COUNT_ERRORS: tl.constexpr = False, MIXED_TILES: tl.constexpr = True,
    COLUMN_SUM: tl.constexpr = False,
    DEVICE_PLAN: tl.constexpr = False, PADDED: tl.constexpr = False, HOST_SPLITS: tl.constexpr = False,
    STATIC_LOOP: tl.constexpr = False,
):
    """Stage 1, one program per (work item, block of packed query rows), in named steps: load the
    work item, load its packed query rows and int8 scales, walk the KV range (:func:`_kv_loop`),
    then store the split's state (:func:`_split_state`) as the final output (:func:`_store_final`)
    or a partial (:func:`_store_partial`), the last split merging with ``FUSE_MERGE``
    (:func:`_merge_if_last`). The helpers are inlined by Triton: one kernel, as written in one piece.

    Bounds (``BOUNDS``, on except to measure its cost): whatever the values of the plan, the block
    table, ``seq_lens`` or ``query_start_loc``, no address outside the tensors is formed for a load
    or store that is not masked off. A work item whose request is outside ``[0, BATCH)`` or KV head
    outside ``[0, NUM_KV_HEADS)`` is read as padding; KV positions stop at ``KV_CAP`` (the block
    table's columns x ``PAGE``); query rows outside ``[0, NUM_ROWS)`` and partial slots outside
    ``[0, NUM_SLOTS)`` are masked; a page id outside ``[0, NUM_PAGES)`` masks its tokens (they
    count as absent) and, with ``COUNT_ERRORS``, is reported in ``ERRORS`` (int32 ``[8]``:
    programs that met one, then the first reporter's request, logical page and page id; then the
    requests whose length or query rows the kernels cannot honour, :func:`_report_bad_request`).

    ``HOST_SPLITS`` (``DEVICE_PLAN`` for a host plan's splits, whose merge reads the plan's
    ``MAX_SPLITS`` slots a row): every split of the plan writes its state, an empty one past the
    request's length on the device, so that no slot the merge reads is left from an earlier call.
    ``STATIC_LOOP`` (with ``HOST_SPLITS``, one query row a request): the KV loop runs over
    ``[start, start + SPLIT_SIZE)`` (within ``KV_CAP``), bounds that need no load, and the page ids are
    read within them, so the first page ids leave with the request's length instead of after it.
    Positions past the length are masked as always, and no program returns early (a request without
    query rows reads and writes nothing)."""
    if LAUNCH_DEPENDENTS:  # let the merge launch now: it waits for this grid in gdc_wait
        gdc_launch_dependents()
    item = tl.program_id(0)
    mblock = tl.program_id(1)
    if DEVICE_PLAN:  # no plan arrays: the item from its index (a plan made on the device)
        b, h, split, start, end, seq_len, r0, q_len, n_split = _device_work_item(
            SEQ_LENS, QUERY_START, item, NUM_KV_HEADS, KV_CAP, BATCH, SPLIT_SIZE, MAX_SPLITS, HOST_SPLITS)
        if COUNT_ERRORS:  # one program per request (its first split, KV head 0, row block 0) checks it
            if ((h == 0) & (split == 0) & (mblock == 0)) & (item // (NUM_KV_HEADS * MAX_SPLITS) < BATCH):
                _report_bad_request(ERRORS, b, seq_len, r0, q_len, KV_CAP, NUM_ROWS,
                                    (BLOCK_M * tl.num_programs(1)) // GROUP)
        if not STATIC_LOOP:
            if q_len == 0:  # padding (the grid covers the block table's capacity): nothing to read or write
                return
    else:
        if PADDED:  # a graph-stable plan: its padding items (request -1) return after one load
            if tl.load(ITEM_REQ + item) < 0:
                return
        b, h, split, start, end, seq_len, r0, q_len, n_split = _load_work_item(
            ITEM_REQ, ITEM_HEAD, ITEM_SPLIT, ITEM_START, ITEM_END, SEQ_LENS, QUERY_START, NUM_SPLITS, item,
            NUM_KV_HEADS, KV_CAP, BATCH, BOUNDS)
        if COUNT_ERRORS:  # (a padding or out-of-range item reads as request 0 without rows: nothing to report)
            if (h == 0) & (split == 0) & (mblock == 0):
                _report_bad_request(ERRORS, b, seq_len, r0, q_len, KV_CAP, NUM_ROWS,
                                    (BLOCK_M * tl.num_programs(1)) // GROUP)
    if MULTI_ROW_BLOCKS:  # a request may have fewer packed rows than the grid (one query row: never)
        if mblock * BLOCK_M >= q_len * GROUP:
            return

    # -- packed query rows: m -> (query row i, head g of the group) --------------------------
    offs_m = mblock * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    i = offs_m // GROUP
    g = offs_m % GROUP
    t = r0 + i
    row_ok = i < q_len
    if BOUNDS:
        row_ok = row_ok & ((t >= 0) & (t < NUM_ROWS))
    hq = h * GROUP + g
    d_ok = offs_d < HEAD_DIM
    q = _load_q(Q, t, hq, offs_d, row_ok, d_ok, stride_qt, stride_qh, KV_INT8, DOT_IEEE, UPCAST)
    q_pos = seq_len - q_len + i  # logical position of each query row: it sees p <= q_pos
    k_sc, v_sc, k_of, v_of = _load_kv_scales(K_SCALE, V_SCALE, K_OFFSET, V_OFFSET, h, stride_sh, offs_d, d_ok,
                                             KV_INT8, HAS_OFFSET, SCALE_PER_CHANNEL)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    if COLUMN_SUM:  # the sum of weights per tile column, summed over the row after the loop
        l_i = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    else:
        l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    bt_row = BLOCK_TABLE + b.to(tl.int64) * stride_bt
    k_base = K + h.to(tl.int64) * stride_kh
    v_base = V + h.to(tl.int64) * stride_vh
    i_first = (mblock * BLOCK_M) // GROUP  # the block's first and last query rows
    i_last = tl.minimum(q_len - 1, (mblock * BLOCK_M + BLOCK_M - 1) // GROUP)
    if STATIC_LOOP:  # the loop's bounds from the program's index and the arguments alone
        loop_end = tl.minimum(start.to(tl.int64) + SPLIT_SIZE, KV_CAP).to(tl.int32)
    else:
        loop_end = end
    m_i, l_i, acc, bad_col = _kv_loop(q, q_pos, i_first, i_last, m_i, l_i, acc, bt_row, k_base, v_base, start, end,
                                      loop_end, offs_n, offs_d, d_ok, k_sc, v_sc, k_of, v_of, qk_scale, soft_cap,
                                      window_left, NUM_PAGES, stride_kp, stride_kt, stride_vp, stride_vt, seq_len,
                                      q_len, PAGE, BLOCK_N, KV_INT8, HAS_OFFSET, SOFT_CAP, HAS_WINDOW, DOT_IEEE, UPCAST,
                                      BOUNDS, MIXED_TILES)
    if COUNT_ERRORS:
        _report_bad_page(ERRORS, bt_row, b, bad_col)

    if COLUMN_SUM:
        l_i = tl.sum(l_i, 1)
    o, lse = _split_state(acc, m_i, l_i)
    out_mask = row_ok[:, None] & d_ok[None, :]
    if n_split == 1:  # the only split of its rows: write the final output directly
        _store_final(OUT, OUT_LSE, o, lse, t, hq, offs_d, row_ok, out_mask, stride_ot, stride_oh, stride_lot,
                     stride_loh)
    else:
        _store_partial(PART_O, PART_LSE, ROW_SLOT, o, lse, t, hq, split, offs_d, row_ok, out_mask,
                       stride_ps, stride_ph, stride_ls, stride_lh, NUM_SLOTS, BOUNDS)
        if FUSE_MERGE:
            if q_len > 0:  # not for padding items (nor requests without query rows)
                _merge_if_last(PART_O, PART_LSE, OUT, OUT_LSE, ROW_SLOT, COUNTERS, b, h, mblock, r0, q_len, n_split,
                               offs_d, d_ok, NUM_KV_HEADS, NUM_ROWS, NUM_SLOTS, stride_ps, stride_ph, stride_ls,
                               stride_lh,
                               stride_ot, stride_oh, stride_lot, stride_loh, GROUP, BLOCK_M, MERGE_CHUNK)


@triton.jit
def _load_work_item(ITEM_REQ, ITEM_HEAD, ITEM_SPLIT, ITEM_START, ITEM_END, SEQ_LENS, QUERY_START, NUM_SPLITS, item,
                    NUM_KV_HEADS, KV_CAP, BATCH, BOUNDS: tl.constexpr):
    """The work item's fields and its request's: ``(b, h, split, start, end, seq_len, r0, q_len, n_split)``.

    A padding item of a graph-stable plan (request ``-1``) becomes an empty range of request 0
    with no query rows, so it reads and writes nothing (with ``PADDED``, set for graph-stable plans,
    ``split_kv_kernel`` returns before this for one: a padded grid's extra programs cost one load,
    not a pass through the kernel; run 21); with ``BOUNDS`` so does an item whose request or KV head
    is out of range (its request's fields are not even loaded), and the range is clipped to
    ``[0, KV_CAP)``. No branch on a loaded value before the KV loop: the work item's fields, then the
    request's, then the first tiles' page ids are each one round trip to memory, not one per branch
    (the ``PADDED`` test puts one more before the real items' loads, 0.3-0.4 µs at batch 1 in run 21:
    plans without padding leave it out)."""
    b = tl.load(ITEM_REQ + item)
    h = tl.load(ITEM_HEAD + item)
    split = tl.load(ITEM_SPLIT + item)
    start = tl.load(ITEM_START + item)
    end = tl.load(ITEM_END + item)
    valid = b >= 0  # False: a padding item of a graph-stable plan, which reads and writes nothing
    if BOUNDS:
        valid = valid & ((b < BATCH) & ((h >= 0) & (h < NUM_KV_HEADS)))
        b = tl.where(valid, b, 0)
        h = tl.where(valid, h, 0)
        start = tl.maximum(start, 0)
        end = tl.where(valid, tl.minimum(end, KV_CAP), start)
        seq_len = tl.load(SEQ_LENS + b, mask=valid, other=0)
        r0 = tl.load(QUERY_START + b, mask=valid, other=0)
        q_len = tl.where(valid, tl.load(QUERY_START + b + 1, mask=valid, other=0) - r0, 0)
        n_split = tl.load(NUM_SPLITS + b, mask=valid, other=1)
    else:
        b = tl.maximum(b, 0)
        end = tl.where(valid, end, start)
        seq_len = tl.load(SEQ_LENS + b)
        r0 = tl.load(QUERY_START + b)
        q_len = tl.where(valid, tl.load(QUERY_START + b + 1) - r0, 0)
        n_split = tl.load(NUM_SPLITS + b)
    return b, h, split, start, end, seq_len, r0, q_len, n_split


@triton.jit
def _device_work_item(SEQ_LENS, QUERY_START, item, NUM_KV_HEADS, KV_CAP, BATCH, SPLIT_SIZE, MAX_SPLITS,
                      HOST_SPLITS: tl.constexpr = False):
    """:func:`_load_work_item` for a plan made on the device (no plan arrays): item ``i`` of the grid
    ``BATCH x NUM_KV_HEADS x MAX_SPLITS`` is request ``b``, KV head ``h``, split ``j``, range
    ``[j * SPLIT_SIZE, min((j + 1) * SPLIT_SIZE, seq_len))`` of ``ceil(seq_len / SPLIT_SIZE)`` splits
    (1 to ``MAX_SPLITS``): the items of the host's ``size:SPLIT_SIZE`` plan. A split past its
    request's count (or a request past ``BATCH``) is padding: no rows, an empty range.
    ``HOST_SPLITS`` (a host plan's splits, whose merge reads ``MAX_SPLITS`` slots a row): every
    request has ``MAX_SPLITS`` splits, those past its length empty."""
    b = item // (NUM_KV_HEADS * MAX_SPLITS)
    h = (item // MAX_SPLITS) % NUM_KV_HEADS
    split = item % MAX_SPLITS
    in_batch = b < BATCH
    b = tl.where(in_batch, b, 0)
    # the request's three fields in one round trip: the query rows' loads do not wait for the length
    seq_len = tl.load(SEQ_LENS + b, mask=in_batch, other=0)
    r0 = tl.load(QUERY_START + b, mask=in_batch, other=0)
    r1 = tl.load(QUERY_START + b + 1, mask=in_batch, other=0)
    if HOST_SPLITS:
        n_split = MAX_SPLITS + 0 * seq_len
    else:
        n_split = tl.minimum(tl.maximum((seq_len + SPLIT_SIZE - 1) // SPLIT_SIZE, 1), MAX_SPLITS)
    valid = in_batch & (split < n_split)
    start = split * SPLIT_SIZE
    end = tl.where(valid, tl.minimum(tl.minimum(start + SPLIT_SIZE, seq_len), KV_CAP), start)
    q_len = tl.where(valid, r1 - r0, 0)
    return b, h, split, start, end, seq_len, r0, q_len, n_split


@triton.jit
def _load_q(Q, t, hq, offs_d, row_ok, d_ok, stride_qt, stride_qh,
            KV_INT8: tl.constexpr, DOT_IEEE: tl.constexpr, UPCAST: tl.constexpr):
    """The packed query rows ``[BLOCK_M, BLOCK_D]`` (row ``m``: query row ``t[m]``, head ``hq[m]``),
    float32 where the dot runs in float32."""
    q_ptr = Q + t.to(tl.int64)[:, None] * stride_qt + hq.to(tl.int64)[:, None] * stride_qh + offs_d[None, :]
    q = tl.load(q_ptr, mask=row_ok[:, None] & d_ok[None, :], other=0.0)
    if (UPCAST or KV_INT8) or DOT_IEEE:
        q = q.to(tl.float32)
    return q


@triton.jit
def _load_kv_scales(K_SCALE, V_SCALE, K_OFFSET, V_OFFSET, h, stride_sh, offs_d, d_ok,
                    KV_INT8: tl.constexpr, HAS_OFFSET: tl.constexpr, SCALE_PER_CHANNEL: tl.constexpr):
    """int8 scales / offsets of KV head ``h``, loaded once per program: ``(k_sc, v_sc, k_of, v_of)``
    (``1, 1, 0, 0`` for a float cache, offsets ``0`` without them)."""
    if KV_INT8:
        k_sc = _load_scale(K_SCALE + h * stride_sh, offs_d, d_ok, SCALE_PER_CHANNEL)
        v_sc = _load_scale(V_SCALE + h * stride_sh, offs_d, d_ok, SCALE_PER_CHANNEL)
        if HAS_OFFSET:
            k_of = _load_scale(K_OFFSET + h * stride_sh, offs_d, d_ok, SCALE_PER_CHANNEL)
            v_of = _load_scale(V_OFFSET + h * stride_sh, offs_d, d_ok, SCALE_PER_CHANNEL)
        else:
            k_of, v_of = 0.0, 0.0
    else:
        k_sc, v_sc, k_of, v_of = 1.0, 1.0, 0.0, 0.0
    return k_sc, v_sc, k_of, v_of


@triton.jit
def _kv_loop(q, q_pos, i_first, i_last, m_i, l_i, acc, bt_row, k_base, v_base, start, end, loop_end, offs_n, offs_d,
             d_ok, k_sc, v_sc, k_of, v_of, qk_scale, soft_cap, window_left, NUM_PAGES,
             stride_kp, stride_kt, stride_vp, stride_vt, seq_len, q_len,
             PAGE: tl.constexpr, BLOCK_N: tl.constexpr, KV_INT8: tl.constexpr, HAS_OFFSET: tl.constexpr,
             SOFT_CAP: tl.constexpr, HAS_WINDOW: tl.constexpr, DOT_IEEE: tl.constexpr, UPCAST: tl.constexpr,
             BOUNDS: tl.constexpr, MIXED_TILES: tl.constexpr):
    """The online softmax over KV positions ``[start, end)`` in tiles of ``BLOCK_N``: returns the
    updated ``(m_i, l_i, acc)`` (base-2 running max, sum of weights, weighted sum of V rows) and the
    first logical page (block-table column) whose page id was outside ``[0, NUM_PAGES)``
    (``INT32_MAX`` if none; such tokens are masked like positions past the end). ``l_i`` is
    ``[BLOCK_M]``, or ``[BLOCK_M, BLOCK_N]`` (``COLUMN_SUM``: a sum per tile column, which the caller
    sums over the row once after the loop, so that a tile's only reduction across warps is its max).

    Tiles start on page boundaries (the first one at ``start`` rounded down; positions before
    ``start`` are masked), so a tile of ``BLOCK_N`` tokens spans ``BLOCK_N / PAGE`` whole pages, or
    lies inside one page: one page id is loaded and checked per page, not per token, then repeated
    over the page's tokens (:func:`_tile_rows`). Plain counted loops whose loads are all
    unconditional (masked) and computed from the loop index alone (page ids, then the K and V copies
    through them: Triton's software pipeliner turns them into asynchronous copies ``num_stages``
    tiles ahead). The first covers the positions before ``mid``, in tiles where every row of the
    block sees every loaded position (all of a one-query-row decode); the second the tiles from
    ``mid`` on, where rows differ (the causal tail of several query rows, the window's edge with
    several rows), and clears non-finite V values a row cannot see (:func:`_kv_tile` ``MIXED``).
    Positions no row of the block sees (past the end, before the first row's window, bad page ids)
    are loaded as 0.

    ``MIXED_TILES`` False (the launch knows that no request has more than one query row): only the
    first loop, over the whole range, to ``loop_end`` (``end``, or a bound at or past it that needs no
    load: ``STATIC_LOOP``), the page ids read before ``loop_end``. The second loop costs registers even
    when it runs no tile (ptxas: 106 -> 168 a thread for 32-token bf16 tiles, one program less per SM),
    so it is compiled only where it can run."""
    lo_ok = start
    if HAS_WINDOW:  # positions before the first row's window: no row of the block sees them
        lo_ok = tl.maximum(start, seq_len - q_len + i_first - window_left)
    if BLOCK_N % PAGE == 0:
        lo = (start // PAGE) * PAGE
    elif PAGE % BLOCK_N == 0:
        lo = (start // BLOCK_N) * BLOCK_N
    else:
        lo = start
    # the first tile some row does not see whole: past the first row's causal limit, or (window,
    # several rows) everywhere
    cut = seq_len - q_len + i_first + 1
    mid = tl.where(cut >= end, end, lo + (tl.maximum(cut - lo, 0) // BLOCK_N) * BLOCK_N)
    if HAS_WINDOW:
        mid = tl.where(i_last > i_first, lo, mid)
    mid = tl.maximum(mid, lo)
    if BLOCK_N % PAGE == 0:
        bad = tl.full([BLOCK_N // PAGE], 2147483647, tl.int32)
    elif PAGE % BLOCK_N == 0:
        bad = tl.full([], 2147483647, tl.int32)
    else:
        bad = tl.full([BLOCK_N], 2147483647, tl.int32)
    col_end = _columns_before(end, PAGE)
    k_slot = (offs_n % PAGE).to(tl.int64) * stride_kt
    v_slot = (offs_n % PAGE).to(tl.int64) * stride_vt
    if MIXED_TILES:
        # the first loop runs to ``end`` and masks positions from ``mid`` on: its bounds come from the
        # work item alone, so its first page ids leave without waiting for the request's fields
        for n0 in range(lo, end, BLOCK_N):
            m_i, l_i, acc, bad = _kv_tile(q, q_pos, m_i, l_i, acc, bad, n0, lo_ok, mid, end, end, col_end, bt_row,
                                          k_base, v_base, offs_n, offs_d, d_ok, k_slot, v_slot, k_sc, v_sc, k_of, v_of,
                                          qk_scale, soft_cap, window_left, NUM_PAGES, stride_kp, stride_kt, stride_vp,
                                          stride_vt, PAGE, BLOCK_N, KV_INT8, HAS_OFFSET, SOFT_CAP, HAS_WINDOW,
                                          DOT_IEEE, UPCAST, BOUNDS, False)
        for n0 in range(mid, end, BLOCK_N):
            m_i, l_i, acc, bad = _kv_tile(q, q_pos, m_i, l_i, acc, bad, n0, lo_ok, end, end, end, col_end, bt_row,
                                          k_base, v_base, offs_n, offs_d, d_ok, k_slot, v_slot, k_sc, v_sc, k_of, v_of,
                                          qk_scale, soft_cap, window_left, NUM_PAGES, stride_kp, stride_kt, stride_vp,
                                          stride_vt, PAGE, BLOCK_N, KV_INT8, HAS_OFFSET, SOFT_CAP, HAS_WINDOW,
                                          DOT_IEEE, UPCAST, BOUNDS, True)
    else:
        for n0 in range(lo, loop_end, BLOCK_N):
            m_i, l_i, acc, bad = _kv_tile(q, q_pos, m_i, l_i, acc, bad, n0, lo_ok, end, end, loop_end, col_end, bt_row,
                                          k_base, v_base, offs_n, offs_d, d_ok, k_slot, v_slot, k_sc, v_sc, k_of, v_of,
                                          qk_scale, soft_cap, window_left, NUM_PAGES, stride_kp, stride_kt, stride_vp,
                                          stride_vt, PAGE, BLOCK_N, KV_INT8, HAS_OFFSET, SOFT_CAP, HAS_WINDOW,
                                          DOT_IEEE, UPCAST, BOUNDS, False)
    if BLOCK_N % PAGE == 0:
        first_bad = tl.min(bad, 0)
    elif PAGE % BLOCK_N == 0:
        first_bad = bad
    else:
        first_bad = tl.min(bad, 0)
    return m_i, l_i, acc, first_bad


@triton.jit
def _columns_before(end, PAGE: tl.constexpr):
    """Block-table columns holding the positions ``< end`` (0 for ``end <= 0``)."""
    return tl.where(end > 0, (end - 1) // PAGE + 1, 0)


@triton.jit
def _expand(x, NP: tl.constexpr, PAGE: tl.constexpr):
    """``[NP]`` per-page values -> ``[NP * PAGE]`` per-token values (each repeated ``PAGE`` times)."""
    return tl.reshape(tl.broadcast_to(x[:, None], (NP, PAGE)), (NP * PAGE,))


@triton.jit
def _tile_rows(bt_row, n0, offs_n, end, load_end, col_end, k_slot, v_slot, bad, NUM_PAGES, stride_kp, stride_kt,
               stride_vp, stride_vt, PAGE: tl.constexpr, BLOCK_N: tl.constexpr, BOUNDS: tl.constexpr):
    """Element offsets (int64 ``[BLOCK_N]``) of the tile's K and V rows from the block table, which
    tokens have a valid page id (``[BLOCK_N]``, all True without ``BOUNDS``), and ``bad`` updated
    with the columns of out-of-range page ids before ``end`` (``col_end`` columns). Page ids are read
    for the positions before ``load_end`` (``end``, or a bound past it within the block table's row:
    those past ``end`` are never used for an address).

    ``BLOCK_N % PAGE == 0`` (the tile starts on a page: ``BLOCK_N / PAGE`` whole pages): one page id
    per page, checked and scaled to a 64-bit page base, then repeated over the page's tokens.
    ``PAGE % BLOCK_N == 0``: the tile lies inside one page, one scalar page id. Otherwise one page id
    per token."""
    if BLOCK_N % PAGE == 0:
        NP: tl.constexpr = BLOCK_N // PAGE
        cols = n0 // PAGE + tl.arange(0, NP)
        col_ok = cols < col_end
        page = tl.load(bt_row + cols, mask=cols < _columns_before(load_end, PAGE), other=0)
        if BOUNDS:
            page_ok = (page >= 0) & (page < NUM_PAGES)
            bad = tl.minimum(bad, tl.where(page_ok, 2147483647, tl.where(col_ok, cols, 2147483647)))
            page = tl.where(page_ok, page, -1)
            page = _expand(page, NP, PAGE)
            tok_ok = page >= 0
            page = tl.maximum(page, 0)
        else:
            page = _expand(page, NP, PAGE)
            tok_ok = offs_n >= 0
        page = page.to(tl.int64)  # per token, so the offsets keep the strides' known alignment
        k_row = page * stride_kp + k_slot
        v_row = page * stride_vp + v_slot
    elif PAGE % BLOCK_N == 0:
        col = n0 // PAGE
        page = tl.load(bt_row + col)
        if BOUNDS:
            page_ok = (page >= 0) & (page < NUM_PAGES)
            bad = tl.minimum(bad, tl.where(page_ok, 2147483647, col))
            page = tl.where(page_ok, page, 0)
            tok_ok = (offs_n >= 0) & page_ok
        else:
            tok_ok = offs_n >= 0
        page = page.to(tl.int64)
        slot = (n0 % PAGE + offs_n).to(tl.int64)
        k_row = page * stride_kp + slot * stride_kt
        v_row = page * stride_vp + slot * stride_vt
    else:
        pos = n0 + offs_n
        in_end = pos < end
        page = tl.load(bt_row + pos // PAGE, mask=pos < load_end, other=0)
        if BOUNDS:
            page_ok = (page >= 0) & (page < NUM_PAGES)
            bad = tl.minimum(bad, tl.where(page_ok, 2147483647, tl.where(in_end, pos // PAGE, 2147483647)))
            page = tl.where(page_ok, page, 0)
            tok_ok = page_ok
        else:
            tok_ok = offs_n >= 0
        page = page.to(tl.int64)
        slot = (pos % PAGE).to(tl.int64)
        k_row = page * stride_kp + slot * stride_kt
        v_row = page * stride_vp + slot * stride_vt
    return k_row, v_row, tok_ok, bad


@triton.jit
def _kv_tile(q, q_pos, m_i, l_i, acc, bad, n0, lo_ok, hi_ok, end, load_end, col_end, bt_row, k_base, v_base, offs_n,
             offs_d, d_ok, k_slot, v_slot, k_sc, v_sc, k_of, v_of, qk_scale, soft_cap, window_left, NUM_PAGES,
             stride_kp, stride_kt, stride_vp, stride_vt,
             PAGE: tl.constexpr, BLOCK_N: tl.constexpr, KV_INT8: tl.constexpr, HAS_OFFSET: tl.constexpr,
             SOFT_CAP: tl.constexpr, HAS_WINDOW: tl.constexpr, DOT_IEEE: tl.constexpr, UPCAST: tl.constexpr,
             BOUNDS: tl.constexpr, MIXED: tl.constexpr):
    """One tile of the online softmax over the positions ``[lo_ok, hi_ok)`` of tile ``[n0, n0 + BLOCK_N)``
    (page ids read up to ``load_end``, ``end`` or past it). ``MIXED`` False: every row of the block sees
    every loaded position (``kv_ok``); True: visibility per row (causal, window), and V values a row cannot see
    are cleared before the dot (``0 * NaN`` would be NaN), a non-finite V value a row sees making
    that row NaN. In both, a non-finite score a row sees is made NaN before the soft cap (which would
    turn ``-inf`` into a finite score), so the row's sum of weights is NaN."""
    k_row, v_row, tok_ok, bad = _tile_rows(bt_row, n0, offs_n, end, load_end, col_end, k_slot, v_slot, bad,
                                           NUM_PAGES, stride_kp, stride_kt, stride_vp, stride_vt, PAGE, BLOCK_N, BOUNDS)
    pos = n0 + offs_n
    kv_ok = ((pos >= lo_ok) & (pos < hi_ok)) & tok_ok
    tile_ok = kv_ok[:, None] & d_ok[None, :]
    k_raw = tl.load(k_base + k_row[:, None] + offs_d[None, :], mask=tile_ok, other=0)
    v_raw = tl.load(v_base + v_row[:, None] + offs_d[None, :], mask=tile_ok, other=0)
    # -- scores (base 2), soft cap, visibility ----------------------------------------------
    s = _tile_scores(q, k_raw, k_sc, k_of, qk_scale, soft_cap, KV_INT8, HAS_OFFSET, UPCAST, DOT_IEEE, SOFT_CAP)
    if MIXED:
        visible = kv_ok[None, :] & (pos[None, :] <= q_pos[:, None])
        if HAS_WINDOW:
            visible = visible & (pos[None, :] >= q_pos[:, None] - window_left)
        s = tl.where(visible, s, float("-inf"))
    else:
        s = tl.where(kv_ok[None, :], s, float("-inf"))
    # -- online softmax with a finite reference max -------------------------------------------
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m_i - m_ref)
    p = tl.exp2(s - m_ref[:, None])
    if len(l_i.shape) == 2:  # per tile column (COLUMN_SUM): the tile's only reduction across the row is its max
        l_i = l_i * alpha[:, None] + p
    else:
        l_i = l_i * alpha + tl.sum(p, 1)
    v = _dequant(v_raw, v_sc, v_of, KV_INT8, HAS_OFFSET, UPCAST)
    if MIXED:  # V a row cannot see must be 0, not NaN; a non-finite V a row sees poisons it
        v, l_i = _seen_values(v, visible, l_i)
    acc = acc * alpha[:, None] + _pv(p, v, DOT_IEEE)
    return m_new, l_i, acc, bad


@triton.jit
def _tanh(x):
    """``tanh(x)`` in float32 to a few ulp relative for every ``x`` (the soft cap ``cap * tanh(s / cap)``
    stays accurate for caps large against the scores): the odd Taylor polynomial to ``x^9`` for
    ``|x| < 0.25`` (truncation below 1e-8 relative), ``1 - 2 / (exp(2x) + 1)`` above, where it no
    longer cancels (and saturates to +-1 without inf / inf). Branch-free: both, then a select."""
    x2 = x * x
    poly = x * (1.0 + x2 * (-0.3333333333333333 + x2 * (0.13333333333333333 + x2 * (
        -0.05396825396825397 + x2 * 0.021869488536155203))))
    expo = 1.0 - 2.0 / (tl.exp2(x * (2.0 * LOG2E)) + 1.0)
    return tl.where(tl.abs(x) < 0.25, poly, expo)


@triton.jit
def _report_bad_page(ERRORS, bt_row, b, col):
    """Count a program that met an out-of-range page id (first at block-table column ``col``,
    ``INT32_MAX`` if none) in ``ERRORS[0]``; the first to count writes its request, logical page
    and the page id to ``ERRORS[1:4]`` (read after the launch)."""
    if col < 2147483647:
        old = tl.atomic_add(ERRORS, 1)
        if old == 0:
            tl.store(ERRORS + 1, b)
            tl.store(ERRORS + 2, col)
            tl.store(ERRORS + 3, tl.load(bt_row + col))


@triton.jit
def _report_bad_request(ERRORS, b, seq_len, r0, q_len, KV_CAP, NUM_ROWS, ROW_CAP):
    """Count a request whose device values the kernels cannot honour (``ERRORS[4:8]``): the bits
    ``1`` a length past its block-table row (``seq_len > KV_CAP``: the tail would be cut), ``2`` a
    negative length, ``4`` query rows not within ``[0, NUM_ROWS)`` in order (a ``query_start_loc``
    that decreases or leaves q's rows), ``8`` more query rows than the launch packs (``max_q_len``),
    OR-ed into ``ERRORS[4]``; ``ERRORS[5]`` counts the requests, the first to count writes its request
    and bits to ``ERRORS[6:8]``. Run by one program per request: a few integer compares, an atomic
    only on an error."""
    r1 = r0 + q_len
    flags = (tl.where(seq_len > KV_CAP, 1, 0) | tl.where(seq_len < 0, 2, 0)
             | tl.where((q_len < 0) | (r0 < 0) | (r1 > NUM_ROWS), 4, 0) | tl.where(q_len > ROW_CAP, 8, 0))
    if flags != 0:
        tl.atomic_or(ERRORS + 4, flags)
        old = tl.atomic_add(ERRORS + 5, 1)
        if old == 0:
            tl.store(ERRORS + 6, b)
            tl.store(ERRORS + 7, flags)


@triton.jit
def _split_state(acc, m_i, l_i):
    """The split's state: ``o = u / l``, ``lse = m + log l`` (natural log); empty rows ``0, -inf``.
    A row whose weighted sum of V is not finite in some channel (a non-finite V value it sees) is
    NaN whole, ``o`` and ``lse``."""
    l_i = l_i + tl.sum(acc * 0.0, 1)  # NaN where a channel of acc is +-inf or NaN
    empty = l_i == 0.0
    l_safe = tl.where(empty, 1.0, l_i)
    o = acc / l_safe[:, None]
    lse = tl.where(empty, float("-inf"), (m_i + tl.log2(l_safe)) * LN2)
    return o, lse


@triton.jit
def _store_final(OUT, OUT_LSE, o, lse, t, hq, offs_d, row_ok, out_mask, stride_ot, stride_oh, stride_lot, stride_loh):
    """The only split of its rows: ``o`` (in the output's dtype) and ``lse`` straight to the output."""
    t64 = t.to(tl.int64)
    hq64 = hq.to(tl.int64)
    tl.store(OUT + t64[:, None] * stride_ot + hq64[:, None] * stride_oh + offs_d[None, :],
             o.to(OUT.dtype.element_ty), mask=out_mask)
    tl.store(OUT_LSE + t64 * stride_lot + hq64 * stride_loh, lse, mask=row_ok)


@triton.jit
def _store_partial(PART_O, PART_LSE, ROW_SLOT, o, lse, t, hq, split, offs_d, row_ok, out_mask,
                   stride_ps, stride_ph, stride_ls, stride_lh, NUM_SLOTS, BOUNDS: tl.constexpr):
    """One split of several: the float32 state to partial slot ``row_slot_start[t] + split`` (with
    ``BOUNDS``, only if that slot is in ``[0, NUM_SLOTS)``)."""
    slot_id = tl.load(ROW_SLOT + t, mask=row_ok, other=0).to(tl.int64) + split
    if BOUNDS:
        row_ok = row_ok & ((slot_id >= 0) & (slot_id < NUM_SLOTS))
        out_mask = out_mask & row_ok[:, None]
    tl.store(PART_O + slot_id[:, None] * stride_ps + hq[:, None] * stride_ph + offs_d[None, :], o, mask=out_mask)
    tl.store(PART_LSE + slot_id * stride_ls + hq * stride_lh, lse, mask=row_ok)


@triton.jit
def _merge_if_last(PART_O, PART_LSE, OUT, OUT_LSE, ROW_SLOT, COUNTERS, b, h, mblock, r0, q_len, n_split,
                   offs_d, d_ok, NUM_KV_HEADS, NUM_ROWS, NUM_SLOTS, stride_ps, stride_ph, stride_ls, stride_lh,
                   stride_ot, stride_oh, stride_lot, stride_loh,
                   GROUP: tl.constexpr, BLOCK_M: tl.constexpr, MERGE_CHUNK: tl.constexpr):
    """The fused merge: the last of the request's splits to finish (a per-(request, KV head, row
    block) counter) merges the block's rows, one (query row, head) at a time, and resets the counter."""
    tl.debug_barrier()
    counter = COUNTERS + (b * NUM_KV_HEADS + h) * tl.num_programs(1) + mblock
    done = tl.atomic_add(counter, 1, sem="acq_rel")
    if done == n_split - 1:
        tl.debug_barrier()
        # the block's valid rows, one (query row, head) at a time
        n_rows = tl.minimum(q_len * GROUP - mblock * BLOCK_M, BLOCK_M)
        for rr in range(0, n_rows):
            r_m = mblock * BLOCK_M + rr
            r_t = r0 + r_m // GROUP
            r_h = h * GROUP + r_m % GROUP
            r_in = (r_t >= 0) & (r_t < NUM_ROWS)  # rows of a query_start_loc the plan was not made for
            first = tl.load(ROW_SLOT + r_t, mask=r_in, other=0).to(tl.int64)
            o_m, lse_m = _merge_row(PART_O, PART_LSE, first, 1, n_split, r_h, offs_d, d_ok, NUM_SLOTS,
                                    stride_ps, stride_ph, stride_ls, stride_lh, MERGE_CHUNK, True)
            r64 = r_t.to(tl.int64)
            tl.store(OUT + r64 * stride_ot + r_h * stride_oh + offs_d, o_m.to(OUT.dtype.element_ty),
                     mask=d_ok & r_in)
            tl.store(OUT_LSE + r64 * stride_lot + r_h * stride_loh, lse_m, mask=r_in)
        tl.atomic_xchg(counter, 0)


@triton.jit
def _merge_row(PART_O, PART_LSE, first, slot_step, n, head, offs_d, d_ok, n_slots,
               stride_ps, stride_ph, stride_ls, stride_lh, CHUNK: tl.constexpr, BYPASS_L1: tl.constexpr):
    """Merge the states in slots ``first + j * slot_step`` (``j < n``) of one (row, head); slots
    outside ``[0, n_slots)`` are read as empty (never loaded):
    ``m = max lse``, ``w = exp(lse - m)``, ``out = sum w o / sum w``, ``lse = m + log sum w``
    (natural log); ``lse = +-inf`` is empty. Returns ``(o [BLOCK_D], lse)``.

    ``CHUNK`` slots are loaded as one ``[CHUNK, BLOCK_D]`` tile, so a row of up to ``CHUNK`` splits
    costs one round trip to memory; longer rows take one step per chunk with a running max. The
    sums are tree reductions over the tile, whose order depends only on ``CHUNK``, ``BLOCK_D``
    and the warps: for a given chunk the result is the same bits whatever else is in the batch."""
    offs_c = tl.arange(0, CHUNK)
    m = tl.full([], float("-inf"), tl.float32)
    l = tl.full([], 0.0, tl.float32)
    u = tl.zeros(offs_d.shape, tl.float32)
    n = tl.minimum(n, n_slots)  # more would only read empty slots
    for j0 in range(0, n, CHUNK):
        sid = first + (j0 + offs_c).to(tl.int64) * slot_step
        ok = (j0 + offs_c < n) & ((sid >= 0) & (sid < n_slots))
        lse_ptr = PART_LSE + sid * stride_ls + head * stride_lh
        o_ptr = PART_O + sid[:, None] * stride_ps + head * stride_ph + offs_d[None, :]
        if BYPASS_L1:  # the fused merge reads what other programs of the same launch wrote
            lse_j = tl.load(lse_ptr, mask=ok, other=float("-inf"), cache_modifier=".cg")
            o_j = tl.load(o_ptr, mask=ok[:, None] & d_ok[None, :], other=0.0, cache_modifier=".cg")
        else:
            lse_j = tl.load(lse_ptr, mask=ok, other=float("-inf"))
            o_j = tl.load(o_ptr, mask=ok[:, None] & d_ok[None, :], other=0.0)
        lse_j = lse_j.to(tl.float32)
        empty = (lse_j == float("inf")) | (lse_j == float("-inf"))
        lse_j = tl.where(empty, float("-inf"), lse_j)
        o_j = tl.where(empty[:, None], 0.0, o_j.to(tl.float32))
        m_new = tl.maximum(m, tl.max(lse_j, 0))
        m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)  # never exp(-inf - -inf)
        a = tl.exp(m - m_ref)
        w = tl.exp(lse_j - m_ref)
        l = l * a + tl.sum(w, 0)
        u = u * a + tl.sum(w[:, None] * o_j, 0)
        m = m_new
    empty_row = l == 0.0
    l_safe = tl.where(empty_row, 1.0, l)
    o = u / l_safe
    # the NaN rule: an inf channel of a non-empty state gives NaN, not inf (finite states average to
    # a finite value, so o - o is 0 exactly where every state's channel was finite)
    o = tl.where(o - o == 0.0, o, float("nan"))
    o = tl.where(empty_row, 0.0, o)
    lse = tl.where(empty_row, float("-inf"), m + tl.log(l_safe))
    return o, lse


@triton.jit
def _device_row_splits(SEQ_LENS, QUERY_START, t, BATCH, SPLIT_SIZE, MAX_SPLITS, SEARCH_STEPS):
    """Row ``t``'s split count under a device-made plan: its request ``b`` (the last with
    ``query_start[b] <= t``, by ``SEARCH_STEPS = bit_length(BATCH - 1)`` halvings of ``[0, BATCH)``),
    then ``ceil(seq_lens[b] / SPLIT_SIZE)`` clamped to ``[1, MAX_SPLITS]``; 1 (nothing to merge) for a
    row past ``query_start[BATCH]`` or an empty batch."""
    lo = t * 0
    hi = lo + BATCH
    for _ in range(0, SEARCH_STEPS):
        active = hi - lo > 1
        mid = (lo + hi) // 2
        v = tl.load(QUERY_START + mid, mask=active, other=0)
        lo = tl.where(active & (v <= t), mid, lo)
        hi = tl.where(active & (v > t), mid, hi)
    in_batch = (BATCH > 0) & (t < tl.load(QUERY_START + BATCH))
    seq_len = tl.load(SEQ_LENS + lo, mask=in_batch, other=0)
    n = tl.minimum(tl.maximum((seq_len + SPLIT_SIZE - 1) // SPLIT_SIZE, 1), MAX_SPLITS)
    return tl.where(in_batch, n, 1)


@triton.jit(do_not_specialize=MERGE_DO_NOT_SPECIALIZE)
def merge_kernel(
    PART_O, PART_LSE, OUT, OUT_LSE, ROW_SLOT, ROW_NS,
    stride_ps, stride_ph, stride_ls, stride_lh,
    stride_ot, stride_oh, stride_lot, stride_loh,
    slot_step, NUM_SLOTS, SEQ_LENS, QUERY_START, BATCH, SPLIT_SIZE, MAX_SPLITS, SEARCH_STEPS,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, SKIP_SINGLE: tl.constexpr,
    CHUNK: tl.constexpr = 16, WAIT_PRIMARY: tl.constexpr = False, DEVICE_PLAN: tl.constexpr = False,
    D_PARTS: tl.constexpr = 1,
):
    """Row ``t``, head ``h`` merges slots ``row_slot[t] + j * slot_step`` for ``j < row_ns[t]``; one
    program per (row, head) and part of the head dim (``D_PARTS`` parts of ``BLOCK_D / D_PARTS``
    columns, the grid's third axis; every part reads the slots' lse, the first stores the row's),
    ``CHUNK`` splits loaded at a time. With ``WAIT_PRIMARY`` (a programmatic dependent launch after
    stage 1) it reads the plan, then waits until stage 1 has finished and its writes are visible.
    ``DEVICE_PLAN`` (a plan made on the device): ``ROW_NS`` is not read; the row's split count is
    ``ceil(seq_len / SPLIT_SIZE)`` of its request (:func:`_device_row_splits`)."""
    t = tl.program_id(0)
    h = tl.program_id(1)
    if D_PARTS > 1:
        part = tl.program_id(2)
    else:
        part = 0
    offs_d = part * (BLOCK_D // D_PARTS) + tl.arange(0, BLOCK_D // D_PARTS)
    d_ok = offs_d < HEAD_DIM
    # the row's plan entries come from the host, not from stage 1: read them before the wait
    if DEVICE_PLAN:
        n = _device_row_splits(SEQ_LENS, QUERY_START, t, BATCH, SPLIT_SIZE, MAX_SPLITS, SEARCH_STEPS)
    else:
        n = tl.load(ROW_NS + t)
    if SKIP_SINGLE and n == 1:  # stage 1 wrote this row directly
        return
    first = tl.load(ROW_SLOT + t).to(tl.int64)
    if WAIT_PRIMARY:
        gdc_wait()
    o, lse = _merge_row(PART_O, PART_LSE, first, slot_step, n, h, offs_d, d_ok, NUM_SLOTS,
                        stride_ps, stride_ph, stride_ls, stride_lh, CHUNK, False)
    t64 = t.to(tl.int64)
    tl.store(OUT + t64 * stride_ot + h * stride_oh + offs_d, o.to(OUT.dtype.element_ty), mask=d_ok)
    if D_PARTS > 1:
        tl.store(OUT_LSE + t64 * stride_lot + h * stride_loh, lse, mask=part == 0)
    else:
        tl.store(OUT_LSE + t64 * stride_lot + h * stride_loh, lse)
