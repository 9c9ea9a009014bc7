"""Sharding a batch across context-parallel ranks (NumPy only): every token exactly once, at the
right physical slot and global position, under both layouts; the shard plans cover exactly what
the rows can see."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from splitkv_common.cp_sharding import LAYOUTS, localize, page_owners, shard, shard_all, shard_plan
from splitkv_common.plan import visible_range


def _table(seq_lens, page, rng):
    """A shuffled block table with -1 past each request's pages (as the case catalog builds it)."""
    n = [-(-s // page) for s in seq_lens]
    perm = rng.permutation(max(sum(n), 1) + 2)
    bt = np.full((len(seq_lens), max(max(n, default=0), 1)), -1, np.int32)
    k = 0
    for b, nb in enumerate(n):
        bt[b, :nb] = perm[k:k + nb]
        k += nb
    return bt


batches = st.fixed_dictionaries({
    "seq_lens": st.lists(st.integers(0, 90), min_size=1, max_size=5),
    "page": st.sampled_from([1, 3, 4, 16]),
    "world": st.integers(1, 6),
    "layout": st.sampled_from(LAYOUTS),
    "seed": st.integers(0, 2 ** 16),
})


@settings(max_examples=150, deadline=None)
@given(batches)
def test_every_token_once_at_its_slot(c):
    page, W, seq = c["page"], c["world"], c["seq_lens"]
    bt = _table(seq, page, np.random.default_rng(c["seed"]))
    shards = shard_all(bt, seq, W, c["layout"], page_size=page)
    for b, S in enumerate(seq):
        pos = np.concatenate([s.positions_of(b) for s in shards])
        assert sorted(pos.tolist()) == list(range(S))  # every position exactly once
        assert sum(int(s.seq_lens[b]) for s in shards) == S
        for s in shards:
            p = s.positions_of(b)
            assert (np.diff(p) > 0).all()  # local order is logical order
            i = np.arange(p.shape[0])
            # local token i at local page i // page, slot i % page holds global position p[i]
            np.testing.assert_array_equal(s.block_table[b, i // page], bt[b, p // page])
            assert (p % page == i % page).all()
            if c["layout"] == "contiguous" and p.size:
                assert p[-1] - p[0] + 1 == p.size  # one contiguous global range
            if c["layout"] == "round_robin" and p.size:
                assert ((p // page) % W == s.rank).all()


@settings(max_examples=100, deadline=None)
@given(batches, st.lists(st.integers(0, 4), min_size=5, max_size=5), st.sampled_from([None, 0, 3, 20]))
def test_shard_plans_cover_the_visible_range_once(c, q_lens, window):
    page, W, seq = c["page"], c["world"], c["seq_lens"]
    ql = np.array(q_lens[:len(seq)])
    qsl = np.concatenate([[0], np.cumsum(ql)])
    bt = _table(seq, page, np.random.default_rng(c["seed"]))
    shards = shard_all(bt, seq, W, c["layout"], page_size=page)
    covered = [np.zeros(max(S, 1), np.int64) for S in seq]
    for s in shards:
        p = shard_plan(s, num_kv_heads=2, query_start_loc=qsl, window_left=window, split_tokens=2 * page)
        assert p.num_slots == int((p.num_splits[np.repeat(np.arange(len(seq)), ql)]).sum())
        mine = [set(s.positions_of(b).tolist()) for b in range(len(seq))]
        for w in range(p.num_valid_items):
            if p.item_kv_head[w]:
                continue
            b, a, e = int(p.item_request[w]), int(p.item_kv_start[w]), int(p.item_kv_end[w])
            assert set(range(a, e)) <= mine[b]  # a rank only reads its own positions
            covered[b][a:e] += 1
    for b, S in enumerate(seq):
        lo, hi = visible_range(S, int(ql[b]), window)
        want = np.zeros(max(S, 1), np.int64)
        want[lo:hi] = 1
        np.testing.assert_array_equal(covered[b], want)


@settings(max_examples=60, deadline=None)
@given(batches)
def test_global_block_table_and_localize(c):
    page, W, seq = c["page"], c["world"], c["seq_lens"]
    rng = np.random.default_rng(c["seed"])
    bt = _table(seq, page, rng)
    cache = rng.standard_normal((max(int(bt.max()) + 1, 1), page, 1, 2))
    for s in shard_all(bt, seq, W, c["layout"], page_size=page):
        s2, k, v = localize(s, cache, cache)
        assert k.shape[0] >= 1
        g = s2.global_block_table()
        for b in range(len(seq)):
            p = s.positions_of(b)
            np.testing.assert_array_equal(k[g[b, p // page], p % page], cache[bt[b, p // page], p % page])


def test_contiguous_balanced_and_capacity():
    assert page_owners(5, 2, "contiguous").tolist() == [0, 0, 0, 1, 1]
    assert page_owners(1, 4, "contiguous").tolist() == [0]  # short request: ranks 1-3 hold nothing
    assert page_owners(7, 3, "round_robin").tolist() == [0, 1, 2, 0, 1, 2, 0]
    assert page_owners(5, 3, "contiguous", capacity_pages=2).tolist() == [0, 0, 1, 1, 2]
    with pytest.raises(ValueError, match="does not fit"):
        page_owners(7, 3, "contiguous", capacity_pages=2)
    with pytest.raises(ValueError, match="layout"):
        page_owners(3, 2, "zigzag")
    with pytest.raises(ValueError, match="rank"):
        shard(np.zeros((1, 1), np.int32), [3], 2, 2, page_size=4)


def test_empty_shards_and_lengths():
    bt = np.array([[5, -1, -1], [0, 1, 2]], np.int32)
    s = shard(bt, [3, 12], 3, 4, "contiguous", page_size=4)  # 1 and 3 pages over 4 ranks
    assert s.seq_lens.tolist() == [0, 0]
    assert s.positions().shape == (2, 0)
    s1 = shard(bt, [3, 10], 2, 4, "round_robin", page_size=4)
    assert s1.seq_lens.tolist() == [0, 2] and s1.positions_of(1).tolist() == [8, 9]


def test_local_view_exact():
    bt = np.arange(8, dtype=np.int32).reshape(1, 8)
    shards = shard_all(bt, [30], 2, "contiguous", page_size=4)
    # one query row, no window: exact on every rank and layout
    assert all(s.local_view_exact() for s in shards)
    assert all(s.local_view_exact() for s in shard_all(bt, [30], 3, "round_robin", page_size=4))
    qsl = np.array([0, 3])
    # multi-query rows: the tail rank of a contiguous layout is exact, the head rank is not
    assert not shards[0].local_view_exact(qsl) and shards[1].local_view_exact(qsl)
    assert not shards[0].local_view_exact(None, window_left=5) and shards[1].local_view_exact(None, window_left=5)


def test_numpy_only():
    """The sharding helpers import no torch, and splitkv_common does not import the torch module."""
    import subprocess
    import sys
    code = ("import sys, splitkv_common, splitkv_common.cp_sharding; "
            "assert 'torch' not in sys.modules and 'splitkv_common.context_parallel' not in sys.modules")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
