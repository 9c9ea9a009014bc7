"""The shared-prefix route of ``AscendDecodeWrapper`` (``plan(..., shared_prefix=...)``) through the
operator, here its CPU kernel (the NPU kernel reads the same plan and tiling buffers): the prefix
stage as the kernels' batch of prefix chunks, the tails, the exact merge; against the float64
reference of ``splitkv_common.shared_prefix``. Nothing here ran on an NPU."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from splitkv_common.parity.accuracy import check  # noqa: E402
from splitkv_common.parity.cases import SHARED_PREFIX_CATALOG, shared_prefix_inputs  # noqa: E402
from splitkv_common.reference import dense_attention, plain_attention  # noqa: E402
from splitkv_common.shared_prefix import PrefixGroup, SharedPrefix, SharedPrefixPlan, shared_prefix_reference  # noqa: E402
from splitkv_common.torch_io import from_torch, to_torch  # noqa: E402

from ascend_ops import ops  # noqa: E402
from ascend_ops.wrapper import AscendDecodeWrapper  # noqa: E402

HOST_READS = ("cpu", "item", "tolist", "numpy", "__array__", "__int__", "__float__", "__bool__", "__index__")


def wrapper_for(inp, t, **kw):
    return AscendDecodeWrapper(inp.q.shape[1], inp.k_cache.shape[2], inp.q.shape[2], inp.k_cache.shape[1],
                               dtype=t["q"].dtype, kv_dtype=t["k_cache"].dtype, device="cpu", **kw)


def plan_and_run(inp, sp, mode="on", validate=True, **kw):
    t = to_torch(inp, "cpu")
    w = wrapper_for(inp, t, **kw)
    splan = w.plan(inp.seq_lens, query_start_loc=inp.query_start_loc, window_left=inp.window_left, scale=inp.scale,
                   soft_cap=inp.soft_cap, max_pages=inp.block_table.shape[1], num_pages=inp.k_cache.shape[0],
                   shared_prefix=sp, block_table=inp.block_table, shared_prefix_mode=mode)
    o, l = w.run(t["q"], t["k_cache"], t["v_cache"], t["block_table"], t["seq_lens"], t["query_start_loc"],
                 k_scale=t["k_scale"], v_scale=t["v_scale"], k_offset=t["k_offset"], v_offset=t["v_offset"],
                 validate=validate)
    return w, splan, t, o, l


@pytest.mark.parametrize("case", SHARED_PREFIX_CATALOG, ids=lambda c: c.name)
def test_the_catalog_through_the_op_matches_the_float64_reference(case):
    inp, sp = case.build()
    w, splan, _, o, l = plan_and_run(inp, sp, mode=case.mode)
    assert isinstance(splan, SharedPrefixPlan) and w.shared_prefix_plan is splan
    assert splan.use_shared == (inp.window_left is None)
    out, lse = from_torch(o, l)
    ref_o, ref_l = shared_prefix_reference(inp, sp)
    acc = check(out, lse, ref_o.astype(np.float64), ref_l, plain_attention(inp), inp.dtype)
    assert acc.passed, acc.reason


def test_the_route_launches_the_op_twice_and_reads_no_device_tensor_on_the_host(monkeypatch):
    """Prefix stage and tails: two launches of the operator; outside them, no host read of q, the
    caches or the block table (what a device-to-host copy would be on an NPU)."""
    inp, sp = shared_prefix_inputs(21, [50 + 7 * i for i in range(9)], [(0, 6, 32), (6, 9, 16)], num_q_heads=8,
                                   num_kv_heads=2, head_dim=64, page_size=8, dtype="float16")
    t = to_torch(inp, "cpu")
    w = wrapper_for(inp, t)
    w.plan(inp.seq_lens, scale=inp.scale, max_pages=inp.block_table.shape[1], num_pages=inp.k_cache.shape[0],
           shared_prefix=sp, block_table=inp.block_table, shared_prefix_mode="on")
    marked = {t[k].untyped_storage().data_ptr() for k in ("q", "k_cache", "v_cache", "block_table")}
    in_kernel, reads, launches = [False], [], []
    for name in HOST_READS:
        orig = getattr(torch.Tensor, name)

        def guarded(self, *a, _orig=orig, _name=name, **k):
            if not in_kernel[0] and self.untyped_storage().data_ptr() in marked:
                reads.append(_name)
            return _orig(self, *a, **k)
        monkeypatch.setattr(torch.Tensor, name, guarded)
    real = ops.decode_attention_op

    def kernel(*a, **k):
        launches.append(a[0].shape[0])
        in_kernel[0] = True
        try:
            return real(*a, **k)
        finally:
            in_kernel[0] = False
    monkeypatch.setattr(ops, "decode_attention_op", kernel)
    o, l = w.run(t["q"], t["k_cache"], t["v_cache"], t["block_table"])
    monkeypatch.undo()
    assert reads == [] and launches == [9, 9]   # the tails' 9 rows, then the prefix chunks' 9 rows
    ref_o, ref_l = dense_attention(inp)
    np.testing.assert_allclose(o.float().numpy(), ref_o, atol=2e-3, rtol=0)
    np.testing.assert_allclose(l.numpy(), ref_l, atol=2e-4, rtol=0)


def test_auto_and_off_take_the_plain_route_with_the_planners_reason():
    inp, sp = shared_prefix_inputs(22, [40, 41, 42], [(0, 3, 16)], page_size=8)
    for mode in ("off", "auto"):
        w, splan, _, o, l = plan_and_run(inp, sp, mode=mode)
        assert not splan.use_shared and w._route is None and "shared prefix off" in splan.reason
        np.testing.assert_allclose(o.float().numpy(), dense_attention(inp)[0], atol=2e-3, rtol=0)
    # the wrapper's own mode is the default; a later plan() without shared_prefix is a plain plan
    t = to_torch(inp, "cpu")
    w = wrapper_for(inp, t, shared_prefix_mode="on")
    assert w.plan(inp.seq_lens, shared_prefix=sp, block_table=inp.block_table).use_shared
    w.plan(inp.seq_lens)
    assert w._route is None and w.shared_prefix_plan is None


def test_a_window_takes_the_plain_route_and_says_why():
    inp, sp = shared_prefix_inputs(23, [60, 70], [(0, 2, 32)], window_left=20, page_size=8)
    _, splan, _, o, _ = plan_and_run(inp, sp, mode="on")
    assert not splan.use_shared and "sliding window" in splan.reason and splan.mode == "on"
    np.testing.assert_allclose(o.float().numpy(), dense_attention(inp)[0], atol=2e-3, rtol=0)


def test_a_replanned_wrapper_runs_the_new_route():
    inp, sp = shared_prefix_inputs(24, [40, 50, 60], [(0, 3, 32)], page_size=8)
    inp2, sp2 = shared_prefix_inputs(25, [33, 20, 45, 52], [(1, 4, 16)], page_size=8)
    t = to_torch(inp, "cpu")
    w = wrapper_for(inp, t, shared_prefix_mode="on")
    for x, s in ((inp, sp), (inp2, sp2)):
        tt = to_torch(x, "cpu")
        w.plan(x.seq_lens, scale=x.scale, shared_prefix=s, block_table=x.block_table)
        o, _ = w.run(tt["q"], tt["k_cache"], tt["v_cache"], tt["block_table"])
        np.testing.assert_allclose(o.float().numpy(), dense_attention(x)[0], atol=2e-3, rtol=0)


# --- refusals: before any kernel runs, naming the argument and the rule --------------------------

@pytest.fixture
def batch():
    inp, sp = shared_prefix_inputs(26, [40, 50, 60], [(0, 3, 32)], page_size=8)
    return inp, sp, to_torch(inp, "cpu")


@pytest.fixture
def no_kernel(monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("a kernel ran")
    monkeypatch.setattr(ops, "decode_attention_op", refuse)


@pytest.mark.parametrize("kw, exc, match", [
    (dict(shared_prefix=PrefixGroup(0, 3, 32)), TypeError, "shared_prefix: expected a .*SharedPrefix"),
    (dict(shared_prefix=SharedPrefix((PrefixGroup(0, 2, 32), PrefixGroup(1, 3, 32)))), ValueError,
     "shared_prefix: group 1 starts at request 1, before the previous group's end"),
    (dict(shared_prefix=SharedPrefix.single(12, batch_size=3)), ValueError, "multiple of page_size 8"),
    (dict(shared_prefix=SharedPrefix.single(48, batch_size=3)), ValueError, "must precede every query row"),
    (dict(shared_prefix=SharedPrefix.single(32, batch_size=3), shared_prefix_mode="yes"), ValueError,
     "shared_prefix_mode: must be one of"),
    (dict(block_table="bt"), ValueError, "block_table, shared_prefix_mode: only with shared_prefix"),
])
def test_plan_refusals(batch, no_kernel, kw, exc, match):
    inp, _, t = batch
    kw = {**kw, **({"block_table": inp.block_table} if kw.get("block_table") == "bt" or "shared_prefix" in kw else {})}
    w = wrapper_for(inp, t)
    with pytest.raises(exc, match=match):
        w.plan(inp.seq_lens, **kw)
    assert w._route is None and w.shared_prefix_plan is None


def test_plan_refuses_a_block_table_that_does_not_start_with_the_prefix(batch, no_kernel):
    inp, sp, t = batch
    bt = inp.block_table.copy()
    bt[2, 1] = bt[2, 1] + 1
    with pytest.raises(ValueError, match=r"shared_prefix: group 0 covers request 2, whose block_table\[2, 1\]"):
        wrapper_for(inp, t).plan(inp.seq_lens, shared_prefix=sp, block_table=bt, shared_prefix_mode="on")


def test_without_a_host_block_table_the_pages_come_from_runs_block_table(batch):
    """plan() needs no host block table: each prefix chunk reads its group's first row on the device."""
    inp, sp, t = batch
    w = wrapper_for(inp, t)
    assert w.plan(inp.seq_lens, scale=inp.scale, shared_prefix=sp, shared_prefix_mode="on").use_shared
    o, _ = w.run(t["q"], t["k_cache"], t["v_cache"], t["block_table"])
    np.testing.assert_allclose(o.float().numpy(), dense_attention(inp)[0], atol=2e-3, rtol=0)
    with pytest.raises(ValueError, match="block_table: 3 columns, fewer than the 4 pages of the planned prefix"):
        w.run(t["q"], t["k_cache"], t["v_cache"], t["block_table"][:, :3].contiguous())


