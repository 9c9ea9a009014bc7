"""The graph decoder of vLLM full-graph mode: the graph-stable wrappers of one captured graph size
and its fixed buffers (:class:`GraphDecoder`; :mod:`splitkv_vllm.graph` makes, refreshes and runs
them).

* :meth:`GraphDecoder.refresh` plans the step's padded batch on the host and rewrites the buffers in
  place, or with ``device_plan`` only copies this step's lengths, query offsets and block table
  into them (the kernels derive the work on the device);
* :meth:`GraphDecoder.run` only enqueues kernels (what a captured graph replays).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import numpy as np
import torch

from ascend_ops.support import DEFAULT_PROFILE
from splitkv_common.plan import Plan
from splitkv_common.validation import MAX_SEQ_LEN, as_int64_lengths

from .log import once

ROUTES = ("ascend", "triton")


def _host_lengths(seq_lens, query_start_loc) -> tuple[np.ndarray, np.ndarray]:
    """Host ``seq_lens`` and ``query_start_loc`` as int64 vectors whose values fit the graph's int32
    buffers: lengths in ``[0, MAX_SEQ_LEN]``, offsets from 0 and non-decreasing (``ValueError``
    naming the argument otherwise; never a wrapped or truncated value). Cost: O(B) NumPy."""
    sl = as_int64_lengths(np.asarray(seq_lens).reshape(-1), "seq_lens")
    qsl = as_int64_lengths(np.asarray(query_start_loc).reshape(-1), "query_start_loc", "[B + 1]")
    if sl.size and (int(sl.min()) < 0 or int(sl.max()) > MAX_SEQ_LEN):
        b = int(np.argmax((sl < 0) | (sl > MAX_SEQ_LEN)))
        raise ValueError(f"seq_lens: request {b} has {int(sl[b])} tokens; lengths must be in [0, MAX_SEQ_LEN = "
                         f"{MAX_SEQ_LEN}] (the graph's buffers are int32)")
    if qsl.size and (int(qsl[0]) != 0 or (np.diff(qsl) < 0).any() or int(qsl[-1]) > MAX_SEQ_LEN):
        raise ValueError(f"query_start_loc: must start at 0 and be non-decreasing within int32, got "
                         f"{qsl[:8].tolist()}")
    return sl, qsl


@dataclass
class GraphDecoder:
    """Graph-stable decode for one captured graph size: its buffers keep their shapes and addresses.

    One decoder serves the layers of one KV-cache group in graphs of ``num_tokens`` query rows. It
    holds one graph-stable :class:`ascend_ops.AscendDecodeWrapper` per set of layer constants (the
    layers that share them share its plan, tiling and workspace; they run one after another) and a
    fixed ``block_table`` buffer ``[max_reqs, max_pages]``. Capacity: ``max_reqs`` requests (the
    real ones first, the rest padded with ``seq_len 0``, no query rows), ``max_splits`` partial slots
    per query row, ``max_work_items`` work items (default: the planner's,
    :func:`splitkv_common.plan.graph_capacity`).

    Per step: :meth:`refresh` (host, outside the graph, before the replay is enqueued) plans the
    padded batch and rewrites the buffers in place; :meth:`run` (captured once) only enqueues the
    kernels on those buffers.

    ``route``: ``ascend`` (:class:`ascend_ops.AscendDecodeWrapper`) or ``triton``
    (:class:`cuda_ref.wrapper.DecodeWrapper`). ``split_tokens > 0``: device planning for the layers
    that allow it (:meth:`device_unsupported`): no plan per step, the kernels cut each request into
    ``split_tokens``-token splits from the device ``seq_lens`` [max_reqs] int32 buffer. Each request
    then has at most ``max_q_len`` query rows, fixed at the first refresh (the warm-up before the
    capture); padding rows are regrouped into ``seq_len 0`` requests of at most that many rows, so a
    uniform-decode graph has the same query offsets every step (the Ascend tiling holds them).
    """

    num_tokens: int
    max_reqs: int
    max_splits: int
    max_work_items: int | None = None
    profile: str = DEFAULT_PROFILE
    policy: str = "auto"
    wrappers: dict = field(default_factory=dict)
    block_table: torch.Tensor | None = None
    _lengths: tuple | None = None  # (seq_lens [max_reqs], query_start_loc [max_reqs + 1]), host int32
    plans: dict = field(default_factory=dict)  # plan per (Hkv, page, Hq, D, kv bytes, window) of the last refresh
    captured: bool = False  # a graph was captured on these buffers (each later refresh precedes a replay)
    layers_captured: int = 0   # layer calls recorded by the capture
    uniform_steps: int = 0     # uniform-decode steps refreshed after the capture (the steps vLLM replays)
    replays: torch.Tensor | None = None   # int64 [1] on the device: + 1 per replay (the first layer's run counts)
    route: str = "ascend"
    split_tokens: int = 0   # > 0: device planning (tokens per split, fixed at capture)
    max_q_len: int = 0      # query rows per request (device plan, triton route); 0: fixed at the first refresh
    seq_lens: torch.Tensor | None = None         # [max_reqs] int32 on the device (triton route / device plan)
    query_start_loc: torch.Tensor | None = None  # [max_reqs + 1] int32 on the device

    def __post_init__(self):
        if self.route not in ROUTES:
            raise ValueError(f"route: expected one of {ROUTES}, got {self.route!r}")

    @staticmethod
    def key(*, num_q_heads, num_kv_heads, head_dim, page_size, dtype, kv_dtype, scale, soft_cap, window_left) -> tuple:
        return (int(num_q_heads), int(num_kv_heads), int(head_dim), int(page_size), dtype, kv_dtype, float(scale),
                None if soft_cap is None else float(soft_cap), None if window_left is None else int(window_left))

    def has(self, key: tuple) -> bool:
        return key in self.wrappers

    def add(self, key: tuple, *, k_cache: torch.Tensor, max_pages: int, workspace: torch.Tensor | None = None):
        """The wrapper of these layer constants, created (buffers allocated and filled) if new.

        ``workspace``: a 1-D float32 store shared with the graphs of other sizes (Ascend route; only one
        graph replays at a time), large enough for this one's plans (else the wrapper grows its own).
        Host work and device copies: call it outside a graph capture (an eager warm-up step).
        """
        w = self.wrappers.get(key)
        if w is not None:
            return w
        hq, hkv, d, page, dtype, kv_dtype, scale, soft_cap, window_left = key
        dev = k_cache.device
        if self.block_table is None:
            self.block_table = torch.zeros((self.max_reqs, int(max_pages)), dtype=torch.int32, device=dev)
        elif self.block_table.shape[1] != max_pages:
            raise ValueError(f"block_table: {max_pages} pages per request, this graph's buffer has "
                             f"{self.block_table.shape[1]}")
        if self.replays is None:
            self.replays = torch.zeros(1, dtype=torch.int64, device=dev)
        if self.seq_lens is None and (self.route == "triton" or self.split_tokens):
            self.seq_lens = torch.zeros(self.max_reqs, dtype=torch.int32, device=dev)
            self.query_start_loc = torch.zeros(self.max_reqs + 1, dtype=torch.int32, device=dev)
        why = self.device_unsupported(key)
        if self.split_tokens and why:
            once(logging.WARNING, "splitkv: device_plan: a layer keeps the host plan in full graphs (%s)", why)
        on_device = self.split_tokens > 0 and why is None
        const = dict(scale=scale, soft_cap=soft_cap, window_left=window_left, max_pages=int(max_pages),
                     num_pages=int(k_cache.shape[0]), device_plan=on_device)
        if self.route == "triton":
            from cuda_ref.wrapper import DecodeWrapper

            if on_device:
                w = DecodeWrapper(hq, hkv, d, page, dtype=dtype, kv_dtype=kv_dtype, device=dev,
                                  policy=f"size:{self.split_tokens}", device_plan=True)
            else:
                w = DecodeWrapper(hq, hkv, d, page, dtype=dtype, kv_dtype=kv_dtype, device=dev, policy=self.policy,
                                  graph_stable=True, max_splits=self.max_splits, max_work_items=self.max_work_items)
        else:
            from ascend_ops import AscendDecodeWrapper

            if on_device:  # slots for the longest request the block table holds: the kernels cut at S x max_splits
                S = self.split_tokens
                slots = -(-int(max_pages) * page // S)
                w = AscendDecodeWrapper(hq, hkv, d, page, dtype=dtype, kv_dtype=kv_dtype, device=dev,
                                        profile=self.profile, graph_stable=True, max_splits=slots,
                                        device_split_tokens=S, workspace=workspace)
            else:
                w = AscendDecodeWrapper(hq, hkv, d, page, dtype=dtype, kv_dtype=kv_dtype, device=dev,
                                        profile=self.profile, policy=self.policy, graph_stable=True,
                                        max_splits=self.max_splits, max_work_items=self.max_work_items,
                                        workspace=workspace)
        from . import errors   # the kernels' error counts, read by errors.poll every N steps

        if self.route == "triton":   # into the device's shared buffer
            errors.attach(w, k_cache.shape[0])
        else:                        # into the workspace's error section
            errors.attach_ascend(w, dev)
        w._splitkv_const = const
        self.wrappers[key] = w
        if self._lengths is not None:
            self._set(key, w)
        return w

    def device_unsupported(self, key: tuple) -> str | None:
        """``None`` when the layers of ``key`` can plan on the device with ``split_tokens``, else why not."""
        page, window_left = key[3], key[8]
        if not self.split_tokens:
            return "device_plan is off"
        if window_left is not None:
            return "sliding window: the device plan has none (the host plan skips the ranges before a window)"
        if self.split_tokens % page:
            return f"split_tokens {self.split_tokens} is not a multiple of the block size {page}"
        return None

    def pad(self, seq_lens, query_start_loc) -> tuple[np.ndarray, np.ndarray]:
        """Host lengths of ``B <= max_reqs`` requests -> ``max_reqs`` requests (padding: no rows, seq_len 0).

        The int32 buffers get only values that fit: lengths in ``[0, MAX_SEQ_LEN]``, offsets from 0,
        non-decreasing (``ValueError`` naming the argument otherwise; never a wrapped value). Cost:
        O(B) NumPy on the host, where the lengths already are."""
        sl, qsl = _host_lengths(seq_lens, query_start_loc)
        B = sl.shape[0]
        if B > self.max_reqs:
            raise ValueError(f"max_reqs: the batch has {B} requests, over this graph's capacity {self.max_reqs}")
        if qsl.shape[0] != B + 1:
            raise ValueError(f"query_start_loc: must be [B + 1] = [{B + 1}], got {qsl.shape[0]}")
        if qsl[-1] != self.num_tokens:
            raise ValueError(f"query_start_loc: ends at {int(qsl[-1])} rows; this graph has {self.num_tokens}")
        sl_p = np.zeros(self.max_reqs, np.int32)
        sl_p[:B] = sl
        qsl_p = np.full(self.max_reqs + 1, qsl[-1], np.int32)
        qsl_p[:B + 1] = qsl
        return sl_p, qsl_p

    def layout(self, seq_lens, query_start_loc) -> tuple[np.ndarray, np.ndarray]:
        """The padded lengths the buffers get: :meth:`pad`; with device planning or on the Triton route
        (whose launch packs the rows of the capture's longest request) the padding rows (the trailing
        ``seq_len 0`` requests, e.g. vLLM Ascend's one dummy request) are first regrouped into requests
        of at most ``max_q_len`` rows (set here at the first call: the most rows of a request with KV).

        Raises ``ValueError`` (``max_q_len``) for a request with KV and more rows than that.
        """
        if not self.split_tokens and self.route != "triton":
            return self.pad(seq_lens, query_start_loc)
        sl, qsl = _host_lengths(seq_lens, query_start_loc)
        q_lens = np.diff(qsl)
        real = int(np.flatnonzero(sl)[-1]) + 1 if sl.any() else 0   # requests past it are padding
        if not self.max_q_len:
            self.max_q_len = max(1, int(q_lens[:real].max(initial=1)))
        Q = self.max_q_len
        if real and int(q_lens[:real].max()) > Q:
            raise ValueError(f"max_q_len: a request has {int(q_lens[:real].max())} query rows; this graph's "
                             f"device plan was captured with {Q}")
        pad_rows = int(qsl[-1] - qsl[real])
        pad_q = np.full(-(-pad_rows // Q), Q, np.int64)
        if pad_q.size:
            pad_q[-1] = pad_rows - Q * (pad_q.size - 1)
        q_all = np.concatenate([q_lens[:real], pad_q])
        sl_all = np.concatenate([sl[:real], np.zeros(pad_q.size, np.int64)])
        return self.pad(sl_all, np.concatenate([[0], np.cumsum(q_all)]))

    def _plan_for(self, w) -> Plan:
        window_left = w._splitkv_const["window_left"]
        key = (w.plan_spec(), window_left)
        if key not in self.plans:
            sl, qsl = self._lengths
            self.plans[key] = w.plan_spec().make(sl, query_start_loc=qsl, window_left=window_left)
        return self.plans[key]

    def _set(self, key, w) -> None:
        c = w._splitkv_const
        if c["device_plan"]:
            self._set_device(w)
            return
        # the plan is fresh from the shared planner (_plan_for): valid by construction, not checked again
        if self.route == "triton":
            w.set_plan(self._plan_for(w), validate=False, window_left=c["window_left"])
            return
        w.set_plan(self._plan_for(w), scale=c["scale"], soft_cap=c["soft_cap"], window_left=c["window_left"],
                   max_pages=c["max_pages"], num_pages=c["num_pages"], validate=False)

    def _set_device(self, w) -> None:
        """Device planning: nothing per step on the Triton route (``max_q_len`` is given to the wrapper
        before its first run); on the Ascend route the tiling is built
        once (a plan of the padded layout with every length 0: the kernels read neither its items nor its
        lengths) and the query offsets, which the tiling holds, must stay those of that first step."""
        if self.route == "triton":
            if w.max_q_len is None:  # before its first run (the capture): the launch packs this many rows
                w.max_q_len = self.max_q_len
            return
        c = w._splitkv_const
        sl, qsl = self._lengths
        if w.host_plan is None:
            w.plan(np.zeros_like(sl), query_start_loc=qsl, scale=c["scale"], soft_cap=c["soft_cap"],
                   max_pages=c["max_pages"], num_pages=c["num_pages"])
        elif not np.array_equal(w.host_plan.query_start_loc, qsl):
            raise ValueError("query_start_loc: this step's query rows per request differ from the captured "
                             f"graph's ({qsl.tolist()} vs {np.asarray(w.host_plan.query_start_loc).tolist()}); "
                             "the Ascend device plan fixes them at capture")

    def refresh(self, seq_lens, query_start_loc, block_table: torch.Tensor) -> None:
        """Plan this step's padded batch and rewrite every buffer in place (host; outside the graph).
        Device-planned wrappers get no plan: only the lengths, query offsets and block table are copied.

        ``seq_lens`` ``[B]`` and ``query_start_loc`` ``[B + 1]`` are host lengths (padding requests
        already given ``seq_len 0``); ``block_table`` ``[B, max_pages]`` int32 on the device is copied
        into the fixed buffer (rows past ``B`` zeroed), ordered on the current stream.

        All or nothing: the block table's metadata (:meth:`_check_step_block_table`), the lengths and
        every wrapper's plan are checked (planned) before the first buffer changes; a wrapper that
        still refuses its plan puts the ones set before it back on the previous step's plans. A
        refused step leaves the lengths, plans and buffers of the previous one (the next replay runs
        the previous step, never half of this one).

        Raises ``ValueError`` naming the bound (``max_reqs``, ``max_work_items``) a step exceeds, or
        the argument (``block_table``, ``seq_lens``, ``query_start_loc``) that is malformed.
        """
        n_req = int(np.shape(seq_lens)[0]) if np.ndim(seq_lens) == 1 else -1
        self._check_step_block_table(block_table, n_req)
        max_q_len = self.max_q_len      # layout() fixes it at the first step
        old = (self._lengths, self.plans)
        try:
            lengths = self.layout(seq_lens, query_start_loc)
            self._lengths, self.plans = lengths, {}
            # every host plan first (the planner refuses a step over the capacity): no wrapper changed yet
            for w in self.wrappers.values():
                if not w._splitkv_const["device_plan"]:
                    self._plan_for(w)
            done = []
            try:
                for key, w in self.wrappers.items():
                    self._set(key, w)
                    done.append((key, w))
            except Exception:
                self._lengths, self.plans = old
                if old[0] is not None:
                    for key, w in done:   # back to the previous step's plans (valid: they were in use)
                        self._set(key, w)
                raise
        except Exception:
            self._lengths, self.plans, self.max_q_len = old + (max_q_len,)
            raise
        if self.block_table is not None:
            B = block_table.shape[0]
            self.block_table[:B].copy_(block_table)
            self.block_table[B:].zero_()
        if self.seq_lens is not None:  # the lengths the kernels read on the device (no plan from them)
            self.seq_lens.copy_(torch.from_numpy(lengths[0]))
            self.query_start_loc.copy_(torch.from_numpy(lengths[1]))

    def _check_step_block_table(self, block_table, num_requests: int) -> None:
        """A step's ``block_table`` fits the fixed buffer: an int32 ``[B, max_pages]`` tensor on its
        device, one row per request of ``seq_lens`` (``num_requests``), at most ``max_reqs`` rows,
        the buffer's ``max_pages`` columns. Metadata only (O(1), no device read); raises
        ``ValueError`` / ``TypeError`` naming ``block_table``."""
        if not isinstance(block_table, torch.Tensor) or block_table.dim() != 2:
            got = tuple(block_table.shape) if isinstance(block_table, torch.Tensor) else type(block_table).__name__
            raise ValueError(f"block_table: must be a [B, max_pages] int32 tensor, got {got}")
        if block_table.dtype != torch.int32:
            raise TypeError(f"block_table: dtype must be int32, got {block_table.dtype}")
        B, pages = block_table.shape
        if num_requests >= 0 and B != num_requests:
            raise ValueError(f"block_table: {B} rows for {num_requests} requests (seq_lens); one row per request")
        if B > self.max_reqs:
            raise ValueError(f"max_reqs: the block table has {B} rows, over this graph's capacity {self.max_reqs}")
        buf = self.block_table
        if buf is not None:
            if pages != buf.shape[1]:
                raise ValueError(f"block_table: {pages} pages per request, this graph's buffer has {buf.shape[1]}")
            if block_table.device != buf.device:
                raise ValueError(f"block_table: on {block_table.device}, this graph's buffer is on {buf.device}")

    def run(self, key: tuple, q, k_cache, v_cache, *, out=None, count: bool = False):
        """The decode of the layers with constants ``key`` on the current buffers: ``(out, lse)``.

        Enqueues the kernels only: no host read, no allocation, no host work (capturable); with
        ``count`` (the graph's first layer) also one increment of the device counter :attr:`replays`,
        which every replay repeats.
        ``q`` ``[num_tokens, Hq, D]``; ``out`` (optional) the same shape, else the wrapper's buffer.
        """
        w = self.wrappers[key]
        c = w._splitkv_const
        if self.route == "triton":
            o, lse = w.run(q, k_cache, v_cache, self.block_table, self.seq_lens, self.query_start_loc,
                           scale=c["scale"], soft_cap=c["soft_cap"], window_left=c["window_left"])
            if out is not None:
                out.copy_(o)
                o = out
        else:
            o, lse = w.run(q, k_cache, v_cache, self.block_table, seq_lens=self.seq_lens if c["device_plan"] else None,
                           scale=c["scale"], soft_cap=c["soft_cap"], window_left=c["window_left"], out=out)
        if count and self.replays is not None:   # captured with the kernels: the count grows at each replay
            self.replays.add_(1)
        return o, lse
