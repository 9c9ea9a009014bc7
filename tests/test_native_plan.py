"""The C planner (``splitkv_common/native/plan_fast.c``) makes the NumPy planner's plans, bit for bit.

The NumPy planner is the oracle: on a generated corpus (ragged lengths incl. 0 and the int32 limit,
multi-query rows as ``q_lens`` and ``query_start_loc``, zero-row requests, every policy and profile,
caps, graph-stable capacities, int32 / int64 / other inputs, streams of graph-stable steps reusing the
last plan's buffers) the C planner either hands the batch back (None) exactly where the NumPy fast
path does, or makes the same plan: every array (dtype, shape, values), every scalar, the ``reason``
and the ``estimates_us``. Its device packing equals :meth:`DevicePlan.pack_into`'s.
"""

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from splitkv_common import native
from splitkv_common.devices import PROFILES
from splitkv_common.plan import NativePlanner, PlanSpec
from splitkv_common.planner import _fast_settings, _plan_fast
from test_planner_equality import assert_same_plan

pytestmark = pytest.mark.skipif(native.load() is None, reason=f"C planner: {native.status()}")

PAGES = [1, 8, 16, 128]


def numpy_fast(spec: PlanSpec, seq, q_lens, qsl):
    """The NumPy fast path's plan (None where it hands on to the general path)."""
    f = _fast_settings(spec.num_kv_heads, spec.page_size, spec.head_dim, spec.kv_elem_bytes, spec.num_q_heads, None,
                       spec.min_split_tokens, spec.max_splits, spec.max_work_items, spec.graph_stable, None)
    return None if f is None else _plan_fast(seq, q_lens, qsl, spec.policy, spec.device, f)


def check_one(nat: NativePlanner, spec: PlanSpec, seq, q_lens=None, qsl=None, reuse=None, want_reuse=None):
    """The C plan against the NumPy planner's (the same plan or an error from it); returns both."""
    got = nat.make(seq, q_lens, qsl, reuse=reuse)
    try:
        want = spec.make(seq, q_lens, qsl, reuse=want_reuse)
    except ValueError:
        assert got is None, "the C planner planned a batch the NumPy planner refuses"
        return None, None
    fast = numpy_fast(spec, seq, q_lens, qsl)
    plain = type(seq) is np.ndarray and seq.dtype in (np.int32, np.int64) and seq.ndim == 1 and \
        all(x is None or (type(x) is np.ndarray and x.dtype in (np.int32, np.int64)) for x in (q_lens, qsl))
    if plain:   # the C planner takes exactly what the NumPy fast path takes
        assert (got is None) == (fast is None), (got, fast)
    if got is not None:
        assert_same_plan(got, want)
        assert got.items.shape == (5, got.num_items)
        assert got.items.flags.c_contiguous
    return got, want


