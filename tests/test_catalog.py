"""The case catalog: unique names, every small case builds and validates, sizes tagged, and the
coverage that seed sections 07/08 ask for (checked on the built inputs, not only on tags)."""

import math

import numpy as np
import pytest

from splitkv_common.parity.cases import CATALOG, POISON, Case, catalog, get_case, random_inputs
from splitkv_common.merge import naive_average
from splitkv_common.plan import SplitPolicy
from splitkv_common.reference import dense_attention, gather_kv, split_attention, split_partials, visible

SMALL = catalog(("small",))


@pytest.fixture(scope="module")
def built():
    """Every small case built once: name -> (case, inputs)."""
    return {c.name: (c, c.build()) for c in SMALL}


def _plan(case, inp):
    return inp.plan(case.policy, device="h200", **case.plan_kwargs)


def test_names_are_unique_and_sizes_tagged():
    names = [c.name for c in CATALOG]
    assert len(names) == len(set(names))
    assert {c.size for c in CATALOG} == {"small", "full"}
    assert len(SMALL) >= 30 and len(catalog(("full",))) >= 3
    for c in CATALOG:
        assert isinstance(c, Case) and "/" in c.name and c.name == c.name.strip()
        SplitPolicy.parse(c.policy)
        assert isinstance(c.tags, tuple)


def test_every_small_case_builds_validates_and_plans(built):
    for name, (case, inp) in built.items():
        dims = inp.validate()
        assert dims.num_rows == inp.q.shape[0], name
        plan = _plan(case, inp)
        assert plan.batch_size == len(inp.seq_lens), name


def test_building_is_deterministic():
    for c in SMALL[:10]:
        a, b = c.build(), c.build()
        for f in ("q", "k_cache", "v_cache", "block_table", "seq_lens", "query_start_loc"):
            np.testing.assert_array_equal(getattr(a, f), getattr(b, f), err_msg=f"{c.name} {f}")


def test_seed_worked_example_gives_4_9_through_dense_and_split_paths(built):
    case, inp = built["seed/worked-example"]
    assert case.policy == "size:2" and inp.meta["expected_out"] == 4.9
    ref, ref_lse = dense_attention(inp)
    np.testing.assert_allclose(ref, 4.9, rtol=1e-7)
    plan = _plan(case, inp)
    assert plan.num_splits.tolist() == [2]  # the seed's two blocks
    out, lse = split_attention(inp, plan)
    np.testing.assert_allclose(out, 4.9, rtol=1e-6)
    assert float(lse[0, 0]) == pytest.approx(math.log(10), rel=1e-6)
    po, _ = split_partials(inp, plan)
    assert float(naive_average(po)[0, 0]) == pytest.approx(3.976, abs=5e-4)


