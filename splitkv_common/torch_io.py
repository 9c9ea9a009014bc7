"""The decode problem in torch: dtype names <-> torch dtypes, and NumPy cases <-> torch tensors.

Every torch-based backend (the eager torch path, the Triton wrapper, the Ascend operator's binding)
converts through here, so the dtype map and the tensor layout of a case exist once.

Importing this module requires torch; ``splitkv_common`` itself does not import it.
"""

from __future__ import annotations

import numpy as np
import torch

from .inputs import DecodeInputs

TORCH_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32, "int8": torch.int8}
"""Dtype name (as :mod:`splitkv_common.dtypes` spells it) -> torch dtype."""

DTYPE_NAMES = {v: k for k, v in TORCH_DTYPES.items()}
"""Torch dtype -> dtype name (the inverse of :data:`TORCH_DTYPES`)."""


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype of a dtype name (``'bfloat16'`` -> ``torch.bfloat16``); unknown names raise ``KeyError``."""
    return TORCH_DTYPES[name]


def as_torch_dtype(dtype):
    """A dtype name or a torch dtype -> the torch dtype (anything else is returned unchanged)."""
    return TORCH_DTYPES.get(dtype, dtype)


def torch_dtype_name(dtype: torch.dtype) -> str:
    """The name of a torch dtype (``torch.bfloat16`` -> ``'bfloat16'``, ``torch.int32`` -> ``'int32'``)."""
    return DTYPE_NAMES.get(dtype) or str(dtype).replace("torch.", "")


def to_torch(inputs: DecodeInputs, device="cpu") -> dict:
    """The inputs as torch tensors on ``device`` in their logical dtypes (lossless).

    Keys are the argument names of the decode calls (``q``, ``k_cache``, ``v_cache``,
    ``block_table``, ``seq_lens``, ``query_start_loc``, ``k_scale``, ``v_scale``, ``k_offset``,
    ``v_offset``); the index arrays are int32, absent int8 scales / offsets ``None``.
    """

    def t(x, dt=None):
        if x is None:
            return None
        x = torch.from_numpy(np.ascontiguousarray(x))
        return (x.to(dt) if dt is not None else x).to(device)

    return dict(
        q=t(inputs.q, torch_dtype(inputs.dtype)),
        k_cache=t(inputs.k_cache, torch_dtype(inputs.kv_dtype)),
        v_cache=t(inputs.v_cache, torch_dtype(inputs.kv_dtype)),
        block_table=t(inputs.block_table.astype(np.int32)), seq_lens=t(inputs.seq_lens.astype(np.int32)),
        query_start_loc=t(inputs.query_start_loc.astype(np.int32)),
        k_scale=t(inputs.k_scale), v_scale=t(inputs.v_scale), k_offset=t(inputs.k_offset), v_offset=t(inputs.v_offset),
    )


def from_torch(out: torch.Tensor, lse: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """``(out, lse)`` torch tensors (any device, any float dtype) -> NumPy float32."""
    return out.detach().float().cpu().numpy(), lse.detach().float().cpu().numpy()


def grown_store(store: "torch.Tensor | None", rows: int, rest: tuple, dtype, device) -> "torch.Tensor":
    """A zeroed ``[>= rows, *rest]`` buffer: ``store`` itself when it has the rows, else a new one grown by
    half (at least ``rows``), so that a wrapper whose batches change size every step (eager serving)
    stops allocating once its stores are large enough; callers take views of the first rows."""
    if store is not None and store.shape[0] >= rows:
        return store
    n = rows if store is None else max(rows, store.shape[0] + store.shape[0] // 2)
    return torch.zeros((n,) + tuple(rest), dtype=dtype, device=device)
