"""The vectorised planner makes the previous loop planner's plans, bit for bit.

Every array field equal (``np.array_equal``, same dtype), every scalar field, the ``reason`` text and
the ``estimates_us`` dict equal, on a generated corpus: ragged lengths including 0, sliding windows,
multi-query rows (``q_lens`` and ``query_start_loc``, zero-row requests included), every policy,
the caps, graph-stable padding, every device profile, page sizes 1 / 8 / 16 / 128. Errors are
compared too: both planners raise ``ValueError`` with the same message, or neither does.
"""

import dataclasses

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from planner_oracle import make_plan as oracle_make_plan
from splitkv_common.devices import PROFILES, get_profile
from splitkv_common.plan import make_plan
from splitkv_common.plan_checks import check_plan_limits

ARRAY_FIELDS = ("item_request", "item_kv_head", "item_split", "item_kv_start", "item_kv_end", "num_splits",
                "query_start_loc", "row_slot_start", "row_num_splits")
PAGES = [1, 8, 16, 128]


def assert_same_plan(got, want):
    """Field by field: arrays equal with the same dtype and shape, scalars and texts equal."""
    for f in dataclasses.fields(want):
        if f.name == "items":   # the buffer whose rows are the item arrays (compared as those)
            continue
        a, b = getattr(got, f.name), getattr(want, f.name)
        if f.name in ARRAY_FIELDS:
            assert isinstance(a, np.ndarray), f.name
            assert a.dtype == b.dtype, (f.name, a.dtype, b.dtype)
            assert a.shape == b.shape, (f.name, a.shape, b.shape)
            assert np.array_equal(a, b), (f.name, a, b)
        elif f.name == "policy":
            assert (a.kind, a.value) == (b.kind, b.value)
        else:
            assert type(a) is type(b), (f.name, type(a), type(b))
            assert a == b, (f.name, a, b)
    # the estimates: same candidates in the same order, the same rounded floats (bit for bit; the
    # loop planner's merge figures were NumPy floats, a float subclass) and item counts
    assert list(got.estimates_us) == list(want.estimates_us)
    for k, v in want.estimates_us.items():
        g = got.estimates_us[k]
        assert list(g) == list(v) == ["attention_us", "merge_us", "work_items"]
        for x in ("attention_us", "merge_us"):
            assert isinstance(g[x], float) and float(g[x]).hex() == float(v[x]).hex(), (k, x, g[x], v[x])
        assert type(g["work_items"]) is int and g["work_items"] == v["work_items"]


_LIMIT_ARGS = ("num_kv_heads", "page_size", "q_lens", "query_start_loc", "policy", "window_left", "max_splits",
               "graph_stable", "max_work_items")


def both(seq, **kw):
    """Plan with both planners; the same plan, or the same ``ValueError`` from each. A batch over the
    size limits (which the loop planner did not have) is refused by the planner before it plans."""
    try:
        check_plan_limits(seq, **{k: v for k, v in kw.items() if k in _LIMIT_ARGS},
                          default_max_splits=get_profile(kw.get("device", "h200")).max_splits)
    except ValueError as e:
        if "over the limit" in str(e):
            with pytest.raises(ValueError, match="over the limit"):
                make_plan(seq, **kw)
            return None
    try:
        want = oracle_make_plan(seq, **kw)
    except ValueError as e:
        with pytest.raises(ValueError) as got_err:
            make_plan(seq, **kw)
        assert str(got_err.value) == str(e)
        return None
    got = make_plan(seq, **kw)
    assert_same_plan(got, want)
    return got


# --- the generated corpus -----------------------------------------------------------------------


def _policy(page):
    return st.one_of(
        st.just("none"), st.just("auto"),
        st.integers(1, 40).map(lambda k: f"size:{k * page}"),
        st.integers(1, 70).map(lambda k: f"count:{k}"),
    )


def _lengths(max_len):
    # mostly ragged, with zeros and exact page / split multiples over-represented
    return st.one_of(st.integers(0, max_len), st.just(0), st.sampled_from([1, 16, 128, 256, 512, 1024, 4096]))


