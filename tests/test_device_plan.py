"""Plans made on the device (``DecodeWrapper(device_plan=True, policy="size:S")``), through the Triton
interpreter: the same bits as the host's ``size:S`` plan, a "graph-like" reuse with new lengths and
batch composition and no plan, batch invariance, and the host-side refusals."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import cuda_ref  # noqa: E402  (selects the interpreter without a GPU: before anything imports triton)

pytest.importorskip("triton")
from cuda_ref.wrapper import DecodeWrapper  # noqa: E402
from splitkv_common.parity import accuracy, cases  # noqa: E402
from splitkv_common.reference import dense_attention, plain_attention  # noqa: E402
from splitkv_common.torch_io import to_torch  # noqa: E402

DEVICE = "cpu" if cuda_ref.INTERPRET else "cuda"


def _wrapper(inp, **kw):
    T, Hq, D = inp.q.shape
    _, page, Hkv, _ = inp.k_cache.shape
    return DecodeWrapper(Hq, Hkv, D, page, dtype=inp.dtype, device=DEVICE, **kw)


def _bits(t):
    t = t.detach().cpu()
    return (t.float() if t.dtype != torch.float32 else t).numpy().view(np.uint32).copy()


def _host_planned(inp, x, split, **kw):
    w = _wrapper(inp, policy=f"size:{split}", **kw)
    w.plan(inp.seq_lens, query_start_loc=inp.query_start_loc)
    out, lse = w.run(**x, scale=inp.scale)
    return _bits(out), _bits(lse)


def _judge(inp, out, lse):
    ro, rl = dense_attention(inp)
    return accuracy.check(out.float().cpu().numpy(), lse.cpu().numpy(), ro, rl, plain_attention(inp), inp.dtype)


@pytest.mark.parametrize("fuse", [False, True])
@pytest.mark.parametrize("lens, q_lens, split", [
    ([70, 0, 5, 120, 33], [1, 2, 1, 3, 1], 16),      # ragged, an empty request, multi-query rows
    ([0, 0, 16, 17, 1], None, 16),                    # lengths on and next to a split boundary
    ([300, 9, 0], [2, 0, 1], 32),                     # a request without query rows
    ([129], [4], 8),                                  # one request, many splits (more than a merge chunk)
])
def test_device_plan_matches_the_host_size_plan_bitwise(lens, q_lens, split, fuse):
    inp = cases.random_inputs(7, lens, q_lens=q_lens, num_q_heads=8, num_kv_heads=2, head_dim=32, page_size=8,
                              dtype="bfloat16")
    x = to_torch(inp, DEVICE)
    want = _host_planned(inp, x, split, fuse_merge=fuse)
    # the packed query rows per program (BLOCK_M) follow the longest request: the host plan takes it
    # from the batch, the device plan from max_q_len; the same tile gives the same bits
    w = _wrapper(inp, policy=f"size:{split}", device_plan=True, fuse_merge=fuse, max_q_len=max(q_lens or [1]))
    assert w.plan(inp.seq_lens) is None   # nothing to plan on the host
    out, lse = w.run(**x, scale=inp.scale, validate=True)
    np.testing.assert_array_equal(_bits(out), want[0])
    np.testing.assert_array_equal(_bits(lse), want[1])
    acc = _judge(inp, out, lse)
    assert acc.passed, acc.reason


def test_device_plan_replays_new_lengths_and_batches_without_a_plan():
    # one wrapper, the device tensors refreshed in place (as before a graph replay): lengths, requests
    # emptied and refilled, query rows moved between requests (same total), no plan() in between;
    # at most 3 rows a request x 2 heads: one 16-row tile, as in every host plan compared with
    inp = cases.random_inputs(3, [90, 40, 7, 64], q_lens=[1, 2, 1, 2], num_q_heads=4, num_kv_heads=2, head_dim=32,
                              page_size=8, dtype="float16")
    x = to_torch(inp, DEVICE)
    w = _wrapper(inp, policy="size:16", device_plan=True, max_q_len=3)
    out, lse = w.run(**x, scale=inp.scale)
    ptrs = (out.data_ptr(), lse.data_ptr(), w.dplan.data.data_ptr(), w._buffers["part_o"].data_ptr())
    rng = np.random.default_rng(5)
    for q_lens in ([1, 2, 1, 2], [3, 0, 2, 1], [0, 3, 3, 0], [2, 2, 1, 1]):
        lens = rng.integers(0, inp.seq_lens + 1).astype(np.int32)
        lens[rng.integers(0, 4)] = 0
        qsl = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
        x["seq_lens"].copy_(torch.from_numpy(lens))
        x["query_start_loc"].copy_(torch.from_numpy(qsl))
        out.fill_(float("nan"))  # every row must be written again
        out2, lse2 = w.run(**x, scale=inp.scale)
        assert (out2.data_ptr(), lse2.data_ptr(), w.dplan.data.data_ptr(), w._buffers["part_o"].data_ptr()) == ptrs
        new = dataclasses.replace(inp, seq_lens=lens, query_start_loc=qsl)
        acc = _judge(new, out2, lse2)
        assert acc.passed, acc.reason
        want = _host_planned(new, x, 16)
        np.testing.assert_array_equal(_bits(out2), want[0])
        np.testing.assert_array_equal(_bits(lse2), want[1])


def test_device_plan_takes_batches_of_other_sizes_on_one_launch():
    """One device-planned wrapper, eager batches of 1-5 requests over one cache (the first ones of a
    batch of 5): the launch prepared for two requests or more serves every such batch, its request
    bound and the merge's search steps following each call, and each result is the host ``size:S``
    plan's bit for bit."""
    inp = cases.random_inputs(9, [90, 40, 7, 64, 130], num_q_heads=4, num_kv_heads=2, head_dim=32, page_size=8,
                              dtype="float16")
    x = to_torch(inp, DEVICE)
    w = _wrapper(inp, policy="size:16", device_plan=True, max_q_len=1)
    launches = set()
    for B in (5, 2, 4, 1, 3, 5):
        sub = dict(x, q=x["q"][:B], block_table=x["block_table"][:B], seq_lens=x["seq_lens"][:B],
                   query_start_loc=x["query_start_loc"][:B + 1])
        out, lse = w.run(**sub, scale=inp.scale)
        launches.add(id(w.last_launch))
        assert w.last_launch.sizes == (B, B, B)
        assert w.last_launch.merge.tail[0] == B and w.last_launch.merge.tail[3] == (B - 1).bit_length()
        new = dataclasses.replace(inp, q=inp.q[:B], block_table=inp.block_table[:B], seq_lens=inp.seq_lens[:B],
                                  query_start_loc=inp.query_start_loc[:B + 1])
        want = _host_planned(new, sub, 16)
        np.testing.assert_array_equal(_bits(out), want[0])
        np.testing.assert_array_equal(_bits(lse), want[1])
    assert len(launches) == 2   # one for a single request, one for the rest


