"""The Triton route of shared-prefix decode (``cuda_ref.shared_prefix``): the prefix stage kernel, the
tails through the split kernel, the merge; parity with the float64 reference on every shared-prefix
case (the Triton interpreter on a CPU), the wrapper's API and its refusals, the vLLM-style entry."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from cuda_ref.shared_prefix import SharedPrefixWrapper, decode_with_common_prefix  # noqa: E402
from splitkv_common.parity.accuracy import check  # noqa: E402
from splitkv_common.parity.cases import SHARED_PREFIX_CATALOG, shared_prefix_inputs  # noqa: E402
from splitkv_common.reference import dense_attention, plain_attention  # noqa: E402
from splitkv_common.shared_prefix import SharedPrefix  # noqa: E402
from splitkv_common.torch_io import from_torch, to_torch  # noqa: E402

CASES = {c.name: c for c in SHARED_PREFIX_CATALOG}


def _wrapper(inp, **kw):
    return SharedPrefixWrapper(inp.q.shape[1], inp.k_cache.shape[2], inp.q.shape[2], inp.k_cache.shape[1],
                               dtype=inp.dtype, kv_dtype="int8" if inp.kv_dtype == "int8" else inp.dtype, **kw)


def run_triton(inp, sp, mode="on", policy="auto", **kw):
    w = _wrapper(inp, mode=mode, policy=policy, **kw)
    splan = w.plan(inp.seq_lens, inp.query_start_loc, shared_prefix=sp, block_table=inp.block_table,
                   window_left=inp.window_left)
    x = to_torch(inp, w.device)
    out, lse = w.run(**x, scale=inp.scale, soft_cap=inp.soft_cap, window_left=inp.window_left, validate=True)
    return (*from_torch(out, lse), splan)


@pytest.mark.parametrize("name", sorted(CASES))
def test_triton_route_passes_the_accuracy_rule(name):
    case = CASES[name]
    inp, sp = case.build()
    out, lse, splan = run_triton(inp, sp, mode=case.mode, policy=case.policy)
    assert splan.use_shared
    ref_out, ref_lse = dense_attention(inp)
    acc = check(out, lse, ref_out, ref_lse, plain_attention(inp), inp.dtype)
    assert acc.passed, acc.reason


def test_row_blocks_of_16_rows_many_requests():
    """More packed rows than one block (block_m 16, 12 requests x GQA 2 = 24 rows): two row blocks."""
    inp, sp = shared_prefix_inputs(501, [40 + 3 * i for i in range(12)], [(0, 12, 32)], num_q_heads=4,
                                   num_kv_heads=2, page_size=8)
    out, lse, splan = run_triton(inp, sp, block_m=16)
    ref_out, ref_lse = dense_attention(inp)
    assert check(out, lse, ref_out, ref_lse, plain_attention(inp), inp.dtype).passed


def test_auto_plain_path_gives_the_same_answer():
    inp, sp = CASES["shared-prefix/one-group"].build()
    out, lse, splan = run_triton(inp, sp, mode="auto")
    assert not splan.use_shared    # a tiny batch: the planner keeps the plain path, and says why
    assert "not below" in splan.reason
    ref_out, ref_lse = dense_attention(inp)
    assert check(out, lse, ref_out, ref_lse, plain_attention(inp), inp.dtype).passed


def test_common_prefix_len_entry():
    inp, _ = shared_prefix_inputs(502, [50, 60, 41], [(0, 3, 40)], page_size=8, q_lens=[1, 1, 1])
    x = to_torch(inp, "cpu")
    out, lse = decode_with_common_prefix(x["q"], x["k_cache"], x["v_cache"], x["block_table"], x["seq_lens"],
                                         x["query_start_loc"], 40, scale=inp.scale, mode="on")
    ref_out, ref_lse = dense_attention(inp)
    o, l = from_torch(out, lse)
    assert check(o, l, ref_out, ref_lse, plain_attention(inp), inp.dtype).passed
    with pytest.raises(ValueError, match="multiple of page_size 8"):
        decode_with_common_prefix(x["q"], x["k_cache"], x["v_cache"], x["block_table"], x["seq_lens"],
                                  x["query_start_loc"], 36, mode="on")


def test_run_refuses_another_batch_or_window():
    inp, sp = CASES["shared-prefix/one-group"].build()
    w = _wrapper(inp, mode="on")
    w.plan(inp.seq_lens, inp.query_start_loc, shared_prefix=sp, block_table=inp.block_table)
    x = to_torch(inp, "cpu")
    with pytest.raises(ValueError, match="window_left: the plan was made for None"):
        w.run(**x, window_left=8)
    with pytest.raises(ValueError, match="the plan was made for 4 requests and 4 rows"):
        w.run(x["q"][:3], x["k_cache"], x["v_cache"], x["block_table"][:3], x["seq_lens"][:3],
              x["query_start_loc"][:4])
    bad = x["block_table"].clone()
    bad[1, 0] = bad[3, 5]
    with pytest.raises(ValueError, match=r"request 1, whose block_table\[1, 0\]"):
        w.run(x["q"], x["k_cache"], x["v_cache"], bad, x["seq_lens"], x["query_start_loc"], validate=True)
    with pytest.raises(ValueError, match="block_m: must be a power of two >= 16"):
        _wrapper(inp, block_m=8)


def test_plan_without_pages_or_block_table_is_refused():
    inp, _ = CASES["shared-prefix/one-group"].build()
    w = _wrapper(inp, mode="on")
    with pytest.raises(ValueError, match="block_table: plan\\(\\) needs it"):
        w.plan(inp.seq_lens, inp.query_start_loc, shared_prefix=SharedPrefix.single(48, 0, 4))


def test_graph_stable_buffers_keep_their_shapes_across_steps():
    """Graph replay reads the same device buffers: a graph-stable plan of a later step (longer tails)
    writes into the buffers the first one made, and still gives the right answer."""
    inp, sp = shared_prefix_inputs(503, [50, 58, 45], [(0, 3, 40)], page_size=8)
    w = _wrapper(inp, mode="on", graph_stable=True, policy="size:16")
    w.plan(inp.seq_lens, inp.query_start_loc, shared_prefix=sp, block_table=inp.block_table)
    buf, dplan = w._buf, w._tail_dplan
    inp2, sp2 = shared_prefix_inputs(503, [52, 60, 47], [(0, 3, 40)], page_size=8)
    w.plan(inp2.seq_lens, inp2.query_start_loc, shared_prefix=sp2, block_table=inp2.block_table)
    assert w._buf is buf and w._tail_dplan is dplan
    x = to_torch(inp2, "cpu")
    out, lse = w.run(**x, scale=inp2.scale)
    ref_out, ref_lse = dense_attention(inp2)
    assert check(*from_torch(out, lse), ref_out, ref_lse, plain_attention(inp2), inp2.dtype).passed


def test_nan_in_a_prefix_value_poisons_its_group_only():
    """NaN in a K value of group 0's prefix: group 0's rows are NaN for the query heads of that KV head,
    every other row (group 1, the request on its own, the other KV head) keeps the reference's values."""
    inp, sp = CASES["shared-prefix/two-groups-and-loner"].build()
    inp.k_cache[inp.block_table[0, 1], 4, 1, 7] = np.nan
    out, lse, _ = run_triton(inp, sp, policy="size:16")
    ref_out, ref_lse = dense_attention(inp)
    np.testing.assert_array_equal(np.isnan(lse), np.isnan(ref_lse))
    assert np.isnan(lse[:2, 2:]).all() and not np.isnan(lse[2:]).any()
    fin = ~np.isnan(ref_lse)
    assert np.abs(out - ref_out)[fin].max() < 1e-4


