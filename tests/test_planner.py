"""Split plans (conventions: "Plans"): coverage, page boundaries, policies, graph-stable shapes, ``auto``."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from splitkv_common.parity.cases import random_inputs
from splitkv_common.devices import PROFILES, get_profile
from splitkv_common.plan import Plan, SplitPolicy, make_plan, visible_range
from splitkv_common.reference import dense_attention, split_attention


def check_plan(plan: Plan, seq_lens, q_lens=None, window_left=None):
    """Every invariant a plan must hold, checked from its arrays alone."""
    seq = np.asarray(seq_lens, np.int64)
    B = len(seq)
    ql = np.ones(B, np.int64) if q_lens is None else np.asarray(q_lens, np.int64)
    page, hkv = plan.page_size, plan.num_kv_heads
    n = plan.num_valid_items
    req, head, split = plan.item_request, plan.item_kv_head, plan.item_split
    start, end = plan.item_kv_start, plan.item_kv_end
    for arr in (req, head, split, start, end, plan.num_splits, plan.query_start_loc, plan.row_slot_start,
                plan.row_num_splits):
        assert arr.dtype == np.int32
    assert plan.batch_size == B and plan.num_items >= n
    np.testing.assert_array_equal(plan.query_start_loc, np.concatenate([[0], np.cumsum(ql)]))
    # padding: request -1, empty range, only after the valid items
    assert np.all(req[:n] >= 0) and np.all(req[n:] == -1) and np.all(end[n:] == start[n:])
    for b in range(B):
        lo, hi = visible_range(int(seq[b]), int(ql[b]), window_left)
        for h in range(hkv):
            sel = np.flatnonzero((req[:n] == b) & (head[:n] == h))
            # one item per split, numbered 0.. in order
            assert len(sel) == plan.num_splits[b] >= 1
            np.testing.assert_array_equal(split[sel], np.arange(len(sel)))
            a, e = start[sel].astype(np.int64), end[sel].astype(np.int64)
            if hi <= lo:  # nothing visible: one empty item so the row is written by the same path
                assert len(sel) == 1 and a[0] == e[0]
                continue
            # inside [0, seq_len), contiguous, no overlap, no gap
            assert a[0] >= 0 and e[-1] == hi == seq[b]
            assert np.all(e > a)
            np.testing.assert_array_equal(a[1:], e[:-1])
            # covers the visible range: the first range starts at the page holding lo
            assert a[0] == (lo // page) * page
            # boundaries on page boundaries except where the request ends
            assert np.all(a % page == 0)
            assert np.all((e % page == 0) | (e == seq[b]))
            cover = np.zeros(int(seq[b]), np.int64)
            for x, y in zip(a, e):
                cover[x:y] += 1
            assert np.all(cover[lo:] == 1) and np.all(cover[:a[0]] == 0)
    # merge index: each row reads its request's splits, slots distinct and inside the buffer
    rows = plan.row_request()
    np.testing.assert_array_equal(plan.row_num_splits, plan.num_splits[rows] if len(rows) else [])
    used = [plan.row_slot_start[t] + j for t in range(plan.num_rows) for j in range(plan.row_num_splits[t])]
    assert len(set(used)) == len(used)
    assert all(0 <= s < plan.num_slots for s in used)
    assert plan.max_splits == int(plan.row_num_splits.max(initial=1))


def ranges_of(plan, b, h=0):
    n = plan.num_valid_items
    sel = np.flatnonzero((plan.item_request[:n] == b) & (plan.item_kv_head[:n] == h))
    return list(zip(plan.item_kv_start[sel].tolist(), plan.item_kv_end[sel].tolist()))


# --- coverage and page boundaries, every policy -------------------------------------------------

POLICIES = ["none", "auto", "size:1", "size:16", "size:48", "count:1", "count:3", "count:7"]


@pytest.mark.parametrize("page", [1, 3, 8, 16])
@pytest.mark.parametrize("policy", POLICIES)
def test_plan_invariants_on_odd_lengths(page, policy):
    if policy.startswith("size:") and int(policy[5:]) % page:
        policy = f"size:{page * max(1, int(policy[5:]) // page)}"
    seq = [0, 1, 15, 16, 17, 54, 97, 200]
    plan = make_plan(seq, num_kv_heads=2, page_size=page, policy=policy, min_split_tokens=16, device="h200")
    check_plan(plan, seq)


@settings(max_examples=60, deadline=None)
@given(
    seq=st.lists(st.integers(0, 300), min_size=1, max_size=5),
    page=st.sampled_from([1, 2, 5, 16, 64]),
    hkv=st.integers(1, 3),
    qmax=st.integers(1, 4),
    window=st.one_of(st.none(), st.integers(0, 100)),
    pol=st.one_of(st.just("none"), st.just("auto"), st.integers(1, 6).map(lambda k: f"size:{k}"),
                  st.integers(1, 9).map(lambda k: f"count:{k}")),
    max_splits=st.one_of(st.none(), st.integers(1, 6)),
    graph=st.booleans(),
    device=st.sampled_from(["h200", "910b2", "cpu"]),
    data=st.data(),
)
def test_plan_invariants_property(seq, page, hkv, qmax, window, pol, max_splits, graph, device, data):
    q_lens = data.draw(st.lists(st.integers(1, qmax), min_size=len(seq), max_size=len(seq)))
    if pol.startswith("size:"):
        pol = f"size:{int(pol[5:]) * page}"
    plan = make_plan(seq, num_kv_heads=hkv, page_size=page, q_lens=q_lens, policy=pol, device=device,
                     window_left=window, max_splits=max_splits, graph_stable=graph, min_split_tokens=page)
    check_plan(plan, seq, q_lens, window)
    cap = max_splits if max_splits is not None else get_profile(device).max_splits
    assert plan.num_splits.max() <= cap
    if pol.startswith("count:"):
        assert plan.num_splits.max() <= int(pol[6:])
    if graph:   # the default capacity: the worst case, or where the planner picks the splits a bounded one
        prof, worst = get_profile(device), len(seq) * hkv * cap
        chooses = pol == "none" or (pol == "auto" and not prof.cube_units)
        want = min(worst, max(2 * len(seq) * hkv, 4 * prof.units)) if chooses else worst
        assert plan.num_items == want and plan.num_slots == sum(q_lens) * cap


def test_contiguous_cache_is_one_page_per_request():
    seq = [37, 5, 64]
    plan = make_plan(seq, num_kv_heads=1, page_size=64, policy="size:64")
    check_plan(plan, seq)
    assert plan.num_splits.tolist() == [1, 1, 1]
    assert [ranges_of(plan, b) for b in range(3)] == [[(0, 37)], [(0, 5)], [(0, 64)]]


def test_visible_range_and_window_start_on_a_page():
    assert visible_range(0, 1, None) == (0, 0)
    assert visible_range(100, 1, None) == (0, 100)
    assert visible_range(100, 1, 20) == (79, 100)      # query at 99 sees 79..99
    assert visible_range(100, 3, 20) == (77, 100)      # first query at 97 sees 77..97
    assert visible_range(10, 1, -1) == (0, 10)         # -1: no window
    assert visible_range(10, 2, 50) == (0, 10)
    plan = make_plan([100], num_kv_heads=1, page_size=8, policy="size:16", window_left=20)
    # the first range starts at the page holding 79; boundaries stay on multiples of 16
    assert ranges_of(plan, 0) == [(72, 80), (80, 96), (96, 100)]


# --- policies ---------------------------------------------------------------------------------


def test_none_gives_one_split_per_request():
    plan = make_plan([0, 5, 1000], num_kv_heads=4, page_size=16, policy="none")
    assert plan.num_splits.tolist() == [1, 1, 1] and plan.split_tokens == 0
    assert plan.num_valid_items == 12 and plan.num_slots == 3
    assert ranges_of(plan, 2, 3) == [(0, 1000)]
    assert "none" in plan.reason


def test_fixed_size_cuts_at_multiples_of_the_size():
    plan = make_plan([100, 32, 31], num_kv_heads=1, page_size=16, policy="size:32")
    assert plan.split_tokens == 32
    assert ranges_of(plan, 0) == [(0, 32), (32, 64), (64, 96), (96, 100)]
    assert ranges_of(plan, 1) == [(0, 32)]
    assert ranges_of(plan, 2) == [(0, 31)]
    assert "batch-invariant" in plan.reason


@settings(max_examples=40, deadline=None)
@given(seq=st.lists(st.integers(0, 500), min_size=2, max_size=6), k=st.integers(1, 8),
       page=st.sampled_from([1, 4, 16]), others=st.lists(st.integers(0, 5000), max_size=5), data=st.data())
def test_fixed_size_is_batch_invariant(seq, k, page, others, data):
    """A request's ranges do not depend on the other requests of the batch (nor on its position in it)."""
    pol = f"size:{k * page}"
    alone = [ranges_of(make_plan([s], num_kv_heads=1, page_size=page, policy=pol), 0) for s in seq]
    batch = seq + others
    order = data.draw(st.permutations(range(len(batch))))
    plan = make_plan([batch[i] for i in order], num_kv_heads=2, page_size=page, policy=pol)
    for pos, i in enumerate(order):
        if i < len(seq):
            assert ranges_of(plan, pos, 0) == ranges_of(plan, pos, 1) == alone[i]


