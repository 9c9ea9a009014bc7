"""The host side of a decode step on the CPU: a plan's one-buffer upload (``PlanUploader``), its views,
no reallocation across graph-stable steps, and ``run()``'s launches prepared once per signature."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")
import cuda_ref  # noqa: E402  (selects the interpreter without a GPU: before anything imports triton)

pytest.importorskip("triton")
from cuda_ref import launch  # noqa: E402
from cuda_ref.launch import _FIELDS, DevicePlan, PlanUploader  # noqa: E402
from cuda_ref.wrapper import DecodeWrapper  # noqa: E402
from splitkv_common.parity import cases  # noqa: E402
from splitkv_common.plan import make_plan  # noqa: E402
from splitkv_common.torch_io import to_torch  # noqa: E402

DEVICE = "cpu" if cuda_ref.INTERPRET else "cuda"


def _plans(graph_stable):
    rng = np.random.default_rng(0)
    for B in (1, 3, 17, 40, 2):
        lens = rng.integers(0, 3000, B)
        q_lens = rng.integers(1, 4, B)
        yield make_plan(lens, num_kv_heads=2, page_size=16, q_lens=q_lens, policy="size:256" if B % 2 else "auto",
                        num_q_heads=8, graph_stable=graph_stable, max_splits=16 if graph_stable else None)


def _assert_views_hold(dp: DevicePlan, plan):
    for f in _FIELDS:
        np.testing.assert_array_equal(dp.view(f).cpu().numpy(), getattr(plan, f), err_msg=f)
    assert (dp.num_items, dp.batch_size, dp.num_rows, dp.num_slots) == (
        plan.num_items, plan.batch_size, plan.num_rows, plan.num_slots)


def test_views_hold_the_plan_and_the_device_buffer_is_reused_while_large_enough():
    up = PlanUploader(DEVICE)
    sizes = []
    for plan in _plans(False):
        dp = up.upload(plan, group=4)
        _assert_views_hold(dp, plan)
        assert dp.data.numel() == sum(DevicePlan.sizes(plan.num_items, plan.batch_size, plan.num_rows))
        for f in _FIELDS:   # every view 16-byte aligned, whatever the plan's sizes (one Triton specialization)
            assert dp.view(f).data_ptr() % 16 == 0, f
        sizes.append(dp.data.numel())
    # one device buffer that grows geometrically, one staging buffer (a ring of one off CUDA)
    assert up.allocations <= 2 * (1 + sum(b > a for a, b in zip(sizes, sizes[1:])))
    assert up.allocations < 2 * len(sizes)


def test_graph_stable_steps_allocate_nothing_and_keep_the_views():
    inp = cases.random_inputs(3, [70, 33, 5, 120], q_lens=[1, 2, 1, 3], num_q_heads=4, num_kv_heads=2,
                              head_dim=32, page_size=8)
    w = DecodeWrapper(4, 2, 32, 8, dtype="float32", device=DEVICE, policy="size:16", graph_stable=True, max_splits=16)
    for _ in range(w._uploader.ring):   # every staging buffer of the ring in use once
        w.plan(inp.seq_lens, query_start_loc=inp.query_start_loc)
    dp = w.dplan
    views = {f: dp.view(f) for f in _FIELDS}
    ptr, allocs, bufs = dp.data.data_ptr(), w._uploader.allocations, dict(w._buffers)
    rng = np.random.default_rng(1)
    for _ in range(5):
        lens = rng.integers(0, inp.seq_lens + 1)
        plan = w.plan(lens, query_start_loc=inp.query_start_loc)
        assert w.dplan is dp and dp.data.data_ptr() == ptr
        assert w._uploader.allocations == allocs
        assert all(w._buffers[k] is v for k, v in bufs.items())
        for f in _FIELDS:
            assert dp.view(f) is views[f]
        _assert_views_hold(dp, plan)


def test_graph_stable_plans_reuse_the_spare_plans_buffer():
    """plan() writes a graph-stable plan into the buffer of the plan before the one in use: the plan
    it returned last stays valid through the next plan(), the one before is overwritten, and a plan
    given to set_plan() is never written."""
    w = DecodeWrapper(4, 2, 32, 8, dtype="float32", device=DEVICE, policy="size:16", graph_stable=True, max_splits=16)
    rng = np.random.default_rng(2)
    lens = [rng.integers(0, 120, 4) for _ in range(5)]
    fresh = [w.plan_spec().make(x) for x in lens]
    got = [w.plan(lens[0]), w.plan(lens[1])]
    assert got[1].items is not got[0].items
    for k in range(2, 5):
        got.append(w.plan(lens[k]))
        assert got[k].items is got[k - 2].items       # two buffers, taking turns
        for f in ("item_request", "item_kv_start", "item_kv_end"):   # the previous plan still holds
            np.testing.assert_array_equal(getattr(got[k - 1], f), getattr(fresh[k - 1], f), err_msg=f)
            np.testing.assert_array_equal(getattr(got[k], f), getattr(fresh[k], f), err_msg=f)
        _assert_views_hold(w.dplan, fresh[k])
    theirs = w.plan_spec().make(lens[0])
    keep = theirs.item_kv_end.copy()
    w.set_plan(theirs)
    for x in lens[1:4]:
        w.plan(x)
        np.testing.assert_array_equal(theirs.item_kv_end, keep)


def test_eager_plans_of_other_sizes_reuse_the_buffers_stores():
    """An eager wrapper whose plans change size every step (batch and splits) allocates its output and
    partial buffers only while they grow: later plans take views of the stores, and the results are
    those of a wrapper made for each batch."""
    w = DecodeWrapper(4, 2, 32, 8, dtype="float32", device=DEVICE, policy="size:16")
    rng = np.random.default_rng(5)
    lens = [rng.integers(0, 90, B).tolist() for B in (5, 2, 5, 3, 1, 4)]
    lens += [[8] * 4, [200] * 4, [30] * 4, [300] * 4]   # one batch size, the partial slots growing and shrinking
    lens += [[40] * 7, [40] * 2]   # more requests than the stores held, then fewer again
    batches = [cases.random_inputs(30 + k, x, num_q_heads=4, num_kv_heads=2, head_dim=32, page_size=8)
               for k, x in enumerate(lens)]
    # more query rows than the stores held, the partial slots and counters within theirs
    batches.append(cases.random_inputs(50, [10, 12], q_lens=[5, 4], num_q_heads=4, num_kv_heads=2, head_dim=32,
                                       page_size=8))
    for k, inp in enumerate(batches):
        before = {n: (t.data_ptr(), t.shape[0]) for n, t in w._stores.items()}
        w.plan(inp.seq_lens, query_start_loc=inp.query_start_loc)
        out, lse = w.run(**to_torch(inp, DEVICE), scale=inp.scale)
        ref = DecodeWrapper(4, 2, 32, 8, dtype="float32", device=DEVICE, policy="size:16")
        ref.plan(inp.seq_lens, query_start_loc=inp.query_start_loc)
        want = ref.run(**to_torch(inp, DEVICE), scale=inp.scale)
        for a, b in zip(want, (out, lse)):
            assert torch.equal(a.cpu(), b.cpu())
        assert out.shape[0] == inp.q.shape[0] and w._buffers["part_o"].shape[0] >= max(w.host_plan.num_slots, 1)
        for n, (ptr, rows) in before.items():   # a store is replaced only when a buffer outgrows it
            need = {"out": out.shape[0], "lse": out.shape[0], "part_o": w.host_plan.num_slots,
                    "part_lse": w.host_plan.num_slots,
                    "counters": w.host_plan.batch_size * 2 * w.dplan.row_blocks}.get(n, 0)
            if need <= rows:
                assert w._stores[n].data_ptr() == ptr, n
    assert w._stores["out"].shape[0] >= 9 and w._stores["part_o"].shape[0] >= max(
        DecodeWrapper(4, 2, 32, 8, dtype="float32", device=DEVICE, policy="size:16").plan(
            b.seq_lens, query_start_loc=b.query_start_loc).num_slots for b in batches)


def test_graph_stable_refresh_refuses_other_shapes():
    w = DecodeWrapper(4, 2, 32, 8, dtype="float32", device=DEVICE, policy="size:16", graph_stable=True, max_splits=8)
    w.plan([10, 20])
    with pytest.raises(ValueError, match="shapes changed under a graph-stable plan"):
        w.plan([10, 20, 30])


def test_pack_into_writes_each_field_at_its_aligned_offset():
    for plan in list(_plans(True)) + list(_plans(False)):
        buf = np.full(DevicePlan.pack(plan).size + 3, -7, np.int32)
        n = DevicePlan.pack_into(plan, buf)
        assert n == buf.size - 3 and (buf[n:] == -7).all()
        offsets = np.cumsum([0] + DevicePlan.sizes(plan.num_items, plan.batch_size, plan.num_rows))
        assert (offsets % 4 == 0).all() and offsets[-1] == n
        for f, off in zip(_FIELDS, offsets):
            a = getattr(plan, f)
            np.testing.assert_array_equal(buf[off:off + a.shape[0]], a, err_msg=f)


def test_run_prepares_its_launches_once_per_signature(monkeypatch):
    inp = cases.random_inputs(4, [40, 9], num_q_heads=4, num_kv_heads=2, head_dim=32, page_size=8)
    w = DecodeWrapper(4, 2, 32, 8, dtype="float32", device=DEVICE, policy="size:16")
    x = to_torch(inp, DEVICE)
    calls = []
    real = launch.prepare_decode
    lens_20 = torch.tensor([20, 9], dtype=torch.int32, device=DEVICE)
    ref = DecodeWrapper(4, 2, 32, 8, dtype="float32", device=DEVICE, policy="size:16")
    ref.plan([20, 9])
    want_20 = ref.run(**dict(x, seq_lens=lens_20))[0]

    def counting(*a, **k):
        calls.append(1)
        return real(*a, **k)

    monkeypatch.setattr("cuda_ref.wrapper.prepare_decode", counting)
    w.plan(inp.seq_lens)
    first = w.run(**x)[0].clone()
    again = w.run(**x)[0]
    assert len(calls) == 1 and torch.equal(first, again)
    w.run(**x, soft_cap=30.0)             # another signature: prepared again
    assert len(calls) == 2
    w.plan([9, 40])                       # the same sizes (items, rows, slots): the same launch
    w.run(**x)
    assert len(calls) == 2
    w.plan([20, 9])                       # fewer work items: the same launch, over a smaller grid
    fewer = w.run(**dict(x, seq_lens=lens_20))[0]
    assert len(calls) == 2 and w.last_launch.stage1.grid == (w.dplan.num_items, w.dplan.row_blocks)
    assert torch.equal(fewer, want_20)
    w.plan([16, 9])                       # nothing split: no merge, prepared again
    w.run(**dict(x, seq_lens=torch.tensor([16, 9], dtype=torch.int32, device=DEVICE)))
    assert len(calls) == 3
    w.plan([40, 40])                      # more partial slots than the buffers hold: they grow, prepared again
    w.run(**dict(x, seq_lens=torch.tensor([40, 40], dtype=torch.int32, device=DEVICE)))
    assert len(calls) == 4


def _first_requests(x: dict, B: int) -> dict:
    """The call arguments of the batch's first ``B`` requests (one query row each), the same cache."""
    return dict(x, q=x["q"][:B], block_table=x["block_table"][:B], seq_lens=x["seq_lens"][:B],
                query_start_loc=x["query_start_loc"][:B + 1])