def test_graph_stable_wrappers_refuse_a_shared_prefix(batch, no_kernel):
    inp, sp, t = batch
    w = wrapper_for(inp, t, graph_stable=True, max_work_items=64)
    with pytest.raises(ValueError, match="shared_prefix: not supported by a graph-stable wrapper"):
        w.plan(inp.seq_lens, shared_prefix=sp, block_table=inp.block_table)
    with pytest.raises(ValueError, match="shared_prefix_mode: must be one of"):
        wrapper_for(inp, t, shared_prefix_mode="always")


def test_run_refusals(batch, no_kernel):
    inp, sp, t = batch
    w = wrapper_for(inp, t)
    w.plan(inp.seq_lens, scale=inp.scale, shared_prefix=sp, block_table=inp.block_table, shared_prefix_mode="on")
    with pytest.raises(ValueError, match="q, block_table: the shared-prefix plan was made for 3 requests and 3 rows"):
        w.run(t["q"][:2], t["k_cache"], t["v_cache"], t["block_table"][:2])
    with pytest.raises(ValueError, match="window_left: run with 8, the plan was made for no window"):
        w.run(t["q"], t["k_cache"], t["v_cache"], t["block_table"], window_left=8)
    bt = t["block_table"].clone()
    bt[1, 0] = bt[1, 0] + 1
    with pytest.raises(ValueError, match=r"shared_prefix: group 0 covers request 1"):
        w.run(t["q"], t["k_cache"], t["v_cache"], bt, t["seq_lens"], t["query_start_loc"], validate=True)
    with pytest.raises(ValueError, match="plan: covers 40 KV tokens of request 0, whose seq_len is 39"):
        w.run(t["q"], t["k_cache"], t["v_cache"], t["block_table"], t["seq_lens"] - 1, t["query_start_loc"],
              validate=True)


