"""Host tiling of the Ascend C kernels: the shared :class:`~splitkv_common.plan.Plan` as the two
buffers the kernels read (``ascend_ops/kernel/splitkv_tiling.h``), with the Unified Buffer (UB)
budget and the workspace size computed and checked here, on the host.

* ``plan`` words (int32): work items ``[numItems, 5]`` (request, KV head, split, start, end),
  ``query_start_loc [B + 1]``, ``seq_lens [B]``, ``row_slot_start [T]``, ``row_num_splits [T]``:
  the shared plan copied unchanged (one source of truth).
* ``tiling``: one ``SplitKVTiling``; its field list is read from the header itself, so the bytes
  packed here and the struct the kernels read cannot drift apart.
* The on-chip budgets (UB, L1, L0) and the tile sizes that fit them: :mod:`ascend_ops.budgets`
  (its names are importable from here too).
* Workspace: float32 ``o [numSlots, Hq, D]`` then ``lse [numSlots, Hq, 8]`` (each lse repeated to
  fill one 32-byte block): :func:`workspace_bytes`.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from splitkv_common import native as _native
from splitkv_common.devices import get_profile
from splitkv_common.plan_layout import Plan
from splitkv_common.planner import make_plan

from .budgets import (BLOCK, ITEMSIZE, LSE_REPEAT, L0A_BYTES, L0B_BYTES, L0C_BYTES, L1_BYTES,  # noqa: F401 (tiling.X names them too)
                      MIX_ITEM_OVERHEAD_TOKENS, MIX_MAX_ROWS, MIX_MAX_STEP_TOKENS, MIX_P_STEPS, MIX_Q_STEPS,
                      MIX_TILE_CANDIDATES, TILE_CANDIDATES, UB_BYTES, _r32, _ru, choose_mix_tiles, choose_tiles,
                      combine_heads, combine_ub_bytes, mix_cube_bytes, mix_cube_dtype, mix_cube_rows,
                      mix_scratch_core_bytes, mix_scratch_max_bytes, mix_ub_bytes, mix_unsupported, row_elems,
                      split_ub_bytes)
from .support import DEFAULT_PROFILE, kv_dtype_supported, q_dtype_supported, supported_head_dim

HEADER = Path(__file__).with_name("kernel") / "splitkv_tiling.h"
DTYPE_CODES = {"float32": 0, "float16": 1, "bfloat16": 2, "int8": 3}


def _read_fields() -> list[tuple[str, str]]:
    """``[(name, 'i' | 'f')]`` of ``struct SplitKVTiling`` in declaration order, from the header."""
    text = HEADER.read_text()
    body = re.search(r"struct SplitKVTiling \{(.*?)\};", text, re.S)
    if body is None:
        raise RuntimeError(f"{HEADER}: struct SplitKVTiling not found")
    fields = []
    for line in body.group(1).splitlines():
        m = re.match(r"\s*(int32_t|float)\s+(\w+);", line)
        if m:
            fields.append((m.group(2), "i" if m.group(1) == "int32_t" else "f"))
    words = int(re.search(r"#define SPLITKV_TILING_WORDS (\d+)", text).group(1))
    if len(fields) != words:
        raise RuntimeError(f"{HEADER}: {len(fields)} fields parsed, SPLITKV_TILING_WORDS says {words}")
    return fields


FIELDS = _read_fields()
FIELD_NAMES = [n for n, _ in FIELDS]
_FORMAT = "<" + "".join(k for _, k in FIELDS)
TILING_BYTES = struct.calcsize(_FORMAT)
VERSION = int(re.search(r"#define SPLITKV_TILING_VERSION (\d+)", HEADER.read_text()).group(1))
#: the workspace's error section (``splitkv_tiling.h``): one slot of int32 counters per launched block
ERROR_SLOT_BYTES = int(re.search(r"#define SPLITKV_ERROR_SLOT_BYTES (\d+)", HEADER.read_text()).group(1))
ERROR_SLOTS = int(re.search(r"#define SPLITKV_ERROR_SLOTS (\d+)", HEADER.read_text()).group(1))
ERROR_BYTES = ERROR_SLOT_BYTES * ERROR_SLOTS


def pack_tiling(t: dict) -> bytes:
    """The ``SplitKVTiling`` bytes (little-endian) of a field dict."""
    return struct.pack(_FORMAT, *[t[n] for n in FIELD_NAMES])


def unpack_tiling(data: bytes) -> dict:
    """A field dict from ``SplitKVTiling`` bytes."""
    return dict(zip(FIELD_NAMES, struct.unpack(_FORMAT, bytes(data)[:TILING_BYTES])))


def balance_items(plan: Plan, cores: int, overhead_tokens: int = MIX_ITEM_OVERHEAD_TOKENS) -> np.ndarray:
    """``[cores + 1]`` first item of each AI core: contiguous item ranges of about equal length.

    Why contiguous ranges by prefix sums: an item's cost is its token count (K and V bytes) plus a
    fixed cost, and items differ in length (requests of different lengths, the last split of a
    request); round-robin gives one core every long item. Each item goes to the core its weight's
    midpoint falls in (``floor(mid * cores / total)``), so a core's load is within one item of
    ``total / cores`` and the items of one request stay together (the same block-table rows).
    """
    # items past num_valid_items are padding (weight 0, the last core's): the prefix decides the bounds.
    # In integers: item i's midpoint times 2 is c[i - 1] + c[i] (c: the prefix sums of the weights), so
    # item i goes to core k or later exactly when (c[i - 1] + c[i]) * cores >= 2 * total * k.
    nv = int(plan.num_valid_items)
    bounds = np.zeros(cores + 1, np.int32)
    bounds[cores] = plan.num_items
    if nv == 0:
        return bounds
    start, end = plan.item_kv_start[:nv], plan.item_kv_end[:nv]
    w = (np.maximum(end - start, 0) + overhead_tokens) * (plan.item_request[:nv] >= 0)
    c = np.cumsum(w, dtype=np.int64)
    total = int(c[-1])
    if total <= 0:
        return bounds
    c += c - w   # 2 x each midpoint
    c *= cores
    bounds[1:cores] = np.searchsorted(c, np.arange(2 * total, 2 * total * cores, 2 * total, dtype=np.int64))
    return bounds


def npu_split_count(seq_lens, num_kv_heads: int, page_size: int, profile: str = DEFAULT_PROFILE,
                    num_q_heads: int | None = None, head_dim: int = 128, kv_elem_bytes: int = 2) -> int:
    """Splits per request (of the longest one) that the ``auto`` policy gives on an Ascend profile:
    the shared planner's NPU rule (:func:`splitkv_common.plan.npu_auto`: about ``cube cores / (B *
    Hkv)``, as CANN's IFA, with the profile's minimum split length), so the estimate, the wrapper
    and the tests plan the same way."""
    plan = make_plan(np.asarray(seq_lens, np.int64).reshape(-1), num_kv_heads=num_kv_heads, page_size=page_size,
                     policy="auto", device=profile, num_q_heads=num_q_heads or num_kv_heads, head_dim=head_dim,
                     kv_elem_bytes=kv_elem_bytes)
    return int(plan.num_splits.max(initial=1))


def workspace_bytes(num_slots: int, num_q_heads: int, head_dim: int) -> tuple[int, int]:
    """``(lse_offset_bytes, total_bytes)`` of the workspace, from its start: the error section
    (``ERROR_BYTES``), then o ``[S, Hq, D]`` and lse ``[S, Hq, 8]``, float32."""
    o = int(num_slots) * int(num_q_heads) * int(head_dim) * 4
    return ERROR_BYTES + o, ERROR_BYTES + o + int(num_slots) * int(num_q_heads) * LSE_REPEAT * 4


def check_error_slots(block_dim: int) -> None:
    """Each launched block counts in its own slot of the workspace's error section."""
    if block_dim > ERROR_SLOTS:
        raise ValueError(f"block_dim: {block_dim} blocks, the workspace's error section has {ERROR_SLOTS} slots "
                         "(one per launched block)")


