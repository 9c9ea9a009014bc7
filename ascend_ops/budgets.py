"""The on-chip budgets of the Ascend C kernels (910B), computed on the host: every ``InitBuffer`` of
each kernel listed with the same expressions as the kernel sources (each rounded up to 32 bytes),
and the tile sizes chosen so that they fit.

* Vector cores: the Unified Buffer (UB, 192 KiB) of the split stage (:func:`split_ub_bytes`,
  :func:`choose_tiles`) and of the combine (:func:`combine_ub_bytes`, :func:`combine_heads`); a
  config over budget raises ``ValueError`` naming the rule. The CPU twin enforces the same 192 KiB
  on the kernels' actual ``InitBuffer`` calls, and the tests check both agree.
* The mixed (AIC + AIV) split stage: the cube core's L1 / L0A / L0B / L0C (:func:`mix_cube_bytes`),
  the vector cores' UB (:func:`mix_ub_bytes`), the per-core scratch in GM
  (:func:`mix_scratch_core_bytes`), and the cube tile and exchange step that fit
  (:func:`choose_mix_tiles`).

:mod:`ascend_ops.tiling` packs the chosen sizes into the tiling the kernels read.
"""

from __future__ import annotations

import functools

from .support import mixed_kernel_unsupported

LSE_REPEAT = 8                 # floats per workspace lse (one 32-byte block)
UB_BYTES = 192 * 1024          # Unified Buffer per vector core, 910B
BLOCK = 32                     # UB alignment and copy granule, bytes
ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2, "int8": 1}
TILE_CANDIDATES = (128, 64, 32, 16, 8)  # KV tokens per UB tile, largest first


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


def combine_ub_bytes(head_dim: int, dtype: str, num_q_heads: int, max_splits: int, heads: int = 1) -> dict[str, int]:
    """Every UB buffer of the combine kernel (``CombineStage::Init``), bytes after 32-byte rounding,
    merging ``heads`` query heads of one KV head at once."""
    D, S, H = head_dim, max_splits, heads
    blk = _r32(H * LSE_REPEAT * 4)
    return {
        "lseQ (lse blocks [splits, heads])": _r32(S * H * LSE_REPEAT * 4),
        "oQ (partial o rows [splits, heads, D])": _r32(S * H * D * 4),
        "outQ (2 x out rows [heads, D])": 2 * _r32(H * D * ITEMSIZE[dtype]),
        "w (weights)": _r32(S * H * LSE_REPEAT * 4),
        "m, sum, lse": 3 * blk,
        "acc [heads, D]": _r32(H * D * 4),
        "lseRow": _r32(_ru(num_q_heads, 8) * 4),
    }


def combine_heads(head_dim: int, dtype: str, num_q_heads: int, max_splits: int, group: int,
                  ub_bytes: int = UB_BYTES) -> int:
    """The most query heads of one KV head (at most ``group``) the combine merges at once within the UB."""
    best = 1
    for h in range(1, max(1, group) + 1):
        if sum(combine_ub_bytes(head_dim, dtype, num_q_heads, max_splits, h).values()) <= ub_bytes:
            best = h
    return best


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


# ---- the mixed (AIC + AIV) split stage -----------------------------------------------------------
L1_BYTES, L0A_BYTES, L0B_BYTES, L0C_BYTES = 512 * 1024, 64 * 1024, 64 * 1024, 128 * 1024  # per AIC, 910B
MIX_TILE_CANDIDATES = (256, 128, 64, 32, 16)  # KV tokens per cube tile, largest first
# KV tokens per cube <-> vector exchange step, at most (a whole number of tiles; the largest whose
# S / P rows fit the UB and the P rows the L1): each exchange costs a chain of GM round trips and
# cross-core flags, so fewer, longer steps (CANN IFA: 2048-8192 tokens)
MIX_MAX_STEP_TOKENS = 2048
MIX_MAX_ROWS = 128  # query rows of one item (q_len x G), padded to 16
MIX_ITEM_OVERHEAD_TOKENS = 64  # balance weight of an item's fixed cost, in tokens (ASSUMPTION)
MIX_Q_STEPS = 3  # int8 KV (MSD): int8 rows per q row on the cube (kQSteps)
MIX_P_STEPS = 2  # int8 KV (MSD): int8 rows per P row on the cube (kPSteps)


