"""A host plan on the device: :class:`DevicePlan` (the plan's eight int32 arrays in one buffer) and
:class:`PlanUploader` (its pinned host copy and the one copy to the device a step, graph-capturable).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import torch

from splitkv_common import native as _native
from splitkv_common.plan_layout import Plan

from .configs import packed_rows, plan_item_tokens

# index of each int32 array inside a packed device plan (see DevicePlan.pack)
_FIELDS = ("item_request", "item_kv_head", "item_split", "item_kv_start", "item_kv_end",
           "num_splits", "row_slot_start", "row_num_splits")


@dataclass
class DevicePlan:
    """A :class:`~splitkv_common.plan.Plan` on the device as one int32 buffer.

    ``data`` holds the eight int32 arrays of the plan one after the other (``_FIELDS`` order), each
    starting on a 16-byte boundary (:meth:`sizes`: every array's length rounded up to 4 entries; the
    gaps are never read), so every view is aligned whatever the plan's sizes: Triton specializes a kernel on
    its pointers' 16-byte alignment, and plans of any sizes then share one compiled kernel.
    :meth:`view` returns slices of it (made once per buffer, not per launch), so one host-to-device
    copy refreshes a plan in place (graph replay). :class:`PlanUploader` makes and refreshes them.

    ``split_size > 0``: a plan made on the device (``DecodeWrapper(device_plan=True)``): no work-item
    arrays; the kernels derive work item ``i`` of the grid ``batch_size * Hkv * max_splits`` as
    request ``i // (Hkv * max_splits)``, KV head, split ``j = i % max_splits`` with the range
    ``[j * split_size, min((j + 1) * split_size, seq_len))``, and each row's split count as
    ``ceil(seq_len / split_size)``; ``data`` is then ``row_slot_start [num_rows]`` alone
    (``t * max_splits``, fixed while the shapes are).
    """

    data: torch.Tensor
    num_items: int
    batch_size: int
    num_rows: int
    num_slots: int
    max_splits: int
    block_m: int
    row_blocks: int
    graph_stable: bool
    max_q_len: int = 0  # query rows of the longest request; 0: unknown (the kernel then handles several)
    split_size: int = 0
    # a host plan whose work items stage 1 derives from its index (PlanSpec.items_from_index): its split
    # length (2**31 - 1 unsplit; 0: from its arrays), with ``max_splits`` splits a request; the items'
    # arrays are uploaded all the same
    index_split: int = 0
    item_tokens: int = 0  # the plan's split length, or an unsplit auto plan's longest item (plan_item_tokens)
    # the work items default_config chooses for: a graph-stable plan's valid items (those of the plan
    # the buffer was made for; its padding returns at once), not its capacity; 0: num_items
    config_items: int = 0
    _views: "dict | None" = field(default=None, repr=False, compare=False)
    _stage1_views: "tuple | None" = field(default=None, repr=False, compare=False)

    @property
    def index_items(self) -> bool:
        """Whether stage 1 derives this host plan's work items from its index (``index_split``)."""
        return self.index_split > 0

    @staticmethod
    def lengths(num_items: int, batch_size: int, num_rows: int) -> list[int]:
        """The eight arrays' lengths (``_FIELDS`` order)."""
        return [num_items] * 5 + [batch_size, num_rows, num_rows]

    @staticmethod
    def sizes(num_items: int, batch_size: int, num_rows: int) -> list[int]:
        """The eight arrays' extents in ``data``: each length rounded up to 4 int32 entries (16 bytes),
        so each array starts aligned; ``sum`` is ``data``'s length."""
        return [(n + 3) & ~3 for n in DevicePlan.lengths(num_items, batch_size, num_rows)]

    @staticmethod
    def pack(plan: Plan) -> np.ndarray:
        out = np.zeros(sum(DevicePlan.sizes(plan.num_items, plan.batch_size, plan.num_rows)), np.int32)
        DevicePlan.pack_into(plan, out)
        return out

    @staticmethod
    def pack_into(plan: Plan, out: np.ndarray, items_upto: "int | None" = None) -> int:
        """Write the plan's eight arrays into the int32 array ``out`` (long enough), each at its
        aligned offset (:meth:`sizes`; the gaps are left as they are, never read); returns the entries spanned. One slice assignment per field, no intermediate array.
        ``items_upto``: write only the first entries of the five work-item arrays, ``out`` already
        holding the rest (the padding of a graph-stable plan of the same shapes)."""
        small = plan.__dict__.get("_small")   # made by the C planner: packed by it too
        if small is not None:
            return _native.load().pack(plan.items, plan.num_items, -1 if items_upto is None else items_upto, small,
                                plan.batch_size, plan.num_rows, out)
        off = 0
        for k, f in enumerate(_FIELDS):
            a = getattr(plan, f)
            n = a.shape[0]
            if k < 5 and items_upto is not None:
                out[off:off + items_upto] = a[:items_upto]
            else:
                out[off:off + n] = a
            off += (n + 3) & ~3
        return off

    @staticmethod
    def views_of(data: torch.Tensor, num_items: int, batch_size: int, num_rows: int) -> dict:
        """The eight arrays of a packed buffer ``data`` by name (views of it; one slice each, made for
        every new plan size of an eager batch)."""
        views, off = {}, 0
        for f, n in zip(_FIELDS, DevicePlan.lengths(num_items, batch_size, num_rows)):
            views[f] = data[off:off + n]
            off += (n + 3) & ~3
        return views

    def view(self, name: str) -> torch.Tensor:
        if self._views is None:
            if self.split_size:
                self._views = {"row_slot_start": self.data}
            else:
                self._views = self.views_of(self.data, self.num_items, self.batch_size, self.num_rows)
        return self._views[name]

    def stage1_views(self) -> tuple:
        """A host plan's arrays in stage 1's argument order (the first seven ``_FIELDS``, all but
        ``row_num_splits``), made once per plan buffer: a repeated launch builds no tuple of them."""
        if self._stage1_views is None:
            self._stage1_views = tuple(self.view(f) for f in _FIELDS[:7])
        return self._stage1_views

    @classmethod
    def from_plan(cls, plan: Plan, group: int, device, out: "DevicePlan | None" = None,
                  max_block_m: int = 64) -> "DevicePlan":
        """Copy ``plan`` to ``device``; with ``out`` of the same shapes, refresh its buffer in place.
        ``max_block_m`` caps the packed query rows per program (:func:`packed_rows`). A one-off
        copy; a wrapper keeps a :class:`PlanUploader` (its staging buffers) instead."""
        return PlanUploader(device).upload(plan, group, out=out, max_block_m=max_block_m)

    @classmethod
    def on_device(cls, batch_size: int, num_kv_heads: int, num_rows: int, max_pages: int, page_size: int,
                  split_size: int, group: int, max_q_len: int, device, max_block_m: int = 64) -> "DevicePlan":
        """A plan made on the device (``split_size > 0``, see the class doc) for a batch of
        ``batch_size`` requests, ``num_rows`` query rows (at most ``max_q_len`` per request) and
        block tables of ``max_pages`` columns: ``max_splits = ceil(max_pages * page_size /
        split_size)``, ``batch_size * num_kv_heads * max_splits`` work items, ``num_rows *
        max_splits`` partial slots."""
        max_splits = max(1, -(-max_pages * page_size // split_size))
        block_m, row_blocks = packed_rows(max_q_len, group, max_block_m)
        slots = torch.arange(0, num_rows * max_splits, max_splits, dtype=torch.int32).to(device)
        return cls(slots, batch_size * num_kv_heads * max_splits, batch_size, num_rows, num_rows * max_splits,
                   max_splits, block_m, row_blocks, True, max_q_len=max_q_len, split_size=split_size,
                   item_tokens=split_size)


class PlanUploader:
    """Copies plans to one device as one int32 buffer each step: the plan is packed into a pinned
    host buffer (one of a ring of ``ring``), then one non-blocking copy moves it into a device buffer
    that is reused while it is large enough (always, for graph-stable plans: the refresh is in place).

    A pinned buffer is written only after the copy that last read it has finished (a CUDA event per
    ring slot, made once and re-recorded; queried first, waited on only if the copy is still running),
    so a plan in flight is never overwritten; with two slots the host waits only if it plans two steps
    ahead of the device. The copy is ordered on the current stream, before the kernels that read the
    plan. Off CUDA the buffers are plain CPU tensors (the copy is a memcpy). Nothing is made per call
    that the sizes fix: the staging slices and the device buffer's slice and array views are kept per
    size (a plan of sizes seen before reuses them).

    ``last_parts``: host µs of the last upload's parts, ``{"prepare", "wait", "pack", "copy",
    "record"}`` (``splitkv_bench/serving.py`` reports them).

    ``in_graph``: the copy is left to :meth:`copy`, which a graph capture takes in (graph-stable
    plans: one pinned buffer at a fixed address, ring 1). ``upload`` then only packs, after the last
    copy that read the buffer has finished (its event, made ``external`` so that a captured copy
    records it at every replay); ``pending`` says a packed plan has not been copied outside a graph.
    """

    def __init__(self, device, ring: int = 2, in_graph: bool = False):
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        self.in_graph = bool(in_graph)
        self.ring = 1 if self.in_graph else max(1, int(ring))
        self.pending = False                       # in_graph: packed, not copied since (outside a graph)
        self.copied_in_capture = False             # in_graph: copy() was captured since the last pack
        self._packed = None                        # in_graph: (host slice, device buffer) of the last pack
        self._host: list = [None] * self.ring      # (tensor, numpy view) per slot
        self._layout: list = [None] * self.ring    # per slot: (items, size, valid items) of its last graph-stable pack
        self._events: list = [None] * self.ring
        self._next = 0
        self._dev: "torch.Tensor | None" = None    # the device buffer (capacity >= the plan)
        self._dev_views: dict = {}                 # (W, B, T) -> (slice of _dev, its array views)
        self._host_slices: list = [{} for _ in range(self.ring)]   # per slot: n -> host_t[:n]
        self.allocations = 0                       # buffers allocated so far (host and device)
        self.last_parts: dict = {}

    def _staging(self, n: int):
        """A host buffer of at least ``n`` int32 entries whose last copy has finished: ``(slot, tensor
        slice [n], numpy array)``."""
        k = self._next
        self._next = (k + 1) % self.ring
        self.wait_for_copy(k)
        buf = self._host[k]
        if buf is None or buf[0].numel() < n:
            t = torch.zeros(max(n, 2 * (buf[0].numel() if buf else 0)), dtype=torch.int32, pin_memory=self.cuda)
            buf = self._host[k] = (t, t.numpy())
            self._layout[k] = None
            self._host_slices[k] = {}
            self.allocations += 1
        sl = self._host_slices[k].get(n)
        if sl is None:
            if len(self._host_slices[k]) >= 16:
                self._host_slices[k].clear()
            sl = self._host_slices[k][n] = buf[0][:n]
        return k, sl, buf[1]

    def wait_for_copy(self, k: int = 0) -> None:
        """Until the last copy that read pinned buffer ``k`` has finished (its event queried first;
        nothing to wait for off CUDA or before the first copy)."""
        ev = self._events[k]
        if ev is not None and not ev.query():
            ev.synchronize()

    def _device_slice(self, W: int, B: int, T: int, n: int, graph_stable: bool, extra: int = 0):
        """``(slice [n] of the device buffer, its array views, stage 1's of them in its argument order)``
        (:meth:`DevicePlan.stage1_views`), kept per sizes while the buffer is;
        the buffer has ``extra`` entries more after them (the ``in_graph`` lengths)."""
        hit = self._dev_views.get((W, B, T))
        if hit is not None:
            return hit
        if self._dev is None or self._dev.numel() < n + extra:
            need = n + extra
            cap = need if graph_stable else max(need, 2 * (self._dev.numel() if self._dev is not None else 0))
            self._dev = torch.empty(cap, dtype=torch.int32, device=self.device)
            self._dev_views = {}
            self.allocations += 1
        if len(self._dev_views) >= 64:   # an eager batch-1 stream alone has ~25 item counts
            self._dev_views.clear()
        dst = self._dev[:n]
        views = DevicePlan.views_of(dst, W, B, T)
        hit = self._dev_views[(W, B, T)] = (dst, views, tuple(views[f] for f in _FIELDS[:7]))
        return hit

    @staticmethod
    def inputs_size(batch_size: int) -> int:
        """``in_graph``: the entries after a plan for its batch's ``seq_lens [B]`` and, from a 16-byte
        boundary, ``query_start_loc [B + 1]`` (copied with it: :meth:`inputs`)."""
        return ((batch_size + 3) & ~3) + batch_size + 1

    @staticmethod
    def _inputs_slices(num_entries: int, batch_size: int) -> tuple[slice, slice]:
        """Where ``seq_lens`` and ``query_start_loc`` lie after a plan of ``num_entries`` packed entries."""
        at = num_entries + ((batch_size + 3) & ~3)
        return slice(num_entries, num_entries + batch_size), slice(at, at + batch_size + 1)

    def inputs(self, num_entries: int, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``in_graph``: the device views ``(seq_lens [B], query_start_loc [B + 1])`` (int32) that follow a
        plan of ``num_entries`` packed entries, copied with it."""
        seq, qsl = self._inputs_slices(num_entries, batch_size)
        return self._dev[seq], self._dev[qsl]

    def upload(self, plan: Plan, group: int, out: "DevicePlan | None" = None, max_block_m: int = 64,
               seq_lens: "np.ndarray | None" = None) -> DevicePlan:
        """``plan`` on the device; with ``out`` (a graph-stable plan of the same shapes) its buffer is
        refreshed in place and ``out`` returned, else a :class:`DevicePlan` over this uploader's device
        buffer (which the next upload reuses: one plan in use at a time). ``in_graph``: ``seq_lens``
        (host, ``[B]``, the planned batch's) and the plan's ``query_start_loc`` are packed after the plan
        and copied with it (:meth:`inputs`); without ``seq_lens`` that part keeps what it held."""
        clock = time.perf_counter
        t0 = clock()
        W, B, T = plan.num_items, plan.batch_size, plan.num_rows
        n = 5 * ((W + 3) & ~3) + ((B + 3) & ~3) + 2 * ((T + 3) & ~3)   # sum(DevicePlan.sizes(W, B, T))
        max_q = plan.__dict__.get("_max_q")   # the C planner's
        if max_q is None:
            qsl = plan.query_start_loc
            max_q = int((qsl[1:] - qsl[:-1]).max()) if B else 1
        block_m, row_blocks = packed_rows(max_q, group, max_block_m)
        if out is not None:
            if out.data.numel() != n or (out.num_items, out.batch_size, out.num_rows) != (W, B, T):
                raise ValueError(
                    f"plan: shapes changed under a graph-stable plan ({W} items, {B} "
                    f"requests, {T} rows vs {out.num_items}, {out.batch_size}, {out.num_rows})")
            if (block_m, row_blocks) != (out.block_m, out.row_blocks) and block_m * row_blocks > out.block_m * out.row_blocks:
                raise ValueError("plan: the longest request has more query rows than the graph was captured for")
            if out.max_q_len == 1 and max_q > 1:
                raise ValueError(f"plan: a request has {max_q} query rows; the graph was captured for one per request")
            dst, views, stage1 = out.data, None, None
        extra = self.inputs_size(B) if self.in_graph else 0
        if out is None:
            dst, views, stage1 = self._device_slice(W, B, T, n, plan.graph_stable, extra)
        t1 = clock()
        k, host_t, host_np = self._staging(n + extra)
        t2 = clock()
        # a graph-stable plan like the slot's last one: its padding is there already, write the valid
        # items only (up to the last one's count, which this plan's padding overwrites)
        last = self._layout[k]
        upto = None
        if plan.graph_stable and last is not None and last[:2] == (W, n):
            upto = max(plan.num_valid_items, last[2])
        DevicePlan.pack_into(plan, host_np, items_upto=upto)
        self._layout[k] = (W, n, plan.num_valid_items) if plan.graph_stable else None
        t3 = clock()
        if self.in_graph:   # the copy is copy()'s: captured in the graph, or made by the next eager run
            if seq_lens is not None:
                seq, qsl = self._inputs_slices(n, B)
                host_np[seq] = seq_lens
                host_np[qsl] = plan.query_start_loc
            self._packed, self.pending, self.copied_in_capture = (host_t, self._dev[:n + extra]), True, False
            t4 = clock()
        else:
            dst.copy_(host_t, non_blocking=self.cuda)
            t4 = clock()
            if self.cuda:
                ev = self._events[k]
                if ev is None:
                    ev = self._events[k] = torch.cuda.Event()
                ev.record()
        t5 = clock()
        self.last_parts = dict(prepare=(t1 - t0) * 1e6, wait=(t2 - t1) * 1e6, pack=(t3 - t2) * 1e6,
                               copy=(t4 - t3) * 1e6, record=(t5 - t4) * 1e6)
        if out is not None:
            return out
        return DevicePlan(dst, W, B, T, plan.num_slots, plan.max_splits, block_m, row_blocks, plan.graph_stable,
                          max_q_len=max_q, item_tokens=plan_item_tokens(plan),
                          config_items=plan.num_valid_items if plan.graph_stable else 0, _views=views,
                          _stage1_views=stage1)


    def copy(self) -> None:
        """``in_graph``: copy the last packed plan into its device buffer and record the event the
        next pack waits for. Inside a graph capture both become graph nodes, so every replay copies
        what the last ``upload`` packed; outside one it is an eager copy."""
        if self._packed is None:
            raise RuntimeError("plan: call plan() (or set_plan()) before copy_plan()")
        host_t, dst = self._packed
        dst.copy_(host_t, non_blocking=self.cuda)
        capturing = False
        if self.cuda:
            ev = self._events[0]
            if ev is None:   # external: a captured record becomes an event-record node of the graph
                ev = self._events[0] = torch.cuda.Event(external=True)
            ev.record()
            capturing = torch.cuda.is_current_stream_capturing()
        self.pending = False
        self.copied_in_capture = capturing