# the plan words' sections in order, by their tiling offset fields: the items last (plan_words)
_SECTIONS = ("qslOffset", "seqLensOffset", "rowSlotOffset", "rowNumOffset", "coreRangeOffset", "itemsOffset")


def plan_words(plan: Plan, seq_lens, core_range=None) -> tuple[np.ndarray, dict]:
    """The int32 ``plan`` buffer and the section offsets (in words) of the tiling (``core_range``:
    the mixed kernel's first item per AI core, :func:`balance_items`).

    The sections in order: ``query_start_loc [B + 1]``, ``seq_lens [B]``, ``row_slot_start [T]``,
    ``row_num_splits [T]``, the core ranges, then the items ``[W, 5]`` last, so that a graph-stable
    plan's words differ from the previous step's only in a prefix (its valid items end before the
    padding) and only that prefix need be uploaded."""
    items = np.stack([plan.item_request, plan.item_kv_head, plan.item_split, plan.item_kv_start,
                      plan.item_kv_end], axis=1).astype(np.int32).reshape(-1)
    arrays = dict(qslOffset=np.asarray(plan.query_start_loc, np.int32),
                  seqLensOffset=np.asarray(seq_lens, np.int32).reshape(-1),
                  rowSlotOffset=np.asarray(plan.row_slot_start, np.int32),
                  rowNumOffset=np.asarray(plan.row_num_splits, np.int32),
                  coreRangeOffset=np.asarray(core_range if core_range is not None else [], np.int32),
                  itemsOffset=items)
    parts = [(name, arrays[name]) for name in _SECTIONS]
    offs, at = {}, 0
    for name, arr in parts:
        offs[name] = at
        at += arr.size
    words = np.concatenate([a for _, a in parts]).astype(np.int32) if at else np.zeros(1, np.int32)
    offs["planWords"] = int(words.size)
    return words, offs


