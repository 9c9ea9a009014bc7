"""``torch.ops.splitkv_ascend.decode_attention``: schema, fake and CPU kernels, runtime, Python API.

The operator is the kernels' contract, nothing more: the tensors the two Ascend C kernels read and
write, plus the host-side ``block_dim`` (see :data:`SCHEMA`). Everything decided per batch (the
shared :class:`~splitkv_common.plan.Plan`, scale, soft cap, window, tile sizes) travels in two
device buffers built on the host by :mod:`ascend_ops.tiling`: ``plan`` (int32 words) and
``tiling`` (one ``SplitKVTiling``, ``ascend_ops/kernel/splitkv_tiling.h``).

Kernels registered for the op:

* ``PrivateUse1`` (the ``npu`` device): **C++**, ``ascend_ops/csrc/binding.cpp``, in the library
  ``scripts/build_ascend.sh`` builds; :func:`load_extension` loads it. It enqueues the split and
  combine kernels on the current NPU stream.
* ``CPU``: :func:`_cpu_kernel`, the same contract computed with stock torch ops
  (:func:`splitkv_common.torch_eager.decode_attention`) from the same ``plan``/``tiling`` bytes,
  and writing the partials in the kernels' workspace layout. It is the op's executable
  specification (tests, ``torch.library.opcheck``), not an NPU implementation.
* Fake (meta): checks shapes and dtypes, writes nothing, for ``torch.compile`` and aclgraph tracing.

The schema lives here only. The C++ library implements it without restating it; when it is loaded
the dispatcher checks its C++ signature against this schema.

Python API (the same as :mod:`cuda_ref`'s): :class:`AscendDecodeWrapper` (``plan()`` on the host,
``run()`` on the device without host sync, aclgraph-capturable) and :func:`decode_attention`.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch

from splitkv_common.devices import get_profile
from splitkv_common.npu_probe import npu_device, npu_unavailable, torch_npu_imported, torch_npu_unavailable
from splitkv_common.plan import Plan, PlanSpec
from splitkv_common.validation import check_decode_args, check_gqa, check_wrapper_tensors, host, normalize_window

from .support import DEFAULT_PROFILE, KV_QUANT_DTYPE, Q_DTYPES, supported_head_dims, unsupported_reason

NAMESPACE = "splitkv_ascend"
OP_NAME = "decode_attention"
QUALNAME = f"{NAMESPACE}::{OP_NAME}"

#: The operator's schema, the single definition (binding.cpp implements it).
SCHEMA = (
    "decode_attention(Tensor q, Tensor k_cache, Tensor v_cache, Tensor block_table, Tensor? kv_quant, "
    "Tensor plan, Tensor tiling, Tensor(a!) workspace, Tensor(b!) out, Tensor(c!) lse, int block_dim) -> ()"
)

LIBRARY_FILE = "libsplitkv_ascend.so"
#: Where ``scripts/build_ascend.sh`` puts the library (``SPLITKV_ASCEND_LIB`` names another file).
LIBRARY_DIR = Path(__file__).resolve().parent / "_lib"

TORCH_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32, "int8": torch.int8}
_Q_TORCH_DTYPES = tuple(TORCH_DTYPES[n] for n in Q_DTYPES)


# ---------------------------------------------------------------------------------------------
# Runtime: what is missing, in words
# ---------------------------------------------------------------------------------------------

def library_path() -> Path:
    """The extension library to load: ``SPLITKV_ASCEND_LIB`` or ``ascend_ops/_lib/libsplitkv_ascend.so``."""
    env = os.environ.get("SPLITKV_ASCEND_LIB")
    return Path(env) if env else LIBRARY_DIR / LIBRARY_FILE


def has_npu_kernel() -> bool:
    """Whether a ``PrivateUse1`` kernel is registered for the op (the C++ library is loaded)."""
    return torch._C._dispatch_has_kernel_for_dispatch_key(QUALNAME, "PrivateUse1")


def load_extension(path: "str | Path | None" = None) -> None:
    """Load the C++ library (its ``PrivateUse1`` kernel); raise ``RuntimeError`` saying what is missing.

    torch_npu is imported first (the library links against it). Loading twice is a no-op.
    """
    if has_npu_kernel():
        return
    why = torch_npu_unavailable()
    if why:
        raise RuntimeError(f"{QUALNAME}: cannot load the NPU kernel: {why}")
    lib = Path(path) if path is not None else library_path()
    if not lib.is_file():
        raise RuntimeError(f"{QUALNAME}: the extension is not built ({lib} does not exist); run "
                           "scripts/build_ascend.sh on a machine with CANN and torch_npu (docs/npu.md)")
    try:
        torch.ops.load_library(str(lib))
    except Exception as e:  # noqa: BLE001
        raise RuntimeError(f"{QUALNAME}: loading {lib} failed: {type(e).__name__}: {e}") from e
    if not has_npu_kernel():
        raise RuntimeError(f"{QUALNAME}: {lib} loaded but registered no PrivateUse1 kernel for the op")


def extension_unavailable() -> str | None:
    """``None`` when the NPU kernel is registered or loads now, else why not."""
    try:
        load_extension()
    except RuntimeError as e:
        return str(e)
    return None


def runtime_unavailable() -> str | None:
    """``None`` when the operator can run on an NPU here, else the first missing piece in words:
    torch_npu (not installed / not importable), an NPU device, the built extension."""
    return npu_unavailable() or extension_unavailable()


def resolve_device(device=None) -> torch.device:
    """``device`` (default: the NPU) as a ``torch.device``; ``RuntimeError`` saying what is missing
    when it names the NPU and torch does not know it (torch_npu not imported)."""
    try:
        return torch.device(device if device is not None else npu_device())
    except RuntimeError:
        why = npu_unavailable() or "torch does not know the device"
        raise RuntimeError(f"{QUALNAME}: cannot use device {str(device or 'npu')!r}: {why}") from None


def require_npu_kernel(device: torch.device) -> None:
    """Raise a clear ``RuntimeError`` unless the op can run on ``device``."""
    if device.type == "cpu":
        return
    if device.type != torch._C._get_privateuse1_backend_name() and device.type != "npu":
        raise RuntimeError(f"{QUALNAME}: tensors are on {device}; the operator runs on an Ascend NPU ('npu')")
    if has_npu_kernel():
        return
    why = runtime_unavailable()
    if why:
        raise RuntimeError(f"{QUALNAME}: cannot run on {device}: {why}")


# ---------------------------------------------------------------------------------------------
# The operator: definition, fake kernel, CPU kernel
# ---------------------------------------------------------------------------------------------

_LIB = torch.library.Library(NAMESPACE, "DEF")
_LIB.define(SCHEMA)


def _check_meta(q, k_cache, v_cache, block_table, kv_quant, plan, tiling, workspace, out, lse, block_dim):
    """Metadata checks shared by the fake and CPU kernels (binding.cpp makes the same ones)."""
    from . import tiling as tl

    if q.dim() != 3:
        raise ValueError(f"q: must be [T, Hq, D], got {tuple(q.shape)}")
    if k_cache.dim() != 4 or v_cache.shape != k_cache.shape or k_cache.shape[3] != q.shape[2]:
        raise ValueError(f"k_cache, v_cache: must be [num_pages, page_size, Hkv, {q.shape[2]}], "
                         f"got {tuple(k_cache.shape)} and {tuple(v_cache.shape)}")
    if q.dtype not in _Q_TORCH_DTYPES:
        raise TypeError(f"q: dtype must be float32, float16 or bfloat16, got {q.dtype}")
    if k_cache.dtype != v_cache.dtype or k_cache.dtype not in (q.dtype, TORCH_DTYPES[KV_QUANT_DTYPE]):
        raise TypeError(f"k_cache, v_cache: dtype must be q's or int8, got {k_cache.dtype}, {v_cache.dtype}")
    if k_cache.dtype == torch.int8 and kv_quant is None:
        raise ValueError("kv_quant: required with an int8 KV cache")
    if kv_quant is not None and (kv_quant.dtype != torch.float32
                                 or tuple(kv_quant.shape) != (4, k_cache.shape[2], q.shape[2])):
        raise ValueError(f"kv_quant: must be float32 [4, Hkv, D], got {kv_quant.dtype} {tuple(kv_quant.shape)}")
    if block_table.dtype != torch.int32 or block_table.dim() != 2:
        raise TypeError(f"block_table: must be int32 [B, max_pages], "
                        f"got {block_table.dtype} {tuple(block_table.shape)}")
    if plan.dtype != torch.int32 or plan.dim() != 1:
        raise TypeError(f"plan: must be 1-D int32 words, got {plan.dtype} {tuple(plan.shape)}")
    if tiling.dtype != torch.uint8 or tiling.numel() != tl.TILING_BYTES:
        raise TypeError(f"tiling: must be {tl.TILING_BYTES} uint8 bytes, got {tiling.dtype} x {tiling.numel()}")
    if workspace.dtype != torch.float32:
        raise TypeError(f"workspace: dtype must be float32, got {workspace.dtype}")
    if out.shape != q.shape or out.dtype != q.dtype:
        raise ValueError(f"out: must be {tuple(q.shape)} {q.dtype}, got {tuple(out.shape)} {out.dtype}")
    if lse.dtype != torch.float32 or tuple(lse.shape) != tuple(q.shape[:2]):
        raise ValueError(f"lse: must be float32 {tuple(q.shape[:2])}, got {lse.dtype} {tuple(lse.shape)}")
    if not 0 < block_dim <= 65535:
        raise ValueError(f"block_dim: must be in [1, 65535], got {block_dim}")


@torch.library.register_fake(QUALNAME, lib=_LIB)
def _fake_kernel(q, k_cache, v_cache, block_table, kv_quant, plan, tiling, workspace, out, lse, block_dim):
    _check_meta(q, k_cache, v_cache, block_table, kv_quant, plan, tiling, workspace, out, lse, block_dim)


def _cpu_kernel(q, k_cache, v_cache, block_table, kv_quant, plan, tiling, workspace, out, lse, block_dim):
    """The op's contract on CPU tensors, from the same ``plan`` and ``tiling`` the kernels read."""
    from splitkv_common.torch_eager import decode_attention as eager

    from . import tiling as tl

    _check_meta(q, k_cache, v_cache, block_table, kv_quant, plan, tiling, workspace, out, lse, block_dim)
    t = tl.unpack_tiling(tiling.numpy().tobytes())
    host_plan, seq_lens, qsl = plan_from_words(plan.numpy(), t)
    quant = {}
    if kv_quant is not None:
        quant = dict(k_scale=kv_quant[0], k_offset=kv_quant[1], v_scale=kv_quant[2], v_offset=kv_quant[3])
    o, lse_rows, (po, pl) = eager(q, k_cache, v_cache, block_table, torch.from_numpy(seq_lens),
                           torch.from_numpy(qsl), plan=host_plan, scale=float(t["scale"]),
                           soft_cap=float(t["softCap"]) if t["softCap"] > 0 else None,
                           window_left=int(t["windowLeft"]) if t["windowLeft"] >= 0 else None,
                           return_partials=True, **quant)
    out.copy_(o)
    lse.copy_(lse_rows)
    # the workspace as the split stage leaves it: o [numSlots, Hq, D], then lse [numSlots, Hq, 8]
    ws = workspace.view(-1)
    n_o = po.numel()
    lse_at = int(t["lseOffsetBytes"]) // 4
    if ws.numel() >= lse_at + pl.numel() * 8 and ws.numel() >= n_o:
        ws[:n_o].copy_(po.reshape(-1))
        ws[lse_at:lse_at + pl.numel() * 8].copy_(pl.unsqueeze(-1).expand(*pl.shape, 8).reshape(-1))


