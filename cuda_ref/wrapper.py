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

Safety: ``run()`` checks every call's metadata (shapes, strides, dtypes, devices, scalars; no host
sync, so also while a graph is captured); a call whose tensors' metadata and scalars equal those of
the last call that passed (under a plan of the same batch and rows) costs one guard
(:func:`cuda_ref.checks.call_guard`: one C++ call for all of them where it builds, about 0.1 µs), any
other signature that passed a set lookup (:meth:`DecodeWrapper.check`). Values it cannot see without a sync are made harmless in the kernels: a block-table entry
outside ``[0, num_pages)`` reads as an absent page and is counted in a small device-side error
buffer; :meth:`DecodeWrapper.check_errors` (a host sync) raises on it; ``wrapper.debug = True`` (or
``SPLITKV_DEBUG=1``) calls it after every eager ``run()``. ``set_plan()`` checks the plan against
itself and the wrapper (``cuda_ref.checks.check_plan``).

Host cost per step: ``plan()`` packs the plan into a pinned host buffer and makes one non-blocking
copy into a device buffer that is reused (``cuda_ref.plan_upload.PlanUploader``); ``run()`` prepares its
launches (grid, strides, constexprs) once per signature and plan shape and then only launches.

With ``device_plan=True`` (and ``policy="size:S"``) there is no host plan at all: the kernels derive
the work items of the ``size:S`` plan from ``seq_lens`` and ``query_start_loc`` on the device, over
a grid fixed by the tensors' shapes (``B x Hkv x ceil(block_table columns x page / S)``), so a
captured graph replays any batch of those shapes after only the inputs vLLM copies anyway:

    w = DecodeWrapper(32, 8, 128, 16, policy="size:256", device_plan=True)
    with torch.cuda.graph(g): out, lse = w.run(q, k_cache, v_cache, block_table, seq_lens, query_start_loc)
    seq_lens.copy_(new_lens); query_start_loc.copy_(new_qsl); g.replay()     # no plan(), no plan copy