def _tiling_max_splits(plan: Plan, seq_lens, device_split_tokens: int, page_size: int) -> int:
    """The tiling's ``maxSplits``: the plan's most splits of a row, or with ``device_split_tokens``
    ``S > 0`` the slots per query row of a graph-stable plan, after the rules of that mode."""
    S = device_split_tokens
    if not S:
        return max(1, plan.max_splits)
    T = plan.num_rows
    if not plan.graph_stable:
        raise ValueError("device_split_tokens: needs a graph-stable plan (partial slots row * max_splits + j)")
    if S < 0 or S % page_size:
        raise ValueError(f"device_split_tokens: {S} must be a positive multiple of page_size {page_size}")
    max_splits = plan.num_slots // T if T else 1
    if T and plan.num_slots != T * max_splits:
        raise ValueError("device_split_tokens: the plan's slots are not row * max_splits + j")
    longest = int(np.asarray(seq_lens).max(initial=0))
    if longest > S * max_splits:
        raise ValueError(f"seq_lens: {longest} tokens is over device_split_tokens * max_splits = "
                         f"{S} * {max_splits}; the kernels would read only {S * max_splits}")
    return max_splits


def _check_sync_all_blocks(block_dim: int, cores: int, device: str) -> None:
    """The fused mixed launch synchronizes all its AI cores (SyncAll): more blocks than the device
    has cores never all run at once, and the launch hangs."""
    if block_dim > cores:
        raise ValueError(f"block_dim: {block_dim} AI cores for the fused mixed launch, but the device ({device}) has "
                         f"{cores}: its SyncAll needs every block resident at once (more would hang)")


