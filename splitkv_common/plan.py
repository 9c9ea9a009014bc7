"""Split planning: which work items exist, which KV range each covers, where its partial goes.

A :class:`Plan` is plain data shared by every backend (NumPy, torch, Triton, Ascend C):

* **work items** ``[W]``: ``item_request``, ``item_kv_head``, ``item_split`` (the split's index in
  its request), ``item_kv_start`` / ``item_kv_end`` (a ``[start, end)`` range of logical KV
  positions). A work item covers every query row of its request and every query head of its KV
  head's GQA group. Padding items (graph-stable plans) have ``item_request == -1`` and an empty range.
* **partial slots**: the partial of query row ``t`` (global row, ``query_start_loc[b] + i``) from
  split ``j`` lives in slot ``row_slot_start[t] + j``; row ``t`` merges ``row_num_splits[t]``
  consecutive slots. Partials are float32 ``o [num_slots, Hq, D]`` and ``lse [num_slots, Hq]``
  (natural log).

Split boundaries fall on page boundaries (multiples of the split length, itself a multiple of the
page size, counted from logical position 0), except where a request's visible range starts or
ends. A request with no visible position still gets one (empty) work item per KV head, so every
output row is written by the same path.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from .devices import DeviceProfile, get_profile
from .validation import check_plan_limits

POLICIES = ("auto", "fixed_size", "fixed_count", "none")


@dataclass(frozen=True)
class SplitPolicy:
    """How to split: ``auto``; ``fixed_size`` (``value`` tokens, batch-invariant);
    ``fixed_count`` (``value`` splits per request); ``none`` (one split per request)."""

    kind: str = "auto"
    value: int = 0

    def __post_init__(self):
        if self.kind not in POLICIES:
            raise ValueError(f"policy: unknown kind {self.kind!r}; expected one of {POLICIES}")
        if self.kind in ("fixed_size", "fixed_count") and self.value <= 0:
            raise ValueError(f"policy: {self.kind} needs a positive value, got {self.value}")

    @classmethod
    def parse(cls, text: "str | SplitPolicy") -> "SplitPolicy":
        """Parse ``auto``, ``none``, ``size:N`` / ``fixed_size:N``, ``count:N`` / ``fixed_count:N``."""
        if isinstance(text, SplitPolicy):
            return text
        kind, _, val = str(text).partition(":")
        kind = {"size": "fixed_size", "count": "fixed_count"}.get(kind, kind)
        if kind in ("auto", "none"):
            if val:
                raise ValueError(f"policy: {kind!r} takes no value, got {text!r}")
            return cls(kind)
        try:
            return cls(kind, int(val))
        except ValueError as e:
            raise ValueError(f"policy: cannot parse {text!r} ({e}); use auto, none, size:N or count:N") from None

    def __str__(self):
        return self.kind if self.kind in ("auto", "none") else f"{self.kind}:{self.value}"


@dataclass(frozen=True)
class Plan:
    """A split plan (see module docstring for the layout). All arrays are int32 NumPy arrays."""

    item_request: np.ndarray
    item_kv_head: np.ndarray
    item_split: np.ndarray
    item_kv_start: np.ndarray
    item_kv_end: np.ndarray
    num_valid_items: int
    num_splits: np.ndarray       # [B] splits of each request
    query_start_loc: np.ndarray  # [B + 1]
    row_slot_start: np.ndarray   # [T]
    row_num_splits: np.ndarray   # [T]
    num_slots: int
    num_kv_heads: int
    page_size: int
    policy: SplitPolicy
    split_tokens: int            # the uniform split length chosen (0: one split per request)
    graph_stable: bool
    reason: str
    estimates_us: dict = field(default_factory=dict, compare=False)

    @property
    def num_items(self) -> int:
        """Work items including padding (the grid size of a split kernel)."""
        return int(self.item_request.shape[0])

    @property
    def batch_size(self) -> int:
        return int(self.num_splits.shape[0])

    @property
    def num_rows(self) -> int:
        return int(self.row_slot_start.shape[0])

    @property
    def max_splits(self) -> int:
        return int(self.row_num_splits.max(initial=1))

    def row_request(self) -> np.ndarray:
        """``[T]`` the request of each query row."""
        q_lens = np.diff(self.query_start_loc)
        return np.repeat(np.arange(self.batch_size, dtype=np.int32), q_lens)

    def workspace_bytes(self, num_q_heads: int, head_dim: int) -> int:
        """Bytes of the float32 partial buffers: ``o [num_slots, Hq, D]`` and ``lse [num_slots, Hq]``."""
        return int(self.num_slots) * int(num_q_heads) * (int(head_dim) + 1) * 4

    def kv_bytes_read(self, head_dim: int, kv_elem_bytes: int) -> int:
        """KV bytes the valid work items read (K and V, one KV head each)."""
        tokens = (self.item_kv_end - self.item_kv_start)[: self.num_valid_items].astype(np.int64).sum()
        return int(tokens) * int(head_dim) * 2 * int(kv_elem_bytes)

    def covered_seq_lens(self) -> np.ndarray:
        """``[B]`` int64: per request, the end of its last work item, i.e. the ``seq_len`` the plan was
        made for (0 for an empty request)."""
        n = self.num_valid_items
        seq = np.zeros(self.batch_size, np.int64)
        np.maximum.at(seq, self.item_request[:n], self.item_kv_end[:n])
        return seq

    def check_batch(self, seq_lens=None, query_start_loc=None) -> None:
        """Raise ``ValueError`` unless the batch's host ``seq_lens [B]`` / ``query_start_loc [B + 1]``
        (either may be omitted) are the ones this plan was made for."""
        if seq_lens is not None:
            sl = np.asarray(seq_lens).astype(np.int64).reshape(-1)
            if sl.shape[0] != self.batch_size:
                raise ValueError(f"plan: made for {self.batch_size} requests, the batch has {sl.shape[0]}")
            bad = np.flatnonzero(sl != self.covered_seq_lens())
            if bad.size:
                b = int(bad[0])
                raise ValueError(f"plan: covers {int(self.covered_seq_lens()[b])} KV tokens of request {b}, whose "
                                 f"seq_len is {int(sl[b])}; plan again for this batch")
        if query_start_loc is not None and not np.array_equal(np.asarray(query_start_loc).astype(np.int64).reshape(-1),
                                                              self.query_start_loc):
            raise ValueError("plan: made for other query rows per request (query_start_loc differs)")

    def validate(self, seq_lens=None, query_start_loc=None, *, window_left=None, num_kv_heads: int | None = None,
                 batch_size: int | None = None, coverage: bool = True) -> "Plan":
        """Check a plan that came from outside (vectorised NumPy, no device memory): raise
        ``ValueError`` naming the field and the broken rule, else return the plan.

        * shapes: item arrays ``[W]``, ``num_splits [B]``, ``query_start_loc [B + 1]`` from 0,
          non-decreasing, ``row_slot_start`` / ``row_num_splits [T]``;
        * valid items: ``0 <= request < B``, ``0 <= kv_head < Hkv``, ``0 <= split < num_splits[request]``,
          ``0 <= start <= end``; each (request, KV head, split) once; items past ``num_valid_items``
          are padding (request ``-1``, empty range);
        * coverage: each (request, KV head)'s ranges are disjoint, contiguous and cover exactly its
          visible span (:func:`visible_range`, from ``seq_lens``, default the plan's coverage):
          the first starts at or before the span's start (at most its page), the last ends at
          ``seq_len``;
        * slots: each row merges its request's ``num_splits`` slots,
          ``row_slot_start + row_num_splits <= num_slots``, and no two rows share a slot.

        ``seq_lens`` / ``query_start_loc`` (host arrays), ``window_left``, ``num_kv_heads`` and
        ``batch_size`` are the batch's, when known. ``coverage=False`` checks the ranges are disjoint
        but not that they cover the span (a context-parallel shard's plan covers its own part).
        """
        from .validation import normalize_window

        def fail(msg):
            raise ValueError(f"plan: {msg}")

        arrays = {k: np.asarray(getattr(self, k)) for k in ("item_request", "item_kv_head", "item_split",
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
        n = int(self.num_valid_items)
        if not 0 <= n <= W:
            fail(f"num_valid_items {n} must lie in [0, {W}] (the work items)")
        B = a["num_splits"].shape[0]
        if batch_size is not None and B != int(batch_size):
            fail(f"made for {B} requests, the batch has {batch_size}")
        Hkv = int(self.num_kv_heads)
        if num_kv_heads is not None and Hkv != int(num_kv_heads):
            fail(f"made for {Hkv} KV heads, the batch has {num_kv_heads}")
        if Hkv <= 0 or int(self.page_size) <= 0:
            fail(f"num_kv_heads ({Hkv}) and page_size ({self.page_size}) must be positive")
        qsl = a["query_start_loc"]
        if qsl.shape[0] != B + 1 or qsl[0] != 0 or (np.diff(qsl) < 0).any():
            fail(f"query_start_loc must be [B + 1] = [{B + 1}], start at 0 and be non-decreasing")
        if query_start_loc is not None:
            given = np.asarray(query_start_loc).astype(np.int64).reshape(-1)
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
            seq = np.asarray(seq_lens).astype(np.int64).reshape(-1)
            if seq.shape[0] != B:
                fail(f"made for {B} requests, seq_lens has {seq.shape[0]}")
        else:
            seq = self.covered_seq_lens()
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
            page = int(self.page_size)
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
            bad = (rs < 0) | (rs + rn > int(self.num_slots))
            if bad.any():
                t = int(np.argmax(bad))
                fail(f"row {t}: slots [{int(rs[t])}, {int(rs[t] + rn[t])}) are outside [0, num_slots = {self.num_slots})")
            o = np.argsort(rs, kind="stable")
            if T > 1 and (rs[o][:-1] + rn[o][:-1] > rs[o][1:]).any():
                i = int(np.argmax(rs[o][:-1] + rn[o][:-1] > rs[o][1:]))
                fail(f"rows {int(o[i])} and {int(o[i + 1])} share partial slots")
        if int(self.num_slots) < 0:
            fail(f"num_slots must be >= 0, got {self.num_slots}")
        return self

    def describe(self) -> str:
        """A human-readable summary with the reason for the choice."""
        lines = [
            f"policy {self.policy}: split length {self.split_tokens or 'whole request'} tokens, "
            f"{self.num_valid_items} work items ({self.num_items} with padding), {self.num_slots} partial slots",
            f"splits per request: {self.num_splits.tolist()}",
            f"reason: {self.reason}",
        ]
        return "\n".join(lines)


def visible_range(seq_len: int, q_len: int, window_left: int | None) -> tuple[int, int]:
    """``[lo, hi)``: logical KV positions any query row of the request can see.

    Query ``i`` sees ``p <= seq_len - q_len + i`` and, with a window, ``p >= pos - window_left``;
    the union over the rows is ``[max(0, seq_len - q_len - window_left), seq_len)``.
    """
    if seq_len <= 0:
        return 0, 0
    lo = 0 if window_left is None or window_left < 0 else max(0, seq_len - q_len - window_left)
    return lo, seq_len


def _round_up(x: int, m: int) -> int:
    return -(-x // m) * m


def _ranges(lo: int, hi: int, split: int, page: int) -> list[tuple[int, int]]:
    """Cut ``[lo, hi)`` at multiples of ``split`` (``0``: no cut), starting at the page holding ``lo``."""
    if hi <= lo:
        return [(0, 0)]
    start = (lo // page) * page
    if split <= 0:
        return [(start, hi)]
    out = []
    a = start
    while a < hi:
        b = min(hi, (a // split + 1) * split)
        out.append((a, b))
        a = b
    return out


def _estimate_us(spans, q_lens, split: int, *, num_kv_heads: int, num_q_heads: int, head_dim: int,
                 kv_elem_bytes: int, page: int, prof: DeviceProfile) -> tuple[float, float, int]:
    """Cost model: (attention µs, merge µs, work items) for a uniform split length (0: none)."""
    items_bytes = []
    partial_rows = 0
    for (lo, hi), ql in zip(spans, q_lens):
        rngs = _ranges(lo, hi, split, page)
        partial_rows += ql * len(rngs)
        items_bytes.extend([(b - a) * head_dim * 2 * kv_elem_bytes for a, b in rngs] * num_kv_heads)
    total = sum(items_bytes)
    w = len(items_bytes)
    waves = math.ceil(w / (prof.units * prof.items_per_unit))
    t_attn = (prof.launch_us + max(total / (prof.bandwidth_gbps * 1e3),
                                   max(items_bytes) / (prof.unit_bandwidth_gbps * 1e3))
              + waves * prof.item_overhead_us)
    multi = any(len(_ranges(lo, hi, split, page)) > 1 for lo, hi in spans)
    t_merge = 0.0
    if multi:
        t_merge = prof.launch_us + 2 * partial_rows * num_q_heads * (head_dim + 1) * 4 / (prof.bandwidth_gbps * 1e3)
    return t_attn, t_merge, w


def make_plan(seq_lens, *, num_kv_heads: int, page_size: int, q_lens=None, query_start_loc=None,
              policy: "str | SplitPolicy" = "auto", device: "str | DeviceProfile" = "h200",
              num_q_heads: int | None = None, head_dim: int = 128, kv_elem_bytes: int = 2,
              window_left: int | None = None, min_split_tokens: int | None = None,
              max_splits: int | None = None, graph_stable: bool = False,
              max_work_items: int | None = None) -> Plan:
    """Plan the split of a decode batch.

    Args:
        seq_lens: ``[B]`` valid KV tokens per request (current tokens included), ``>= 0``.
        num_kv_heads: ``Hkv``; one work item per (request, KV head, split).
        page_size: tokens per KV page; split boundaries are multiples of it.
        q_lens / query_start_loc: query rows per request (default one each).
        policy: ``auto``, ``none``, ``size:N`` (tokens, a multiple of ``page_size``) or ``count:N``.
        device: device profile name or object (``auto`` decides from it).
        num_q_heads, head_dim, kv_elem_bytes: shape facts for the cost model and workspace.
        window_left: sliding window (positions before ``pos - window_left`` are never read).
        min_split_tokens / max_splits: bounds ``auto`` respects (default: the profile's);
            ``max_splits`` caps every policy.
        graph_stable: fixed shapes for graph replay: ``max_splits`` slots per query row and
            ``max_work_items`` work items (padded with ``item_request = -1``).
        max_work_items: capacity of a graph-stable plan (default ``B * Hkv * max_splits``).
    """
    prof = get_profile(device)
    check_plan_limits(seq_lens, num_kv_heads=num_kv_heads, page_size=page_size, q_lens=q_lens, query_start_loc=query_start_loc, policy=policy, window_left=window_left, max_splits=max_splits, graph_stable=graph_stable, max_work_items=max_work_items, default_max_splits=prof.max_splits)  # noqa: E501
    pol = SplitPolicy.parse(policy)
    seq = np.asarray(seq_lens).astype(np.int64).reshape(-1)
    B = seq.shape[0]
    if (seq < 0).any():
        raise ValueError(f"seq_lens: must be >= 0, got {seq[seq < 0][:4].tolist()}")
    if page_size <= 0:
        raise ValueError(f"page_size: must be positive, got {page_size}")
    if num_kv_heads <= 0:
        raise ValueError(f"num_kv_heads: must be positive, got {num_kv_heads}")
    if query_start_loc is not None:
        qsl = np.asarray(query_start_loc).astype(np.int64).reshape(-1)
        if qsl.shape[0] != B + 1 or qsl[0] != 0 or (np.diff(qsl) < 0).any():
            raise ValueError("query_start_loc: must be [B + 1], start at 0 and be non-decreasing")
        ql = np.diff(qsl)
    else:
        ql = np.ones(B, np.int64) if q_lens is None else np.asarray(q_lens).astype(np.int64).reshape(-1)
        if ql.shape[0] != B:
            raise ValueError(f"q_lens: must have one entry per request ({B}), got {ql.shape[0]}")
        if (ql < 0).any():
            raise ValueError("q_lens: must be >= 0")
        qsl = np.concatenate([[0], np.cumsum(ql)])
    hq = num_q_heads if num_q_heads is not None else num_kv_heads
    if hq <= 0 or hq % num_kv_heads:
        raise ValueError(f"num_q_heads: must be a positive multiple of num_kv_heads (GQA), got {hq} and {num_kv_heads}")
    if head_dim <= 0:
        raise ValueError(f"head_dim: must be positive, got {head_dim}")
    min_split = prof.min_split_tokens if min_split_tokens is None else int(min_split_tokens)
    cap = prof.max_splits if max_splits is None else int(max_splits)
    if cap <= 0:
        raise ValueError(f"max_splits: must be positive, got {cap}")
    spans = [visible_range(int(s), int(q), window_left) for s, q in zip(seq, ql)]
    longest = max([hi - (lo // page_size) * page_size for lo, hi in spans], default=0)
    est = {}

    if pol.kind == "none":
        split, reason = 0, "policy none: one work item per (request, KV head)"
    elif pol.kind == "fixed_size":
        if pol.value % page_size:
            raise ValueError(f"split_size: {pol.value} tokens is not a multiple of page_size {page_size}")
        split, reason = pol.value, f"fixed split size {pol.value} tokens (batch-invariant boundaries)"
    elif pol.kind == "fixed_count":
        split = 0  # per request below
        reason = f"fixed split count {pol.value} per request (split length rounded up to the page size)"
    else:
        kw = dict(num_kv_heads=num_kv_heads, num_q_heads=hq, head_dim=head_dim, kv_elem_bytes=kv_elem_bytes,
                  page=page_size, prof=prof)
        cands = [0]
        s = _round_up(max(min_split, page_size), page_size)
        while s < longest:
            cands.append(s)
            s *= 2
        best = None
        for c in cands:
            if c and math.ceil(longest / c) > cap:
                continue
            if not spans:
                break
            ta, tm, w = _estimate_us(spans, ql, c, **kw)
            est[c] = {"attention_us": round(ta, 3), "merge_us": round(tm, 3), "work_items": w}
            total = ta + tm
            # prefer fewer splits unless the gain is over 3 %
            if best is None or total < best[1] * 0.97:
                best = (c, total)
        split = best[0] if best else 0
        if not est:
            reason = "auto: empty batch"
        else:
            none_t = est[0]["attention_us"] + est[0]["merge_us"]
            par = B * num_kv_heads
            if split == 0 and par >= prof.units:
                reason = (f"auto on {prof.name}: {par} (request, KV head) items already occupy "
                          f"{prof.units} units; splitting would add merge and per-split cost "
                          f"(no split est. {none_t:.1f} µs)")
            elif split == 0:
                reason = (f"auto on {prof.name}: {par} (request, KV head) items for {prof.units} units, but the "
                          f"history is too short for splitting to pay for its merge and per-split cost "
                          f"(no split est. {none_t:.1f} µs)")
            else:
                e = est[split]
                reason = (f"auto on {prof.name}: only {par} (request, KV head) items for {prof.units} units; "
                          f"splits of {split} tokens give {e['work_items']} items, est. "
                          f"{e['attention_us']:.1f} µs attention + {e['merge_us']:.1f} µs merge "
                          f"vs {none_t:.1f} µs unsplit")

    # per-request ranges
    per_req: list[list[tuple[int, int]]] = []
    for (lo, hi), q in zip(spans, ql):
        if pol.kind == "fixed_count":
            span = hi - (lo // page_size) * page_size
            s_b = _round_up(max(1, math.ceil(span / pol.value)), page_size) if span > 0 else 0
        else:
            s_b = split
        rngs = _ranges(lo, hi, s_b, page_size)
        # fixed_count: a window start off a split boundary can add a range; the count is a cap too
        limit = min(cap, pol.value) if pol.kind == "fixed_count" else cap
        if len(rngs) > limit:  # grow the split length to respect the cap
            span = hi - (lo // page_size) * page_size
            rngs = _ranges(lo, hi, _round_up(math.ceil(span / limit), page_size), page_size)
            while len(rngs) > limit:  # absolute boundaries can add one range; grow again
                s_b = _round_up(max(s_b, (rngs[1][0] - rngs[0][0])) + page_size, page_size)
                rngs = _ranges(lo, hi, s_b, page_size)
        per_req.append(rngs)

    num_splits = np.array([len(r) for r in per_req], np.int32)
    T = int(qsl[-1])
    row_req = np.repeat(np.arange(B), ql)
    row_ns = num_splits[row_req] if T else np.zeros(0, np.int32)
    if graph_stable:
        row_start = (np.arange(T) * cap).astype(np.int32)
        num_slots = T * cap
    else:
        row_start = np.concatenate([[0], np.cumsum(row_ns)[:-1]]).astype(np.int32) if T else np.zeros(0, np.int32)
        num_slots = int(row_ns.sum())

    items = [(b, h, j, a, e) for b, rngs in enumerate(per_req) for h in range(num_kv_heads)
             for j, (a, e) in enumerate(rngs)]
    n_valid = len(items)
    if graph_stable:
        cap_items = B * num_kv_heads * cap if max_work_items is None else int(max_work_items)
        if n_valid > cap_items:
            raise ValueError(f"max_work_items: the batch needs {n_valid} work items, over the capacity {cap_items}")
        items += [(-1, 0, 0, 0, 0)] * (cap_items - n_valid)
    arr = np.array(items, np.int32).reshape(-1, 5)
    return Plan(
        item_request=arr[:, 0].copy(), item_kv_head=arr[:, 1].copy(), item_split=arr[:, 2].copy(),
        item_kv_start=arr[:, 3].copy(), item_kv_end=arr[:, 4].copy(), num_valid_items=n_valid,
        num_splits=num_splits, query_start_loc=qsl.astype(np.int32), row_slot_start=row_start,
        row_num_splits=row_ns.astype(np.int32), num_slots=int(num_slots), num_kv_heads=int(num_kv_heads),
        page_size=int(page_size), policy=pol, split_tokens=int(split), graph_stable=bool(graph_stable),
        reason=reason, estimates_us=est)


@dataclass(frozen=True)
class PlanSpec:
    """The planning settings a backend's ``plan()`` / ``run()`` wrapper fixes at construction.

    One layer's shapes (``num_q_heads``, ``num_kv_heads``, ``head_dim``, ``page_size``, KV element
    bytes) and the split settings (``policy``, the device profile, graph stability and the caps);
    :meth:`make` plans a batch with them. Every wrapper plans through this, so they all cut a batch
    the same way for the same settings.
    """

    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    page_size: int
    kv_elem_bytes: int = 2
    policy: str = "auto"
    device: str = "h200"
    graph_stable: bool = False
    max_splits: int | None = None
    max_work_items: int | None = None
    min_split_tokens: int | None = None

    def check_shapes(self, plan: Plan, q, k_cache, v_cache, block_table, seq_lens=None, query_start_loc=None) -> None:
        """The metadata checks of a batch against these settings and ``plan`` (shapes only: no device
        memory is read): ``q [T, Hq, D]`` with ``T`` the plan's rows, ``k_cache``/``v_cache``
        ``[num_pages, page_size, Hkv, D]``, ``block_table [B, max_pages]``, ``seq_lens [B]``,
        ``query_start_loc [B + 1]`` with ``B`` the plan's requests. Raises ``ValueError``."""
        Hq, Hkv, D, page = self.num_q_heads, self.num_kv_heads, self.head_dim, self.page_size
        if len(q.shape) != 3 or tuple(q.shape[1:]) != (Hq, D):
            raise ValueError(f"q: must be [T, {Hq}, {D}], got {tuple(q.shape)}")
        if len(k_cache.shape) != 4 or tuple(k_cache.shape[1:]) != (page, Hkv, D):
            raise ValueError(f"k_cache: must be [num_pages, {page}, {Hkv}, {D}], got {tuple(k_cache.shape)}")
        if tuple(v_cache.shape) != tuple(k_cache.shape):
            raise ValueError(f"v_cache: shape must equal k_cache's {tuple(k_cache.shape)}, got {tuple(v_cache.shape)}")
        B = plan.batch_size
        if len(block_table.shape) != 2 or block_table.shape[0] != B:
            raise ValueError(f"plan: made for {B} requests, block_table has shape {tuple(block_table.shape)}")
        for name, x, n in (("seq_lens", seq_lens, B), ("query_start_loc", query_start_loc, B + 1)):
            if x is not None and tuple(x.shape) != (n,):
                raise ValueError(f"plan: made for {B} requests, {name} has shape {tuple(x.shape)} (must be [{n}])")
        if q.shape[0] != plan.num_rows:
            raise ValueError(f"plan: made for {plan.num_rows} query rows, q has {q.shape[0]}")

    def make(self, seq_lens, q_lens=None, query_start_loc=None, window_left: int | None = None) -> Plan:
        """Plan a batch: ``seq_lens [B]`` and optional ``q_lens [B]`` / ``query_start_loc [B + 1]``
        (host arrays); ``window_left`` None or ``-1`` for no window."""
        from .validation import normalize_window

        caps = dict(min_split_tokens=self.min_split_tokens, max_splits=self.max_splits,
                    max_work_items=self.max_work_items)
        return make_plan(np.asarray(seq_lens), num_kv_heads=self.num_kv_heads, page_size=self.page_size,
                         q_lens=None if q_lens is None else np.asarray(q_lens),
                         query_start_loc=None if query_start_loc is None else np.asarray(query_start_loc),
                         policy=self.policy, device=self.device, num_q_heads=self.num_q_heads,
                         head_dim=self.head_dim, kv_elem_bytes=self.kv_elem_bytes,
                         window_left=normalize_window(window_left), graph_stable=self.graph_stable,
                         **{k: v for k, v in caps.items() if v is not None})


class PlannedWrapper:
    """What every backend's ``plan()`` / ``run()`` wrapper shares: its settings as one
    :class:`PlanSpec` (``self.spec``), read back as attributes, and planning through it."""

    spec: PlanSpec

    num_q_heads = property(lambda self: self.spec.num_q_heads, doc="Hq")
    num_kv_heads = property(lambda self: self.spec.num_kv_heads, doc="Hkv")
    head_dim = property(lambda self: self.spec.head_dim, doc="D")
    page_size = property(lambda self: self.spec.page_size, doc="tokens per KV page")
    profile = property(lambda self: self.spec.device, doc="the planner's device profile")
    policy = property(lambda self: self.spec.policy, doc="the split policy")
    graph_stable = property(lambda self: self.spec.graph_stable, doc="fixed-shape plans for graph replay")
    max_splits = property(lambda self: self.spec.max_splits)
    max_work_items = property(lambda self: self.spec.max_work_items)
    min_split_tokens = property(lambda self: self.spec.min_split_tokens)

    def plan_spec(self) -> PlanSpec:
        """The planning settings of this wrapper (shared with every backend's wrapper)."""
        return self.spec