@st.composite
def case(draw):
    page = draw(st.sampled_from(PAGES))
    max_len = draw(st.sampled_from([40, 600, 5000, 40000, 2**31 - 1]))
    n = draw(st.sampled_from([1, 4, 11, 40, 300]))
    min_n = draw(st.sampled_from([1, 1, n // 2 + 1]))
    lens = st.one_of(st.integers(0, max_len), st.just(0), st.sampled_from([1, 16, 128, 512, 4096]))
    seq = draw(st.lists(lens, min_size=min_n, max_size=n))
    hkv = draw(st.sampled_from([1, 2, 8]))
    pol = draw(st.one_of(st.sampled_from(["auto"] * 6 + ["none"]), st.integers(1, 40).map(lambda k: f"size:{k * page}")))
    profiles = sorted(PROFILES)   # GPU profiles (the cost model) and Ascend ones (npu_auto)
    spec = dict(num_q_heads=hkv * draw(st.sampled_from([1, 4])), num_kv_heads=hkv,
                head_dim=draw(st.sampled_from([64, 128])), page_size=page, kv_elem_bytes=draw(st.sampled_from([1, 2])),
                policy=pol, device=draw(st.sampled_from(profiles)), graph_stable=draw(st.booleans()))
    if draw(st.booleans()):
        spec["min_split_tokens"] = draw(st.sampled_from([0, 1, page, 64, 256, 1000]))
    if draw(st.booleans()):
        spec["max_splits"] = draw(st.integers(1, 80))
    if spec["graph_stable"] and draw(st.booleans()):
        spec["max_work_items"] = draw(st.integers(0, 4000))
    dtype = draw(st.sampled_from([np.int64] * 4 + [np.int32] * 3 + [np.uint16, "list"]))
    rows = draw(st.sampled_from(["default", "q_lens", "qsl"]))
    rows_of = st.lists(st.integers(0, 6), min_size=len(seq), max_size=len(seq))
    steps = draw(st.integers(1, 3))
    more = [draw(st.lists(lens, min_size=len(seq), max_size=len(seq))) for _ in range(steps - 1)]
    qs = [draw(rows_of)]
    for _ in range(steps - 1):   # the same query rows, or others (T changes: a reused plan's buffers do not fit)
        qs.append(qs[-1] if draw(st.booleans()) else draw(rows_of))
    return spec, [seq] + more, qs, rows, dtype


def _as(x, dtype):
    return list(x) if dtype == "list" else np.array(x).astype(dtype)


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(c=case())
def test_same_plans_as_the_numpy_planner(c):
    kw, steps, qs, rows, dtype = c
    spec = PlanSpec(**kw)
    nat = NativePlanner.for_spec(spec)
    assert nat is not None
    got = want = None
    for seq, q in zip(steps, qs):   # graph-stable steps write into the last step's buffers, as a wrapper's do
        qv = _as(q, dtype if dtype != np.uint16 else np.int32)
        q_lens = qv if rows == "q_lens" else None
        qsl = _as(np.concatenate([[0], np.cumsum(q)]), dtype if dtype != np.uint16 else np.int64) if rows == "qsl" else None
        got2, want2 = check_one(nat, spec, _as(seq, dtype), q_lens, qsl, reuse=got, want_reuse=want)
        if got2 is not None and got is not None and got.num_items == got2.num_items and spec.graph_stable:
            assert got2.items is got.items   # written in place
        got, want = got2, want2


@pytest.mark.parametrize("B", [1, 16, 64, 256, 1024])
@pytest.mark.parametrize("policy", ["auto", "size:512", "none"])
@pytest.mark.parametrize("graph_stable", [False, True])
@pytest.mark.parametrize("device", ["h200", "910b2", "910b4"])
def test_same_plans_at_serving_shapes(B, policy, graph_stable, device):
    """The serving benchmark's shapes (longest requests first above 528 items), a stream of steps."""
    rng = np.random.default_rng(B)
    spec = PlanSpec(32, 8, 128, 16, policy=policy, graph_stable=graph_stable, device=device)
    nat = NativePlanner.for_spec(spec)
    got = want = None
    for step in range(4):
        seq = rng.integers(0 if step == 3 else 512, 8193, B)
        got, want = check_one(nat, spec, seq, reuse=got, want_reuse=want)
        assert got is not None


def test_hands_back_what_the_numpy_fast_path_does_not_plan():
    """Windows, the cap growing a split, lengths past int32, inputs of other types: None."""
    spec = PlanSpec(32, 8, 128, 16, policy="size:16", max_splits=4)
    nat = NativePlanner.for_spec(spec)
    assert nat.make(np.array([1000, 5])) is None                        # 63 splits over the cap of 4
    assert nat.make(np.array([64, 5])) is not None
    nat = NativePlanner.for_spec(PlanSpec(32, 8, 128, 16))
    assert nat.make(np.array([2**31, 5])) is None
    assert nat.make(np.array([-1, 5])) is None
    assert nat.make(np.array([[5, 5]])) is None                          # 2-D
    assert nat.make(np.array([5.0, 5.0])) is None                        # float
    assert nat.make(np.arange(10)[::2]) is None                          # strided
    assert nat.make(np.zeros(0, np.int64)) is None                       # empty
    assert nat.make(np.array([5, 6]), query_start_loc=np.array([0, 2, 1])) is None
    assert nat.make(np.array([5, 6]), q_lens=np.array([1])) is None
    assert NativePlanner.for_spec(PlanSpec(32, 8, 128, 16, policy="count:4")) is None
    assert NativePlanner.for_spec(PlanSpec(32, 8, 128, 16, policy="count:4", device="910b2")) is None


def test_auto_reason_is_the_numpy_planners():
    spec = PlanSpec(32, 8, 128, 16, graph_stable=True)
    nat = NativePlanner.for_spec(spec)
    seq = np.array([16000], np.int64)
    got = nat.make(seq)
    seq[0] = 5   # the reason is made later, from the batch as it was
    want = spec.make(np.array([16000]))
    assert got.reason == want.reason and "splits of" in got.reason
    assert got.estimates_us == want.estimates_us


@pytest.mark.parametrize("lens", [[16000], [300], [40000, 5, 0], [0, 0], [129] * 3])
def test_npu_auto_reason_is_the_numpy_planners(lens):
    """``auto`` on an Ascend profile (the NPU rule in C): the same split and, when read, the NumPy
    planner's reason and estimates."""
    spec = PlanSpec(32, 8, 128, 16, device="910b4")
    got = NativePlanner.for_spec(spec).make(np.array(lens, np.int64))
    want = spec.make(np.array(lens))
    assert got is not None
    assert_same_plan(got, want)
    assert got.reason == want.reason and got.reason.startswith("auto on 910b4")


def test_packs_as_the_device_plan_does():
    """``DevicePlan.pack_into`` of a C-made plan (the C packer) equals the field-by-field packing."""
    torch = pytest.importorskip("torch")
    del torch
    from cuda_ref.launch import DevicePlan, _FIELDS

    rng = np.random.default_rng(3)
    for graph_stable in (False, True):
        spec = PlanSpec(32, 8, 128, 16, graph_stable=graph_stable)
        nat = NativePlanner.for_spec(spec)
        for B in (1, 5, 64):
            p = nat.make(rng.integers(0, 9000, B), q_lens=rng.integers(0, 3, B))
            n = sum(DevicePlan.sizes(p.num_items, p.batch_size, p.num_rows))
            got = np.full(n, -7, np.int32)
            assert DevicePlan.pack_into(p, got) == n
            want = np.full(n, -7, np.int32)
            off = 0
            for f, k in zip(_FIELDS, DevicePlan.lengths(p.num_items, p.batch_size, p.num_rows)):
                want[off:off + k] = getattr(p, f)
                off += (k + 3) & ~3
            assert np.array_equal(got, want)
            part = np.full(n, -7, np.int32)
            DevicePlan.pack_into(p, part, items_upto=3)
            assert np.array_equal(part[:3], want[:3]) and (part[3:(p.num_items + 3) & ~3] == -7).all()


def test_wrapper_plans_with_it():
    """A wrapper's ``make_plan`` takes the C planner where it applies, the NumPy one elsewhere."""
    from splitkv_common.plan import PlannedWrapper

    class W(PlannedWrapper):
        def __init__(self, **kw):
            self.spec = PlanSpec(32, 8, 128, 16, **kw)

    w = W(graph_stable=True)
    p = w.make_plan(np.array([100, 2000]))
    assert "_small" in p.__dict__
    q = w.make_plan(np.array([100, 2000]), window_left=64)   # windows: NumPy
    assert "_small" not in q.__dict__
    assert "_small" not in W(policy="count:2").make_plan(np.array([100])).__dict__


def test_off_by_environment(monkeypatch):
    monkeypatch.setenv("SPLITKV_NATIVE", "0")
    native.reset()
    try:
        assert native.load() is None and "SPLITKV_NATIVE=0" in native.status()
        assert NativePlanner.for_spec(PlanSpec(32, 8, 128, 16)) is None
    finally:
        monkeypatch.delenv("SPLITKV_NATIVE")
        native.reset()
        assert native.load() is not None


def test_same_choice_under_a_capacity():
    """Graph-stable capacities below ``auto``'s first choice: the same choice among those that fit
    (a few % of such batches choose differently than without the capacity)."""
    rng = np.random.default_rng(11)
    moved = 0
    for _ in range(3000):
        B = int(rng.integers(1, 40))
        seq = rng.integers(0, int(rng.choice([600, 5000, 40000, 200000])), B)
        spec = PlanSpec(32, 8, 128, 16, graph_stable=True, max_work_items=int(rng.integers(B * 8, B * 8 * 30)))
        got, want = check_one(NativePlanner.for_spec(spec), spec, seq)
        if got is not None:
            moved += got.split_tokens != PlanSpec(32, 8, 128, 16).make(seq).split_tokens
    assert moved > 100   # the capacity moved the choice


def test_a_captured_plan_is_refreshed_in_one_call():
    """``DecodeWrapper(plan_in_graph=True)``: from the third ``plan()`` on (both plan buffers made), a
    batch of the captured sizes is planned and packed by one C call: each step's plan and the pinned
    buffer the captured copy reads equal the NumPy planner's plan and its packing; a batch the refresh
    does not take (another size, more query rows than captured, a window, a list, a tensor) goes the
    full way, with its errors, and a refused one writes nothing."""
    torch = pytest.importorskip("torch")
    import cuda_ref  # noqa: F401  (the interpreter without a GPU)
    from cuda_ref.launch import DevicePlan
    from cuda_ref.wrapper import DecodeWrapper

    device = "cpu" if cuda_ref.INTERPRET else "cuda"
    rng = np.random.default_rng(4)
    tried_rows = 0
    for policy, B, rows in (("auto", 5, "q_lens"), ("size:64", 6, "qsl"), ("none", 4, None), ("auto", 70, None)):
        w = DecodeWrapper(8, 2, 32, 16, graph_stable=True, plan_in_graph=True, policy=policy, device=device)
        ql = rng.integers(1, 3, B)
        qkw = {} if rows is None else dict(q_lens=ql) if rows == "q_lens" else \
            dict(query_start_loc=np.concatenate([[0], np.cumsum(ql)]).astype(np.int32))
        spec = w.plan_spec()
        host = None
        for step in range(12):
            seq = rng.integers(0, 3000 if step % 3 else 20, B).astype(np.int64 if step % 2 else np.int32)
            before = w.plan_refreshes
            if step == 0:
                assert w.refresh_parts == {}
            plan = w.plan(seq, **qkw)
            assert w.plan_refreshes == before + (step >= 2), (policy, step)
            if step >= 2:   # the refresh's parts, host µs
                parts = w.refresh_parts
                assert set(parts) == {"wait", "plan", "after"} and min(parts.values()) >= 0, parts
            want = spec.make(seq, qkw.get("q_lens"), qkw.get("query_start_loc"))
            assert_same_plan(plan, want)
            packed = DevicePlan.pack(want)
            np.testing.assert_array_equal(w._uploader._host[0][1][:packed.size], packed)
            host = host or w._uploader._host[0]
            assert w._uploader._host[0] is host and w._uploader.pending
            tail = host[1][packed.size:]   # the batch's lengths and offsets, copied with the plan
            at = (B + 3) & ~3
            np.testing.assert_array_equal(tail[:B], seq)
            np.testing.assert_array_equal(tail[at:at + B + 1], want.query_start_loc)
        # the full way: its errors, nothing written by the refresh first
        snapshot = host[1].copy()
        T, most = int(ql.sum()), w._refresh_with.most_rows
        if rows is not None and T > most:   # the same rows, all in one request: more than the capture's tile
            more = np.zeros(B, np.int64)
            more[0] = T
            tried_rows += 1
            with pytest.raises(ValueError, match="query rows"):
                w.plan(rng.integers(100, 3000, B), **(dict(q_lens=more) if rows == "q_lens" else
                                                      dict(query_start_loc=np.concatenate([[0], np.cumsum(more)]))))
        with pytest.raises(ValueError, match="shapes changed"):
            w.plan(rng.integers(0, 3000, B + 1))
        np.testing.assert_array_equal(host[1], snapshot)
        n = w.plan_refreshes
        for other in (dict(window_left=64), dict(as_list=True), dict(as_tensor=True)):
            seq = rng.integers(0, 3000, B)
            arg = seq.tolist() if other.pop("as_list", False) else torch.from_numpy(seq) if other.pop("as_tensor", False) \
                else seq
            plan = w.plan(arg, **qkw, **other)
            want = spec.make(seq, qkw.get("q_lens"), qkw.get("query_start_loc"), other.get("window_left"))
            assert_same_plan(plan, want)
        assert w.plan_refreshes == n
    assert tried_rows == 2


def _captured_cpu_wrapper(policy="auto", B=4):
    """A ``plan_in_graph`` wrapper on the CPU, planned twice (its C refresher made)."""
    pytest.importorskip("torch")
    from cuda_ref.wrapper import DecodeWrapper

    w = DecodeWrapper(8, 2, 32, 16, graph_stable=True, plan_in_graph=True, policy=policy, device="cpu")
    rng = np.random.default_rng(7)
    for _ in range(2):
        w.plan(rng.integers(0, 3000, B))
    assert w._refresh_with is not None
    return w, rng


@pytest.mark.parametrize("answer", [0, 600, 1, None])
def test_the_refresh_waits_for_the_copy_the_event_does_not_say_is_done(answer):
    """The refresher queries the captured copy's event from C (an address given as cuEventQuery's; here
    a stand-in): done (0) plans at once; not done (600), an error code or no query function call the
    wrapper's wait first (which synchronises, or raises: then nothing is written)."""
    import ctypes

    w, rng = _captured_cpu_wrapper()
    calls, asked = [], []

    @ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)
    def query(ev):
        asked.append(ev)
        return answer

    nat, up = w._native, w._uploader
    fast = nat.refresher(4, 4, 1, up._host[0][1], w.dplan.data.numel(), w._spare, w._mine, w, up,
                         lambda: calls.append(1))
    assert fast.event == 0
    fast.refresh(rng.integers(0, 3000, 4), None, None)
    assert calls == [] and asked == []     # no event yet: nothing to wait for
    fast.set_event(0xABC0, 0 if answer is None else ctypes.cast(query, ctypes.c_void_p).value)
    assert fast.event == 0xABC0
    seq = rng.integers(0, 3000, 4)
    plan = fast.refresh(seq, None, None)
    assert asked == ([] if answer is None else [0xABC0])
    assert calls == ([] if answer == 0 else [1])
    assert_same_plan(plan, w.plan_spec().make(seq))

    def refuse():
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    if answer != 0:   # the wait's error is the refresh's, before anything is written
        fast = nat.refresher(4, 4, 1, up._host[0][1], w.dplan.data.numel(), w._spare, w._mine, w, up, refuse)
        fast.set_event(0xABC0, 0 if answer is None else ctypes.cast(query, ctypes.c_void_p).value)
        before, n = up._host[0][1].copy(), w.plan_refreshes
        with pytest.raises(RuntimeError, match="illegal memory access"):
            fast.refresh(rng.integers(0, 3000, 4), None, None)
        np.testing.assert_array_equal(up._host[0][1], before)
        assert w.plan_refreshes == n


def test_make_plan_hands_the_refresh_back_to_set_plan():
    """``make_plan()`` called by hand takes the spare plan's buffers: the refresher is dropped (it would
    write into them) and made again by the next ``set_plan()`` of the plan made last (``plan()``'s
    own, or that one by hand); the plan made by hand is never written over, and every plan is the
    NumPy planner's."""
    w, rng = _captured_cpu_wrapper()
    spec = w.plan_spec()

    def refreshed(steps=3):
        for _ in range(steps):
            seq = rng.integers(0, 3000, 4)
            n = w.plan_refreshes
            assert_same_plan(w.plan(seq), spec.make(seq))
            assert w.plan_refreshes == n + 1

    seq = rng.integers(0, 3000, 4)
    made = w.make_plan(seq)
    assert w._refresh_with is None
    other = rng.integers(0, 3000, 4)
    assert_same_plan(w.plan(other), spec.make(other))   # the full way
    assert w._refresh_with is not None
    refreshed()
    assert_same_plan(made, spec.make(seq))   # its buffers are in neither plan the refresher writes
    seq = rng.integers(0, 3000, 4)
    w.set_plan(w.make_plan(seq), validate=False)
    assert w._refresh_with is not None and w.plan_refreshes
    refreshed()


def test_a_plan_made_read_only_is_planned_the_full_way():
    """A wrapper's plan whose buffers were made read-only gets no refresher (it would write into them):
    ``plan()`` goes the full way, into new buffers, and the read-only plan keeps its values."""
    w, rng = _captured_cpu_wrapper()
    spec = w.plan_spec()
    seq = rng.integers(0, 3000, 4)
    frozen = w.plan(seq)
    frozen.items.flags.writeable = False
    before = frozen.items.copy()
    for _ in range(3):
        other = rng.integers(0, 3000, 4)
        assert_same_plan(w.plan(other), spec.make(other))
    np.testing.assert_array_equal(frozen.items, before)
    assert_same_plan(frozen, spec.make(seq))


def test_a_wrapper_with_a_refresher_is_collected():
    """The refresher holds the wrapper's ``__dict__`` (which holds it): the cycle is the garbage
    collector's to free."""
    import gc
    import weakref

    w, _ = _captured_cpu_wrapper()
    ref = weakref.ref(w)
    del w
    gc.collect()
    assert ref() is None


@pytest.mark.parametrize("answer", [0, 600, None])
def test_step_inputs_write_in_one_c_call(answer):
    """``StepInputs(in_graph=True).write()`` through the C ``LengthsWriter``: int32 / int64 arrays of B and
    B + 1 entries are written as NumPy's assignment writes them, after the copy's event says it is
    done (a stand-in query here: not done, or no query function, calls the wait first); anything else
    (a list, floats, other lengths, values past int32, negative lengths, offsets out of order) is
    declined and written or refused by the Python path, with its errors (never a wrapped value)."""
    import ctypes

    pytest.importorskip("torch")
    from cuda_ref.wrapper import StepInputs

    B = 5
    si = StepInputs(B, "cpu", in_graph=True)
    assert si._writer is not None and si._writer.event == 0
    _, seq_np, qsl_np = si._host[0]
    waits, asked = [], []
    w = si._writer = native.load().LengthsWriter(seq_np, qsl_np, lambda: waits.append(1))   # a counting wait

    @ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)
    def query(ev):
        asked.append(ev)
        return answer

    rng = np.random.default_rng(3)
    for step in range(4):
        if step == 2:
            w.set_event(0x5EED0, 0 if answer is None else ctypes.cast(query, ctypes.c_void_p).value)
        seq = rng.integers(0, 1 << 31 if step == 3 else 9000, B).astype(np.int64 if step % 2 else np.int32)
        qsl = np.concatenate([[0], np.cumsum(rng.integers(1, 3, B))]).astype(np.int32 if step % 2 else np.int64)
        assert w.write(seq, qsl) is True
        want_seq, want_qsl = np.empty(B, np.int32), np.empty(B + 1, np.int32)
        want_seq[:], want_qsl[:] = seq, qsl   # NumPy's assignment: the Python path's
        np.testing.assert_array_equal(seq_np, want_seq)
        np.testing.assert_array_equal(qsl_np, want_qsl)
    assert asked == ([] if answer is None else [0x5EED0, 0x5EED0])
    assert len(waits) == (0 if answer == 0 else 2)
    before = seq_np.copy(), qsl_np.copy()
    for seq, qsl in ((list(range(B)), list(range(B + 1))), (np.ones(B, np.float64), np.arange(B + 1)),
                     (np.ones(B + 1, np.int64), np.arange(B + 1)), (np.ones(B, np.int64)[::-1][::2], np.arange(B + 1)),
                     (np.full(B, (1 << 32) + 40, np.int64), np.arange(B + 1)), (np.full(B, -1, np.int32), np.arange(B + 1)),
                     (np.ones(B, np.int32), np.array([0, 2, 1, 3, 4, 5], np.int32))):
        assert w.write(seq, qsl) is False   # declined: nothing written
        np.testing.assert_array_equal(seq_np, before[0])
        np.testing.assert_array_equal(qsl_np, before[1])
    si.write(list(range(B)), list(range(B + 1)))   # the Python path writes what C declines
    np.testing.assert_array_equal(seq_np, np.arange(B))
    with pytest.raises(ValueError, match="seq_lens: 5 entries expected"):
        si.write(np.ones(B + 1, np.int64), np.arange(B + 1))
    with pytest.raises(ValueError, match="seq_lens: request 0 has 4294967336 tokens"):
        si.write(np.full(B, (1 << 32) + 40, np.int64), np.arange(B + 1))
    np.testing.assert_array_equal(seq_np, np.arange(B))   # refused before anything was written


def test_a_read_only_plan_is_not_written_into():
    spec = PlanSpec(32, 8, 128, 16, graph_stable=True)
    nat = NativePlanner.for_spec(spec)
    old = nat.make(np.array([100, 5000]))
    old.items.flags.writeable = False
    before = old.items.copy()
    new = nat.make(np.array([300, 200]), reuse=old)
    assert new.items is not old.items and np.array_equal(old.items, before)
    assert_same_plan(new, spec.make(np.array([300, 200])))


def test_a_refresh_into_a_short_buffer_writes_nothing():
    """The captured copy's buffer too short for the plan and the lengths: an error, and the spare plan's
    buffers untouched (checked before anything is written)."""
    spec = PlanSpec(32, 8, 128, 16, graph_stable=True)
    nat = NativePlanner.for_spec(spec)
    old = nat.make(np.array([100, 5000]))
    items, small = old.items.copy(), old._small.copy()
    with pytest.raises(ValueError, match="packed"):
        nat._mod.plan(nat._settings, np.array([300, 200]), 0, None, old.items, old._small, old.num_valid_items,
                      np.zeros(16, np.int32), -1, 2, 2, 1)
    assert np.array_equal(old.items, items) and np.array_equal(old._small, small)


def test_settings_and_costs_past_int64_are_the_numpy_planners():
    """Settings the C planner's int64 arithmetic does not hold are never taken, and a batch whose cost
    products pass int64 (Python's are exact) is handed back; the NumPy planner plans or refuses both."""
    for kw in (dict(max_work_items=-1, graph_stable=True), dict(head_dim=1 << 17), dict(kv_elem_bytes=0),
               dict(policy=f"size:{2**31}")):
        args = dict(num_q_heads=32, num_kv_heads=8, head_dim=128, page_size=16)
        args.update(kw)
        assert NativePlanner.for_spec(PlanSpec(**args)) is None, kw
    spec = PlanSpec(1024, 1024, 1 << 16, 16, kv_elem_bytes=16)
    nat = NativePlanner.for_spec(spec)
    seq = np.full(4, 2**31 - 1)
    assert nat.make(seq) is None
    assert spec.make(seq).num_valid_items > 0
    assert nat.make(np.full(4, 2**20)) is not None   # the same settings with products in range
    check_one(nat, spec, np.full(4, 2**20))


def test_a_numpy_made_plan_is_reused_in_place():
    """A graph-stable plan the NumPy planner made (a window step, say) as ``reuse``: its item buffer is
    written in place, its padding kept right, the plan the NumPy planner's."""
    spec = PlanSpec(32, 8, 128, 16, graph_stable=True)
    nat = NativePlanner.for_spec(spec)
    old = spec.make(np.array([9000, 7000, 50]))   # more valid items than the next plan: padding rewritten
    assert "_small" not in old.__dict__
    got = nat.make(np.array([300, 200, 0]), reuse=old)
    assert got.items is old.items
    assert_same_plan(got, spec.make(np.array([300, 200, 0])))


def test_numpy_arrays_and_other_buffers_plan_alike():
    """The module reads NumPy arrays through their fields (NumPy's C API, where its headers were
    found when it was built) and any other object through the buffer protocol: the same lengths as a
    NumPy array, a memoryview of one and an ``array.array`` give the same plan, written into NumPy
    arrays or memoryviews of them alike; what one way refuses (other byte orders, unsigned or
    non-contiguous entries, a read-only plan buffer) the other refuses too."""
    import array

    mod = native.load()
    if native._numpy_include() is not None:
        assert mod.NUMPY_API == 1   # the fast read is the one tested against the buffer protocol here
    spec = PlanSpec(32, 8, 128, 16, graph_stable=True)
    nat = NativePlanner.for_spec(spec)
    seq = np.array([100, 5000, 0, 2049], np.int64)
    ql = np.array([1, 2, 1, 3], np.int32)
    ways = {"numpy": lambda a: a, "memoryview": memoryview,
            "array.array": lambda a: array.array("q" if a.itemsize == 8 else "i", a.tolist())}
    first = mod.plan(nat._settings, seq, 1, ql, None, None, -1)
    assert first is not None and first[8] is False
    W, N, _, _, B, T = first[:6]
    results = []
    for name, way in ways.items():
        for out_way in (lambda a: a, memoryview):
            items, small = np.full((5, N), 7, np.int32), np.full(2 * B + 1 + 2 * T, 7, np.int32)
            r = mod.plan(nat._settings, way(seq), 1, way(ql), out_way(items), out_way(small), -1)
            assert r is not None and r[8] is True, name
            results.append((r, items, small))
    for r, items, small in results[1:]:
        assert r == results[0][0]
        np.testing.assert_array_equal(items, results[0][1])
        np.testing.assert_array_equal(small, results[0][2])
    assert_same_plan(nat.make(seq, q_lens=ql), spec.make(seq, ql))
    refused = [seq.astype(">i8"), seq.astype(np.uint32), np.repeat(seq, 2)[::2], seq.astype(np.float64)]
    for bad in refused:
        for way in (lambda a: a, memoryview):
            assert mod.plan(nat._settings, way(bad), 0, None, None, None, -1) is None, bad.dtype
    items, small = np.zeros((5, N), np.int32), np.zeros(2 * B + 1 + 2 * T, np.int32)
    items.flags.writeable = False
    for way in (lambda a: a, memoryview):
        r = mod.plan(nat._settings, seq, 1, ql, way(items), small, -1)
        assert r is not None and r[8] is False and not items.any()