def mix_cube_dtype(dtype: str, kv_dtype: str) -> str:
    """The cube's input dtype: q's, or int8 for int8 KV (IFA's MSD route: int8 x int8 -> int32)."""
    return "int8" if kv_dtype == "int8" else dtype


def mix_cube_rows(rows_pad: int, kv_dtype: str | None) -> tuple[int, int]:
    """Rows of the cube's S slot and of its P / O slots: ``rows_pad``, or for int8 KV the expanded
    q and P rows (``MIX_Q_STEPS`` and ``MIX_P_STEPS`` blocks; ``MixCommon::SR`` / ``PR``)."""
    if kv_dtype == "int8":
        return MIX_Q_STEPS * rows_pad, MIX_P_STEPS * rows_pad
    return rows_pad, rows_pad


def mix_ub_bytes(head_dim: int, dtype: str, step_tokens: int, rows_pad: int, soft_cap: bool,
                 kv_dtype: str | None = None, multi_query: bool = False) -> dict[str, int]:
    """Every UB buffer of one vector core of the mixed split stage (``MixVec::Init`` and, for int8
    KV, ``MixVec::InitQuant``), bytes, for exchange steps of ``step_tokens`` (``multi_query``: a
    request has several query rows, the causal band's V row buffers of ``AddBand``, 16-bit KV only)."""
    D, TT, RH = head_dim, step_tokens, rows_pad // 2
    items = 1 if kv_dtype == "int8" else 2  # items whose state the vector cores hold at once
    cube = mix_cube_dtype(dtype, kv_dtype or dtype)
    p_rows = MIX_P_STEPS * RH if kv_dtype == "int8" else RH
    b = {"s (scores)": _r32(RH * TT * 4), "p (probabilities, cube dtype)": _r32(p_rows * TT * ITEMSIZE[cube]),
         "o (P V tile)": _r32(RH * D * 4), "acc (16-bit KV: two items)": items * _r32(RH * D * 4),
         "red": 2 * _r32(_ru(2 * RH, 8) * 4),
         "blocks (per item: running max x2, l, lr; alpha x2, two sums: a 32-byte block per row slot)":
             (4 * items + 4) * _r32(_ru(2 * RH, 8) * 32),
         "work": 256}
    if soft_cap:
        b["cap (soft-cap scratch)"] = _r32(RH * TT * 4)
    b["outQ (2 x o row + lse block)"] = 2 * _r32((D + LSE_REPEAT) * 4)
    if kv_dtype == "int8":
        b.update({"qT (q rows)": _r32(RH * D * ITEMSIZE[dtype]), "qf, qe, qr (q' steps, float)": 3 * _r32(RH * D * 4),
                  "qh (a q step, half)": _r32(RH * D * 2), "qx (q steps, int8)": _r32(MIX_Q_STEPS * RH * D),
                  "kvq (scales, offsets)": _r32(4 * D * 4),
                  "si (S steps, int32; P steps, float)": _r32(MIX_Q_STEPS * RH * TT * 4),
                  "pf (P residual, float)": _r32(RH * TT * 4), "ph (P steps, half)": _r32(MIX_P_STEPS * RH * TT * 2),
                  "oi (O steps, int32)": _r32(MIX_P_STEPS * RH * D * 4), "of (O step 0, float)": _r32(RH * D * 4)})
    elif multi_query:
        b["vb, vf (a band V row, q dtype and float32)"] = _r32(D * ITEMSIZE[dtype]) + _r32(D * 4)
    return b


def mix_cube_bytes(head_dim: int, tile_tokens: int, rows_pad: int, kv_dtype: str | None = None,
                   step_tokens: int | None = None) -> dict[str, int]:
    """The cube core's buffers (``MixCube::Init``) per memory, bytes: 16-bit q and KV, or for int8
    KV int8 inputs with the expanded q and P rows and int32 results. L1 holds q, two K and two V
    tile buffers and a step's P rows (``step_tokens``, default one tile)."""
    D, TT, ST = head_dim, tile_tokens, step_tokens or tile_tokens
    SR, PR = mix_cube_rows(rows_pad, kv_dtype)
    e = 1 if kv_dtype == "int8" else 2
    return {"L1": e * (SR * D + 4 * TT * D + PR * ST), "L0A": e * (SR * D + PR * TT), "L0B": e * TT * D,
            "L0C": 4 * (SR * TT + PR * D)}


