"""The decode problem as data: :class:`DecodeInputs`, what every backend receives.

Arrays are NumPy. Floating arrays are float32 holding values exactly representable in ``dtype``
(``q``) or the KV dtype (see :mod:`splitkv_common.dtypes`); an int8 KV cache is int8 with float32
scales (and optional offsets): the value is ``(x - offset) * scale``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .plan_layout import Plan
from .planner import make_plan
from .policies import SplitPolicy
from .validation import DecodeDims, check_decode_args, normalize_window


@dataclass
class DecodeInputs:
    """One decode call.

    Attributes:
        q: float32 ``[T, Hq, D]`` (values of ``dtype``).
        k_cache, v_cache: ``[num_pages, page_size, Hkv, D]``, float32 values of ``dtype`` or int8.
        block_table: int32 ``[B, max_pages]``; seq_lens: int32 ``[B]``.
        query_start_loc: int32 ``[B + 1]`` (rows of request ``b``: ``qsl[b]:qsl[b+1]``).
        dtype: ``'float16'``, ``'bfloat16'`` or ``'float32'``: q's and the output's dtype.
        scale: softmax scale (default ``1/sqrt(D)``); soft_cap: ``cap * tanh(s / cap)`` or None.
        window_left: sliding window or None; k_scale/v_scale/k_offset/v_offset: int8 KV dequant.
    """

    q: np.ndarray
    k_cache: np.ndarray
    v_cache: np.ndarray
    block_table: np.ndarray
    seq_lens: np.ndarray
    query_start_loc: np.ndarray | None = None
    dtype: str = "float32"
    scale: float | None = None
    soft_cap: float | None = None
    window_left: int | None = None
    k_scale: np.ndarray | None = None
    v_scale: np.ndarray | None = None
    k_offset: np.ndarray | None = None
    v_offset: np.ndarray | None = None
    meta: dict = field(default_factory=dict)

    def __post_init__(self):
        if self.query_start_loc is None:
            self.query_start_loc = np.arange(len(self.seq_lens) + 1, dtype=np.int32)
        if self.scale is None:
            self.scale = float(1.0 / np.sqrt(self.q.shape[-1]))
        self.window_left = normalize_window(self.window_left)

    @property
    def kv_dtype(self) -> str:
        return "int8" if self.k_cache.dtype == np.int8 else self.dtype

    @property
    def q_lens(self) -> np.ndarray:
        return np.diff(self.query_start_loc)

    def validate(self, supported_head_dims=None, backend: str = "") -> DecodeDims:
        """Run the shared checks; the float arrays' own dtype is float32 by design (see module doc)."""
        return check_decode_args(
            _Named(self.q, self.dtype), _Named(self.k_cache, self.kv_dtype), _Named(self.v_cache, self.kv_dtype),
            self.block_table, self.seq_lens, self.query_start_loc, scale=self.scale, soft_cap=self.soft_cap,
            window_left=self.window_left, k_scale=self.k_scale, v_scale=self.v_scale, k_offset=self.k_offset,
            v_offset=self.v_offset, supported_head_dims=supported_head_dims, backend=backend)

    def plan(self, policy: "str | SplitPolicy" = "auto", device: str = "h200", **kw) -> Plan:
        """The shared plan for this batch (see :func:`splitkv_common.plan.make_plan`)."""
        return make_plan(self.seq_lens, num_kv_heads=self.k_cache.shape[2], page_size=self.k_cache.shape[1],
                         query_start_loc=self.query_start_loc, policy=policy, device=device,
                         num_q_heads=self.q.shape[1], head_dim=self.q.shape[2],
                         kv_elem_bytes=1 if self.kv_dtype == "int8" else (4 if self.dtype == "float32" else 2),
                         window_left=self.window_left, **kw)

    def dequantized_kv(self) -> tuple[np.ndarray, np.ndarray]:
        """float64 ``(K, V)`` caches with int8 dequantization applied (``(x - offset) * scale``)."""
        return (dequantize(self.k_cache, self.k_scale, self.k_offset),
                dequantize(self.v_cache, self.v_scale, self.v_offset))


class _Named:
    """An array presented under another dtype name (float32 storage of a bf16/fp16 value)."""

    def __init__(self, arr, name):
        self.shape, self.dtype = arr.shape, name


def dequantize(cache, scale=None, offset=None) -> np.ndarray:
    """``[P, page, Hkv, D]`` -> float64; int8 uses ``(x - offset) * scale`` with scale ``[Hkv]`` or ``[Hkv, D]``."""
    x = np.asarray(cache, dtype=np.float64)
    if cache.dtype != np.int8:
        return x
    hkv, d = cache.shape[2], cache.shape[3]
    s = np.broadcast_to(np.asarray(scale, np.float64).reshape(hkv, -1), (hkv, d))
    o = np.zeros((hkv, d)) if offset is None else np.broadcast_to(np.asarray(offset, np.float64).reshape(hkv, -1), (hkv, d))
    return (x - o) * s