def test_unused_cache_slots_are_poisoned_and_pages_shuffled(built):
    _, inp = built["paging/page-size-8"]
    page = inp.k_cache.shape[1]
    used = np.zeros(inp.k_cache.shape[:2], bool)
    for b, sl in enumerate(inp.seq_lens):
        pos = np.arange(sl)
        used[inp.block_table[b, pos // page], pos % page] = True
    assert np.all(inp.k_cache[~used] == POISON) and np.all(inp.v_cache[~used] == POISON)
    rows = [inp.block_table[b, :-(-int(s) // page)] for b, s in enumerate(inp.seq_lens)]
    assert any(np.any(np.diff(r) != 1) for r in rows if len(r) > 1)


# --- coverage of seed sections 07/08, from the inputs ----------------------------------------


def _cases(built, pred):
    return [n for n, (c, inp) in built.items() if pred(c, inp)]


def test_coverage_vector_v_and_different_q(built):
    vector = _cases(built, lambda c, i: i.v_cache.shape[3] > 1 and np.ptp(i.v_cache[..., 0, :], axis=-1).max() > 0)
    assert any(n.startswith("basic/vector-v") for n in vector)
    diff_q = _cases(built, lambda c, i: i.q.shape[0] > 1 and np.abs(i.q[0] - i.q[1]).max() > 0)
    assert len(diff_q) >= 10


def test_coverage_unaligned_lengths(built):
    def unaligned(c, inp):
        plan = _plan(c, inp)
        page = inp.k_cache.shape[1]
        return plan.split_tokens > 0 and any(s % page and s % plan.split_tokens and s > plan.split_tokens
                                             for s in inp.seq_lens.tolist())
    assert "basic/unaligned-lengths" in _cases(built, unaligned)


def _has_masked_split(c, inp):
    """A (row, split) of a non-empty request whose positions the row cannot see at all."""
    plan = _plan(c, inp)
    qsl = inp.query_start_loc
    for w in range(plan.num_valid_items):
        b = int(plan.item_request[w])
        a, e = int(plan.item_kv_start[w]), int(plan.item_kv_end[w])
        n = int(qsl[b + 1] - qsl[b])
        if e > a and n:
            vis = visible(int(inp.seq_lens[b]), n, np.arange(a, e), inp.window_left)
            if not vis.any(-1).all():
                return True
    return False


def test_coverage_masked_splits(built):
    assert "mask/causal-tail-masked-split" in _cases(built, _has_masked_split)

    def window_cuts_a_split(c, inp):  # a split that a row's window leaves partly outside
        plan = _plan(c, inp)
        if inp.window_left is None:
            return False
        for w in range(plan.num_valid_items):
            b = int(plan.item_request[w])
            a, e = int(plan.item_kv_start[w]), int(plan.item_kv_end[w])
            n = int(inp.query_start_loc[b + 1] - inp.query_start_loc[b])
            causal = visible(int(inp.seq_lens[b]), n, np.arange(a, e), None)
            windowed = visible(int(inp.seq_lens[b]), n, np.arange(a, e), inp.window_left)
            if (causal & ~windowed).any():
                return True
        return False
    assert "mask/sliding-window" in _cases(built, window_cuts_a_split)


def _all_scores(inp):
    """Every scaled (uncapped) score of every row against its request's whole history."""
    K, _ = inp.dequantized_kv()
    group = inp.q.shape[1] // K.shape[2]
    out = []
    for bi, sl in enumerate(inp.seq_lens.tolist()):
        r0, r1 = inp.query_start_loc[bi], inp.query_start_loc[bi + 1]
        if sl and r1 > r0:
            k = np.repeat(gather_kv(K, inp.block_table, bi, 0, sl), group, axis=1)
            out.append(inp.scale * np.einsum("thd,nhd->thn", inp.q[r0:r1].astype(np.float64), k).ravel())
    return np.concatenate(out) if out else np.zeros(0)


def test_coverage_large_and_negative_scores(built):
    # scores beyond +-88: exp overflows (or underflows to 0) in float32 without the max subtraction
    big = _cases(built, lambda c, i: _all_scores(i).max(initial=0) > 88 and _all_scores(i).min(initial=0) < -88)
    assert "scores/very-large" in big and "scores/very-large-bf16" in big
    capped = _cases(built, lambda c, i: i.soft_cap is not None and np.abs(_all_scores(i)).max() > i.soft_cap)
    assert capped  # the cap actually bites


def test_coverage_gqa(built):
    ratios = {i.q.shape[1] // i.k_cache.shape[2] for _, (c, i) in built.items()}
    assert 1 in ratios and any(r > 1 and r & (r - 1) for r in ratios)   # MHA and a non-power-of-two group
    assert _cases(built, lambda c, i: i.k_cache.shape[2] == 1 and i.q.shape[1] > 1)  # MQA
    assert _cases(built, lambda c, i: i.q.shape[1] == i.k_cache.shape[2] and i.q.shape[1] % 2)  # odd head count


def test_coverage_page_boundaries(built):
    pages = {i.k_cache.shape[1] for _, (c, i) in built.items()}
    assert {1, 8, 16} <= pages
    # a split boundary that is a page boundary inside a request, and a request ending mid-page
    assert _cases(built, lambda c, i: _plan(c, i).num_splits.max() > 1 and
                  any(s % i.k_cache.shape[1] for s in i.seq_lens.tolist()))


def test_coverage_int8(built):
    q8 = {n: i for n, (c, i) in built.items() if i.kv_dtype == "int8"}
    assert any(i.k_scale.ndim == 1 for i in q8.values())             # per KV head
    assert any(i.k_scale.ndim == 2 for i in q8.values())             # per (KV head, channel)
    assert any(i.k_offset is not None for i in q8.values())
    assert {i.dtype for i in q8.values()} >= {"float16", "bfloat16"}


def test_coverage_empty_rows_and_multi_query(built):
    assert _cases(built, lambda c, i: (i.seq_lens == 0).any() and (i.seq_lens > 0).any())
    assert _cases(built, lambda c, i: len(i.seq_lens) and (i.seq_lens == 0).all())
    mq = _cases(built, lambda c, i: (i.q_lens > 1).any())
    assert "multi-query/ragged" in mq and len(mq) >= 3


def test_coverage_dtypes_and_head_dims(built):
    assert {i.dtype for _, (c, i) in built.items()} == {"float32", "float16", "bfloat16"}
    dims = {i.q.shape[2] for _, (c, i) in built.items()}
    assert {64, 128, 256} <= dims and (80 in dims or 96 in dims)


def test_counterexample_defeats_the_naive_average(built):
    case, inp = built["seed/wrong-average-counterexample"]
    assert "counterexample" in case.tags
    plan = _plan(case, inp)
    assert plan.num_splits.tolist() == [2]
    lens = [e - a for a, e in zip(plan.item_kv_start, plan.item_kv_end)][:2]
    assert lens[0] != lens[1]  # unequal weight masses
    ref, _ = dense_attention(inp)
    po, pl = split_partials(inp, plan)
    wrong = naive_average(po)
    assert np.abs(wrong - ref).max() > 1e-2
    out, _ = split_attention(inp, plan)
    np.testing.assert_allclose(out, ref, atol=1e-5)


def test_tags_for_the_acceptance_lists():
    tags = {t for c in CATALOG for t in c.tags}
    for t in ("seed", "counterexample", "basic", "lengths", "paging", "policy", "mask", "multi-query", "window",
              "scores", "soft-cap", "gqa", "head-dim", "int8", "empty", "full"):
        assert t in tags, t


# --- selection --------------------------------------------------------------------------------


def test_catalog_selection():
    assert catalog("all") == [c for c in CATALOG]
    assert all(c.size == "full" for c in catalog("full"))
    seed = catalog(("small",), "seed")
    assert {c.name for c in seed} == {"seed/worked-example", "seed/worked-example-bf16",
                                      "seed/wrong-average-counterexample"}
    glob = catalog(("small",), "gqa/*")
    assert glob and all(c.name.startswith("gqa/") for c in glob)
    both = catalog(("small",), "int8/*, empty")
    assert {c.name.split("/")[0] for c in both} == {"int8", "empty"}
    assert catalog(("small",), "no-such-case") == []
    assert get_case("seed/worked-example").name == "seed/worked-example"
    with pytest.raises(ValueError, match="case"):
        get_case("nope")


def test_random_inputs_options():
    inp = random_inputs(5, [10, 0, 3], q_lens=[2, 1, 3], num_q_heads=6, num_kv_heads=3, head_dim=16, page_size=4,
                        dtype="float16", window_left=3, soft_cap=20.0)
    assert inp.q.shape == (6, 6, 16) and inp.k_cache.shape[1:] == (4, 3, 16)
    np.testing.assert_array_equal(inp.query_start_loc, [0, 2, 3, 6])
    assert inp.window_left == 3 and inp.soft_cap == 20.0 and inp.dtype == "float16"
    assert np.all(inp.block_table[1] == -1)
    inp.validate()


@pytest.mark.slow
def test_every_full_case_builds_and_validates():
    for c in catalog(("full",)):
        inp = c.build()
        inp.validate()
        inp.plan(c.policy, device="h200", **c.plan_kwargs)