def test_fixed_size_must_be_a_page_multiple():
    with pytest.raises(ValueError, match="split_size"):
        make_plan([100], num_kv_heads=1, page_size=16, policy="size:24")


def test_fixed_count():
    plan = make_plan([100, 7, 0], num_kv_heads=1, page_size=8, policy="count:3")
    assert ranges_of(plan, 0) == [(0, 40), (40, 80), (80, 100)]   # 100/3 -> 34 -> 40 (pages)
    assert ranges_of(plan, 1) == [(0, 7)]                           # shorter than one page
    assert ranges_of(plan, 2) == [(0, 0)]
    assert make_plan([100], num_kv_heads=1, page_size=1, policy="count:4").num_splits.tolist() == [4]
    one = make_plan([100, 7], num_kv_heads=1, page_size=8, policy="count:1")
    none = make_plan([100, 7], num_kv_heads=1, page_size=8, policy="none")
    np.testing.assert_array_equal(one.item_kv_start, none.item_kv_start)
    np.testing.assert_array_equal(one.item_kv_end, none.item_kv_end)


def test_fixed_count_with_a_window_never_exceeds_the_count():
    for seq in range(1, 120, 3):
        for w in (0, 5, 17):
            for c in (2, 3, 5):
                plan = make_plan([seq], num_kv_heads=1, page_size=1, policy=f"count:{c}", window_left=w)
                assert plan.num_splits[0] <= c
                check_plan(plan, [seq], None, w)