def test_batches_of_other_sizes_share_one_prepared_launch(monkeypatch):
    """An eager wrapper whose batch changes size every step prepares its launch once for batches of
    two requests or more (one more for a single request: its signature differs where a rule looks
    at one entry) and bounds the kernels by each batch's sizes: every result equals a fresh
    wrapper's for that batch."""
    inp = cases.random_inputs(8, [70, 9, 33, 120, 5, 64], num_q_heads=4, num_kv_heads=2, head_dim=32, page_size=8)
    x = to_torch(inp, DEVICE)
    calls = []
    real = launch.prepare_decode

    def counting(*a, **k):
        calls.append(1)
        return real(*a, **k)

    monkeypatch.setattr("cuda_ref.wrapper.prepare_decode", counting)
    w = DecodeWrapper(4, 2, 32, 8, dtype="float32", device=DEVICE, policy="size:16")
    w.plan(inp.seq_lens)          # the largest batch first: its stores hold every later one
    w.run(**x)
    shared, prepared = w.last_launch, len(calls)
    for B in (3, 5, 2, 6, 4, 1, 2):
        sub = _first_requests(x, B)
        w.plan(inp.seq_lens[:B])
        n = len(calls)
        out, lse = w.run(**sub)
        prepared += len(calls) - n
        if B > 1:
            assert w.last_launch is shared and w.last_launch.sizes == (B, B, B)
        ref = DecodeWrapper(4, 2, 32, 8, dtype="float32", device=DEVICE, policy="size:16")
        ref.plan(inp.seq_lens[:B])
        for a, b in zip(ref.run(**sub), (out, lse)):
            assert torch.equal(a.cpu(), b.cpu())
    assert prepared == 2


