"""Input validation shared by every backend, run before any computation or kernel launch.

Every error names the argument and the rule it broke. Works on NumPy arrays and torch tensors
(shapes and dtype names); value checks (block-table ranges, lengths) read host copies.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import numpy as np

from .dtypes import FLOAT_DTYPES, dtype_name

INDEX_DTYPES = ("int32", "int64")


@dataclass(frozen=True)
class DecodeDims:
    """Sizes of a validated decode call."""

    num_rows: int        # T
    num_q_heads: int     # Hq
    num_kv_heads: int    # Hkv
    head_dim: int        # D
    num_pages: int
    page_size: int
    batch_size: int      # B
    max_pages: int       # block_table.shape[1]
    dtype: str           # q / output dtype
    kv_dtype: str        # float dtype of q, or int8

    @property
    def group_size(self) -> int:
        return self.num_q_heads // self.num_kv_heads


def check_gqa(num_q_heads: int, num_kv_heads: int) -> None:
    """The GQA rule: query head ``h`` reads KV head ``h // (Hq / Hkv)``, so ``Hq % Hkv == 0``; both
    positive ints (``num_kv_heads=0`` is an error naming it, not a ``ZeroDivisionError``)."""
    for name, v in (("num_q_heads", num_q_heads), ("num_kv_heads", num_kv_heads)):
        if not isinstance(v, (int, np.integer)) or isinstance(v, (bool, np.bool_)) or v <= 0:
            raise ValueError(f"{name}: must be a positive int, got {v!r}")
    if num_q_heads % num_kv_heads:
        raise ValueError(f"q: Hq % Hkv must be 0 (GQA group size), got Hq={num_q_heads}, Hkv={num_kv_heads}")


def check_wrapper_tensors(named: dict, *, tensor_type, dtype, kv_dtype, int8_kv: bool, device, on_device) -> None:
    """The metadata checks every backend's wrapper makes before a launch (no host sync): each given
    argument of ``named`` (name -> tensor or None) is a ``tensor_type`` (``torch.Tensor``; passed in,
    so this module needs no torch) for which ``on_device(x.device)`` holds, ``q`` has the wrapper's
    ``dtype``, ``k_cache`` / ``v_cache`` its ``kv_dtype``, and ``k_scale`` / ``v_scale`` are given
    exactly when the cache is int8 (``int8_kv``)."""
    for name, x in named.items():
        if x is None:
            continue
        if not isinstance(x, tensor_type):
            raise TypeError(f"{name}: expected a torch tensor, got {type(x).__name__}")
        if not on_device(x.device):
            raise ValueError(f"{name}: on {x.device}, expected {device} (the wrapper's device)")
    q, k_cache, v_cache = named["q"], named["k_cache"], named["v_cache"]
    if q.dtype != dtype:
        raise TypeError(f"q: dtype must be {dtype} (the wrapper's dtype), got {q.dtype}")
    if k_cache.dtype != kv_dtype or v_cache.dtype != kv_dtype:
        raise TypeError(f"k_cache, v_cache: dtype must be {kv_dtype}, got {k_cache.dtype}, {v_cache.dtype}")
    if int8_kv != (named.get("k_scale") is not None and named.get("v_scale") is not None):
        raise ValueError("k_scale, v_scale: required with an int8 KV cache and only then")


def host(x) -> np.ndarray:
    """A NumPy copy of an array or tensor (torch tensors are moved to the CPU)."""
    if hasattr(x, "detach"):
        return x.detach().cpu().numpy()
    return np.asarray(x)


def _shape(x, name):
    if not hasattr(x, "shape"):
        raise TypeError(f"{name}: expected an array or tensor, got {type(x).__name__}")
    return tuple(int(s) for s in x.shape)


def check_decode_args(q, k_cache, v_cache, block_table, seq_lens, query_start_loc=None, *,
                      scale=None, soft_cap=None, window_left=None, k_scale=None, v_scale=None,
                      k_offset=None, v_offset=None, supported_head_dims=None,
                      backend: str = "") -> DecodeDims:
    """Validate a decode call (see ``docs/conventions.md``) and return its sizes.

    Shapes: ``q [T, Hq, D]``; ``k_cache``, ``v_cache [num_pages, page_size, Hkv, D]``;
    ``block_table [B, max_pages]`` int32/int64; ``seq_lens [B]`` int32/int64;
    ``query_start_loc [B + 1]`` (default: one row per request, ``T == B``);
    int8 KV needs ``k_scale``/``v_scale`` float32 ``[Hkv]`` or ``[Hkv, D]`` (offsets the same shape).

    The checks run in this order, each a named step; the first broken rule raises:
    q / cache shapes, dtypes, int8 scales, block table and lengths, query rows, page ids, scalars.

    Raises:
        TypeError: a wrong dtype or a non-array argument.
        ValueError: a wrong shape, a value out of range, or a head dim the backend does not support.
    """
    who = f" ({backend})" if backend else ""
    T, Hq, D, P, page, Hkv = _check_shapes(q, k_cache, v_cache, supported_head_dims, who)
    qd, kd = _check_dtypes(q, k_cache, v_cache, k_scale, v_scale, k_offset, v_offset)
    _check_int8_scales(k_scale, v_scale, k_offset, v_offset, Hkv, D)
    B, max_pages, sl = _check_block_table_and_lengths(block_table, seq_lens, page)
    _check_query_start_loc(query_start_loc, T, B)
    if B:
        check_page_ids(block_table, sl, max_pages, page, P)
    check_scalars(scale, soft_cap, window_left)
    return DecodeDims(T, Hq, Hkv, D, P, page, B, max_pages, qd, kd)


def _check_shapes(q, k_cache, v_cache, supported_head_dims, who) -> tuple[int, int, int, int, int, int]:
    """``q [T, Hq, D]`` and ``k_cache == v_cache [P, page, Hkv, D]``: ranks, positive sizes, one head
    dim, the GQA rule, a supported head dim. Returns ``(T, Hq, D, P, page, Hkv)``."""
    qs = _shape(q, "q")
    ks = _shape(k_cache, "k_cache")
    vs = _shape(v_cache, "v_cache")
    if len(qs) != 3:
        raise ValueError(f"q: must be [T, Hq, D], got shape {qs}")
    if len(ks) != 4:
        raise ValueError(f"k_cache: must be [num_pages, page_size, Hkv, D], got shape {ks}")
    if vs != ks:
        raise ValueError(f"v_cache: shape {vs} must equal k_cache's {ks}")
    T, Hq, D = qs
    P, page, Hkv, Dk = ks
    if D <= 0 or Hq <= 0 or Hkv <= 0 or page <= 0:
        raise ValueError(f"q, k_cache: head dim, heads and page size must be positive (q {qs}, k_cache {ks})")
    if Dk != D:
        raise ValueError(f"k_cache: head dim {Dk} must equal q's head dim {D}")
    check_gqa(Hq, Hkv)
    if supported_head_dims is not None and D not in supported_head_dims:
        raise ValueError(f"q: head dim {D} is not supported{who}; supported: {sorted(supported_head_dims)}")
    return T, Hq, D, P, page, Hkv


def _check_dtypes(q, k_cache, v_cache, k_scale, v_scale, k_offset, v_offset) -> tuple[str, str]:
    """q a float dtype; the cache q's dtype, or int8 with scales; scales / offsets only with int8.
    Returns the dtype names ``(q's, the cache's)``."""
    qd, kd, vd = dtype_name(q), dtype_name(k_cache), dtype_name(v_cache)
    if qd not in FLOAT_DTYPES:
        raise TypeError(f"q: dtype must be one of {FLOAT_DTYPES}, got {qd}")
    if kd != vd:
        raise TypeError(f"v_cache: dtype {vd} must equal k_cache's {kd}")
    if kd == "int8":
        for name, s in (("k_scale", k_scale), ("v_scale", v_scale)):
            if s is None:
                raise ValueError(f"{name}: required when the KV cache is int8")
    elif kd != qd:
        raise TypeError(f"k_cache: dtype must equal q's ({qd}) or be int8, got {kd}")
    else:
        for name, s in (("k_scale", k_scale), ("v_scale", v_scale), ("k_offset", k_offset), ("v_offset", v_offset)):
            if s is not None:
                raise ValueError(f"{name}: only valid with an int8 KV cache (k_cache is {kd})")
    return qd, kd


def _check_int8_scales(k_scale, v_scale, k_offset, v_offset, Hkv, D) -> None:
    """Each given scale / offset is float32 ``[Hkv]`` or ``[Hkv, D]``; an offset has its scale's shape."""
    for name, s, ref in (("k_scale", k_scale, None), ("v_scale", v_scale, None),
                         ("k_offset", k_offset, k_scale), ("v_offset", v_offset, v_scale)):
        if s is None:
            continue
        ss = _shape(s, name)
        if ss not in ((Hkv,), (Hkv, D)):
            raise ValueError(f"{name}: must be [Hkv] (per head) or [Hkv, D] (per channel) = [{Hkv}] or [{Hkv}, {D}], got {ss}")
        if dtype_name(s) != "float32":
            raise TypeError(f"{name}: dtype must be float32, got {dtype_name(s)}")
        if ref is not None and _shape(ref, "scale") != ss:
            raise ValueError(f"{name}: shape {ss} must equal its scale's {_shape(ref, 'scale')}")