@pytest.mark.parametrize("policy", ["size:16", "count:40", "auto"])
def test_max_splits_is_respected_by_every_policy(policy):
    seq = [5000, 1000, 16, 0]
    plan = make_plan(seq, num_kv_heads=2, page_size=16, policy=policy, max_splits=3, min_split_tokens=16)
    assert plan.num_splits.max() <= 3
    check_plan(plan, seq)
    # without the cap the same policy would split more
    if policy != "auto":
        assert make_plan(seq, num_kv_heads=2, page_size=16, policy=policy).num_splits.max() > 3


def test_profile_max_splits_is_the_default_cap():
    for dev in ("h200", "910b2", "cpu"):
        plan = make_plan([100000], num_kv_heads=1, page_size=16, policy="size:16", device=dev)
        assert plan.num_splits[0] == PROFILES[dev].max_splits


# --- graph-stable plans -----------------------------------------------------------------------


def test_graph_stable_plan_has_fixed_shapes_for_different_lengths():
    plans = [make_plan(seq, num_kv_heads=2, page_size=16, policy="size:32", graph_stable=True, max_splits=8)
             for seq in ([100, 5, 40], [3000, 0, 1], [0, 0, 0], [256, 256, 256])]
    assert len({p.num_items for p in plans}) == 1 and plans[0].num_items == 3 * 2 * 8
    assert len({p.num_slots for p in plans}) == 1 and plans[0].num_slots == 3 * 8
    for p, seq in zip(plans, ([100, 5, 40], [3000, 0, 1], [0, 0, 0], [256, 256, 256])):
        assert p.graph_stable
        np.testing.assert_array_equal(p.row_slot_start, np.arange(3) * 8)
        check_plan(p, seq)
        assert np.all(p.item_request[p.num_valid_items:] == -1)


