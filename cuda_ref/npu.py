"""Harness backend ``triton-npu``: these Triton kernels on an Ascend NPU (triton-ascend).

The same two kernels as the CUDA path (``cuda_ref/kernels.py``: split, then merge), compiled by
triton-ascend instead of upstream Triton and launched on ``npu`` tensors through torch_npu. What
changes on the NPU is the launch, never the math:

* **No fused merge.** The fused merge of the CUDA path needs an atomic counter and memory ordering
  between programs; Ascend AI cores have no barrier across programs, so the merge always runs as
  the separate second kernel (``fuse_merge=False``).
* **Tiles sized for the Unified Buffer.** Each vector core has 192 KiB of Unified Buffer; the
  stage-1 tiles (``BLOCK_M`` packed query rows x ``BLOCK_N`` KV tokens x ``BLOCK_D``) must fit in it.
  :data:`NPU_TILES` holds the largest tiles that ``splitkv_bench/lower_triton_ascend.py`` showed to
  lower for Ascend910B3 without a UB overflow (results in ``docs/triton-ascend.md``).

Available only where triton-ascend (the ``triton`` package with an ``ascend`` backend), torch_npu
and an NPU are present; otherwise unavailable with the reason (the NPU probes are
:mod:`splitkv_common.npu_probe`'s). ``import cuda_ref.npu`` needs none of them (nor torch).
"""

from __future__ import annotations

import importlib.util
import pathlib

from splitkv_common.inputs import DecodeInputs
from splitkv_common.npu_probe import DEFAULT_NPU_PROFILE, npu_device, npu_unavailable
from splitkv_common.plan_layout import Plan
from splitkv_common.parity.registry import Backend

# (max head dim, q dtype family) -> (max BLOCK_M, BLOCK_N). "16" is float16 / bfloat16 q and KV.
# Checked by splitkv_bench/lower_triton_ascend.py (every head dim x dtype x GQA group x feature below).
NPU_TILES = {
    (64, "16"): (64, 64),
    (128, "16"): (32, 64),
    (256, "16"): (32, 32),
    (64, "32"): (32, 64),
    (128, "32"): (32, 32),
    (256, "32"): (16, 32),
}
MAX_HEAD_DIM = 256
# head dims the lowering check covers (BLOCK_D is the next power of two: 96 -> 128)
CHECKED_HEAD_DIMS = (64, 96, 128, 256)

def dtype_family(dtype: str) -> str:
    return "32" if dtype in ("float32", "fp32") else "16"


def npu_tile(head_dim: int, dtype: str, kv_dtype: str | None = None) -> tuple[int, int]:
    """``(max BLOCK_M, BLOCK_N)`` of the split kernel on the NPU for this head dim, q dtype and KV
    dtype (int8 KV is dequantized to float32 before the dot: it takes the float32 tiles)."""
    d = 1 << (max(int(head_dim), 16) - 1).bit_length()
    fam = "32" if kv_dtype == "int8" else dtype_family(dtype)
    for (dmax, f), tile in sorted(NPU_TILES.items()):
        if d <= dmax and f == fam:
            return tile
    raise ValueError(f"head dim {head_dim}: the NPU tile table stops at {MAX_HEAD_DIM}")


def triton_ascend_unavailable() -> str | None:
    """``None`` when the installed ``triton`` is triton-ascend, else why not."""
    spec = importlib.util.find_spec("triton")
    if spec is None:
        return "triton is not installed: install triton-ascend (see docs/triton-ascend.md)"
    root = pathlib.Path(spec.origin).parent
    if not (root / "backends" / "ascend").is_dir():
        return ("the installed triton has no Ascend backend (it is upstream Triton); triton-ascend replaces "
                "it: pip install triton-ascend (docs/triton-ascend.md)")
    return None


def triton_npu_unavailable() -> str | None:
    why = triton_ascend_unavailable()
    if why:
        return why
    try:
        import torch  # noqa: F401
    except Exception as e:  # noqa: BLE001 - torch itself missing
        return f"torch is not usable ({type(e).__name__}: {e})"
    return npu_unavailable()


def triton_npu_unsupported(inputs: DecodeInputs) -> str | None:
    d = int(inputs.q.shape[-1])
    if d > MAX_HEAD_DIM:
        return f"head dim {d}: the NPU tile table (lowering-checked) stops at {MAX_HEAD_DIM}"
    return None


def run_triton_npu(inputs: DecodeInputs, plan: Plan):
    """Run ``cuda_ref``'s kernels on the NPU with the harness's plan; NumPy ``(out, lse)``."""
    import torch

    from splitkv_common.torch_io import from_torch, to_torch

    from .checks import check_launch, check_plan
    from .configs import KernelConfig
    from .launch import launch_decode
    from .plan_upload import DevicePlan

    t = to_torch(inputs, npu_device())
    q, k = t["q"], t["k_cache"]
    T, Hq, D = q.shape
    group = Hq // k.shape[2]
    max_m, block_n = npu_tile(D, inputs.dtype, inputs.kv_dtype)
    check_launch(q, k, t["v_cache"], t["block_table"], t["seq_lens"], t["query_start_loc"], k_scale=t["k_scale"],
                 v_scale=t["v_scale"], k_offset=t["k_offset"], v_offset=t["v_offset"], scale=inputs.scale,
                 soft_cap=inputs.soft_cap, window_left=inputs.window_left)
    check_plan(plan, k.shape[2])
    dplan = DevicePlan.from_plan(plan, group, q.device, max_block_m=max_m)
    out = torch.empty_like(q)
    lse = torch.empty(T, Hq, dtype=torch.float32, device=q.device)
    slots = max(plan.num_slots, 1)
    part_o = torch.empty(slots, Hq, D, dtype=torch.float32, device=q.device)
    part_lse = torch.empty(slots, Hq, dtype=torch.float32, device=q.device)
    launch_decode(q, k, t["v_cache"], t["block_table"], t["seq_lens"], t["query_start_loc"], dplan, out, lse,
                  part_o, part_lse, scale=inputs.scale, soft_cap=inputs.soft_cap, window_left=inputs.window_left,
                  k_scale=t["k_scale"], v_scale=t["v_scale"], k_offset=t["k_offset"], v_offset=t["v_offset"],
                  config=KernelConfig(block_n=block_n, num_warps=1, num_stages=1), fuse_merge=False)
    return from_torch(out, lse)


triton_npu_backend = Backend(
    "triton-npu", run_triton_npu, unavailable=triton_npu_unavailable, unsupported=triton_npu_unsupported,
    device=DEFAULT_NPU_PROFILE,
    description="cuda_ref's Triton kernels on an Ascend NPU through triton-ascend (split + separate merge)")
