"""``DecodeWrapper``: plan once per batch on the host, run on the device (the FlashInfer split).

    w = DecodeWrapper(num_q_heads=32, num_kv_heads=8, head_dim=128, page_size=16, dtype=torch.bfloat16)
    w.plan(seq_lens_host)                       # host: shared plan, device copy, buffers (may allocate)
    out, lse = w.run(q, k_cache, v_cache, block_table, seq_lens)   # device: no allocation, no sync

With ``graph_stable=True`` the plan has fixed shapes (``max_splits`` slots per row, a fixed number of
work items), every buffer is allocated by the first ``plan()`` and refreshed in place by later ones,
so ``run()`` can be captured in a CUDA graph once and replayed while the lengths change:

    w.plan(lens0); g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g): out, lse = w.run(...)
    seq_lens.copy_(new_lens); w.plan(new_lens_host); g.replay()
"""

from __future__ import annotations

import torch

from splitkv_common.plan import Plan, PlannedWrapper, PlanSpec
from splitkv_common.torch_io import as_torch_dtype
from splitkv_common.validation import check_decode_args, check_gqa, check_wrapper_tensors, host, normalize_window

from . import INTERPRET
from .launch import DevicePlan, KernelConfig, launch_decode

class DecodeWrapper(PlannedWrapper):
    """Split-KV decode attention over a paged KV cache ``[num_pages, page_size, Hkv, D]``.

    Args:
        num_q_heads, num_kv_heads, head_dim, page_size: the model's shape (``Hq % Hkv == 0``).
        dtype: q's and the output's dtype; ``kv_dtype``: the cache's (default ``dtype``; or int8).
        device: where buffers live (default: the current CUDA device, else the CPU + interpreter).
        profile: device profile of the ``auto`` planner; policy: ``auto``, ``none``, ``size:N``, ``count:N``.
        graph_stable: fixed-shape plans for graph replay (``max_splits`` and ``max_work_items`` bound them).
        fuse_merge: merge in stage 1 (the last split to finish merges, with a per-(request, KV head)
            counter) instead of a second launch; default: the second launch (the faster on the H200,
            docs/perf-notes.md). Both give bitwise the same result.
        config: stage-1 tile / warps / stages (default by head dim and plan, see
            :func:`cuda_ref.launch.default_config`; fixed-size and no-split plans keep their
            batch invariance).
    """

    def __init__(self, num_q_heads: int, num_kv_heads: int, head_dim: int, page_size: int, *,
                 dtype=torch.bfloat16, kv_dtype=None, device=None, profile: str = "h200", policy: str = "auto",
                 graph_stable: bool = False, max_splits: int | None = None, max_work_items: int | None = None,
                 min_split_tokens: int | None = None, fuse_merge: bool | None = None,
                 config: KernelConfig | None = None):
        check_gqa(num_q_heads, num_kv_heads)
        self.dtype = as_torch_dtype(dtype)
        self.kv_dtype = self.dtype if kv_dtype is None else as_torch_dtype(kv_dtype)
        self.device = torch.device(device if device is not None else ("cpu" if INTERPRET else "cuda"))
        self.spec = PlanSpec(int(num_q_heads), int(num_kv_heads), int(head_dim), int(page_size),
                             kv_elem_bytes=torch.empty(0, dtype=self.kv_dtype).element_size(), policy=policy,
                             device=profile, graph_stable=graph_stable, max_splits=max_splits,
                             max_work_items=max_work_items, min_split_tokens=min_split_tokens)
        self.fuse_merge, self.config = fuse_merge, config
        self.merge = True  # False leaves the merge launch out (benchmarks time stage 1 alone)
        self.pdl: bool | None = None  # merge by programmatic dependent launch; None: where available
        self.host_plan: Plan | None = None
        self.dplan: DevicePlan | None = None
        self._buffers: dict[str, torch.Tensor] = {}

    # -- host side -----------------------------------------------------------------------------
    def plan(self, seq_lens, q_lens=None, query_start_loc=None, window_left=None) -> Plan:
        """Make the shared plan for a batch (host arrays) and copy it to the device."""
        plan = self.plan_spec().make(host(seq_lens), None if q_lens is None else host(q_lens),
                                     None if query_start_loc is None else host(query_start_loc), window_left)
        self.set_plan(plan)
        return plan

    def set_plan(self, plan: Plan) -> None:
        """Use a plan made elsewhere (the parity harness plans every backend the same way)."""
        if plan.num_kv_heads != self.num_kv_heads or plan.page_size != self.page_size:
            raise ValueError(f"plan: made for Hkv={plan.num_kv_heads}, page_size={plan.page_size}; this wrapper "
                             f"has Hkv={self.num_kv_heads}, page_size={self.page_size}")
        group = self.num_q_heads // self.num_kv_heads
        reuse = self.dplan if (self.graph_stable and self.dplan is not None) else None
        self.dplan = DevicePlan.from_plan(plan, group, self.device, out=reuse)
        self.host_plan = plan
        T, Hq, D = plan.num_rows, self.num_q_heads, self.head_dim
        need = {
            "out": ((T, Hq, D), self.dtype), "lse": ((T, Hq), torch.float32),
            "part_o": ((max(plan.num_slots, 1), Hq, D), torch.float32),
            "part_lse": ((max(plan.num_slots, 1), Hq), torch.float32),
            "counters": ((max(plan.batch_size * self.num_kv_heads * self.dplan.row_blocks, 1),), torch.int32),
        }
        for name, (shape, dt) in need.items():
            buf = self._buffers.get(name)
            if buf is None or tuple(buf.shape) != shape:
                if reuse is not None and buf is not None:
                    raise ValueError(f"plan: buffer {name} changed shape under a graph-stable plan")
                self._buffers[name] = torch.zeros(shape, dtype=dt, device=self.device)

    def workspace_bytes(self) -> int:
        """Bytes of the partial buffers (and merge counters) the current plan needs."""
        if self.host_plan is None:
            return 0
        extra = self._buffers["counters"].numel() * 4 if self._fused() else 0
        return self.host_plan.workspace_bytes(self.num_q_heads, self.head_dim) + extra

    # -- device side ---------------------------------------------------------------------------
    def run(self, q, k_cache, v_cache, block_table, seq_lens, query_start_loc=None, *, scale=None,
            soft_cap=None, window_left=None, k_scale=None, v_scale=None, k_offset=None, v_offset=None,
            validate: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """Attention for the planned batch: ``(out [T, Hq, D] in q's dtype, lse [T, Hq] float32)``.

        Shapes, dtypes, devices and the plan's match with the batch are checked without reading
        device memory; ``validate=True`` adds the shared value checks (block-table ranges, lengths:
        a host sync, so not inside a graph). The returned tensors are the wrapper's own buffers,
        overwritten by the next ``run()``.
        """
        if self.dplan is None:
            raise RuntimeError("plan: call plan() (or set_plan()) before run()")
        if query_start_loc is None:
            query_start_loc = self._default_qsl(q.shape[0], block_table.shape[0], q.device)
        window_left = normalize_window(window_left)
        self.check(q, k_cache, v_cache, block_table, seq_lens, query_start_loc, k_scale, v_scale, k_offset, v_offset)
        if validate:
            check_decode_args(q, k_cache, v_cache, block_table, seq_lens, query_start_loc, scale=scale,
                              soft_cap=soft_cap, window_left=window_left, k_scale=k_scale, v_scale=v_scale,
                              k_offset=k_offset, v_offset=v_offset, backend="triton")
            self.host_plan.check_batch(host(seq_lens), host(query_start_loc))
        b = self._buffers
        launch_decode(q, k_cache, v_cache, block_table, seq_lens, query_start_loc, self.dplan, b["out"], b["lse"],
                      b["part_o"], b["part_lse"], b["counters"],
                      scale=float(scale) if scale is not None else self.head_dim ** -0.5, soft_cap=soft_cap,
                      window_left=window_left, k_scale=k_scale, v_scale=v_scale, k_offset=k_offset,
                      v_offset=v_offset, config=self.config, fuse_merge=self._fused(), interpret=INTERPRET,
                      merge=self.merge, batch_invariant=self.host_plan.policy.kind in ("fixed_size", "none"),
                      pdl=self.pdl)
        return b["out"], b["lse"]

    def _fused(self) -> bool:
        return bool(self.fuse_merge)

    def _default_qsl(self, T, B, device):
        if T != B:
            raise ValueError(f"query_start_loc: required when q has {T} rows for {B} requests")
        buf = self._buffers.get("default_qsl")
        if buf is None or buf.numel() != B + 1:
            buf = torch.arange(B + 1, dtype=torch.int32, device=device)
            self._buffers["default_qsl"] = buf
        return buf

    def check(self, q, k_cache, v_cache, block_table, seq_lens, query_start_loc,
              k_scale=None, v_scale=None, k_offset=None, v_offset=None) -> None:
        """Metadata checks (no host sync): dtypes, devices, layouts, and the plan against the batch."""
        named = dict(q=q, k_cache=k_cache, v_cache=v_cache, block_table=block_table, seq_lens=seq_lens,
                     query_start_loc=query_start_loc, k_scale=k_scale, v_scale=v_scale, k_offset=k_offset,
                     v_offset=v_offset)
        check_wrapper_tensors(named, tensor_type=torch.Tensor, dtype=self.dtype, kv_dtype=self.kv_dtype,
                              int8_kv=self.kv_dtype == torch.int8, device=self.device,
                              on_device=lambda d: d == self.device or d.type == self.device.type == "cuda")
        for name in ("block_table", "seq_lens", "query_start_loc"):
            if named[name].dtype != torch.int32:
                raise TypeError(f"{name}: dtype must be int32 for the triton backend, got {named[name].dtype}")
        for name in ("q", "k_cache", "v_cache"):
            x = named[name]
            if x.dim() >= 1 and x.stride(-1) != 1:
                raise ValueError(f"{name}: the last (head-dim) axis must be contiguous, got strides {x.stride()}")
        if v_cache.stride() != k_cache.stride():
            raise ValueError(f"v_cache: strides must equal k_cache's {k_cache.stride()}, got {v_cache.stride()}")
        self.spec.check_shapes(self.host_plan, q, k_cache, v_cache, block_table, seq_lens, query_start_loc)
        for name, x in (("k_offset", k_offset), ("v_offset", v_offset)):
            if x is not None and (k_offset is None or v_offset is None):
                raise ValueError("k_offset, v_offset: give both or neither")
        for name, x in (("k_scale", k_scale), ("v_scale", v_scale), ("k_offset", k_offset), ("v_offset", v_offset)):
            if x is not None:
                if x.dtype != torch.float32:
                    raise TypeError(f"{name}: dtype must be float32, got {x.dtype}")
                if tuple(x.shape) not in ((self.num_kv_heads,), (self.num_kv_heads, self.head_dim)) or \
                        tuple(x.shape) != tuple(k_scale.shape) or (x.dim() == 2 and x.stride(1) != 1):
                    raise ValueError(f"{name}: must be [Hkv] or contiguous [Hkv, D] like k_scale, got {tuple(x.shape)}")
