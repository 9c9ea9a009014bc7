"""Low-precision dtypes in NumPy without extra packages.

NumPy has no bfloat16. Cases therefore carry float32 arrays whose values are exactly representable
in the case's dtype (``float16``, ``bfloat16`` or ``float32``); backends convert them to their native
dtype losslessly. :func:`round_to` rounds float32 to such values (round to nearest even).
"""

from __future__ import annotations

import numpy as np

FLOAT_DTYPES = ("float16", "bfloat16", "float32")
KV_DTYPES = FLOAT_DTYPES + ("int8",)
ITEMSIZE = {"float16": 2, "bfloat16": 2, "float32": 4, "int8": 1, "int32": 4, "int64": 8}
EPS = {"float16": 2.0 ** -10, "bfloat16": 2.0 ** -7, "float32": 2.0 ** -23}


def round_to(x, dtype: str) -> np.ndarray:
    """Round to the nearest value of ``dtype`` (ties to even) and return float32."""
    x = np.asarray(x, dtype=np.float32)
    if dtype == "float32":
        return x.copy()
    if dtype == "float16":
        return x.astype(np.float16).astype(np.float32)
    if dtype == "bfloat16":
        bits = x.view(np.uint32).astype(np.uint64)
        rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        out = rounded.astype(np.uint32).view(np.float32)
        return np.where(np.isnan(x), x, out).astype(np.float32)
    raise ValueError(f"dtype: unsupported {dtype!r}; expected one of {FLOAT_DTYPES}")


def dtype_name(x) -> str:
    """Name of an array's dtype (NumPy or torch), e.g. ``'bfloat16'``, ``'int32'``."""
    dt = getattr(x, "dtype", None)
    if dt is None:
        raise TypeError(f"expected an array or tensor, got {type(x).__name__}")
    return str(dt).replace("torch.", "")