_LIB.impl(OP_NAME, _cpu_kernel, "CPU")


def plan_from_words(words: np.ndarray, t: dict) -> tuple[Plan, np.ndarray, np.ndarray]:
    """Rebuild ``(plan, seq_lens, query_start_loc)`` from the int32 plan buffer and its tiling fields."""
    words = np.asarray(words, np.int32)
    n_items, batch, rows = int(t["numItems"]), int(t["batch"]), int(t["numRows"])
    items = words[t["itemsOffset"]:t["itemsOffset"] + 5 * n_items].reshape(n_items, 5)
    qsl = words[t["qslOffset"]:t["qslOffset"] + batch + 1].copy()
    seq_lens = words[t["seqLensOffset"]:t["seqLensOffset"] + batch].copy()
    row_slot = words[t["rowSlotOffset"]:t["rowSlotOffset"] + rows].copy()
    row_num = words[t["rowNumOffset"]:t["rowNumOffset"] + rows].copy()
    valid = items[:, 0] >= 0
    n_valid = int(valid.sum())
    if not valid[:n_valid].all():
        raise ValueError("plan: padding items (request -1) must come after every valid item")
    counts = np.zeros(batch, np.int32)
    np.maximum.at(counts, items[valid, 0], items[valid, 2] + 1)
    p = Plan(item_request=items[:, 0].copy(), item_kv_head=items[:, 1].copy(), item_split=items[:, 2].copy(),
             item_kv_start=items[:, 3].copy(), item_kv_end=items[:, 4].copy(), num_valid_items=n_valid,
             num_splits=counts, query_start_loc=qsl, row_slot_start=row_slot, row_num_splits=row_num,
             num_slots=int(t["numSlots"]), num_kv_heads=int(t["numKVHeads"]), page_size=int(t["pageSize"]),
             policy=_policy_none(), split_tokens=0, graph_stable=n_valid < n_items, reason="rebuilt from plan words")
    return p, seq_lens, qsl


