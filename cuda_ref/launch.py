"""Host glue of the Triton kernels: a plan on the device, kernel configurations, the launches.

Nothing here allocates or reads device memory back: :func:`launch_decode` and :func:`launch_merge`
take every buffer from the caller, so a CUDA graph can capture them.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import torch
import triton

from splitkv_common.plan import Plan

from . import kernels

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

    def __str__(self):
        return f"n{self.block_n}w{self.num_warps}s{self.num_stages}"


def default_config(head_dim: int, kv_bytes: int, num_items: int = 0, batch_invariant: bool = True) -> KernelConfig:
    """Stage-1 configuration by head dim, KV element size and the plan (chosen from H200
    measurements: docs/perf-notes.md).

    The tile holds 16 KiB of K at 2 bytes an element (int8 counts as 4: it is dequantized to
    float32 before the dot), at most 64 tokens; 4 warps (8 for float32 tiles, which spill with 4).
    Triton's pipeliner keeps the page ids two stages ahead of the K / V copies: ``num_stages`` 5
    gives two K / V buffers in shared memory (one tile in flight while the other is computed), 7
    gives three. Plans of at most two work items per SM ("few") take 5.

    Plans of more items ("many"): with ``batch_invariant`` (fixed split size or no split, whose
    results must not depend on the rest of the batch) only ``num_stages`` changes, to 7: the tile
    and the warps decide the order of the sums and stay as they are. Otherwise (``auto``,
    ``count:N``) the 16-bit D-128 tile halves to 32 tokens with 5 stages where the plan fits one
    wave of such programs (four per SM: B64 x 2k, 512 items, 131 against 151 µs with 64-token
    tiles), and stays at 64 tokens with 5 stages beyond (B128 x 1k, 1024 items: 137 against 147 µs,
    runs 12 and 13); other head dims and dtypes were not measured and keep the batch-invariant choice."""
    d = max(16, triton.next_power_of_2(head_dim))
    key = "few" if 0 < num_items <= 2 * 132 else "many"
    elem = min(max(kv_bytes, 2), 4)
    block_n = max(16, min(64, (16 * 1024) // (d * elem)))
    warps = 8 if elem == 4 else 4
    if key == "few":
        return KernelConfig(block_n=block_n, num_warps=warps, num_stages=5)
    if not batch_invariant and d == 128 and elem == 2:
        one_wave = num_items <= 4 * 132  # 32-token tiles: four programs per SM (106 registers a thread)
        return KernelConfig(block_n=block_n // 2 if one_wave else block_n, num_warps=warps, num_stages=5)
    return KernelConfig(block_n=block_n, num_warps=warps, num_stages=7)


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
    rows = max(1, int(max_q_len)) * int(group)
    block_m = min(int(max_block_m), max(16, triton.next_power_of_2(rows)))
    return block_m, triton.cdiv(rows, block_m)


def merge_chunk(block_d: int) -> int:
    """Slots the merge loads as one ``[CHUNK, BLOCK_D]`` float32 tile: 4K elements (128 registers a
    thread for the merge's one warp), at most 32 (the ``auto`` plan's most splits at batch 1), so
    such a row is merged after one round trip to memory. Depends on the head dim alone: a row's
    result does not depend on the rest of the batch."""
    return max(1, min(32, 4096 // block_d))


@dataclass
class DevicePlan:
    """A :class:`~splitkv_common.plan.Plan` copied to the device as one int32 buffer.

    ``data`` holds the eight int32 arrays of the plan back to back (``_FIELDS`` order); the views
    are slices of it, so one host-to-device copy refreshes a plan in place (graph replay).
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

    @staticmethod
    def sizes(num_items: int, batch_size: int, num_rows: int) -> list[int]:
        return [num_items] * 5 + [batch_size, num_rows, num_rows]

    @staticmethod
    def pack(plan: Plan) -> np.ndarray:
        return np.concatenate([np.asarray(getattr(plan, f), np.int32).reshape(-1) for f in _FIELDS])

    def view(self, name: str) -> torch.Tensor:
        sizes = self.sizes(self.num_items, self.batch_size, self.num_rows)
        k = _FIELDS.index(name)
        off = sum(sizes[:k])
        return self.data[off:off + sizes[k]]

    @classmethod
    def from_plan(cls, plan: Plan, group: int, device, out: "DevicePlan | None" = None,
                  max_block_m: int = 64) -> "DevicePlan":
        """Copy ``plan`` to ``device``; with ``out`` of the same shapes, refresh its buffer in place.
        ``max_block_m`` caps the packed query rows per program (:func:`packed_rows`)."""
        host = torch.from_numpy(cls.pack(plan))
        max_q = int(np.diff(plan.query_start_loc).max(initial=1))
        block_m, row_blocks = packed_rows(max_q, group, max_block_m)
        if out is not None:
            if out.data.numel() != host.numel() or (out.num_items, out.batch_size, out.num_rows) != (
                    plan.num_items, plan.batch_size, plan.num_rows):
                raise ValueError(
                    f"plan: shapes changed under a graph-stable plan ({plan.num_items} items, {plan.batch_size} "
                    f"requests, {plan.num_rows} rows vs {out.num_items}, {out.batch_size}, {out.num_rows})")
            if (block_m, row_blocks) != (out.block_m, out.row_blocks) and block_m * row_blocks > out.block_m * out.row_blocks:
                raise ValueError("plan: the longest request has more query rows than the graph was captured for")
            if out.max_q_len == 1 and max_q > 1:
                raise ValueError(f"plan: a request has {max_q} query rows; the graph was captured for one per request")
            out.data.copy_(host)
            return out
        return cls(host.to(device), plan.num_items, plan.batch_size, plan.num_rows, plan.num_slots,
                   plan.max_splits, block_m, row_blocks, plan.graph_stable, max_q)


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
    ``errors`` (int32 ``[4]``, zeroed by the caller) counts out-of-range page ids
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
    Neither changes any arithmetic.
    """
    T, Hq, D = q.shape
    _, page, Hkv, _ = k_cache.shape
    group = Hq // Hkv
    kv_int8 = k_cache.dtype == torch.int8
    dot_ieee = q.dtype == torch.float32 or kv_int8
    cfg = config or default_config(D, k_cache.element_size() if not kv_int8 else 4, dplan.num_items,
                                   batch_invariant)
    block_d = max(16, triton.next_power_of_2(D))
    sh, per_channel = _scale_layout(k_scale)
    dummy = seq_lens
    # the bounds the kernel keeps whatever the values: sizes of the tensors it was given
    batch = min(block_table.shape[0], seq_lens.shape[0], query_start_loc.shape[0] - 1, dplan.batch_size)
    num_rows = min(T, out.shape[0], lse.shape[0], dplan.num_rows)
    num_slots = min(part_o.shape[0], part_lse.shape[0])
    kv_cap = min(block_table.shape[1] * page, _INT32_MAX)
    if fuse_merge and counters.numel() < batch * Hkv * dplan.row_blocks:
        raise ValueError(f"counters: {counters.numel()} entries, the fused merge needs {batch * Hkv * dplan.row_blocks}")
    win = 0 if window_left is None else min(int(window_left), 1 << 30)  # wider than any position: no window
    with_merge = merge and not fuse_merge and (dplan.max_splits > 1 or dplan.graph_stable) and T > 0
    sms, can_pdl = _device_traits(q.device)
    pdl = with_merge and not interpret and (can_pdl if pdl is None else bool(pdl))
    if dplan.num_items and T:
        grid = (dplan.num_items, dplan.row_blocks)
        kernels.split_kv_kernel[grid](
            q, k_cache, v_cache, block_table, seq_lens, query_start_loc,
            dplan.view("item_request"), dplan.view("item_kv_head"), dplan.view("item_split"),
            dplan.view("item_kv_start"), dplan.view("item_kv_end"),
            dplan.view("num_splits"), dplan.view("row_slot_start"),
            part_o, part_lse, out, lse, counters if fuse_merge else dummy, errors if errors is not None else dummy,
            k_scale if k_scale is not None else dummy, v_scale if v_scale is not None else dummy,
            k_offset if k_offset is not None else dummy, v_offset if v_offset is not None else dummy,
            float(scale), float(soft_cap if soft_cap is not None else 1.0), win,
            q.stride(0), q.stride(1),
            k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
            v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
            block_table.stride(0),
            part_o.stride(0), part_o.stride(1), part_lse.stride(0), part_lse.stride(1),
            out.stride(0), out.stride(1), lse.stride(0), lse.stride(1),
            sh, Hkv, k_cache.shape[0], kv_cap, num_rows, num_slots, batch,
            GROUP=group, PAGE=page, HEAD_DIM=D, BLOCK_D=block_d, BLOCK_M=dplan.block_m, BLOCK_N=cfg.block_n,
            KV_INT8=kv_int8, HAS_OFFSET=k_offset is not None, SOFT_CAP=soft_cap is not None,
            HAS_WINDOW=window_left is not None, DOT_IEEE=dot_ieee, UPCAST=interpret, FUSE_MERGE=fuse_merge,
            SCALE_PER_CHANNEL=per_channel, MERGE_CHUNK=merge_chunk(block_d),
            LAUNCH_DEPENDENTS=pdl and dplan.num_items * dplan.row_blocks <= 2 * sms,
            MULTI_ROW_BLOCKS=dplan.row_blocks > 1, BOUNDS=_KERNEL_BOUNDS, COUNT_ERRORS=errors is not None,
            MIXED_TILES=dplan.max_q_len != 1,
            num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    if with_merge:
        launch_merge(part_o, part_lse, out, lse, dplan.view("row_slot_start"), dplan.view("row_num_splits"),
                     skip_single=True, num_warps=cfg.merge_warps, pdl=pdl)


def launch_merge(part_o, part_lse, out, lse, row_slot_start, row_num_splits, *, slot_step: int = 1,
                 skip_single: bool = False, num_warps: int = 1, pdl: bool = False) -> None:
    """Merge kernel: row ``t`` of ``out [T, H, D]`` / ``lse [T, H]`` from slots
    ``row_slot_start[t] + j * slot_step``, ``j < row_num_splits[t]``, of ``part_o [S, H, D]`` /
    ``part_lse [S, H]``, one program per (row, head). With ``skip_single`` rows of one split are
    left as they are. ``pdl``: the launch follows the previous kernel on the stream by programmatic
    dependent launch (the kernel waits for it before reading the partial states). Slots outside
    ``part_o`` / ``part_lse`` are read as empty, whatever the plan says."""
    T = min(out.shape[0], lse.shape[0], row_slot_start.shape[0], row_num_splits.shape[0])
    H, D = part_o.shape[1], part_o.shape[2]
    if T == 0 or H == 0:
        return
    block_d = triton.next_power_of_2(D)
    extra = dict(launch_pdl=True) if pdl else {}
    kernels.merge_kernel[(T, H)](
        part_o, part_lse, out, lse, row_slot_start, row_num_splits,
        part_o.stride(0), part_o.stride(1), part_lse.stride(0), part_lse.stride(1),
        out.stride(0), out.stride(1), lse.stride(0), lse.stride(1),
        slot_step, min(part_o.shape[0], part_lse.shape[0]), HEAD_DIM=D, BLOCK_D=block_d, SKIP_SINGLE=skip_single,
        CHUNK=merge_chunk(block_d), WAIT_PRIMARY=pdl, num_warps=num_warps, **extra)