@st.composite
def corpus_case(draw):
    page = draw(st.sampled_from(PAGES))
    max_len = draw(st.sampled_from([40, 600, 5000, 40000]))
    seq = draw(st.lists(_lengths(max_len), min_size=0, max_size=draw(st.sampled_from([1, 4, 12, 40]))))
    hkv = draw(st.sampled_from([1, 2, 8]))
    kw = dict(num_kv_heads=hkv, page_size=page, num_q_heads=hkv * draw(st.sampled_from([1, 4])),
              head_dim=draw(st.sampled_from([64, 128])), kv_elem_bytes=draw(st.sampled_from([1, 2])),
              policy=draw(_policy(page)), device=draw(st.sampled_from(sorted(PROFILES))))
    rows = draw(st.sampled_from(["default", "ones", "multi", "qsl"]))
    if rows != "default":
        q = draw(st.lists(st.integers(0 if rows != "ones" else 1, 1 if rows == "ones" else 6),
                          min_size=len(seq), max_size=len(seq)))
        if rows == "qsl":
            kw["query_start_loc"] = np.concatenate([[0], np.cumsum(q, dtype=np.int64)]).astype(np.int32)
        else:
            kw["q_lens"] = q
    kw["window_left"] = draw(st.one_of(st.none(), st.just(-1), st.integers(0, 8), st.integers(0, 3000)))
    if draw(st.booleans()):
        kw["min_split_tokens"] = draw(st.sampled_from([0, 1, page, 64, 256, 512, 1000, 8192]))
    if draw(st.booleans()):
        kw["max_splits"] = draw(st.integers(1, 80))
    kw["graph_stable"] = draw(st.booleans())
    if kw["graph_stable"] and draw(st.booleans()):
        kw["max_work_items"] = draw(st.integers(0, 4000))
    return seq, kw


@settings(max_examples=3000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=corpus_case())
def test_same_plans_as_the_loop_planner(case):
    seq, kw = case
    both(seq, **kw)


@settings(max_examples=400, deadline=None)
@given(seq=st.lists(st.integers(1, 300), min_size=1, max_size=6), page=st.sampled_from(PAGES),
       window=st.integers(0, 300), qmax=st.integers(0, 8), limit=st.integers(1, 5),
       pol=st.sampled_from(["size", "count"]), k=st.integers(1, 12), data=st.data())
def test_same_plans_where_the_cap_grows_the_split(seq, page, window, qmax, limit, pol, k, data):
    """Windows off a split boundary with a tight cap: the split length grows (the planner's retry path)."""
    q_lens = data.draw(st.lists(st.integers(0, qmax), min_size=len(seq), max_size=len(seq)))
    policy = f"size:{k * page}" if pol == "size" else f"count:{k}"
    both(seq, num_kv_heads=2, page_size=page, q_lens=q_lens, policy=policy, window_left=window,
         max_splits=limit, device="h200")


# --- fixed cases: the benchmark's shapes and the edges -------------------------------------------


@pytest.mark.parametrize("B", [0, 1, 16, 64, 256, 1024])
@pytest.mark.parametrize("policy", ["auto", "size:256", "count:4", "none"])
@pytest.mark.parametrize("graph_stable", [False, True])
def test_same_plans_at_serving_shapes(B, policy, graph_stable):
    rng = np.random.default_rng(B)
    seq = rng.integers(512, 8193, B)
    for device in ("h200", "910b2", "cpu"):
        both(seq, num_kv_heads=8, num_q_heads=32, head_dim=128, page_size=16, policy=policy, device=device,
             graph_stable=graph_stable)


@pytest.mark.parametrize("page", PAGES)
def test_same_plans_on_edges(page):
    cases = [
        ([], {}), ([0], {}), ([0, 0, 0], dict(graph_stable=True)),
        ([1], dict(policy="count:1")), ([page * 64], dict(policy="auto", min_split_tokens=page)),
        ([10**6], dict(policy="auto")), ([10**6, 3], dict(policy=f"size:{page}")),
        ([100, 7, 0], dict(q_lens=[0, 0, 0], window_left=0)),            # zero rows and window 0: empty spans
        ([100, 7, 0], dict(q_lens=[3, 0, 2], window_left=2, policy="count:5")),
        ([5000, 1000, 16, 0], dict(max_splits=3, policy="auto", min_split_tokens=page)),
        ([50, 9], dict(graph_stable=True, max_splits=7, max_work_items=5, policy=f"size:{page}")),  # error
        ([50, 9], dict(graph_stable=True, max_splits=7, max_work_items=0)),
        ([2**31 - 100, 2**30 + 7, 5, 0, 2**31 - 1], dict(policy="size:1024", max_splits=8)),  # int32 limit
        ([2**31 - 100, 2**30 + 7, 5, 0], dict(policy="count:3", window_left=5000, num_kv_heads=3)),
        (np.array([100, 7, 0], np.int32), dict(num_kv_heads=np.int64(3), page_size=np.int64(page),
                                               policy="auto", min_split_tokens=np.int64(page))),  # NumPy ints
        ([30, -1], {}), ([30], dict(policy=f"size:{page + 1}" if page > 1 else "size:0")),    # errors
        ([30, 40], dict(query_start_loc=[0, 2, 1])), ([30, 40], dict(max_splits=0)),
    ]
    for seq, extra in cases:
        kw = dict(num_kv_heads=2, page_size=page)
        kw.update(extra)
        both(seq, **kw)