def _check_block_table_and_lengths(block_table, seq_lens, page) -> tuple[int, int, np.ndarray]:
    """``block_table [B, max_pages]`` and ``seq_lens [B]`` of an index dtype; every length
    non-negative and within its block-table row's pages. Returns ``(B, max_pages, seq_lens as int64)``."""
    bts = _shape(block_table, "block_table")
    if len(bts) != 2:
        raise ValueError(f"block_table: must be [B, max_pages], got shape {bts}")
    if dtype_name(block_table) not in INDEX_DTYPES:
        raise TypeError(f"block_table: dtype must be int32 or int64, got {dtype_name(block_table)}")
    B, max_pages = bts
    sls = _shape(seq_lens, "seq_lens")
    if sls != (B,):
        raise ValueError(f"seq_lens: must be [B] = [{B}] (one per block_table row), got shape {sls}")
    if dtype_name(seq_lens) not in INDEX_DTYPES:
        raise TypeError(f"seq_lens: dtype must be int32 or int64, got {dtype_name(seq_lens)}")
    sl = host(seq_lens).astype(np.int64)
    if B and int(sl.max()) > MAX_SEQ_LEN:
        raise ValueError(f"seq_lens: {int(sl.max())} tokens, over the limit MAX_SEQ_LEN = {MAX_SEQ_LEN}")
    if (sl < 0).any():
        raise ValueError(f"seq_lens: negative lengths are invalid, got {sl[sl < 0][:4].tolist()}")
    owned = max_pages * page
    if (sl > owned).any():
        b = int(np.argmax(sl > owned))
        raise ValueError(f"seq_lens: request {b} has {int(sl[b])} tokens, beyond the {max_pages} pages x "
                         f"{page} tokens its block_table row can hold")
    return B, max_pages, sl