def build_buffers(plan: Plan, *, seq_lens, num_q_heads: int, head_dim: int, page_size: int, max_pages: int,
                  num_pages: int, dtype: str, kv_dtype: str, scale: float, soft_cap: float | None = None,
                  window_left: int | None = None, profile: str = DEFAULT_PROFILE,
                  block_dim: int | None = None, kernel: str = "auto",
                  all_cores: bool = False, device_split_tokens: int = 0) -> tuple[dict, bytes, np.ndarray]:
    """``(tiling fields, tiling bytes, plan words)`` for one batch; checks every host-side rule.

    ``kernel``: ``auto`` (the mixed split stage where :func:`~ascend_ops.support.mixed_kernel_unsupported`
    allows it, else the vector-only one), ``mix`` or ``vector``. ``all_cores``: launch on every core of
    the profile for the chosen kernel (cube cores for the mixed one, vector cores otherwise) whatever
    the batch, so that a captured graph keeps its launch. The field dict also holds
    ``kernelReason`` (not packed): why this split stage serves the call, in words.

    ``device_split_tokens`` (graph mode, ``S > 0``): the kernels derive their work items, ranges and
    partial slots from the plan's ``seqLens`` section on the device (``splitkv_tiling.h``), so new
    lengths need no new tiling: the plan must be graph-stable (slots ``row * max_splits + j``), ``S``
    a multiple of the page size, every length at most ``S * max_splits``; implies ``all_cores``.

    Raises ``ValueError`` naming the rule when the head dim, dtypes, UB budget, copy-parameter
    ranges or workspace size are out of what the kernels take.
    """
    if not q_dtype_supported(dtype):
        raise ValueError(f"dtype: the Ascend kernels take float32, float16 or bfloat16 q, got {dtype!r}")
    if not kv_dtype_supported(dtype, kv_dtype):
        raise ValueError(f"kv_dtype: must be q's dtype ({dtype}) or int8, got {kv_dtype!r}")
    why = supported_head_dim(head_dim)
    if why:
        raise ValueError(why)
    hkv = int(plan.num_kv_heads)
    if num_q_heads % hkv:
        raise ValueError(f"num_q_heads: {num_q_heads} is not a multiple of num_kv_heads {hkv}")
    prof = get_profile(profile)
    ub = prof.ub_bytes or UB_BYTES
    group = num_q_heads // hkv
    qsl = np.asarray(plan.query_start_loc, np.int64)
    max_q = int(np.diff(qsl).max(initial=0))
    tt, rc = choose_tiles(head_dim, dtype, kv_dtype, max(1, max_q * group), soft_cap is not None and soft_cap > 0, ub)
    S = int(device_split_tokens or 0)
    max_splits = _tiling_max_splits(plan, seq_lens, S, page_size)
    all_cores = all_cores or S > 0
    comb_heads = combine_heads(head_dim, dtype, num_q_heads, max_splits, group, ub)
    comb = combine_ub_bytes(head_dim, dtype, num_q_heads, max_splits, comb_heads)
    if sum(comb.values()) > ub:
        raise ValueError(f"UB budget: the combine kernel needs {sum(comb.values())} bytes for {max_splits} splits "
                         f"per row, head_dim={head_dim}; rule: all InitBuffer sizes of one vector core must fit "
                         f"the {ub}-byte Unified Buffer (use fewer splits per row)")
    if (num_q_heads - 1) * head_dim // 8 > 65535:
        raise ValueError("combine: (Hq - 1) * D / 8 must fit DataCopyParams' 16-bit stride (in 32-byte blocks)")
    if max_splits > 4095:
        raise ValueError(f"combine: {max_splits} splits per row; a DataCopy moves at most 4095 blocks "
                         "(blockCount <= 4095 on dav-c220) and the combine copies one block per split")
    if page_size > 65535:
        raise ValueError("page_size: at most 65535 (DataCopyPad blockCount is 16-bit)")
    lse_off, ws = workspace_bytes(plan.num_slots, num_q_heads, head_dim)
    T = plan.num_rows
    if kernel not in ("auto", "mix", "vector"):
        raise ValueError(f"kernel: auto, mix or vector, got {kernel!r}")
    mix = None
    why = "vector kernel forced (kernel='vector')"
    if kernel != "vector":
        why = mix_unsupported(head_dim, dtype, kv_dtype, num_q_heads, hkv)
        if why is None:
            mix = choose_mix_tiles(head_dim, dtype, max(1, max_q * group), soft_cap is not None and soft_cap > 0, ub,
                                   kv_dtype, multi_query=max_q > 1)
            why = None if mix else f"mixed kernel: {max_q * group} query rows per item do not fit one cube tile"
        if why and kernel == "mix":
            raise ValueError(why)
    reason = ("mixed AIC + AIV split stage, fused launch (split, SyncAll, combine)" if mix
              else f"vector-only split stage + combine (fallback: {why})")
    mix_fields = dict(kernelKind=0, mixTileTokens=0, mixRowsPad=0, scratchOffsetBytes=ws, scratchCoreBytes=0,
                      mixUbBytes=0, mixStepTiles=0)
    core_range = None
    if mix:
        tt_m, mp, steps_m = mix
        cores = prof.cube_units or prof.units
        if block_dim is None:
            block_dim = cores if all_cores else max(1, min(cores, plan.num_valid_items))
        _check_sync_all_blocks(int(block_dim), cores, prof.name)
        core_range = balance_items(plan, int(block_dim))
        scratch_off = _ru(ws, 512)
        # all_cores (graph-stable): the scratch is sized for the largest tile and row count, so that
        # the workspace keeps its size whatever rows the next batch has (its layout follows the
        # batch's own tile and rows, which fit)
        capped = soft_cap is not None and soft_cap > 0
        per_core = (mix_scratch_max_bytes(head_dim, dtype, kv_dtype, capped)
                    if all_cores else mix_scratch_core_bytes(head_dim, dtype, tt_m * steps_m, mp, kv_dtype))
        ws = scratch_off + int(block_dim) * per_core
        mix_fields = dict(kernelKind=1, mixTileTokens=tt_m, mixRowsPad=mp, scratchOffsetBytes=scratch_off,
                          scratchCoreBytes=per_core, mixStepTiles=steps_m,
                          mixUbBytes=sum(mix_ub_bytes(head_dim, dtype, tt_m * steps_m, mp, capped,
                                                      kv_dtype, multi_query=max_q > 1).values()))
    if ws >= 2 ** 31:
        raise ValueError(f"workspace: {ws} bytes does not fit the tiling's int32 workspaceBytes")
    words, offs = plan_words(plan, seq_lens, core_range)
    if block_dim is None:
        block_dim = prof.units if all_cores else max(1, min(prof.units, max(plan.num_valid_items, T)))
    split_b = split_ub_bytes(head_dim, dtype, kv_dtype, tt, rc, soft_cap is not None and soft_cap > 0)
    t = dict(
        version=VERSION, blockDim=int(block_dim), batch=int(plan.batch_size), numRows=int(T),
        numQHeads=int(num_q_heads), numKVHeads=hkv, groupSize=int(group), headDim=int(head_dim),
        pageSize=int(page_size), maxPages=int(max_pages), numPages=int(num_pages), numItems=int(plan.batch_size * hkv * max_splits) if S else int(plan.num_items),
        numSlots=int(plan.num_slots), maxQLen=max_q, qDtype=DTYPE_CODES[dtype], kvDtype=DTYPE_CODES[kv_dtype],
        windowLeft=-1 if window_left is None or window_left < 0 else int(window_left), scale=float(scale),
        softCap=float(soft_cap) if soft_cap else 0.0, tileTokens=tt, rowChunk=rc,
        kvRowElems=row_elems(head_dim, kv_dtype), qRowElems=row_elems(head_dim, dtype), rowElems=_ru(head_dim, 8),
        maxSplits=max_splits, lseOffsetBytes=lse_off, workspaceBytes=ws,
        splitUbBytes=sum(split_b.values()), combineUbBytes=sum(comb.values()), **mix_fields, **offs,
        combineBlockDim=int(max(1, min(prof.units, T * hkv))), deviceSplitTokens=S,
        combineHeads=int(comb_heads))
    check_dma_block_counts(t)
    check_error_slots(int(block_dim))
    tb = pack_tiling(t)
    t["kernelReason"] = reason
    return t, tb, words


