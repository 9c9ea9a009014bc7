"""The split policies and the ``auto`` cost model.

* :class:`SplitPolicy`: ``auto``, ``fixed_size:N`` (tokens), ``fixed_count:N`` (splits per request)
  or ``none``; :func:`fixed_choice` is every policy's split length but ``auto``'s.
* ``auto`` on a GPU profile (:func:`choose_auto`): the candidates (no split, then the page-rounded
  minimum doubled), their costs in µs from the device profile (``docs/planner.md``), the cheapest
  taken, fewer splits preferred unless more gain over 3 %; on an Ascend profile :func:`npu_auto`
  (about ``cube cores / (B * Hkv)`` splits, as CANN's IFA).

Lengths and split lengths are tokens (int or int64 ``[B]`` / ``[C, B]`` arrays); the spans
(``sp``) and the checked batch (``batch``) are :mod:`~splitkv_common.plan_layout`'s ``Spans`` and
:mod:`~splitkv_common.plan_checks`' ``Batch``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from .devices import DeviceProfile
from .validation import MAX_SEQ_LEN, MAX_WORK_ITEMS

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


parse_policy = functools.lru_cache(maxsize=64)(SplitPolicy.parse)   # policy text -> the (frozen) policy


def round_up(x, m):
    """``x`` rounded up to a multiple of ``m`` (ints or int64 arrays)."""
    return -(-x // m) * m


def auto_candidates(longest: int, min_split: int, page: int, cap: int) -> list:
    """``auto``'s split lengths: none (0), then the page-rounded minimum doubled while under the
    longest request, leaving out those that would cut it into more than ``cap`` splits."""
    cands = [0]
    s = round_up(max(min_split, page), page)
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


def _candidate_stats(sp, ql, cands: list):
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


def choose_auto(sp, batch, *, num_kv_heads: int, head_dim: int, kv_elem_bytes: int,
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
    cands = auto_candidates(sp.longest, batch.min_split, page, batch.cap)
    stats = _candidate_stats(sp, batch.ql, cands)
    lens_total = int(sp.end.sum()) if sp.at_zero else int((sp.end - sp.start).sum())
    return auto_model(batch.prof, B, batch.hq, cands, stats, lens_total, num_kv_heads, head_dim, kv_elem_bytes,
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
        length = 0 if want == 1 else round_up(-(-longest // want), page)
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


def lone_bandwidth(prof: DeviceProfile, head_dim: int, kv_elem_bytes: int, lone: bool) -> float:
    """The per-item bandwidth (bytes / µs) of a candidate of one item a unit (``DeviceProfile.lone_*``)
    at this head dim and KV element size, 0.0 where the profile has none for them or ``lone`` is off
    (graph-stable plans); the NumPy planner's and the C planner's (its settings) alike."""
    gbps = prof.lone_unit_bandwidth_gbps
    fits = head_dim == prof.lone_head_dim and kv_elem_bytes == prof.lone_kv_bytes
    return gbps * 1e3 if lone and gbps > 0 and fits else 0.0


def item_bandwidth(prof: DeviceProfile, items: int, longest_tokens: int, lone_bw: float) -> float:
    """Bytes / µs one work item pulls: ``lone_bw`` (:func:`lone_bandwidth`) for a plan of at most one
    item a unit whose longest item has at least ``lone_min_tokens`` tokens, else the profile's
    ``unit_bandwidth_gbps``."""
    if lone_bw and items <= prof.units and longest_tokens >= prof.lone_min_tokens:
        return lone_bw
    return prof.unit_bandwidth_gbps * 1e3


def _auto_costs(prof: DeviceProfile, hq: int, cands: list, stats, lens_total: int, num_kv_heads: int,
                head_dim: int, kv_elem_bytes: int, lone: bool = True) -> list:
    """The cost model (``docs/planner.md``) of every candidate (``stats``: :func:`_candidate_stats`'s
    lists, ``lens_total``: the tokens read): ``(split, work items, attention µs, merge µs or None
    when the candidate does not split)`` each, every term computed as the loop planner did, bit for bit.
    ``lone``: candidates of one item a unit may take the profile's ``lone_*`` bandwidth (not for
    graph-stable plans)."""
    ranges, rows, most, longest = stats
    token_bytes = head_dim * 2 * kv_elem_bytes
    bw = prof.bandwidth_gbps * 1e3
    lone_bw = lone_bandwidth(prof, head_dim, kv_elem_bytes, lone)
    launch, per_wave, slots = prof.launch_us, prof.item_overhead_us, prof.units * prof.items_per_unit
    t_stream = lens_total * num_kv_heads * token_bytes / bw   # the same tokens whatever the split
    merge_bytes = 2 * hq * (head_dim + 1) * 4                  # per partial row (o and lse, written and read)
    out = []
    for c, r, pr, m, lg in zip(cands, ranges, rows, most, longest):
        w = r * num_kv_heads
        ubw = item_bandwidth(prof, w, lg, lone_bw)
        t_attn = launch + max(t_stream, lg * token_bytes / ubw) + -(-w // slots) * per_wave
        out.append((c, w, t_attn, launch + pr * merge_bytes / bw if m > 1 else None))
    return out


def auto_model(prof: DeviceProfile, B: int, hq: int, cands: list, stats, lens_total: int, num_kv_heads: int,
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


def fixed_choice(pol: SplitPolicy, page: int):
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


def choose_split(sp, batch, *, num_kv_heads: int, head_dim: int, kv_elem_bytes: int,
                  page: int):
    """The policy's uniform split length (0: none, or per request for ``fixed_count``), the reason and
    the ``auto`` estimates."""
    fixed = fixed_choice(batch.pol, page)
    if fixed is not None:
        return fixed
    return choose_auto(sp, batch, num_kv_heads=num_kv_heads, head_dim=head_dim, kv_elem_bytes=kv_elem_bytes,
                        page=page)