:class:`StepInputs` keeps ``seq_lens`` and ``query_start_loc`` as views of one device buffer, so a step
refreshes both with one non-blocking copy.
"""

from __future__ import annotations

import os

import numpy as np
import torch

from splitkv_common.guards import ThreadOwner, check_validate
from splitkv_common.plan_layout import Plan
from splitkv_common.plan_spec import PlannedWrapper, PlanSpec
from splitkv_common.torch_io import as_torch_dtype, grown_store
from splitkv_common.validation import check_decode_args, check_gqa, host, normalize_window

from . import INTERPRET
from .call_checks import CallChecks
from .checks import ERROR_SLOTS, any_batch_key, check_plan, describe_errors
from .checks import plan_pages as plan_page_count
from .configs import KernelConfig, packed_limit
from .driver_launch import event_query_address
from .launch import plan_launch_key, prepare_decode
from .plan_upload import DevicePlan, PlanUploader
from .step_inputs import StepInputs  # noqa: F401  (cuda_ref.wrapper.StepInputs keeps working)

#: a plan's window not given to set_plan(): run() does not compare it
_UNKNOWN = object()


class DecodeWrapper(CallChecks, PlannedWrapper, ThreadOwner):
    """Split-KV decode attention over a paged KV cache ``[num_pages, page_size, Hkv, D]``.

    Args:
        num_q_heads, num_kv_heads, head_dim, page_size: the model's shape (``Hq % Hkv == 0``).
        dtype: q's and the output's dtype; ``kv_dtype``: the cache's (default ``dtype``; or int8).
        device: where buffers live (default: the current CUDA device, else the CPU + interpreter).
        profile: device profile of the ``auto`` planner; policy: ``auto``, ``none``, ``size:N``, ``count:N``.
        graph_stable: fixed-shape plans for graph replay (``max_splits`` and ``max_work_items`` bound them).
        fuse_merge: merge in stage 1 (the last split to finish merges, with a per-(request, KV head)
            counter) instead of a second launch; default: the second launch (the faster kernels on
            the H200; the launch it saves is 10-19 µs of host time an eager call at batch 1 there,
            docs/perf-notes.md).
            Both merge with the same code; its sums reduce across the launch's warps (4 fused, 1
            separate), so the two agree to rounding: bitwise in the interpreter and at the batch-1
            points measured on the H200, not at B16 x 8k.
        config: stage-1 tile / warps / stages (default by head dim and plan, see
            :func:`cuda_ref.configs.default_config`; fixed-size and no-split plans keep their
            batch invariance).
        device_plan: plan on the device (needs ``policy="size:S"``): no ``plan()``; ``run()`` takes any
            batch, the kernels cut it as the host's ``size:S`` plan would (bit for bit, for requests
            of at most ``max_splits x S`` tokens, where the host planner would grow the split).
        max_q_len: with ``device_plan``, the most query rows of one request (default: all of q's
            rows, always enough; a smaller bound, e.g. 1 + speculative tokens, launches fewer
            programs). A request with more is refused by ``run(validate=True)`` only.
        plan_in_graph: with ``graph_stable``, the plan's host-to-device copy goes into the graph:
            ``plan()`` only packs the plan into one pinned host buffer, and :meth:`copy_plan`, called
            once inside the capture before the layers' ``run()``, copies it at every replay, with the
            batch's lengths and offsets packed after it (:attr:`planned_seq_lens`,
            :attr:`planned_query_start_loc`: pass them to ``run()`` in the capture). A step is then
            ``plan()`` and one replay, with no copy or event record of the wrapper's (the next
            ``plan()`` queries the replay's copy event, and waits for it, before packing); with the
            C planner ``plan()`` is then one C call (:meth:`_refresh`). Eager ``run()`` copies a
            newly packed plan itself.

    A plan knows what it was made for: ``run()`` refuses, naming the argument, a ``window_left``
    wider than the plan's (no window, or a larger one: the plan skips the positions before its
    window; a narrower one is masked by the kernels; one comparison per call; a plan given to
    ``set_plan()`` without its ``window_left`` is not compared), ``query_start_loc=None`` for a
    plan of other query rows than one per request, and q rows, requests or block-table columns other than the plan's (the cached
    metadata checks); ``validate=True`` adds the lengths and query offsets the plan covers (a host
    sync). A refused ``plan()`` / ``set_plan()`` leaves the previous plan in use.

    Single-threaded: the thread of the first ``plan()`` / ``set_plan()`` (or, with ``device_plan``,
    ``run()``) owns the wrapper, and a call from another thread raises ``RuntimeError`` (it would run
    with the owner's plan, into the owner's output buffers); use one wrapper per thread, or
    :meth:`release_thread` to hand it over (:class:`splitkv_common.guards.ThreadOwner`).

    Graph replay with a host plan (``graph_stable=True``)::

        w.plan(lens, q_lens)                 # the capture's shapes
        with torch.cuda.graph(g):
            w.run(q, k_cache, v_cache, block_table, seq_lens, query_start_loc)
        w.plan(new_lens, q_lens); (copy new_lens into seq_lens); g.replay()   # each step

    and with ``plan_in_graph=True`` (one copy a step, inside the graph)::

        with torch.cuda.graph(g):
            w.copy_plan()
            w.run(q, k_cache, v_cache, block_table, w.planned_seq_lens, w.planned_query_start_loc)
        w.plan(new_lens, q_lens); g.replay()                                  # each step
    """

    def __init__(self, num_q_heads: int, num_kv_heads: int, head_dim: int, page_size: int, *,
                 dtype=torch.bfloat16, kv_dtype=None, device=None, profile: str = "h200", policy: str = "auto",
                 graph_stable: bool = False, max_splits: int | None = None, max_work_items: int | None = None,
                 min_split_tokens: int | None = None, fuse_merge: bool | None = None,
                 config: KernelConfig | None = None, device_plan: bool = False, max_q_len: int | None = None,
                 plan_in_graph: bool = False):
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
        # plan(): stage 1 derives the work items of a plan from its own index where they are those of
        # the device-plan formula (PlanSpec.items_from_index: one dependent load fewer before the first KV
        # tile, the same arithmetic); False launches every plan from its arrays (for measuring)
        self.index_items = True
        self.host_plan: Plan | None = None
        self.dplan: DevicePlan | None = None
        self._buffers: dict[str, torch.Tensor] = {}
        self._stores: dict[str, torch.Tensor] = {}   # what the size-dependent buffers are views of
        self._fits = None   # the stores' (rows, slots, counters) and the rows out / lse hold (_buffers_for)
        # check_errors() after every eager run() (a host sync): for debugging
        self.debug = os.environ.get("SPLITKV_DEBUG", "") not in ("", "0")
        self.forget_checks()   # the signatures that passed the checks (check())
        self._plan_pages = 0  # block-table columns the current plan reads
        self._plan_sig = None      # the plan's (requests, rows)
        self._plan_window = _UNKNOWN   # the window the plan was made for (normalized); _UNKNOWN: not told
        self._plan_one_row = None      # the plan has one query row per request (None: not known)
        self._device_shape = None  # device_plan: (B, T, block-table columns) the device plan was made for
        self._num_pages = 0   # num_pages of the last run's cache (for check_errors' message)
        self._refresh_with = None    # plan_in_graph with the C planner: the C refresher (_refresher())
        self.plan_refreshes = 0      # plan() calls the refresher made (one C call each)
        if plan_in_graph and (not graph_stable or device_plan):
            raise ValueError("plan_in_graph: needs graph_stable=True and a host plan (device_plan=False): the "
                             "captured copy has the capture's sizes")
        self._uploader = PlanUploader(self.device, in_graph=plan_in_graph)
        self._launches: dict = {}   # prepared launches by (checked signature, plan shape)
        self._launches_any_batch: dict = {}   # the same by the signature without the batch's sizes
        self.last_launch = None  # the DecodeLaunch of the last run(); .fast: which launch path it took
        self.device_plan = bool(device_plan)
        self.max_q_len = None if max_q_len is None else int(max_q_len)
        if self.device_plan:
            pol = self.spec.make([0]).policy   # the shared policy parser (and its errors)
            if pol.kind != "fixed_size":
                raise ValueError(f"device_plan: needs policy size:S (a fixed split length), got {policy!r}")
            if self.max_q_len is not None and self.max_q_len < 1:
                raise ValueError(f"max_q_len: must be >= 1, got {max_q_len}")
            self.split_size = int(pol.value)

    # -- host side -----------------------------------------------------------------------------
    def plan(self, seq_lens, q_lens=None, query_start_loc=None, window_left=None) -> Plan:
        """Make the shared plan for a batch (host arrays) and copy it to the device. With
        ``device_plan`` there is nothing to do (returns None): the kernels plan. A graph-stable plan
        returned here stays valid until the second ``plan()`` after it, which writes into its buffer.
        A refused batch raises before anything changes: the previous plan stays in use."""
        self._claim_thread("plan")
        fast = self._refresh_with
        if fast is not None and window_left is None:
            plan = fast.refresh(seq_lens, q_lens, query_start_loc)
            if plan is not None:
                self._plan_one_row = True if q_lens is None and query_start_loc is None else None
                return plan
        if self.device_plan:
            return None
        seq_lens = host(seq_lens)
        plan = self.make_plan(seq_lens, None if q_lens is None else host(q_lens),
                              None if query_start_loc is None else host(query_start_loc), window_left)
        # made by the shared planner: valid by construction (tests/test_planner*.py), not checked again
        self._set_plan(plan, False, seq_lens, normalize_window(window_left))
        if self.index_items and window_left is None and not plan.graph_stable:
            self.dplan.index_split = self.spec.items_from_index(plan)
        return plan

    def set_plan(self, plan: Plan, *, validate: bool = True, window_left=_UNKNOWN) -> None:
        """Use a plan made elsewhere (the parity harness plans every backend the same way).

        ``validate`` (default): the plan is checked first (:func:`cuda_ref.checks.check_plan`: the
        shared :meth:`Plan.validate` without the coverage rule, since a context-parallel shard's
        plan covers only its part). ``False`` only for a plan fresh
        from the shared planner (``plan_spec().make``), which is valid by construction.
        ``window_left``: the window the plan was made for; given, ``run()`` refuses another one.
        A refused plan leaves the previous one in use."""
        self._claim_thread("set_plan")
        check_validate(validate, allow_auto=False)
        if not isinstance(plan, Plan):
            raise TypeError(f"plan: expected a splitkv_common.plan.Plan, got {type(plan).__name__}")
        self._set_plan(plan, validate, None, _UNKNOWN if window_left is _UNKNOWN else normalize_window(window_left))

    def _set_plan(self, plan: Plan, validate: bool, seq_lens, window=_UNKNOWN) -> None:
        """:meth:`set_plan`; ``seq_lens``: the planned batch's lengths (``plan()``'s), which a
        ``plan_in_graph`` wrapper copies with the plan (:attr:`planned_seq_lens`); ``window``: the
        normalized window it was made for (or ``_UNKNOWN``). Every check runs before the first change."""
        if plan.num_kv_heads != self.num_kv_heads or plan.page_size != self.page_size:
            raise ValueError(f"plan: made for Hkv={plan.num_kv_heads}, page_size={plan.page_size}; this wrapper "
                             f"has Hkv={self.num_kv_heads}, page_size={self.page_size}")
        if self.device_plan:
            raise ValueError("plan: a wrapper with device_plan=True plans on the device; set_plan() does not apply")
        plan_pages = check_plan(plan, self.num_kv_heads) if validate else plan_page_count(plan)
        group = self.num_q_heads // self.num_kv_heads
        reuse = self.dplan if (self.graph_stable and self.dplan is not None) else None
        self.dplan = self._uploader.upload(plan, group, out=reuse, seq_lens=seq_lens)
        self._retire_plan(plan)
        self.host_plan = plan
        self._plan_pages = plan_pages
        self.set_plan_sig((plan.batch_size, plan.num_rows))  # what check()'s cached part depends on in the plan
        self._plan_window = window
        qsl = plan.query_start_loc
        self._plan_one_row = bool(qsl.shape[0] == plan.batch_size + 1 and int(qsl[-1]) == plan.batch_size
                                  and (plan.batch_size == 0 or int(np.diff(qsl).min()) == 1))
        if reuse is not None:  # graph-stable refresh: the shapes (hence the buffers) are those of the capture
            self._refresh_with = self._refresher(plan)
            return
        d = self.dplan
        self._buffers_for(plan.num_rows, plan.num_slots, plan.batch_size * self.num_kv_heads * d.row_blocks)

    def _refresher(self, plan: Plan):
        """The C object that makes ``plan()`` of a captured host plan in one call
        (:meth:`NativePlanner.refresher`), or None where it does not apply: the plan copy not captured
        (``plan_in_graph=False``), ``plan`` or the spare plan not made by the C planner. A batch of the
        captured sizes is planned and packed (with its lengths) into the pinned buffer the captured copy
        reads, into the buffers of the plan not in use, once the last replay's copy has read the buffer
        (the event it records, queried from C; else :meth:`PlanUploader.wait_for_copy`)."""
        spare, up = self._spare, self._uploader
        if not up.in_graph or not self._native or spare is None or self._mine is not plan or \
                "_small" not in plan.__dict__ or "_small" not in spare.__dict__:
            return None
        d, group = self.dplan, self.num_q_heads // self.num_kv_heads
        most = 1 if d.max_q_len == 1 else packed_limit(d.block_m * d.row_blocks, group)
        try:
            fast = self._native.refresher(d.batch_size, d.num_rows, most, up._host[0][1], d.data.numel(), spare,
                                          plan, self, up, up.wait_for_copy)
        except ValueError:   # a buffer it could not write (a plan made read-only): plan() goes the full way
            return None
        self._tell_event(fast)
        return fast

    def _tell_event(self, fast) -> None:
        """The refresher learns the event the captured copy records (made at the first copy)."""
        ev = self._uploader._events[0]
        if fast is not None and ev is not None and not fast.event:
            fast.set_event(ev.cuda_event, event_query_address())

    @property
    def refresh_parts(self) -> dict:
        """Host µs of the last ``plan()`` that refreshed a captured plan in one C call (``plan_in_graph``):
        ``wait`` (until the last replay's copy had read the pinned buffer: an event query when it had),
        ``plan`` (the C planner, writing the plan and the lengths into that buffer) and ``after``
        (the plan object's and the wrapper's fields); empty before the first refresh since the last
        full ``plan()``."""
        fast = self._refresh_with
        return {} if fast is None else fast.parts

    def _buffers_for(self, T: int, num_slots: int, num_counters: int) -> None:
        """The output, partial and counter buffers for ``T`` rows and ``num_slots`` partial slots and
        the error buffer (allocated once). Each lives in a store that grows by half when too small,
        so plans of other sizes (an eager batch changing every step) allocate nothing once the store
        is large enough: ``out`` and ``lse`` are views of its first rows (made when their shape
        changes), the partial buffers and counters the whole store (the kernels bound their slots by
        it, so plans of other sizes share a prepared launch)."""
        fits = self._fits   # the stores' rows, slots and counters: within them, at most new out / lse views
        if fits is not None and T <= fits[0] and num_slots <= fits[1] and num_counters <= fits[2]:
            if T != fits[3]:
                st = self._stores
                self._buffers["out"], self._buffers["lse"] = st["out"][:T], st["lse"][:T]
                self._fits = fits[:3] + (T,)
            return
        if "errors" not in self._buffers:  # allocated once: a captured graph keeps its address
            self._buffers["errors"] = torch.zeros(ERROR_SLOTS, dtype=torch.int32, device=self.device)
        Hq, D = self.num_q_heads, self.head_dim
        need = {
            "out": ((T, Hq, D), self.dtype), "lse": ((T, Hq), torch.float32),
            "part_o": ((max(num_slots, 1), Hq, D), torch.float32),
            "part_lse": ((max(num_slots, 1), Hq), torch.float32),
            "counters": ((max(num_counters, 1),), torch.int32),
        }
        for name, (shape, dt) in need.items():
            store = self._stores[name] = grown_store(self._stores.get(name), shape[0], shape[1:], dt, self.device)
            if name not in ("out", "lse"):
                self._buffers[name] = store
                continue
            buf = self._buffers.get(name)   # the caller's results: exactly T rows
            if buf is None or buf.shape[0] != shape[0] or buf.data_ptr() != store.data_ptr():
                self._buffers[name] = store[:shape[0]]
        st = self._stores
        self._fits = (min(st["out"].shape[0], st["lse"].shape[0]), min(st["part_o"].shape[0], st["part_lse"].shape[0]),
                      st["counters"].shape[0], T)

    @property
    def upload_parts(self) -> dict:
        """Host µs of the last plan upload's parts (``PlanUploader.last_parts``: prepare, wait, pack,
        copy, record); empty before the first."""
        return self._uploader.last_parts

    def workspace_bytes(self) -> int:
        """Bytes of the partial buffers (and merge counters) the current plan needs."""
        if self.device_plan:   # T x max_splits slots of o [Hq, D] and lse [Hq], float32
            d = self.dplan
            return 0 if d is None else d.num_slots * self.num_q_heads * (self.head_dim + 1) * 4
        if self.host_plan is None:
            return 0
        extra = self._buffers["counters"].numel() * 4 if self._fused() else 0
        return self.host_plan.workspace_bytes(self.num_q_heads, self.head_dim) + extra

    # -- device side ---------------------------------------------------------------------------
    def run(self, q, k_cache, v_cache, block_table, seq_lens, query_start_loc=None, *, scale=None,
            soft_cap=None, window_left=None, k_scale=None, v_scale=None, k_offset=None, v_offset=None,
            validate: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """Attention for the planned batch: ``(out [T, Hq, D] in q's dtype, lse [T, Hq] float32)``.

        Shapes, strides, dtypes, devices, scalars and the plan's match with the batch are checked
        on every call without reading device memory (cached per signature), and so are the plan's
        window (``window_left`` no wider than the one ``plan()`` was given: one comparison) and its query
        rows when ``query_start_loc`` is omitted; ``validate=True`` adds the shared value checks
        (block-table ranges, lengths) and the lengths and query offsets the plan covers (a host sync,
        so not inside a graph); ``"auto"`` validates when q is on the CPU; anything else is refused.
        Without it, out-of-range page ids are masked and counted (:meth:`check_errors`). The
        returned tensors are the wrapper's own buffers, overwritten by the next ``run()``.
        Refused from a thread other than the wrapper's (:class:`~splitkv_common.guards.ThreadOwner`).
        """
        self._claim_thread("run")
        if validate is not False:
            validate = check_validate(validate) is True or (validate == "auto" and q.device.type == "cpu")
        if self.device_plan:
            self._device_side_plan(q, block_table)
        elif self.dplan is None:
            raise RuntimeError("plan: call plan() (or set_plan()) before run()")
        elif self._uploader.in_graph:
            self._plan_copy_for_run(q)
        if query_start_loc is None:
            if not self.device_plan and self._plan_one_row is False:
                raise ValueError("query_start_loc: required: the plan was made for other query rows per request "
                                 "than one each (pass the batch's query_start_loc)")
            query_start_loc = self._default_qsl(q.shape[0], block_table.shape[0], q.device)
        last = self._last_call   # check()'s guard inline (a method call costs more than the guard): same rule
        if last is not None and last[0](q, k_cache, v_cache, block_table, seq_lens, query_start_loc, k_scale, v_scale,
                                        k_offset, v_offset, scale, soft_cap, window_left) and self._plan_pages <= last[1]:
            key = last[2]
        else:
            key = self.check(q, k_cache, v_cache, block_table, seq_lens, query_start_loc, k_scale, v_scale, k_offset,
                             v_offset, scale=scale, soft_cap=soft_cap, window_left=window_left)
        pw = self._plan_window
        if pw is not None and pw is not _UNKNOWN and not self.device_plan and \
                (window_left is None or window_left == -1 or window_left > pw):
            raise ValueError(f"window_left: run with {window_left!r}, wider than the plan's window {pw} (the plan "
                             f"skips the positions before it); plan() again with this window")
        if validate:
            self._validate_values(q, k_cache, v_cache, block_table, seq_lens, query_start_loc, scale, soft_cap,
                                  window_left, k_scale, v_scale, k_offset, v_offset)
        b = self._buffers
        dp = self.dplan
        # one prepared launch for every plan of this batch whose sizes decide nothing but the grid
        lkey = None if key is None else (key, plan_launch_key(dp, self.device), b["part_o"].shape[0], self.config,
                                         self.fuse_merge, self.merge, self.pdl)
        prep = self._launches.get(lkey) if lkey is not None else None
        wide = None
        if prep is None and lkey is not None:   # a batch of other sizes: the launch of its signature without them
            wide = (any_batch_key(key),) + lkey[1:]
            prep = self._launches_any_batch.get(wide)
            if prep is not None:
                self._remember_launch(self._launches, lkey, prep)
        if prep is None:
            prep = prepare_decode(
                q, k_cache, v_cache, block_table, seq_lens, query_start_loc, dp, b["out"], b["lse"], b["part_o"],
                b["part_lse"], b["counters"], scale=float(scale) if scale is not None else self.head_dim ** -0.5,
                soft_cap=soft_cap, window_left=normalize_window(window_left), k_scale=k_scale, v_scale=v_scale,
                k_offset=k_offset, v_offset=v_offset, config=self.config, fuse_merge=self._fused(),
                interpret=INTERPRET, merge=self.merge, batch_invariant=self.device_plan
                or self.host_plan.policy.kind in ("fixed_size", "none"), pdl=self.pdl, errors=b["errors"])
            if lkey is not None:
                # the previous launch's launchers fit where its tensors had these dtypes and devices
                # (shapes and strides, which the kernels take as arguments, are compared by adopt)
                prep.kinds = tuple(None if t is None else t[2:] for t in key[:10])
                if self.last_launch is not None and self.last_launch.kinds == prep.kinds:
                    prep.adopt(self.last_launch)
                self._remember_launch(self._launches, lkey, prep)
                self._remember_launch(self._launches_any_batch, wide, prep)
        # check() tied the batch to the plan and out / lse hold its rows: launch_sizes is the plan's
        prep.launch(q, k_cache, v_cache, block_table, seq_lens, query_start_loc, dp, b["out"], b["lse"], b["part_o"],
                    b["part_lse"], b["counters"], k_scale, v_scale, k_offset, v_offset, b["errors"],
                    sizes=(dp.batch_size, dp.num_rows, dp.num_rows))
        self.last_launch = prep
        self._num_pages = k_cache.shape[0]
        if self.debug and not (q.is_cuda and torch.cuda.is_current_stream_capturing()):
            self.check_errors()
        return b["out"], b["lse"]

    @staticmethod
    def _remember_launch(cache: dict, key, prep) -> None:
        if len(cache) >= 64:
            cache.clear()
        cache[key] = prep

    @property
    def planned_seq_lens(self) -> torch.Tensor:
        """``plan_in_graph``: the last ``plan()``'s ``seq_lens`` on the device (int32 ``[B]``), copied with
        the plan by :meth:`copy_plan`. Passed to ``run()`` inside the capture, they make a step
        ``plan()`` and one replay: one copy for the plan and the lengths, which cannot disagree."""
        return self._planned_inputs()[0]

    @property
    def planned_query_start_loc(self) -> torch.Tensor:
        """``plan_in_graph``: the last ``plan()``'s ``query_start_loc`` on the device (int32 ``[B + 1]``),
        copied with the plan (see :attr:`planned_seq_lens`)."""
        return self._planned_inputs()[1]

    def _planned_inputs(self):
        if not self._uploader.in_graph:
            raise ValueError("plan_in_graph: the planned lengths are copied with the plan only by "
                             "DecodeWrapper(plan_in_graph=True)")
        if self.dplan is None:
            raise RuntimeError("plan: call plan() before reading the planned lengths")
        d = self.dplan
        return self._uploader.inputs(d.data.numel(), d.batch_size)

    def copy_plan(self) -> None:
        """``plan_in_graph``: copy the plan the last ``plan()`` packed into the device plan. Call it once
        inside the graph's capture, before the layers' ``run()``: each replay then copies what the
        last ``plan()`` packed (and records the event the next ``plan()`` waits for)."""
        if not self._uploader.in_graph:
            raise ValueError("plan_in_graph: copy_plan() is for DecodeWrapper(plan_in_graph=True); plan() "
                             "copies the plan itself")
        self._uploader.copy()
        self._tell_event(self._refresh_with)

    def _plan_copy_for_run(self, q) -> None:
        """``plan_in_graph``: an eager ``run()`` copies a plan packed since the last copy; inside a capture
        the capture must hold the copy (``copy_plan()``), else replays would use the capture's plan."""
        up = self._uploader
        if q.is_cuda and torch.cuda.is_current_stream_capturing():
            if not up.copied_in_capture:
                raise RuntimeError("plan_in_graph: call copy_plan() inside the capture, before run(): without "
                                   "it the graph would replay the plan of the capture")
        elif up.pending:
            up.copy()
            self._tell_event(self._refresh_with)

    def _validate_values(self, q, k_cache, v_cache, block_table, seq_lens, query_start_loc, scale, soft_cap,
                         window_left, k_scale, v_scale, k_offset, v_offset) -> None:
        """``run(validate=True)``: the shared value checks (a host sync) and the batch against the plan
        (host plan: the lengths and rows it was made for; device plan: rows per request within the
        launch's packed rows)."""
        check_decode_args(q, k_cache, v_cache, block_table, seq_lens, query_start_loc, scale=scale,
                          soft_cap=soft_cap, window_left=normalize_window(window_left), k_scale=k_scale,
                          v_scale=v_scale, k_offset=k_offset, v_offset=v_offset, backend="triton")
        if not self.device_plan:
            self.host_plan.check_batch(host(seq_lens), host(query_start_loc))
            return
        q_lens = np.diff(host(query_start_loc).astype(np.int64))
        most = self.dplan.block_m * self.dplan.row_blocks // (self.num_q_heads // self.num_kv_heads)
        if q_lens.size and int(q_lens.max()) > most:
            raise ValueError(f"query_start_loc: a request has {int(q_lens.max())} query rows; max_q_len allows {most}")

    def _device_side_plan(self, q, block_table) -> None:
        """``device_plan``: the :class:`DevicePlan` (row slots only) and buffers for q's rows and the block
        table's shape, made when those shapes change (not while a graph replays)."""
        B, T, pages = block_table.shape[0], q.shape[0], block_table.shape[1]
        shape = (B, T, pages)
        if self._device_shape == shape:
            return
        group = self.num_q_heads // self.num_kv_heads
        max_q = T if self.max_q_len is None else min(self.max_q_len, max(T, 1))
        d = DevicePlan.on_device(B, self.num_kv_heads, T, pages, self.page_size, self.split_size, group, max_q,
                                 self.device)
        self.dplan = d
        self._plan_pages = 0
        self._device_shape = shape
        self.set_plan_sig((B, T))
        self._buffers_for(T, d.num_slots, B * self.num_kv_heads * d.row_blocks)

    def check_errors(self) -> None:
        """Raise ``RuntimeError`` if a kernel since the last call met values it could not honour, naming
        each rule broken (:func:`cuda_ref.checks.describe_errors`): a block-table entry outside
        ``[0, num_pages)`` (its tokens were read as absent; the first (request, logical page, page
        id) seen), a length past its block-table row or negative, a ``query_start_loc`` that
        decreases or leaves q's rows, a request with more rows than ``max_q_len`` (the first request
        seen). The error buffer is reset either way. Reads device memory: a host sync."""
        e = self._buffers.get("errors")
        if e is None:
            return
        msg = describe_errors(e.tolist(), self._num_pages)
        if msg:
            e.zero_()
            raise RuntimeError(msg)

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