DMA_MAX_BLOCKS = 4095  # DataCopy / DataCopyPad blockCount on dav-c220 (kernel_operator_data_copy_impl.h)


def dma_block_counts(t: dict) -> dict[str, int]:
    """The largest ``blockCount`` each strided copy of the kernels issues for a tiling, by copy."""
    counts = {
        "split: K / V rows of one page segment (<= tileTokens)": int(t["tileTokens"]),
        "split: q rows of one query row's heads (<= rowChunk)": int(t["rowChunk"]),
        "combine: one lse block / o row per split (maxSplits)": int(t["maxSplits"]),
    }
    if int(t["kernelKind"]) == 1:
        counts["mixed: S / P / O rows of one vector core (mixRowsPad / 2)"] = int(t["mixRowsPad"]) // 2
    return counts


def check_dma_block_counts(t: dict) -> None:
    """``ValueError`` naming the copy when one would move more than 4095 blocks (the dav-c220 limit
    the twin enforces as ``[dma-param]``)."""
    for what, n in dma_block_counts(t).items():
        if n > DMA_MAX_BLOCKS:
            raise ValueError(f"DMA block count: {what} would be {n}; a DataCopy moves at most {DMA_MAX_BLOCKS} "
                             "blocks (blockCount <= 4095 on dav-c220)")


def kv_quant_array(inputs) -> np.ndarray:
    """float32 ``[4, Hkv, D]``: k scale, k offset, v scale, v offset (per channel; per-head values broadcast)."""
    hkv, d = inputs.k_cache.shape[2], inputs.k_cache.shape[3]

    def full(x, default):
        if x is None:
            return np.full((hkv, d), default, np.float32)
        return np.broadcast_to(np.asarray(x, np.float32).reshape(hkv, -1), (hkv, d))

    return np.ascontiguousarray(np.stack([full(inputs.k_scale, 1.0), full(inputs.k_offset, 0.0),
                                          full(inputs.v_scale, 1.0), full(inputs.v_offset, 0.0)]), np.float32)