def test_the_ascend_backends_shared_prefix_route_on_the_cpu_kernel():
    """The ``ascend`` parity backend's route (``backend.extra["shared_prefix"]``), here on the CPU kernel."""
    import dataclasses
    import functools

    from ascend_ops.npu_backend import ascend_backend, run_shared_prefix
    from splitkv_common.parity.shared_prefix import run_shared_prefix_parity

    on_cpu = dataclasses.replace(ascend_backend, unavailable=lambda: None,
                                 extra={"shared_prefix": functools.partial(run_shared_prefix, device="cpu")})
    rep = run_shared_prefix_parity([on_cpu])
    assert ascend_backend.extra["shared_prefix"] is run_shared_prefix
    assert [r.status for r in rep.results] == ["pass"] * len(SHARED_PREFIX_CATALOG), rep.to_markdown()


def test_groups_whose_rows_span_several_prefix_chunks(monkeypatch):
    """Twenty requests under one prefix (GQA 4: 16 rows a chunk, two chunks), a second group after a
    loner: each chunk's block-table row is its group's first request's, gathered on the device."""
    inp, sp = shared_prefix_inputs(27, [70 + 3 * i for i in range(24)], [(1, 21, 64), (22, 24, 32)], num_q_heads=8,
                                   num_kv_heads=2, head_dim=64, page_size=16, dtype="bfloat16")
    t = to_torch(inp, "cpu")
    w = wrapper_for(inp, t)
    w.plan(inp.seq_lens, scale=inp.scale, shared_prefix=sp, shared_prefix_mode="on")
    assert w._route.chunk_request.tolist() == [1, 1, 22]
    rows = []
    real = ops.decode_attention_op
    monkeypatch.setattr(ops, "decode_attention_op", lambda *a, **k: rows.append(a[0].shape[0]) or real(*a, **k))
    o, l = w.run(t["q"], t["k_cache"], t["v_cache"], t["block_table"])
    assert rows == [24, 22]
    out, lse = from_torch(o, l)
    ref_o, ref_l = shared_prefix_reference(inp, sp)
    acc = check(out, lse, ref_o, ref_l, plain_attention(inp), inp.dtype)
    assert acc.passed, acc.reason


def test_a_refused_plan_leaves_the_shared_route_in_use(batch):
    inp, sp, t = batch
    w = wrapper_for(inp, t)
    splan = w.plan(inp.seq_lens, scale=inp.scale, shared_prefix=sp, shared_prefix_mode="on")
    route = w._route
    with pytest.raises(ValueError, match="multiple of page_size 8"):
        w.plan(inp.seq_lens, scale=inp.scale, shared_prefix=SharedPrefix.single(12, batch_size=3))
    assert w._route is route and w.shared_prefix_plan is splan
    o, _ = w.run(t["q"], t["k_cache"], t["v_cache"], t["block_table"])
    np.testing.assert_allclose(o.float().numpy(), dense_attention(inp)[0], atol=2e-3, rtol=0)