def _check_query_start_loc(query_start_loc, T, B) -> None:
    """``query_start_loc [B + 1]`` of an index dtype, from 0, non-decreasing, to ``T``; absent only
    when every request has one row (``T == B``)."""
    if query_start_loc is None:
        if T != B:
            raise ValueError(f"query_start_loc: required when q has {T} rows for {B} requests")
        return
    qls = _shape(query_start_loc, "query_start_loc")
    if qls != (B + 1,):
        raise ValueError(f"query_start_loc: must be [B + 1] = [{B + 1}], got shape {qls}")
    if dtype_name(query_start_loc) not in INDEX_DTYPES:
        raise TypeError(f"query_start_loc: dtype must be int32 or int64, got {dtype_name(query_start_loc)}")
    qsl = host(query_start_loc).astype(np.int64)
    if qsl[0] != 0 or (np.diff(qsl) < 0).any() or qsl[-1] != T:
        raise ValueError(f"query_start_loc: must start at 0, be non-decreasing and end at T={T}, got "
                         f"{qsl[:8].tolist()}{'...' if qsl.size > 8 else ''}")


def check_page_ids(block_table, sl, max_pages, page, P) -> None:
    """Every block-table entry a request uses (its first ``ceil(seq_len / page)`` pages) is in ``[0, P)``."""
    bt = host(block_table).astype(np.int64)
    used = (np.arange(max_pages)[None, :] * page) < sl[:, None]
    bad = used & ((bt < 0) | (bt >= P))
    if bad.any():
        b, j = (int(i) for i in np.argwhere(bad)[0])
        raise ValueError(f"block_table: entry [{b}, {j}] = {int(bt[b, j])} is out of range [0, {P}) "
                         f"(num_pages of k_cache)")