def test_a_batch_of_other_sizes_is_still_checked_against_the_plan_and_itself():
    """The checks' cache leaves the batch's sizes out of its signature, not out of the checks: after
    a batch passed, one whose sizes disagree with each other or with the plan is refused by name,
    and so is a strided ``seq_lens`` that passed while it had one entry."""
    inp = cases.random_inputs(8, [70, 9, 33, 120], num_q_heads=4, num_kv_heads=2, head_dim=32, page_size=8)
    x = to_torch(inp, DEVICE)
    w = DecodeWrapper(4, 2, 32, 8, dtype="float32", device=DEVICE, policy="size:16")
    w.plan(inp.seq_lens[:3])
    w.run(**_first_requests(x, 3))
    with pytest.raises(ValueError, match=r"plan: made for 3 requests, seq_lens has shape \(4,\)"):
        w.run(**dict(_first_requests(x, 3), seq_lens=x["seq_lens"]))
    with pytest.raises(ValueError, match="plan: made for 3 query rows, q has 2"):
        w.run(**dict(_first_requests(x, 3), q=x["q"][:2]))
    with pytest.raises(ValueError, match="plan: made for 3 requests, block_table has shape"):
        w.run(**_first_requests(x, 2))
    strided = torch.zeros(8, dtype=torch.int32, device=DEVICE)
    strided[::2] = x["seq_lens"]
    w.plan(inp.seq_lens[:1])
    w.run(**dict(_first_requests(x, 1), seq_lens=strided[:2:2]))     # one entry: its stride is never used
    w.plan(inp.seq_lens[:2])
    w.run(**dict(_first_requests(x, 2), seq_lens=x["seq_lens"][:2]))
    with pytest.raises(ValueError, match="seq_lens: the request axis must have stride 1"):
        w.run(**dict(_first_requests(x, 2), seq_lens=strided[:4:2]))


