"""The shared-prefix planner's cost model (``docs/shared-prefix.md``, "The planner's decision"): one
kernel's estimate (:func:`stage_us`), the merge's (:func:`merge_us`), the programs a prefix work item
takes (:func:`packed_row_blocks`) and the prefix plan's own split length (:func:`prefix_split`).
Estimates in µs from a :class:`~splitkv_common.devices.DeviceProfile`; no measurement."""

from __future__ import annotations

import numpy as np

from .devices import DeviceProfile
from .plan import Plan
from .policies import auto_candidates, item_bandwidth

#: the packed query rows (rows x GQA group) one prefix program holds: the ``M`` of its matrix product
#: (at least 16, the tensor cores' smallest tile).
PREFIX_BLOCK_M = 64


def stage_us(prof: DeviceProfile, read_bytes: float, items: int, longest_bytes: float, flops: float = 0.0,
              reread_bytes: float = 0.0, lone_bw: float = 0.0, longest_tokens: int = 0) -> float:
    """One kernel of the cost model (``docs/planner.md``): a launch, the bytes at the device's
    bandwidth (or the longest item at one unit's), the matrix work at ``dot_tflops``, per-wave cost.
    ``reread_bytes`` of ``read_bytes`` are re-reads of bytes other items read at about the same time,
    charged at ``l2_reread_gbps`` where the profile knows it. ``lone_bw`` (bytes / µs,
    :func:`~splitkv_common.policies.lone_bandwidth`): a split-kernel plan of one item a unit whose
    longest item has ``longest_tokens >= lone_min_tokens`` streams at that rate, as the planner's own
    model says (the backend's deeper-tile configuration)."""
    bw, unit_bw = prof.bandwidth_gbps * 1e3, item_bandwidth(prof, items, longest_tokens, lone_bw)
    reread = min(max(reread_bytes, 0.0), read_bytes) if prof.l2_reread_gbps > 0 else 0.0
    t_read = (read_bytes - reread) / bw + (reread / (prof.l2_reread_gbps * 1e3) if reread else 0.0)
    slots = prof.units * prof.items_per_unit
    t_dot = flops / (prof.dot_tflops * 1e6) if flops and prof.dot_tflops > 0 else 0.0
    waves = -(-items // slots)
    return prof.launch_us + max(t_read, longest_bytes / unit_bw, t_dot) + waves * prof.item_overhead_us


def plan_bytes_and_items(plan: Plan, token_bytes: int, num_kv_heads: int) -> tuple[float, int, float]:
    n = plan.num_valid_items
    lens = (plan.item_kv_end[:n].astype(np.int64) - plan.item_kv_start[:n])
    return float(lens.sum() * token_bytes), n, float(lens.max(initial=0) * token_bytes)


def merge_us(prof: DeviceProfile, slots_read: int, num_q_heads: int, head_dim: int) -> float:
    """The merge kernel: a launch, each partial written then read (o and lse, float32)."""
    return prof.launch_us + slots_read * 2 * num_q_heads * (head_dim + 1) * 4 / (prof.bandwidth_gbps * 1e3)


def packed_row_blocks(rows: int, group: int, block_m: int = PREFIX_BLOCK_M) -> int:
    """Programs a prefix work item takes: its group's ``rows x group`` packed rows in blocks of ``block_m``."""
    return max(1, -(-rows * group // block_m))


def prefix_split(prof: DeviceProfile, prefix_len, rows, blocks, *, num_kv_heads: int, num_q_heads: int,
                 head_dim: int, token_bytes: int, page_size: int) -> tuple[int, str]:
    """The prefix plan's split length (tokens) under ``auto``: the candidate of least estimated prefix
    stage plus its partials' share of the merge, and a clause for the plan's reason.

    The plain planner's ``auto`` sees the groups as a few long requests and splits them to fill the
    device; but each prefix work item runs once per block of packed rows (``blocks [G]``) and each of
    its splits adds a partial state for every one of the group's ``rows [G]`` query rows and
    ``num_q_heads`` heads (float32 o and lse, written by the stage and read by the merge). The
    candidates are ``auto``'s lengths (:func:`~splitkv_common.policies.auto_candidates`: the profile's
    shortest split doubled, at most ``max_splits`` a group) and the longest prefix unsplit; each is
    costed by :func:`stage_us`, the stage model of
    :func:`~splitkv_common.shared_prefix.plan_shared_prefix`, from the groups' lengths
    alone (no plan is made). Ties go to the longer split (fewer partials)."""
    lens = np.asarray(prefix_len, np.int64)
    rows, blocks = np.asarray(rows, np.int64), np.asarray(blocks, np.int64)
    longest = int(lens.max(initial=0))
    whole = max(page_size, -(-longest // page_size) * page_size)
    cands = [c for c in auto_candidates(longest, prof.min_split_tokens, page_size, prof.max_splits) if c]
    cands.append(whole)
    group = num_q_heads // num_kv_heads
    unique = float(lens.sum() * num_kv_heads * token_bytes)
    read = float((lens * blocks).sum() * num_kv_heads * token_bytes)
    flops = float((lens * rows).sum()) * num_kv_heads * group * head_dim * 4
    slot_bytes = 2 * num_q_heads * (head_dim + 1) * 4 / (prof.bandwidth_gbps * 1e3)   # µs a row's partial
    c = np.array(cands, np.int64)[:, None]
    splits = np.maximum(1, -(-lens[None, :] // c))                        # [C, G]
    programs = (splits * blocks).sum(1) * num_kv_heads
    partial_us = (splits * rows).sum(1) * slot_bytes
    costs = [stage_us(prof, read, int(n), float(min(s, longest) * token_bytes), flops, reread_bytes=read - unique)
             + float(m) for s, n, m in zip(cands, programs, partial_us)]
    i = len(costs) - 1 - int(np.argmin(costs[::-1]))   # the longest of the least
    size, most = cands[i], int(splits[i].max(initial=1))
    return size, f"; prefix split {size} tokens ({most} a group; least est. of {len(cands)} lengths)"
