"""The shared-prefix route of :class:`ascend_ops.wrapper.AscendDecodeWrapper` through the operator.

``AscendDecodeWrapper.plan(..., shared_prefix=...)`` asks the shared planner
(:func:`splitkv_common.shared_prefix.plan_shared_prefix`, the wrapper's device profile) for the
decision; on the shared route it keeps a :class:`SharedPrefixRoute`, whose ``run()`` enqueues

1. the prefix stage: the operator on the prefix batch of :func:`ascend_ops.shared_prefix.prefix_layout`
   (one "request" per chunk of a group's query rows, block-table row the prefix's pages, the plan's
   ``seqLens`` words the causal lengths that let every row see the whole prefix): the mixed
   kernel's work items with the group's rows as ``M``;
2. the tails: the operator on the batch of :func:`splitkv_common.shared_prefix.tail_inputs` (block-table
   rows shifted past each request's prefix on the device, the tail plan of the shared plan);
3. the exact merge of each covered row's two states (:func:`splitkv_common.torch_eager.merge_states`).

Each stage is an :class:`~ascend_ops.wrapper.AscendDecodeWrapper` of its own, planned on the host in
``plan()`` (kept from one plan to the next); ``run()`` does device work only (gathers, the two
launches, the merge): no host sync. The prefix pages are read from ``run()``'s block table on the
device (each chunk's row: its group's first request's, which starts with the prefix's pages), so
``plan()`` needs no host block table; ``run(validate=True)`` checks it against the prefix on the host.
A sliding window takes the plain route (a prefix chunk's rows sit at different positions, which one
"request" of the kernels cannot express), as on the twin (:func:`ascend_ops.sim_backend.run_twin_shared_prefix`).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from splitkv_common.shared_prefix import (SharedPrefix, SharedPrefixPlan, check_shared_prefix, groups_as_shared_prefix,
                                          plan_shared_prefix)
from splitkv_common.torch_eager import merge_states
from splitkv_common.validation import check_decode_args, host, normalize_window

from .shared_prefix import PREFIX_ROWS_PER_ITEM, prefix_layout

WINDOW_REASON = ("a sliding window takes the plain route on the Ascend kernels (a prefix item's rows sit at "
                 "different positions, which one request of the kernels cannot express)")


def plan_route(wrapper, seq, qsl, window_left, shared_prefix, *, mode: str, block_table, num_pages) -> SharedPrefixPlan:
    """The planner's decision for ``wrapper``'s shapes and device profile (host arrays); a window
    turns the shared route off, with that reason."""
    if not isinstance(shared_prefix, SharedPrefix):
        raise TypeError(f"shared_prefix: expected a splitkv_common.shared_prefix.SharedPrefix, got "
                        f"{type(shared_prefix).__name__}")
    if wrapper.graph_stable or wrapper.device_split_tokens:
        raise ValueError("shared_prefix: not supported by a graph-stable wrapper (the prefix batch's shape follows "
                         "the groups); plan a wrapper made without graph_stable")
    win = normalize_window(window_left)
    kv_bytes = torch.empty(0, dtype=wrapper.kv_dtype).element_size()
    splan = plan_shared_prefix(seq, qsl, shared_prefix, num_kv_heads=wrapper.num_kv_heads,
                               page_size=wrapper.page_size, num_q_heads=wrapper.num_q_heads, head_dim=wrapper.head_dim,
                               kv_elem_bytes=kv_bytes, device=wrapper.profile, policy=wrapper.policy,
                               window_left=win, block_table=None if block_table is None else host(block_table),
                               num_pages=num_pages, mode="off" if win is not None else mode)
    if win is not None and mode != "off" and splan.groups.num_groups:
        splan = dataclasses.replace(splan, mode=mode, reason=f"shared prefix off ({mode}): {WINDOW_REASON}")
    return splan


class SharedPrefixRoute:
    """The two stages' wrappers and the device indices of one shared plan (see the module doc)."""

    def __init__(self, wrapper, splan: SharedPrefixPlan, seq, qsl, *, scale, soft_cap, max_pages, num_pages,
                 stages: "tuple | None" = None, rows_per_item: int = PREFIX_ROWS_PER_ITEM):
        self.splan = splan
        self.page = wrapper.page_size
        self.dtype, self.kv_dtype, self.device = wrapper.dtype, wrapper.kv_dtype, wrapper.device
        self.num_q_heads, self.num_kv_heads, self.head_dim = wrapper.num_q_heads, wrapper.num_kv_heads, wrapper.head_dim

        def stage():   # a wrapper of the same kind and settings for each stage (no import: no circle)
            return type(wrapper)(wrapper.num_q_heads, wrapper.num_kv_heads, wrapper.head_dim, wrapper.page_size,
                                       dtype=wrapper.dtype, kv_dtype=wrapper.kv_dtype, device=wrapper.device,
                                       profile=wrapper.profile, policy=wrapper.policy)

        groups = splan.groups
        const = dict(scale=scale, soft_cap=soft_cap, num_pages=num_pages)
        # the tails: the shared plan's tail plan, lengths less each request's prefix
        self.tail, self.prefix = stages if stages is not None else (stage(), stage())
        self.tail_seq = (np.asarray(seq, np.int64) - groups.request_prefix).astype(np.int32)
        self.tail.set_plan(splan.tail, seq_lens=self.tail_seq, validate=False, max_pages=max_pages, **const)
        # the prefix stage: a plain batch whose plan's seqLens words are the causal lengths
        G = wrapper.num_q_heads // wrapper.num_kv_heads
        bt, lens, pqsl, causal, rows = prefix_layout(groups, G, rows_per_item)
        pplan = self.prefix.make_plan(lens, None, pqsl, None)
        self.prefix.set_plan(pplan, seq_lens=causal, validate=False, max_pages=bt.shape[1], **const)
        # each chunk's block-table row: its group's first request's (the prefix's pages first)
        per = max(1, rows_per_item // G)
        chunks = [-(-int(e - s) // per) for s, e in zip(groups.row_start, groups.row_end)]
        self.prefix_pages = int(bt.shape[1])
        dev = wrapper.device
        self.chunk_request = torch.from_numpy(np.repeat(groups.first, chunks).astype(np.int64)).to(dev)
        self.rows = torch.from_numpy(rows).to(dev)
        self.shift = torch.from_numpy(groups.request_prefix // self.page).to(dev)
        self._q = None   # the prefix rows of q (kept: no allocation once large enough)

    @property
    def stages(self) -> tuple:
        return self.tail, self.prefix

    # -- device side --------------------------------------------------------------------------
    def tail_block_table(self, block_table: torch.Tensor) -> torch.Tensor:
        """Row ``b`` of ``block_table`` from column ``request_prefix[b] / page_size`` on, -1 padded (a
        gather on the device)."""
        W = block_table.shape[1]
        col = torch.arange(W, device=block_table.device)[None, :] + self.shift[:, None]
        got = block_table.long().gather(1, col.clamp(max=max(W - 1, 0)))
        return torch.where(col < W, got, torch.full_like(got, -1)).to(torch.int32).contiguous()

    def run(self, q, k_cache, v_cache, block_table, seq_lens=None, query_start_loc=None, *, scale=None, soft_cap=None,
            window_left=None, k_scale=None, v_scale=None, k_offset=None, v_offset=None, out=None, lse=None,
            validate: bool = False):
        splan = self.splan
        if window_left is not None:
            raise ValueError(f"window_left: run with {window_left!r}, the plan was made for no window (the shared "
                             f"route runs without one); plan() again with this window")
        B, T = splan.plain.batch_size, splan.plain.num_rows
        if not isinstance(block_table, torch.Tensor) or block_table.dim() != 2 or not isinstance(q, torch.Tensor) \
                or q.dim() != 3:
            raise ValueError("q, block_table: must be a 3-D and a 2-D tensor")
        if block_table.shape[0] != B or q.shape[0] != T:
            raise ValueError(f"q, block_table: the shared-prefix plan was made for {B} requests and {T} rows, got "
                             f"{block_table.shape[0]} and {q.shape[0]}")
        if block_table.shape[1] < self.prefix_pages:
            raise ValueError(f"block_table: {block_table.shape[1]} columns, fewer than the {self.prefix_pages} pages "
                             f"of the planned prefix")
        quant = dict(k_scale=k_scale, v_scale=v_scale, k_offset=k_offset, v_offset=v_offset)
        if validate:   # host checks (a sync): the whole batch, then the prefix against its block table
            sl = seq_lens if seq_lens is not None else torch.from_numpy(self.tail_seq + splan.groups.request_prefix)
            qs = query_start_loc if query_start_loc is not None else torch.from_numpy(splan.plain.query_start_loc)
            check_decode_args(q, k_cache, v_cache, block_table, sl, qs, scale=scale, soft_cap=soft_cap,
                              backend="ascend", **quant)
            splan.plain.check_batch(None if seq_lens is None else host(seq_lens),
                                    None if query_start_loc is None else host(query_start_loc))
            check_shared_prefix(groups_as_shared_prefix(splan, self.page), host(sl), host(qs), self.page,
                                host(block_table), k_cache.shape[0])
        const = dict(scale=scale, soft_cap=soft_cap, **quant)
        out, lse = self.tail.run(q, k_cache, v_cache, self.tail_block_table(block_table), out=out, lse=lse, **const)
        n = self.rows.shape[0]
        if n == 0:
            return out, lse
        if self._q is None or self._q.shape[0] < n or self._q.device != q.device:
            self._q = torch.empty((n, *q.shape[1:]), dtype=q.dtype, device=q.device)
        qp = self._q[:n]
        torch.index_select(q, 0, self.rows, out=qp)
        pbt = block_table.index_select(0, self.chunk_request)[:, :self.prefix_pages].contiguous()
        po, pl = self.prefix.run(qp, k_cache, v_cache, pbt, **const)
        mo, ml = merge_states(torch.stack([out.index_select(0, self.rows), po], 1),
                              torch.stack([lse.index_select(0, self.rows), pl], 1), dim=1)
        out.index_copy_(0, self.rows, mo.to(out.dtype))
        lse.index_copy_(0, self.rows, ml)
        return out, lse

    def check_errors(self) -> None:
        """Both stages' :meth:`~ascend_ops.wrapper.AscendDecodeWrapper.check_errors` (a host sync)."""
        self.tail.check_errors()
        self.prefix.check_errors()

    def workspace_bytes(self) -> int:
        return self.tail.workspace_bytes() + self.prefix.workspace_bytes()



def check_mode(mode, name: str = "shared_prefix_mode") -> str:
    from splitkv_common.shared_prefix import MODES

    if mode not in MODES:
        raise ValueError(f"{name}: must be one of {MODES}, got {mode!r}")
    return mode


def plan_wrapper(wrapper, seq_lens, q_lens, query_start_loc, window_left, shared_prefix, block_table, mode,
                 **const) -> SharedPrefixPlan:
    """``AscendDecodeWrapper.plan(..., shared_prefix=...)``: the planner's decision (:func:`plan_route`),
    then the shared route (a :class:`SharedPrefixRoute`, the stage wrappers of the route in use kept)
    or the wrapper's own plain plan of the batch. A refused batch leaves the previous plan in use,
    except where building the new route failed after its stages were replanned: the wrapper is then
    unplanned (``run()`` asks for a plan)."""
    seq = np.asarray(host(seq_lens), np.int64).reshape(-1)
    if query_start_loc is not None and q_lens is not None:
        raise ValueError("q_lens, query_start_loc: give one of them")
    if query_start_loc is not None:
        qsl = np.asarray(host(query_start_loc), np.int64).reshape(-1)
    else:
        ql = np.ones(seq.shape[0], np.int64) if q_lens is None else np.asarray(host(q_lens), np.int64).reshape(-1)
        qsl = np.concatenate([[0], np.cumsum(ql)])
    mode = wrapper.shared_prefix_mode if mode is None else check_mode(mode)
    splan = plan_route(wrapper, seq, qsl, window_left, shared_prefix, mode=mode, block_table=block_table,
                       num_pages=const["num_pages"])
    if splan.use_shared:
        old, wrapper._route = wrapper._route, None
        try:
            route = SharedPrefixRoute(wrapper, splan, seq, qsl, stages=None if old is None else old.stages, **const)
        except BaseException:
            if old is not None:
                wrapper.host_plan = wrapper.shared_prefix_plan = None
            raise
    else:
        wrapper.plan(seq, query_start_loc=qsl, window_left=window_left, **const)
        route = None
    wrapper._route, wrapper.shared_prefix_plan = route, splan
    return splan