def test_a_prepared_launch_refuses_a_batch_empty_where_it_was_not():
    inp = cases.random_inputs(8, [70, 9], num_q_heads=4, num_kv_heads=2, head_dim=32, page_size=8)
    x = to_torch(inp, DEVICE)
    w = DecodeWrapper(4, 2, 32, 8, dtype="float32", device=DEVICE, policy="size:16")
    w.plan(inp.seq_lens)
    w.run(**x)
    with pytest.raises(ValueError, match="launch: prepared for batch sizes"):
        w.last_launch.resize((0, 0, 0))


def test_graph_stable_staging_rewrites_only_the_valid_items_and_stays_exact():
    # valid counts going down and up: the padding left in each staging buffer must be right each time
    up = PlanUploader(DEVICE, ring=2)
    out = None
    for lens in ([3000, 2000, 10], [0, 0, 0], [5000, 4000, 3000], [17, 0, 900], [5000, 5000, 5000], [1, 1, 1]):
        plan = make_plan(lens, num_kv_heads=2, page_size=16, policy="size:256", num_q_heads=8, graph_stable=True,
                         max_splits=32)
        out = up.upload(plan, group=4, out=out)
        _assert_views_hold(out, plan)


def test_a_new_plan_of_the_same_batch_is_checked_against_the_block_tables_width():
    # the cached metadata check covers the batch and rows; the pages a plan reads are checked each call
    inp = cases.random_inputs(4, [30, 9], num_q_heads=4, num_kv_heads=2, head_dim=32, page_size=8)
    w = DecodeWrapper(4, 2, 32, 8, dtype="float32", device=DEVICE, policy="size:16")
    x = to_torch(inp, DEVICE)
    w.plan([30, 9])
    w.run(**x)
    cols = x["block_table"].shape[1]
    w.plan([cols * 8 + 1, 9])     # one token more than the block table holds
    with pytest.raises(ValueError, match=f"reads {cols + 1} pages of a request; block_table has only {cols}"):
        w.run(**x)


def test_plans_of_sizes_seen_before_reuse_the_slices_and_views_and_hold_their_values():
    up = PlanUploader(DEVICE)
    mk = lambda lens: make_plan(lens, num_kv_heads=2, page_size=16, policy="size:256", num_q_heads=8)  # noqa: E731
    a, b, a2 = mk([300, 1000]), mk([3000, 20, 700]), mk([260, 1020])
    assert (a.num_items, a.batch_size, a.num_rows) == (a2.num_items, a2.batch_size, a2.num_rows)
    assert (a.num_items, a.batch_size) != (b.num_items, b.batch_size)
    _assert_views_hold(up.upload(b, group=4), b)   # the larger plan first: the buffers' sizes
    dp_a = up.upload(a, group=4)
    views_a = {f: dp_a.view(f) for f in _FIELDS}
    allocs = up.allocations
    _assert_views_hold(up.upload(b, group=4), b)
    dp_a2 = up.upload(a2, group=4)
    assert all(dp_a2.view(f) is views_a[f] for f in _FIELDS)   # no view made again
    _assert_views_hold(dp_a2, a2)
    assert up.allocations == allocs
    assert set(up.last_parts) == {"prepare", "wait", "pack", "copy", "record"}
    assert all(v >= 0 for v in up.last_parts.values())


