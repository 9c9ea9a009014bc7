"""Host glue of the Triton kernels: the launches of the split and merge kernels.

Nothing here allocates or reads device memory back: :func:`launch_decode` and :func:`launch_merge`
take every buffer from the caller, so a CUDA graph can capture them. The plan on the device:
:mod:`cuda_ref.plan_upload`; the kernel configurations: :mod:`cuda_ref.configs` (both re-exported
here).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import torch

from . import kernels
from .configs import _FEW_ITEMS, _H200, _SMS, LONG_ITEM_TOKENS, KernelConfig, _device_traits, _many_config
from .configs import default_config, merge_chunk, merge_d_parts
from .fast_launch import FastLaunch, describe
from .plan_upload import DevicePlan

# re-exported: ``cuda_ref.launch.<name>`` keeps working for these
from .configs import fullest_waves, lone_item, packed_limit, packed_rows, plan_item_tokens  # noqa: F401
from .plan_upload import _FIELDS, PlanUploader  # noqa: F401

# False drops the kernels' bounds masks (kernels.split_kv_kernel's BOUNDS): only for measuring their
# cost (splitkv_bench/perf_check.py --overhead) on trusted inputs; never set it elsewhere.
KERNEL_BOUNDS = True
_INT32_MAX = 2 ** 31 - 1


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
        MULTI_ROW_BLOCKS=dplan.row_blocks > 1, BOUNDS=KERNEL_BOUNDS, COUNT_ERRORS=errors is not None,
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
