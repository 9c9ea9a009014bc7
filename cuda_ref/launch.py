"""Host glue of the Triton kernels: a plan on the device, kernel configurations, the launches.

Nothing here allocates or reads device memory back: :func:`launch_decode` and :func:`launch_merge`
take every buffer from the caller, so a CUDA graph can capture them.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass, field

import numpy as np
import torch

from splitkv_common import native as _native
from splitkv_common.devices import PROFILES
from splitkv_common.plan_layout import Plan

from . import kernels
from .fast_launch import FastLaunch, describe

# index of each int32 array inside a packed device plan (see DevicePlan.pack)
_FIELDS = ("item_request", "item_kv_head", "item_split", "item_kv_start", "item_kv_end",
           "num_splits", "row_slot_start", "row_num_splits")

# False drops the kernels' bounds masks (kernels.split_kv_kernel's BOUNDS): only for measuring their
# cost (scripts/h200_perf_check.py --overhead) on trusted inputs; never set it elsewhere.
_KERNEL_BOUNDS = True
_INT32_MAX = 2 ** 31 - 1


@dataclass(frozen=True)
class KernelConfig:
    """Tile and launch shape of stage 1: ``block_n`` KV tokens per tile, warps, software-pipeline
    stages (``num_stages`` >= 2 turns the tile loads into asynchronous copies that many tiles ahead);
    ``merge_warps``: warps of the separate merge (one warp reduces a row's ``[CHUNK, D]`` tile with
    shuffles alone, no shared memory or barriers). Why these defaults: docs/perf-notes.md."""

    block_n: int = 64
    num_warps: int = 4
    num_stages: int = 3
    merge_warps: int = 1
    # one-row kernels: the sum of weights kept per tile column and summed over the row after the KV
    # loop, so that a tile's only reduction across warps is its max (multi-query kernels ignore it)
    column_sum: bool = False

    def __str__(self):
        return f"n{self.block_n}w{self.num_warps}s{self.num_stages}" + ("c" if self.column_sum else "")


# a plan's split length from which 16-bit D-64 tiles hold 128 tokens (default_config)
LONG_ITEM_TOKENS = 1024


def lone_item(head_dim: int, kv_bytes: int, num_items: int, batch_invariant: bool, item_tokens: int) -> bool:
    """A plan :func:`default_config` runs one work item an SM with deeper tiles: not batch-invariant
    (``auto``), at the h200 profile's one-item-a-unit figures, by which the planner costs such plans
    (``DeviceProfile.lone_*``: 16-bit D 128, at most one item an SM, the longest at least 1,024
    tokens). ``kv_bytes`` as :func:`default_config` takes it (int8 passed as 4: never)."""
    p = _H200
    return (not batch_invariant and int(head_dim) == p.lone_head_dim and kv_bytes == p.lone_kv_bytes
            and 0 < num_items <= _SMS and item_tokens >= p.lone_min_tokens)


def default_config(head_dim: int, kv_bytes: int, num_items: int = 0, batch_invariant: bool = True,
                   item_tokens: int = 0) -> KernelConfig:
    """Stage-1 configuration by head dim, KV element size and the plan (chosen from H200
    measurements: docs/perf-notes.md).

    The tile holds 16 KiB of K at 2 bytes an element (int8 counts as 4: it is dequantized to
    float32 before the dot), at most 64 tokens, or 128 at 16-bit D 64 where the plan's split length
    ``item_tokens`` (a plan property, so fixed-size plans keep their batch invariance) is at least
    1024: run 15 measured 128-token tiles 7-11 % faster at four such points with 2k-8k tokens per item
    (B16 x 4k 42.5 against 46.0 µs, B16 x 16k 133.6 / 149.6) and 1-2 % slower at 256-512; 4 warps (8
    for float32 tiles, which spill with 4).
    Triton's pipeliner keeps the page ids two stages ahead of the K / V copies: ``num_stages`` 5
    gives two K / V buffers in shared memory (one tile in flight while the other is computed), 7
    gives three. Plans of at most two work items per SM ("few") take 5; at 16-bit D 64 an ``auto``
    plan's also keep the row sum per tile column (``column_sum``; run 79: B1 x 16k 19.3 -> 18.8 µs,
    B16 x 4k 42.9 -> 42.2; level or worse at D 128 and D 256, and batch-invariant plans keep one
    order of sums whatever their item count).

    An ``auto`` plan (not ``batch_invariant``) of at most one item an SM whose longest item has
    the h200 profile's ``lone_min_tokens`` (1,024) or more, at 16-bit D 128 (:func:`lone_item`): 128-token tiles, 8 warps, 6
    stages, the row sum per tile column (``column_sum``: one cross-warp reduction a tile fewer, run 77),
    two to three 64 KiB K / V stages in flight for the SM's one program (run 55: unsplit B 16
    plans 1.4-4.5 % faster than two splits and the merge under the defaults; the planner's h200
    profile costs them so, ``DeviceProfile.lone_*``).

    Plans of more items ("many"): with ``batch_invariant`` (fixed split size or no split, whose
    results must not depend on the rest of the batch) only ``num_stages`` changes, to 7: the tile
    and the warps decide the order of the sums and stay as they are. Otherwise (``auto``,
    ``count:N``) 16-bit tiles of D 128 and D 64 take 32 tokens and 2 warps (5 stages at D 128, 7 at
    D 64): run 15 measured it best or level at every "many" point tried, three interleaved rounds
    each (D 128: B64 x 2k 129.5 against 131.7 µs, B64 x 4k 249.9 / 252.0, B128 x 1k 133.0 / 136.1,
    B128 x 2k 253.2 / 262.4; D 64: B64 x 4k 132.9 / 139.2, B128 x 1k 74.5 / 79.4; docs/perf-notes.md);
    other head dims and dtypes were not measured and keep the batch-invariant choice.

    At 16-bit D 128 the "many" choice is by waves instead (:func:`fullest_waves`): of the
    configurations it may take (``auto``: 32 tokens with 2 or 4 warps and 5 stages, 64 tokens with 4
    warps and 5 or 7 stages; batch-invariant plans: 64 tokens, 4 warps, 5 or 7 stages), the one whose
    waves (the programs the H200 holds at once) the work items fill best: a wave of equal items takes
    about as long whether it is full or not, so a plan of 640 items ran 1.3x faster with 5 programs
    an SM (one wave) than with 4 (two), at every item length from 1k to 8k tokens (run 38). Up to
    1,320 items, the range measured; beyond, the choice above. Except (``auto``, from 265 to 2,112
    items: :data:`_ONE_WARP_ITEMS`): one warp a program on 16-token tiles (n16w1s5), about ten
    programs an SM (the compiled kernel's registers and shared memory), no barrier across warps in a
    tile's chain; on an H100 0.6-2 % faster than the waves' choice at all ten points from 320 to
    2,048 items, 5 % slower at 256 and 0.9 % at 4,096 (runs 131-134, docs/perf-notes.md; not measured
    on an H200)."""
    d = max(16, 1 << (int(head_dim) - 1).bit_length())  # the next power of two
    key = "few" if 0 < num_items <= _FEW_ITEMS else "many"
    elem = min(max(kv_bytes, 2), 4)
    if lone_item(head_dim, kv_bytes, num_items, batch_invariant, item_tokens):
        return KernelConfig(*_LONE)
    longest = 128 if (d == 64 and elem == 2 and item_tokens >= LONG_ITEM_TOKENS) else 64
    block_n = max(16, min(longest, (16 * 1024) // (d * elem)))
    warps = 8 if elem == 4 else 4
    if key == "few":   # at 16-bit D 64 with `auto`, the row sum per tile column (run 79)
        return KernelConfig(block_n=block_n, num_warps=warps, num_stages=5,
                            column_sum=not batch_invariant and d == 64 and elem == 2)
    if d == 128 and elem == 2:
        return KernelConfig(*_many_config(num_items, batch_invariant))
    if not batch_invariant and d == 64 and elem == 2:
        return KernelConfig(block_n=32, num_warps=2, num_stages=7)
    return KernelConfig(block_n=block_n, num_warps=warps, num_stages=7)


_H200 = PROFILES["h200"]   # the planner's profile of these kernels (lone_item)
_SMS = _H200.units
_FEW_ITEMS = 2 * _SMS  # default_config's "few" work items: at most two per SM of the H200
# one item an SM (an `auto` plan of at most _SMS items, the longest at least lone_min_tokens, 16-bit
# D 128): 128-token tiles, 8 warps, 6 stages (run 55: B16 x 1k-8k unsplit 25.5 / 40.6 / 70.1 / 128.4 µs
# against 26.4 / 41.3 / 71.1 / 130.5 for two splits and the merge; the planner's h200 profile costs
# such plans with this configuration's per-item bandwidth, DeviceProfile.lone_*), and the row sum kept
# per tile column (run 77: 0.2-1.6 % faster at B16 x 1k-8k, B4 x 1k at 32 / 32 and B16 x 1k at 64 / 8;
# not for plans of more items, where it spilled and ran 5.6 % slower at B128 x 1k in run 64)
_LONE = (128, 8, 6, 1, True)


def plan_item_tokens(plan: Plan) -> int:
    """:attr:`DevicePlan.item_tokens` of ``plan``: its split length; for an ``auto`` plan that does
    not split (and is not graph-stable, whose launch the capture fixes) of at most one work item an
    SM, its longest item, which decides :func:`default_config`'s one-item-an-SM configuration."""
    if plan.split_tokens or plan.graph_stable or plan.policy.kind != "auto" or not 0 < plan.num_items <= _SMS:
        return plan.split_tokens
    return int((plan.item_kv_end - plan.item_kv_start).max())


# programs one H200 SM holds at once, per 16-bit D-128 stage-1 configuration (tokens a tile, warps,
# stages), from the compiled kernels' registers and shared memory (n32w2s5 192 registers a thread x
# 64 threads and 38 KB; n32w4s5 96 x 128, 38 KB; n64w4s5 148 x 128, 72 KB; n64w4s7 139 x 128, 105 KB)
# and where each one's time steps up with the work items (run 38: n32w2s5 steps up past 4 x 132, where
# its registers would allow 5)
_SM_PROGRAMS = {(32, 2, 5): 4, (32, 4, 5): 5, (64, 4, 5): 3, (64, 4, 7): 2}
_BY_WAVES = ((32, 2, 5), (32, 4, 5), (64, 4, 5), (64, 4, 7))
_WAVES_UPTO = 2 * 5 * _SMS   # the item counts measured (run 38): two waves of the largest
_STAGES_ONLY = ((64, 4, 7), (64, 4, 5))   # batch-invariant plans: the tile and the warps fixed
# `auto` plans of this many work items at 16-bit D 128: one-warp programs on 16-token tiles (default_config)
_ONE_WARP = (16, 1, 5)
_ONE_WARP_ITEMS = range(_FEW_ITEMS + 1, 16 * _SMS + 1)


def _many_config(num_items: int, batch_invariant: bool) -> tuple:
    """16-bit D-128 stage-1 configuration of a plan of more than the "few" work items (default_config)."""
    if not batch_invariant and num_items in _ONE_WARP_ITEMS:
        return _ONE_WARP
    return fullest_waves(num_items, _STAGES_ONLY if batch_invariant else _BY_WAVES)


@functools.lru_cache(maxsize=4096)
def fullest_waves(num_items: int, candidates: tuple = _BY_WAVES) -> tuple:
    """Of ``candidates`` (``(block_n, warps, stages)`` keys of ``_SM_PROGRAMS``), the configuration
    whose waves ``num_items`` work items fill best: ``items / (waves x programs a wave)``, where the
    programs a wave are ``_SM_PROGRAMS`` x 132 SMs; within 2 % of the best fill, the one with more
    programs a wave (fewer waves). Measured at 256-1,280 items of 1k-8k tokens
    (``scripts/bench_wave_configs.py``, runs 38-42, docs/perf-notes.md): within 1 % of the fastest of
    the four at all 28 points, where always taking n32w2s5 lost up to 30 %. Outside that range (more than 1,320 items, or none: a count not known)
    the first candidate, the choice before (many waves fill alike)."""
    if not 0 < num_items <= _WAVES_UPTO:
        return candidates[0]

    def fill(c):
        slots = _SM_PROGRAMS[c] * _SMS
        return num_items / (-(-num_items // slots) * slots)
    top = max(fill(c) for c in candidates)
    return max((c for c in candidates if fill(c) >= top - 0.02), key=lambda c: _SM_PROGRAMS[c])


@functools.lru_cache(maxsize=None)
def _device_traits(device: torch.device) -> tuple[int, bool]:
    """``(multiprocessors, programmatic dependent launch usable)`` of a device; ``(0, False)`` off CUDA."""
    if device.type != "cuda":
        return 0, False
    props = torch.cuda.get_device_properties(device)
    return props.multi_processor_count, props.major >= 9 and kernels.gdc_wait is not None


def packed_rows(max_q_len: int, group: int, max_block_m: int = 64) -> tuple[int, int]:
    """``(BLOCK_M, row blocks)``: a work item packs ``q_len * group`` query rows into tiles of
    ``BLOCK_M``, from 16 (the ``tl.dot`` minimum) up to ``max_block_m`` (64 on CUDA; the NPU's
    Unified Buffer needs smaller caps, ``cuda_ref.npu.npu_tile``)."""
    return _packed_rows(max(1, int(max_q_len)) * int(group), int(max_block_m))


@functools.lru_cache(maxsize=256)
def _packed_rows(rows: int, max_block_m: int) -> tuple[int, int]:
    block_m = min(max_block_m, max(16, 1 << (rows - 1).bit_length()))  # the next power of two, as plain ints
    return block_m, -(-rows // block_m)


@functools.lru_cache(maxsize=64)
def packed_limit(tile_rows: int, group: int, max_block_m: int = 64) -> int:
    """The most query rows a request may have for its packed rows to fit ``tile_rows`` (a captured
    plan's ``block_m * row_blocks``, :func:`packed_rows`), at least 1."""
    most = 1
    while True:
        block_m, row_blocks = packed_rows(most + 1, group, max_block_m)
        if block_m * row_blocks > tile_rows:
            return most
        most += 1


MERGE_COLUMNS = 64   # head-dim columns one program of the separate merge takes


def merge_d_parts(block_d: int) -> int:
    """Programs of the separate merge per (row, head), each merging ``MERGE_COLUMNS`` columns of the
    head dim (``block_d`` a power of two; one program below that). Depends on the head dim alone (a
    row's result does not depend on the rest of the batch). At batch 1 the merge is a tenth to a
    fifth of the call and its one warp per (row, head) loads the row's whole ``[CHUNK, D]`` tile:
    halving the tile (two programs at D 128, four at D 256) measured 0.4-1.1 µs faster at B1 x 2k-16k
    (B1 x 2k 13.4 -> 12.3-12.9 µs), 3.3 µs at B1 x 32k D 256 (33.2 -> 29.9), level at B1 x 1k / 64k,
    B16 x 8k and D 64; 32 columns a program was level or slower (run 48, docs/perf-notes.md)."""
    return max(1, block_d // MERGE_COLUMNS)


def merge_chunk(columns: int) -> int:
    """Slots the merge loads as one ``[CHUNK, columns]`` float32 tile (``columns``: the head-dim
    columns one program merges, ``BLOCK_D`` or its part, :func:`merge_d_parts`): at most 4K elements
    (128 registers a thread for the merge's one warp) and 32 slots, so a row of up to 32 splits is
    merged after one round trip to memory. Depends on the head dim alone: a row's result does not
    depend on the rest of the batch."""
    return max(1, min(32, 4096 // columns))


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
    "record"}`` (``scripts/bench_serving.py`` reports them).

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


def _scale_layout(scale: "torch.Tensor | None") -> tuple[int, bool]:
    """``(stride between KV heads, per channel)`` of an int8 scale ``[Hkv]`` or ``[Hkv, D]``
    (the channel axis contiguous, as the wrapper checks)."""
    if scale is None:
        return 0, False
    if scale.dim() == 2 and scale.stride(1) != 1:
        raise ValueError(f"k_scale: the channel axis must be contiguous, got strides {scale.stride()}")
    return scale.stride(0), scale.dim() == 2


def launch_decode(q, k_cache, v_cache, block_table, seq_lens, query_start_loc, dplan: DevicePlan,
                  out, lse, part_o, part_lse, counters=None, *, scale: float, soft_cap=None, window_left=None,
                  k_scale=None, v_scale=None, k_offset=None, v_offset=None, config: KernelConfig | None = None,
                  fuse_merge: bool = False, interpret: bool = False, merge: bool = True,
                  batch_invariant: bool = True, pdl: bool | None = None, errors=None) -> None:
    """Stage 1 (and stage 2 unless fused) into the caller's buffers. No allocation, no host sync.

    The caller checks the metadata (:func:`cuda_ref.checks.check_launch`; the wrapper and the op do).
    Whatever the values in the index tensors and the plan, the kernels stay inside the tensors they
    are given (out-of-range page ids are masked, rows and slots bounded by the buffers' sizes);
    ``errors`` (int32 ``[8]``, zeroed by the caller) counts out-of-range page ids and requests whose
    lengths or rows the kernels cannot honour
    (:meth:`cuda_ref.wrapper.DecodeWrapper.check_errors` reads it).

    Shapes: ``q [T, Hq, D]``, ``k_cache``/``v_cache [P, page, Hkv, D]`` (last dim contiguous),
    ``out [T, Hq, D]`` (q's dtype), ``lse [T, Hq]`` float32, ``part_o [>= num_slots, Hq, D]`` and
    ``part_lse [>= num_slots, Hq]`` float32, ``counters`` int32 ``[>= B * Hkv * row_blocks]``
    zeroed once (only with ``fuse_merge``). ``merge=False`` leaves stage 2 out (timing only).
    ``batch_invariant=False`` lets the default configuration depend on the plan's size (plans of
    the ``auto`` and ``count:N`` policies, see :func:`default_config`). ``pdl``: launch the separate
    merge by programmatic dependent launch (default: on sm_90+ with a Triton that has it); when every
    stage-1 program fits on the GPU at once (at most two per multiprocessor) stage 1 also lets the
    merge launch as soon as it starts, so the merge's launch is hidden behind stage 1's work.
    Neither changes any arithmetic. This is :func:`prepare_decode` then :meth:`DecodeLaunch.launch`;
    a caller that launches the same shapes again keeps the :class:`DecodeLaunch` (whose launches then
    take the fast path of :mod:`cuda_ref.fast_launch`; this one-off launch takes Triton's normal one).
    """
    prep = prepare_decode(q, k_cache, v_cache, block_table, seq_lens, query_start_loc, dplan, out, lse, part_o,
                          part_lse, counters, scale=scale, soft_cap=soft_cap, window_left=window_left,
                          k_scale=k_scale, v_scale=v_scale, k_offset=k_offset, v_offset=v_offset, config=config,
                          fuse_merge=fuse_merge, interpret=interpret, merge=merge, batch_invariant=batch_invariant,
                          pdl=pdl, errors=errors, fast_path=False)
    prep.launch(q, k_cache, v_cache, block_table, seq_lens, query_start_loc, dplan, out, lse, part_o, part_lse,
                counters, k_scale, v_scale, k_offset, v_offset, errors)


@dataclass
class DecodeLaunch:
    """Everything :func:`launch_decode` derives from the shapes, strides, dtypes, scalars and the
    plan's sizes, computed once (:func:`prepare_decode`): the grid, the kernel's scalar arguments
    (scale, window, strides, bounds) and constexprs, and the merge's. Valid for any call whose
    tensors have the same signature and whose device plan has the same sizes.

    After its first call each launch goes through the compiled kernel's own launcher
    (:mod:`cuda_ref.fast_launch`) where that was checked to reproduce Triton's launch; :attr:`fast`
    says which path runs and why."""

    grid: "tuple | None"          # stage 1's grid; None: no stage-1 launch (no items or no rows)
    scalars: tuple                # the kernel's arguments after its tensors
    constexprs: dict
    fuse_merge: bool
    merge: "MergeLaunch | None"   # the separate merge; None: none (fused, or one split everywhere)
    fast_path: bool = True        # False: always Triton's normal launch (a launch made once)
    sizes: tuple = ()             # (requests, stage-1 rows, merged rows) bounding the kernels (launch_sizes)
    # an index-derived host plan's (SPLIT_SIZE, MAX_SPLITS), which plans sharing the launch change; else None
    index_derive: "tuple | None" = None
    stage1: "FastLaunch | None" = field(default=None, repr=False, compare=False)
    kinds: "tuple | None" = field(default=None, repr=False, compare=False)  # its tensors' dtypes, devices (adopt)

    def __post_init__(self):
        if self.grid is not None and self.stage1 is None:
            self.stage1 = FastLaunch(kernels.split_kv_kernel, self.grid, (None,) * _STAGE1_TENSORS + self.scalars,
                                     tuple(range(_STAGE1_TENSORS)), self.constexprs, enabled=self.fast_path)

    @property
    def fast(self) -> dict:
        """``{"fast": True / False / None (not launched yet), "reason": ..., "slow_calls": ...}``
        over this launch's kernels (:func:`cuda_ref.fast_launch.describe`)."""
        return describe([self.stage1, self.merge.call if self.merge is not None else None])

    def adopt(self, other: "DecodeLaunch | None") -> None:
        """Take the checked launchers of ``other`` (a launch prepared for tensors of the same dtypes and
        devices, other plan sizes) where they bind the same compiled kernels (:meth:`FastLaunch.adopt`)."""
        if other is None:
            return
        if self.stage1 is not None:
            self.stage1.adopt(other.stage1)
        if self.merge is not None and other.merge is not None:
            self.merge.call.adopt(other.merge.call)

    def resize(self, sizes: tuple) -> None:
        """Bound the kernels by another batch's ``sizes`` (:func:`launch_sizes`): stage 1's request and
        row bounds, the merge's grid (and a device-made plan's request count). A batch of other sizes
        shares the launch when it is empty where this one was and only there (0, or not: a launch
        without a stage 1 or a merge stays one); otherwise ``ValueError``."""
        batch, rows, merged = sizes
        was = self.sizes
        if (batch > 0) != (was[0] > 0) or (rows > 0) != (was[1] > 0) or (merged > 0) != (was[2] > 0):
            raise ValueError(f"launch: prepared for batch sizes {was}, called with {sizes} (empty where "
                             "the prepared one is not, or the other way round): prepare a launch for it")
        if self.stage1 is not None:
            scalars = list(self.scalars)
            scalars[_ROWS_AT], scalars[_BATCH_AT] = rows, batch
            self.scalars = tuple(scalars)
            self.stage1.set_values({_STAGE1_TENSORS + _ROWS_AT: rows, _STAGE1_TENSORS + _BATCH_AT: batch})
        if self.merge is not None:
            self.merge.resize(merged, batch)
        self.sizes = sizes

    def _set_index_derive(self, derive: tuple) -> None:
        """Stage 1's ``SPLIT_SIZE`` and ``MAX_SPLITS`` for another index-derived plan of this launch's key."""
        scalars = list(self.scalars)
        scalars[_SPLIT_AT], scalars[_MAX_SPLITS_AT] = derive
        self.scalars = tuple(scalars)
        if self.stage1 is not None:
            self.stage1.set_values({_STAGE1_TENSORS + _SPLIT_AT: derive[0], _STAGE1_TENSORS + _MAX_SPLITS_AT: derive[1]})
        self.index_derive = derive

    def tensors(self, q, k_cache, v_cache, block_table, seq_lens, query_start_loc, dplan: DevicePlan, out, lse,
                part_o, part_lse, counters=None, k_scale=None, v_scale=None, k_offset=None, v_offset=None,
                errors=None) -> tuple:
        """Stage 1's tensor arguments, in the kernel's order (absent ones replaced by ``seq_lens``)."""
        dummy = seq_lens
        if dplan.split_size:
            items = (dummy,) * 6 + (dplan.view("row_slot_start"),)
        else:
            items = dplan.stage1_views()
        return (q, k_cache, v_cache, block_table, seq_lens, query_start_loc, *items,
                part_o, part_lse, out, lse, counters if self.fuse_merge else dummy,
                errors if errors is not None else dummy,
                k_scale if k_scale is not None else dummy, v_scale if v_scale is not None else dummy,
                k_offset if k_offset is not None else dummy, v_offset if v_offset is not None else dummy)

    def launch(self, q, k_cache, v_cache, block_table, seq_lens, query_start_loc, dplan: DevicePlan, out, lse,
               part_o, part_lse, counters=None, k_scale=None, v_scale=None, k_offset=None, v_offset=None,
               errors=None, sizes: "tuple | None" = None) -> None:
        """The launches, with this call's tensors (of the signature it was prepared for, batch sizes
        aside) and stage 1's grid from ``dplan`` (a plan of the same :func:`plan_launch_key`, any
        number of work items); the bounds that depend on the batch's sizes follow this call's
        tensors (:meth:`resize`). ``sizes``: :func:`launch_sizes` of these tensors when the caller
        knows them (the wrapper, whose checks tie them to its plan); None: computed here."""
        if sizes is None:
            sizes = launch_sizes(q, block_table, seq_lens, query_start_loc, dplan, out, lse)
        if sizes != self.sizes:
            self.resize(sizes)
        if self.index_derive is not None and dplan.index_items:
            derive = _index_derive(dplan)
            if derive != self.index_derive:
                self._set_index_derive(derive)
        if self.stage1 is not None:
            grid = (dplan.num_items, dplan.row_blocks)
            if grid != self.stage1.grid:
                self.stage1.set_grid(grid)
            self.stage1(*self.tensors(q, k_cache, v_cache, block_table, seq_lens, query_start_loc, dplan, out, lse,
                                      part_o, part_lse, counters, k_scale, v_scale, k_offset, v_offset, errors))
        if self.merge is not None:
            ns = seq_lens if dplan.split_size else dplan.view("row_num_splits")
            self.merge.launch(part_o, part_lse, out, lse, dplan.view("row_slot_start"), ns, seq_lens, query_start_loc)


_STAGE1_TENSORS = 23  # tensor arguments of kernels.split_kv_kernel (DecodeLaunch.tensors)
# where NUM_ROWS and BATCH stand among stage 1's scalars (DecodeLaunch.scalars, after the tensors)
_ROWS_AT = kernels.split_kv_kernel.arg_names.index("NUM_ROWS") - _STAGE1_TENSORS
_BATCH_AT = kernels.split_kv_kernel.arg_names.index("BATCH") - _STAGE1_TENSORS
_SPLIT_AT = kernels.split_kv_kernel.arg_names.index("SPLIT_SIZE") - _STAGE1_TENSORS
_MAX_SPLITS_AT = kernels.split_kv_kernel.arg_names.index("MAX_SPLITS") - _STAGE1_TENSORS


def launch_sizes(q, block_table, seq_lens, query_start_loc, dplan: DevicePlan, out, lse) -> tuple:
    """``(requests, stage-1 rows, merged rows)`` the kernels are bounded by: the fewest requests of
    the block table, lengths, query offsets and plan, the fewest rows of q, the outputs and the
    plan, and the rows the merge reaches (outputs and the plan's row arrays)."""
    merged = min(out.shape[0], lse.shape[0], dplan.num_rows)
    return (min(block_table.shape[0], seq_lens.shape[0], query_start_loc.shape[0] - 1, dplan.batch_size),
            min(q.shape[0], merged), merged)


@functools.lru_cache(maxsize=4096)
def _config_class(num_items: int) -> tuple:
    """What of a plan's work-item count :func:`default_config` reads: whether they are "few", and
    the choices for more items otherwise (:func:`_many_config`; cached: read by every ``run()``)."""
    if 0 < num_items <= _FEW_ITEMS:
        return (True,)
    return (False, _many_config(num_items, False), _many_config(num_items, True))


def plan_launch_key(dplan: DevicePlan, device) -> tuple:
    """What of a device plan decides :func:`prepare_decode`'s result besides stage 1's grid (which
    :meth:`DecodeLaunch.launch` takes from each call's plan): rows per item, graph stability, a
    device-made plan's split, several query rows, long items, and from the work-item count only
    whether there are any, the configuration it decides (:func:`default_config`), whether they all fit on
    the GPU at once (the merge's early launch) and whether anything is merged. Plans with equal
    keys, for tensors of one signature and partial buffers of one size, share a prepared launch."""
    n = dplan.num_items
    sms = _device_traits(device)[0]
    return (dplan.block_m, dplan.row_blocks, dplan.graph_stable, dplan.split_size,
            dplan.max_splits if dplan.split_size else 0, dplan.max_q_len != 1,
            dplan.item_tokens >= LONG_ITEM_TOKENS, n > 0, _config_class(dplan.config_items or n),
            # long items, one an SM: default_config's lone_item
            dplan.item_tokens >= _H200.lone_min_tokens and 0 < (dplan.config_items or n) <= _SMS,
            n * dplan.row_blocks <= 2 * sms,
            dplan.max_splits > 1 or dplan.graph_stable, dplan.index_items)


def prepare_decode(q, k_cache, v_cache, block_table, seq_lens, query_start_loc, dplan: DevicePlan,
                   out, lse, part_o, part_lse, counters=None, *, scale: float, soft_cap=None, window_left=None,
                   k_scale=None, v_scale=None, k_offset=None, v_offset=None, config: KernelConfig | None = None,
                   fuse_merge: bool = False, interpret: bool = False, merge: bool = True,
                   batch_invariant: bool = True, pdl: bool | None = None, errors=None,
                   fast_path: bool = True) -> DecodeLaunch:
    """:func:`launch_decode`'s host work without the launches (see there for the arguments).
    ``fast_path``: the launches may take :mod:`cuda_ref.fast_launch` after their first call (for a
    caller that keeps the :class:`DecodeLaunch`); False: Triton's normal launch each call."""
    T, Hq, D = q.shape
    _, page, Hkv, _ = k_cache.shape
    group = Hq // Hkv
    kv_int8 = k_cache.dtype == torch.int8
    dot_ieee = q.dtype == torch.float32 or kv_int8
    cfg = config or default_config(D, k_cache.element_size() if not kv_int8 else 4,
                                   dplan.config_items or dplan.num_items, batch_invariant, dplan.item_tokens)
    block_d = max(16, 1 << (D - 1).bit_length())  # the next power of two
    sh, per_channel = _scale_layout(k_scale)
    # the bounds the kernel keeps whatever the values: sizes of the tensors it was given
    sizes = launch_sizes(q, block_table, seq_lens, query_start_loc, dplan, out, lse)
    batch, num_rows = sizes[:2]
    num_slots = min(part_o.shape[0], part_lse.shape[0])
    kv_cap = min(block_table.shape[1] * page, _INT32_MAX)
    if fuse_merge and counters.numel() < batch * Hkv * dplan.row_blocks:
        raise ValueError(f"counters: {counters.numel()} entries, the fused merge needs {batch * Hkv * dplan.row_blocks}")
    win = 0 if window_left is None else min(int(window_left), 1 << 30)  # wider than any position: no window
    with_merge = merge and not fuse_merge and (dplan.max_splits > 1 or dplan.graph_stable) and T > 0
    sms, can_pdl = _device_traits(q.device)
    pdl = with_merge and not interpret and (can_pdl if pdl is None else bool(pdl))
    grid = (dplan.num_items, dplan.row_blocks) if (dplan.num_items and T) else None
    # the device-plan prologue's split length and splits a request: a device-made plan's, or an
    # index-derived host plan's (set again by each call: DecodeLaunch.launch)
    derive = (dplan.split_size, dplan.max_splits) if dplan.split_size else (
        _index_derive(dplan) if dplan.index_items and not fuse_merge else ())
    scalars = (
        float(scale), float(soft_cap if soft_cap is not None else 1.0), win,
        q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        block_table.stride(0),
        part_o.stride(0), part_o.stride(1), part_lse.stride(0), part_lse.stride(1),
        out.stride(0), out.stride(1), lse.stride(0), lse.stride(1),
        sh, Hkv, k_cache.shape[0], kv_cap, num_rows, num_slots, batch,
        # constants where there is no device-plan prologue (no respecialization)
        *(derive or (1, 1)))
    host_splits = bool(derive) and not dplan.split_size and dplan.max_splits > 1
    constexprs = dict(
        GROUP=group, PAGE=page, HEAD_DIM=D, BLOCK_D=block_d, BLOCK_M=dplan.block_m, BLOCK_N=cfg.block_n,
        KV_INT8=kv_int8, HAS_OFFSET=k_offset is not None, SOFT_CAP=soft_cap is not None,
        HAS_WINDOW=window_left is not None, DOT_IEEE=dot_ieee, UPCAST=interpret, FUSE_MERGE=fuse_merge,
        SCALE_PER_CHANNEL=per_channel, MERGE_CHUNK=merge_chunk(block_d),
        LAUNCH_DEPENDENTS=pdl and dplan.num_items * dplan.row_blocks <= 2 * sms,
        MULTI_ROW_BLOCKS=dplan.row_blocks > 1, BOUNDS=_KERNEL_BOUNDS, COUNT_ERRORS=errors is not None,
        MIXED_TILES=dplan.max_q_len != 1, COLUMN_SUM=cfg.column_sum and dplan.max_q_len == 1,
        DEVICE_PLAN=bool(derive),
        PADDED=dplan.graph_stable and not dplan.split_size,
        HOST_SPLITS=host_splits,
        # the KV loop's bounds from the split length alone: up to 2 % faster at batch 1 and D <= 128 on
        # an H100, 1-3 % slower at D 256 (run 127, docs/perf-notes.md)
        STATIC_LOOP=host_splits and dplan.max_q_len == 1 and D <= 128,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    merge_prep = None
    if with_merge:
        ns = seq_lens if dplan.split_size else dplan.view("row_num_splits")
        merge_prep = prepare_merge(part_o, part_lse, out, lse, dplan.view("row_slot_start"), ns, skip_single=True,
                                   num_warps=cfg.merge_warps, pdl=pdl, fast_path=fast_path,
                                   device_plan=(batch, dplan.split_size, dplan.max_splits) if dplan.split_size else None)
    return DecodeLaunch(grid, scalars, constexprs, fuse_merge, merge_prep, fast_path, sizes,
                        index_derive=derive if derive and not dplan.split_size else None)


def _index_derive(dplan: DevicePlan) -> tuple:
    """``(SPLIT_SIZE, MAX_SPLITS)`` of an index-derived host plan."""
    return dplan.index_split, dplan.max_splits


def launch_merge(part_o, part_lse, out, lse, row_slot_start, row_num_splits, *, slot_step: int = 1,
                 skip_single: bool = False, num_warps: int = 1, pdl: bool = False, device_plan=None) -> None:
    """Merge kernel: row ``t`` of ``out [T, H, D]`` / ``lse [T, H]`` from slots
    ``row_slot_start[t] + j * slot_step``, ``j < row_num_splits[t]``, of ``part_o [S, H, D]`` /
    ``part_lse [S, H]``, one program per (row, head, part of the head dim: :func:`merge_d_parts`).
    With ``skip_single`` rows of one split are left as they are. ``pdl``: the launch follows the
    previous kernel on the stream by programmatic dependent launch (the kernel waits for it before
    reading the partial states). Slots outside
    ``part_o`` / ``part_lse`` are read as empty, whatever the plan says.

    ``device_plan = (seq_lens, query_start_loc, batch, split_size, max_splits)``: a plan made on the
    device (:class:`DevicePlan` with ``split_size``); ``row_num_splits`` is not read: row ``t``'s
    request ``b`` is found in ``query_start_loc`` (a binary search) and its split count is
    ``ceil(seq_lens[b] / split_size)`` (1 to ``max_splits``); rows past ``query_start_loc[batch]``
    are left as they are."""
    dp = device_plan[2:] if device_plan is not None else None
    m = prepare_merge(part_o, part_lse, out, lse, row_slot_start, row_num_splits, slot_step=slot_step,
                      skip_single=skip_single, num_warps=num_warps, pdl=pdl, device_plan=dp, fast_path=False)
    if m is not None:
        seq_lens, qsl = device_plan[:2] if device_plan is not None else (row_num_splits, row_num_splits)
        m.launch(part_o, part_lse, out, lse, row_slot_start, row_num_splits, seq_lens, qsl)


@dataclass
class MergeLaunch:
    """:func:`launch_merge`'s grid, scalar arguments and constexprs, computed once (:func:`prepare_merge`);
    ``call`` launches it (:class:`cuda_ref.fast_launch.FastLaunch`)."""

    grid: tuple
    strides: tuple                # the arguments between the tensors and seq_lens / query_start_loc
    tail: tuple                   # the arguments after them
    constexprs: dict
    fast_path: bool = True
    call: "FastLaunch | None" = field(default=None, repr=False, compare=False)

    def __post_init__(self):
        if self.call is None:
            n = len(self.strides)
            positional = (None,) * 6 + self.strides + (None, None) + self.tail
            self.call = FastLaunch(kernels.merge_kernel, self.grid, positional, (0, 1, 2, 3, 4, 5, 6 + n, 7 + n),
                                   self.constexprs, enabled=self.fast_path)

    def launch(self, part_o, part_lse, out, lse, row_slot_start, row_num_splits, seq_lens, query_start_loc):
        self.call(part_o, part_lse, out, lse, row_slot_start, row_num_splits, seq_lens, query_start_loc)

    def resize(self, rows: int, batch: int) -> None:
        """Merge ``rows`` rows (the grid); a device-made plan's merge also ``batch`` requests (its
        binary search's bound and step count)."""
        self.grid = (rows,) + self.grid[1:]
        self.call.set_grid(self.grid)
        if self.constexprs["DEVICE_PLAN"] and batch != self.tail[0]:
            self.tail = (batch,) + self.tail[1:3] + (_search_steps(batch),)
            self.call.set_values({_MERGE_BATCH_AT: batch, _MERGE_STEPS_AT: self.tail[3]})


# where the merge's request count and search steps stand among its arguments (MergeLaunch.resize)
_MERGE_BATCH_AT = kernels.merge_kernel.arg_names.index("BATCH")
_MERGE_STEPS_AT = kernels.merge_kernel.arg_names.index("SEARCH_STEPS")


def _search_steps(batch: int) -> int:
    """Halvings of ``[0, batch)`` that find a row's request (the device-plan merge's binary search)."""
    return max(batch - 1, 0).bit_length()


def prepare_merge(part_o, part_lse, out, lse, row_slot_start, row_num_splits, *, slot_step: int = 1,
                  skip_single: bool = False, num_warps: int = 1, pdl: bool = False,
                  device_plan=None, fast_path: bool = True) -> "MergeLaunch | None":
    """:func:`launch_merge` without the launch (None: nothing to merge); ``device_plan = (batch,
    split_size, max_splits)``; ``fast_path`` as :func:`prepare_decode`'s."""
    if device_plan is not None:
        batch, split_size, max_splits = device_plan
        T = min(out.shape[0], lse.shape[0], row_slot_start.shape[0])
    else:
        batch, split_size, max_splits = 0, 1, 1
        T = min(out.shape[0], lse.shape[0], row_slot_start.shape[0], row_num_splits.shape[0])
    H, D = part_o.shape[1], part_o.shape[2]
    if T == 0 or H == 0:
        return None
    block_d = 1 << (D - 1).bit_length()
    parts = merge_d_parts(block_d)
    extra = dict(launch_pdl=True) if pdl else {}
    strides = (part_o.stride(0), part_o.stride(1), part_lse.stride(0), part_lse.stride(1),
               out.stride(0), out.stride(1), lse.stride(0), lse.stride(1),
               slot_step, min(part_o.shape[0], part_lse.shape[0]))
    tail = (batch, split_size, max_splits, _search_steps(batch))
    constexprs = dict(HEAD_DIM=D, BLOCK_D=block_d, SKIP_SINGLE=skip_single, CHUNK=merge_chunk(block_d // parts),
                      WAIT_PRIMARY=pdl, DEVICE_PLAN=device_plan is not None, D_PARTS=parts, num_warps=num_warps,
                      **extra)
    return MergeLaunch((T, H, parts), strides, tail, constexprs, fast_path)
