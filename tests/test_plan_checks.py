"""The plan checks itself against a batch (``Plan.covered_seq_lens``, ``Plan.check_batch``) and the
shared wrapper settings check a batch's shapes (``PlanSpec.check_shapes``), for every wrapper."""

import dataclasses
from types import SimpleNamespace

import numpy as np
import pytest

from splitkv_common.plan import PlannedWrapper, PlanSpec, make_plan


def _plan(seq=(100, 0, 33), q_lens=(1, 2, 1), window=None):
    return make_plan(np.array(seq), num_kv_heads=2, num_q_heads=4, page_size=16, q_lens=np.array(q_lens),
                     policy="size:32", window_left=window)


@pytest.mark.parametrize("window", [None, 10])
def test_covered_seq_lens_are_the_lengths_planned(window):
    assert _plan(window=window).covered_seq_lens().tolist() == [100, 0, 33]


@pytest.mark.parametrize("graph_stable", [False, True])
def test_covered_seq_lens_in_any_item_order(graph_stable):
    """The planners' order (items of a request together) takes the fast path; a plan whose items come
    in another order (made elsewhere) gives the same lengths through the general one."""
    seq = np.array([300, 0, 33, 4000, 17])
    p = make_plan(seq, num_kv_heads=2, num_q_heads=4, page_size=16, policy="size:64", graph_stable=graph_stable)
    assert p.covered_seq_lens().tolist() == seq.tolist()
    n = p.num_valid_items
    order = np.random.default_rng(1).permutation(n)
    fields = {f: getattr(p, f).copy() for f in ("item_request", "item_kv_head", "item_split", "item_kv_start",
                                                 "item_kv_end")}
    for f, a in fields.items():
        a[:n] = a[:n][order]
    shuffled = dataclasses.replace(p, **fields)
    assert not (shuffled.item_request[1:n] >= shuffled.item_request[:n - 1]).all()
    assert shuffled.covered_seq_lens().tolist() == seq.tolist()


def test_check_batch_names_what_differs():
    p = _plan()
    p.check_batch([100, 0, 33], [0, 1, 3, 4])
    with pytest.raises(ValueError, match="plan: covers 33 KV tokens of request 2, whose seq_len is 34"):
        p.check_batch([100, 0, 34])
    with pytest.raises(ValueError, match="plan: made for 3 requests, the batch has 2"):
        p.check_batch([100, 0])
    with pytest.raises(ValueError, match="query_start_loc differs"):
        p.check_batch(query_start_loc=[0, 1, 2, 3])


def _t(*shape):
    return SimpleNamespace(shape=shape)


def test_check_shapes_against_the_spec_and_the_plan():
    spec, p = PlanSpec(4, 2, 8, 16), _plan()
    ok = dict(q=_t(4, 4, 8), k_cache=_t(9, 16, 2, 8), v_cache=_t(9, 16, 2, 8), block_table=_t(3, 7),
              seq_lens=_t(3), query_start_loc=_t(4))
    spec.check_shapes(p, **ok)
    for change, message in [(dict(q=_t(4, 4, 16)), r"q: must be \[T, 4, 8\]"),
                            (dict(k_cache=_t(9, 8, 2, 8)), r"k_cache: must be \[num_pages, 16, 2, 8\]"),
                            (dict(v_cache=_t(8, 16, 2, 8)), "v_cache: shape must equal k_cache's"),
                            (dict(block_table=_t(2, 7)), "plan: made for 3 requests, block_table"),
                            (dict(seq_lens=_t(4)), r"seq_lens has shape \(4,\) \(must be \[3\]\)"),
                            (dict(query_start_loc=_t(3)), "query_start_loc has shape"),
                            (dict(q=_t(3, 4, 8)), "plan: made for 4 query rows, q has 3")]:
        with pytest.raises(ValueError, match=message):
            spec.check_shapes(p, **{**ok, **change})


def test_wrappers_hold_one_plan_spec():
    class W(PlannedWrapper):
        def __init__(self):
            self.spec = PlanSpec(32, 8, 128, 16, policy="size:512", device="910b2", graph_stable=True, max_splits=4)

    w = W()
    assert (w.num_q_heads, w.num_kv_heads, w.head_dim, w.page_size) == (32, 8, 128, 16)
    assert (w.policy, w.profile, w.graph_stable, w.max_splits) == ("size:512", "910b2", True, 4)
    assert w.plan_spec() is w.spec
