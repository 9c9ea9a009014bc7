"""Host plans whose work items stage 1 derives from its own index (``PlanSpec.items_from_index``, launched
with the kernel's device-plan prologue: unsplit plans in batch order, and one request's splits): which plans
qualify, and through the Triton interpreter the same bits as the same plan launched from its item arrays
(``DecodeWrapper.index_items = False``), also when one wrapper's launch serves plans of other split lengths."""

from __future__ import annotations

import numpy as np
import pytest

from splitkv_common.plan import PlanSpec

torch = pytest.importorskip("torch")
import cuda_ref  # noqa: E402  (selects the interpreter without a GPU: before anything imports triton)

pytest.importorskip("triton")
from cuda_ref.wrapper import DecodeWrapper  # noqa: E402
from splitkv_common.parity import cases  # noqa: E402
from splitkv_common.torch_io import to_torch  # noqa: E402

DEVICE = "cpu" if cuda_ref.INTERPRET else "cuda"


def _spec(policy, hkv=2, **kw):
    return PlanSpec(8, hkv, 32, 8, policy=policy, **kw)


def _derived_items(plan, hkv, S=2 ** 31 - 1):
    """The valid items of the kernels' index formula (``_device_work_item``) with ``S`` tokens a split
    and the plan's splits a request (default: one split past every length) for ``plan``'s lengths."""
    B, N = plan.batch_size, int(plan.num_splits.max())
    seq = np.zeros(B, np.int64)
    np.maximum.at(seq, plan.item_request, plan.item_kv_end)
    i = np.arange(B * hkv * N)
    b, h, j = i // (hkv * N), (i // N) % hkv, i % N
    valid = j < np.clip(-(-seq[b] // S), 1, N)
    start = j * S
    return tuple(x[valid] for x in (b, h, j, start, np.minimum(start + S, seq[b])))


@pytest.mark.parametrize("policy, lens", [
    ("none", [100]), ("size:64", [0]), ("size:64", [64]), ("none", [5, 0, 300, 17]), ("size:512", [100, 200, 3]),
])
def test_index_items_are_the_plans_items(policy, lens):
    spec = _spec(policy)
    plan = spec.make(np.array(lens))
    assert spec.items_from_index(plan), f"{policy} {lens}: expected items in index order"
    want = _derived_items(plan, 2)
    have = (plan.item_request, plan.item_kv_head, plan.item_split, plan.item_kv_start, plan.item_kv_end)
    for a, b in zip(have, want):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("policy, lens", [
    ("size:64", [1000]), ("size:64", [1024]), ("auto", [1000]), ("auto", [16384]), ("auto", [131072]),
    ("count:3", [250]), ("count:7", [16]), ("size:16", [17]),
])
def test_index_items_of_one_requests_splits(policy, lens):
    # batch 1: the splits [j S, min((j + 1) S, len)), KV head by KV head, are the formula's with S, N
    spec = _spec(policy)
    plan = spec.make(np.array(lens))
    S = spec.items_from_index(plan)
    assert plan.max_splits > 1 and 0 < S < 2 ** 31 - 1, f"{policy} {lens}: expected a split length"
    have = (plan.item_request, plan.item_kv_head, plan.item_split, plan.item_kv_start, plan.item_kv_end)
    for a, b in zip(have, _derived_items(plan, 2, S)):
        np.testing.assert_array_equal(a, b)


def test_index_items_of_one_item_an_sm():
    # B 16 x 1k at Hq 32 / Hkv 8, D 128 on the h200 profile: `auto` leaves it unsplit, in batch order
    spec = PlanSpec(32, 8, 128, 16)
    plan = spec.make(np.full(16, 1024))
    assert plan.num_items == 128 and spec.items_from_index(plan)


@pytest.mark.parametrize("policy, lens, kw", [
    ("size:64", [100, 300], {}),                       # ragged split counts
    ("size:64", [128, 128], {}),                       # even equal counts
    ("none", [5, 300], {"graph_stable": True}),        # padded, and the capture fixes the kernel
    ("size:64", [1000], {"graph_stable": True}),
])
def test_index_items_refuse_other_plans(policy, lens, kw):
    spec = _spec(policy, **kw)
    assert not spec.items_from_index(spec.make(np.array(lens)))


def test_index_items_refuse_a_window_and_longest_first_order():
    spec = _spec("none")
    assert spec.items_from_index(spec.make(np.array([1000, 7])))
    assert not spec.items_from_index(spec.make(np.array([1000, 7]), window_left=300))   # ranges from 700
    # an unsplit plan of more than 4 items a unit may put its longest requests first
    big = PlanSpec(8, 8, 32, 8, policy="none")
    lens = np.arange(1, 100)   # increasing: the longest last, reordered above 528 items
    plan = big.make(lens)
    assert plan.num_items > 528 and int(plan.item_request[0]) != 0
    assert not big.items_from_index(plan)


def _bits(t):
    t = t.detach().cpu()
    return (t.float() if t.dtype != torch.float32 else t).numpy().view(np.uint32).copy()


@pytest.mark.parametrize("policy, lens, q_lens", [
    ("none", [129], [3]),                       # one request, three query rows
    ("none", [70, 0, 5, 33], [1, 2, 1, 1]),     # ragged, an empty request, multi-query rows
    ("size:128", [70, 128, 1, 100], None),      # one split each
    ("size:16", [100], None),                   # one request's splits
    ("auto", [300], [3]),                       # ... with three query rows
    ("count:3", [250], None),
])
def test_index_items_give_the_same_bits(policy, lens, q_lens):
    inp = cases.random_inputs(11, lens, q_lens=q_lens, num_q_heads=8, num_kv_heads=2, head_dim=32, page_size=8,
                              dtype="bfloat16")
    x = to_torch(inp, DEVICE)
    res = {}
    for on in (True, False):
        w = DecodeWrapper(8, 2, 32, 8, dtype=inp.dtype, device=DEVICE, policy=policy)
        w.index_items = on
        w.plan(inp.seq_lens, query_start_loc=inp.query_start_loc)
        assert w.dplan.index_items is on
        out, lse = w.run(**x, scale=inp.scale)
        assert w.last_launch.constexprs["DEVICE_PLAN"] is on
        res[on] = (_bits(out), _bits(lse))
    np.testing.assert_array_equal(res[True][0], res[False][0])
    np.testing.assert_array_equal(res[True][1], res[False][1])


def test_one_launch_serves_index_plans_of_other_split_lengths():
    # batch 1 under auto, one cache: 2056 tokens are 33 splits of 64, 4104 tokens 33 splits of 128. The
    # two plans share one prepared launch (same launch key and slots), which takes each plan's split length
    x = cases.random_inputs(5, [4104], num_q_heads=8, num_kv_heads=2, head_dim=32, page_size=8, dtype="bfloat16")
    t = to_torch(x, DEVICE)
    outs = {}
    for on in (True, False):
        w = DecodeWrapper(8, 2, 32, 8, dtype=torch.bfloat16, device=DEVICE)
        w.index_items = on
        outs[on], launches = [], set()
        for n in (2056, 4104, 2056):
            w.plan(np.array([n]))
            assert w.dplan.index_items is on and w.host_plan.max_splits == 33
            out, lse = w.run(**dict(t, seq_lens=torch.tensor([n], dtype=torch.int32, device=DEVICE)), scale=x.scale)
            outs[on].append((_bits(out), _bits(lse)))
            launches.add(id(w.last_launch))
        if on:
            assert len(launches) == 1 and w.last_launch.index_derive == (64, 33)
    for a, b in zip(outs[True], outs[False]):
        np.testing.assert_array_equal(a[0], b[0])
        np.testing.assert_array_equal(a[1], b[1])
    assert not np.array_equal(outs[True][0][0], outs[True][1][0])   # the two lengths differ