def mix_scratch_core_bytes(head_dim: int, dtype: str, step_tokens: int, rows_pad: int,
                           kv_dtype: str | None = None) -> int:
    """Scratch of one AI core: S, P, O slots (two each, S and P of a whole exchange step of
    ``step_tokens``) and a zero row (``MixCommon::ZOff``); for int8 KV the slots hold the expanded
    rows (``mix_cube_rows``) and the expanded q rows ``[MIX_Q_STEPS * MP, D]`` int8 follow (``QOff``)."""
    D, TT, MP = head_dim, step_tokens, rows_pad
    SR, PR = mix_cube_rows(MP, kv_dtype)
    e = ITEMSIZE[mix_cube_dtype(dtype, kv_dtype or dtype)]
    n = 2 * (SR * TT * 4 + PR * (TT * e + D * 4)) + D * e
    if kv_dtype == "int8":
        n += MIX_Q_STEPS * MP * D
    return _ru(n, 512)


def mix_unsupported(head_dim: int, dtype: str, kv_dtype: str, num_q_heads: int, num_kv_heads: int) -> str | None:
    """None when the mixed split stage takes these shapes, else why (the rule lives in ``support.py``)."""
    return mixed_kernel_unsupported(head_dim, dtype, kv_dtype, num_q_heads, num_kv_heads)


@functools.lru_cache(maxsize=1024)  # pure in its arguments; a tiling build asks on every new plan
def choose_mix_tiles(head_dim: int, dtype: str, rows: int, soft_cap: bool, ub_bytes: int = UB_BYTES,
                     kv_dtype: str | None = None, multi_query: bool = False):
    """``(tile_tokens, rows_pad, step_tiles)`` of the mixed split stage, or None when no tile fits
    every unit: the largest tile whose buffers fit with a one-tile step, then the longest exchange
    step (a power of two tiles, at most ``MIX_MAX_STEP_TOKENS``) whose UB and L1 buffers fit."""
    MP = max(16, _ru(rows, 16))
    if MP > MIX_MAX_ROWS:
        return None

    def fits(tt: int, st: int) -> bool:
        cube = mix_cube_bytes(head_dim, tt, MP, kv_dtype, st)
        return (cube["L1"] <= L1_BYTES and cube["L0A"] <= L0A_BYTES and cube["L0B"] <= L0B_BYTES
                and cube["L0C"] <= L0C_BYTES and (MP // 2) * st >= head_dim
                and sum(mix_ub_bytes(head_dim, dtype, st, MP, soft_cap, kv_dtype, multi_query).values()) <= ub_bytes)

    for tt in MIX_TILE_CANDIDATES:
        if kv_dtype == "int8" and tt % 32:  # whole int8 fractals of 32 tokens
            continue
        if not fits(tt, tt):
            continue
        steps = 1
        while tt * steps * 2 <= MIX_MAX_STEP_TOKENS and fits(tt, tt * steps * 2):
            steps *= 2
        return tt, MP, steps
    return None


@functools.lru_cache(maxsize=64)  # pure; 16 tile choices (~0.14 ms) per graph-stable tiling otherwise
def mix_scratch_max_bytes(head_dim: int, dtype: str, kv_dtype: str | None, soft_cap: bool) -> int:
    """The largest per-core scratch any row count, with one query row or several, may need
    (graph-stable workspaces keep it whatever the next batch holds)."""
    best = 0
    for rows, multi_query in [(r, m) for r in range(16, MIX_MAX_ROWS + 1, 16) for m in (False, True)]:
        mix = choose_mix_tiles(head_dim, dtype, rows, soft_cap, kv_dtype=kv_dtype, multi_query=multi_query)
        if mix:
            best = max(best, mix_scratch_core_bytes(head_dim, dtype, mix[0] * mix[2], mix[1], kv_dtype))
    return best