def _policy_none():
    from splitkv_common.plan import SplitPolicy

    return SplitPolicy("none")


def decode_attention_op(q, k_cache, v_cache, block_table, kv_quant, plan, tiling, workspace, out, lse,
                        block_dim: int) -> None:
    """``torch.ops.splitkv_ascend.decode_attention``: fill ``out`` and ``lse`` (and ``workspace``)."""
    torch.ops.splitkv_ascend.decode_attention(q, k_cache, v_cache, block_table, kv_quant, plan, tiling, workspace,
                                              out, lse, block_dim)


def pack_kv_quant(k_scale, v_scale, k_offset=None, v_offset=None, *, num_kv_heads: int, head_dim: int,
                  device) -> "torch.Tensor | None":
    """float32 ``[4, Hkv, D]``: k scale, k offset, v scale, v offset (per head expanded per channel)."""
    if k_scale is None and v_scale is None:
        return None

    def full(x, fill):
        if x is None:
            return torch.full((num_kv_heads, head_dim), fill, dtype=torch.float32, device=device)
        return x.to(device=device, dtype=torch.float32).reshape(num_kv_heads, -1).expand(num_kv_heads, head_dim)

    return torch.stack([full(k_scale, 1.0), full(k_offset, 0.0), full(v_scale, 1.0), full(v_offset, 0.0)]).contiguous()


