"""What the Ascend C kernels take, and the Ascend defaults: the rules in one place.

Every check of "can the Ascend kernels run this?" reads this module: the wrapper and
``decode_attention`` (:mod:`ascend_ops.wrapper`, :mod:`ascend_ops.ops`), the host tiling
(:mod:`ascend_ops.tiling`), the harness backends ``ascend`` and ``ascend-sim``, the vLLM plugin
(``splitkv_vllm``) and ``splitkv_bench/npu_graph_check.py``.

* q dtypes: float32, float16, bfloat16; the KV cache is in q's dtype or int8 (with per-head or
  per-channel scales and offsets).
* head dims: multiples of 8 in [8, 256] (float32 rows are copied as whole 32-byte blocks; the
  tiling's UB budget is sized for up to 256).
* the device profile (:mod:`splitkv_common.devices`) NPU plans are made for: on an NPU the chip's
  own (its name from the runtime), with the core counts the device reports (:func:`npu_profile`);
  elsewhere ``910b2`` unless ``SPLITKV_ASCEND_PROFILE`` names another.
* which split stage serves a call (:func:`mixed_kernel_unsupported`): the mixed AIC + AIV kernel
  (``splitkv_split_mix``) for float16 / bfloat16 q with a KV cache of the same dtype or int8 and
  head dims that are multiples of 16 up to 256; everything else (float32 q, head dims that are
  multiples of 8 only) takes the vector-only kernel (``splitkv_split``), the documented fallback.

Needs neither torch nor NumPy (torch only when an NPU's profile is queried).
"""

from __future__ import annotations

import functools
import os
from dataclasses import replace

from splitkv_common.devices import PROFILES, DeviceProfile, get_profile
from splitkv_common.npu_probe import DEFAULT_NPU_PROFILE

#: The device profile the Ascend side plans for unless told otherwise.
DEFAULT_PROFILE = DEFAULT_NPU_PROFILE
#: The environment variable that names another profile (harness backends, vLLM plugin, scripts).
PROFILE_ENV = "SPLITKV_ASCEND_PROFILE"

#: q (and output) dtypes the kernels take.
Q_DTYPES = ("float32", "float16", "bfloat16")
#: The quantized KV dtype (the other KV dtype is q's own).
KV_QUANT_DTYPE = "int8"
#: Head dims: multiples of HEAD_DIM_STEP in [HEAD_DIM_STEP, MAX_HEAD_DIM].
HEAD_DIM_STEP = 8
MAX_HEAD_DIM = 256


def profile() -> str:
    """The device profile to plan for: ``SPLITKV_ASCEND_PROFILE``, else :data:`DEFAULT_PROFILE`."""
    return os.environ.get(PROFILE_ENV, DEFAULT_PROFILE)


def npu_cores(index: int) -> tuple[int, int]:
    """``(cube cores, vector cores)`` the kernels may use on NPU ``index``: torch_npu's device
    properties (``cube_core_num``, ``vector_core_num``), lowered to its current stream's limit where
    torch_npu has one (``torch.npu.get_stream_limit``). ``RuntimeError`` when it reports none."""
    import torch

    props = torch.npu.get_device_properties(index)
    aic = int(getattr(props, "cube_core_num", 0) or 0)
    aiv = int(getattr(props, "vector_core_num", 0) or 0) or 2 * aic
    get_limit = getattr(torch.npu, "get_stream_limit", None)
    if get_limit is not None:
        try:
            limit = get_limit(torch.npu.current_stream(index))
        except Exception:  # noqa: BLE001 - an older torch_npu or no limit set: the device's counts stand
            limit = {}
        aic = min(aic, int(limit.get("cube_core_num") or aic))
        aiv = min(aiv, int(limit.get("vector_core_num") or aiv))
    if aic <= 0 or aiv <= 0:
        raise RuntimeError(f"NPU {index}: torch_npu reports {aic} cube / {aiv} vector cores; the Ascend kernels need "
                           "the device's core counts to size their launches")
    return aic, aiv


def npu_profile(device, name: str | None = None) -> DeviceProfile:
    """The profile the kernels plan and launch for on the NPU ``device`` (a torch device or index).

    ``name`` (or ``SPLITKV_ASCEND_PROFILE``) picks the planner's constants; by default the chip's own
    profile, found by the name the runtime gives it (``torch.npu.get_device_name``: ``Ascend910B3``,
    ``Ascend910_9391``...); a chip without a profile is refused. The core counts are always the
    device's (:func:`npu_cores`), never more than the profile's: a fused launch synchronizes all its
    AI cores, and more blocks than the device runs at once would hang."""
    import torch

    index = device if isinstance(device, int) else (device.index if device.index is not None
                                                    else torch.npu.current_device())
    return _npu_profile(int(index), name or os.environ.get(PROFILE_ENV))


