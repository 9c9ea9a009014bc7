"""Split planning: which work items exist, which KV range each covers, where its partial goes.

A :class:`Plan` is plain data shared by every backend (NumPy, torch, Triton, Ascend C):

* **work items** ``[W]``: ``item_request``, ``item_kv_head``, ``item_split`` (the split's index in
  its request), ``item_kv_start`` / ``item_kv_end`` (a ``[start, end)`` range of logical KV
  positions). A work item covers every query row of its request and every query head of its KV
  head's GQA group. Padding items (graph-stable plans) have ``item_request == -1`` and an empty range.
  Items come request by request (KV head, then split, inside each); the order of the items does not
  change any result (each writes its own slot). A plan of more items than its device runs at once
  puts the requests that read the most tokens first (:func:`_longest_first`), others keep the batch
  order.
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

import functools
import itertools
import operator
from dataclasses import dataclass, field

import numpy as np

from .devices import DeviceProfile, get_profile
from . import validation as _limits
from .validation import MAX_SEQ_LEN, MAX_WORK_ITEMS, check_plan_limits, int_vector, normalize_window

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
        if self.kind in ("fixed_size", "fixed_count"):
            v = self.value
            if not isinstance(v, (int, np.integer)) or isinstance(v, (bool, np.bool_)):
                raise ValueError(f"policy: {self.kind} needs an integer value, got {v!r}")
            if v <= 0:
                raise ValueError(f"policy: {self.kind} needs a positive value, got {v}")
            # split lengths and counts are int32 in plans and kernels
            limit, name = (MAX_SEQ_LEN, "MAX_SEQ_LEN") if self.kind == "fixed_size" else (MAX_WORK_ITEMS, "MAX_WORK_ITEMS")
            if v > limit:
                raise ValueError(f"policy: {self.kind}:{v} is over the limit {name} = {limit}")

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
    # the [5, num_items] int32 buffer whose rows are the five item arrays, set by make_plan only
    # (its ``reuse`` takes it over); None for plans built field by field or copied by replace()
    items: "np.ndarray | None" = field(default=None, init=False, compare=False, repr=False)

    def __getattr__(self, name):
        # ``reason`` and ``estimates_us`` of an ``auto`` plan are made on first read (_new_plan)
        if name in ("reason", "estimates_us"):
            d = self.__dict__
            why = d.pop("_why", None)
            if why is not None:
                d["reason"], d["estimates_us"] = why[0](*why[1])
                return d[name]
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

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
        req, end = self.item_request[:n], self.item_kv_end[:n]
        if n and req[0] >= 0 and bool((req[1:] >= req[:-1]).all()):
            # the planners' order (each request's items together): one maximum per run of a request
            starts = np.flatnonzero(np.concatenate(([True], req[1:] != req[:-1])))
            seq[req[starts]] = np.maximum.reduceat(end, starts)
        else:
            np.maximum.at(seq, req, end)   # any order (slower: 1 ms for 10k items)
        return seq

    def check_batch(self, seq_lens=None, query_start_loc=None) -> None:
        """Raise ``ValueError`` unless the batch's host ``seq_lens [B]`` / ``query_start_loc [B + 1]``
        (either may be omitted) are the ones this plan was made for."""
        if seq_lens is not None:
            sl = int_vector(seq_lens, "seq_lens")
            if sl.shape[0] != self.batch_size:
                raise ValueError(f"plan: made for {self.batch_size} requests, the batch has {sl.shape[0]}")
            bad = np.flatnonzero(sl != self.covered_seq_lens())
            if bad.size:
                b = int(bad[0])
                raise ValueError(f"plan: covers {int(self.covered_seq_lens()[b])} KV tokens of request {b}, whose "
                                 f"seq_len is {int(sl[b])}; plan again for this batch")
        if query_start_loc is not None and not np.array_equal(int_vector(query_start_loc, "query_start_loc", "[B + 1]"),
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


def _round_up(x, m):
    """``x`` rounded up to a multiple of ``m`` (ints or int64 arrays)."""
    return -(-x // m) * m


# --- the planner, as array steps ----------------------------------------------------------------
#
# A request's ranges follow from three numbers: ``start`` (the page holding its first visible
# position), ``end`` (its length) and its split length ``s``. With ``f = start // s`` there are
# ``(end - 1) // s - f + 1`` ranges and range ``j`` is ``[max(start, (f + j) * s), min(end, (f + j + 1) * s))``.
# So every step works on ``[B]`` arrays (``[C, B]`` for the ``auto`` candidates), never on lists of
# ranges. A request that sees nothing is planned as ``start = end = 0`` (its one empty range); a
# request that is not split has one range ``[start, end)`` whatever ``s`` is.


@dataclass(slots=True)
class _Batch:
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


@dataclass(slots=True)
class _Spans:
    """What each request reads: ``[start, end)``, the start on a page boundary (``[B]`` int64)."""

    start: np.ndarray     # the page holding the first visible position (0 where nothing is visible)
    end: np.ndarray       # seq_len (0 where nothing is visible)
    last: np.ndarray      # max(end - 1, 0), for range counts
    raw_span: np.ndarray  # seq_len minus the page holding lo, requests that see nothing included
    longest: int          # the longest raw span (the ``auto`` candidates stop below it)
    max_last: int         # the largest ``last``
    at_zero: bool         # every start is 0 (no window): the ``start`` terms drop out


def _check_inputs(seq_lens, num_kv_heads, page_size, q_lens, query_start_loc, policy, device, num_q_heads,
                  head_dim, min_split_tokens, max_splits) -> _Batch:
    """Parse and validate the arguments (errors in the documented order)."""
    prof = get_profile(device)
    pol = _parse_policy(policy) if isinstance(policy, str) else SplitPolicy.parse(policy)
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
    return _Batch(prof, pol, seq, ql, qsl, int(qsl[-1]), hq, min_split, cap)


_parse_policy = functools.lru_cache(maxsize=64)(SplitPolicy.parse)   # policy text -> the (frozen) policy


def _spans(batch: _Batch, window_left, page: int) -> _Spans:
    """:func:`visible_range` of every request, its start moved down to a page boundary."""
    seq = batch.seq
    last = np.maximum(seq - 1, 0)
    longest = int(seq.max()) if seq.shape[0] else 0
    if window_left is None or window_left < 0:   # everything visible: [0, seq_len)
        return _Spans(np.zeros(seq.shape[0], np.int64), seq, last, seq, longest, max(longest - 1, 0), True)
    ql = 1 if batch.ql is None else batch.ql
    lo = np.maximum(seq - ql - window_left, 0)
    raw_start = lo // page * page
    raw_span = seq - raw_start
    longest = int(raw_span.max()) if seq.shape[0] else 0
    empty = seq <= lo                            # no row sees anything: one empty range
    if empty.any():
        start, end = np.where(empty, 0, raw_start), np.where(empty, 0, seq)
        last = np.maximum(end - 1, 0)
    else:
        start, end = raw_start, seq
    return _Spans(start, end, last, raw_span, longest, int(last.max(initial=0)), not start.any())


def _range_counts(sp: _Spans, s) -> np.ndarray:
    """Ranges per request for split length(s) ``s > 0`` (an int, ``[B]`` or ``[C, 1]``)."""
    if sp.at_zero:
        return sp.last // s + 1
    return sp.last // s - sp.start // s + 1


def _auto_candidates(longest: int, min_split: int, page: int, cap: int) -> list:
    """``auto``'s split lengths: none (0), then the page-rounded minimum doubled while under the
    longest request, leaving out those that would cut it into more than ``cap`` splits."""
    cands = [0]
    s = _round_up(max(min_split, page), page)
    while s < longest:
        if -(-longest // s) <= cap:
            cands.append(s)
        s *= 2
    return cands


@functools.lru_cache(maxsize=64)
def _column(values: tuple) -> np.ndarray:
    """``values`` as a read-only int64 ``[C, 1]`` column (the candidates, the same most steps)."""
    a = np.array(values, np.int64)[:, None]
    a.flags.writeable = False
    return a


def _candidate_stats(sp: _Spans, ql, cands: list):
    """Per candidate split length (``[C, B]`` arrays reduced over the batch): ranges in the batch,
    partial rows (query rows x ranges), the most ranges of one request and the longest range (tokens).
    Lists of Python ints, candidate 0 (no split) first."""
    B = sp.end.shape[0]
    rows0 = B if ql is None else int(ql.sum())
    longest_end = int((sp.end if sp.at_zero else sp.end - sp.start).max())   # the longest range unsplit
    ranges, rows, most, longest = [B], [rows0], [1], [longest_end]
    if len(cands) == 1:
        return ranges, rows, most, longest
    s = _column(tuple(cands[1:]))
    q = sp.last // s                                   # [C - 1, B] the split holding the last position
    extra = q if sp.at_zero else q - sp.start // s     # ranges - 1
    per_c = [x + B for x in extra.sum(axis=1).tolist()]
    ranges += per_c
    rows += per_c if ql is None else [x + rows0 for x in (extra @ ql).tolist()]
    if sp.at_zero:
        # ranges start on multiples of s: the most ranges are the longest request's, the longest
        # range a whole split or the longest request
        most += [sp.max_last // c + 1 for c in cands[1:]]
        longest += [min(c, longest_end) for c in cands[1:]]
        return ranges, rows, most, longest
    most_c = extra.max(axis=1) + 1
    most += most_c.tolist()
    # three ranges or more: a whole split is the longest; otherwise the longer of the end ranges
    longest += cands[1:]
    short = np.flatnonzero(most_c < 3)
    if short.size:
        s_, q_ = s[short], q[short]
        first = np.minimum(sp.end, (sp.start // s_ + 1) * s_) - sp.start
        tail = sp.end - np.maximum(sp.start, q_ * s_)
        for i, v in zip(short.tolist(), np.maximum(first, tail).max(axis=1).tolist()):
            longest[i + 1] = v
    return ranges, rows, most, longest


def _choose_auto(sp: _Spans, batch: _Batch, *, num_kv_heads: int, head_dim: int, kv_elem_bytes: int,
                 page: int):
    """``auto``: the cost model (``docs/planner.md``) for every candidate, the cheapest taken, fewer
    splits preferred unless more gain over 3 %. Returns the split length, the reason, the estimates.
    Ascend profiles (``cube_units``) take :func:`npu_auto` instead."""
    B = batch.seq.shape[0]
    if B == 0:
        return 0, "auto: empty batch", {}
    if batch.prof.cube_units:
        span = sp.end if sp.at_zero else sp.end - sp.start
        return npu_auto(batch.prof, int((span > 0).sum()), int(span.max()), num_kv_heads=num_kv_heads,
                        num_q_heads=batch.hq, head_dim=head_dim, kv_elem_bytes=kv_elem_bytes, page=page,
                        min_split=batch.min_split, cap=batch.cap)
    cands = _auto_candidates(sp.longest, batch.min_split, page, batch.cap)
    stats = _candidate_stats(sp, batch.ql, cands)
    lens_total = int(sp.end.sum()) if sp.at_zero else int((sp.end - sp.start).sum())
    return _auto_model(batch.prof, B, batch.hq, cands, stats, lens_total, num_kv_heads, head_dim, kv_elem_bytes,
                       batch.max_items)


def npu_auto(prof: DeviceProfile, active: int, longest: int, *, num_kv_heads: int, num_q_heads: int,
             head_dim: int, kv_elem_bytes: int, page: int, min_split: int, cap: int):
    """``auto`` on an Ascend profile: the split count from the cube-core count, as CANN's IFA does
    (about ``cube cores / (B * Hkv)``, splits no shorter than ``min_split``; docs/ascend-kernel.md).

    The mixed kernel runs one AI core (1 cube + 2 vector cores) per cube core, each taking a
    contiguous run of work items balanced by length. For ``s`` splits per request the busiest core
    holds ``ceil(active * Hkv * s / cube cores)`` items of ``longest / s`` tokens on average, each
    costing its bytes at the core's share of the bandwidth plus the profile's per-item overhead;
    the ``s`` that minimises it is taken, fewer splits unless more gain over 3 % (the combine and
    the per-item cost are not free). ``active``: requests that see a token; ``longest``: the longest
    span (tokens). Returns the split length (0: no split), the reason in words and the estimates
    per candidate split length (µs)."""
    cores = prof.cube_units or prof.units
    items = active * num_kv_heads
    if items == 0:
        return 0, f"auto on {prof.name}: no request sees a token", {}
    core_bw = prof.bandwidth_gbps * 1e3 / cores            # bytes per µs for one core
    token_bytes = head_dim * 2 * kv_elem_bytes
    most = max(1, min(cap, longest // max(min_split, page)))
    est, shape, best, best_t = {}, {}, None, None
    for want in range(1, most + 1):
        length = 0 if want == 1 else _round_up(-(-longest // want), page)
        count = 1 if want == 1 else -(-longest // length)
        if length in est or count != want:                # page rounding gave another count
            continue
        per_core = -(-items * count // cores)             # items on the busiest core (balanced by length)
        t_attn = prof.launch_us + per_core * (longest / count * token_bytes / core_bw + prof.item_overhead_us)
        t_merge = 0.0 if count == 1 else active * num_q_heads * count * (head_dim + 8) * 4 * 2 / (prof.bandwidth_gbps * 1e3)
        est[length] = {"attention_us": round(t_attn, 3), "merge_us": round(t_merge, 3), "work_items": items * count}
        shape[length] = (count, per_core)
        if best is None or t_attn + t_merge < best_t * 0.97:
            best, best_t = length, t_attn + t_merge
    none_t = est[0]["attention_us"]
    head = f"auto on {prof.name} (NPU rule, as CANN's IFA: about cube cores / (B * Hkv) splits)"
    if best == 0 and items >= cores:
        return 0, (f"{head}: {items} (request, KV head) items already occupy {cores} cube cores; splitting would "
                   f"not shorten the busiest core by 3 % (no split est. {none_t:.1f} µs)"), est
    if best == 0:
        return 0, (f"{head}: {items} (request, KV head) items for {cores} cube cores, but the history is too "
                   f"short for splits no shorter than {max(min_split, page)} tokens to pay (no split est. "
                   f"{none_t:.1f} µs)"), est
    e, (count, per_core) = est[best], shape[best]
    return best, (f"{head}: only {items} (request, KV head) items for {cores} cube cores; splits of {best} "
                  f"tokens ({count} per request) give {e['work_items']} items, {per_core} on "
                  f"the busiest core, est. {e['attention_us']:.1f} µs + {e['merge_us']:.1f} µs combine vs "
                  f"{none_t:.1f} µs unsplit"), est


def _lone_bandwidth(prof: DeviceProfile, head_dim: int, kv_elem_bytes: int, lone: bool) -> float:
    """The per-item bandwidth (bytes / µs) of a candidate of one item a unit (``DeviceProfile.lone_*``)
    at this head dim and KV element size, 0.0 where the profile has none for them or ``lone`` is off
    (graph-stable plans); the NumPy planner's and the C planner's (its settings) alike."""
    gbps = prof.lone_unit_bandwidth_gbps
    fits = head_dim == prof.lone_head_dim and kv_elem_bytes == prof.lone_kv_bytes
    return gbps * 1e3 if lone and gbps > 0 and fits else 0.0


def _auto_costs(prof: DeviceProfile, hq: int, cands: list, stats, lens_total: int, num_kv_heads: int,
                head_dim: int, kv_elem_bytes: int, lone: bool = True) -> list:
    """The cost model (``docs/planner.md``) of every candidate (``stats``: :func:`_candidate_stats`'s
    lists, ``lens_total``: the tokens read): ``(split, work items, attention µs, merge µs or None
    when the candidate does not split)`` each, every term computed as the loop planner did, bit for bit.
    ``lone``: candidates of one item a unit may take the profile's ``lone_*`` bandwidth (not for
    graph-stable plans)."""
    ranges, rows, most, longest = stats
    token_bytes = head_dim * 2 * kv_elem_bytes
    bw, unit_bw = prof.bandwidth_gbps * 1e3, prof.unit_bandwidth_gbps * 1e3
    lone_bw = _lone_bandwidth(prof, head_dim, kv_elem_bytes, lone)
    launch, per_wave, slots = prof.launch_us, prof.item_overhead_us, prof.units * prof.items_per_unit
    t_stream = lens_total * num_kv_heads * token_bytes / bw   # the same tokens whatever the split
    merge_bytes = 2 * hq * (head_dim + 1) * 4                  # per partial row (o and lse, written and read)
    out = []
    for c, r, pr, m, lg in zip(cands, ranges, rows, most, longest):
        w = r * num_kv_heads
        ubw = lone_bw if (lone_bw and w <= prof.units and lg >= prof.lone_min_tokens) else unit_bw
        t_attn = launch + max(t_stream, lg * token_bytes / ubw) + -(-w // slots) * per_wave
        out.append((c, w, t_attn, launch + pr * merge_bytes / bw if m > 1 else None))
    return out


def _auto_model(prof: DeviceProfile, B: int, hq: int, cands: list, stats, lens_total: int, num_kv_heads: int,
                head_dim: int, kv_elem_bytes: int, max_items: int | None = None):
    """The choice over the candidates' costs (:func:`_auto_costs`): the cheapest, fewer splits
    preferred unless more gain over 3 %. If that choice has more than ``max_items`` work items (a
    graph-stable plan's capacity), the same choice among the candidates that fit (no split always
    does), so a plan that fits is the plan made without a capacity. Returns the split length, None
    and ``(function, args)`` that make the reason and the estimates when a reader asks for them
    (:meth:`Plan.__getattr__`; formatting them costs more than choosing). ``max_items`` is given for
    graph-stable plans only, which do not take the profile's one-item-a-unit bandwidth."""
    costs = _auto_costs(prof, hq, cands, stats, lens_total, num_kv_heads, head_dim, kv_elem_bytes,
                        max_items is None)
    best_c, best_w = _cheapest(costs, None)
    if max_items is not None and best_w > max_items:
        best_c, _ = _cheapest(costs, max_items)
    return best_c, None, (_auto_explain, (best_c, costs, B * num_kv_heads, prof))