def test_graph_stable_with_multi_query_and_capacity():
    plan = make_plan([50, 9], num_kv_heads=1, page_size=4, q_lens=[3, 2], policy="size:8", graph_stable=True,
                     max_splits=7, max_work_items=20)
    assert plan.num_items == 20 and plan.num_slots == 5 * 7
    np.testing.assert_array_equal(plan.row_slot_start, np.arange(5) * 7)
    check_plan(plan, [50, 9], [3, 2])
    with pytest.raises(ValueError, match="max_work_items"):
        make_plan([50, 9], num_kv_heads=1, page_size=4, policy="size:8", graph_stable=True, max_splits=7,
                  max_work_items=5)


def test_graph_stable_plan_computes_the_same_attention():
    inp = random_inputs(3, [70, 0, 33], q_lens=[2, 1, 3], page_size=8)
    ref, ref_lse = dense_attention(inp)
    plan = inp.plan("size:16", device="h200", graph_stable=True, max_splits=10)
    out, lse = split_attention(inp, plan)
    np.testing.assert_allclose(out, ref, atol=2e-5)
    np.testing.assert_array_equal(np.isneginf(lse), np.isneginf(ref_lse))


# --- auto -------------------------------------------------------------------------------------


def _auto(seq, device, **kw):
    return make_plan(seq, num_kv_heads=8, num_q_heads=32, head_dim=128, page_size=16, policy="auto",
                     device=device, **kw)


@pytest.mark.parametrize("device", ["h200", "910b2", "910b3"])
def test_auto_splits_a_long_single_request_but_not_a_large_batch(device):
    prof = get_profile(device)
    one = _auto([16384], device)
    many = _auto([16384] * 64, device)
    assert one.num_splits[0] > 1 and one.split_tokens > 0
    assert many.split_tokens == 0 and np.all(many.num_splits == 1)
    for p in (one, many):
        assert f"auto on {prof.name}" in p.reason and len(p.reason.split()) > 8
        assert p.estimates_us and 0 in p.estimates_us
        check_plan(p, [16384] if p is one else [16384] * 64)
    assert one.reason != many.reason
    assert "splits of" in one.reason and "already occupy" in many.reason
    # the chosen split is the one of the recorded estimates with the chosen length
    assert one.split_tokens in one.estimates_us


def test_auto_decides_from_the_device_profile():
    h200, npu = _auto([16384], "h200"), _auto([16384], "910b2")
    assert h200.split_tokens != npu.split_tokens
    assert h200.num_splits[0] > npu.num_splits[0] > 1   # more units to fill on the GPU
    assert "h200" in h200.reason and "910b2" in npu.reason
    assert "h200" not in npu.reason