# ---------------------------------------------------------------------------------------------
# Python API
# ---------------------------------------------------------------------------------------------

class AscendDecodeWrapper:
    """Split-KV decode attention on an Ascend NPU over a paged KV cache ``[num_pages, page_size, Hkv, D]``.

    ``plan()`` runs on the host once per batch: the shared plan, the ``plan``/``tiling`` buffers
    (:mod:`ascend_ops.tiling`) copied to the device, the workspace. ``run()`` only checks metadata
    and enqueues the two kernels: no allocation (its outputs are the wrapper's buffers unless
    ``out``/``lse`` are given), no host sync, so it can be captured in an aclgraph
    (``torch.npu.NPUGraph``) and replayed.

    With ``graph_stable=True`` every buffer keeps its shape and address across ``plan()`` calls
    (fixed ``max_splits`` slots per row and ``max_work_items`` work items), and ``plan()``
    refreshes them in place: capture ``run()`` once, then before each replay write the new
    lengths and call ``plan()`` again (docs/npu.md, "Plan, run and aclgraph")::

        w = AscendDecodeWrapper(32, 8, 128, 128, dtype=torch.bfloat16, graph_stable=True, max_work_items=1024)
        w.plan(seq_lens_host, scale=scale, max_pages=block_table.shape[1], num_pages=k_cache.shape[0])
        w.run(q, k_cache, v_cache, block_table)            # warm-up, eager
        g = torch.npu.NPUGraph()
        with torch.npu.graph(g):
            out, lse = w.run(q, k_cache, v_cache, block_table)
        w.plan(new_seq_lens_host, scale=scale); g.replay()

    Args:
        num_q_heads, num_kv_heads, head_dim, page_size: the model's shape (``Hq % Hkv == 0``).
        dtype: q's and the output's dtype; kv_dtype: the cache's (default ``dtype``; or int8).
        device: ``npu`` (default: the current NPU) or ``cpu`` (the op's CPU kernel, for tests).
        profile: device profile of the planner (default :data:`~ascend_ops.support.DEFAULT_PROFILE`,
            ``910b2``; or ``910b3``...); policy: ``auto``, ``none``, ``size:N``, ``count:N``;
            graph_stable, max_splits, max_work_items, min_split_tokens: as
            :func:`splitkv_common.plan.make_plan`.

    The attention's constants (``scale``, ``soft_cap``, ``window_left``) and the page counts are
    part of the tiling: give them to ``plan()`` so that ``run()`` does no host work.
    """

    def __init__(self, num_q_heads: int, num_kv_heads: int, head_dim: int, page_size: int, *,
                 dtype=torch.bfloat16, kv_dtype=None, device=None, profile: str = DEFAULT_PROFILE, policy: str = "auto",
                 graph_stable: bool = False, max_splits: int | None = None, max_work_items: int | None = None,
                 min_split_tokens: int | None = None):
        check_gqa(num_q_heads, num_kv_heads)
        self.num_q_heads, self.num_kv_heads = int(num_q_heads), int(num_kv_heads)
        self.head_dim, self.page_size = int(head_dim), int(page_size)
        self.dtype = TORCH_DTYPES.get(dtype, dtype)
        self.kv_dtype = self.dtype if kv_dtype is None else TORCH_DTYPES.get(kv_dtype, kv_dtype)
        why = unsupported_reason(self.head_dim, _dtype_name(self.dtype), _dtype_name(self.kv_dtype))
        if why:
            raise ValueError(f"{QUALNAME}: {why}")
        self.device = resolve_device(device)
        require_npu_kernel(self.device)
        self.profile, self.policy = profile, policy
        self.graph_stable, self.max_splits, self.max_work_items = graph_stable, max_splits, max_work_items
        self.min_split_tokens = min_split_tokens
        self.host_plan: Plan | None = None
        self.tiling: dict | None = None
        self._buffers: dict[str, torch.Tensor] = {}
        self._staging: dict[str, torch.Tensor] = {}
        self._staging_events: dict = {}
        self._attn: tuple = (None, None, None)  # (scale, soft_cap, window_left) of the tiling
        self._pages: tuple | None = None  # (max_pages, num_pages) of the tiling
        self._stale = True

    # -- host side ---------------------------------------------------------------------------
    def plan_spec(self) -> PlanSpec:
        """The planning settings of this wrapper (shared with every backend's wrapper)."""
        return PlanSpec(self.num_q_heads, self.num_kv_heads, self.head_dim, self.page_size,
                        kv_elem_bytes=torch.empty(0, dtype=self.kv_dtype).element_size(), policy=self.policy,
                        device=self.profile, graph_stable=self.graph_stable, max_splits=self.max_splits,
                        max_work_items=self.max_work_items, min_split_tokens=self.min_split_tokens)

    def plan(self, seq_lens, q_lens=None, query_start_loc=None, window_left=None, *, scale=None,
             soft_cap=None, max_pages: int | None = None, num_pages: int | None = None) -> Plan:
        """Plan a batch from host lengths and prepare the device buffers (may allocate)."""
        p = self.plan_spec().make(host(seq_lens), None if q_lens is None else host(q_lens),
                                  None if query_start_loc is None else host(query_start_loc), window_left)
        self.set_plan(p, seq_lens=host(seq_lens), scale=scale, soft_cap=soft_cap, window_left=window_left,
                      max_pages=max_pages, num_pages=num_pages)
        return p

    def set_plan(self, plan: Plan, *, seq_lens=None, scale=None, soft_cap=None, window_left=None,
                 max_pages: int | None = None, num_pages: int | None = None) -> None:
        """Use a plan made elsewhere (the parity harness plans every backend the same way).

        ``seq_lens`` (host) default to the plan's coverage (the last item's end per request).
        ``scale``/``soft_cap``/``window_left`` are the attention's constants (``scale`` None:
        ``1/sqrt(D)``). ``max_pages``/``num_pages`` (block-table width, pages in the cache) default
        to the previous plan's, else are read from the tensors at the first ``run()``. When all are
        known the device buffers are refreshed now, so that ``run()`` does no host work.
        """
        if plan.num_kv_heads != self.num_kv_heads or plan.page_size != self.page_size:
            raise ValueError(f"plan: made for Hkv={plan.num_kv_heads}, page_size={plan.page_size}; this wrapper "
                             f"has Hkv={self.num_kv_heads}, page_size={self.page_size}")
        self.host_plan = plan
        self._seq_lens = plan_seq_lens(plan) if seq_lens is None else np.asarray(seq_lens, np.int64).reshape(-1)
        self._attn = (None if scale is None else float(scale), None if soft_cap is None else float(soft_cap),
                      normalize_window(window_left))
        old = self._pages or (None, None)
        self._pages = (max_pages if max_pages is not None else old[0], num_pages if num_pages is not None else old[1])
        self._stale = True
        if None not in self._pages:
            self._refresh()

    def _refresh(self) -> None:
        """Build ``plan``/``tiling`` on the host and copy them into the device buffers."""
        from . import tiling as tl

        p = self.host_plan
        scale, soft_cap, window_left = self._attn
        max_pages, num_pages = self._pages
        t, tiling_bytes, words = tl.build_buffers(
            p, seq_lens=self._seq_lens, num_q_heads=self.num_q_heads, head_dim=self.head_dim,
            page_size=self.page_size, max_pages=max_pages, num_pages=num_pages, dtype=_dtype_name(self.dtype),
            kv_dtype=_dtype_name(self.kv_dtype), scale=self.head_dim ** -0.5 if scale is None else scale,
            soft_cap=soft_cap, window_left=window_left, profile=self.profile,
            # a captured launch keeps its block count: graph-stable plans use every core
            block_dim=get_profile(self.profile).units if self.graph_stable else None)
        need = {
            "plan": (words.size, torch.int32), "tiling": (tl.TILING_BYTES, torch.uint8),
            "workspace": (max(int(t["workspaceBytes"]) // 4, 1), torch.float32),
        }
        for name, (n, dt) in need.items():
            buf = self._buffers.get(name)
            if buf is None or buf.numel() != n:
                if buf is not None and self.graph_stable:
                    raise ValueError(f"plan: buffer {name} changed size ({buf.numel()} -> {n}) under a "
                                     "graph-stable plan; give max_work_items / max_splits that bound every batch")
                self._buffers[name] = torch.zeros(n, dtype=dt, device=self.device)
        self._upload("plan", words)
        self._upload("tiling", np.frombuffer(tiling_bytes, np.uint8).copy())
        T = p.num_rows
        for name, shape, dt in (("out", (T, self.num_q_heads, self.head_dim), self.dtype),
                                ("lse", (T, self.num_q_heads), torch.float32)):
            buf = self._buffers.get(name)
            if buf is None or tuple(buf.shape) != shape:
                if buf is not None and self.graph_stable:
                    raise ValueError(f"plan: {name} changed shape ({tuple(buf.shape)} -> {shape}) under a "
                                     "graph-stable plan; a captured graph needs the same query rows every step")
                self._buffers[name] = torch.empty(shape, dtype=dt, device=self.device)
        self.tiling = t
        self._stale = False

    def _upload(self, name: str, host_array: np.ndarray) -> None:
        """Copy a host array into a device buffer, ordered on the current stream.

        On an NPU the copy goes through a pinned staging buffer, asynchronously; an event recorded
        after it guards the staging buffer, so the next ``plan()`` never overwrites bytes a copy has
        not read yet. Elsewhere (CPU, test backends) it is a plain copy.
        """
        src = torch.from_numpy(np.ascontiguousarray(host_array))
        dst = self._buffers[name]
        if self.device.type == "cpu" or not torch_npu_imported():
            dst.copy_(src)
            return
        stage = self._staging.get(name)
        if stage is None or stage.shape != src.shape:
            stage = torch.empty(src.shape, dtype=src.dtype, pin_memory=True)
            self._staging[name] = stage
        event = self._staging_events.get(name)
        if event is not None:
            event.synchronize()  # the previous copy from this staging buffer has been issued and done
        stage.copy_(src)
        dst.copy_(stage, non_blocking=True)
        event = torch.npu.Event()
        event.record()
        self._staging_events[name] = event

    def workspace_bytes(self) -> int:
        """Bytes of the kernels' workspace for the current plan (0 before the first run/plan)."""
        return 0 if self.tiling is None else int(self.tiling["workspaceBytes"])

    # -- device side -------------------------------------------------------------------------
    def run(self, q, k_cache, v_cache, block_table, seq_lens=None, query_start_loc=None, *, scale=None,
            soft_cap=None, window_left=None, k_scale=None, v_scale=None, k_offset=None, v_offset=None,
            out=None, lse=None, validate: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """Attention for the planned batch: ``(out [T, Hq, D] in q's dtype, lse [T, Hq] float32)``.

        Metadata only is checked (no device memory is read). The kernels take the lengths from the
        plan (``plan()``'s host ``seq_lens``); ``validate=True`` also runs the shared value checks
        and compares ``seq_lens``/``query_start_loc`` with the plan (host syncs: not in a graph).
        ``scale``/``soft_cap``/``window_left`` default to the planned ones; other values rebuild the
        tiling (host work: do it before a capture, not inside).
        """
        if self.host_plan is None:
            raise RuntimeError("plan: call plan() (or set_plan()) before run()")
        planned = self._attn
        attn = (planned[0] if scale is None else float(scale), planned[1] if soft_cap is None else float(soft_cap),
                planned[2] if window_left is None else normalize_window(window_left))
        pages = (int(block_table.shape[1]), int(k_cache.shape[0]))
        if self._stale or attn != planned or pages != self._pages:
            # first run() after a plan() that did not know the pages, or other constants:
            # host work and a copy, so not inside a graph capture (docs/npu.md)
            self._attn, self._pages = attn, pages
            self._refresh()
        self.check(q, k_cache, v_cache, block_table, k_scale, v_scale, k_offset, v_offset)
        if validate:
            check_decode_args(q, k_cache, v_cache, block_table,
                              seq_lens if seq_lens is not None else torch.from_numpy(self._seq_lens),
                              query_start_loc, scale=attn[0], soft_cap=attn[1], window_left=attn[2],
                              k_scale=k_scale, v_scale=v_scale, k_offset=k_offset, v_offset=v_offset,
                              supported_head_dims=supported_head_dims(), backend="ascend")
            check_plan_matches(self.host_plan, self._seq_lens, seq_lens, query_start_loc)
        b = self._buffers
        out = b["out"] if out is None else out
        lse = b["lse"] if lse is None else lse
        quant = pack_kv_quant(k_scale, v_scale, k_offset, v_offset, num_kv_heads=self.num_kv_heads,
                              head_dim=self.head_dim, device=q.device)
        decode_attention_op(q, k_cache, v_cache, block_table, quant, b["plan"], b["tiling"], b["workspace"], out,
                            lse, int(self.tiling["blockDim"]))
        return out, lse

    def check(self, q, k_cache, v_cache, block_table, k_scale=None, v_scale=None, k_offset=None,
              v_offset=None) -> None:
        """Metadata checks (no host sync): devices, dtypes, shapes, contiguity, and the plan."""
        named = dict(q=q, k_cache=k_cache, v_cache=v_cache, block_table=block_table, k_scale=k_scale,
                     v_scale=v_scale, k_offset=k_offset, v_offset=v_offset)
        check_wrapper_tensors(named, tensor_type=torch.Tensor, dtype=self.dtype, kv_dtype=self.kv_dtype,
                              int8_kv=self.kv_dtype == torch.int8, device=self.device,
                              on_device=lambda d: d.type == self.device.type)
        if block_table.dtype != torch.int32:
            raise TypeError(f"block_table: dtype must be int32 for the ascend backend, got {block_table.dtype}")
        for name in ("q", "k_cache", "v_cache", "block_table"):
            if not named[name].is_contiguous():
                raise ValueError(f"{name}: must be contiguous (the kernels address it densely)")
        if q.dim() != 3 or tuple(q.shape[1:]) != (self.num_q_heads, self.head_dim):
            raise ValueError(f"q: must be [T, {self.num_q_heads}, {self.head_dim}], got {tuple(q.shape)}")
        if k_cache.dim() != 4 or tuple(k_cache.shape[1:]) != (self.page_size, self.num_kv_heads, self.head_dim):
            raise ValueError(f"k_cache: must be [num_pages, {self.page_size}, {self.num_kv_heads}, {self.head_dim}], "
                             f"got {tuple(k_cache.shape)}")
        if tuple(v_cache.shape) != tuple(k_cache.shape):
            raise ValueError(f"v_cache: shape must equal k_cache's {tuple(k_cache.shape)}, got {tuple(v_cache.shape)}")
        p = self.host_plan
        if block_table.dim() != 2 or block_table.shape[0] != p.batch_size:
            raise ValueError(f"plan: made for {p.batch_size} requests, "
                             f"block_table has shape {tuple(block_table.shape)}")
        if q.shape[0] != p.num_rows:
            raise ValueError(f"plan: made for {p.num_rows} query rows, q has {q.shape[0]}")


def plan_seq_lens(plan: Plan) -> np.ndarray:
    """Per request, the end of its last work item: its seq_len (0 for an empty request)."""
    n = plan.num_valid_items
    seq = np.zeros(plan.batch_size, np.int64)
    np.maximum.at(seq, plan.item_request[:n], plan.item_kv_end[:n])
    return seq


def check_plan_matches(plan: Plan, planned_seq_lens: np.ndarray, seq_lens=None, query_start_loc=None) -> None:
    """Raise ``ValueError`` when the batch's lengths are not the ones the plan was made for."""
    if seq_lens is not None:
        sl = host(seq_lens).astype(np.int64)
        if sl.shape != planned_seq_lens.shape or not np.array_equal(sl, planned_seq_lens):
            bad = np.flatnonzero(sl != planned_seq_lens) if sl.shape == planned_seq_lens.shape else [0]
            raise ValueError(f"plan: made for other seq_lens (first difference at request {int(bad[0])}); "
                             "call plan() for this batch")
    if query_start_loc is not None and not np.array_equal(host(query_start_loc).astype(np.int32),
                                                          plan.query_start_loc):
        raise ValueError("plan: made for other query rows per request (query_start_loc differs)")


def decode_attention(q, k_cache, v_cache, block_table, seq_lens, query_start_loc=None, *, scale=None,
                     soft_cap=None, window_left=None, k_scale=None, v_scale=None, k_offset=None, v_offset=None,
                     plan: Plan | None = None, policy: str = "auto", out=None, lse=None,
                     profile: str = DEFAULT_PROFILE) -> tuple[torch.Tensor, torch.Tensor]:
    """Split-KV decode attention on an Ascend NPU: ``(out [T, Hq, D] in q's dtype, lse [T, Hq] float32)``.

    Shapes and semantics are ``docs/conventions.md``'s (the same call as ``cuda_ref``): ``q [T, Hq, D]``;
    ``k_cache``/``v_cache [num_pages, page_size, Hkv, D]`` in q's dtype or int8 (then ``k_scale``/
    ``v_scale`` float32 ``[Hkv]`` or ``[Hkv, D]``, optional offsets); ``block_table [B, max_pages]``
    int32; ``seq_lens [B]``; ``query_start_loc [B + 1]`` (default one row per request); lse natural log.

    The arguments are validated first (the shared checks, reading host copies of the lengths and the
    block table), then a plan is made unless given, then the kernels run. One call plans and runs;
    for a decode loop (and aclgraph) use :class:`AscendDecodeWrapper`.

    Raises:
        TypeError, ValueError: invalid arguments (the shared messages).
        RuntimeError: the operator cannot run here (says what is missing: torch_npu, an NPU, the
            built extension).
    """
    dims = check_decode_args(q, k_cache, v_cache, block_table, seq_lens, query_start_loc, scale=scale,
                             soft_cap=soft_cap, window_left=window_left, k_scale=k_scale, v_scale=v_scale,
                             k_offset=k_offset, v_offset=v_offset, supported_head_dims=supported_head_dims(),
                             backend="ascend")
    if q.device.type == "cpu":
        why = runtime_unavailable()
        raise RuntimeError(f"{QUALNAME}: q is a CPU tensor; the operator runs on an Ascend NPU"
                           + (f", and none is usable here: {why}" if why else " (move the tensors to 'npu')"))
    require_npu_kernel(q.device)
    w = AscendDecodeWrapper(dims.num_q_heads, dims.num_kv_heads, dims.head_dim, dims.page_size, dtype=q.dtype,
                            kv_dtype=k_cache.dtype, device=q.device, profile=profile, policy=policy)
    sl = host(seq_lens)
    qsl = None if query_start_loc is None else host(query_start_loc)
    const = dict(scale=scale, soft_cap=soft_cap, window_left=window_left, max_pages=dims.max_pages,
                 num_pages=dims.num_pages)
    if plan is None:
        w.plan(sl, query_start_loc=qsl, **const)
    else:
        check_plan_matches(plan, plan_seq_lens(plan), sl, qsl)
        w.set_plan(plan, seq_lens=sl, **const)
    bt = block_table if block_table.dtype == torch.int32 else block_table.to(torch.int32)
    return w.run(q, k_cache, v_cache, bt, scale=scale, soft_cap=soft_cap, window_left=window_left,
                 k_scale=k_scale, v_scale=v_scale, k_offset=k_offset, v_offset=v_offset, out=out, lse=lse)


def _dtype_name(dt: torch.dtype) -> str:
    return str(dt).replace("torch.", "")