@functools.lru_cache(maxsize=None)
def _npu_profile(index: int, name: str | None) -> DeviceProfile:
    """:func:`npu_profile`, once per (device, name): a wrapper made every step queries nothing."""
    import torch

    chip = torch.npu.get_device_name(index)
    name = name or chip
    try:
        prof = get_profile(name)
    except ValueError:
        raise ValueError(f"device: NPU {index} is a {chip}, which has no device profile (known: "
                         f"{', '.join(sorted(PROFILES))}); name one with {PROFILE_ENV} or profile=") from None
    aic, aiv = npu_cores(index)
    return replace(prof, cube_units=min(prof.cube_units or aic, aic), units=min(prof.units, aiv))


def launch_profile(device, name: str | None = None) -> str | DeviceProfile:
    """The profile a wrapper on ``device`` plans for: :func:`npu_profile` on an NPU; elsewhere (the
    op's CPU kernel, the twin) ``name``, else :func:`profile`."""
    if getattr(device, "type", "cpu") == "cpu":
        return name or profile()
    return npu_profile(device, name)


def q_dtype_supported(dtype: str) -> bool:
    """Whether the kernels take q (and write the output) in ``dtype``."""
    return dtype in Q_DTYPES


def kv_dtype_supported(dtype: str, kv_dtype: str) -> bool:
    """Whether the kernels take a ``kv_dtype`` cache with a ``dtype`` q: q's dtype or int8."""
    return kv_dtype in (dtype, KV_QUANT_DTYPE)


def supported_head_dim(head_dim: int) -> str | None:
    """None when the kernels take ``head_dim``, else why not."""
    if head_dim % HEAD_DIM_STEP or not HEAD_DIM_STEP <= head_dim <= MAX_HEAD_DIM:
        return (f"head dim {head_dim}: the Ascend kernels need a multiple of 8 in [8, {MAX_HEAD_DIM}] "
                "(float32 rows copied as whole 32-byte blocks)")
    return None


def supported_head_dims() -> range:
    """Every head dim the kernels take (for :func:`splitkv_common.validation.check_decode_args`)."""
    return range(HEAD_DIM_STEP, MAX_HEAD_DIM + 1, HEAD_DIM_STEP)


def unsupported_reason(head_dim: int, dtype: str, kv_dtype: str) -> str | None:
    """``None`` when the kernels handle this head dim and these dtypes, else why not."""
    why = supported_head_dim(int(head_dim))
    if why:
        return why
    if not q_dtype_supported(dtype):
        return f"dtype {dtype}: the Ascend kernels take float32, float16 or bfloat16 q"
    if not kv_dtype_supported(dtype, kv_dtype):
        return f"KV dtype {kv_dtype}: the Ascend kernels take q's dtype ({dtype}) or int8"
    return None


#: Head dims the mixed (AIC + AIV) split stage takes: multiples of MIX_HEAD_DIM_STEP up to MAX_HEAD_DIM
#: (whole 16 x 16 cube fractals along D).
MIX_HEAD_DIM_STEP = 16
MIX_INT8_HEAD_DIM_STEP = 32  # int8 KV on the mixed kernel: a head dim of whole 16 x 32 int8 fractals


def mixed_kernel_unsupported(head_dim: int, dtype: str, kv_dtype: str, num_q_heads: int = 1,
                             num_kv_heads: int = 1) -> str | None:
    """None when the mixed AIC + AIV split stage takes this call, else why the vector-only kernel
    serves it (float32 q, head dims not a multiple of 16, strides over 16 bits).

    int8 KV is taken with fp16 or bf16 q and head dims that are multiples of 32 (whole int8
    fractals): IFA's MSD route, q and P expanded into int8 rows and int8 x int8 on the cube, the
    scales and offsets folded into q, the scores and the output."""
    if dtype not in ("float16", "bfloat16") or kv_dtype not in (dtype, KV_QUANT_DTYPE):
        return f"mixed kernel: fp16/bf16 q with KV of the same dtype or int8 only (got {dtype} / {kv_dtype})"
    if head_dim % MIX_HEAD_DIM_STEP or not MIX_HEAD_DIM_STEP <= head_dim <= MAX_HEAD_DIM:
        return f"mixed kernel: head dim a multiple of 16 in [16, {MAX_HEAD_DIM}] (got {head_dim})"
    if kv_dtype == KV_QUANT_DTYPE and head_dim % MIX_INT8_HEAD_DIM_STEP:
        return (f"mixed kernel: int8 KV needs a head dim that is a multiple of {MIX_INT8_HEAD_DIM_STEP} "
                f"(whole int8 fractals; got {head_dim})")
    if num_q_heads * head_dim > 65535 or num_kv_heads * head_dim > 65535:
        return "mixed kernel: Hq * D and Hkv * D must fit Nd2NzParams' 16-bit strides"
    return None
