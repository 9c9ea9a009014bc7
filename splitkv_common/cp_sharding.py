"""Sharding one batch's KV history across the ranks of a context-parallel group (NumPy only).

Each request's logical pages (its row of the block table) are divided among ``W`` ranks under one of
two layouts (``docs/context-parallel.md``):

* ``contiguous``: rank ``r`` owns one contiguous range of logical pages. By default the ranges are
  balanced (rank ``r`` owns pages ``[ceil(r n / W), ceil((r + 1) n / W))`` of a request with ``n``
  pages); with ``capacity_pages=C`` rank ``r`` owns ``[r C, (r + 1) C)``, the layout of a cache
  that fills one device before the next.
* ``round_robin``: logical page ``j`` lives on rank ``j % W`` (vLLM's decode context parallelism
  with ``cp_kv_cache_interleave_size`` equal to the page size).

In both layouts a rank's pages keep their logical order and only a request's last logical page
can be partial, so a rank's pages are all full except possibly its last one: local token ``i``
is at local page ``i // page_size``, slot ``i % page_size``, exactly as in an unsharded cache.

Masking (the causal tail of multi-query rows, sliding windows) is defined on the *global* logical
positions. :class:`Shard` therefore carries both views:

* the **local view**: the rank's block table (its pages in logical order) and ``seq_lens`` (its
  token count per request), what a plain decode call takes; exact when every row of the rank sees
  its whole shard the same way in both coordinate systems (:meth:`Shard.local_view_exact`), always
  true for one query row per request without a window;
* the **global view**: a block table indexed by the global logical page (entries of pages the rank
  does not own point to local page 0 and are never read), the global ``seq_lens``, and a
  :class:`~splitkv_common.plan.Plan` whose work items are the rank's own page runs in global
  positions (:func:`shard_plan`). Every backend that executes plans (NumPy, torch, Triton) then
  masks by global positions: exact for both layouts, every mask.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from .plan_layout import Plan, visible_range
from .policies import SplitPolicy
from .validation import MAX_SEQ_LEN, as_int64_lengths

_INT32_MAX = (1 << 31) - 1

LAYOUTS = ("contiguous", "round_robin")


def _cdiv(a, b):
    return -(-a // b)


def page_owners(num_pages: int, world_size: int, layout: str, capacity_pages: int | None = None) -> np.ndarray:
    """``[num_pages]`` int32: the rank owning each logical page of a request with ``num_pages`` pages."""
    if world_size <= 0:
        raise ValueError(f"world_size: must be positive, got {world_size}")
    if layout not in LAYOUTS:
        raise ValueError(f"layout: unknown {layout!r}; expected one of {LAYOUTS}")
    j = np.arange(num_pages, dtype=np.int64)
    if layout == "round_robin":
        if capacity_pages is not None:
            raise ValueError("capacity_pages: only for the contiguous layout")
        return (j % world_size).astype(np.int32)
    if capacity_pages is not None:
        if capacity_pages <= 0:
            raise ValueError(f"capacity_pages: must be positive, got {capacity_pages}")
        if num_pages > capacity_pages * world_size:
            raise ValueError(f"capacity_pages: a request of {num_pages} pages does not fit on {world_size} ranks "
                             f"of {capacity_pages} pages")
        return (j // capacity_pages).astype(np.int32)
    # balanced: rank r starts at ceil(r n / W); the owner of page j is the last rank starting at or before j
    starts = _cdiv(np.arange(world_size + 1, dtype=np.int64) * num_pages, world_size)
    return (np.searchsorted(starts, j, side="right") - 1).astype(np.int32)


@dataclass(frozen=True)
class Shard:
    """What rank ``rank`` of ``world_size`` holds of a batch.

    Attributes:
        block_table: int32 ``[B, max_local_pages]``, the rank's pages of each request in logical
            order (physical ids of the table it was cut from; :func:`localize` renumbers them), ``-1``
            past a request's local pages.
        logical_pages: int32, same shape: the global logical page index of each local page (``-1`` pad).
        seq_lens: int32 ``[B]``: the rank's tokens of each request (``0`` for an empty shard).
        global_seq_lens: int32 ``[B]``: the requests' whole lengths.
    """

    rank: int
    world_size: int
    layout: str
    page_size: int
    block_table: np.ndarray
    logical_pages: np.ndarray
    seq_lens: np.ndarray
    global_seq_lens: np.ndarray

    @property
    def batch_size(self) -> int:
        return int(self.seq_lens.shape[0])

    def positions_of(self, b: int) -> np.ndarray:
        """int64 ``[seq_lens[b]]``: the global logical position of each local token of request ``b``."""
        n = int(self.seq_lens[b])
        i = np.arange(n, dtype=np.int64)
        return self.logical_pages[b, i // self.page_size].astype(np.int64) * self.page_size + i % self.page_size

    def positions(self) -> np.ndarray:
        """int64 ``[B, max local tokens]``: global positions of the local tokens, ``-1`` padding."""
        L = int(self.seq_lens.max(initial=0))
        out = np.full((self.batch_size, L), -1, np.int64)
        for b in range(self.batch_size):
            p = self.positions_of(b)
            out[b, :p.shape[0]] = p
        return out

    def global_block_table(self) -> np.ndarray:
        """int32 ``[B, max global pages]``: column ``j`` is this rank's page holding global logical page
        ``j``, or ``0`` (a page that is never read) where another rank owns it."""
        n = int(_cdiv(int(self.global_seq_lens.max(initial=0)), self.page_size))
        out = np.zeros((self.batch_size, max(n, 1)), np.int32)
        for b in range(self.batch_size):
            k = int(_cdiv(int(self.seq_lens[b]), self.page_size))
            out[b, self.logical_pages[b, :k]] = self.block_table[b, :k]
        return out

    def local_view_exact(self, query_start_loc=None, window_left: int | None = None) -> bool:
        """Whether a plain decode of the local view (local lengths, local positions ``0..n-1``)
        gives every row exactly the visibility it has in global positions.

        Always true for one query row per request without a window (a single query sees its whole
        history, and attention is a function of the set of positions, not their order). With more
        rows or a window it holds e.g. for the rank that owns the tail of a contiguous layout.
        """
        qsl = np.arange(self.batch_size + 1) if query_start_loc is None else np.asarray(query_start_loc)
        q_lens = np.diff(qsl).astype(np.int64)
        w = None if window_left is None or window_left < 0 else int(window_left)
        for b in range(self.batch_size):
            n, q, S = int(self.seq_lens[b]), int(q_lens[b]), int(self.global_seq_lens[b])
            if n == 0 or q == 0 or (q == 1 and w is None):
                continue
            i = np.arange(q, dtype=np.int64)[:, None]
            pos = self.positions_of(b)[None, :]
            loc = np.arange(n, dtype=np.int64)[None, :]
            qg, ql = S - q + i, n - q + i
            g = pos <= qg
            lo = loc <= ql
            if w is not None:
                g &= pos >= qg - w
                lo &= loc >= ql - w
            if not np.array_equal(g, lo):
                return False
        return True


def check_used_page_ids(block_table, seq_lens, page_size: int, num_pages: int | None = None,
                        name: str = "block_table") -> None:
    """Every entry a request uses (its first ``ceil(seq_len / page_size)`` columns) is a page id:
    ``>= 0``, within int32 (a shard's tables are int32: no id is narrowed unchecked) and, given
    ``num_pages``, below it. ``-1`` in a used entry is refused here, on the host, so that every shard
    backend reads the same thing (``docs/conventions.md``, Page ids). Entries past a request's length
    may hold anything. Cost: one vectorised pass over the table (once per batch, on the host)."""
    bt = np.asarray(block_table)
    seq = np.asarray(seq_lens, np.int64)
    if bt.size == 0 or seq.size == 0:
        return
    cols = np.arange(bt.shape[1], dtype=np.int64)[None, :] * int(page_size)
    used = cols < seq[:, None]
    hi = _INT32_MAX if num_pages is None else min(_INT32_MAX, int(num_pages) - 1)
    ids = bt.astype(np.int64) if bt.dtype != np.uint64 else bt
    bad = used & ((ids < 0) | (ids > hi))
    if bad.any():
        b, j = (int(i) for i in np.argwhere(bad)[0])
        x = int(bt[b, j])
        if x < 0:
            why = "a used entry must be a page id >= 0 (-1 marks only entries past the request's length)"
        elif x > _INT32_MAX:
            why = f"page ids must fit int32 (at most {_INT32_MAX})"
        else:
            why = f"out of range [0, {num_pages}) (num_pages of k_cache)"
        raise ValueError(f"{name}: entry [{b}, {j}] = {x} of request {b} ({int(seq[b])} tokens): {why}")


def shard(block_table, seq_lens, rank: int, world_size: int, layout: str = "contiguous", *, page_size: int,
          capacity_pages: int | None = None) -> Shard:
    """Rank ``rank``'s share of a batch (``block_table [B, max_pages]``, ``seq_lens [B]``)."""
    if not 0 <= rank < world_size:
        raise ValueError(f"rank: must be in [0, {world_size}), got {rank}")
    if page_size <= 0:
        raise ValueError(f"page_size: must be positive, got {page_size}")
    bt = np.asarray(block_table)
    seq = as_int64_lengths(seq_lens, "seq_lens")
    if bt.ndim != 2 or bt.shape[0] != seq.shape[0]:
        raise ValueError(f"block_table: must be [B, max_pages] with B = {seq.shape[0]}, got {bt.shape}")
    if bt.dtype.kind not in "iu":
        raise TypeError(f"block_table: dtype must be an integer type (int32 or int64), got {bt.dtype}")
    if (seq < 0).any():
        raise ValueError("seq_lens: must be >= 0")
    if seq.size and int(seq.max()) > MAX_SEQ_LEN:
        b = int(np.argmax(seq))
        raise ValueError(f"seq_lens: request {b} has {int(seq[b])} tokens, over the limit MAX_SEQ_LEN = {MAX_SEQ_LEN} "
                         f"(a shard's lengths are int32)")
    check_used_page_ids(bt, seq, page_size)
    B = seq.shape[0]
    per_req_pages, per_req_tokens = [], np.zeros(B, np.int64)
    for b in range(B):
        n_pages = int(_cdiv(int(seq[b]), page_size))
        if n_pages > bt.shape[1]:
            raise ValueError(f"block_table: request {b} needs {n_pages} pages, the table has {bt.shape[1]} columns")
        owner = page_owners(n_pages, world_size, layout, capacity_pages)
        mine = np.flatnonzero(owner == rank)
        per_req_pages.append(mine)
        tokens = np.minimum(page_size, int(seq[b]) - mine * page_size)
        per_req_tokens[b] = int(tokens.sum())
    P = max([m.shape[0] for m in per_req_pages], default=0)
    local_bt = np.full((B, max(P, 1)), -1, np.int32)
    logical = np.full((B, max(P, 1)), -1, np.int32)
    for b, mine in enumerate(per_req_pages):
        local_bt[b, :mine.shape[0]] = bt[b, mine]
        logical[b, :mine.shape[0]] = mine
    return Shard(rank, world_size, layout, int(page_size), local_bt, logical, per_req_tokens.astype(np.int32),
                 seq.astype(np.int32))


def shard_all(block_table, seq_lens, world_size: int, layout: str = "contiguous", *, page_size: int,
              capacity_pages: int | None = None) -> list[Shard]:
    """Every rank's :class:`Shard`."""
    return [shard(block_table, seq_lens, r, world_size, layout, page_size=page_size, capacity_pages=capacity_pages)
            for r in range(world_size)]


def localize(s: Shard, k_cache, v_cache):
    """The rank's own cache: ``(shard, k_local, v_local)`` with only the pages ``s`` uses (at least
    one, a copy of page 0 of the input, for an empty rank), and the shard's block table renumbered
    into them. Works on NumPy arrays and torch tensors alike (plain indexing)."""
    check_used_page_ids(s.block_table, s.seq_lens, s.page_size, int(k_cache.shape[0]), name="shard.block_table")
    used = s.block_table[s.block_table >= 0]
    ids = np.unique(used)
    if ids.size == 0:
        ids = np.zeros(1, np.int64)
    remap = np.full(int(ids.max()) + 1, -1, np.int64)
    remap[ids] = np.arange(ids.size)
    bt = np.where(s.block_table >= 0, remap[np.maximum(s.block_table, 0)], -1).astype(np.int32)
    idx = ids.astype(np.int64)
    if hasattr(k_cache, "index_select"):  # torch: keep the device
        import torch
        t = torch.as_tensor(idx, device=k_cache.device)
        return replace(s, block_table=bt), k_cache.index_select(0, t), v_cache.index_select(0, t)
    return replace(s, block_table=bt), np.asarray(k_cache)[idx], np.asarray(v_cache)[idx]


def shard_plan(s: Shard, *, num_kv_heads: int, query_start_loc=None, window_left: int | None = None,
               split_tokens: int = 0) -> Plan:
    """The rank's work as a :class:`~splitkv_common.plan.Plan` in *global* positions, for the global
    view (:meth:`Shard.global_block_table`, ``global_seq_lens``).

    Work items are the maximal runs of the rank's consecutive logical pages, clipped to the
    request's visible range (``plan.visible_range``: a window's positions no row sees are skipped)
    and cut at multiples of ``split_tokens`` (``0``: no cut). A request with nothing of this rank
    visible gets one empty item per KV head, so its rows come out as ``0, -inf``.
    Round-robin runs are single pages: correct on every backend, one work item per page.
    """
    page = s.page_size
    B = s.batch_size
    qsl = np.arange(B + 1) if query_start_loc is None else np.asarray(query_start_loc).astype(np.int64)
    ql = np.diff(qsl)
    w = None if window_left is None or window_left < 0 else int(window_left)
    per_req: list[list[tuple[int, int]]] = []
    for b in range(B):
        lo, hi = visible_range(int(s.global_seq_lens[b]), int(ql[b]), w)
        k = int(_cdiv(int(s.seq_lens[b]), page))
        pages = s.logical_pages[b, :k].astype(np.int64)
        rngs = []
        if k:
            cut = np.flatnonzero(np.diff(pages) != 1) + 1
            for run in np.split(pages, cut):
                a, e = max(int(run[0]) * page, lo), min((int(run[-1]) + 1) * page, hi)
                while a < e:
                    stop = e if split_tokens <= 0 else min(e, (a // split_tokens + 1) * split_tokens)
                    rngs.append((a, stop))
                    a = stop
        per_req.append(rngs or [(0, 0)])
    num_splits = np.array([len(r) for r in per_req], np.int32)
    T = int(qsl[-1])
    row_ns = num_splits[np.repeat(np.arange(B), ql)] if T else np.zeros(0, np.int32)
    row_start = np.concatenate([[0], np.cumsum(row_ns)[:-1]]).astype(np.int32) if T else np.zeros(0, np.int32)
    items = [(b, h, j, a, e) for b, rngs in enumerate(per_req) for h in range(num_kv_heads)
             for j, (a, e) in enumerate(rngs)]
    arr = np.array(items, np.int32).reshape(-1, 5)
    return Plan(item_request=arr[:, 0].copy(), item_kv_head=arr[:, 1].copy(), item_split=arr[:, 2].copy(),
                item_kv_start=arr[:, 3].copy(), item_kv_end=arr[:, 4].copy(), num_valid_items=len(items),
                num_splits=num_splits, query_start_loc=qsl.astype(np.int32), row_slot_start=row_start,
                row_num_splits=row_ns.astype(np.int32), num_slots=int(row_ns.sum()), num_kv_heads=int(num_kv_heads),
                page_size=page, policy=SplitPolicy("fixed_size", split_tokens) if split_tokens > 0 else SplitPolicy("none"),
                split_tokens=int(max(split_tokens, 0)), graph_stable=False,
                reason=f"context-parallel shard {s.rank}/{s.world_size} ({s.layout}): the rank's page runs in global "
                       f"positions")