def test_auto_runs_one_long_item_a_unit_unsplit_on_the_h200():
    """``DeviceProfile.lone_*``: at 128 (request, KV head) pairs of 1k-8k tokens (B 16, Hkv 8) the
    H200's unsplit plan, whose one item an SM the launch streams with deeper tiles (run 55), is
    cheaper than two splits and the merge; not for graph-stable plans (their launch keeps the
    capture's configuration), other token sizes (not measured) or more items than units."""
    prof = get_profile("h200")
    for n in (1024, 2048, 8192):
        p = _auto([n] * 16, "h200")
        assert p.split_tokens == 0 and p.num_items == 128
        est = p.estimates_us[0]["attention_us"]   # the lone bandwidth: the item's bytes at 32 GB/s
        lone = prof.launch_us + max(n * 512 / (prof.lone_unit_bandwidth_gbps * 1e3),
                                    16 * 8 * n * 512 / (prof.bandwidth_gbps * 1e3)) + prof.item_overhead_us
        assert est == round(lone, 3)
        assert _auto([n] * 16, "h200", graph_stable=True).split_tokens > 0
    assert make_plan([1024] * 16, num_kv_heads=8, num_q_heads=32, head_dim=64, page_size=16,
                     device="h200").split_tokens > 0                          # 256 bytes a token
    assert make_plan([1024] * 17, num_kv_heads=8, num_q_heads=32, head_dim=128, page_size=16,
                     device="h200").estimates_us[0]["attention_us"] > 30     # 136 items: the usual per-item cost
    assert _auto([16384], "h200").split_tokens == 512                        # batch 1 as before
    assert get_profile("910b2").lone_unit_bandwidth_gbps == 0


def test_auto_leaves_short_histories_alone():
    p = _auto([100, 100], "h200")   # splits of 64 tokens would not pay for their merge here
    assert p.split_tokens == 0 and "would not pay" in p.reason
    assert _auto([300, 300], "h200").split_tokens == 64   # here they do (the profile's minimum, run 16)


@pytest.mark.parametrize("min_split", [256, 1024, 8192])
def test_auto_respects_the_minimum_split_length(min_split):
    seq = [16384, 5000, 77]
    p = _auto(seq, "h200", min_split_tokens=min_split)
    assert p.split_tokens == 0 or p.split_tokens >= min_split
    for b, s in enumerate(seq):
        r = ranges_of(p, b)
        assert all(e - a >= min_split for a, e in r[:-1])   # only the request's tail may be shorter
    profile_min = get_profile("h200").min_split_tokens
    d = _auto(seq, "h200")
    assert d.split_tokens == 0 or d.split_tokens >= profile_min


def test_auto_empty_batch():
    p = make_plan([], num_kv_heads=2, page_size=16)
    assert p.num_items == 0 and p.num_slots == 0 and "empty batch" in p.reason


# --- describe / sizes -------------------------------------------------------------------------


def test_describe_and_byte_counts():
    p = make_plan([100, 40], num_kv_heads=2, num_q_heads=4, page_size=16, policy="size:32")
    text = p.describe()
    assert p.reason in text and "fixed_size:32" in text and str(p.num_splits.tolist()) in text
    assert p.workspace_bytes(4, 64) == p.num_slots * 4 * (64 + 1) * 4
    assert p.kv_bytes_read(64, 2) == (100 + 40) * 2 * 64 * 2 * 2   # tokens x Hkv x D x (K and V) x bytes
    assert p.num_slots == 4 + 2


def test_device_profiles():
    assert get_profile("Ascend910B3") is PROFILES["910b3"]
    assert get_profile("nvidia-h200") is PROFILES["h200"]
    assert PROFILES["910b1"].name == "910b1" and PROFILES["910b4"].units == PROFILES["910b3"].units
    with pytest.raises(ValueError, match="device"):
        get_profile("tpu")


# --- errors -----------------------------------------------------------------------------------


