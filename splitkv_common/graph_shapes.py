"""Graph-stable shapes: the work-item capacity a graph-stable plan is padded to.

A graph-stable plan (``graph_stable=True``) keeps its shapes from step to step so that a captured
graph replays it: ``max_splits`` partial slots per query row and :func:`graph_capacity` work items
(padding items have ``item_request = -1`` and an empty range).
"""

from __future__ import annotations

from .devices import DeviceProfile
from .policies import SplitPolicy

# A graph-stable plan's default capacity where the policy leaves the work items to the planner
# (``auto`` on GPU profiles, ``none``): twice the batch's (request, KV head) pairs, at least 4 per
# unit (528 on the H200), at most the worst case ``B x Hkv x max_splits``. Its grid is the capacity:
# each padding program costs a launch slot (B 32 x 8k, 256 valid items: 269 µs with 528, 273-284 with
# 1,056, 290 with 2,112; run 41), and the whole plan is copied every step, 20 bytes an item (a 42 KB
# copy node cost 7 µs more than a 10 KB one, run 33). Against 8 per unit, the longer splits it makes
# auto take were 1-2 % faster at B 3-24 x 16k-64k and 1-2 % slower at B 8-16 x 128k-256k (run 41;
# docs/perf-notes.md)
GRAPH_ITEMS_PER_UNIT = 4


def graph_capacity(batch_size: int, num_kv_heads: int, max_splits: int, policy: SplitPolicy,
                   prof: DeviceProfile, max_work_items: int | None = None) -> int:
    """The work-item capacity of a graph-stable plan: ``max_work_items`` if given; by default
    ``B x Hkv x max_splits`` (what ``size:N`` and ``count:N`` may need), and for ``auto`` on a GPU
    profile and ``none`` ``min(B x Hkv x max_splits, max(2 x B x Hkv, 4 x units))``: ``auto`` then
    chooses among the splits whose work items fit it (no split always does)."""
    if max_work_items is not None:
        return int(max_work_items)
    worst = batch_size * num_kv_heads * max_splits
    if policy.kind == "none" or (policy.kind == "auto" and not prof.cube_units):
        return min(worst, max(2 * batch_size * num_kv_heads, GRAPH_ITEMS_PER_UNIT * prof.units))
    return worst