@dataclass
class Tiling:
    """Everything the two launches need besides the tensors."""

    fields: dict
    tiling_bytes: bytes
    plan_words: np.ndarray
    kv_quant: np.ndarray | None

    @property
    def workspace_bytes(self) -> int:
        return int(self.fields["workspaceBytes"])

    @property
    def block_dim(self) -> int:
        return int(self.fields["blockDim"])

    @property
    def combine_block_dim(self) -> int:
        return int(self.fields["combineBlockDim"])

    @property
    def mixed(self) -> bool:
        """Whether the split stage is the mixed AIC + AIV kernel (``splitkv_split_mix``)."""
        return int(self.fields["kernelKind"]) == 1

    @property
    def kernel_reason(self) -> str:
        """Why this split stage serves the call (the fallback's reason when it is the vector one)."""
        return str(self.fields.get("kernelReason", ""))

    @property
    def launches(self) -> list[tuple[str, int]]:
        """The launches of one call, ``[(kernel entry, block count)]``, in order: what the torch_npu
        binding enqueues (``ops.decode_attention``'s ``kernel`` = ``kernelKind``) and what the twin
        runs by default (:func:`ascend_ops.sim_backend.run_twin`)."""
        return launches(self.fields)


def launches(fields: dict) -> list[tuple[str, int]]:
    """``[(kernel entry, block count)]`` of a tiling: the fused mixed launch on ``blockDim`` AI cores,
    or the vector split stage on ``blockDim`` vector cores then the combine (the binding gives it
    the same count; the combine takes any)."""
    if int(fields["kernelKind"]) == 1:
        return [("splitkv_attention_mix", int(fields["blockDim"]))]
    return [("splitkv_split", int(fields["blockDim"])), ("splitkv_combine", int(fields["blockDim"]))]


def build_tiling(inputs, plan: Plan, profile: str = DEFAULT_PROFILE, block_dim: int | None = None,
                 kernel: str = "auto", device_split_tokens: int = 0) -> Tiling:
    """:func:`build_buffers` for one :class:`~splitkv_common.inputs.DecodeInputs` and its plan
    (``kernel``: ``auto`` takes the mixed split stage where it applies, ``mix`` or ``vector`` force one)."""
    t, tb, words = build_buffers(
        plan, seq_lens=inputs.seq_lens, num_q_heads=inputs.q.shape[1], head_dim=inputs.q.shape[2],
        page_size=inputs.k_cache.shape[1], max_pages=inputs.block_table.shape[1], num_pages=inputs.k_cache.shape[0],
        dtype=inputs.dtype, kv_dtype=inputs.kv_dtype, scale=inputs.scale, soft_cap=inputs.soft_cap,
        window_left=inputs.window_left, profile=profile, block_dim=block_dim, kernel=kernel,
        device_split_tokens=device_split_tokens)
    return Tiling(t, tb, words, kv_quant_array(inputs) if inputs.kv_dtype == "int8" else None)


# fields of build_buffers' tiling that depend on the plan itself; the others depend only on the settings,
# the KV heads, the longest request's query rows and the most splits of a row (TilingBuilder's key)
_PLAN_FIELDS = ("blockDim", "batch", "numRows", "numPages", "numItems", "numSlots", "lseOffsetBytes",
                "workspaceBytes", "scratchOffsetBytes", "combineBlockDim", "itemsOffset", "qslOffset",
                "seqLensOffset", "rowSlotOffset", "rowNumOffset", "coreRangeOffset", "planWords")


def _word_offsets(B: int, n_seq: int, T: int, cores: int, W: int) -> dict:
    """The plan words' section offsets (:func:`plan_words`' layout, the items last) and their count
    (``planWords``, at least 1): ``B`` requests, ``n_seq`` lengths, ``T`` rows, ``cores`` AI cores'
    ranges (0: none), ``W`` items."""
    sizes = dict(qslOffset=B + 1, seqLensOffset=n_seq, rowSlotOffset=T, rowNumOffset=T,
                 coreRangeOffset=cores + 1 if cores else 0, itemsOffset=5 * W)
    offs, at = {}, 0
    for name in _SECTIONS:
        n = sizes[name]
        offs[name] = at
        at += n
    offs["planWords"] = max(at, 1)
    return offs