def _cheapest(costs: list, max_items: int | None):
    """``(split, work items)`` of the cheapest of ``costs`` (:func:`_auto_costs`' entries, in order),
    fewer splits preferred unless more gain over 3 %, among those of at most ``max_items`` items."""
    best_c = best_t = best_w = None
    for c, w, t_attn, t_merge in costs:
        if max_items is not None and w > max_items and best_c is not None:
            continue
        total = t_attn + (0.0 if t_merge is None else t_merge)
        if best_c is None or total < best_t * 0.97:
            best_c, best_t, best_w = c, total, w
    return best_c, best_w


def _auto_explain(split: int, costs: list, par: int, prof: DeviceProfile):
    """The reason and the estimates (µs, rounded as they always were) of an ``auto`` choice."""
    est = {}
    for c, w, t_attn, t_merge in costs:
        # rounded as NumPy rounds (multiply, round half to even, divide), as it always was
        est[c] = {"attention_us": round(t_attn, 3),
                  "merge_us": 0.0 if t_merge is None else round(t_merge * 1000.0) / 1000.0, "work_items": w}
    return _auto_reason(split, est, par, prof), est


def _auto_reason(split: int, est: dict, par: int, prof: DeviceProfile) -> str:
    none_t = est[0]["attention_us"] + est[0]["merge_us"]
    if split == 0 and par >= prof.units:
        return (f"auto on {prof.name}: {par} (request, KV head) items already occupy "
                f"{prof.units} units; splitting would add merge and per-split cost "
                f"(no split est. {none_t:.1f} µs)")
    if split == 0:
        return (f"auto on {prof.name}: {par} (request, KV head) items for {prof.units} units, but "
                f"splitting would not pay for its merge and per-split cost at these lengths "
                f"(no split est. {none_t:.1f} µs)")
    e = est[split]
    return (f"auto on {prof.name}: only {par} (request, KV head) items for {prof.units} units; "
            f"splits of {split} tokens give {e['work_items']} items, est. "
            f"{e['attention_us']:.1f} µs attention + {e['merge_us']:.1f} µs merge "
            f"vs {none_t:.1f} µs unsplit")