def _is_real(x) -> bool:
    """A real number that is not a bool (``True`` is not a scale)."""
    return isinstance(x, numbers.Real) and not isinstance(x, (bool, np.bool_))


def check_scalars(scale=None, soft_cap=None, window_left=None) -> None:
    """The one meaning of the attention's scalars, checked by every entry point (cheap, no arrays).

    * ``scale``: None (``1/sqrt(D)``) or a finite number ``> 0`` (a negative scale is refused);
    * ``soft_cap``: None (no cap) or a finite number ``> 0`` (``0`` is not "no cap": map
      FlashAttention's ``softcap=0.0`` to None before the call);
    * ``window_left``: None or ``-1`` (no window), or an int ``>= 0`` (not a bool or a float).

    Bounds (so that no backend overflows float32 or int32 on a legal value): ``scale`` at most
    :data:`MAX_SCALE` (a larger one turns ordinary scores into ``inf`` in float32, and
    ``inf - inf`` into NaN rows); ``soft_cap`` at most float32's largest value; ``window_left`` at
    most :data:`MAX_SEQ_LEN` (positions are int32: a wider window is no window, pass None or -1).

    Anything else raises ``ValueError`` naming the argument and the rule. Cost: a few comparisons.
    """
    if scale is not None:
        if not (_is_real(scale) and math.isfinite(float(scale)) and float(scale) > 0):
            raise ValueError(f"scale: must be a finite positive number (or None for 1/sqrt(D)), got {scale!r}")
        if float(scale) > MAX_SCALE:
            raise ValueError(f"scale: {float(scale)!r} is over the limit MAX_SCALE = {MAX_SCALE:g} "
                             f"({'it overflows float32' if float(scale) > FLOAT32_MAX else 'scale x score would overflow float32'})")
    if soft_cap is not None:
        if not (_is_real(soft_cap) and math.isfinite(float(soft_cap)) and float(soft_cap) > 0):
            raise ValueError(f"soft_cap: must be None or a finite positive number (0 is not 'no cap': pass None), "
                             f"got {soft_cap!r}")
        if float(soft_cap) > FLOAT32_MAX:
            raise ValueError(f"soft_cap: {float(soft_cap)!r} overflows float32 (largest {FLOAT32_MAX:g})")
    if window_left is not None:
        if not (isinstance(window_left, (int, np.integer)) and not isinstance(window_left, (bool, np.bool_))
                and window_left >= -1):
            raise ValueError(f"window_left: must be None, -1 (no window) or a non-negative int, got {window_left!r}")
        if int(window_left) > MAX_SEQ_LEN:
            raise ValueError(f"window_left: {int(window_left)} is over the limit MAX_SEQ_LEN = {MAX_SEQ_LEN} "
                             f"(positions are int32; a window that wide is no window: pass None or -1)")


_check_scalars = check_scalars
_check_page_ids = check_page_ids


def normalize_window(window_left) -> int | None:
    """``None`` or ``-1`` mean no window (the vLLM / FlashInfer spelling); otherwise the int ``>= 0``.
    Anything else (``-2``, ``-5``, a float) is refused (:func:`check_scalars`)."""
    check_scalars(window_left=window_left)
    return None if window_left is None or int(window_left) < 0 else int(window_left)


# ---------------------------------------------------------------------------------------------
# Size limits: absurd sizes are refused before any planning work, naming the limit
# ---------------------------------------------------------------------------------------------

#: Longest request (KV tokens): plans and kernels store positions as int32.
MAX_SEQ_LEN = 2**31 - 1
#: Requests in one batch.
MAX_BATCH = 1 << 20
#: Query rows in one batch (``T``).
MAX_QUERY_ROWS = 1 << 22
#: Work items a plan may have, counted as the policy cuts the batch before the ``max_splits`` cap
#: (one per (request, KV head) at least).
MAX_WORK_ITEMS = 1 << 22
#: Partial slots of a plan (``o [num_slots, Hq, D]``): graph-stable plans reserve ``T * max_splits``.
MAX_PARTIAL_SLOTS = 1 << 26
#: KV heads.
MAX_KV_HEADS = 1 << 16
#: Largest softmax ``scale``: ``scale x q.k`` stays finite in float32 for every fp16 cache and
#: every bf16 / fp32 one of ordinary magnitude (``1 / sqrt(D)`` is below 1).
MAX_SCALE = float(1 << 16)
#: float32's largest finite value (what kernels and tilings store scalars in).
FLOAT32_MAX = float(np.finfo(np.float32).max)


