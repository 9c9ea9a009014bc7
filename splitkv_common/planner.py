"""``make_plan``: the split planner, as array steps (``docs/planner.md``).

The general path checks the arguments (:mod:`~splitkv_common.plan_checks`), finds the visible
spans, the policy's split length (:mod:`~splitkv_common.policies`), each request's range count
under the cap, the work items and the partial slots (:mod:`~splitkv_common.plan_layout`). The
common decode case takes a fast path (below) that makes the same plans bit for bit.
"""

from __future__ import annotations

import functools
import itertools
import operator
from dataclasses import dataclass

import numpy as np

from . import validation as _limits
from .devices import DeviceProfile, get_profile
from .graph_shapes import graph_capacity
from .plan_checks import Batch, check_inputs, check_plan_limits
from .plan_layout import (Plan, Spans, alloc_items, fill_ragged, fill_uniform, iota, longest_first, new_plan,
                          order_items, partial_slots, request_splits, visible_spans, work_items)
from .policies import (SplitPolicy, auto_candidates, auto_model, choose_auto, choose_split, fixed_choice, npu_auto,
                       parse_policy)

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
    pol = parse_policy(policy) if isinstance(policy, str) else SplitPolicy.parse(policy)
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
    fixed = fixed_choice(pol, page_size)
    if fixed is not None:
        split, reason, est = fixed
    elif prof.cube_units:   # Ascend profiles: the NPU rule (the general path calls the same function)
        min_split = prof.min_split_tokens if f.min_split_tokens is None else f.min_split_tokens
        split, reason, est = npu_auto(prof, sum(x > 0 for x in seq), longest, num_kv_heads=hkv, num_q_heads=hq,
                                      head_dim=f.head_dim, kv_elem_bytes=f.kv_elem_bytes, page=page_size,
                                      min_split=min_split, cap=cap)
    else:
        min_split = prof.min_split_tokens if f.min_split_tokens is None else f.min_split_tokens
        cands = auto_candidates(longest, min_split, page_size, cap)
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
        split, reason, est = auto_model(prof, B, hq, cands, (ranges, rows, most_c, longest_c), sum(seq), hkv,
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
    # work items (requests in batch order, or the longest first: longest_first)
    order = None
    if W - hkv * seq.count(0) > order_items(prof) and any(x < y for x, y in zip(seq, seq[1:])):
        order = sorted(range(B), key=lambda b: -seq[b])
    buf = alloc_items(W, capacity, f.reuse)
    if R == B * most:   # every request has `most` ranges: [B, Hkv, N] broadcasts of one template
        v = buf[:, :W].reshape(5, B, hkv, most)
        v[0] = 0 if B == 1 else (iota(B) if order is None else np.array(order, np.int32))[:, None, None]
        v[1] = iota(hkv)[:, None]
        v[2:] = _uniform_template(most, split)[:, None, None, :]
        ends = seq if order is None else [seq[b] for b in order]
        v[4, :, :, most - 1] = seq[0] if B == 1 else np.array(ends, np.int32)[:, None]
    else:   # each request's block of Hkv x n items from its template
        head = iota(hkv)[:, None]
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
    return new_plan(buf, W, small[:B], small[B:b1], small[b1:b2], small[b2:], num_slots, hkv, page_size, pol,
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
        ql, qsl = None, iota(B + 1, np.int64)
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
    sp = Spans(None, seq, last, seq, longest, max(longest - 1, 0), True)   # everything visible
    fixed = fixed_choice(pol, page)
    if fixed is not None:
        split, reason, est = fixed
    else:
        batch = Batch(prof, pol, seq, ql, qsl, T, hq,
                       prof.min_split_tokens if f.min_split_tokens is None else f.min_split_tokens, cap, max_items)
        split, reason, est = choose_auto(sp, batch, num_kv_heads=hkv, head_dim=f.head_dim,
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
    buf = alloc_items(W, capacity, f.reuse)
    order, osp, _, on = longest_first(sp, split, n, W, hkv, order_items(prof))
    if R == B * most:
        fill_uniform(buf, osp, split, B, hkv, most, order)
    else:
        fill_ragged(buf, osp, split, on, hkv, W, order)
    if n is None and ql is None and not f.graph_stable:   # a row and a split per request: slot b for row b
        num_splits, row_ns, row_start, num_slots = np.ones(B, np.int32), np.ones(B, np.int32), iota(B).copy(), B
    else:
        num_splits = np.ones(B, np.int32) if n is None else n.astype(np.int32)
        row_start, row_ns, num_slots = partial_slots(num_splits, ql, T, cap, f.graph_stable)
    return new_plan(buf, W, num_splits, qsl.astype(np.int32), row_start, row_ns, num_slots, hkv, page, pol, split,
                     f.graph_stable, reason, est)


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
    batch = check_inputs(seq_lens, num_kv_heads, page_size, q_lens, query_start_loc, policy, device,
                          num_q_heads, head_dim, min_split_tokens, max_splits)
    num_kv_heads = operator.index(num_kv_heads)   # a Python int from here (work-item counts, shifts)
    capacity = None
    if graph_stable:
        capacity = graph_capacity(batch.seq.shape[0], num_kv_heads, batch.cap, batch.pol, batch.prof,
                                  None if max_work_items is None else int(max_work_items))
        batch.max_items = capacity
    sp = visible_spans(batch, window_left, page_size)
    split, reason, est = choose_split(sp, batch, num_kv_heads=num_kv_heads, head_dim=head_dim,
                                       kv_elem_bytes=kv_elem_bytes, page=page_size)
    s, n, most = request_splits(sp, batch, split, page_size)
    num_splits = n.astype(np.int32)
    row_start, row_ns, num_slots = partial_slots(num_splits, batch.ql, batch.rows, batch.cap, graph_stable)
    buf, n_valid = work_items(sp, s, n, most, num_kv_heads, capacity, reuse, order_items(batch.prof))
    return new_plan(buf, n_valid, num_splits, batch.qsl.astype(np.int32), row_start, row_ns, num_slots,
                     num_kv_heads, int(page_size), batch.pol, split, graph_stable, reason, est)
