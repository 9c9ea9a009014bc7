"""Split planning: which work items exist, which KV range each covers, where its partial goes.

A :class:`Plan` is plain data shared by every backend (NumPy, torch, Triton, Ascend C):

* **work items** ``[W]``: ``item_request``, ``item_kv_head``, ``item_split`` (the split's index in
  its request), ``item_kv_start`` / ``item_kv_end`` (a ``[start, end)`` range of logical KV
  positions). A work item covers every query row of its request and every query head of its KV
  head's GQA group. Padding items (graph-stable plans) have ``item_request == -1`` and an empty range.
  Items come request by request (KV head, then split, inside each); the order of the items does not
  change any result (each writes its own slot). A plan of more items than its device runs at once
  puts the requests that read the most tokens first (:func:`longest_first`), others keep the batch
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
from dataclasses import dataclass, field

import numpy as np

from .devices import DeviceProfile
from .plan_checks import Batch, validate_plan
from .policies import SplitPolicy, round_up
from .validation import int_vector


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
        # ``reason`` and ``estimates_us`` of an ``auto`` plan are made on first read (new_plan)
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
        ``ValueError`` naming the field and the broken rule, else return the plan. The rules and the
        arguments: :func:`~splitkv_common.plan_checks.validate_plan`."""
        validate_plan(self, seq_lens, query_start_loc, window_left=window_left, num_kv_heads=num_kv_heads,
                      batch_size=batch_size, coverage=coverage)
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


# --- the planner, as array steps ----------------------------------------------------------------
#
# A request's ranges follow from three numbers: ``start`` (the page holding its first visible
# position), ``end`` (its length) and its split length ``s``. With ``f = start // s`` there are
# ``(end - 1) // s - f + 1`` ranges and range ``j`` is ``[max(start, (f + j) * s), min(end, (f + j + 1) * s))``.
# So every step works on ``[B]`` arrays (``[C, B]`` for the ``auto`` candidates), never on lists of
# ranges. A request that sees nothing is planned as ``start = end = 0`` (its one empty range); a
# request that is not split has one range ``[start, end)`` whatever ``s`` is.


@dataclass(slots=True)
class Spans:
    """What each request reads: ``[start, end)``, the start on a page boundary (``[B]`` int64)."""

    start: np.ndarray     # the page holding the first visible position (0 where nothing is visible)
    end: np.ndarray       # seq_len (0 where nothing is visible)
    last: np.ndarray      # max(end - 1, 0), for range counts
    raw_span: np.ndarray  # seq_len minus the page holding lo, requests that see nothing included
    longest: int          # the longest raw span (the ``auto`` candidates stop below it)
    max_last: int         # the largest ``last``
    at_zero: bool         # every start is 0 (no window): the ``start`` terms drop out


def visible_spans(batch: Batch, window_left, page: int) -> Spans:
    """:func:`visible_range` of every request, its start moved down to a page boundary."""
    seq = batch.seq
    last = np.maximum(seq - 1, 0)
    longest = int(seq.max()) if seq.shape[0] else 0
    if window_left is None or window_left < 0:   # everything visible: [0, seq_len)
        return Spans(np.zeros(seq.shape[0], np.int64), seq, last, seq, longest, max(longest - 1, 0), True)
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
    return Spans(start, end, last, raw_span, longest, int(last.max(initial=0)), not start.any())


def range_counts(sp: Spans, s) -> np.ndarray:
    """Ranges per request for split length(s) ``s > 0`` (an int, ``[B]`` or ``[C, 1]``)."""
    if sp.at_zero:
        return sp.last // s + 1
    return sp.last // s - sp.start // s + 1