# --- the fast path: Python ints up to _SMALL_B requests, [B] arrays above -----------------------


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.uint32, "list"])
@pytest.mark.parametrize("rows", ["default", "q_lens", "qsl"])
def test_same_plans_on_the_fast_path(dtype, rows):
    """Batch sizes on both sides of the small-batch bound, the input types the fast path takes,
    spec-decode rows, graph-stable plans, the policies it plans itself and those it hands on."""
    from splitkv_common.planner import _SMALL_B

    rng = np.random.default_rng(7)
    for B in sorted({1, 2, 3, 4, 7, _SMALL_B, _SMALL_B + 1, 40, 150}):
        for trial in range(3):
            seq = rng.integers(0 if trial else 1, 9000, B)
            seq = seq.tolist() if dtype == "list" else seq.astype(dtype)
            kw = dict(num_kv_heads=8, num_q_heads=32, head_dim=128, page_size=16)
            q = rng.integers(1 if trial < 2 else 0, 5, B)
            if rows == "q_lens":
                kw["q_lens"] = q.tolist() if dtype == "list" else q.astype(np.int32)
            elif rows == "qsl":
                kw["query_start_loc"] = np.concatenate([[0], np.cumsum(q)]).astype(np.int32)
            for policy in ("auto", "size:256", "size:16", "none", "count:3"):
                for gs in (False, True):
                    both(seq, policy=policy, graph_stable=gs, **kw)
                    both(seq, policy=policy, graph_stable=gs, max_splits=4, **kw)   # the cap grows size:N
                    both(seq, policy=policy, graph_stable=gs, min_split_tokens=16, window_left=-1, **kw)


def test_wide_batch_path_hands_errors_on():
    """Invalid inputs above the small-batch bound raise what the general path raises (lengths beyond
    int64 or int32, negative ones, bad query rows)."""
    base = list(range(1, 40))
    with pytest.raises(ValueError, match="seq_lens: a value does not fit int64"):
        make_plan(base + [2**70], num_kv_heads=2, page_size=16)
    for seq, extra in ([base + [2**40], {}], [base + [-3], {}],
                       [base, dict(q_lens=[1] * 38)], [base, dict(query_start_loc=[0] + base)],
                       [np.array(base, np.uint64), {}], [base, dict(policy="size:10")]):
        kw = dict(num_kv_heads=2, page_size=16)
        kw.update(extra)
        both(seq, **kw)


def test_small_batch_path_hands_errors_on():
    """Invalid inputs at small B raise what the general path raises."""
    cases = [([5, -1], {}), ([5], dict(page_size=0)), ([5], dict(num_kv_heads=0)), ([5], dict(max_splits=0)),
             ([5], dict(num_q_heads=3)), ([5], dict(head_dim=0)), ([5], dict(policy="size:10")),
             ([5, 6], dict(q_lens=[1])), ([5, 6], dict(q_lens=[1, -1])), ([5, 6], dict(query_start_loc=[0, 2, 1])),
             ([5, 6], dict(query_start_loc=[1, 2, 3])), ([5000], dict(graph_stable=True, max_work_items=3)),
             ([5], dict(device="nope")), ([5], dict(policy="bogus"))]
    for seq, extra in cases:
        kw = dict(num_kv_heads=2, page_size=16)
        kw.update(extra)
        both(seq, **kw)


# --- reuse: a graph-stable step writes into the previous step's buffer ---------------------------


@pytest.mark.parametrize("B", [1, 5, 40, 300])
@pytest.mark.parametrize("extra", [dict(policy="auto"), dict(policy="size:64"), dict(policy="none"),
                                   dict(policy="count:3"), dict(policy="auto", window_left=700),
                                   dict(policy="size:32", q_lens="ragged")])
