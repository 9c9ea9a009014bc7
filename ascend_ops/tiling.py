"""Host tiling of the Ascend C kernels: the shared :class:`~splitkv_common.plan.Plan` as the two
buffers the kernels read (``ascend_ops/kernel/splitkv_tiling.h``), with the Unified Buffer (UB)
budget and the workspace size computed and checked here, on the host.

* ``plan`` words (int32): work items ``[numItems, 5]`` (request, KV head, split, start, end),
  ``query_start_loc [B + 1]``, ``seq_lens [B]``, ``row_slot_start [T]``, ``row_num_splits [T]``:
  the shared plan copied unchanged (one source of truth).
* ``tiling``: one ``SplitKVTiling``; its field list is read from the header itself, so the bytes
  packed here and the struct the kernels read cannot drift apart.
* UB budget: :func:`split_ub_bytes` / :func:`combine_ub_bytes` list every ``InitBuffer`` of each
  kernel (the same expressions as the kernel sources, each rounded up to 32 bytes); a config over
  192 KiB raises ``ValueError`` naming the rule. The CPU twin enforces the same 192 KiB on the
  kernels' actual ``InitBuffer`` calls, and the tests check both agree.
* Workspace: float32 ``o [numSlots, Hq, D]`` then ``lse [numSlots, Hq, 8]`` (each lse repeated to
  fill one 32-byte block): :func:`workspace_bytes`.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from splitkv_common.devices import get_profile
from splitkv_common.plan import Plan

from .support import DEFAULT_PROFILE, kv_dtype_supported, q_dtype_supported, supported_head_dim

HEADER = Path(__file__).with_name("kernel") / "splitkv_tiling.h"
UB_BYTES = 192 * 1024          # Unified Buffer per vector core, 910B
BLOCK = 32                     # UB alignment and copy granule, bytes
LSE_REPEAT = 8                 # floats per workspace lse (one 32-byte block)
DTYPE_CODES = {"float32": 0, "float16": 1, "bfloat16": 2, "int8": 3}
ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2, "int8": 1}
TILE_CANDIDATES = (128, 64, 32, 16, 8)  # KV tokens per UB tile, largest first


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


def pack_tiling(t: dict) -> bytes:
    """The ``SplitKVTiling`` bytes (little-endian) of a field dict."""
    return struct.pack(_FORMAT, *[t[n] for n in FIELD_NAMES])


def unpack_tiling(data: bytes) -> dict:
    """A field dict from ``SplitKVTiling`` bytes."""
    return dict(zip(FIELD_NAMES, struct.unpack(_FORMAT, bytes(data)[:TILING_BYTES])))


def _r32(x: int) -> int:
    return -(-int(x) // BLOCK) * BLOCK


def _ru(x: int, m: int) -> int:
    return -(-int(x) // m) * m


def row_elems(head_dim: int, dtype: str) -> int:
    """UB row stride, in elements of ``dtype``, of a ``head_dim`` row padded to 32 bytes."""
    return _r32(head_dim * ITEMSIZE[dtype]) // ITEMSIZE[dtype]


def split_ub_bytes(head_dim: int, dtype: str, kv_dtype: str, tile_tokens: int, row_chunk: int,
                   soft_cap: bool) -> dict[str, int]:
    """Every UB buffer of the split kernel (``SplitStage::Init``), bytes after 32-byte rounding."""
    D, TT, R = head_dim, tile_tokens, row_chunk
    KR, QR, RE = row_elems(D, kv_dtype), row_elems(D, dtype), _ru(D, 8)
    kvb, qb = ITEMSIZE[kv_dtype], ITEMSIZE[dtype]
    b = {"inK (2 x K tile)": 2 * _r32(TT * KR * kvb), "inV (2 x V tile)": 2 * _r32(TT * KR * kvb)}
    if kv_dtype != "float32":
        b["kf (K tile float32)"] = _r32(TT * KR * 4)
        b["vf (V tile float32)"] = _r32(TT * KR * 4)
    if kv_dtype == "int8":
        b["h16 (int8 -> half staging)"] = _r32(TT * KR * 2)
        b["quant (scale/offset rows)"] = _r32(4 * KR * 4)
    if dtype != "float32":
        b["qIn (q staging)"] = _r32(R * QR * qb)
    b["qf (q rows float32)"] = _r32(R * QR * 4)
    b["acc (u rows)"] = _r32(R * RE * 4)
    b["stat (m, l)"] = _r32(2 * _ru(R, 8) * 4)
    b["sc (scores)"] = _r32(_ru(TT, 8) * 4)
    b["prod"] = _r32(RE * 4)
    b["red"] = BLOCK
    b["tmp"] = BLOCK
    b["work (reduce scratch)"] = _r32(_ru(2 * -(-max(TT, D) // 64), 8) * 4)
    if soft_cap:
        b["cap (soft-cap scratch)"] = _r32(_ru(TT, 8) * 4)
    b["outQ (2 x o row + lse block)"] = 2 * _r32((RE + LSE_REPEAT) * 4)
    return b


def combine_ub_bytes(head_dim: int, dtype: str, num_q_heads: int, max_splits: int) -> dict[str, int]:
    """Every UB buffer of the combine kernel (``CombineStage::Init``), bytes after 32-byte rounding."""
    D, S = head_dim, max_splits
    RE, QR = _ru(D, 8), row_elems(D, dtype)
    return {
        "lseQ (2 x lse blocks)": 2 * _r32(S * LSE_REPEAT * 4),
        "oQ (2 x partial o rows)": 2 * _r32(S * RE * 4),
        "outQ (2 x out row)": 2 * _r32(QR * ITEMSIZE[dtype]),
        "w (weights)": _r32(S * LSE_REPEAT * 4),
        "acc": _r32(RE * 4),
        "red": BLOCK,
        "tmp": BLOCK,
        "work (reduce scratch)": _r32(_ru(2 * -(-(S * LSE_REPEAT) // 64), 8) * 4),
        "lseRow": _r32(_ru(num_q_heads, 8) * 4),
    }


def choose_tiles(head_dim: int, dtype: str, kv_dtype: str, rows: int, soft_cap: bool,
                 ub_bytes: int = UB_BYTES) -> tuple[int, int]:
    """``(tile_tokens, row_chunk)``: all ``rows`` query rows at once with the largest tile that fits;
    else tiles of 32 tokens and as many rows as fit. Raises ``ValueError`` if nothing fits."""
    rows = max(1, int(rows))
    for tt in TILE_CANDIDATES[:3]:
        if sum(split_ub_bytes(head_dim, dtype, kv_dtype, tt, rows, soft_cap).values()) <= ub_bytes:
            return tt, rows
    for tt in TILE_CANDIDATES[2:]:
        lo, hi = 0, rows
        while lo < hi:  # largest row chunk that fits
            mid = (lo + hi + 1) // 2
            if sum(split_ub_bytes(head_dim, dtype, kv_dtype, tt, mid, soft_cap).values()) <= ub_bytes:
                lo = mid
            else:
                hi = mid - 1
        if lo >= 1:
            return tt, lo
    need = sum(split_ub_bytes(head_dim, dtype, kv_dtype, TILE_CANDIDATES[-1], 1, soft_cap).values())
    raise ValueError(f"UB budget: the split kernel needs {need} bytes for head_dim={head_dim}, dtype={dtype}, "
                     f"kv_dtype={kv_dtype} even with {TILE_CANDIDATES[-1]}-token tiles and one query row; rule: "
                     f"all InitBuffer sizes of one vector core must fit the {ub_bytes}-byte (192 KiB) Unified Buffer")


def workspace_bytes(num_slots: int, num_q_heads: int, head_dim: int) -> tuple[int, int]:
    """``(lse_offset_bytes, total_bytes)`` of the workspace: o ``[S, Hq, D]`` then lse ``[S, Hq, 8]``, float32."""
    o = int(num_slots) * int(num_q_heads) * int(head_dim) * 4
    return o, o + int(num_slots) * int(num_q_heads) * LSE_REPEAT * 4


def plan_words(plan: Plan, seq_lens) -> tuple[np.ndarray, dict]:
    """The int32 ``plan`` buffer and the section offsets (in words) of the tiling."""
    items = np.stack([plan.item_request, plan.item_kv_head, plan.item_split, plan.item_kv_start,
                      plan.item_kv_end], axis=1).astype(np.int32).reshape(-1)
    parts = [("itemsOffset", items), ("qslOffset", np.asarray(plan.query_start_loc, np.int32)),
             ("seqLensOffset", np.asarray(seq_lens, np.int32).reshape(-1)),
             ("rowSlotOffset", np.asarray(plan.row_slot_start, np.int32)),
             ("rowNumOffset", np.asarray(plan.row_num_splits, np.int32))]
    offs, at = {}, 0
    for name, arr in parts:
        offs[name] = at
        at += arr.size
    words = np.concatenate([a for _, a in parts]).astype(np.int32) if at else np.zeros(1, np.int32)
    if words.size == 0:
        words = np.zeros(1, np.int32)
    offs["planWords"] = int(words.size)
    return words, offs


def build_buffers(plan: Plan, *, seq_lens, num_q_heads: int, head_dim: int, page_size: int, max_pages: int,
                  num_pages: int, dtype: str, kv_dtype: str, scale: float, soft_cap: float | None = None,
                  window_left: int | None = None, profile: str = DEFAULT_PROFILE,
                  block_dim: int | None = None) -> tuple[dict, bytes, np.ndarray]:
    """``(tiling fields, tiling bytes, plan words)`` for one batch; checks every host-side rule.

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
    max_splits = max(1, plan.max_splits)
    comb = combine_ub_bytes(head_dim, dtype, num_q_heads, max_splits)
    if sum(comb.values()) > ub:
        raise ValueError(f"UB budget: the combine kernel needs {sum(comb.values())} bytes for {max_splits} splits "
                         f"per row, head_dim={head_dim}; rule: all InitBuffer sizes of one vector core must fit "
                         f"the {ub}-byte Unified Buffer (use fewer splits per row)")
    if (num_q_heads - 1) * head_dim // 8 > 65535 or max_splits > 65535:
        raise ValueError("combine: (Hq - 1) * D / 8 must fit DataCopyParams' 16-bit stride (in 32-byte blocks)")
    if page_size > 65535:
        raise ValueError("page_size: at most 65535 (DataCopyPad blockCount is 16-bit)")
    lse_off, ws = workspace_bytes(plan.num_slots, num_q_heads, head_dim)
    if ws >= 2 ** 31:
        raise ValueError(f"workspace: {ws} bytes does not fit the tiling's int32 workspaceBytes")
    words, offs = plan_words(plan, seq_lens)
    T = plan.num_rows
    if block_dim is None:
        block_dim = max(1, min(prof.units, max(plan.num_valid_items, T)))
    split_b = split_ub_bytes(head_dim, dtype, kv_dtype, tt, rc, soft_cap is not None and soft_cap > 0)
    t = dict(
        version=VERSION, blockDim=int(block_dim), batch=int(plan.batch_size), numRows=int(T),
        numQHeads=int(num_q_heads), numKVHeads=hkv, groupSize=int(group), headDim=int(head_dim),
        pageSize=int(page_size), maxPages=int(max_pages), numPages=int(num_pages), numItems=int(plan.num_items),
        numSlots=int(plan.num_slots), maxQLen=max_q, qDtype=DTYPE_CODES[dtype], kvDtype=DTYPE_CODES[kv_dtype],
        windowLeft=-1 if window_left is None or window_left < 0 else int(window_left), scale=float(scale),
        softCap=float(soft_cap) if soft_cap else 0.0, tileTokens=tt, rowChunk=rc,
        kvRowElems=row_elems(head_dim, kv_dtype), qRowElems=row_elems(head_dim, dtype), rowElems=_ru(head_dim, 8),
        maxSplits=max_splits, lseOffsetBytes=lse_off, workspaceBytes=ws,
        splitUbBytes=sum(split_b.values()), combineUbBytes=sum(comb.values()), **offs)
    return t, pack_tiling(t), words


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


def build_tiling(inputs, plan: Plan, profile: str = DEFAULT_PROFILE, block_dim: int | None = None) -> Tiling:
    """:func:`build_buffers` for one :class:`~splitkv_common.inputs.DecodeInputs` and its plan."""
    t, tb, words = build_buffers(
        plan, seq_lens=inputs.seq_lens, num_q_heads=inputs.q.shape[1], head_dim=inputs.q.shape[2],
        page_size=inputs.k_cache.shape[1], max_pages=inputs.block_table.shape[1], num_pages=inputs.k_cache.shape[0],
        dtype=inputs.dtype, kv_dtype=inputs.kv_dtype, scale=inputs.scale, soft_cap=inputs.soft_cap,
        window_left=inputs.window_left, profile=profile, block_dim=block_dim)
    return Tiling(t, tb, words, kv_quant_array(inputs) if inputs.kv_dtype == "int8" else None)