_CACHE_INPUTS = None


def _cache_inputs():
    """One cache for six requests (the steps below take their first ``B``), made once."""
    global _CACHE_INPUTS
    if _CACHE_INPUTS is None:
        inp = cases.random_inputs(11, [70, 9, 33, 120, 5, 64], num_q_heads=4, num_kv_heads=2, head_dim=32,
                                  page_size=8)
        _CACHE_INPUTS = inp, to_torch(inp, DEVICE)
    return _CACHE_INPUTS


def _outcome(w, x):
    try:
        out, lse = w.run(**x)
        return "ok", out.cpu().clone(), lse.cpu().clone()
    except (TypeError, ValueError) as e:
        return type(e).__name__, str(e)


_BREAKS = ("none", "seq_lens longer", "q shorter", "block_table shorter", "query_start_loc longer",
           "strided seq_lens")


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 6), st.integers(1, 6), st.sampled_from(_BREAKS)), min_size=2, max_size=6))
def test_the_signature_caches_never_change_what_a_call_does(steps):
    """A wrapper that remembers its checks and launches across calls of changing batch sizes (some
    of them wrong: sizes that disagree with each other or with the plan, a strided ``seq_lens``)
    does what a fresh wrapper does with the same plan: the same error, or the same bits."""
    inp, x = _cache_inputs()
    kept = DecodeWrapper(4, 2, 32, 8, dtype="float32", device=DEVICE, policy="size:16")
    for planned, B, brk in steps:
        call = _first_requests(x, B)
        if brk == "seq_lens longer":
            call["seq_lens"] = x["seq_lens"][:B + 1]
        elif brk == "q shorter":
            call["q"] = x["q"][:B - 1]
        elif brk == "block_table shorter":
            call["block_table"] = x["block_table"][:B - 1]
        elif brk == "query_start_loc longer":
            call["query_start_loc"] = torch.arange(B + 2, dtype=torch.int32, device=DEVICE)
        elif brk == "strided seq_lens":
            strided = torch.zeros(2 * B, dtype=torch.int32, device=DEVICE)
            strided[::2] = x["seq_lens"][:B]
            call["seq_lens"] = strided[::2]
        fresh = DecodeWrapper(4, 2, 32, 8, dtype="float32", device=DEVICE, policy="size:16")
        for w in (kept, fresh):
            w.plan(inp.seq_lens[:planned])
        got, want = _outcome(kept, call), _outcome(fresh, call)
        assert got[0] == want[0], (planned, B, brk, got[:2], want[:2])
        if got[0] == "ok":
            assert torch.equal(got[1], want[1]) and torch.equal(got[2], want[2]), (planned, B, brk)
        else:
            assert got[1] == want[1], (planned, B, brk)


@pytest.mark.parametrize("native", [True, False])
def test_with_fields_copies_a_plan_keeping_its_reason_lazy(native):
    """``with_fields`` changes the given fields only, drops the item buffer and the C planner's packed
    arrays (the copy's arrays are no longer their rows: it packs from its fields), and does not make a
    lazy reason first (the NumPy planner's cost model is not run for a copy nobody asks why of)."""
    from splitkv_common.plan_layout import with_fields
    from splitkv_common.plan_spec import PlanSpec, NativePlanner
    spec = PlanSpec(8, 2, 64, 16)
    lens = np.array([300, 40, 1000], np.int32)
    planner = NativePlanner.for_spec(spec) if native else None
    if native and planner is None:
        pytest.skip("the C planner is not available here")
    plan = planner.make(lens) if native else spec.make(lens)
    lazy = "_why" in plan.__dict__
    assert lazy or not native   # an auto plan of the C planner says why only when asked
    ends = (plan.item_kv_end + 5).astype(np.int32)
    copy = with_fields(plan, item_kv_end=ends, num_slots=plan.num_slots + 1)
    assert copy.items is None and "_small" not in copy.__dict__
    assert ("_why" in copy.__dict__) == lazy and ("_why" in plan.__dict__) == lazy
    np.testing.assert_array_equal(copy.item_kv_end, ends)
    np.testing.assert_array_equal(copy.item_kv_start, plan.item_kv_start)
    assert copy.num_slots == plan.num_slots + 1 and copy.reason == plan.reason
    packed = DevicePlan.pack(copy)
    assert not np.array_equal(packed, DevicePlan.pack(plan))
    with pytest.raises(TypeError, match="not fields of Plan"):
        with_fields(plan, bogus=1)