def _fixed_choice(pol: SplitPolicy, page: int):
    """The split length, reason and (empty) estimates of every policy but ``auto`` (None for it)."""
    if pol.kind == "none":
        return 0, "policy none: one work item per (request, KV head)", {}
    if pol.kind == "fixed_size":
        if pol.value % page:
            raise ValueError(f"split_size: {pol.value} tokens is not a multiple of page_size {page}")
        return pol.value, f"fixed split size {pol.value} tokens (batch-invariant boundaries)", {}
    if pol.kind == "fixed_count":
        return 0, f"fixed split count {pol.value} per request (split length rounded up to the page size)", {}
    return None


def _choose_split(sp: _Spans, batch: _Batch, *, num_kv_heads: int, head_dim: int, kv_elem_bytes: int,
                  page: int):
    """The policy's uniform split length (0: none, or per request for ``fixed_count``), the reason and
    the ``auto`` estimates."""
    fixed = _fixed_choice(batch.pol, page)
    if fixed is not None:
        return fixed
    return _choose_auto(sp, batch, num_kv_heads=num_kv_heads, head_dim=head_dim, kv_elem_bytes=kv_elem_bytes,
                        page=page)


def _grow_to_cap(sp: _Spans, s: np.ndarray, n: np.ndarray, limit: int, page: int):
    """Grow the split length of the requests with more than ``limit`` ranges until they fit.

    ``s``, ``n``: ``[B]`` split lengths and range counts, updated in place. Such a request first takes
    ``ceil(span / limit)`` rounded up to the page size; absolute boundaries can still give one range
    more, and then its length grows a page at a time from the larger of its policy length and that
    try's first range, until the count fits.
    """
    over = np.flatnonzero(n > limit)
    start, end, last = sp.start[over], sp.end[over], sp.last[over]
    s2 = _round_up(-(-(end - start) // limit), page)
    bad = np.flatnonzero(last // s2 - start // s2 + 1 > limit)
    if bad.size:
        st, en, la = start[bad], end[bad], last[bad]
        first = np.minimum(en, (st // s2[bad] + 1) * s2[bad]) - st      # that try's first range
        g = _round_up(np.maximum(s[over[bad]], first) + page, page)
        todo = np.arange(bad.size)
        while todo.size:
            f = st[todo] // g[todo]
            still = la[todo] // g[todo] - f + 1 > limit
            todo, f = todo[still], f[still]
            first = np.minimum(en[todo], (f + 1) * g[todo]) - st[todo]
            g[todo] = _round_up(np.maximum(g[todo], first) + page, page)
        s2[bad] = g
    s[over] = s2
    n[over] = last // s2 - start // s2 + 1


def _request_splits(sp: _Spans, batch: _Batch, split: int, page: int):
    """Each request's split length (an int when uniform, else ``[B]``; 0: no request split), range
    count ``[B]`` (int64) and the most ranges of one request, under the policy's rule and the cap."""
    pol, B = batch.pol, batch.seq.shape[0]
    if B == 0 or (split == 0 and pol.kind != "fixed_count"):
        return 0, np.ones(B, np.int64), 1
    if pol.kind == "fixed_count":
        span = sp.raw_span
        # no span only where nothing is visible: one empty range whatever the length
        s = np.where(span > 0, _round_up(np.maximum(-(-span // pol.value), 1), page), page)
        limit = min(batch.cap, pol.value)   # a window start off a split boundary can add a range
        n = _range_counts(sp, s)
        most = int(n.max())
    else:
        s, limit = split, batch.cap
        n = _range_counts(sp, split)
        most = sp.max_last // split + 1 if sp.at_zero else int(n.max())
    if most > limit:
        s = np.full(B, s, np.int64) if not isinstance(s, np.ndarray) else s
        _grow_to_cap(sp, s, n, limit, page)
        most = int(n.max())
    return s, n, most


def _alloc_items(W: int, capacity: int | None, reuse: "Plan | None" = None) -> np.ndarray:
    """One ``[5, size]`` int32 buffer whose rows are the work-item arrays: ``W`` valid entries to
    fill, then padding (request -1, zeros). A graph-stable ``reuse`` plan of the same capacity
    gives its buffer, re-padded only where its valid items went past ``W``."""
    size = W if capacity is None else capacity
    if capacity is not None and W > capacity:
        raise ValueError(f"max_work_items: the batch needs {W} work items, over the capacity {capacity}")
    old = None if reuse is None or capacity is None or not reuse.graph_stable else reuse.items
    if old is not None and old.shape == (5, size) and old.dtype == np.int32 and old.flags.c_contiguous:
        n = reuse.num_valid_items
        if n > W:
            old[0, W:n] = -1
            old[1:, W:n] = 0
        return old
    buf = np.empty((5, size), np.int32)
    if size > W:
        buf[0, W:] = -1
        buf[1:, W:] = 0
    return buf


@functools.lru_cache(maxsize=64)
def _iota(n: int, dtype=np.int32) -> np.ndarray:
    """``arange(n)``, cached and read-only (the small index vectors every plan broadcasts)."""
    a = np.arange(n, dtype=dtype)
    a.flags.writeable = False
    return a


def _fill_uniform(buf: np.ndarray, sp: _Spans, s, B: int, hkv: int, N: int, order=None):
    """Work items when every request has ``N`` ranges: ``[B, Hkv, N]`` views, broadcast writes;
    ``order``: the requests' order (:func:`_longest_first`; ``sp`` and ``s`` in it), None: 0..B-1."""
    if B == 0:
        return
    req, head, split, kv_start, kv_end = buf[:, :B * hkv * N].reshape(5, B, hkv, N)
    req[...] = (_iota(B) if order is None else order)[:, None, None]
    head[...] = _iota(hkv)[:, None]
    if N == 1:   # one range: [start, end)
        split[...] = 0
        kv_start[...] = 0 if sp.at_zero else sp.start[:, None, None]
        kv_end[...] = sp.end[:, None, None]
        return
    j = _iota(N, np.int64)
    split[...] = j
    if sp.at_zero and not isinstance(s, np.ndarray):
        a = j * s                                  # [N]: the same cuts for every request
        kv_start[...] = a
        kv_end[...] = np.minimum(sp.end[:, None], a + s)[:, None, :]
        return
    s_col = s if not isinstance(s, np.ndarray) else s[:, None]
    b = (sp.start[:, None] // s_col + j + 1) * s_col
    kv_start[...] = np.maximum(sp.start[:, None], b - s_col)[:, None, :]
    kv_end[...] = np.minimum(sp.end[:, None], b)[:, None, :]


def _fill_ragged(buf: np.ndarray, sp: _Spans, s, n: np.ndarray, hkv: int, W: int, order=None):
    """Work items for ragged range counts: one segment per (request, KV head) holding its ``n``
    ranges, ``j`` counting up inside each. Item-sized arithmetic is done in int32 (the plan's type)
    straight into the buffer's rows. ``order``: as :func:`_fill_uniform`'s."""
    s_max = int(s.max()) if isinstance(s, np.ndarray) else int(s)
    if sp.max_last + 1 + s_max >= 2**31:   # positions near the int32 limit: go wide
        wide = np.zeros((5, W), np.int64)
        _fill_ragged_into(wide, sp, s, n, hkv, W, order)
        buf[:, :W] = wide
        return
    _fill_ragged_into(buf, sp, s, n, hkv, W, order)


def _fill_ragged_into(buf: np.ndarray, sp: _Spans, s, n: np.ndarray, hkv: int, W: int, order=None):
    """:func:`_fill_ragged`'s arithmetic, in ``buf``'s integer type."""
    B = n.shape[0]
    dt = buf.dtype
    req, head, split, kv_start, kv_end = buf[:, :W]
    seg_len = np.repeat(n, hkv)                                       # [B * Hkv]
    seg_off = np.zeros(B * hkv, dt)
    np.cumsum(seg_len[:-1], out=seg_off[1:])
    seg = np.repeat(np.arange(B * hkv, dtype=dt), seg_len)            # [W] the item's segment
    if hkv & (hkv - 1) == 0:                                          # a power of two: shift and mask
        np.right_shift(seg, hkv.bit_length() - 1, out=req)
        np.bitwise_and(seg, hkv - 1, out=head)
    else:
        np.floor_divide(seg, hkv, out=req)
        np.subtract(seg, req * hkv, out=head)
    np.subtract(np.arange(W, dtype=dt), np.repeat(seg_off, seg_len), out=split)
    item_count = n * hkv
    if order is not None:   # the k-th block is request order[k]
        req[...] = np.repeat(order.astype(dt), item_count)
    end_i = np.repeat(sp.end.astype(dt), item_count)
    if sp.at_zero and not isinstance(s, np.ndarray):
        # ranges start on multiples of s: [j * s, min(end, (j + 1) * s))
        s = int(s)
        np.multiply(split, s, out=kv_start)
        np.add(kv_start, s, out=kv_end)
        np.minimum(kv_end, end_i, out=kv_end)
        return
    s_b = np.broadcast_to(np.asarray(s, np.int64), (B,))
    s_i = np.repeat(s_b.astype(dt), item_count)
    b = (np.repeat((sp.start // s_b).astype(dt), item_count) + split + 1) * s_i   # the range's split end
    np.maximum(np.repeat(sp.start.astype(dt), item_count), b - s_i, out=kv_start)
    np.minimum(end_i, b, out=kv_end)


def _order_items(prof: DeviceProfile) -> int:
    """The work items above which a plan puts its longest requests first (:func:`_longest_first`):
    four per unit (528 on the H200), more than its programs run at once."""
    return 4 * prof.units


# A graph-stable plan's default capacity where the policy leaves the work items to the planner
# (``auto`` on GPU profiles, ``none``): twice the batch's (request, KV head) pairs, at least 4 per
# unit (528 on the H200), at most the worst case ``B x Hkv x max_splits``. Its grid is the capacity:
# each padding program costs a launch slot (B 32 x 8k, 256 valid items: 269 µs with 528, 273-284 with
# 1,056, 290 with 2,112; run 41), and the whole plan is copied every step, 20 bytes an item (a 42 KB
# copy node cost 7 µs more than a 10 KB one, run 33). Against 8 per unit, the longer splits it makes
# auto take were 1-2 % faster at B 3-24 x 16k-64k and 1-2 % slower at B 8-16 x 128k-256k (run 41;
# docs/perf-notes.md)
_GRAPH_ITEMS_PER_UNIT = 4


def graph_capacity(batch_size: int, num_kv_heads: int, max_splits: int, policy: SplitPolicy,
                   prof: DeviceProfile, max_work_items: int | None = None) -> int:
    """The work-item capacity of a graph-stable plan: ``max_work_items`` if given; by default
    ``B x Hkv x max_splits`` (what ``size:N`` and ``count:N`` may need), and for ``auto`` on a GPU
    profile and ``none`` ``min(B x Hkv x max_splits, max(2 x B x Hkv, 4 x units))``: ``auto`` then
    chooses among the splits whose work items fit it (no split always does)."""
    if max_work_items is not None:
        return int(max_work_items)
    worst = batch_size * num_kv_heads * max_splits
    if policy.kind == "none" or (policy.kind == "auto" and not prof.cube_units):
        return min(worst, max(2 * batch_size * num_kv_heads, _GRAPH_ITEMS_PER_UNIT * prof.units))
    return worst


def _longest_first(sp: _Spans, s, n, W: int, hkv: int, above: int):
    """The requests' order in a plan of ``W`` items (``hkv`` per range): those reading the most
    tokens (``end - start``) first, ties in batch order (a stable sort), or None to keep the batch
    order. Only plans of more than ``above`` items that read tokens (:func:`_order_items`; a request
    reading none, such as the ``seq_len = 0`` padding of a captured batch, has one empty range per
    KV head, which costs its program a store), which the device runs in waves: it starts programs in
    grid order, so the longest requests no longer start last and set the tail. On the H200, eager
    ragged batches of 1,024-2,048 items ran 9-19 % faster, and plans of up to 520 items did not
    gain (+-2 %; run 21, docs/perf-notes.md). Graph-stable plans too, with a capacity near their
    items (:func:`graph_capacity`; run 22: B 256 ragged 1,169 -> 1,047 µs graph-stable).

    Returns ``(order [B] int32, sp, s, n)`` with the spans, split lengths and range counts in that
    order (the fills write the items of request ``order[k]`` k-th), or ``(None, sp, s, n)``."""
    if W <= above:
        return None, sp, s, n
    key = sp.end if sp.at_zero else sp.end - sp.start
    if key.shape[0] < 2 or bool((key[:-1] >= key[1:]).all()):
        return None, sp, s, n
    empty = key.shape[0] - int(np.count_nonzero(key))   # requests reading nothing: one range each
    if empty and W - empty * hkv <= above:
        return None, sp, s, n
    order = np.argsort(-key, kind="stable")
    sp = _Spans(None if sp.start is None else sp.start[order], sp.end[order], sp.last[order],
                sp.raw_span[order], sp.longest, sp.max_last, sp.at_zero)
    return (order.astype(np.int32), sp, s[order] if isinstance(s, np.ndarray) else s,
            None if n is None else n[order])


def _work_items(sp: _Spans, s, n: np.ndarray, most: int, hkv: int, capacity: int | None, reuse=None,
                order_above: int = 0):
    """The work-item arrays (int32 rows of one buffer): request-major (requests reading more tokens
    first above a size, :func:`_longest_first`), then KV head, then split; padded
    to ``capacity`` (graph-stable plans) with ``item_request = -1`` and empty ranges.
    Returns the buffer and the count of valid items."""
    B = n.shape[0]
    R = int(n.sum()) if B else 0
    W = R * hkv
    buf = _alloc_items(W, capacity, reuse)
    order, sp, s, n = _longest_first(sp, s, n, W, hkv, order_above)
    if R == B * most:
        _fill_uniform(buf, sp, s, B, hkv, most, order)
    else:
        _fill_ragged(buf, sp, s, n, hkv, W, order)
    return buf, W


def _slots(num_splits: np.ndarray, ql, T: int, cap: int, graph_stable: bool):
    """``row_slot_start``, ``row_num_splits`` (``[T]`` int32) and ``num_slots`` for ``num_splits [B]``
    (int32) and ``ql [B]`` query rows per request (None: one each), ``T`` rows in all."""
    if T == 0:
        return np.zeros(0, np.int32), np.zeros(0, np.int32), 0
    row_ns = num_splits.copy() if ql is None else np.repeat(num_splits, ql)
    if graph_stable:
        return np.arange(0, T * cap, cap, dtype=np.int32), row_ns, T * cap
    ends = np.cumsum(row_ns, dtype=np.int64)
    return (ends - row_ns).astype(np.int32), row_ns, int(ends[-1])


# --- the common decode case: no window, no count policy, inputs within every limit -------------------
#
# Most decode steps plan a batch without a sliding window under ``auto``, ``size:N`` or ``none``, with
# well-formed integer inputs. For those :func:`make_plan` skips the general path's argument parsing
# and limit checks (screened here without raising, in the order that makes the same errors
# come first) and plans with the same functions in the same order, so the plans are the same bit
# for bit: up to ``_SMALL_B`` requests with Python ints (NumPy's per-call overhead, about a
# microsecond a step, would be most of the time), above it with ``[B]`` arrays (the Python loops
# over candidates and requests cost as much as the arrays' overhead from about 10 requests on:
# ``auto`` at B 12 52 µs either way on the 2-core CPU, B 16 64 against 53). Anything else
# (windows, ``count:N``, the cap growing a split, any input error) goes the general way.

_SMALL_B = 10
_I32_LIMIT = 2**31


def _int_list(x):
    """``x`` as a list of Python ints when it is a 1-D NumPy integer array (not uint64) or a list /
    tuple of Python ints; else None (the general path converts it)."""
    if type(x) is np.ndarray:
        k = x.dtype.kind
        if x.ndim == 1 and (k == "i" or (k == "u" and x.dtype.itemsize < 8)):
            return x.tolist()
        return None
    if type(x) is list or type(x) is tuple:
        for v in x:
            if type(v) is not int:
                return None
        return list(x)
    return None


def _int_array(x):
    """``x`` as a 1-D int64 array when it is a 1-D NumPy integer array (not uint64) or a list / tuple
    of Python ints; else None."""
    if type(x) is not np.ndarray:
        x = _int_list(x)
        if x is None:
            return None
        try:
            x = np.array(x, np.int64) if x else np.zeros(0, np.int64)
        except OverflowError:   # beyond int64: the general path reports it
            return None
    k = x.dtype.kind
    if x.ndim != 1 or not (k == "i" or (k == "u" and x.dtype.itemsize < 8)):
        return None
    return x.astype(np.int64, copy=False)


@functools.lru_cache(maxsize=256)
def _uniform_template(n: int, s: int) -> np.ndarray:
    """``[3, n]`` int32 (read-only): split index, start and end of ``n`` ranges of ``s`` tokens from 0;
    the last end is a placeholder (the request's length goes there)."""
    j = np.arange(n, dtype=np.int64)
    t = np.stack([j, j * s, np.minimum((j + 1) * s, _I32_LIMIT - 1)]).astype(np.int32)
    t.flags.writeable = False
    return t


@dataclass(slots=True)
class _Fast:
    """The screened settings of a fast-path plan (Python ints)."""

    hkv: int
    page: int
    head_dim: int
    kv_elem_bytes: int
    num_q_heads: int | None
    min_split_tokens: int | None
    max_splits: int | None
    max_work_items: int | None
    graph_stable: bool
    reuse: "Plan | None"


def _fast_settings(num_kv_heads, page_size, head_dim, kv_elem_bytes, num_q_heads, window_left, min_split_tokens,
                   max_splits, max_work_items, graph_stable, reuse):
    """The scalar arguments when the fast path may plan with them (all Python ints within the
    limits, no window), else None. Raises nothing."""
    if window_left is not None and (type(window_left) is not int or window_left != -1):
        return None
    if type(num_kv_heads) is not int or type(page_size) is not int or type(head_dim) is not int \
            or type(kv_elem_bytes) is not int or (num_q_heads is not None and type(num_q_heads) is not int):
        return None
    if not (0 < num_kv_heads <= _limits.MAX_KV_HEADS and 0 < page_size <= _limits.MAX_SEQ_LEN):
        return None
    if max_splits is not None and (type(max_splits) is not int or max_splits > _limits.MAX_WORK_ITEMS):
        return None
    if max_work_items is not None and type(max_work_items) is not int:
        return None
    if min_split_tokens is not None and (type(min_split_tokens) is not int or min_split_tokens < 0):
        return None
    return _Fast(num_kv_heads, page_size, head_dim, kv_elem_bytes, num_q_heads, min_split_tokens, max_splits,
                 max_work_items, bool(graph_stable), reuse)


def _fast_policy(f: _Fast, policy, device, T: int):
    """The device profile, policy, ``Hq`` and cap of a fast-path plan, or None (the general path
    plans). Called once the batch is screened: raises only what the general path raises first then
    (an unknown device or a policy that does not parse), and nothing for ``T`` query rows over the
    limit (the general path reports those before the device)."""
    if T > _limits.MAX_QUERY_ROWS:
        return None
    prof = get_profile(device)
    pol = _parse_policy(policy) if isinstance(policy, str) else SplitPolicy.parse(policy)
    if pol.kind == "fixed_count":
        return None
    hq = f.num_q_heads if f.num_q_heads is not None else f.hkv
    if hq <= 0 or hq % f.hkv or f.head_dim <= 0:
        return None
    cap = prof.max_splits if f.max_splits is None else f.max_splits
    if cap <= 0 or (pol.kind == "fixed_size" and pol.value % f.page):
        return None
    return prof, pol, hq, cap


def _fast_capacity(f: _Fast, B: int, W: int, T: int, cap: int, capacity):
    """A graph-stable plan's work-item capacity (``capacity``: :func:`graph_capacity`'s; None when
    not graph-stable); False when the general path must plan (and report) it: a default capacity is
    checked against the limit by its worst case ``B * Hkv * cap``, as ``check_plan_limits`` does."""
    if W > _limits.MAX_WORK_ITEMS:
        return False
    if not f.graph_stable:
        return None
    worst = B * f.hkv * cap if f.max_work_items is None else capacity
    if W > capacity or worst > _limits.MAX_WORK_ITEMS or T * cap > _limits.MAX_PARTIAL_SLOTS:
        return False
    return capacity


def _plan_fast(seq_lens, q_lens, query_start_loc, policy, device, f: _Fast):
    """:func:`make_plan` for the common case (see above); None where the general path must plan."""
    t = type(seq_lens)
    if (t is np.ndarray and seq_lens.ndim == 1 and seq_lens.shape[0] > _SMALL_B) \
            or ((t is list or t is tuple) and len(seq_lens) > _SMALL_B):
        return _plan_wide(seq_lens, q_lens, query_start_loc, policy, device, f)
    return _plan_small(seq_lens, q_lens, query_start_loc, policy, device, f)


def _plan_small(seq_lens, q_lens, query_start_loc, policy, device, f: _Fast):
    """Up to ``_SMALL_B`` requests, from Python ints."""
    seq = _int_list(seq_lens)
    if seq is None:
        return None
    B = len(seq)
    if B == 0 or B > _SMALL_B:
        return None
    longest = max(seq)
    if min(seq) < 0 or longest >= _I32_LIMIT:
        return None
    # query rows
    if query_start_loc is not None:
        qsl = _int_list(query_start_loc)
        if qsl is None or len(qsl) != B + 1 or qsl[0] != 0:
            return None
        ql = [qsl[i + 1] - qsl[i] for i in range(B)]
        if min(ql) < 0:
            return None
    elif q_lens is None:
        ql, qsl = None, list(range(B + 1))
    else:
        ql = _int_list(q_lens)
        if ql is None or len(ql) != B or min(ql) < 0:
            return None
        qsl = [0]
        qsl += itertools.accumulate(ql)
    T = qsl[-1]
    hkv, page_size = f.hkv, f.page
    got = _fast_policy(f, policy, device, T)
    if got is None:
        return None
    prof, pol, hq, cap = got
    max_items = graph_capacity(B, hkv, cap, pol, prof, f.max_work_items) if f.graph_stable else None
    # the split length
    fixed = _fixed_choice(pol, page_size)
    if fixed is not None:
        split, reason, est = fixed
    elif prof.cube_units:   # Ascend profiles: the NPU rule (the general path calls the same function)
        min_split = prof.min_split_tokens if f.min_split_tokens is None else f.min_split_tokens
        split, reason, est = npu_auto(prof, sum(x > 0 for x in seq), longest, num_kv_heads=hkv, num_q_heads=hq,
                                      head_dim=f.head_dim, kv_elem_bytes=f.kv_elem_bytes, page=page_size,
                                      min_split=min_split, cap=cap)
    else:
        min_split = prof.min_split_tokens if f.min_split_tokens is None else f.min_split_tokens
        cands = _auto_candidates(longest, min_split, page_size, cap)
        # _candidate_stats without a window: every range starts on a multiple of the split length
        last = [x - 1 if x > 0 else 0 for x in seq]
        rows0 = B if ql is None else T
        ranges, rows, most_c, longest_c = [B], [rows0], [1], [longest]
        max_last = max(longest - 1, 0)
        for c in cands[1:]:
            q = [x // c for x in last]
            r = sum(q) + B
            ranges.append(r)
            rows.append(r if ql is None else sum([a * b for a, b in zip(q, ql)]) + rows0)
            most_c.append(max_last // c + 1)
            longest_c.append(min(c, longest))
        split, reason, est = _auto_model(prof, B, hq, cands, (ranges, rows, most_c, longest_c), sum(seq), hkv,
                                         f.head_dim, f.kv_elem_bytes, max_items)
    # ranges per request
    if split == 0:
        n, most = [1] * B, 1
    else:
        n = [(x - 1 if x > 0 else 0) // split + 1 for x in seq]
        most = max(n)
        if most > cap:   # the cap grows the split: the general path
            return None
    R = sum(n)
    W = R * hkv
    capacity = _fast_capacity(f, B, W, T, cap, max_items)
    if capacity is False:
        return None
    # work items (requests in batch order, or the longest first: _longest_first)
    order = None
    if W - hkv * seq.count(0) > _order_items(prof) and any(x < y for x, y in zip(seq, seq[1:])):
        order = sorted(range(B), key=lambda b: -seq[b])
    buf = _alloc_items(W, capacity, f.reuse)
    if R == B * most:   # every request has `most` ranges: [B, Hkv, N] broadcasts of one template
        v = buf[:, :W].reshape(5, B, hkv, most)
        v[0] = 0 if B == 1 else (_iota(B) if order is None else np.array(order, np.int32))[:, None, None]
        v[1] = _iota(hkv)[:, None]
        v[2:] = _uniform_template(most, split)[:, None, None, :]
        ends = seq if order is None else [seq[b] for b in order]
        v[4, :, :, most - 1] = seq[0] if B == 1 else np.array(ends, np.int32)[:, None]
    else:   # each request's block of Hkv x n items from its template
        head = _iota(hkv)[:, None]
        off = 0
        for b in range(B) if order is None else order:
            k = n[b]
            v = buf[:, off:off + hkv * k].reshape(5, hkv, k)
            v[0] = b
            v[1] = head
            v[2:] = _uniform_template(k, split)[:, None, :]
            v[4, :, k - 1] = seq[b]
            off += hkv * k
    # partial slots
    if T == 0:
        row_ns, row_start, num_slots = [], [], 0
    else:
        row_ns = n if ql is None else [k for k, q in zip(n, ql) for _ in range(q)]
        if f.graph_stable:
            row_start, num_slots = list(range(0, T * cap, cap)), T * cap
        else:
            row_start = [0]
            row_start += itertools.accumulate(row_ns[:-1])
            num_slots = row_start[-1] + row_ns[-1]
    # num_splits [B], query_start_loc [B + 1], row_slot_start [T], row_num_splits [T]: one int32 array
    small = np.array(n + qsl + row_start + row_ns, np.int32)
    b1, b2 = 2 * B + 1, 2 * B + 1 + T
    return _new_plan(buf, W, small[:B], small[B:b1], small[b1:b2], small[b2:], num_slots, hkv, page_size, pol,
                     split, f.graph_stable, reason, est)


def _plan_wide(seq_lens, q_lens, query_start_loc, policy, device, f: _Fast):
    """More than ``_SMALL_B`` requests, as ``[B]`` arrays (the general path's steps without its
    parsing and checks)."""
    seq = _int_array(seq_lens)
    if seq is None:
        return None
    B = seq.shape[0]
    if B == 0 or B > _limits.MAX_BATCH or B * f.hkv > _limits.MAX_WORK_ITEMS:
        return None
    longest = int(seq.max())
    if int(seq.min()) < 0 or longest >= _I32_LIMIT:
        return None
    if query_start_loc is not None:
        qsl = _int_array(query_start_loc)
        if qsl is None or qsl.shape[0] != B + 1 or qsl[0] != 0:
            return None
        ql = qsl[1:] - qsl[:-1]
        if int(ql.min()) < 0:
            return None
    elif q_lens is None:
        ql, qsl = None, _iota(B + 1, np.int64)
    else:
        ql = _int_array(q_lens)
        if ql is None or ql.shape[0] != B or int(ql.min()) < 0:
            return None
        qsl = np.zeros(B + 1, np.int64)
        np.cumsum(ql, out=qsl[1:])
    T = int(qsl[-1])
    got = _fast_policy(f, policy, device, T)
    if got is None:
        return None
    prof, pol, hq, cap = got
    hkv, page = f.hkv, f.page
    max_items = graph_capacity(B, hkv, cap, pol, prof, f.max_work_items) if f.graph_stable else None
    last = seq - 1
    np.maximum(last, 0, out=last)
    sp = _Spans(None, seq, last, seq, longest, max(longest - 1, 0), True)   # everything visible
    fixed = _fixed_choice(pol, page)
    if fixed is not None:
        split, reason, est = fixed
    else:
        batch = _Batch(prof, pol, seq, ql, qsl, T, hq,
                       prof.min_split_tokens if f.min_split_tokens is None else f.min_split_tokens, cap, max_items)
        split, reason, est = _choose_auto(sp, batch, num_kv_heads=hkv, head_dim=f.head_dim,
                                          kv_elem_bytes=f.kv_elem_bytes, page=page)
    if split == 0:
        n, most, R = None, 1, B
    else:
        most = sp.max_last // split + 1
        if most > cap:   # the cap grows the split: the general path
            return None
        n = last // split + 1
        R = int(n.sum())
    W = R * hkv
    capacity = _fast_capacity(f, B, W, T, cap, max_items)
    if capacity is False:
        return None
    buf = _alloc_items(W, capacity, f.reuse)
    order, osp, _, on = _longest_first(sp, split, n, W, hkv, _order_items(prof))
    if R == B * most:
        _fill_uniform(buf, osp, split, B, hkv, most, order)
    else:
        _fill_ragged(buf, osp, split, on, hkv, W, order)
    if n is None and ql is None and not f.graph_stable:   # a row and a split per request: slot b for row b
        num_splits, row_ns, row_start, num_slots = np.ones(B, np.int32), np.ones(B, np.int32), _iota(B).copy(), B
    else:
        num_splits = np.ones(B, np.int32) if n is None else n.astype(np.int32)
        row_start, row_ns, num_slots = _slots(num_splits, ql, T, cap, f.graph_stable)
    return _new_plan(buf, W, num_splits, qsl.astype(np.int32), row_start, row_ns, num_slots, hkv, page, pol, split,
                     f.graph_stable, reason, est)


def _new_plan(buf, n_valid, num_splits, qsl, row_start, row_ns, num_slots, hkv, page, pol, split, graph_stable,
              reason, est) -> "Plan":
    """A :class:`Plan` over the work-item buffer ``buf [5, W]`` (its rows are the item arrays),
    built without the dataclass constructor's per-field frozen assignments (a few µs a plan).
    ``reason`` None: ``est`` is ``(function, args)`` that makes both when read."""
    req, head, jsplit, kv_start, kv_end = buf
    p = object.__new__(Plan)
    d = p.__dict__
    d.update(item_request=req, item_kv_head=head, item_split=jsplit, item_kv_start=kv_start, item_kv_end=kv_end,
             num_valid_items=n_valid, num_splits=num_splits, query_start_loc=qsl, row_slot_start=row_start,
             row_num_splits=row_ns, num_slots=int(num_slots), num_kv_heads=hkv, page_size=page, policy=pol,
             split_tokens=int(split), graph_stable=bool(graph_stable), items=buf)
    if reason is None:
        d["_why"] = est
    else:
        d["reason"], d["estimates_us"] = reason, est
    return p


def make_plan(seq_lens, *, num_kv_heads: int, page_size: int, q_lens=None, query_start_loc=None,
              policy: "str | SplitPolicy" = "auto", device: "str | DeviceProfile" = "h200",
              num_q_heads: int | None = None, head_dim: int = 128, kv_elem_bytes: int = 2,
              window_left: int | None = None, min_split_tokens: int | None = None,
              max_splits: int | None = None, graph_stable: bool = False,
              max_work_items: int | None = None, reuse: "Plan | None" = None) -> Plan:
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
        max_work_items: capacity of a graph-stable plan (default :func:`graph_capacity`: ``B * Hkv *
            max_splits``, or for ``auto`` on a GPU profile and ``none`` about twice ``B * Hkv``, which
            ``auto``'s choice then fits).
        reuse: a graph-stable plan made earlier by this function (the previous step's): when the new
            plan is graph-stable with the same capacity it takes over ``reuse``'s work-item buffer and
            writes only what changes (the padding is there already), so a step costs its valid items,
            not the capacity. ``reuse`` is spent then: its item arrays hold the new plan's.

    The steps, each on ``[B]`` arrays (``docs/planner.md``): check the inputs, the visible spans, the
    policy's split length (``auto``: every candidate costed at once), each request's split length and
    range count under the cap, the work items, the partial slots.
    """
    if reuse is not None and not isinstance(reuse, Plan):
        raise TypeError(f"reuse: must be a Plan made by make_plan (the previous step's), got {type(reuse).__name__}")
    f = _fast_settings(num_kv_heads, page_size, head_dim, kv_elem_bytes, num_q_heads, window_left,
                       min_split_tokens, max_splits, max_work_items, graph_stable, reuse)
    if f is not None:
        fast = _plan_fast(seq_lens, q_lens, query_start_loc, policy, device, f)
        if fast is not None:   # planned only within the limits below
            return fast
    check_plan_limits(seq_lens, num_kv_heads=num_kv_heads, page_size=page_size, q_lens=q_lens,
                      query_start_loc=query_start_loc, policy=policy, window_left=window_left,
                      max_splits=max_splits, graph_stable=graph_stable, max_work_items=max_work_items,
                      default_max_splits=get_profile(device).max_splits)
    batch = _check_inputs(seq_lens, num_kv_heads, page_size, q_lens, query_start_loc, policy, device,
                          num_q_heads, head_dim, min_split_tokens, max_splits)
    num_kv_heads = operator.index(num_kv_heads)   # a Python int from here (work-item counts, shifts)
    capacity = None
    if graph_stable:
        capacity = graph_capacity(batch.seq.shape[0], num_kv_heads, batch.cap, batch.pol, batch.prof,
                                  None if max_work_items is None else int(max_work_items))
        batch.max_items = capacity
    sp = _spans(batch, window_left, page_size)
    split, reason, est = _choose_split(sp, batch, num_kv_heads=num_kv_heads, head_dim=head_dim,
                                       kv_elem_bytes=kv_elem_bytes, page=page_size)
    s, n, most = _request_splits(sp, batch, split, page_size)
    num_splits = n.astype(np.int32)
    row_start, row_ns, num_slots = _slots(num_splits, batch.ql, batch.rows, batch.cap, graph_stable)
    buf, n_valid = _work_items(sp, s, n, most, num_kv_heads, capacity, reuse, _order_items(batch.prof))
    return _new_plan(buf, n_valid, num_splits, batch.qsl.astype(np.int32), row_start, row_ns, num_slots,
                     num_kv_heads, int(page_size), batch.pol, split, graph_stable, reason, est)


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

    def items_from_index(self, plan: Plan) -> int:
        """The split length ``S`` with which a kernel can derive ``plan``'s work items (made by
        :meth:`make`) from its own index, as for a plan made on the device, or 0 where it cannot: item
        ``i`` of ``B x Hkv x N`` is request ``i // (Hkv N)``, KV head ``(i // N) % Hkv``, split ``j = i % N``,
        the range ``[j S, min((j + 1) S, seq_len))``. Two kinds of plan qualify:

        * unsplit (``N = 1``, ``S = 2**31 - 1``: one split past every length) with its requests in batch
          order (at most :func:`_order_items` items: a larger one may put its longest requests first),
          such as every one-item-an-SM plan;
        * one request's ``N >= 2`` splits of ``S`` tokens from position 0 (batch 1): since the
          prologue reads the request's fields in one round trip, 0.4-3.3 % faster than its item arrays
          on an H100, level at D 256 (run 124, docs/perf-notes.md; run 65 measured them slower before).

        Not graph-stable plans (padded, and their capture fixes the kernel), nor ranges that do not
        start at 0 (a window)."""
        W, B = plan.num_valid_items, plan.batch_size
        if plan.graph_stable or B == 0 or W != plan.num_items or plan.item_kv_start[0] != 0:
            return 0
        if W == B * self.num_kv_heads:
            if B > 1 and W > _order_items(get_profile(self.device)):
                return 0
            return 2 ** 31 - 1 if not plan.item_kv_start.any() else 0
        N = int(plan.num_splits[0])
        if B != 1 or W != N * self.num_kv_heads:
            return 0
        S, L = int(plan.item_kv_end[0]), int(plan.item_kv_end[N - 1])
        return S if S > 0 and -(-L // S) == N else 0

    def make(self, seq_lens, q_lens=None, query_start_loc=None, window_left: int | None = None,
             reuse: Plan | None = None) -> Plan:
        """Plan a batch: ``seq_lens [B]`` and optional ``q_lens [B]`` / ``query_start_loc [B + 1]``
        (host arrays); ``window_left`` None or ``-1`` for no window; ``reuse``: see :func:`make_plan`."""
        return make_plan(np.asarray(seq_lens), num_kv_heads=self.num_kv_heads, page_size=self.page_size,
                         q_lens=None if q_lens is None else np.asarray(q_lens),
                         query_start_loc=None if query_start_loc is None else np.asarray(query_start_loc),
                         policy=self.policy, device=self.device, num_q_heads=self.num_q_heads,
                         head_dim=self.head_dim, kv_elem_bytes=self.kv_elem_bytes,
                         window_left=None if window_left is None else normalize_window(window_left),
                         graph_stable=self.graph_stable, min_split_tokens=self.min_split_tokens,
                         max_splits=self.max_splits, max_work_items=self.max_work_items, reuse=reuse)


class NativePlanner:
    """:func:`make_plan` for one :class:`PlanSpec` through the C fast path (:mod:`splitkv_common.native`):
    the plans the NumPy planner makes, bit for bit, in one call, for the common decode case (no
    window; ``auto`` (the cost model on a GPU profile, :func:`npu_auto` on an Ascend one), ``size:N``
    or ``none``; 1-D int32 / int64 host arrays within the limits). :meth:`make` returns None for
    anything else, and the caller plans with NumPy (which reports every error). :meth:`for_spec` is
    None where the C module is unavailable or the settings never qualify (``count:N``, scalars the
    NumPy fast path would not take).

    A plan made here has the layout :func:`make_plan` gives (``items``, the ``[5, N]`` work-item
    buffer; the four small arrays are views of one int32 buffer), its ``reason`` and ``estimates_us``
    made by the NumPy planner when first read, and a graph-stable ``reuse`` plan's buffers written in
    place as :func:`make_plan` writes them."""

    _FORMAT = "=20q5d2qd"

    def __init__(self, spec: "PlanSpec", mod, settings: bytes, pol: SplitPolicy, fixed):
        self.spec, self._mod, self._settings, self._pol, self._fixed = spec, mod, settings, pol, fixed

    @classmethod
    def for_spec(cls, spec: "PlanSpec") -> "NativePlanner | None":
        from . import native
        import struct

        mod = native.load()
        if mod is None:
            return None
        f = _fast_settings(spec.num_kv_heads, spec.page_size, spec.head_dim, spec.kv_elem_bytes, spec.num_q_heads,
                           None, spec.min_split_tokens, spec.max_splits, spec.max_work_items, spec.graph_stable, None)
        if f is None:
            return None
        try:
            got = _fast_policy(f, spec.policy, spec.device, 0)
        except (ValueError, TypeError, KeyError):   # the NumPy planner reports it at make()
            return None
        if got is None:
            return None
        prof, pol, hq, cap = got
        if pol.kind not in ("auto", "fixed_size", "none"):
            return None
        # shapes in the C planner's int64 range (its costs' products are checked per batch)
        if not (hq <= _limits.MAX_KV_HEADS and 0 < f.head_dim <= 1 << 16 and 0 < f.kv_elem_bytes <= 16) or \
                (f.max_work_items is not None and f.max_work_items < 0) or pol.value >= _I32_LIMIT:
            return None
        kind = {"auto": 3 if prof.cube_units else 0, "fixed_size": 1, "none": 2}[pol.kind]   # 3: npu_auto
        min_split = prof.min_split_tokens if f.min_split_tokens is None else f.min_split_tokens
        cores = prof.cube_units or prof.units
        settings = struct.pack(
            cls._FORMAT, f.hkv, f.page, hq, f.head_dim * 2 * f.kv_elem_bytes, 2 * hq * (f.head_dim + 1) * 4,
            kind, pol.value if kind == 1 else 0, min_split, cap, int(f.graph_stable),
            -1 if f.max_work_items is None else f.max_work_items, _GRAPH_ITEMS_PER_UNIT * prof.units,
            prof.units * prof.items_per_unit,
            _order_items(prof), _limits.MAX_BATCH, _limits.MAX_QUERY_ROWS, _limits.MAX_WORK_ITEMS,
            _limits.MAX_PARTIAL_SLOTS, prof.units, prof.lone_min_tokens,
            prof.bandwidth_gbps * 1e3, prof.unit_bandwidth_gbps * 1e3, prof.launch_us, prof.item_overhead_us,
            _lone_bandwidth(prof, f.head_dim, f.kv_elem_bytes, not f.graph_stable),
            # npu_auto's cores, the combine's bytes a (request, split) and one core's bandwidth
            cores, hq * (f.head_dim + 8) * 4 * 2, prof.bandwidth_gbps * 1e3 / cores)
        if len(settings) != mod.SETTINGS_BYTES:
            return None
        return cls(spec, mod, settings, pol, _fixed_choice(pol, f.page))

    def make(self, seq_lens, q_lens=None, query_start_loc=None, reuse: "Plan | None" = None) -> "Plan | None":
        """The plan of ``seq_lens [B]`` (and ``q_lens [B]`` or ``query_start_loc [B + 1]``), or None
        where the NumPy planner must make it. ``reuse``: as :func:`make_plan`'s."""
        kind, q = query_rows_arg(q_lens, query_start_loc)
        items = small = None
        prev = -1
        if reuse is not None and reuse.graph_stable and self.spec.graph_stable:
            old = reuse.items
            if old is not None and old.dtype == np.int32 and old.flags.c_contiguous:
                items, prev = old, reuse.num_valid_items
                small = reuse.__dict__.get("_small")   # None (a NumPy-made plan): the C planner says its size
        mod, settings = self._mod, self._settings
        r = mod.plan(settings, seq_lens, kind, q, items, small, prev)
        if r is None:
            return None
        W, N, split, num_slots, B, T, max_q, max_end, filled = r
        if not filled:
            if items is None or items.shape[1] != N or not items.flags.writeable:
                items, prev = np.empty((5, N), np.int32), -1
            small = np.empty(2 * B + 1 + 2 * T, np.int32)
            r = mod.plan(settings, seq_lens, kind, q, items, small, prev)
            if r is None or not r[8]:
                return None
        b1, b2 = 2 * B + 1, 2 * B + 1 + T
        fixed = self._fixed
        if fixed is not None:
            reason, est = fixed[1], fixed[2]
        else:   # auto: the NumPy planner says why when asked, of the batch the arrays hold
            reason, est = None, (_plan_reason, (self.spec, items, small, W, B, kind))
        p = _new_plan(items, W, small[:B], small[B:b1], small[b1:b2], small[b2:b2 + T], num_slots, self.spec.num_kv_heads,
                      self.spec.page_size, self._pol, split, self.spec.graph_stable, reason, est)
        d = p.__dict__
        d["_small"], d["_max_q"], d["_max_end"], d["_kind"] = small, max_q, max_end, kind
        return p

    def refresher(self, batch_size: int, num_rows: int, most_rows: int, packed: np.ndarray, packed_size: int,
                  spare: "Plan", mine: "Plan", owner: object, uploader: object, wait):
        """The C object that refreshes a captured plan in one call (``plan_fast.c``'s ``Refresher``): each
        ``refresh(seq_lens, q_lens, query_start_loc)`` of a batch of ``batch_size`` requests and
        ``num_rows`` query rows (at most ``most_rows`` in one) plans into ``spare``'s buffers (then
        ``mine``'s, in turn), packs the plan and the batch's lengths into ``packed`` (the pinned int32
        buffer a captured copy reads; ``packed_size``: the plan's entries there) and sets the fields a
        wrapper's ``plan()`` sets: the plan object's, ``owner``'s plans in use (``_spare``, ``_mine``,
        ``_made``, ``host_plan``, ``_plan_pages``, ``plan_refreshes``) and ``uploader``'s record of its
        pack (``_layout[0]``, ``pending``, ``copied_in_capture``). ``wait()`` is called when the copy's
        event (``set_event``) is not known to be done. Both plans must be this planner's, at these sizes."""
        why = (None, None) if self._fixed is not None else (_plan_reason_of, self.spec)
        return self._mod.Refresher(self._settings, batch_size, num_rows, most_rows, packed, packed_size,
                                   self.spec.page_size, spare, mine, vars(owner), vars(uploader), uploader._layout,
                                   *why, wait)


def _plan_reason_of(spec: "PlanSpec", plan: "Plan"):
    """:func:`_plan_reason` of a C-made plan as it is now (a captured plan's refresh rewrites it in place)."""
    d = plan.__dict__
    return _plan_reason(spec, d["items"], d["_small"], d["num_valid_items"], plan.batch_size, d["_kind"])


def query_rows_arg(q_lens, query_start_loc) -> tuple:
    """The C planner's ``(q_kind, q)`` for a batch's query rows: ``(2, query_start_loc)``, ``(1, q_lens)``
    or ``(0, None)`` (one row each), ``query_start_loc`` first as :func:`make_plan` reads it."""
    if query_start_loc is not None:
        return 2, query_start_loc
    if q_lens is not None:
        return 1, q_lens
    return 0, None


def _plan_reason(spec: "PlanSpec", items: np.ndarray, small: np.ndarray, W: int, B: int, kind: int):
    """``(reason, estimates_us)`` of a C-made ``auto`` plan: the NumPy planner's, for the batch its
    arrays hold (read while the plan is valid): each request's length is its items' largest end
    (no window), its rows come from ``query_start_loc``."""
    seq = np.zeros(B, np.int64)
    np.maximum.at(seq, items[0, :W], items[4, :W])
    p = spec.make(seq, None, None if kind == 0 else small[B:2 * B + 1].copy())
    return p.reason, p.estimates_us


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

    # Graph-stable plans made by plan() are written into the buffer of the plan before the one in
    # use (make_plan's ``reuse``): a step costs its valid items, not the padded capacity. So a plan
    # returned by plan() stays valid until the second plan() after it.
    _made: Plan | None = None    # the last plan make_plan() returned
    _native: "NativePlanner | None | bool" = False   # the C planner for this spec (False: not looked up yet)
    _mine: Plan | None = None    # the plan in use, when make_plan() made it
    _spare: Plan | None = None   # a plan make_plan() made that is no longer in use (its buffer is reused)
    _refresh_with = None         # a C refresher of the two plans above (cuda_ref's plan_in_graph), or None

    def plan_spec(self) -> PlanSpec:
        """The planning settings of this wrapper (shared with every backend's wrapper)."""
        return self.spec

    def make_plan(self, seq_lens, q_lens=None, query_start_loc=None, window_left=None) -> Plan:
        """The plan ``plan()`` makes for a batch (host arrays), without putting it in use
        (``set_plan`` does): graph-stable plans are written into the buffer of a plan of this
        wrapper that is no longer in use."""
        spare, self._spare = self._spare, None
        # the spare's buffers are this plan's now: set_plan() makes a refresher again
        fast, self._refresh_with = self._refresh_with, None
        try:
            made = None
            if window_left is None:
                nat = self._native
                if nat is False:
                    nat = self._native = NativePlanner.for_spec(self.spec)
                if nat is not None:
                    made = nat.make(seq_lens, q_lens, query_start_loc, reuse=spare)
            if made is None:
                made = self.spec.make(seq_lens, q_lens, query_start_loc, window_left, reuse=spare)
        except BaseException:   # a refused batch leaves the wrapper as it was
            self._spare, self._refresh_with = spare, fast
            raise
        self._made = made
        return made

    def _retire_plan(self, plan: Plan) -> None:
        """``plan`` goes into use (set_plan): the plan of this wrapper in use before is spare now."""
        if self._mine is not None:
            self._spare = self._mine
        self._mine = plan if plan is self._made else None