def test_reuse_makes_the_same_plans(B, extra):
    """A stream of graph-stable steps (lengths grow, requests finish and start, the valid items grow
    and shrink), each planned with ``reuse`` = the previous step's plan: every plan equals one made
    fresh (padding included), and every step writes into the first step's buffer."""
    rng = np.random.default_rng(B)
    kw = dict(num_kv_heads=4, num_q_heads=16, page_size=16, graph_stable=True, max_splits=32, **extra)
    prev, first = None, None
    seq = rng.integers(0, 4000, B)
    for step in range(6):
        if step == 3:
            seq = rng.integers(0, 200, B)      # mostly short: far fewer valid items than the step before
        else:
            seq = seq + rng.integers(0, 300, B)
        if extra.get("q_lens") == "ragged":
            kw["q_lens"] = rng.integers(0, 4, B)
        fresh = make_plan(seq, **kw)
        got = make_plan(seq, reuse=prev, **kw)
        assert_same_plan(got, fresh)
        assert got.items is not None and np.shares_memory(got.item_request, got.items)
        first = got.items if first is None else first
        assert got.items is first, "a graph-stable step of the same capacity allocates no new buffer"
        prev = got


def test_reuse_only_where_it_fits():
    """A plan of another capacity, a plan that is not graph-stable, one built field by field and a
    ``replace()`` copy (which could misstate its valid items) are not reused: the new plan gets its
    own buffer and is still right. A non-plan is refused."""
    kw = dict(num_kv_heads=2, page_size=16, graph_stable=True)
    small = make_plan([100, 50], **kw)
    other = make_plan([100, 50, 7], reuse=small, **kw)        # capacity 3 * 2 * 64, not 2 * 2 * 64
    assert other.items is not small.items
    assert_same_plan(other, make_plan([100, 50, 7], **kw))
    eager = make_plan([100, 50], num_kv_heads=2, page_size=16)
    again = make_plan([300, 5], reuse=eager, **kw)
    assert again.items is not eager.items
    assert_same_plan(again, make_plan([300, 5], **kw))
    fields = {f.name: getattr(small, f.name) for f in dataclasses.fields(small) if f.init}
    built = type(small)(**{k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in fields.items()})
    assert built.items is None
    assert_same_plan(make_plan([9, 900], reuse=built, **kw), make_plan([9, 900], **kw))
    told = dataclasses.replace(small, num_valid_items=0)   # a copy that misstates its valid items
    assert told.items is None
    assert_same_plan(make_plan([9, 900], reuse=told, **kw), make_plan([9, 900], **kw))
    with pytest.raises(TypeError, match="reuse"):
        make_plan([9, 900], reuse=np.zeros((5, 256), np.int32), **kw)


def test_auto_explanation_is_made_when_read():
    """An ``auto`` plan's reason and estimates, made on first read, survive copying and pickling."""
    import copy
    import pickle

    seq = np.random.default_rng(3).integers(512, 8193, 40)
    kw = dict(num_kv_heads=8, num_q_heads=32, page_size=16, policy="auto")
    want = oracle_make_plan(seq, **kw)
    for got in (make_plan(seq, **kw), pickle.loads(pickle.dumps(make_plan(seq, **kw))),
                copy.deepcopy(make_plan(seq, **kw)), dataclasses.replace(make_plan(seq, **kw))):
        assert got.reason == want.reason and got.estimates_us == want.estimates_us
        assert_same_plan(got, want)
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        make_plan(seq, **kw).nope


def _request_blocks(plan):
    """The requests of a plan's valid items in item order, one entry per contiguous block."""
    req = plan.item_request[: plan.num_valid_items]
    starts = np.flatnonzero(np.r_[True, req[1:] != req[:-1]])
    return req[starts]


