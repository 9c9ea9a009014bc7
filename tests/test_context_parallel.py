"""Context-parallel decode in one process: every rank's state computed in turn, merged with the
torch merge, judged against the float64 reference of the unsharded batch (the accuracy rule).
The collective itself is tested in test_context_parallel_dist.py."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from splitkv_common.parity.accuracy import check  # noqa: E402
from splitkv_common.torch_io import to_torch  # noqa: E402
from splitkv_common.parity.cases import random_inputs  # noqa: E402
from splitkv_common.context_parallel import (comm_bytes, default_pg_backend,  # noqa: E402
                                             make_batch, torch_shard_backend)
from splitkv_common.cp_sharding import LAYOUTS, localize, shard_all  # noqa: E402
from cuda_ref.context_parallel import TritonShardBackend  # noqa: E402
from splitkv_common.reference import dense_attention, plain_attention  # noqa: E402
from splitkv_common.torch_eager import merge_states  # noqa: E402


def simulate(inp, world, layout, backend_factory=lambda: torch_shard_backend):
    """Each rank's (o, lse) from its own localized cache, then the exact merge over ranks."""
    x = to_torch(inp)
    os_, ls_, ranks = [], [], []
    for s in shard_all(inp.block_table, inp.seq_lens, world, layout, page_size=inp.k_cache.shape[1]):
        s2, k, v = localize(s, x["k_cache"], x["v_cache"])
        batch = make_batch(s2, x["q"], k, v, query_start_loc=x["query_start_loc"], scale=inp.scale,
                           soft_cap=inp.soft_cap, window_left=inp.window_left, k_scale=x["k_scale"],
                           v_scale=x["v_scale"], k_offset=x["k_offset"], v_offset=x["v_offset"])
        be = backend_factory()
        o, lse = be(batch)
        assert o.dtype == torch.float32 and lse.dtype == torch.float32
        assert not torch.isnan(o).any() and not torch.isnan(lse).any()
        # an empty shard (nothing of a request on this rank) is 0 / -inf
        empty = torch.isneginf(lse)
        assert (o[empty] == 0).all()
        os_.append(o.clone())
        ls_.append(lse.clone())
        ranks.append((s2, be))
    out, lse = merge_states(torch.stack(os_), torch.stack(ls_), dim=0)
    return out.numpy(), lse.numpy(), ranks


def judge(inp, out, lse):
    ref_o, ref_l = dense_attention(inp)
    acc = check(out, lse, ref_o, ref_l, plain_attention(inp), inp.dtype)
    assert acc.passed, acc.reason


cases = st.fixed_dictionaries({
    "seq_lens": st.lists(st.integers(0, 70), min_size=1, max_size=4),
    "q_len": st.integers(1, 4),
    "heads": st.sampled_from([(4, 4), (4, 2), (6, 2), (8, 1)]),
    "page": st.sampled_from([1, 4, 16]),
    "window": st.sampled_from([None, 0, 5, 40]),
    "world": st.integers(1, 5),
    "layout": st.sampled_from(LAYOUTS),
    "dtype": st.sampled_from(["float32", "bfloat16"]),
    "seed": st.integers(0, 1000),
})


@settings(max_examples=40, deadline=None)
@given(cases)
def test_torch_backend_matches_the_reference(c):
    B = len(c["seq_lens"])
    ql = [c["q_len"] if b % 2 == 0 else 1 for b in range(B)]
    inp = random_inputs(c["seed"], c["seq_lens"], q_lens=ql, num_q_heads=c["heads"][0], num_kv_heads=c["heads"][1],
                        head_dim=16, page_size=c["page"], dtype=c["dtype"], window_left=c["window"])
    out, lse, _ = simulate(inp, c["world"], c["layout"])
    judge(inp, out, lse)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("extra", [dict(kv_quant="channel", kv_offset=True, dtype="float16"),
                                   dict(soft_cap=30.0, q_scale=20.0), dict(q_scale=60.0)],
                         ids=["int8-offset", "soft-cap", "large-scores"])
def test_torch_backend_int8_softcap_large_scores(layout, extra):
    inp = random_inputs(7, [45, 0, 13, 90], q_lens=[2, 1, 3, 1], num_q_heads=6, num_kv_heads=2, head_dim=32,
                        page_size=8, window_left=30, **extra)
    out, lse, _ = simulate(inp, 3, layout)
    judge(inp, out, lse)