def test_device_plan_is_batch_invariant():
    target = cases.random_inputs(5, [150], num_q_heads=8, num_kv_heads=2, head_dim=32, dtype="bfloat16")
    got = []
    for before, after in (([], []), ([40, 0], [7]), ([], [300, 1, 99])):
        lens = before + [150] + after
        inp = cases.random_inputs(9, lens, num_q_heads=8, num_kv_heads=2, head_dim=32, dtype="bfloat16")
        b = len(before)
        q, k, v = inp.q.copy(), inp.k_cache.copy(), inp.v_cache.copy()
        q[b] = target.q[0]
        n = -(-150 // 16)
        k[inp.block_table[b, :n]] = target.k_cache[target.block_table[0, :n]]
        v[inp.block_table[b, :n]] = target.v_cache[target.block_table[0, :n]]
        inp = dataclasses.replace(inp, q=q, k_cache=k, v_cache=v)
        w = _wrapper(inp, policy="size:32", device_plan=True)
        out, lse = w.run(**to_torch(inp, DEVICE), scale=inp.scale)
        got.append((_bits(out)[b], _bits(lse)[b]))
    for o, l in got[1:]:
        np.testing.assert_array_equal(o, got[0][0])
        np.testing.assert_array_equal(l, got[0][1])


def test_device_plan_refusals():
    inp = cases.random_inputs(2, [40, 20], q_lens=[9, 1], num_q_heads=4, num_kv_heads=2, head_dim=32, page_size=8)
    x = to_torch(inp, DEVICE)
    with pytest.raises(ValueError, match="device_plan: needs policy size:S"):
        _wrapper(inp, policy="auto", device_plan=True)
    w = _wrapper(inp, policy="size:16", device_plan=True, max_q_len=2)   # one 16-row tile: 8 rows of 2 heads
    with pytest.raises(ValueError, match="9 query rows; max_q_len allows 8"):
        w.run(**x, validate=True)
    with pytest.raises(ValueError, match="set_plan"):
        w.set_plan(inp.plan("size:16"))
    with pytest.raises(ValueError, match="window_left"):
        w.run(**x, window_left=8)


def test_step_inputs_one_copy_into_views_of_one_buffer():
    """``StepInputs``: seq_lens and query_start_loc as views of one device buffer, refreshed by one copy
    from a ring of host buffers; a device-planned run() over them equals one over separate tensors."""
    from cuda_ref.wrapper import StepInputs

    inp = cases.random_inputs(11, [70, 0, 5, 33], q_lens=[1, 2, 1, 3], num_q_heads=8, num_kv_heads=2, head_dim=32,
                              page_size=8, dtype="bfloat16")
    x = to_torch(inp, DEVICE)
    B = len(inp.seq_lens)
    si = StepInputs(B, DEVICE)
    assert si.seq_lens.untyped_storage().data_ptr() == si.query_start_loc.untyped_storage().data_ptr()
    assert si.query_start_loc.data_ptr() % 16 == 0 and si.query_start_loc.shape == (B + 1,)
    w = _wrapper(inp, policy="size:16", device_plan=True, max_q_len=3)
    want = [_bits(t) for t in w.run(**x, scale=inp.scale)]
    host_before = [h[0] for h in si._host]
    for lens in ([1, 2, 3, 4], inp.seq_lens):   # a first step, then the batch (through the other ring slot)
        si.update(np.asarray(lens, np.int64), inp.query_start_loc)
        np.testing.assert_array_equal(si.seq_lens.cpu().numpy(), lens)
        np.testing.assert_array_equal(si.query_start_loc.cpu().numpy(), inp.query_start_loc)
    assert [h[0] for h in si._host] == host_before                 # nothing allocated per step
    got = [_bits(t) for t in w.run(**dict(x, seq_lens=si.seq_lens, query_start_loc=si.query_start_loc),
                                   scale=inp.scale)]
    for a, b in zip(want, got):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(ValueError, match="seq_lens: 4 entries expected"):
        si.update([1, 2, 3], inp.query_start_loc)
    with pytest.raises(ValueError, match="query_start_loc: 5 entries expected"):
        si.update([1, 2, 3, 4], [0, 1])


class _Replay:
    """A stand-in for a captured graph off CUDA: ``replay()`` runs the captured steps again."""

    def __init__(self, fn):
        self.fn, self.calls = fn, 0

    def replay(self):
        self.calls += 1
        self.result = self.fn()


def _capture(step):
    """``step`` (returning ``(out, lse)``) captured in a CUDA graph after a warm-up call, or off CUDA
    in a :class:`_Replay`: ``(graph, out, lse)``."""
    if DEVICE == "cuda":
        step()
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            out, lse = step()
        return g, out, lse
    return (_Replay(step), *step())


def test_step_inputs_in_graph_copy_is_replayed_with_each_steps_lengths():
    """``StepInputs(in_graph=True)``: one pinned host buffer; the captured copy (``copy()``) carries
    what ``replay()`` wrote before each replay, so successive steps with other lengths give the bits
    of a run over tensors made for each step (on CUDA: a real graph with the copy captured)."""
    from cuda_ref.wrapper import StepInputs

    B = 4
    inp = cases.random_inputs(13, [70, 0, 5, 33], q_lens=[1, 2, 1, 3], num_q_heads=8, num_kv_heads=2, head_dim=32,
                              page_size=8, dtype="bfloat16")
    x = to_torch(inp, DEVICE)
    si = StepInputs(B, DEVICE, in_graph=True)
    assert len(si._host) == 1   # the captured copy reads one fixed address
    w = _wrapper(inp, policy="size:16", device_plan=True, max_q_len=3)

    def step():
        si.copy()
        return w.run(**dict(x, seq_lens=si.seq_lens, query_start_loc=si.query_start_loc), scale=inp.scale)

    si.update(inp.seq_lens, inp.query_start_loc)   # warm-up values (the capture runs nothing on CUDA)
    g, out, lse = _capture(step)
    for lens in ([1, 0, 3, 4], [69, 0, 8, 40], list(inp.seq_lens)):   # within each request's pages
        si.replay(g, np.asarray(lens, np.int64), inp.query_start_loc)
        if DEVICE == "cpu":
            out, lse = g.result
        got = [_bits(out), _bits(lse)]
        fresh = dataclasses.replace(inp, seq_lens=np.asarray(lens, np.int64))
        ref = _wrapper(inp, policy="size:16", device_plan=True, max_q_len=3)
        want = [_bits(t) for t in ref.run(**to_torch(fresh, DEVICE), scale=inp.scale)]
        for a, b in zip(want, got):
            np.testing.assert_array_equal(a, b)
    with pytest.raises(ValueError, match="seq_lens: 4 entries expected"):
        si.replay(g, [1, 2, 3], inp.query_start_loc)
    with pytest.raises(ValueError, match="in_graph: replay"):
        StepInputs(B, DEVICE).replay(g, [1, 2, 3, 4], inp.query_start_loc)
    with pytest.raises(ValueError, match="in_graph: copy"):
        StepInputs(B, DEVICE).copy()


@pytest.mark.parametrize("kw", [dict(), dict(graph_stable=True, max_splits=8),
                                dict(graph_stable=True, max_splits=8, plan_in_graph=True)],
                         ids=["plain", "graph-stable", "plan-in-graph"])
def test_plan_refuses_lengths_of_two_dimensions(kw):
    """``plan()`` with ``seq_lens`` of shape ``[B, 1]`` (or ``query_start_loc`` of ``[1, B + 1]``) is
    refused naming the argument, in every planning mode, before anything is packed or copied; a
    captured plan's refresh (plan_in_graph) hands such a batch to the full path, which refuses it."""
    inp = cases.random_inputs(22, [70, 5, 33, 9], num_q_heads=8, num_kv_heads=2, head_dim=32, page_size=8,
                              dtype="bfloat16")
    w = _wrapper(inp, policy="size:16", **kw)
    seq = np.asarray(inp.seq_lens)
    w.plan(seq)
    for step in range(3):   # from the second plan() on, a captured wrapper refreshes in one C call
        n = w.plan_refreshes
        with pytest.raises(ValueError, match="^seq_lens: must be 1-D"):
            w.plan(seq.reshape(-1, 1))
        with pytest.raises(ValueError, match="^query_start_loc: must be 1-D"):
            w.plan(seq, query_start_loc=np.arange(5).reshape(1, -1))
        w.plan(seq + step)
        # a refused batch changed nothing: the next plan() refreshes as it would have
        assert w.plan_refreshes == n + (kw.get("plan_in_graph", False) and step > 0)


def test_plan_in_graph_replays_each_steps_host_plan():
    """``DecodeWrapper(plan_in_graph=True)``: ``plan()`` only packs; the copy captured by ``copy_plan()``
    carries each step's plan, so replays with new lengths (new plans, fewer and more work items) give
    the bits of a wrapper planned for each step; an eager ``run()`` copies a new plan itself. On CUDA
    a real graph, whose next ``plan()`` waits on the event its copy records."""
    from cuda_ref.wrapper import StepInputs

    B = 4
    inp = cases.random_inputs(21, [70, 0, 5, 33], q_lens=[1, 2, 1, 3], num_q_heads=8, num_kv_heads=2,
                              head_dim=32, page_size=8, dtype="bfloat16")
    x = to_torch(inp, DEVICE)
    kw = dict(policy="size:16", graph_stable=True, max_splits=8)
    w = _wrapper(inp, plan_in_graph=True, **kw)
    si = StepInputs(B, DEVICE)
    w.plan(inp.seq_lens, query_start_loc=inp.query_start_loc)
    si.update(inp.seq_lens, inp.query_start_loc)

    def step():
        w.copy_plan()
        return w.run(**dict(x, seq_lens=si.seq_lens, query_start_loc=si.query_start_loc), scale=inp.scale)

    def want(lens):
        fresh = dataclasses.replace(inp, seq_lens=np.asarray(lens, np.int64))
        ref = _wrapper(inp, **kw)
        ref.plan(fresh.seq_lens, query_start_loc=inp.query_start_loc)
        return [_bits(t) for t in ref.run(**to_torch(fresh, DEVICE), scale=inp.scale)]

    # eager: a plan() then run() without copy_plan(): run() copies the packed plan
    lens = [40, 0, 8, 12]
    w.plan(np.asarray(lens), query_start_loc=inp.query_start_loc)
    si.update(np.asarray(lens), inp.query_start_loc)
    out, lse = w.run(**dict(x, seq_lens=si.seq_lens, query_start_loc=si.query_start_loc), scale=inp.scale)
    for a, b in zip(want(lens), [_bits(out), _bits(lse)]):
        np.testing.assert_array_equal(a, b)
    # plan() only packs: the device keeps the previous plan until a copy, and a run over the previous
    # plan (shorter ranges) gives other bits (so the replays below check that the captured copy
    # carried each plan)
    lens = [69, 0, 8, 40]
    plan = w.plan(np.asarray(lens), query_start_loc=inp.query_start_loc)
    si.update(np.asarray(lens), inp.query_start_loc)
    assert w._uploader.pending
    assert not np.array_equal(w.dplan.view("item_kv_end").cpu().numpy(), plan.item_kv_end)
    w._uploader.pending = False   # as a graph captured without copy_plan() would replay
    out, lse = w.run(**dict(x, seq_lens=si.seq_lens, query_start_loc=si.query_start_loc), scale=inp.scale)
    assert any(not np.array_equal(a, b) for a, b in zip(want(lens), [_bits(out), _bits(lse)]))
    w.copy_plan()
    np.testing.assert_array_equal(w.dplan.view("item_kv_end").cpu().numpy(), plan.item_kv_end)
    # the graph: the copy captured, each step plan() + lengths + replay
    w.plan(inp.seq_lens, query_start_loc=inp.query_start_loc)
    si.update(inp.seq_lens, inp.query_start_loc)
    g, out, lse = _capture(step)
    for lens in ([1, 0, 3, 4], [69, 0, 8, 40], [2, 0, 1, 1], [60, 0, 5, 33]):   # within each request's pages
        w.plan(np.asarray(lens, np.int64), query_start_loc=inp.query_start_loc)
        si.update(np.asarray(lens, np.int64), inp.query_start_loc)
        g.replay()
        if DEVICE == "cpu":
            out, lse = g.result
        for a, b in zip(want(lens), [_bits(out), _bits(lse)]):
            np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("policy", ["auto", "size:16"])
def test_plan_in_graph_copies_the_planned_lengths_with_the_plan(policy):
    """``planned_seq_lens`` / ``planned_query_start_loc``: the last ``plan()``'s lengths and offsets,
    packed after the plan and copied with it, so a graph captured over them replays each step's batch
    after ``plan()`` alone (one copy a step; from the third plan on the C planner's one-call refresh,
    where it is available): the bits of a wrapper planned for each step."""
    inp = cases.random_inputs(23, [70, 0, 5, 33], q_lens=[1, 2, 1, 3], num_q_heads=8, num_kv_heads=2,
                              head_dim=32, page_size=8, dtype="bfloat16")
    x = to_torch(inp, DEVICE)
    kw = dict(policy=policy, graph_stable=True, max_splits=8)
    w = _wrapper(inp, plan_in_graph=True, **kw)
    with pytest.raises(RuntimeError, match="call plan"):
        w.planned_seq_lens
    with pytest.raises(ValueError, match="plan_in_graph"):
        _wrapper(inp, **kw).planned_seq_lens
    qsl = np.asarray(inp.query_start_loc, np.int64)
    w.plan(np.asarray(inp.seq_lens, np.int64), query_start_loc=qsl)

    def step():
        w.copy_plan()
        return w.run(**dict(x, seq_lens=w.planned_seq_lens, query_start_loc=w.planned_query_start_loc),
                     scale=inp.scale)

    def want(lens):
        fresh = dataclasses.replace(inp, seq_lens=np.asarray(lens, np.int64))
        ref = _wrapper(inp, **kw)
        ref.plan(fresh.seq_lens, query_start_loc=inp.query_start_loc)
        return [_bits(t) for t in ref.run(**to_torch(fresh, DEVICE), scale=inp.scale)]

    g, out, lse = _capture(step)
    steps = ([1, 0, 3, 4], [69, 0, 8, 40], [2, 0, 1, 1], [60, 0, 5, 33], [0, 0, 0, 7])
    for lens in steps:   # within each request's pages
        w.plan(np.asarray(lens, np.int64), query_start_loc=qsl)
        g.replay()
        if DEVICE == "cpu":
            out, lse = g.result
        np.testing.assert_array_equal(w.planned_seq_lens.cpu().numpy(), lens)
        np.testing.assert_array_equal(w.planned_query_start_loc.cpu().numpy(), qsl)
        for a, b in zip(want(lens), [_bits(out), _bits(lse)]):
            np.testing.assert_array_equal(a, b)
    from splitkv_common import native
    if native.load() is not None:
        assert w.plan_refreshes >= len(steps) - 1


def test_plan_in_graph_refuses_misuse():
    inp = cases.random_inputs(22, [30, 7], num_q_heads=4, num_kv_heads=2, head_dim=32, page_size=8)
    with pytest.raises(ValueError, match="plan_in_graph: needs graph_stable"):
        _wrapper(inp, plan_in_graph=True)
    with pytest.raises(ValueError, match="plan_in_graph: needs graph_stable"):
        _wrapper(inp, plan_in_graph=True, graph_stable=True, policy="size:16", device_plan=True)
    with pytest.raises(ValueError, match="plan_in_graph: copy_plan"):
        _wrapper(inp, graph_stable=True).copy_plan()
    with pytest.raises(RuntimeError, match="before copy_plan"):
        _wrapper(inp, graph_stable=True, plan_in_graph=True).copy_plan()
    if DEVICE == "cuda":   # a capture without copy_plan() would replay the capture's plan: refused
        x = to_torch(inp, DEVICE)
        w = _wrapper(inp, graph_stable=True, plan_in_graph=True)
        w.plan(inp.seq_lens)
        w.run(**x, scale=inp.scale)
        w.plan(inp.seq_lens)
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with pytest.raises(RuntimeError, match="call copy_plan"):
            with torch.cuda.graph(g):
                w.run(**x, scale=inp.scale)
