"""The seed's worked example (sections 03 and 04), computed with the real merge code.

Scores ``s = [0, ln2, ln3, ln4]`` (weights 1:2:3:4) and ``V = [1, 2, 4, 8]``: the full output is
``49/10 = 4.9``. Cut into blocks, each block's state ``(m, l, u)`` is merged exactly by
:func:`splitkv_common.merge.merge_states`; averaging the blocks' outputs gives 3.976 for two blocks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .merge import merge_states, naive_average
from .states import mlu_to_state, state_to_mlu

SCORES = np.log(np.array([1.0, 2.0, 3.0, 4.0]))
VALUES = np.array([1.0, 2.0, 4.0, 8.0])


@dataclass(frozen=True)
class Block:
    positions: tuple[int, ...]
    m: float
    l: float
    u: float
    out: float
    lse: float


@dataclass(frozen=True)
class Explanation:
    full_out: float
    blocks: list[Block]
    merged_m: float
    merged_l: float
    merged_u: float
    merged_out: float
    merged_lse: float
    naive_average: float


def block_bounds(n_positions: int, splits: int) -> list[tuple[int, int]]:
    """Contiguous, as-equal-as-possible blocks (the first ones one longer)."""
    if not 1 <= splits <= n_positions:
        raise ValueError(f"splits: must be between 1 and {n_positions}, got {splits}")
    base, extra = divmod(n_positions, splits)
    out, a = [], 0
    for i in range(splits):
        b = a + base + (1 if i < extra else 0)
        out.append((a, b))
        a = b
    return out


def explain(splits: int = 2, scores=SCORES, values=VALUES) -> Explanation:
    """Blocks' ``(m, l, u)``, the exact merge and the naive average for ``splits`` blocks."""
    s = np.asarray(scores, np.float64)
    v = np.asarray(values, np.float64)
    w = np.exp(s - s.max())
    full = float((w * v).sum() / w.sum())
    blocks, os_, lses = [], [], []
    for a, b in block_bounds(len(s), splits):
        m = float(s[a:b].max())
        e = np.exp(s[a:b] - m)
        l, u = float(e.sum()), float((e * v[a:b]).sum())
        o, lse = mlu_to_state(np.array([m]), np.array([l]), np.array([[u]]))
        blocks.append(Block(tuple(range(a, b)), m, l, u, float(o[0, 0]), float(lse[0])))
        os_.append(o)
        lses.append(lse)
    out, lse = merge_states(np.stack(os_), np.stack(lses))
    m_all = max(b.m for b in blocks)
    merged = state_to_mlu(out.astype(np.float64), lse, m=np.array([m_all]))
    return Explanation(full, blocks, m_all, float(merged.l[0]), float(merged.u[0, 0]), float(out[0, 0]),
                       float(lse[0]), float(naive_average(np.stack(os_))[0, 0]))


def _ln(x: float) -> str:
    """Pretty-print a value as ln(k) when it is the log of a small integer."""
    k = math.exp(x)
    return f"ln{round(k)}" if abs(k - round(k)) < 1e-9 and round(k) > 1 else f"{x:.4f}"


def render(e: Explanation) -> str:
    lines = [
        "scores s = [0, ln2, ln3, ln4] (weights 1:2:3:4), V = [1, 2, 4, 8]",
        f"full softmax output: {e.full_out:.4f}",
        "",
        f"{'block':<12}{'m':>8}{'l':>9}{'u':>9}{'local out':>11}{'lse':>9}",
    ]
    for b in e.blocks:
        lines.append(f"{str(list(b.positions)):<12}{_ln(b.m):>8}{b.l:>9.4f}{b.u:>9.4f}{b.out:>11.4f}{b.lse:>9.4f}")
    lines += [
        "",
        f"merged (common max m = {_ln(e.merged_m)}): l = {e.merged_l:.4f}, u = {e.merged_u:.4f}, "
        f"out = u / l = {e.merged_out:.4f}, lse = {e.merged_lse:.4f}",
        f"naive average of local outputs: {e.naive_average:.4f}"
        + ("" if len(e.blocks) == 1 else f"  (wrong by {e.naive_average - e.full_out:+.4f})"),
    ]
    return "\n".join(lines)
