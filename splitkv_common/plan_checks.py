"""The planner's checks: a batch's size against the limits, the planner's arguments, a plan from outside.

* :func:`check_plan_limits`: refuse a batch too large to plan, naming the limit
  (:mod:`~splitkv_common.validation`'s ``MAX_*``), before any planning work.
* :func:`check_inputs`: parse and check :func:`~splitkv_common.planner.make_plan`'s arguments into
  :class:`Batch` (int64 host arrays).
* :func:`validate_plan`: check a :class:`~splitkv_common.plan_layout.Plan` that came from outside
  against its layout's rules (what :meth:`Plan.validate` runs).

Errors are ``ValueError`` / ``TypeError`` naming the argument (or the plan's field) and the rule.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .devices import DeviceProfile, get_profile
from .policies import SplitPolicy, parse_policy
from .validation import (MAX_BATCH, MAX_KV_HEADS, MAX_PARTIAL_SLOTS, MAX_QUERY_ROWS, MAX_SEQ_LEN, MAX_WORK_ITEMS,
                         as_int64_lengths, check_scalars, int_vector, normalize_window)


def check_plan_limits(seq_lens, *, num_kv_heads: int, page_size: int, q_lens=None, query_start_loc=None,
                      policy="auto", window_left=None, max_splits: int | None = None,
                      graph_stable: bool = False, max_work_items: int | None = None,
                      default_max_splits: int = 64) -> None:
    """Refuse a batch too large to plan, in milliseconds, naming the limit (the constants above).

    Called first by :func:`~splitkv_common.planner.make_plan` and by ``splitkv plan``. Counts are
    int64 on the host; ``seq_len`` must fit int32 (:data:`MAX_SEQ_LEN`); the work items the policy
    would make (before the ``max_splits`` cap, which the planner applies after cutting) are at most
    :data:`MAX_WORK_ITEMS`.
    """
    seq = as_int64_lengths(seq_lens, "seq_lens")
    B = int(seq.shape[0])
    if B > MAX_BATCH:
        raise ValueError(f"seq_lens: {B} requests, over the limit MAX_BATCH = {MAX_BATCH}")
    if B and int(seq.max()) > MAX_SEQ_LEN:
        b = int(np.argmax(seq))
        raise ValueError(f"seq_lens: request {b} has {int(seq[b])} tokens, over the limit MAX_SEQ_LEN = "
                         f"{MAX_SEQ_LEN} (positions are int32)")
    for name, v in (("num_kv_heads", num_kv_heads), ("page_size", page_size)):
        if not isinstance(v, (int, np.integer)) or isinstance(v, (bool, np.bool_)):
            raise TypeError(f"{name}: must be an int, got {type(v).__name__} {v!r}")
        if v <= 0:
            raise ValueError(f"{name}: must be positive, got {v}")
    if num_kv_heads > MAX_KV_HEADS:
        raise ValueError(f"num_kv_heads: {num_kv_heads}, over the limit MAX_KV_HEADS = {MAX_KV_HEADS}")
    if page_size > MAX_SEQ_LEN:
        raise ValueError(f"page_size: {page_size}, over the limit MAX_SEQ_LEN = {MAX_SEQ_LEN}")
    check_scalars(window_left=window_left)
    if query_start_loc is not None:
        qsl = as_int64_lengths(query_start_loc, "query_start_loc", "[B + 1]")
        ql = np.diff(qsl) if qsl.size else np.zeros(0, np.int64)
        T = int(qsl[-1]) if qsl.size else 0
    elif q_lens is not None:
        ql = as_int64_lengths(q_lens, "q_lens")
        T = int(ql.sum()) if ql.size else 0
    else:
        ql, T = np.ones(B, np.int64), B
    if T > MAX_QUERY_ROWS or (ql.size and int(ql.max()) > MAX_QUERY_ROWS):
        raise ValueError(f"q_lens: {T} query rows, over the limit MAX_QUERY_ROWS = {MAX_QUERY_ROWS}")
    if max_splits is not None:
        if not isinstance(max_splits, (int, np.integer)) or isinstance(max_splits, (bool, np.bool_)):
            raise TypeError(f"max_splits: must be an int, got {type(max_splits).__name__}")
        if max_splits > MAX_WORK_ITEMS:
            raise ValueError(f"max_splits: {max_splits}, over the limit MAX_WORK_ITEMS = {MAX_WORK_ITEMS}")
    cap = default_max_splits if max_splits is None else max(int(max_splits), 1)
    if B * num_kv_heads > MAX_WORK_ITEMS:
        raise ValueError(f"seq_lens, num_kv_heads: {B} requests x {num_kv_heads} KV heads = {B * num_kv_heads} "
                         f"work items at least, over the limit MAX_WORK_ITEMS = {MAX_WORK_ITEMS}")
    try:
        pol = SplitPolicy.parse(policy)
    except ValueError:
        return  # make_plan reports a bad policy
    if pol.kind in ("fixed_size", "fixed_count") and B and ql.shape[0] == B:
        w = normalize_window(window_left)
        lo = np.zeros(B, np.int64) if w is None else np.maximum(0, seq - ql - w)
        lo = (lo // page_size) * page_size
        if pol.kind == "fixed_size":
            split = max(int(pol.value), 1)
            ranges = np.where(seq > 0, -(-seq // split) - lo // split, 1)
        else:
            pages = -(-(seq - lo) // page_size)
            ranges = np.where(seq > 0, np.minimum(int(pol.value) + 1, pages + 1), 1)
        items = int(np.clip(ranges, 1, None).sum()) * int(num_kv_heads)
        if items > MAX_WORK_ITEMS:
            raise ValueError(f"policy: {pol} cuts this batch into {items} work items before the max_splits "
                             f"cap, over the limit MAX_WORK_ITEMS = {MAX_WORK_ITEMS}; use a larger split")
    if graph_stable:
        n = B * num_kv_heads * cap if max_work_items is None else max_work_items
        if not isinstance(n, (int, np.integer)) or isinstance(n, bool):
            raise ValueError(f"max_work_items: must be an integer (graph-stable capacity), got {n!r}")
        if n > MAX_WORK_ITEMS:
            raise ValueError(f"max_work_items: {n} (graph-stable capacity), over the limit MAX_WORK_ITEMS = "
                             f"{MAX_WORK_ITEMS}")
        if T * cap > MAX_PARTIAL_SLOTS:
            raise ValueError(f"max_splits: {T} rows x {cap} slots = {T * cap} partial slots, over the limit "
                             f"MAX_PARTIAL_SLOTS = {MAX_PARTIAL_SLOTS}")


@dataclass(slots=True)
class Batch:
    """The checked inputs of :func:`make_plan` (int64 host arrays)."""

    prof: DeviceProfile
    pol: SplitPolicy
    seq: np.ndarray          # [B] lengths
    ql: np.ndarray | None    # [B] query rows, None: one each
    qsl: np.ndarray          # [B + 1]
    rows: int                # T, the query rows
    hq: int
    min_split: int
    cap: int
    max_items: int | None = None   # a graph-stable plan's capacity: auto's splits must fit it


def check_inputs(seq_lens, num_kv_heads, page_size, q_lens, query_start_loc, policy, device, num_q_heads,
                  head_dim, min_split_tokens, max_splits) -> Batch:
    """Parse and validate the arguments (errors in the documented order)."""
    prof = get_profile(device)
    pol = parse_policy(policy) if isinstance(policy, str) else SplitPolicy.parse(policy)
    seq = int_vector(seq_lens, "seq_lens")
    B = seq.shape[0]
    if B and seq.min() < 0:
        raise ValueError(f"seq_lens: must be >= 0, got {seq[seq < 0][:4].tolist()}")
    if page_size <= 0:
        raise ValueError(f"page_size: must be positive, got {page_size}")
    if num_kv_heads <= 0:
        raise ValueError(f"num_kv_heads: must be positive, got {num_kv_heads}")
    if query_start_loc is not None:
        qsl = int_vector(query_start_loc, "query_start_loc", "[B + 1]")
        if qsl.shape[0] != B + 1 or qsl[0] != 0 or (np.diff(qsl) < 0).any():
            raise ValueError("query_start_loc: must be [B + 1], start at 0 and be non-decreasing")
        ql = np.diff(qsl)
    elif q_lens is None:
        ql, qsl = None, np.arange(B + 1, dtype=np.int64)
    else:
        ql = int_vector(q_lens, "q_lens")
        if ql.shape[0] != B:
            raise ValueError(f"q_lens: must have one entry per request ({B}), got {ql.shape[0]}")
        if B and ql.min() < 0:
            raise ValueError("q_lens: must be >= 0")
        qsl = np.zeros(B + 1, np.int64)
        np.cumsum(ql, out=qsl[1:])
    hq = num_q_heads if num_q_heads is not None else num_kv_heads
    if hq <= 0 or hq % num_kv_heads:
        raise ValueError(f"num_q_heads: must be a positive multiple of num_kv_heads (GQA), got {hq} and {num_kv_heads}")
    if head_dim <= 0:
        raise ValueError(f"head_dim: must be positive, got {head_dim}")
    min_split = prof.min_split_tokens if min_split_tokens is None else int(min_split_tokens)
    if min_split < 0:
        raise ValueError(f"min_split_tokens: must be >= 0, got {min_split}")
    cap = prof.max_splits if max_splits is None else int(max_splits)
    if cap <= 0:
        raise ValueError(f"max_splits: must be positive, got {cap}")
    return Batch(prof, pol, seq, ql, qsl, int(qsl[-1]), hq, min_split, cap)


def validate_plan(plan, seq_lens=None, query_start_loc=None, *, window_left=None, num_kv_heads: int | None = None,
                  batch_size: int | None = None, coverage: bool = True) -> None:
    """Check a plan that came from outside (vectorised NumPy, no device memory): raise
    ``ValueError`` naming the field and the broken rule (:meth:`Plan.validate`).

    * shapes: item arrays ``[W]``, ``num_splits [B]``, ``query_start_loc [B + 1]`` from 0,
      non-decreasing, ``row_slot_start`` / ``row_num_splits [T]``;
    * valid items: ``0 <= request < B``, ``0 <= kv_head < Hkv``, ``0 <= split < num_splits[request]``,
      ``0 <= start <= end``; each (request, KV head, split) once; items past ``num_valid_items``
      are padding (request ``-1``, empty range);
    * coverage: each (request, KV head)'s ranges are disjoint, contiguous and cover exactly its
      visible span (:func:`~splitkv_common.plan_layout.visible_range`, from ``seq_lens``, default the plan's coverage):
      the first starts at or before the span's start (at most its page), the last ends at
      ``seq_len``;
    * slots: each row merges its request's ``num_splits`` slots,
      ``row_slot_start + row_num_splits <= num_slots``, and no two rows share a slot.

    ``seq_lens`` / ``query_start_loc`` (host arrays), ``window_left``, ``num_kv_heads`` and
    ``batch_size`` are the batch's, when known. ``coverage=False`` checks the ranges are disjoint
    but not that they cover the span (a context-parallel shard's plan covers its own part).
    """

    def fail(msg):
        raise ValueError(f"plan: {msg}")

    arrays = {k: np.asarray(getattr(plan, k)) for k in ("item_request", "item_kv_head", "item_split",
                                                          "item_kv_start", "item_kv_end", "num_splits",
                                                          "query_start_loc", "row_slot_start", "row_num_splits")}
    for k, a in arrays.items():
        if a.ndim != 1 or (a.size and a.dtype.kind not in "iu"):
            fail(f"{k} must be a 1-D integer array, got {a.dtype} {a.shape}")
    a = {k: v.astype(np.int64) for k, v in arrays.items()}
    W = a["item_request"].shape[0]
    for k in ("item_kv_head", "item_split", "item_kv_start", "item_kv_end"):
        if a[k].shape[0] != W:
            fail(f"{k} has {a[k].shape[0]} entries, item_request {W}")
    n = int(plan.num_valid_items)
    if not 0 <= n <= W:
        fail(f"num_valid_items {n} must lie in [0, {W}] (the work items)")
    B = a["num_splits"].shape[0]
    if batch_size is not None and B != int(batch_size):
        fail(f"made for {B} requests, the batch has {batch_size}")
    Hkv = int(plan.num_kv_heads)
    if num_kv_heads is not None and Hkv != int(num_kv_heads):
        fail(f"made for {Hkv} KV heads, the batch has {num_kv_heads}")
    if Hkv <= 0 or int(plan.page_size) <= 0:
        fail(f"num_kv_heads ({Hkv}) and page_size ({plan.page_size}) must be positive")
    qsl = a["query_start_loc"]
    if qsl.shape[0] != B + 1 or qsl[0] != 0 or (np.diff(qsl) < 0).any():
        fail(f"query_start_loc must be [B + 1] = [{B + 1}], start at 0 and be non-decreasing")
    if query_start_loc is not None:
        given = int_vector(query_start_loc, "query_start_loc", "[B + 1]")
        if not np.array_equal(given, qsl):
            fail("made for other query rows per request (query_start_loc differs)")
    T = int(qsl[-1])
    rs, rn = a["row_slot_start"], a["row_num_splits"]
    if rs.shape[0] != T or rn.shape[0] != T:
        fail(f"row_slot_start and row_num_splits must be [T] = [{T}] (query_start_loc[-1]), got "
             f"{rs.shape[0]} and {rn.shape[0]}")
    ns = a["num_splits"]
    if B and (ns < 1).any():
        fail(f"num_splits of request {int(np.argmax(ns < 1))} is {int(ns.min())}; every request has >= 1 split")
    # padding items
    pad = slice(n, W)
    if (a["item_request"][pad] != -1).any() or (a["item_kv_start"][pad] != a["item_kv_end"][pad]).any():
        fail(f"items past num_valid_items ({n}) must be padding: request -1 and an empty range")
    req, head, split = a["item_request"][:n], a["item_kv_head"][:n], a["item_split"][:n]
    start, end = a["item_kv_start"][:n], a["item_kv_end"][:n]
    for name, x, hi in (("item_request", req, B), ("item_kv_head", head, Hkv)):
        bad = (x < 0) | (x >= hi)
        if bad.any():
            w = int(np.argmax(bad))
            fail(f"{name}[{w}] = {int(x[w])} is out of range [0, {hi})")
    bad = (split < 0) | (split >= ns[req])
    if bad.any():
        w = int(np.argmax(bad))
        fail(f"item_split[{w}] = {int(split[w])} is out of range [0, {int(ns[req[w]])}) (num_splits of "
             f"request {int(req[w])})")
    bad = (start < 0) | (end < start)
    if bad.any():
        w = int(np.argmax(bad))
        fail(f"item {w} has range [{int(start[w])}, {int(end[w])}); ranges must satisfy 0 <= start <= end")
    # each (request, head, split) exactly once, and each (request, head) has num_splits items
    key = (req * Hkv + head) * (int(ns.max(initial=1)) + 1) + split
    if np.unique(key).size != n:
        fail("two work items have the same (request, KV head, split)")
    count = np.bincount(req * Hkv + head, minlength=B * Hkv).reshape(B, Hkv) if B else np.zeros((0, Hkv), np.int64)
    bad = count != ns[:, None]
    if bad.any():
        b, h = (int(i) for i in np.argwhere(bad)[0])
        fail(f"request {b}, KV head {h} has {int(count[b, h])} work items, its num_splits is {int(ns[b])}")
    # coverage: per (request, head), sorted by start, contiguous, from the span's page to seq_len
    if seq_lens is not None:
        seq = int_vector(seq_lens, "seq_lens")
        if seq.shape[0] != B:
            fail(f"made for {B} requests, seq_lens has {seq.shape[0]}")
    else:
        seq = plan.covered_seq_lens()
    ql = np.diff(qsl)
    wl = normalize_window(window_left)
    lo = np.zeros(B, np.int64) if wl is None else np.maximum(0, seq - ql - wl)
    lo = np.where(seq > 0, lo, 0)
    hi = np.maximum(seq, 0)
    if n:
        order = np.lexsort((end, start, req * Hkv + head))
        g, s_, e_ = (req * Hkv + head)[order], start[order], end[order]
        first = np.ones(n, bool)
        first[1:] = g[1:] != g[:-1]
        last = np.ones(n, bool)
        last[:-1] = g[1:] != g[:-1]
        if coverage:
            gap = ~first[1:] & (s_[1:] != e_[:-1]) if n > 1 else np.zeros(0, bool)
        else:
            gap = ~first[1:] & (s_[1:] < e_[:-1]) & (s_[1:] < e_[1:]) if n > 1 else np.zeros(0, bool)
        if gap.any():
            i = int(np.argmax(gap)) + 1
            b, h = divmod(int(g[i]), Hkv)
            fail(f"request {b}, KV head {h}: ranges [{int(s_[i - 1])}, {int(e_[i - 1])}) and "
                 f"[{int(s_[i])}, {int(e_[i])}) overlap or leave a gap")
        gb = g // Hkv
        page = int(plan.page_size)
        lo_page = (lo[gb] // page) * page
        some = hi[gb] > lo[gb]
        if coverage:
            bad_first = first & ((s_ > lo[gb]) | (s_ < lo_page)) & some
            bad_last = last & (e_ != hi[gb]) & some
            bad_empty = ~some & (e_ != s_)  # nothing visible: only empty ranges
        else:  # within the request's positions only
            bad_first = np.zeros(n, bool)
            bad_last = (e_ > hi[gb]) & (e_ > s_) & (seq_lens is not None)
            bad_empty = bad_first
        for bad, what in ((bad_first, "starts"), (bad_last, "ends"), (bad_empty, "ends")):
            if bad.any():
                i = int(np.argmax(bad))
                b, h = divmod(int(g[i]), Hkv)
                fail(f"request {b}, KV head {h}: its ranges {what} at {int(s_[i] if what == 'starts' else e_[i])}; "
                     f"its visible span is [{int(lo[b])}, {int(hi[b])}) (seq_len {int(seq[b])}); plan again")
    # slots
    if T:
        row_req = np.repeat(np.arange(B), ql)
        bad = rn != ns[row_req]
        if bad.any():
            t = int(np.argmax(bad))
            fail(f"row {t} merges {int(rn[t])} slots, its request {int(row_req[t])} has {int(ns[row_req[t]])} splits")
        bad = (rs < 0) | (rs + rn > int(plan.num_slots))
        if bad.any():
            t = int(np.argmax(bad))
            fail(f"row {t}: slots [{int(rs[t])}, {int(rs[t] + rn[t])}) are outside [0, num_slots = {plan.num_slots})")
        o = np.argsort(rs, kind="stable")
        if T > 1 and (rs[o][:-1] + rn[o][:-1] > rs[o][1:]).any():
            i = int(np.argmax(rs[o][:-1] + rn[o][:-1] > rs[o][1:]))
            fail(f"rows {int(o[i])} and {int(o[i + 1])} share partial slots")
    if int(plan.num_slots) < 0:
        fail(f"num_slots must be >= 0, got {plan.num_slots}")
    return plan
