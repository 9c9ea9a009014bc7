"""Shared-prefix decode (``splitkv_common.shared_prefix``) on the Ascend kernels.

The prefix stage is the mixed kernel's own work item with ``M`` = the group's query rows: the rows
of a group (contiguous in ``q``), in chunks of at most ``PREFIX_ROWS_PER_ITEM`` query-row x GQA
rows, become the query rows of one "request" of a plain batch whose block-table row is the
group's prefix pages and whose work ranges are ``[0, prefix_len)`` (:func:`prefix_batch`). Every
row of it must see the whole prefix (the prefix is history for all of them), so the plan's
``seqLens`` words say ``prefix_len + q_rows - 1``: the kernels' causal rule (row ``i`` sees
positions up to ``seq_len - q_rows + i``) then cuts nothing inside ``[0, prefix_len)``, and the
band past it holds no work. One launch reads each group's prefix once per chunk for all its
rows, on the cube (16-bit KV; float32 takes the vector kernel). The tails run as the plain
batch of :func:`~splitkv_common.shared_prefix.tail_inputs`, and each covered row's two states are
merged exactly (:func:`~splitkv_common.merge.merge_states`).

A batch with a sliding window takes the plain route: a chunk's rows sit at different positions,
which one "request" of the plain kernels cannot express.

:func:`ascend_ops.sim_backend.run_twin_shared_prefix` runs it on the CPU twin (the ``ascend-sim``
backend's shared-prefix route); nothing here ran on an NPU.
"""

from __future__ import annotations

import numpy as np

from splitkv_common.inputs import DecodeInputs
from splitkv_common.shared_prefix import Groups

#: query rows x GQA group of one prefix item: the cube's M (a multiple of 16 up to MIX_MAX_ROWS)
PREFIX_ROWS_PER_ITEM = 64


def prefix_layout(groups: Groups, gqa: int, rows_per_item: int = PREFIX_ROWS_PER_ITEM) -> tuple:
    """The prefix stage's batch from host facts alone: ``(block_table, seq_lens, query_start_loc,
    causal_lens, rows)``, one request per chunk of a group's query rows (``max(1, rows_per_item //
    gqa)`` rows a chunk): block-table row the group's prefix pages (-1 padded, never read),
    ``seq_lens`` the prefix length (what the plan's ranges cover), ``causal_lens`` int32 ``[Bv]`` the
    lengths the kernels must see (``prefix_len + rows - 1``, written over the plan's ``seqLens``
    words), ``rows`` int64 ``[Tv]`` each row's row in the batch."""
    per = max(1, rows_per_item // gqa)
    rows, bt_rows, lens, qsl = [], [], [], [0]
    for g in range(groups.num_groups):
        P = int(groups.prefix_len[g])
        for a in range(int(groups.row_start[g]), int(groups.row_end[g]), per):
            r = np.arange(a, min(a + per, int(groups.row_end[g])))
            rows.append(r)
            bt_rows.append(groups.pages[g])
            lens.append(P)
            qsl.append(qsl[-1] + r.size)
    rows = np.concatenate(rows).astype(np.int64) if rows else np.zeros(0, np.int64)
    lens = np.asarray(lens, np.int32)
    bt = np.stack(bt_rows).astype(np.int32) if bt_rows else np.zeros((0, 1), np.int32)
    qsl = np.asarray(qsl, np.int32)
    causal = (lens + np.diff(qsl) - 1).astype(np.int32)
    return bt, lens, qsl, causal, rows


def prefix_batch(inp: DecodeInputs, groups: Groups,
                 rows_per_item: int = PREFIX_ROWS_PER_ITEM) -> tuple[DecodeInputs, np.ndarray, np.ndarray]:
    """The prefix stage as a plain batch: ``(inputs, causal_lens, rows)`` (:func:`prefix_layout`).

    ``inputs``: ``q`` the chunks' rows ``[Tv, Hq, D]``, the layout's block table, lengths and rows,
    no window; caches, scale, soft cap and int8 scales are ``inp``'s."""
    G = inp.q.shape[1] // inp.k_cache.shape[2]
    bt, lens, qsl, causal, rows = prefix_layout(groups, G, rows_per_item)
    vin = DecodeInputs(q=np.ascontiguousarray(inp.q[rows]), k_cache=inp.k_cache, v_cache=inp.v_cache, block_table=bt,
                       seq_lens=lens, query_start_loc=qsl, dtype=inp.dtype, scale=inp.scale,
                       soft_cap=inp.soft_cap, window_left=None, k_scale=inp.k_scale, v_scale=inp.v_scale,
                       k_offset=inp.k_offset, v_offset=inp.v_offset)
    return vin, causal, rows
