"""Shared-prefix ("cascade") decode: a prefix common to a group of requests is read once for all their
query rows, and its state is merged exactly with each request's state over its own tail.

The semantics (``docs/conventions.md``, "Shared prefixes"):

* A :class:`PrefixGroup` covers the contiguous requests ``[first, end)`` of the batch and a prefix of
  ``prefix_len`` tokens, a multiple of the page size, at logical positions ``[0, prefix_len)`` of
  every one of them. Its pages are ``prefix_pages`` (int32 ``[prefix_len / page_size]``), by default
  the first entries of the group's first request's block-table row; every covered request's
  block-table row starts with exactly these pages (checked where the block table is on the host).
* Every query row of a covered request comes after the prefix: ``seq_len - q_len >= prefix_len``.
  The prefix is history for all of them, so causality never cuts it; a sliding window may start
  inside it (each row then sees ``[max(0, q_pos - window_left), prefix_len)`` of it).
* The result is the plain decode's, computed as two states merged by :mod:`splitkv_common.merge`:
  the prefix state of row ``t`` over ``[0, prefix_len)`` and its tail state over
  ``[prefix_len, seq_len)`` (the tail is a plain decode of the shifted batch: block-table row
  ``b`` from column ``prefix_len / page_size`` on, length ``seq_len - prefix_len``). Soft cap,
  int8 KV, GQA, NaN rules: as the plain decode, since the states are the same states.
* Anything ambiguous is refused with a ``ValueError`` naming ``shared_prefix`` (or the argument)
  and the rule: overlapping or unsorted groups, a group outside the batch or empty, a prefix not
  a multiple of the page size, a query row inside the prefix, a block table that does not start
  with the prefix's pages, page ids out of range.

:func:`plan_shared_prefix` is the planner's decision (shared or plain, with a reason and the
estimates); :func:`shared_prefix_reference` is the float64 ground truth of the two-level
computation; :func:`shared_prefix_attention` the float32 NumPy route (the ``numpy`` backend's).
All lse are natural-log.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass, field

import numpy as np

from .devices import DeviceProfile, get_profile
from .dtypes import round_to
from .inputs import DecodeInputs
from .merge import merge_states
from .plan import Plan
from .plan_spec import PlanSpec
from .policies import lone_bandwidth
from .shared_prefix_cost import PREFIX_BLOCK_M, merge_us, packed_row_blocks, plan_bytes_and_items, prefix_split, stage_us
from .validation import MAX_SEQ_LEN, host, int_vector, normalize_window

#: ``auto`` takes the shared path only when its estimate is below this fraction of the plain one:
#: the cost model's error must not turn a small estimated gain into a measured loss.
SHARED_MARGIN = 0.8
MODES = ("auto", "on", "off")


def _int(x, what: str) -> int:
    if not isinstance(x, numbers.Integral) or isinstance(x, (bool, np.bool_)):
        raise ValueError(f"shared_prefix: {what} must be an int, got {x!r}")
    return int(x)


@dataclass(frozen=True)
class PrefixGroup:
    """Requests ``[first, end)`` of the batch share their first ``prefix_len`` tokens.

    Attributes:
        first, end: the covered requests, a contiguous range (``first < end``).
        prefix_len: shared tokens, a multiple of the page size, ``>= 0`` (0: nothing shared).
        prefix_pages: int32 ``[prefix_len / page_size]`` physical pages of the prefix, or None (the
            first entries of request ``first``'s block-table row).
    """

    first: int
    end: int
    prefix_len: int
    prefix_pages: "np.ndarray | None" = field(default=None, compare=False)


@dataclass(frozen=True)
class SharedPrefix:
    """What is shared in a batch: one or more :class:`PrefixGroup` (sorted, disjoint)."""

    groups: tuple

    @classmethod
    def single(cls, prefix_len: int, first: int = 0, end: "int | None" = None, batch_size: "int | None" = None,
               prefix_pages=None) -> "SharedPrefix":
        """One group: requests ``[first, end)`` (``end`` defaults to ``batch_size``)."""
        if end is None:
            if batch_size is None:
                raise ValueError("shared_prefix: give end or batch_size")
            end = batch_size
        return cls((PrefixGroup(first, end, prefix_len, prefix_pages),))

    @classmethod
    def from_common_prefix_len(cls, common_prefix_len: int, batch_size: int) -> "SharedPrefix":
        """vLLM's convention (its FlashAttention backend's cascade attention): the whole batch shares
        its first ``common_prefix_len`` tokens (a multiple of the block size; vLLM rounds it down
        so), whose pages are ``block_table[0, :common_prefix_len // page_size]``. 0: nothing shared."""
        return cls.single(common_prefix_len, 0, batch_size)


@dataclass(frozen=True)
class Groups:
    """A checked :class:`SharedPrefix` as arrays (groups with ``prefix_len > 0`` only).

    Attributes:
        first, end, prefix_len: int64 ``[G]``; pages: int32 ``[G, max_prefix_pages]`` (-1 padded).
        request_prefix: int64 ``[B]`` the prefix length of each request (0: not covered).
        row_start, row_end: int64 ``[G]`` the group's query rows ``[row_start, row_end)``.
    """

    first: np.ndarray
    end: np.ndarray
    prefix_len: np.ndarray
    pages: np.ndarray
    request_prefix: np.ndarray
    row_start: np.ndarray
    row_end: np.ndarray

    @property
    def num_groups(self) -> int:
        return int(self.first.shape[0])


def check_shared_prefix(shared_prefix, seq_lens, query_start_loc, page_size: int, block_table=None,
                        num_pages: "int | None" = None, require_pages: bool = True) -> Groups:
    """Check ``shared_prefix`` against a batch and return it as :class:`Groups`; host data only.

    Args:
        shared_prefix: a :class:`SharedPrefix`.
        seq_lens: ``[B]`` ints; query_start_loc: ``[B + 1]`` ints; page_size: tokens per page.
        block_table: ``[B, max_pages]`` (host) or None: when given, every covered request's row
            must start with the prefix's pages (and give them when ``prefix_pages`` is None).
        num_pages: the cache's pages, for the range check of ``prefix_pages``.
        require_pages: False (planning from lengths alone): a group without ``prefix_pages`` and no
            block table is legal and its pages are left unknown (-1); every route checks again with
            its block table.

    Raises ``ValueError`` naming ``shared_prefix`` and the rule (see the module doc).
    """
    if not isinstance(shared_prefix, SharedPrefix):
        raise TypeError(f"shared_prefix: expected a SharedPrefix, got {type(shared_prefix).__name__}")
    seq = int_vector(seq_lens, "seq_lens").astype(np.int64)
    B = seq.shape[0]
    qsl = int_vector(query_start_loc, "query_start_loc", "[B + 1]").astype(np.int64)
    if qsl.shape[0] != B + 1:
        raise ValueError(f"query_start_loc: must be [B + 1] = [{B + 1}], got {qsl.shape[0]} entries")
    page = _int(page_size, "page_size")
    if page <= 0:
        raise ValueError(f"page_size: must be > 0, got {page}")
    bt = None if block_table is None else host(block_table)
    groups = tuple(shared_prefix.groups)
    rows, pages_list = [], []
    prev_end = 0
    for i, g in enumerate(groups):
        if not isinstance(g, PrefixGroup):
            raise TypeError(f"shared_prefix: group {i} is a {type(g).__name__}, expected a PrefixGroup")
        first, end, L = _int(g.first, f"group {i}'s first"), _int(g.end, f"group {i}'s end"), \
            _int(g.prefix_len, f"group {i}'s prefix_len")
        if not 0 <= first < end <= B:
            raise ValueError(f"shared_prefix: group {i} covers requests [{first}, {end}), which must be a non-empty "
                             f"range inside the batch [0, {B})")
        if first < prev_end:
            raise ValueError(f"shared_prefix: group {i} starts at request {first}, before the previous group's end "
                             f"{prev_end}; groups must be sorted and disjoint")
        prev_end = end
        if L < 0 or L > MAX_SEQ_LEN:
            raise ValueError(f"shared_prefix: group {i}'s prefix_len {L} must be in [0, {MAX_SEQ_LEN}]")
        if L % page:
            raise ValueError(f"shared_prefix: group {i}'s prefix_len {L} must be a multiple of page_size {page} "
                             f"(round it down: the rest of its last page is each request's own tail)")
        ql = qsl[first + 1:end + 1] - qsl[first:end]
        hist = seq[first:end] - ql
        bad = np.flatnonzero(hist < L)
        if bad.size:
            b = first + int(bad[0])
            raise ValueError(f"shared_prefix: group {i}'s prefix_len {L} reaches request {b}'s query rows "
                             f"(seq_len {int(seq[b])} - q_len {int(ql[bad[0]])} = {int(hist[bad[0]])} < {L}); "
                             f"the prefix must precede every query row")
        if L == 0:
            continue
        n = L // page
        pp = g.prefix_pages
        if pp is None and bt is None and not require_pages:
            rows.append((first, end, L))
            pages_list.append(np.full(n, -1, np.int32))
            continue
        if pp is None:
            if bt is None:
                raise ValueError(f"shared_prefix: group {i} has no prefix_pages and no block table was given")
            pp = np.asarray(bt[first, :n])
        pp = np.asarray(pp)
        if pp.ndim != 1 or pp.shape[0] != n or not np.issubdtype(pp.dtype, np.integer):
            raise ValueError(f"shared_prefix: group {i}'s prefix_pages must be [prefix_len / page_size] = [{n}] "
                             f"ints, got shape {pp.shape} {pp.dtype}")
        hi = np.iinfo(np.int32).max if num_pages is None else int(num_pages)
        out = np.flatnonzero((pp < 0) | (pp >= hi))
        if out.size:
            raise ValueError(f"shared_prefix: group {i}'s prefix page {int(out[0])} = {int(pp[out[0]])} is out of "
                             f"range [0, {hi})")
        if bt is not None:
            if bt.shape[1] < n:
                raise ValueError(f"block_table: {bt.shape[1]} columns, fewer than group {i}'s {n} prefix pages")
            diff = np.argwhere(bt[first:end, :n] != pp[None, :])
            if diff.size:
                b, j = first + int(diff[0, 0]), int(diff[0, 1])
                raise ValueError(f"shared_prefix: group {i} covers request {b}, whose block_table[{b}, {j}] = "
                                 f"{int(bt[b, j])} is not the prefix's page {int(pp[j])}")
        rows.append((first, end, L))
        pages_list.append(pp.astype(np.int32))
    G = len(rows)
    arr = np.asarray(rows, np.int64).reshape(G, 3)
    width = max([p.shape[0] for p in pages_list], default=0)
    pages = np.full((G, max(width, 1)), -1, np.int32)
    for k, p in enumerate(pages_list):
        pages[k, :p.shape[0]] = p
    req = np.zeros(B, np.int64)
    for first, end, L in rows:
        req[first:end] = L
    return Groups(arr[:, 0], arr[:, 1], arr[:, 2], pages, req, qsl[arr[:, 0]], qsl[arr[:, 1]])


def tail_block_table(block_table: np.ndarray, request_prefix: np.ndarray, page_size: int) -> np.ndarray:
    """``[B, max_pages]`` int32: row ``b`` of ``block_table`` from column ``request_prefix[b] / page_size``
    on, padded with -1 (never read: the tail's length stops before)."""
    bt = np.asarray(block_table)
    B, W = bt.shape
    shift = (np.asarray(request_prefix, np.int64) // page_size)[:, None]
    col = np.arange(W)[None, :] + shift
    return np.where(col < W, bt[np.arange(B)[:, None], np.minimum(col, W - 1)], -1).astype(np.int32)


def tail_inputs(inp: DecodeInputs, groups: Groups) -> DecodeInputs:
    """The tails as a plain decode: block-table rows shifted past each request's prefix, lengths
    ``seq_len - prefix_len``; everything else (q, caches, scalars, int8 scales) is ``inp``'s."""
    page = inp.k_cache.shape[1]
    return DecodeInputs(
        q=inp.q, k_cache=inp.k_cache, v_cache=inp.v_cache,
        block_table=tail_block_table(inp.block_table, groups.request_prefix, page),
        seq_lens=(np.asarray(inp.seq_lens, np.int64) - groups.request_prefix).astype(np.int32),
        query_start_loc=inp.query_start_loc, dtype=inp.dtype, scale=inp.scale, soft_cap=inp.soft_cap,
        window_left=inp.window_left, k_scale=inp.k_scale, v_scale=inp.v_scale, k_offset=inp.k_offset,
        v_offset=inp.v_offset)


def row_positions(seq_lens, query_start_loc) -> np.ndarray:
    """``[T]`` int64: the logical position of every query row (``seq_len - q_len + i``)."""
    qsl = np.asarray(query_start_loc, np.int64)
    ql = np.diff(qsl)
    seq = np.asarray(seq_lens, np.int64)
    req = np.repeat(np.arange(ql.shape[0]), ql)
    return seq[req] - ql[req] + (np.arange(qsl[-1]) - qsl[req])


# --- the float64 reference ------------------------------------------------------------------------

def _prefix_state(inp: DecodeInputs, groups: Groups, dtype, K=None, V=None):
    """The prefix states of every covered row: ``o [T, Hq, D]``, ``lse [T, Hq]`` in ``dtype`` (rows
    not covered: ``0, -inf``). One matrix product per group: all its rows against its prefix's K/V."""
    from .reference import _finite, _poisoned, _scores

    T, Hq, D = inp.q.shape
    page, Hkv = inp.k_cache.shape[1], inp.k_cache.shape[2]
    group = Hq // Hkv
    if K is None:
        K, V = inp.dequantized_kv()
    o = np.zeros((T, Hq, D), dtype)
    lse = np.full((T, Hq), -np.inf, dtype)
    qpos = row_positions(inp.seq_lens, inp.query_start_loc)
    w = normalize_window(inp.window_left)
    for g in range(groups.num_groups):
        r0, r1, L = int(groups.row_start[g]), int(groups.row_end[g]), int(groups.prefix_len[g])
        if r1 == r0:
            continue
        pos = np.arange(L)
        pages = groups.pages[g, pos // page]
        k, bad_k = _finite(K[pages, pos % page].astype(dtype))                       # [L, Hkv, D]
        v, bad_v = _finite(V[pages, pos % page].astype(dtype))
        q, bad_q = _finite(np.asarray(inp.q[r0:r1]).astype(dtype))                  # [R, Hq, D]
        s = _scores(q, k, inp.scale, inp.soft_cap, group, dtype)                     # [R, Hq, L]
        mask = np.ones((r1 - r0, L), bool)
        if w is not None:
            mask = pos[None, :] >= (qpos[r0:r1, None] - w)
        mask = mask[:, None, :]
        bad = _poisoned(bad_q, np.repeat(bad_k | bad_v, group, axis=1), mask)
        any_vis = mask.any(-1)
        m = np.where(any_vis, np.max(np.where(mask, s, -np.inf), axis=-1), 0.0).astype(dtype)
        p = np.where(mask, np.exp(np.where(mask, s, m[..., None]) - m[..., None]), 0.0).astype(dtype)
        l = np.where(any_vis, p.sum(-1), 1.0).astype(dtype)
        vv = np.repeat(v, group, axis=1)
        oo = np.einsum("qhn,nhd->qhd", p, vv) / l[..., None]
        o[r0:r1] = np.where(bad[..., None], np.nan, np.where(any_vis[..., None], oo, 0.0))
        lse[r0:r1] = np.where(bad, np.nan, np.where(any_vis, m + np.log(l), -np.inf))
    return o, lse


def merge_two_f64(o_a, lse_a, o_b, lse_b) -> tuple[np.ndarray, np.ndarray]:
    """The exact merge of two float64 states (``o [..., D]``, natural-log ``lse [...]``), the rule of
    :mod:`splitkv_common.merge` kept in float64: empty states (``lse = +-inf``) are ignored, a NaN lse
    or a NaN / inf ``o`` of a non-empty state gives NaN."""
    lse = np.stack([lse_a, lse_b]).astype(np.float64)
    o = np.stack([o_a, o_b]).astype(np.float64)
    empty = np.isinf(lse)
    m = np.max(np.where(empty, -np.inf, lse), axis=0)
    all_empty = np.isinf(m)
    m_safe = np.where(all_empty, 0.0, m)
    wgt = np.where(empty, 0.0, np.exp(np.where(empty, 0.0, lse - m_safe)))
    tot = np.where(all_empty, 1.0, wgt.sum(0))
    o_ok = np.where(empty[..., None], 0.0, o)
    bad_o = (~empty[..., None] & ~np.isfinite(o)).any(0)
    with np.errstate(invalid="ignore", over="ignore"):
        out = (wgt[..., None] * np.where(np.isfinite(o_ok), o_ok, 0.0)).sum(0) / tot[..., None]
    out = np.where(all_empty[..., None], 0.0, np.where(bad_o, np.nan, out))
    out_lse = np.where(all_empty, -np.inf, m_safe + np.log(tot))
    return out, out_lse


def shared_prefix_reference(inp: DecodeInputs, shared_prefix: SharedPrefix) -> tuple[np.ndarray, np.ndarray]:
    """float64 ground truth of the two-level decode: ``out [T, Hq, D]``, ``lse [T, Hq]`` (natural log).

    The prefix state (all of a group's rows against its prefix, once) merged by :func:`merge_two_f64`
    with the tail state (:func:`~splitkv_common.reference.dense_attention` of :func:`tail_inputs`). It
    equals the plain :func:`~splitkv_common.reference.dense_attention` up to float64 rounding."""
    from .reference import dense_attention

    inp.validate()
    groups = check_shared_prefix(shared_prefix, inp.seq_lens, inp.query_start_loc, inp.k_cache.shape[1],
                                 inp.block_table, inp.k_cache.shape[0])
    po, pl = _prefix_state(inp, groups, np.float64)
    to, tl = dense_attention(tail_inputs(inp, groups))
    return merge_two_f64(po, pl, to, tl)


# --- the plan -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class SharedPrefixPlan:
    """The planner's decision for a batch with a shared prefix, and the plans that execute it.

    Attributes:
        use_shared: True: the two-level route (``prefix``, ``tail``, merge); False: ``plain``.
        reason, estimates_us: why (the cost comparison for the device profile), and the estimates.
        groups: the checked :class:`Groups`.
        plain: the plain plan of the batch (always made: the comparison needs it, and a backend
            falls back on it).
        prefix: the prefix stage's plan (None unless ``use_shared``): its "requests" are the groups
            (``seq_lens = prefix_len``), its query rows the groups' rows in batch order
            (``prefix_rows [Tp]`` their global rows), its work items ``(group, KV head, split,
            [start, end))``; made with no window (a row's window is applied inside the stage).
        tail: the tail stage's plan: the plain plan of :func:`tail_inputs` (same rows as the batch).
        row_slot_start, row_num_splits: int32 ``[T]``: the merged layout of both stages' partials:
            row ``t``'s tail partial ``j`` in slot ``row_slot_start[t] + j`` (``j <
            tail.row_num_splits[t]``), then its prefix partials; ``row_num_splits`` counts both.
        row_prefix_slot: int32 ``[T]`` the slot of a row's first prefix partial, -1 if not covered.
        num_slots: the merged layout's size.
    """

    use_shared: bool
    reason: str
    estimates_us: dict
    groups: Groups
    plain: Plan
    prefix: "Plan | None"
    tail: "Plan | None"
    prefix_rows: "np.ndarray | None"
    row_slot_start: "np.ndarray | None"
    row_num_splits: "np.ndarray | None"
    row_prefix_slot: "np.ndarray | None"
    num_slots: int
    mode: str = "auto"
    graph_stable: bool = False

    def describe(self) -> str:
        return (f"shared prefix: {'on' if self.use_shared else 'off'} ({self.mode}); "
                f"{self.groups.num_groups} group(s)\nreason: {self.reason}")


def _make(seq_lens, query_start_loc, window_left, common: dict) -> Plan:
    """The plan of a batch with the settings ``common`` (:meth:`PlanSpec.make_fast`: the C planner
    where it plans it, else NumPy)."""
    c = common
    spec = PlanSpec(c["num_q_heads"], c["num_kv_heads"], c["head_dim"], c["page_size"], c["kv_elem_bytes"],
                    str(c["policy"]), c["device"], c["graph_stable"])
    return spec.make_fast(seq_lens, query_start_loc=query_start_loc, window_left=window_left)


def plan_shared_prefix(seq_lens, query_start_loc, shared_prefix: "SharedPrefix | None", *, num_kv_heads: int,
                       page_size: int, num_q_heads: int, head_dim: int = 128, kv_elem_bytes: int = 2,
                       device: "str | DeviceProfile" = "h200", policy="auto", window_left=None,
                       block_table=None, num_pages: "int | None" = None, mode: str = "auto",
                       graph_stable: bool = False, max_batch: "int | None" = None,
                       block_m: int = PREFIX_BLOCK_M, prefix_policy=None) -> SharedPrefixPlan:
    """Decide between the shared-prefix route and the plain one, and plan it.

    Args:
        seq_lens ``[B]``, query_start_loc ``[B + 1]``: the batch (host ints).
        shared_prefix: a :class:`SharedPrefix` or None (plain).
        num_kv_heads, page_size, num_q_heads, head_dim, kv_elem_bytes: shape facts (bytes per KV element).
        device: the profile whose figures the estimates use (:mod:`splitkv_common.devices`).
        policy: the split policy of the plain, tail and prefix plans (``auto``, ``size:N``, ...).
        prefix_policy: the prefix plan's own split policy (None: ``policy``; under ``auto`` the length
            :func:`prefix_split` finds least: its work items run once per block of ``block_m`` packed
            rows, so its best split differs from a request's).
        window_left: the sliding window (None: none).
        block_table, num_pages: for the checks of :func:`check_shared_prefix`.
        mode: ``auto`` (the cost model decides), ``on`` (shared whenever a group shares > 0 tokens),
            ``off`` (plain).
        graph_stable: graph-stable plans (fixed shapes for replay): every row keeps
            ``tail.max_splits + prefix.max_splits`` slots.
        block_m: packed rows of one prefix program (the cost model counts each block's read).

    Cost model, per device profile: plain = its split stage (every request reads its whole
    history) + its merge; shared = the prefix stage (each group's prefix read once per block of
    ``block_m`` packed rows, its matrix work ``4 x rows x group x prefix_len x head_dim`` per KV head
    at the profile's ``dot_tflops``) + the tail stage + one merge of both stages' partials. ``auto``
    takes the shared route only below ``SHARED_MARGIN`` times the plain estimate. The decision is a
    pure function of its arguments (reproducible on the host).
    """
    if mode not in MODES:
        raise ValueError(f"mode: must be one of {MODES}, got {mode!r}")
    prof = get_profile(device)
    seq = int_vector(seq_lens, "seq_lens").astype(np.int64)
    qsl = int_vector(query_start_loc, "query_start_loc", "[B + 1]").astype(np.int64)
    window_left = normalize_window(window_left)
    common = dict(num_kv_heads=num_kv_heads, page_size=page_size, num_q_heads=num_q_heads, head_dim=head_dim,
                  kv_elem_bytes=kv_elem_bytes, device=prof, policy=policy, graph_stable=graph_stable)
    plain = _make(seq, qsl, window_left, common)
    sp = SharedPrefix(()) if shared_prefix is None else shared_prefix
    groups = check_shared_prefix(sp, seq, qsl, page_size, block_table, num_pages, require_pages=False)
    token_bytes = head_dim * 2 * kv_elem_bytes
    group = num_q_heads // num_kv_heads
    pb, pi, pl = plan_bytes_and_items(plain, token_bytes, num_kv_heads)
    lone = dict(lone_bw=lone_bandwidth(prof, head_dim, kv_elem_bytes, not graph_stable))
    floor = float((seq.sum() - sum(int(L) * (int(e - f) - 1) for f, e, L in
                                   zip(groups.first, groups.end, groups.prefix_len))) * token_bytes * num_kv_heads)
    t_plain = stage_us(prof, pb, pi, pl, reread_bytes=pb - floor, longest_tokens=int(pl // token_bytes), **lone) + (merge_us(prof, int(plain.row_num_splits[plain.row_num_splits > 1].sum()),
                                                       num_q_heads, head_dim) if plain.max_splits > 1 else 0.0)
    est = {"plain_us": round(t_plain, 3), "plain_bytes": pb, "unique_bytes": floor}

    def _plain(why):
        return SharedPrefixPlan(False, why, est, groups, plain, None, None, None, None, None, None, plain.num_slots,
                                mode, graph_stable)

    if mode == "off" or groups.num_groups == 0:
        return _plain(f"shared prefix off on {prof.name}: " + ("mode off" if mode == "off" else "no prefix shared"))
    # a window that leaves a group's prefix behind for every row: nothing of it is read
    if window_left is not None:
        qpos = row_positions(seq, qsl)
        keep = np.array([r1 > r0 and qpos[r0:r1].min() - window_left < L for r0, r1, L in
                         zip(groups.row_start, groups.row_end, groups.prefix_len)], bool)
        if not keep.all():
            groups = Groups(*(a[keep] for a in (groups.first, groups.end, groups.prefix_len, groups.pages)),
                            _request_prefix(seq.shape[0], groups, keep), groups.row_start[keep], groups.row_end[keep])
        if groups.num_groups == 0:
            return _plain(f"shared prefix off on {prof.name}: the window starts after every group's prefix")
    rows = (groups.row_end - groups.row_start).astype(np.int64)
    prefix_qsl = np.concatenate([[0], np.cumsum(rows)]).astype(np.int64)
    blocks = np.array([packed_row_blocks(int(r), group, block_m) for r in rows], np.int64)
    own, chosen = prefix_policy, ""
    if own is None and str(policy) == "auto":
        size, chosen = prefix_split(prof, groups.prefix_len, rows, blocks, num_kv_heads=num_kv_heads,
                                    num_q_heads=num_q_heads, head_dim=head_dim, token_bytes=token_bytes,
                                    page_size=page_size)
        own = f"size:{size}"
    try:
        prefix = _make(groups.prefix_len, prefix_qsl, None, dict(common, policy=policy if own is None else own))
    except ValueError as e:   # the plain plan took the lengths: here it is the prefix's own policy
        if prefix_policy is None:
            raise
        raise ValueError(f"prefix_policy: {e}") from None
    t_seq = seq - groups.request_prefix
    tail = _make(t_seq, qsl, window_left, common)
    n = prefix.num_valid_items
    item_blocks = blocks[prefix.item_request[:n]] if n else np.zeros(0, np.int64)
    lens = (prefix.item_kv_end[:n].astype(np.int64) - prefix.item_kv_start[:n])
    xb = float((lens * item_blocks).sum() * token_bytes)
    flops = float((lens * rows[prefix.item_request[:n]] if n else lens).sum()) * group * head_dim * 4
    t_prefix = stage_us(prof, xb, int(item_blocks.sum()), float(lens.max(initial=0) * token_bytes), flops,
                         reread_bytes=xb - float(lens.sum() * token_bytes))
    tb, ti, tlong = plan_bytes_and_items(tail, token_bytes, num_kv_heads)
    t_tail = stage_us(prof, tb, ti, tlong, longest_tokens=int(tlong // token_bytes), **lone)
    # slots: each row's tail partials then its prefix partials
    T = int(qsl[-1])
    tail_n = tail.row_num_splits.astype(np.int64)
    prefix_n = np.zeros(T, np.int64)
    prefix_rows = np.concatenate([np.arange(a, b) for a, b in zip(groups.row_start, groups.row_end)]).astype(np.int64) \
        if groups.num_groups else np.zeros(0, np.int64)
    prefix_n[prefix_rows] = prefix.row_num_splits
    if graph_stable:
        stride = int(tail_n.max(initial=1)) + int(prefix.row_num_splits.max(initial=1))
        row_start = np.arange(T, dtype=np.int64) * stride
        num_slots = T * stride
    else:
        counts = tail_n + prefix_n
        row_start = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64) if T else np.zeros(0, np.int64)
        num_slots = int(counts.sum())
    row_prefix = np.where(prefix_n > 0, row_start + tail_n, -1)
    t_merge = merge_us(prof, int((tail_n + prefix_n).sum()), num_q_heads, head_dim)
    t_shared = t_prefix + t_tail + t_merge
    est.update(shared_us=round(t_shared, 3), prefix_us=round(t_prefix, 3), tail_us=round(t_tail, 3),
               merge_us=round(t_merge, 3), shared_bytes=xb + tb)
    covered = int((groups.end - groups.first).sum())
    facts = (f"{groups.num_groups} group(s) of {covered} request(s) share {int(groups.prefix_len.max())} tokens "
             f"at most; "
             f"shared est. {t_shared:.1f} µs (prefix {t_prefix:.1f}: {xb / 1e6:.2f} MB for {int(rows.sum())} rows "
             f"x {group} heads in {int(blocks.sum())} blocks{chosen}; tails {t_tail:.1f}: {tb / 1e6:.2f} MB; merge "
             f"{t_merge:.1f}) vs plain est. {t_plain:.1f} µs ({pb / 1e6:.2f} MB); unique bytes {floor / 1e6:.2f} MB")
    if mode == "auto" and not t_shared < SHARED_MARGIN * t_plain:
        return _plain(f"shared prefix off on {prof.name} (auto): not below {SHARED_MARGIN} x plain; {facts}")
    why = f"shared prefix on on {prof.name} ({mode}): {facts}"
    i32 = lambda a: np.asarray(a, np.int32)  # noqa: E731
    return SharedPrefixPlan(True, why, est, groups, plain, prefix, tail, i32(prefix_rows), i32(row_start),
                            i32(tail_n + prefix_n), i32(row_prefix), num_slots, mode, graph_stable)


def _request_prefix(B: int, groups: Groups, keep: np.ndarray) -> np.ndarray:
    req = np.zeros(B, np.int64)
    for f, e, L in zip(groups.first[keep], groups.end[keep], groups.prefix_len[keep]):
        req[f:e] = L
    return req


def plan_for_inputs(inp: DecodeInputs, shared_prefix, *, device="h200", policy="auto", mode="auto",
                    **kw) -> SharedPrefixPlan:
    """:func:`plan_shared_prefix` for a :class:`DecodeInputs` (its shapes, window and block table)."""
    return plan_shared_prefix(inp.seq_lens, inp.query_start_loc, shared_prefix, num_kv_heads=inp.k_cache.shape[2],
                              page_size=inp.k_cache.shape[1], num_q_heads=inp.q.shape[1], head_dim=inp.q.shape[2],
                              kv_elem_bytes=1 if inp.kv_dtype == "int8" else (4 if inp.dtype == "float32" else 2),
                              device=device, policy=policy, window_left=inp.window_left, block_table=inp.block_table,
                              num_pages=inp.k_cache.shape[0], mode=mode, **kw)


def groups_as_shared_prefix(splan: SharedPrefixPlan, page_size: int) -> SharedPrefix:
    """The plan's (checked) groups as a :class:`SharedPrefix` with their pages: a batch given to a
    route is checked against what the plan was made for."""
    g = splan.groups
    return SharedPrefix(tuple(PrefixGroup(int(f), int(e), int(L), g.pages[k, :int(L) // page_size])
                              for k, (f, e, L) in enumerate(zip(g.first, g.end, g.prefix_len))))


# --- the NumPy route ------------------------------------------------------------------------------

def prefix_partials(inp: DecodeInputs, splan: SharedPrefixPlan) -> tuple[np.ndarray, np.ndarray]:
    """The prefix stage in float32: ``o [Tp, S, Hq, D]``, ``lse [Tp, S, Hq]`` for the prefix plan's
    rows ``Tp`` (global rows ``splan.prefix_rows``) and ``S = prefix.max_splits`` slots each (unused:
    ``0, -inf``). Each work item is one matrix product: all its group's rows x the GQA group against
    its ``[start, end)`` of the prefix."""
    from .reference import _finite, _poisoned, _scores, partial_state

    pp, groups = splan.prefix, splan.groups
    T, Hq, D = inp.q.shape
    page, Hkv = inp.k_cache.shape[1], inp.k_cache.shape[2]
    grp = Hq // Hkv
    K, V = (x.astype(np.float32) for x in inp.dequantized_kv())
    Tp = int(pp.query_start_loc[-1])
    S = max(int(pp.row_num_splits.max(initial=1)), 1)
    po = np.zeros((Tp, S, Hq, D), np.float32)
    pl = np.full((Tp, S, Hq), -np.inf, np.float32)
    qpos = row_positions(inp.seq_lens, inp.query_start_loc)
    w = inp.window_left
    for it in range(pp.num_valid_items):
        g, h, j = int(pp.item_request[it]), int(pp.item_kv_head[it]), int(pp.item_split[it])
        a, e = int(pp.item_kv_start[it]), int(pp.item_kv_end[it])
        p0, p1 = int(pp.query_start_loc[g]), int(pp.query_start_loc[g + 1])
        if e <= a or p1 == p0:
            continue
        rows = splan.prefix_rows[p0:p1]
        pos = np.arange(a, e)
        pages = groups.pages[g, pos // page]
        heads = slice(h * grp, (h + 1) * grp)
        k, bad_k = _finite(K[pages, pos % page, h:h + 1])                             # [n, 1, D]
        v, bad_v = _finite(V[pages, pos % page, h])                                   # [n, D]
        q, bad_q = _finite(np.asarray(inp.q[rows][:, heads], np.float32))             # [R, G, D]
        s = _scores(q, k, inp.scale, inp.soft_cap, grp, np.float32)                   # [R, G, n]
        mask = np.ones((rows.shape[0], e - a), bool) if w is None else pos[None, :] >= (qpos[rows, None] - w)
        mask = mask[:, None, :]
        o, lse = partial_state(s, v[None, None], np.broadcast_to(mask, s.shape))
        bad = _poisoned(bad_q, bad_k | bad_v[:, None], mask)
        po[p0:p1, j, heads] = np.where(bad[..., None], np.float32(np.nan), o)
        pl[p0:p1, j, heads] = np.where(bad, np.float32(np.nan), lse)
    return po, pl


def shared_prefix_attention(inp: DecodeInputs, splan: SharedPrefixPlan) -> tuple[np.ndarray, np.ndarray]:
    """The float32 NumPy route: ``out [T, Hq, D]`` (values of ``inp.dtype``), ``lse [T, Hq]`` float32.

    Shared: the prefix stage (:func:`prefix_partials`), the tails' partials
    (:func:`~splitkv_common.reference.split_partials` of :func:`tail_inputs` by ``splan.tail``),
    then each row's tail and prefix partials merged at once by :func:`~splitkv_common.merge.merge_states`.
    Plain: :func:`~splitkv_common.reference.split_attention` by ``splan.plain``."""
    from .reference import split_attention, split_partials

    if not isinstance(splan, SharedPrefixPlan):
        raise TypeError(f"splan: expected a SharedPrefixPlan, got {type(splan).__name__}")
    if not splan.use_shared:
        return split_attention(inp, splan.plain)
    inp.validate()
    page = inp.k_cache.shape[1]
    check_shared_prefix(groups_as_shared_prefix(splan, page), inp.seq_lens, inp.query_start_loc, page, inp.block_table,
                        inp.k_cache.shape[0])
    tin = tail_inputs(inp, splan.groups)
    splan.tail.validate(tin.seq_lens, tin.query_start_loc, window_left=tin.window_left,
                        num_kv_heads=inp.k_cache.shape[2])
    T, Hq, D = inp.q.shape
    to, tl = split_partials(tin, splan.tail)
    St = max(int(splan.tail.row_num_splits.max(initial=1)), 1)
    j = np.arange(St)
    ok = j[None, :] < splan.tail.row_num_splits[:, None]
    idx = np.where(ok, splan.tail.row_slot_start[:, None] + j[None, :], 0)
    go = np.where(ok[..., None, None], to[idx], 0.0) if T else np.zeros((0, St, Hq, D), np.float32)
    gl = np.where(ok[..., None], tl[idx], -np.inf) if T else np.zeros((0, St, Hq), np.float32)
    po, pl = prefix_partials(inp, splan)
    Sp = po.shape[1]
    ao = np.zeros((T, Sp, Hq, D), np.float32)
    al = np.full((T, Sp, Hq), -np.inf, np.float32)
    ao[splan.prefix_rows] = po
    al[splan.prefix_rows] = pl
    if T == 0:
        return np.zeros((0, Hq, D), np.float32), np.zeros((0, Hq), np.float32)
    out, lse = merge_states(np.concatenate([go, ao], 1), np.concatenate([gl, al], 1), axis=1)
    return round_to(out, inp.dtype), lse