class TilingBuilder:
    """:func:`build_buffers` for a stream of plans with the same settings (one decode step each): the
    same ``(fields, tiling bytes, plan words)`` bit for bit, in a fraction of the host time.

    What depends only on the settings, the KV heads, the longest request's query rows and the most
    splits of a row (the dtype and head-dim rules, the tiles, the UB budgets, the mixed kernel's
    tiles and scratch) is computed by :func:`build_buffers` once per such key and kept; per plan only
    the plan's own fields (sizes, workspace, block dims, word offsets) and the words are made. The
    words are written into the caller's array (:meth:`build`'s ``into``: the host side of its upload)
    or a buffer kept by the builder, grown when too small; a graph-stable stream into the same array
    allocates nothing and rewrites only the work items up to the larger of this plan's and the
    previous plan's valid count, the rest being padding already (:attr:`fresh_words`). The returned
    words are a view of that array: copy them to the device before the next :meth:`build`.
    """

    def __init__(self, *, num_q_heads: int, head_dim: int, page_size: int, max_pages: int, dtype: str,
                 kv_dtype: str, scale: float, soft_cap: float | None = None, window_left: int | None = None,
                 profile: str = DEFAULT_PROFILE, block_dim: int | None = None, kernel: str = "auto",
                 all_cores: bool = False, device_split_tokens: int = 0):
        self.settings = dict(num_q_heads=num_q_heads, head_dim=head_dim, page_size=page_size, max_pages=max_pages,
                             dtype=dtype, kv_dtype=kv_dtype, scale=scale, soft_cap=soft_cap,
                             window_left=window_left, profile=profile, block_dim=block_dim, kernel=kernel,
                             all_cores=all_cores, device_split_tokens=int(device_split_tokens or 0))
        self._prof = get_profile(profile)
        self._static: dict = {}
        self._buf: "np.ndarray | None" = None   # the words' storage when the caller gives none (kept)
        self._last = None        # (array, section offsets) of the last words written completely
        self._valid = 0          # work items of the last plan written there
        #: the leading words of the last :meth:`build`'s words that may differ from the build's before
        #: (into the same buffer): all of them, or for a graph-stable stream the sections before the
        #: items and the items up to the larger valid count (the rest is padding in both)
        self.fresh_words = 0

    def build(self, plan: Plan, seq_lens, num_pages: int, into=None) -> tuple[dict, bytes, np.ndarray]:
        """``(fields, tiling bytes, plan words)`` of ``plan`` (the batch's host ``seq_lens [B]``).

        ``into``: None (the words go into a buffer the builder keeps), or ``into(fields, n)``, called
        once the fields are made and before any word is written, returning the int32 array (at least
        ``n`` entries) to write the ``n`` words into: where the caller keeps them, e.g. the host buffer
        its upload reads, so that nothing copies them again. It may raise to refuse the plan; nothing
        is written then. A graph-stable stream into the same array object rewrites only its first
        :attr:`fresh_words`."""
        B, T, W = plan.batch_size, plan.num_rows, plan.num_items
        qsl = plan.query_start_loc
        max_q = int((qsl[1:] - qsl[:-1]).max()) if B else 0
        S = self.settings["device_split_tokens"]
        max_splits = _tiling_max_splits(plan, seq_lens, S, self.settings["page_size"])
        all_cores = self.settings["all_cores"] or S > 0
        key = (int(plan.num_kv_heads), max_q, max_splits)
        st = self._static.get(key)
        if st is None:   # the first plan of this key: build_buffers itself (its checks and errors)
            t, _, _ = build_buffers(plan, seq_lens=seq_lens, num_pages=num_pages, **self.settings)
            st = self._static[key] = {k: v for k, v in t.items() if k not in _PLAN_FIELDS}
        t = dict(st)
        hkv = key[0]
        Hq, D = self.settings["num_q_heads"], self.settings["head_dim"]
        block_dim = self.settings["block_dim"]
        lse_off, ws = workspace_bytes(plan.num_slots, Hq, D)
        balanced = 0   # AI cores the mixed kernel's items are balanced over (balance_items), 0: none
        scratch_off = ws
        if st["kernelKind"] == 1:
            cores = self._prof.cube_units or self._prof.units
            if block_dim is None:
                block_dim = cores if all_cores else max(1, min(cores, plan.num_valid_items))
            _check_sync_all_blocks(int(block_dim), cores, self._prof.name)
            balanced = int(block_dim)
            scratch_off = _ru(ws, 512)
            ws = scratch_off + int(block_dim) * st["scratchCoreBytes"]
        if ws >= 2 ** 31:
            raise ValueError(f"workspace: {ws} bytes does not fit the tiling's int32 workspaceBytes")
        if block_dim is None:
            block_dim = self._prof.units if all_cores else max(1, min(self._prof.units, max(plan.num_valid_items, T)))
        check_error_slots(int(block_dim))
        seq = np.asarray(seq_lens).reshape(-1)
        offs = _word_offsets(B, seq.shape[0], T, balanced, W)
        t.update(blockDim=int(block_dim), batch=int(B), numRows=int(T), numPages=int(num_pages),
                 numItems=int(B * key[0] * max_splits) if S else int(W),
                 numSlots=int(plan.num_slots), lseOffsetBytes=lse_off, workspaceBytes=ws, scratchOffsetBytes=scratch_off,
                 combineBlockDim=int(max(1, min(self._prof.units, T * hkv))), **offs)
        size = offs["planWords"]
        words = self._words_of(plan, seq, balanced, offs, None if into is None else into(t, size))
        return t, pack_tiling(t), words

    def _words_of(self, plan: Plan, seq: np.ndarray, cores: int, offs: dict, dest) -> np.ndarray:
        """:func:`plan_words` (``seq``: the lengths ``[B]``; sections at ``offs``) into ``dest`` (None: the
        builder's own buffer), with ``cores`` > 0 the items balanced over that many AI cores
        (:func:`balance_items`): in one call of the C planner's module where it is built and the plan
        has its ``[5, W]`` item buffer, else with NumPy (the same words). Sets :attr:`fresh_words`."""
        W, size = plan.num_items, offs["planWords"]
        if dest is None:
            # every word is written below unless the last plan's are there: a kept buffer will do
            if self._buf is None or self._buf.shape[0] < size:
                self._buf = np.empty(max(size, 2 * (0 if self._buf is None else self._buf.shape[0])), np.int32)
            dest = self._buf
        elif dest.dtype != np.int32 or dest.ndim != 1 or dest.shape[0] < size or not dest.flags.c_contiguous:
            raise ValueError(f"into: must give a contiguous 1-D int32 array of at least {size} words")
        words = dest[:size]
        # a graph-stable plan into the array (the same object: the same memory) whose words the last
        # call wrote completely, in the same layout: only the sections before the items and the items
        # up to the larger valid count change
        last, self._last = self._last, None   # set again once these words are written
        reuse = plan.graph_stable and last is not None and last[0] is dest and last[1] == offs
        where = (dest, offs)
        hi = max(plan.num_valid_items, self._valid) if reuse else W
        at = offs["itemsOffset"]
        self.fresh_words = at + 5 * hi if reuse else size
        self._write_words(plan, seq, cores, words, at, hi)
        self._valid, self._last = plan.num_valid_items, where
        return words

    def _write_words(self, plan: Plan, seq: np.ndarray, cores: int, words: np.ndarray, at: int, hi: int) -> None:
        """The sections before the items, then the first ``hi`` items from word ``at`` on."""
        W = plan.num_items
        buf, mod = plan.items, _native.load()
        if mod is not None and buf is not None and buf.shape == (5, W) and buf.dtype == np.int32 and \
                buf.flags.c_contiguous and mod.ascend_words(
                    buf, plan.num_valid_items, hi, plan.query_start_loc, seq, plan.row_slot_start, plan.row_num_splits,
                    cores, MIX_ITEM_OVERHEAD_TOKENS, words) is not None:
            return
        rest = [plan.query_start_loc, seq, plan.row_slot_start, plan.row_num_splits]
        if cores:
            rest.append(balance_items(plan, cores))
        k = 0
        for a in rest:
            words[k:k + a.shape[0]] = a
            k += a.shape[0]
        items = words[at:at + 5 * W].reshape(W, 5)
        if buf is not None and buf.shape == (5, W):   # the planner's buffer: one transposing copy
            items[:hi] = buf[:, :hi].T
        else:
            for k, f in enumerate((plan.item_request, plan.item_kv_head, plan.item_split, plan.item_kv_start,
                                   plan.item_kv_end)):
                items[:hi, k] = f[:hi]
