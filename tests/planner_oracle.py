"""The previous loop planner (``make_plan`` before vectorisation), kept as the reference for equality tests."""

from __future__ import annotations

import math

import numpy as np

from splitkv_common.devices import DeviceProfile, get_profile
from splitkv_common.plan import Plan, SplitPolicy, npu_auto, visible_range   # make_plan reads no visible_range


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
                 kv_elem_bytes: int, page: int, prof: DeviceProfile, lone: bool = True) -> tuple[float, float, int]:
    """Cost model: (attention µs, merge µs, work items) for a uniform split length (0: none). At most
    one item a unit, the longest of at least ``prof.lone_min_tokens`` tokens, at ``prof.lone_head_dim`` and
    ``prof.lone_kv_bytes``: the item's bandwidth is ``prof.lone_unit_bandwidth_gbps`` where set (``lone``:
    not graph-stable)."""
    items_bytes = []
    partial_rows = 0
    for (lo, hi), ql in zip(spans, q_lens):
        rngs = _ranges(lo, hi, split, page)
        partial_rows += ql * len(rngs)
        items_bytes.extend([(b - a) * head_dim * 2 * kv_elem_bytes for a, b in rngs] * num_kv_heads)
    total = sum(items_bytes)
    w = len(items_bytes)
    waves = math.ceil(w / (prof.units * prof.items_per_unit))
    token_bytes = head_dim * 2 * kv_elem_bytes
    unit_gbps = prof.unit_bandwidth_gbps
    if (lone and prof.lone_unit_bandwidth_gbps > 0 and head_dim == prof.lone_head_dim
            and kv_elem_bytes == prof.lone_kv_bytes and w <= prof.units
            and max(items_bytes) >= prof.lone_min_tokens * token_bytes):
        unit_gbps = prof.lone_unit_bandwidth_gbps
    t_attn = (prof.launch_us + max(total / (prof.bandwidth_gbps * 1e3), max(items_bytes) / (unit_gbps * 1e3))
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
    """The loop planner: :func:`splitkv_common.planner.make_plan`'s plan (and its errors) for the same
    arguments, one request and one range at a time."""
    prof = get_profile(device)
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
    # a graph-stable plan's capacity; where the planner chooses the splits (auto on GPU profiles,
    # none) by default twice the (request, KV head) pairs, at least 4 per unit, at most the worst case
    capacity = None
    if graph_stable:
        capacity = B * num_kv_heads * cap if max_work_items is None else int(max_work_items)
        if max_work_items is None and (pol.kind == "none" or (pol.kind == "auto" and not prof.cube_units)):
            capacity = min(capacity, max(2 * B * num_kv_heads, 4 * prof.units))
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
    elif prof.cube_units and spans:
        # Ascend profiles: the NPU rule (the shared function; its choices are tested in
        # tests/ascend/test_sim_mix.py), fed from the spans as this oracle computes them
        vis = [(lo, hi) for lo, hi in spans if hi > lo]
        split, reason, est = npu_auto(prof, len(vis), max([hi - (lo // page_size) * page_size for lo, hi in vis],
                                                           default=0),
                                      num_kv_heads=num_kv_heads, num_q_heads=hq, head_dim=head_dim,
                                      kv_elem_bytes=kv_elem_bytes, page=page_size, min_split=min_split, cap=cap)
    else:
        kw = dict(num_kv_heads=num_kv_heads, num_q_heads=hq, head_dim=head_dim, kv_elem_bytes=kv_elem_bytes,
                  page=page_size, prof=prof, lone=not graph_stable)
        cands = [0]
        s = _round_up(max(min_split, page_size), page_size)
        while s < longest:
            cands.append(s)
            s *= 2
        costs = []
        for c in cands:
            if c and math.ceil(longest / c) > cap:
                continue
            if not spans:
                break
            ta, tm, w = _estimate_us(spans, ql, c, **kw)
            est[c] = {"attention_us": round(ta, 3), "merge_us": round(tm, 3), "work_items": w}
            costs.append((c, ta + tm, w))

        def cheapest(limit):
            best = None
            for c, total, w in costs:
                if limit is not None and w > limit and best is not None:
                    continue
                # prefer fewer splits unless the gain is over 3 %
                if best is None or total < best[1] * 0.97:
                    best = (c, total, w)
            return best

        best = cheapest(None)
        if best and capacity is not None and best[2] > capacity:   # a graph-stable plan's splits must fit
            best = cheapest(capacity)
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
                reason = (f"auto on {prof.name}: {par} (request, KV head) items for {prof.units} units, but "
                          f"splitting would not pay for its merge and per-split cost at these lengths "
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

    # requests reading more tokens first (ties in batch order) in plans of more than four items per
    # unit, counting the items of requests that read tokens
    order = list(range(B))
    if num_kv_heads * sum(len(r) for r in per_req if r[-1][1] > r[0][0]) > 4 * prof.units:
        order.sort(key=lambda b: -(per_req[b][-1][1] - per_req[b][0][0]))
    items = [(b, h, j, a, e) for b in order for h in range(num_kv_heads)
             for j, (a, e) in enumerate(per_req[b])]
    n_valid = len(items)
    if graph_stable:
        cap_items = capacity
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
