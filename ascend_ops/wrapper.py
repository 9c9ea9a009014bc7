"""``AscendDecodeWrapper``: plan once per batch on the host, run the Ascend kernels on the NPU.

    w = AscendDecodeWrapper(num_q_heads=32, num_kv_heads=8, head_dim=128, page_size=128, dtype=torch.bfloat16)
    w.plan(seq_lens_host, scale=scale, max_pages=block_table.shape[1], num_pages=k_cache.shape[0])
    out, lse = w.run(q, k_cache, v_cache, block_table)   # device: no allocation, no host sync

``plan()`` builds the shared plan and the ``plan``/``tiling`` device buffers (:mod:`ascend_ops.tiling`);
``run()`` enqueues ``torch.ops.splitkv_ascend.decode_attention`` (:mod:`ascend_ops.ops`) on them,
so it can be captured in an aclgraph (docs/npu.md, "Plan, run and aclgraph").

:func:`decode_attention`: one call (validate, plan, run) through a wrapper.
"""

from __future__ import annotations

import numpy as np
import torch

from splitkv_common.device_errors import describe_errors, merge_records
from splitkv_common.guards import ThreadOwner, check_validate
from splitkv_common.npu_probe import torch_npu_imported
from splitkv_common.torch_io import as_torch_dtype, grown_store, torch_dtype_name
from splitkv_common.plan_layout import Plan
from splitkv_common.plan_spec import PlannedWrapper, PlanSpec
from splitkv_common.validation import (check_decode_args, check_gqa, check_scalars, check_wrapper_tensors, host,
                                       normalize_window)

from . import ops
from .ops import QUALNAME, pack_kv_quant
from .runtime import require_npu_kernel, resolve_device, runtime_unavailable
from .support import launch_profile, supported_head_dims, unsupported_reason
from .tiling import TILING_BYTES