@pytest.mark.parametrize("kwargs, match", [
    (dict(seq_lens=[3, -1]), "seq_lens"),
    (dict(page_size=0), "page_size"),
    (dict(num_kv_heads=0), "num_kv_heads"),
    (dict(query_start_loc=[0, 1]), "query_start_loc"),          # wrong length for B = 2
    (dict(query_start_loc=[1, 2, 3]), "query_start_loc"),       # does not start at 0
    (dict(query_start_loc=[0, 2, 1]), "query_start_loc"),       # decreasing
    (dict(q_lens=[1]), "q_lens"),
    (dict(q_lens=[1, -1]), "q_lens"),
    (dict(max_splits=0), "max_splits"),
    (dict(num_q_heads=3), "num_q_heads"),                       # not a multiple of Hkv = 2
    (dict(num_q_heads=0), "num_q_heads"),
    (dict(head_dim=0), "head_dim"),
    (dict(policy="size:10"), "split_size"),
    (dict(policy="bogus"), "policy"),
    (dict(device="tpu"), "device"),
])
def test_make_plan_errors(kwargs, match):
    args = dict(seq_lens=[30, 40], num_kv_heads=2, page_size=8)
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        make_plan(args.pop("seq_lens"), **args)


@pytest.mark.parametrize("text", ["auto:3", "none:1", "size:abc", "size:", "size:0", "count:-2", "bogus",
                                  "fixed_size:1.5", ""])
def test_split_policy_parse_errors(text):
    with pytest.raises(ValueError, match="policy"):
        SplitPolicy.parse(text)


def test_split_policy_parse_and_str():
    assert SplitPolicy.parse("auto") == SplitPolicy("auto")
    assert SplitPolicy.parse("none") == SplitPolicy("none")
    assert SplitPolicy.parse("size:64") == SplitPolicy.parse("fixed_size:64") == SplitPolicy("fixed_size", 64)
    assert SplitPolicy.parse("count:3") == SplitPolicy.parse("fixed_count:3") == SplitPolicy("fixed_count", 3)
    p = SplitPolicy("fixed_count", 3)
    assert SplitPolicy.parse(p) is p
    assert [str(SplitPolicy.parse(t)) for t in ("auto", "none", "size:64", "count:3")] == \
        ["auto", "none", "fixed_size:64", "fixed_count:3"]
    with pytest.raises(ValueError, match="policy"):
        SplitPolicy("fixed_size", 0)
    with pytest.raises(ValueError, match="policy"):
        SplitPolicy("split")


def test_kv_split_count_is_math_ceil_of_span():
    # split count of a fixed size equals ceil(len / size) for a request starting at 0
    for L in (1, 31, 32, 33, 1000):
        p = make_plan([L], num_kv_heads=1, page_size=1, policy="size:32")
        assert p.num_splits[0] == math.ceil(L / 32)


def test_plan_spec_plans_as_make_plan_does():
    """The wrappers' PlanSpec gives the plan make_plan gives for the same settings."""
    from splitkv_common.plan import PlanSpec

    spec = PlanSpec(8, 2, 64, 16, kv_elem_bytes=1, policy="size:32", device="910b2", graph_stable=True,
                    max_splits=4)
    seq = np.array([100, 0, 37])
    got = spec.make(seq, q_lens=[1, 1, 3], window_left=-1)
    want = make_plan(seq, num_kv_heads=2, page_size=16, q_lens=[1, 1, 3], policy="size:32", device="910b2",
                     num_q_heads=8, head_dim=64, kv_elem_bytes=1, graph_stable=True, max_splits=4)
    for f in ("item_request", "item_kv_head", "item_split", "item_kv_start", "item_kv_end", "row_slot_start",
              "row_num_splits", "num_splits"):
        np.testing.assert_array_equal(getattr(got, f), getattr(want, f))
    assert got.num_slots == want.num_slots and got.graph_stable
    assert hash(spec) == hash(PlanSpec(8, 2, 64, 16, kv_elem_bytes=1, policy="size:32", device="910b2",
                                       graph_stable=True, max_splits=4))