def test_graph_stable_wrapper_keeps_its_first_route():
    """For graphs the decision is stable: a graph-stable wrapper whose first plan took the shared route
    keeps it for a batch where ``auto`` alone would not, and refuses a batch that shares nothing."""
    inp, sp = shared_prefix_inputs(504, [50, 58, 45], [(0, 3, 40)], page_size=8)
    w = _wrapper(inp, mode="on", graph_stable=True, policy="size:16")
    assert w.plan(inp.seq_lens, inp.query_start_loc, shared_prefix=sp, block_table=inp.block_table).use_shared
    w.mode = "auto"     # what auto alone picks at this size: plain
    again = w.plan(inp.seq_lens, inp.query_start_loc, shared_prefix=sp, block_table=inp.block_table)
    assert again.use_shared and again.mode == "on"
    with pytest.raises(ValueError, match="the batch shares nothing"):
        w.plan(inp.seq_lens, inp.query_start_loc, shared_prefix=None, block_table=inp.block_table)
    assert w.splan is again     # the refused plan left the previous one in use
    x = to_torch(inp, "cpu")
    out, lse = w.run(**x, scale=inp.scale)
    ref_out, ref_lse = dense_attention(inp)
    assert check(*from_torch(out, lse), ref_out, ref_lse, plain_attention(inp), inp.dtype).passed
    with pytest.raises(ValueError, match=r"out: must be \[3, 4, 64\]"):
        w.run(**x, scale=inp.scale, out=out[:2])


def test_graph_stable_refuses_a_batch_of_other_shapes():
    inp, sp = shared_prefix_inputs(505, [50, 58, 45], [(0, 3, 40)], page_size=8)
    w = _wrapper(inp, mode="on", graph_stable=True, policy="size:16")
    w.plan(inp.seq_lens, inp.query_start_loc, shared_prefix=sp, block_table=inp.block_table)
    buf = w._buf.clone()
    with pytest.raises(ValueError, match="shapes changed under a graph-stable plan"):
        w.plan(inp.seq_lens, inp.query_start_loc, shared_prefix=SharedPrefix.single(32, 0, 3),
               block_table=inp.block_table)
    assert torch.equal(w._buf, buf)


def test_a_prefix_plan_of_its_own_split_policy_passes_the_accuracy_rule():
    case = CASES["shared-prefix/two-groups-and-loner"]
    inp, sp = case.build()
    out, lse, splan = run_triton(inp, sp, mode="on", policy=case.policy, prefix_policy="size:32")
    assert splan.use_shared and splan.prefix.max_splits == 2
    ref_out, ref_lse = dense_attention(inp)
    acc = check(out, lse, ref_out, ref_lse, plain_attention(inp), inp.dtype)
    assert acc.passed, acc.reason


def test_concurrent_stages_is_a_bool_and_gives_the_same_answer_here():
    """``concurrent_stages`` forks the prefix stage onto a second CUDA stream; elsewhere (the CPU, the
    interpreter) one stream runs both stages, and the answer is the same bit for bit."""
    case = CASES["shared-prefix/one-group"]
    inp, sp = case.build()
    out, lse, _ = run_triton(inp, sp)
    out2, lse2, _ = run_triton(inp, sp, concurrent_stages=True)
    np.testing.assert_array_equal(out, out2)
    np.testing.assert_array_equal(lse, lse2)
    with pytest.raises(TypeError, match="concurrent_stages: must be True or False"):
        _wrapper(inp, concurrent_stages="yes")