def _one_dim(a: np.ndarray, name: str, shape: str) -> np.ndarray:
    """``a`` if it has one dimension; anything else (``[B, 1]``, a scalar) is refused naming ``name``
    and the expected ``shape``: a batch's vectors are never flattened."""
    if a.ndim != 1:
        raise ValueError(f"{name}: must be 1-D {shape}, got shape {tuple(a.shape)}")
    return a


def int_vector(x, name: str, shape: str = "[B]") -> np.ndarray:
    """``x`` (a host array, list or CPU tensor of integers) as an int64 vector (:func:`_one_dim`)."""
    return _one_dim(np.asarray(x), name, shape).astype(np.int64)


def as_int64_lengths(x, name: str, shape: str = "[B]") -> np.ndarray:
    """Host int64 copy of an integer vector (``seq_lens``, ``q_lens``, ``query_start_loc``); values
    outside int64, or non-integers, are refused naming ``name`` (never a raw ``OverflowError``), and
    so is anything but one dimension (:func:`_one_dim`)."""
    try:
        a = np.asarray(host(x) if hasattr(x, "detach") else x)
        if a.dtype == object:
            a = a.astype(np.int64)  # Python ints beyond int64 raise OverflowError
        if a.dtype.kind == "f" and not (np.isfinite(a).all() and (a == np.round(a)).all()):
            raise ValueError
        if a.dtype.kind not in "iuf" and a.size:
            raise ValueError
        if a.dtype.kind == "u" and a.size and int(a.max()) > np.iinfo(np.int64).max:
            raise OverflowError
        a = a.astype(np.int64)
    except OverflowError:
        raise ValueError(f"{name}: a value does not fit int64 (limit MAX_SEQ_LEN = {MAX_SEQ_LEN})") from None
    except (TypeError, ValueError):
        raise ValueError(f"{name}: must be integers") from None
    return _one_dim(a, name, shape)


def step_lengths(seq_lens, query_start_loc, batch_size: int) -> tuple[np.ndarray, np.ndarray]:
    """A decode step's host ``seq_lens [B]`` and ``query_start_loc [B + 1]`` checked for int32 device
    buffers: integers (an integral float is accepted, never cut), lengths in ``[0, MAX_SEQ_LEN]``,
    offsets from 0, non-decreasing, at most :data:`MAX_SEQ_LEN`. Returns both as int64;
    ``ValueError`` naming the argument and the rule otherwise (no value is wrapped or truncated).
    Cost: O(B) NumPy (a few µs at B 256)."""
    sl = as_int64_lengths(seq_lens, "seq_lens")
    qsl = as_int64_lengths(query_start_loc, "query_start_loc", "[B + 1]")
    if sl.shape[0] != batch_size:
        raise ValueError(f"seq_lens: {batch_size} entries expected, got {sl.shape[0]}")
    if qsl.shape[0] != batch_size + 1:
        raise ValueError(f"query_start_loc: {batch_size + 1} entries expected, got {qsl.shape[0]}")
    if sl.size and (int(sl.min()) < 0 or int(sl.max()) > MAX_SEQ_LEN):
        b = int(np.argmax((sl < 0) | (sl > MAX_SEQ_LEN)))
        raise ValueError(f"seq_lens: request {b} has {int(sl[b])} tokens; must be in [0, MAX_SEQ_LEN = {MAX_SEQ_LEN}]")
    if int(qsl[0]) != 0 or (np.diff(qsl) < 0).any() or int(qsl[-1]) > MAX_SEQ_LEN:
        raise ValueError(f"query_start_loc: must start at 0, be non-decreasing and at most MAX_SEQ_LEN = "
                         f"{MAX_SEQ_LEN}, got {qsl[:8].tolist()}{'...' if qsl.size > 8 else ''}")
    return sl, qsl
