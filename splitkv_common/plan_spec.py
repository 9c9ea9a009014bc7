"""A wrapper's planning settings and its planners: :class:`PlanSpec` (one layer's shapes and the
split settings; the shape checks of a batch against a plan), :class:`NativePlanner` (the C fast
path of :func:`~splitkv_common.planner.make_plan`) and :class:`PlannedWrapper` (what every
backend's ``plan()`` / ``run()`` wrapper shares).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from . import validation as _limits
from .devices import get_profile
from .graph_shapes import GRAPH_ITEMS_PER_UNIT
from .plan_layout import Plan, new_plan, order_items
from .planner import _I32_LIMIT, _fast_policy, _fast_settings, make_plan
from .policies import SplitPolicy, fixed_choice, lone_bandwidth
from .validation import normalize_window


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
          order (at most :func:`order_items` items: a larger one may put its longest requests first),
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
            if B > 1 and W > order_items(get_profile(self.device)):
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

    def make_fast(self, seq_lens, q_lens=None, query_start_loc=None, window_left: int | None = None,
                  reuse: Plan | None = None) -> Plan:
        """:meth:`make` through the C planner where it plans the batch (:func:`native_planner`: the
        same plan, bit for bit), else NumPy (which also reports every error)."""
        if window_left is None:
            nat = native_planner(self)
            made = None if nat is None else nat.make(seq_lens, q_lens, query_start_loc, reuse=reuse)
            if made is not None:
                return made
        return self.make(seq_lens, q_lens, query_start_loc, window_left, reuse=reuse)


@functools.lru_cache(maxsize=64)
def native_planner(spec: PlanSpec) -> "NativePlanner | None":
    """The C planner of ``spec`` (:meth:`NativePlanner.for_spec`), looked up once per spec."""
    return NativePlanner.for_spec(spec)


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
            -1 if f.max_work_items is None else f.max_work_items, GRAPH_ITEMS_PER_UNIT * prof.units,
            prof.units * prof.items_per_unit,
            order_items(prof), _limits.MAX_BATCH, _limits.MAX_QUERY_ROWS, _limits.MAX_WORK_ITEMS,
            _limits.MAX_PARTIAL_SLOTS, prof.units, prof.lone_min_tokens,
            prof.bandwidth_gbps * 1e3, prof.unit_bandwidth_gbps * 1e3, prof.launch_us, prof.item_overhead_us,
            lone_bandwidth(prof, f.head_dim, f.kv_elem_bytes, not f.graph_stable),
            # npu_auto's cores, the combine's bytes a (request, split) and one core's bandwidth
            cores, hq * (f.head_dim + 8) * 4 * 2, prof.bandwidth_gbps * 1e3 / cores)
        if len(settings) != mod.SETTINGS_BYTES:
            return None
        return cls(spec, mod, settings, pol, fixed_choice(pol, f.page))

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
        p = new_plan(items, W, small[:B], small[B:b1], small[b1:b2], small[b2:b2 + T], num_slots, self.spec.num_kv_heads,
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
            if window_left is None and self._native is False:
                self._native = native_planner(self.spec)
            made = self.spec.make_fast(seq_lens, q_lens, query_start_loc, window_left, reuse=spare)
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