@pytest.mark.parametrize("B, lo, hi, policy, window", [
    (128, 128, 2049, "auto", None),      # no split, the wide path
    (256, 512, 8193, "none", None),
    (10, 700, 1100, "size:16", None),    # the small path, many splits
    (150, 100, 3000, "count:3", None),   # the general path
    (150, 100, 3000, "auto", 700),       # a window: the span read, not the length
])
def test_plans_of_many_items_put_the_longest_requests_first(B, lo, hi, policy, window):
    # more items than the device runs at once (4 per unit: 528 on the H200): the requests reading
    # the most tokens first, each request's items together, ties in batch order (graph-stable
    # plans too); fewer items keep the batch order
    rng = np.random.default_rng(B)
    seq = rng.integers(lo, hi, B)
    seq[1] = seq[0]   # a tie
    kw = dict(num_kv_heads=8, num_q_heads=32, head_dim=128, page_size=16, policy=policy, window_left=window)
    plan = both(seq, **kw)
    assert plan.num_valid_items > 4 * get_profile("h200").units
    blocks = _request_blocks(plan)
    assert sorted(blocks.tolist()) == list(range(B))   # each request's items in one block
    first = {}
    for i in range(plan.num_valid_items):
        first.setdefault(int(plan.item_request[i]), i)
    read = np.array([plan.item_kv_end[plan.item_request == b].max() - plan.item_kv_start[plan.item_request == b].min()
                     for b in blocks])
    assert (read[:-1] >= read[1:]).all()
    tie = [b for b in blocks if b in (0, 1)]
    assert tie == [0, 1]
    assert not (np.diff(blocks) > 0).all()   # the batch was not in that order already
    stable = both(seq, graph_stable=True, **kw)
    if stable.split_tokens == plan.split_tokens:
        np.testing.assert_array_equal(_request_blocks(stable), blocks)
    few = both(seq[:10] if policy != "size:16" else seq[:1], **kw)
    if few.num_valid_items <= 4 * get_profile("h200").units:
        assert (np.diff(_request_blocks(few)) > 0).all()


@pytest.mark.parametrize("real, policy, ordered", [
    (1, "auto", False), (5, "auto", False), (7, "count:2", False), (60, "auto", False),   # 112-480 reading items
    (80, "none", True), (100, "auto", True),                                             # 640, 800
])
def test_requests_reading_nothing_do_not_count_towards_the_order(real, policy, ordered):
    # a captured batch padded with seq_len 0 requests (one empty item per KV head each): ordered by
    # the items of the requests that read tokens, as a batch without the padding would be
    rng = np.random.default_rng(real)
    seq = np.zeros(320, np.int64)
    seq[:real] = rng.integers(1000, 9000, real)
    seq[1] = 100 if real > 1 else seq[1]   # shorter than the next one: not in longest-first order already
    kw = dict(num_kv_heads=8, num_q_heads=32, head_dim=128, page_size=16, policy=policy)
    units = get_profile("h200").units
    for graph in (False, True):
        plan = both(seq, graph_stable=graph, **kw)
        read_items = int((plan.item_kv_end > plan.item_kv_start)[: plan.num_valid_items].sum())
        assert plan.num_valid_items > 4 * units   # the padding alone would be over the threshold
        blocks = _request_blocks(plan)
        assert (read_items > 4 * units) == ordered
        if not ordered:
            assert (np.diff(blocks) > 0).all()
        else:   # the readers first, the longest first
            assert blocks[0] == np.argmax(seq) and set(blocks[:real].tolist()) == set(range(real))
        small = both(seq[:real], graph_stable=graph, **kw)   # the batch without its padding
        if small.split_tokens == plan.split_tokens:
            np.testing.assert_array_equal(_request_blocks(small), blocks[:real])


def test_graph_stable_auto_plans_fit_a_capacity_near_their_items():
    # graph-stable auto (GPU profile): by default twice the (request, KV head) pairs, at least 4 per
    # unit, at most B x Hkv x max_splits work items; auto's choice where it fits (then the plan is
    # the eager one), else the same choice among the splits that fit
    kw = dict(num_kv_heads=8, num_q_heads=32, head_dim=128, page_size=16)
    units = get_profile("h200").units
    seq = np.full(16, 65536)
    eager, stable = both(seq, **kw), both(seq, graph_stable=True, **kw)
    assert stable.num_items == max(2 * 16 * 8, 4 * units) < 16 * 8 * 64
    assert stable.split_tokens == eager.split_tokens and stable.num_valid_items == eager.num_items
    for f in ("item_request", "item_kv_head", "item_split", "item_kv_start", "item_kv_end"):
        np.testing.assert_array_equal(getattr(stable, f)[: eager.num_items], getattr(eager, f))
    seq = np.full(8, 262144)
    eager, stable = both(seq, **kw), both(seq, graph_stable=True, **kw)
    assert eager.num_items > stable.num_items >= stable.num_valid_items
    assert stable.split_tokens > eager.split_tokens
    worst = both(seq, graph_stable=True, max_work_items=8 * 8 * 64, **kw)   # a capacity given is kept
    assert worst.num_items == 8 * 8 * 64 and worst.split_tokens == eager.split_tokens
    assert both(seq, graph_stable=True, policy="size:4096", **kw).num_items == 8 * 8 * 64   # forced splits
    assert both(seq[:1], graph_stable=True, **kw).num_items == 8 * 64   # the worst case is the bound