def test_more_ranks_than_pages():
    inp = random_inputs(8, [3, 0, 17], q_lens=[2, 1, 1], page_size=16)
    for layout in LAYOUTS:
        out, lse, ranks = simulate(inp, 4, layout)
        judge(inp, out, lse)
        assert sum(int(s.seq_lens[0]) == 0 for s, _ in ranks) == 3  # one page: three empty ranks
    assert np.isneginf(lse[2]).all() and (out[2] == 0).all()  # request 1 (row 2), seq_len 0: 0 / -inf


def test_comm_bytes_independent_of_context():
    b = comm_bytes(1, 32, 128, 2)
    assert b["send_per_rank"] == 32 * 129 * 4 and b["recv_per_rank"] == 32 * 129 * 4 and b["buffer"] == 2 * 32 * 129 * 4
    a2a = comm_bytes(4, 32, 128, 4, "all_to_all")
    assert a2a["send_per_rank"] == 3 * 4 * 8 * 129 * 4
    assert comm_bytes(1, 32, 128, 1)["send_per_rank"] == 0
    with pytest.raises(ValueError):
        comm_bytes(1, 32, 128, 2, "ring")
    assert default_pg_backend("cpu") == "gloo" and default_pg_backend("cuda") == "nccl"


# -- the Triton kernels (the interpreter here): local view where exact, global-view plan otherwise --------

@pytest.mark.parametrize("layout,world,seq,q_lens,window,views", [
    ("contiguous", 2, [0, 37, 50], [1, 3, 2], None, ["global", "local"]),
    ("round_robin", 3, [40, 9], None, None, ["local", "local", "local"]),
    ("round_robin", 2, [40, 9], [3, 1], 5, ["global", "global"]),
])
def test_triton_backend(layout, world, seq, q_lens, window, views):
    pytest.importorskip("triton")
    import cuda_ref  # noqa: F401  (selects the interpreter without a GPU)
    inp = random_inputs(3, seq, q_lens=q_lens, window_left=window, page_size=4, num_q_heads=4, num_kv_heads=2,
                        head_dim=16)
    out, lse, ranks = simulate(inp, world, layout, lambda: TritonShardBackend(policy="size:8"))
    judge(inp, out, lse)
    assert [be.view for _, be in ranks] == views


def test_triton_forced_local_view_refuses_inexact():
    pytest.importorskip("triton")
    inp = random_inputs(4, [30], q_lens=[3], page_size=4, num_q_heads=2, num_kv_heads=1, head_dim=16)
    x = to_torch(inp)
    s = shard_all(inp.block_table, inp.seq_lens, 2, "contiguous", page_size=4)[0]
    s2, k, v = localize(s, x["k_cache"], x["v_cache"])
    batch = make_batch(s2, x["q"], k, v, query_start_loc=x["query_start_loc"])
    with pytest.raises(ValueError, match="not exact"):
        TritonShardBackend(forced_view="local").prepare(batch)


def test_triton_backend_replans_for_another_batch():
    pytest.importorskip("triton")
    import cuda_ref  # noqa: F401
    inps = [random_inputs(s, [33, 20], page_size=4, num_q_heads=2, num_kv_heads=1, head_dim=16) for s in (5, 6)]
    be = TritonShardBackend(policy="size:8")
    batches = []
    for inp in inps:
        x = to_torch(inp)
        s = shard_all(inp.block_table, inp.seq_lens, 1, "contiguous", page_size=4)[0]
        s2, k, v = localize(s, x["k_cache"], x["v_cache"])
        batches.append(make_batch(s2, x["q"], k, v, scale=inp.scale))
        be.prepare(batches[-1])
    out, lse = be(batches[0])  # prepared last for batches[1]: planned again for batches[0]
    judge(inps[0], out.numpy().copy(), lse.numpy().copy())


def test_contiguous_fixed_capacity():
    inp = random_inputs(9, [50, 7, 0], q_lens=[3, 1, 1], page_size=4, window_left=9)
    x = to_torch(inp)
    os_, ls_ = [], []
    for s in shard_all(inp.block_table, inp.seq_lens, 4, "contiguous", page_size=4, capacity_pages=4):
        s2, k, v = localize(s, x["k_cache"], x["v_cache"])
        o, lse = torch_shard_backend(make_batch(s2, x["q"], k, v, query_start_loc=x["query_start_loc"],
                                                scale=inp.scale, window_left=inp.window_left))
        os_.append(o)
        ls_.append(lse)
    out, lse = merge_states(torch.stack(os_), torch.stack(ls_), dim=0)
    judge(inp, out.numpy(), lse.numpy())