def _grow_to_cap(sp: Spans, s: np.ndarray, n: np.ndarray, limit: int, page: int):
    """Grow the split length of the requests with more than ``limit`` ranges until they fit.

    ``s``, ``n``: ``[B]`` split lengths and range counts, updated in place. Such a request first takes
    ``ceil(span / limit)`` rounded up to the page size; absolute boundaries can still give one range
    more, and then its length grows a page at a time from the larger of its policy length and that
    try's first range, until the count fits.
    """
    over = np.flatnonzero(n > limit)
    start, end, last = sp.start[over], sp.end[over], sp.last[over]
    s2 = round_up(-(-(end - start) // limit), page)
    bad = np.flatnonzero(last // s2 - start // s2 + 1 > limit)
    if bad.size:
        st, en, la = start[bad], end[bad], last[bad]
        first = np.minimum(en, (st // s2[bad] + 1) * s2[bad]) - st      # that try's first range
        g = round_up(np.maximum(s[over[bad]], first) + page, page)
        todo = np.arange(bad.size)
        while todo.size:
            f = st[todo] // g[todo]
            still = la[todo] // g[todo] - f + 1 > limit
            todo, f = todo[still], f[still]
            first = np.minimum(en[todo], (f + 1) * g[todo]) - st[todo]
            g[todo] = round_up(np.maximum(g[todo], first) + page, page)
        s2[bad] = g
    s[over] = s2
    n[over] = last // s2 - start // s2 + 1


def request_splits(sp: Spans, batch: Batch, split: int, page: int):
    """Each request's split length (an int when uniform, else ``[B]``; 0: no request split), range
    count ``[B]`` (int64) and the most ranges of one request, under the policy's rule and the cap."""
    pol, B = batch.pol, batch.seq.shape[0]
    if B == 0 or (split == 0 and pol.kind != "fixed_count"):
        return 0, np.ones(B, np.int64), 1
    if pol.kind == "fixed_count":
        span = sp.raw_span
        # no span only where nothing is visible: one empty range whatever the length
        s = np.where(span > 0, round_up(np.maximum(-(-span // pol.value), 1), page), page)
        limit = min(batch.cap, pol.value)   # a window start off a split boundary can add a range
        n = range_counts(sp, s)
        most = int(n.max())
    else:
        s, limit = split, batch.cap
        n = range_counts(sp, split)
        most = sp.max_last // split + 1 if sp.at_zero else int(n.max())
    if most > limit:
        s = np.full(B, s, np.int64) if not isinstance(s, np.ndarray) else s
        _grow_to_cap(sp, s, n, limit, page)
        most = int(n.max())
    return s, n, most


def alloc_items(W: int, capacity: int | None, reuse: "Plan | None" = None) -> np.ndarray:
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
def iota(n: int, dtype=np.int32) -> np.ndarray:
    """``arange(n)``, cached and read-only (the small index vectors every plan broadcasts)."""
    a = np.arange(n, dtype=dtype)
    a.flags.writeable = False
    return a


def fill_uniform(buf: np.ndarray, sp: Spans, s, B: int, hkv: int, N: int, order=None):
    """Work items when every request has ``N`` ranges: ``[B, Hkv, N]`` views, broadcast writes;
    ``order``: the requests' order (:func:`longest_first`; ``sp`` and ``s`` in it), None: 0..B-1."""
    if B == 0:
        return
    req, head, split, kv_start, kv_end = buf[:, :B * hkv * N].reshape(5, B, hkv, N)
    req[...] = (iota(B) if order is None else order)[:, None, None]
    head[...] = iota(hkv)[:, None]
    if N == 1:   # one range: [start, end)
        split[...] = 0
        kv_start[...] = 0 if sp.at_zero else sp.start[:, None, None]
        kv_end[...] = sp.end[:, None, None]
        return
    j = iota(N, np.int64)
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


def fill_ragged(buf: np.ndarray, sp: Spans, s, n: np.ndarray, hkv: int, W: int, order=None):
    """Work items for ragged range counts: one segment per (request, KV head) holding its ``n``
    ranges, ``j`` counting up inside each. Item-sized arithmetic is done in int32 (the plan's type)
    straight into the buffer's rows. ``order``: as :func:`fill_uniform`'s."""
    s_max = int(s.max()) if isinstance(s, np.ndarray) else int(s)
    if sp.max_last + 1 + s_max >= 2**31:   # positions near the int32 limit: go wide
        wide = np.zeros((5, W), np.int64)
        _fill_ragged_into(wide, sp, s, n, hkv, W, order)
        buf[:, :W] = wide
        return
    _fill_ragged_into(buf, sp, s, n, hkv, W, order)


def _fill_ragged_into(buf: np.ndarray, sp: Spans, s, n: np.ndarray, hkv: int, W: int, order=None):
    """:func:`fill_ragged`'s arithmetic, in ``buf``'s integer type."""
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


def order_items(prof: DeviceProfile) -> int:
    """The work items above which a plan puts its longest requests first (:func:`longest_first`):
    four per unit (528 on the H200), more than its programs run at once."""
    return 4 * prof.units


def longest_first(sp: Spans, s, n, W: int, hkv: int, above: int):
    """The requests' order in a plan of ``W`` items (``hkv`` per range): those reading the most
    tokens (``end - start``) first, ties in batch order (a stable sort), or None to keep the batch
    order. Only plans of more than ``above`` items that read tokens (:func:`order_items`; a request
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
    sp = Spans(None if sp.start is None else sp.start[order], sp.end[order], sp.last[order],
                sp.raw_span[order], sp.longest, sp.max_last, sp.at_zero)
    return (order.astype(np.int32), sp, s[order] if isinstance(s, np.ndarray) else s,
            None if n is None else n[order])


def work_items(sp: Spans, s, n: np.ndarray, most: int, hkv: int, capacity: int | None, reuse=None,
                order_above: int = 0):
    """The work-item arrays (int32 rows of one buffer): request-major (requests reading more tokens
    first above a size, :func:`longest_first`), then KV head, then split; padded
    to ``capacity`` (graph-stable plans) with ``item_request = -1`` and empty ranges.
    Returns the buffer and the count of valid items."""
    B = n.shape[0]
    R = int(n.sum()) if B else 0
    W = R * hkv
    buf = alloc_items(W, capacity, reuse)
    order, sp, s, n = longest_first(sp, s, n, W, hkv, order_above)
    if R == B * most:
        fill_uniform(buf, sp, s, B, hkv, most, order)
    else:
        fill_ragged(buf, sp, s, n, hkv, W, order)
    return buf, W


def partial_slots(num_splits: np.ndarray, ql, T: int, cap: int, graph_stable: bool):
    """``row_slot_start``, ``row_num_splits`` (``[T]`` int32) and ``num_slots`` for ``num_splits [B]``
    (int32) and ``ql [B]`` query rows per request (None: one each), ``T`` rows in all."""
    if T == 0:
        return np.zeros(0, np.int32), np.zeros(0, np.int32), 0
    row_ns = num_splits.copy() if ql is None else np.repeat(num_splits, ql)
    if graph_stable:
        return np.arange(0, T * cap, cap, dtype=np.int32), row_ns, T * cap
    ends = np.cumsum(row_ns, dtype=np.int64)
    return (ends - row_ns).astype(np.int32), row_ns, int(ends[-1])


def new_plan(buf, n_valid, num_splits, qsl, row_start, row_ns, num_slots, hkv, page, pol, split, graph_stable,
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


def with_fields(plan: "Plan", **changes) -> "Plan":
    """A copy of ``plan`` with ``changes`` (field name -> value), as ``dataclasses.replace`` but
    without making a lazy ``reason`` (:func:`new_plan`) first. The copy has no ``items`` buffer and
    none of the C planner's packed arrays (``_small``): its arrays may no longer be their rows."""
    unknown = set(changes) - {f for f in Plan.__dataclass_fields__ if f != "items"}
    if unknown:
        raise TypeError(f"with_fields: not fields of Plan: {sorted(unknown)}")
    p = object.__new__(Plan)
    d = p.__dict__
    d.update(plan.__dict__, **changes, items=None)
    d.pop("_small", None)
    return p