# int32 words of the meta buffer that hold the tiling (its bytes, a multiple of 4, rounded up to 32): the
# plan words follow
assert TILING_BYTES % 4 == 0
_TILING_WORDS = -(-TILING_BYTES // 32) * 8


class AscendDecodeWrapper(PlannedWrapper, ThreadOwner):
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
        profile: device profile of the planner (default: on an NPU the chip's own, with the core
            counts the device reports, :func:`~ascend_ops.support.npu_profile`; elsewhere
            :data:`~ascend_ops.support.DEFAULT_PROFILE`, ``910b2``; or ``910b3``...); policy: ``auto``, ``none``, ``size:N``, ``count:N``;
            graph_stable, max_splits, max_work_items, min_split_tokens: as
            :func:`splitkv_common.plan.make_plan`.
        workspace: optional 1-D float32 store on ``device`` the kernels' workspace is taken from while it
            is large enough (a larger plan grows a store of its own): wrappers whose launches run one
            after another on one stream (the graphs of several sizes, which replay one at a time) can
            share one, sized for the largest of them.

    The attention's constants (``scale``, ``soft_cap``, ``window_left``) and the page counts are
    part of the tiling: give them to ``plan()`` so that ``run()`` does no host work.

    A plan knows what it was made for: ``run()`` with a ``window_left`` other than the plan's is
    refused (the plan's ranges cover exactly the planned window's span, which the tiling requires);
    another ``scale`` / ``soft_cap`` rebuilds the tiling (host work). A refused ``plan()`` /
    ``set_plan()``, or a ``run()`` whose tiling rebuild is refused, leaves the previous plan, tiling
    and buffers in use.

    Single-threaded: the thread of the first ``plan()`` / ``set_plan()`` owns the wrapper; a call
    from another thread raises ``RuntimeError`` (:class:`splitkv_common.guards.ThreadOwner`).
    """

    def __init__(self, num_q_heads: int, num_kv_heads: int, head_dim: int, page_size: int, *,
                 dtype=torch.bfloat16, kv_dtype=None, device=None, profile: str | None = None, policy: str = "auto",
                 graph_stable: bool = False, max_splits: int | None = None, max_work_items: int | None = None,
                 min_split_tokens: int | None = None, device_split_tokens: int | None = None,
                 workspace: torch.Tensor | None = None, shared_prefix_mode: str = "auto"):
        check_gqa(num_q_heads, num_kv_heads)
        from .shared_prefix_op import check_mode

        self.shared_prefix_mode = check_mode(shared_prefix_mode)
        if device_split_tokens is not None:
            S = int(device_split_tokens)
            if not graph_stable:
                raise ValueError("device_split_tokens: needs graph_stable=True (fixed slots per query row)")
            if S <= 0 or S % int(page_size):
                raise ValueError(f"device_split_tokens: must be a positive multiple of page_size {page_size}, got {S}")
            if policy not in ("auto", f"size:{S}"):
                raise ValueError(f"policy: {policy!r} with device_split_tokens={S}; the split size is fixed (size:{S})")
            policy = f"size:{S}"
        #: graph mode: the split size fixed at capture; the kernels derive their work from seq_lens on the device
        self.device_split_tokens = int(device_split_tokens or 0)
        self.dtype = as_torch_dtype(dtype)
        self.kv_dtype = self.dtype if kv_dtype is None else as_torch_dtype(kv_dtype)
        why = unsupported_reason(int(head_dim), torch_dtype_name(self.dtype), torch_dtype_name(self.kv_dtype))
        if why:
            raise ValueError(f"{QUALNAME}: {why}")
        self.device = resolve_device(device)
        require_npu_kernel(self.device)
        profile = launch_profile(self.device, profile)  # on an NPU: the chip's, with its own core counts
        self.spec = PlanSpec(int(num_q_heads), int(num_kv_heads), int(head_dim), int(page_size),
                             kv_elem_bytes=torch.empty(0, dtype=self.kv_dtype).element_size(), policy=policy,
                             device=profile, graph_stable=graph_stable, max_splits=max_splits,
                             max_work_items=max_work_items, min_split_tokens=min_split_tokens)
        self.host_plan: Plan | None = None
        self.tiling: dict | None = None
        self._buffers: dict[str, torch.Tensor] = {}
        self._stores: dict[str, torch.Tensor] = {}   # what the buffers are views of (_views_for)
        self._views: dict = {}        # the buffers' views by sizes (_views_for)
        self._sizes = None            # the sizes of the buffers in use
        self._builder = None   # the TilingBuilder of the current settings
        self._builder_key = None   # (attention constants, block-table width) it was made for
        self._staging: "torch.Tensor | None" = None   # pinned host copy of the meta buffer (NPU only)
        self._staging_event = None
        self._staging_np = None       # the host side of the meta copy (_host_meta)
        self._uploaded = None         # (address, words) of the meta buffer the last plan's words went into
        self._attn: tuple = (None, None, None)  # (scale, soft_cap, window_left) of the tiling
        self._pages: tuple | None = None  # (max_pages, num_pages) of the tiling
        self.kernel_reason = ""  # why the split stage of the current tiling serves the batch, in words
        self._stale = True
        #: the planner's decision of the last plan() given a shared_prefix (None: none was given)
        self.shared_prefix_plan = None
        self._route = None   # the shared-prefix route in use (ascend_ops.shared_prefix_op), or None
        if workspace is not None:   # a store shared with other wrappers whose launches never overlap it
            if (not isinstance(workspace, torch.Tensor) or workspace.dtype != torch.float32 or workspace.dim() != 1
                    or workspace.device != self.device):
                raise ValueError(f"workspace: must be a 1-D float32 tensor on {self.device}, got "
                                 f"{getattr(workspace, 'dtype', type(workspace).__name__)} "
                                 f"{list(getattr(workspace, 'shape', []))} on {getattr(workspace, 'device', None)}")
            self._stores["workspace"] = workspace

    # -- host side ---------------------------------------------------------------------------
    def plan(self, seq_lens, q_lens=None, query_start_loc=None, window_left=None, *, scale=None,
             soft_cap=None, max_pages: int | None = None, num_pages: int | None = None, shared_prefix=None,
             block_table=None, shared_prefix_mode: str | None = None):
        """Plan a batch from host lengths and prepare the device buffers (may allocate). A
        graph-stable plan returned here stays valid until the second ``plan()`` after it, which
        writes into its buffer. A refused batch leaves the previous plan in use.

        ``shared_prefix`` (a :class:`splitkv_common.shared_prefix.SharedPrefix`, checked as the
        Triton ``SharedPrefixWrapper.plan`` checks it; ``block_table`` on the host gives the prefix's
        pages where a group does not): the shared planner decides between the shared-prefix route
        and the plain one for this wrapper's device profile (``shared_prefix_mode``: ``auto``, ``on``,
        ``off``; default the wrapper's) and ``plan()`` returns its
        :class:`~splitkv_common.shared_prefix.SharedPrefixPlan` (also ``self.shared_prefix_plan``; its
        ``reason`` says why). ``run()`` then runs that route (:mod:`ascend_ops.shared_prefix_op`)."""
        self._claim_thread("plan")
        check_scalars(scale, soft_cap, window_left)
        if shared_prefix is not None:
            return self._plan_shared(seq_lens, q_lens, query_start_loc, window_left, shared_prefix, block_table,
                                     shared_prefix_mode, scale=scale, soft_cap=soft_cap, max_pages=max_pages,
                                     num_pages=num_pages)
        if block_table is not None or shared_prefix_mode is not None:
            raise ValueError("block_table, shared_prefix_mode: only with shared_prefix")
        p = self.make_plan(host(seq_lens), None if q_lens is None else host(q_lens),
                           None if query_start_loc is None else host(query_start_loc), window_left)
        # made by the shared planner: valid by construction (tests/test_planner*.py), not checked again
        self.set_plan(p, seq_lens=seq_lens, scale=scale, soft_cap=soft_cap, window_left=window_left,
                      max_pages=max_pages, num_pages=num_pages, validate=False)
        self.shared_prefix_plan = None
        return p

    def _plan_shared(self, seq_lens, q_lens, query_start_loc, window_left, shared_prefix, block_table, mode, **const):
        """``plan(..., shared_prefix=...)``: :func:`ascend_ops.shared_prefix_op.plan_wrapper`."""
        from .shared_prefix_op import plan_wrapper

        return plan_wrapper(self, seq_lens, q_lens, query_start_loc, window_left, shared_prefix, block_table, mode,
                            **const)

    def set_plan(self, plan: Plan, *, seq_lens=None, scale=None, soft_cap=None, window_left=None,
                 max_pages: int | None = None, num_pages: int | None = None, validate: bool = True) -> None:
        """Use a plan made elsewhere (the parity harness plans every backend the same way).

        ``seq_lens`` (host) default to the plan's coverage (the last item's end per request); given,
        they are checked against it (``validate``) or, with ``validate=False``, taken as the lengths
        the plan was made from (what ``plan()`` passes).
        ``scale``/``soft_cap``/``window_left`` are the attention's constants (``scale`` None:
        ``1/sqrt(D)``). ``max_pages``/``num_pages`` (block-table width, pages in the cache) default
        to the previous plan's, else are read from the tensors at the first ``run()``. When all are
        known the device buffers are refreshed now, so that ``run()`` does no host work.
        All or nothing: a plan refused (by its checks or by the tiling of the buffers, e.g. a
        graph-stable launch that would change) leaves the previous plan, tiling and buffers in use.
        """
        self._claim_thread("set_plan")
        check_validate(validate, allow_auto=False)
        self._route = self.shared_prefix_plan = None   # a plan of its own: no shared-prefix route in use
        check_scalars(scale, soft_cap, window_left)
        if not isinstance(plan, Plan):
            raise TypeError(f"plan: expected a splitkv_common.plan.Plan, got {type(plan).__name__}")
        if plan.num_kv_heads != self.num_kv_heads or plan.page_size != self.page_size:
            raise ValueError(f"plan: made for Hkv={plan.num_kv_heads}, page_size={plan.page_size}; this wrapper "
                             f"has Hkv={self.num_kv_heads}, page_size={self.page_size}")
        # a plan from outside is trusted by the kernels: items, ranges and slots are checked here
        if validate:  # False only for a plan fresh from the shared planner (valid by construction)
            plan.validate(None if seq_lens is None else host(seq_lens), window_left=window_left,
                          num_kv_heads=self.num_kv_heads)
        # the lengths the plan was made for: given, or read back from the plan (its coverage)
        seq = (plan.covered_seq_lens() if seq_lens is None else np.asarray(host(seq_lens), np.int64).reshape(-1))
        before = self._plan_state()
        self._retire_plan(plan)
        self.host_plan = plan
        self._seq_lens = seq
        self._attn = (None if scale is None else float(scale), None if soft_cap is None else float(soft_cap),
                      normalize_window(window_left))
        old = self._pages or (None, None)
        self._pages = (max_pages if max_pages is not None else old[0], num_pages if num_pages is not None else old[1])
        self._stale = True
        if None not in self._pages:
            try:
                self._refresh()
            except BaseException:
                # the tiling refused this plan before writing a word (its claim runs first): the
                # previous plan, which the buffers still hold, stays in use
                self._restore_plan_state(before, plan)
                raise

    def _plan_state(self) -> tuple:
        """What :meth:`set_plan` changes before its tiling is built (restored if the tiling refuses)."""
        return (self.host_plan, self._seq_lens if hasattr(self, "_seq_lens") else None, self._attn, self._pages,
                self._stale, self._mine, self._spare)

    def _restore_plan_state(self, state: tuple, refused: Plan) -> None:
        """Put back :meth:`_plan_state`; the refused plan's buffers (a graph-stable plan made into the
        spare's) become the spare again when the planner made it."""
        self.host_plan, self._seq_lens, self._attn, self._pages, _, self._mine, spare = state
        self._spare = refused if refused is self._made else spare
        self._stale = True   # the next run() rebuilds the restored plan's words (host work, once)

    def _refresh(self) -> None:
        """Build the tiling and the plan words on the host (:class:`ascend_ops.tiling.TilingBuilder`,
        kept while the settings are the same) and copy both into the device with one copy."""
        from . import tiling as tl

        p = self.host_plan
        max_pages, num_pages = self._pages
        if self._builder is None or self._builder_key != (self._attn, max_pages):
            # a new builder when the attention constants or the block-table width change (the rest of
            # its settings are the wrapper's own)
            scale, soft_cap, window_left = self._attn
            self._builder = tl.TilingBuilder(
                num_q_heads=self.num_q_heads, head_dim=self.head_dim, page_size=self.page_size, max_pages=max_pages,
                dtype=torch_dtype_name(self.dtype), kv_dtype=torch_dtype_name(self.kv_dtype),
                scale=self.head_dim ** -0.5 if scale is None else scale, soft_cap=soft_cap, window_left=window_left,
                profile=self.profile,
                # a captured launch keeps its block count: graph-stable plans use every core
                all_cores=self.graph_stable, device_split_tokens=self.device_split_tokens,
                # the fused mixed AIC + AIV launch where support.mixed_kernel_unsupported allows it,
                # else the vector split stage + combine (the reason is kept: self.kernel_reason)
                kernel="auto")
            self._builder_key = (self._attn, max_pages)
        uploaded, self._uploaded = self._uploaded, None   # set again once this plan's words are uploaded

        def claim(t: dict, n: int) -> np.ndarray:
            # before any word is written: the checks, then the buffers of these sizes (the tiling then
            # the plan words in one int32 buffer, "meta", the words from a 32-byte boundary, seen by the
            # kernels as two tensors; the workspace; the outputs), and where the builder writes the
            # words: the host side of the meta copy, past its tiling
            if self.graph_stable and self.tiling is not None and tl.launches(self.tiling) != tl.launches(t):
                raise ValueError(f"plan: the launch changed ({tl.launches(self.tiling)} -> {tl.launches(t)}) under "
                                 f"a graph-stable plan ({t['kernelReason']}); a captured graph keeps its kernel")
            sizes = (_TILING_WORDS + n, max(int(t["workspaceBytes"]) // 4, 1), p.num_rows)
            if sizes != self._sizes:
                if self.graph_stable and self._sizes is not None:
                    self._graph_stable_sizes(sizes)
                self._buffers.update(self._views_for(sizes))
                self._sizes = sizes
            return self._host_meta()[2]

        t, tiling_bytes, words = self._builder.build(p, self._seq_lens, num_pages, into=claim)
        self.kernel_reason = t.pop("kernelReason")
        self._upload_meta(tiling_bytes, words.size, self._builder.fresh_words, uploaded)
        self.tiling = t
        self._stale = False

    def _graph_stable_sizes(self, sizes: tuple) -> None:
        """Raise ``ValueError`` naming the buffer whose size ``sizes`` changes under a graph-stable plan."""
        for what, old, new in zip(("plan", "workspace", "out"), self._sizes, sizes):
            if old == new:
                continue
            if what == "out":
                raise ValueError(f"plan: out changed shape ({old} -> {new} rows) under a graph-stable plan; a "
                                 "captured graph needs the same query rows every step")
            raise ValueError(f"plan: buffer {what} changed size ({old} -> {new}) under a graph-stable plan; "
                             "give max_work_items / max_splits that bound every batch")

    def _views_for(self, sizes: tuple) -> dict:
        """The buffers of ``sizes = (meta words, workspace floats, query rows)``: views of stores that grow
        by half when too small, so that plans of other sizes (an eager batch changing every step)
        allocate nothing once they are large enough; the views kept per sizes (at most 16)."""
        from . import tiling as tl

        hit = self._views.get(sizes)
        if hit is not None:
            return hit
        n_meta, n_ws, T = sizes
        Hq, D = self.num_q_heads, self.head_dim
        grown = False
        for name, n, rest, dt in (("meta", n_meta, (), torch.int32), ("workspace", n_ws, (), torch.float32),
                                  ("out", T, (Hq, D), self.dtype), ("lse", T, (Hq,), torch.float32)):
            store = self._stores.get(name)
            self._stores[name] = grown_store(store, n, rest, dt, self.device)
            grown = grown or self._stores[name] is not store
            if name == "workspace" and store is not None and self._stores[name] is not store:
                e = tl.ERROR_BYTES // 4  # the counts the kernels kept so far move with the workspace (zeroed store)
                self._stores[name][:e].copy_(store[:e])
        if grown or len(self._views) >= 16:
            self._views.clear()
        st = self._stores
        meta = st["meta"][:n_meta]
        hit = self._views[sizes] = dict(meta=meta, tiling=meta[:tl.TILING_BYTES // 4].view(torch.uint8),
                                        plan=meta[_TILING_WORDS:], workspace=st["workspace"][:n_ws],
                                        out=st["out"][:T], lse=st["lse"][:T])
        return hit

    def _host_meta(self) -> tuple:
        """The host side of the ``meta`` copy, ready to be written: ``(int32 NumPy array at least as
        large as the meta store, its tensor, the array past the tiling words, the meta store)``, made
        once per meta store (the builder knows a graph-stable stream's words by that third array
        being the same object): on the CPU the store itself; elsewhere a host buffer (pinned on an
        NPU, where the last copy from it is waited for first: an event recorded after each copy
        guards it)."""
        npu = self.device.type != "cpu" and torch_npu_imported()
        meta, h = self._stores["meta"], self._staging_np
        if h is None or h[3] is not meta:
            store = meta if self.device.type == "cpu" else self._staging
            if store is None or store.numel() < meta.numel():
                store = self._staging = torch.empty(meta.numel(), dtype=torch.int32, pin_memory=npu)
            a = store.numpy()
            h = self._staging_np = (a, store, a[_TILING_WORDS:], meta)
        if npu and self._staging_event is not None:
            self._staging_event.synchronize()  # the previous copy from the staging buffer is done
        return h

    def _upload_meta(self, tiling_bytes: bytes, n_words: int, fresh: int, uploaded) -> None:
        """The tiling bytes into the host side of the ``meta`` copy (:meth:`_host_meta`, where the
        builder has just written the ``n_words`` plan words) and the copy into the device: one copy,
        ordered on the current stream, asynchronous from pinned memory on an NPU (an event recorded
        after it). Where the previous plan's words went into the same device buffer (``uploaded``: its
        ``(address, words)`` then), only the first ``fresh`` words are copied: a graph-stable plan's
        padding items stay as they are on the device (``TilingBuilder.fresh_words``). On the CPU the
        host side is the device buffer: nothing to copy."""
        dst = self._buffers["meta"]
        n = dst.numel()
        a, store, _, _ = self._staging_np
        a[:_TILING_WORDS].view(np.uint8)[:len(tiling_bytes)] = np.frombuffer(tiling_bytes, np.uint8)
        mark = (dst.data_ptr(), n)
        m = _TILING_WORDS + (fresh if uploaded == mark else n_words)
        npu = self.device.type != "cpu" and torch_npu_imported()
        if self.device.type != "cpu":
            dst[:m].copy_(store[:m], non_blocking=npu)
        self._uploaded = mark
        if npu:
            if self._staging_event is None:   # made once, re-recorded after each copy
                self._staging_event = torch.npu.Event()
            self._staging_event.record()

    def workspace_bytes(self) -> int:
        """Bytes of the kernels' workspace for the current plan (0 before the first run/plan)."""
        if self._route is not None:
            return self._route.workspace_bytes()
        return 0 if self.tiling is None else int(self.tiling["workspaceBytes"])

    def check_errors(self) -> None:
        """Raise ``RuntimeError`` if a kernel since the last call met values it could not honour,
        naming each rule broken (:func:`splitkv_common.device_errors.describe_errors`): a block-table
        entry outside ``[0, num_pages)`` (masked: its tokens were read as absent; the first request,
        logical page and page id seen), and in graph mode a device length that is negative, past
        the block-table row or past what the plan covers (read up to it). The kernels count these in
        the workspace's error section (one slot per launched block); the count is reset either
        way. Reads device memory: a host sync (call it where a sync is acceptable, e.g. every N
        steps or in a debug mode)."""
        from . import tiling as tl

        if self._route is not None:
            return self._route.check_errors()
        store = self._stores.get("workspace")
        if store is None:
            return
        e = store[:tl.ERROR_BYTES // 4]
        slots = e.view(torch.int32).cpu().numpy().reshape(tl.ERROR_SLOTS, tl.ERROR_SLOT_BYTES // 4)
        num_pages = 0 if self.tiling is None else int(self.tiling["numPages"])
        msg = describe_errors(merge_records(slots), num_pages, counted="block-table reads")
        if msg:
            e.zero_()
            raise RuntimeError(msg)

    # -- device side -------------------------------------------------------------------------
    def run(self, q, k_cache, v_cache, block_table, seq_lens=None, query_start_loc=None, *, scale=None,
            soft_cap=None, window_left=None, k_scale=None, v_scale=None, k_offset=None, v_offset=None,
            out=None, lse=None, validate: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """Attention for the planned batch: ``(out [T, Hq, D] in q's dtype, lse [T, Hq] float32)``.

        Metadata only is checked (no device memory is read). The kernels take the lengths from the
        plan (``plan()``'s host ``seq_lens``); ``validate=True`` also runs the shared value checks
        and compares ``seq_lens``/``query_start_loc`` with the plan (host syncs: not in a graph);
        ``"auto"``: the same when q is on the CPU; anything else is refused. The checks run here,
        once: the kernels (the CPU kernel too) check only the operator's contract, so without
        ``validate`` an out-of-range page id is not refused (on the CPU it is masked).
        ``scale``/``soft_cap``/``window_left`` default to the planned ones; another ``scale`` or
        ``soft_cap`` rebuilds the tiling (host work: do it before a capture, not inside); another
        ``window_left`` is refused (the plan's ranges cover its window's span).
        """
        self._claim_thread("run")
        if validate is not False:
            validate = check_validate(validate) is True or (validate == "auto" and q.device.type == "cpu")
        if self._route is not None:   # plan(..., shared_prefix=...) chose the shared-prefix route
            check_scalars(scale, soft_cap, window_left)
            return self._route.run(q, k_cache, v_cache, block_table, seq_lens, query_start_loc, scale=scale,
                                   soft_cap=soft_cap, window_left=window_left, k_scale=k_scale, v_scale=v_scale,
                                   k_offset=k_offset, v_offset=v_offset, out=out, lse=lse, validate=validate)
        if self.host_plan is None:
            raise RuntimeError("plan: call plan() (or set_plan()) before run()")
        check_scalars(scale, soft_cap, window_left)
        planned = self._attn
        if window_left is not None and normalize_window(window_left) != planned[2]:
            # the tiling takes a plan whose ranges cover exactly the window's span (Plan.validate)
            raise ValueError(f"window_left: run with {window_left!r}, the plan was made for "
                             f"{'no window' if planned[2] is None else planned[2]} (its ranges cover that window's "
                             f"span); plan() again with this window")
        attn = (planned[0] if scale is None else float(scale), planned[1] if soft_cap is None else float(soft_cap),
                planned[2] if window_left is None else normalize_window(window_left))
        for name, x, rank in (("block_table", block_table, 2), ("k_cache", k_cache, 4)):
            if not isinstance(x, torch.Tensor) or x.dim() != rank:
                raise ValueError(f"{name}: must be a {rank}-D tensor, got "
                                 f"{list(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__}")
        pages = (int(block_table.shape[1]), int(k_cache.shape[0]))
        if self._stale or attn != planned or pages != self._pages:
            # first run() after a plan() that did not know the pages, or other constants:
            # host work and a copy, so not inside a graph capture (docs/npu.md); refused, the
            # wrapper keeps its constants and pages
            before = (self._attn, self._pages, self._stale)
            self._attn, self._pages = attn, pages
            try:
                self._refresh()
            except BaseException:
                self._attn, self._pages, _ = before
                self._stale = True   # rebuilt from the kept constants at the next run()
                raise
        self.check(q, k_cache, v_cache, block_table, k_scale, v_scale, k_offset, v_offset)
        if validate:
            # omitted lengths and rows are the planned ones (what the kernels read)
            sl = seq_lens if seq_lens is not None else torch.from_numpy(self._seq_lens)
            qsl = query_start_loc if query_start_loc is not None else torch.from_numpy(self.host_plan.query_start_loc)
            check_decode_args(q, k_cache, v_cache, block_table, sl, qsl, scale=attn[0], soft_cap=attn[1],
                              window_left=attn[2], k_scale=k_scale, v_scale=v_scale, k_offset=k_offset,
                              v_offset=v_offset, supported_head_dims=supported_head_dims(), backend="ascend")
            self.host_plan.check_batch(None if seq_lens is None else host(seq_lens),
                                       None if query_start_loc is None else host(query_start_loc))
        b = self._buffers
        out = b["out"] if out is None else out
        lse = b["lse"] if lse is None else lse
        self._check_outputs(q, out, lse)
        if self.device_split_tokens and seq_lens is not None:
            self._device_seq_lens(seq_lens)
        quant = pack_kv_quant(k_scale, v_scale, k_offset, v_offset, num_kv_heads=self.num_kv_heads,
                              head_dim=self.head_dim, device=q.device)
        ops.decode_attention_op(q, k_cache, v_cache, block_table, quant, b["plan"], b["tiling"], b["workspace"], out,
                                lse, int(self.tiling["blockDim"]), int(self.tiling["kernelKind"]))
        return out, lse

    def _device_seq_lens(self, seq_lens) -> None:
        """Graph mode: write ``seq_lens`` (a ``[B]`` tensor on the wrapper's device) into the plan buffer's
        ``seqLens`` section with a device copy, ordered before the launch on the stream (captured with it):
        the kernels derive their ranges from it, so a replay needs no host work. Lengths over
        ``device_split_tokens * max_splits`` are cut there (checked on the host only by ``plan()``)."""
        B = self.host_plan.batch_size
        if not isinstance(seq_lens, torch.Tensor) or tuple(seq_lens.shape) != (B,):
            raise ValueError(f"seq_lens: graph mode takes a [{B}] tensor on {self.device}, got "
                             f"{tuple(seq_lens.shape) if isinstance(seq_lens, torch.Tensor) else type(seq_lens).__name__}")
        if seq_lens.device.type != self.device.type or seq_lens.dtype not in (torch.int32, torch.int64):
            raise ValueError(f"seq_lens: must be int32 or int64 on {self.device}, got {seq_lens.dtype} on {seq_lens.device}")
        off = int(self.tiling["seqLensOffset"])
        self._buffers["plan"][off:off + B].copy_(seq_lens)

    def _check_outputs(self, q, out, lse) -> None:
        """``out [T, Hq, D]`` in q's dtype and ``lse [T, Hq]`` float32, on q's device, contiguous."""
        for name, x, shape, dt in (("out", out, tuple(q.shape), q.dtype), ("lse", lse, tuple(q.shape[:2]), torch.float32)):
            if not isinstance(x, torch.Tensor):
                raise TypeError(f"{name}: expected a torch tensor, got {type(x).__name__}")
            if tuple(x.shape) != shape or x.dtype != dt:
                raise ValueError(f"{name}: must be {list(shape)} {dt}, got {list(x.shape)} {x.dtype}")
            if x.device != q.device or not x.is_contiguous():
                raise ValueError(f"{name}: must be contiguous on q's device {q.device}, got {x.device}"
                                 f"{'' if x.is_contiguous() else ' (not contiguous)'}")

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
        Hkv, D = self.num_kv_heads, self.head_dim
        for name, ref in (("k_scale", None), ("v_scale", None), ("k_offset", "k_scale"), ("v_offset", "v_scale")):
            x = named[name]
            if x is None:
                continue
            if tuple(x.shape) not in ((Hkv,), (Hkv, D)) or (ref is not None and named[ref] is not None
                                                             and tuple(x.shape) != tuple(named[ref].shape)):
                raise ValueError(f"{name}: must be [Hkv] or [Hkv, D] = [{Hkv}] or [{Hkv}, {D}] (an offset: its "
                                 f"scale's shape), got {list(x.shape)}")
            if x.dtype != torch.float32:
                raise TypeError(f"{name}: dtype must be float32, got {x.dtype}")
        for name in ("q", "k_cache", "v_cache", "block_table"):
            if not named[name].is_contiguous():
                raise ValueError(f"{name}: must be contiguous (the kernels address it densely)")
        self.spec.check_shapes(self.host_plan, q, k_cache, v_cache, block_table)


# ---------------------------------------------------------------------------------------------
# Python API: one call
# ---------------------------------------------------------------------------------------------

def decode_attention(q, k_cache, v_cache, block_table, seq_lens, query_start_loc=None, *, scale=None,
                     soft_cap=None, window_left=None, k_scale=None, v_scale=None, k_offset=None, v_offset=None,
                     plan: Plan | None = None, policy: str = "auto", out=None, lse=None,
                     profile: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
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
    sl = host(seq_lens)
    qsl = None if query_start_loc is None else host(query_start_loc)
    if plan is not None:  # a plan from outside: checked before anything runs
        plan.validate(sl, qsl if qsl is not None else np.arange(dims.batch_size + 1), window_left=window_left,
                      num_kv_heads=dims.num_kv_heads)
    if q.device.type == "cpu":
        why = runtime_unavailable()
        raise RuntimeError(f"{QUALNAME}: q is a CPU tensor; the operator runs on an Ascend NPU"
                           + (f", and none is usable here: {why}" if why else " (move the tensors to 'npu')"))
    require_npu_kernel(q.device)
    w = AscendDecodeWrapper(dims.num_q_heads, dims.num_kv_heads, dims.head_dim, dims.page_size, dtype=q.dtype,
                            kv_dtype=k_cache.dtype, device=q.device, profile=profile, policy=policy)
    const = dict(scale=scale, soft_cap=soft_cap, window_left=window_left, max_pages=dims.max_pages,
                 num_pages=dims.num_pages)
    if plan is None:
        w.plan(sl, query_start_loc=qsl, **const)
    else:
        w.set_plan(plan, seq_lens=sl, validate=False, **const)   # validated above, with the batch's rows
    bt = block_table if block_table.dtype == torch.int32 else block_table.to(torch.int32)
    return w.run(q, k_cache, v_cache, bt, scale=scale, soft_cap=soft_cap, window_left=window_left,
                 k_scale=k_scale, v_scale=v_scale, k_offset=k_offset, v_offset=v_offset, out=out, lse=lse)
