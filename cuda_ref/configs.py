"""Kernel configurations of the Triton kernels: the split kernel's tile, warps and stages for a plan
(:func:`default_config`), the packed query rows of a program (:func:`packed_rows`), the merge's
parts of the head dim (:func:`merge_d_parts`). Sizes are counts (work items, rows, columns,
tokens); the measurements behind each choice are cited where it is made.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from splitkv_common.devices import PROFILES
from splitkv_common.plan_layout import Plan

from . import kernels


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
    (``bench_wave_configs.py@0fcf0c4``, runs 38-42, docs/perf-notes.md): within 1 % of the fastest of
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
