"""Shared-prefix decode: the semantics, the float64 reference, the refusals, the NumPy route and the
planner's decision (``splitkv_common.shared_prefix``, ``docs/conventions.md`` "Shared prefixes")."""

import numpy as np
import pytest

from splitkv_common.devices import get_profile
from splitkv_common.parity.accuracy import check
from splitkv_common.plan import make_plan
from splitkv_common.policies import auto_candidates
from splitkv_common.parity.cases import SHARED_PREFIX_CATALOG, shared_prefix_inputs
from splitkv_common.reference import dense_attention, plain_attention
from splitkv_common.shared_prefix import (
    SHARED_MARGIN, PrefixGroup, SharedPrefix, check_shared_prefix, merge_two_f64, plan_for_inputs,
    plan_shared_prefix, row_positions, shared_prefix_attention, shared_prefix_reference, tail_block_table,
    tail_inputs)

CASES = {c.name: c for c in SHARED_PREFIX_CATALOG}


def _brute_row(inp, t, h):
    """One (row, head) of attention written from the rule's text, float64: the row's request, its
    position, the visible positions (causal, window), softmax over the (capped) scores."""
    qsl = np.asarray(inp.query_start_loc)
    b = int(np.searchsorted(qsl, t, side="right") - 1)
    n, ql = int(inp.seq_lens[b]), int(qsl[b + 1] - qsl[b])
    pos = n - ql + (t - int(qsl[b]))
    K, V = inp.dequantized_kv()
    page = inp.k_cache.shape[1]
    kh = h // (inp.q.shape[1] // inp.k_cache.shape[2])
    lo = 0 if inp.window_left is None else max(0, pos - inp.window_left)
    ps = np.arange(lo, pos + 1)
    k = K[inp.block_table[b, ps // page], ps % page, kh]
    v = V[inp.block_table[b, ps // page], ps % page, kh]
    s = inp.scale * (k @ inp.q[t, h].astype(np.float64))
    if inp.soft_cap is not None:
        s = inp.soft_cap * np.tanh(s / inp.soft_cap)
    m = s.max()
    w = np.exp(s - m)
    return (w @ v) / w.sum(), m + np.log(w.sum())


@pytest.mark.parametrize("name", sorted(CASES))
def test_reference_is_the_plain_decode(name):
    """The two-level float64 computation (prefix state merged with tail state) equals the plain
    dense decode, and spot rows equal attention written from the rule's text."""
    inp, sp = CASES[name].build()
    out, lse = shared_prefix_reference(inp, sp)
    ref_out, ref_lse = dense_attention(inp)
    assert out.dtype == np.float64
    np.testing.assert_array_equal(np.isneginf(lse), np.isneginf(ref_lse))
    fin = np.isfinite(ref_lse)
    assert np.abs(out - ref_out).max() < 1e-10
    assert np.abs(lse[fin] - ref_lse[fin]).max() < 1e-10
    T = inp.q.shape[0]
    for t in {0, T // 2, T - 1}:
        o, l = _brute_row(inp, t, inp.q.shape[1] - 1)
        assert np.abs(out[t, -1] - o).max() < 1e-9 and abs(lse[t, -1] - l) < 1e-9


def test_reference_is_a_real_merge_of_two_states():
    """The prefix and the tail are two states: the tail alone differs from the full answer, and the
    merge of (prefix, tail) gives it back (never an average)."""
    inp, sp = CASES["shared-prefix/one-group"].build()
    groups = check_shared_prefix(sp, inp.seq_lens, inp.query_start_loc, inp.k_cache.shape[1], inp.block_table)
    to, tl = dense_attention(tail_inputs(inp, groups))
    out, _ = shared_prefix_reference(inp, sp)
    assert np.abs(to - out).max() > 1e-3
    assert np.abs((to + out) / 2 - out).max() > 1e-4


def test_merge_two_f64_rules():
    o_a, o_b = np.array([[1.0, 2.0]]), np.array([[3.0, 4.0]])
    out, lse = merge_two_f64(o_a, np.array([0.0]), o_b, np.array([np.log(3.0)]))
    np.testing.assert_allclose(out, [[2.5, 3.5]])
    np.testing.assert_allclose(lse, [np.log(4.0)])
    out, lse = merge_two_f64(o_a, np.array([-np.inf]), np.full((1, 2), np.nan), np.array([np.inf]))
    assert (out == 0).all() and np.isneginf(lse).all()          # both empty: 0, -inf; an empty o ignored
    out, lse = merge_two_f64(o_a, np.array([np.nan]), o_b, np.array([0.0]))
    assert np.isnan(out).all() and np.isnan(lse).all()


def test_tail_block_table_shifts_each_row_by_its_prefix():
    bt = np.arange(12, dtype=np.int32).reshape(2, 6)
    got = tail_block_table(bt, np.array([32, 0]), 16)
    np.testing.assert_array_equal(got, [[2, 3, 4, 5, -1, -1], [6, 7, 8, 9, 10, 11]])


def test_row_positions():
    np.testing.assert_array_equal(row_positions([5, 9, 3], [0, 1, 4, 4]), [4, 6, 7, 8])


def test_nan_in_the_prefix_poisons_every_row_of_the_group_and_no_other():
    inp, sp = CASES["shared-prefix/two-groups-and-loner"].build()
    p0 = inp.block_table[0, 0]
    inp.k_cache[p0, 3, 0, 5] = np.nan
    out, lse = shared_prefix_reference(inp, sp)
    group = inp.q.shape[1] // inp.k_cache.shape[2]
    assert np.isnan(lse[0:2, :group]).all() and np.isnan(out[0:2, :group]).all()
    assert np.isfinite(lse[2:]).all() and np.isfinite(lse[0:2, group:]).all()
    plan = plan_for_inputs(inp, sp, mode="on", device="cpu", policy="size:16")
    o2, l2 = shared_prefix_attention(inp, plan)
    np.testing.assert_array_equal(np.isnan(l2), np.isnan(lse))


# --- the refusals ---------------------------------------------------------------------------------

def _batch():
    return shared_prefix_inputs(401, [40, 50, 60, 30], [(0, 3, 32)], page_size=8)


@pytest.mark.parametrize("sp, match", [
    (SharedPrefix((PrefixGroup(0, 3, 30),)), "multiple of page_size 8"),
    (SharedPrefix((PrefixGroup(2, 2, 16),)), r"non-empty range"),
    (SharedPrefix((PrefixGroup(0, 5, 16),)), r"inside the batch \[0, 4\)"),
    (SharedPrefix((PrefixGroup(-1, 2, 16),)), r"inside the batch"),
    (SharedPrefix((PrefixGroup(0, 3, 16), PrefixGroup(2, 4, 16))), "sorted and disjoint"),
    (SharedPrefix((PrefixGroup(0, 2, 16), PrefixGroup(0, 1, 16))), "sorted and disjoint"),
    (SharedPrefix((PrefixGroup(0, 4, 32),)), "request 3's query rows"),
    (SharedPrefix((PrefixGroup(0, 4, 24),)), r"request 3, whose block_table\[3, 0\] = .* is not the prefix's page"),
    (SharedPrefix((PrefixGroup(0, 3, -8),)), r"prefix_len -8 must be in"),
    (SharedPrefix((PrefixGroup(0, 3, 16.0),)), "prefix_len must be an int"),
    (SharedPrefix((PrefixGroup(0, 3, 16, np.array([1, 2, 3])),)), r"\[prefix_len / page_size\] = \[2\]"),
    (SharedPrefix((PrefixGroup(0, 3, 16, np.array([10_000, 1])),)), "out of range"),
    (SharedPrefix((PrefixGroup(0, 3, 16, np.array([-1, 1])),)), "out of range"),
])
def test_ambiguous_or_wrong_prefixes_are_refused_naming_shared_prefix(sp, match):
    inp, _ = _batch()
    with pytest.raises(ValueError, match=match):
        shared_prefix_reference(inp, sp)
    with pytest.raises(ValueError, match=match):
        plan_for_inputs(inp, sp)


def test_a_prefix_of_pages_other_than_the_block_tables_is_refused():
    inp, _ = _batch()
    other = inp.block_table[3, :2].copy()   # request 3's own pages: valid ids, not the group's
    with pytest.raises(ValueError, match=r"block_table\[0, 0\] = .* is not the prefix's page"):
        shared_prefix_reference(inp, SharedPrefix((PrefixGroup(0, 3, 16, other),)))


def test_a_query_row_inside_the_prefix_is_refused():
    inp, _ = shared_prefix_inputs(402, [33, 40], [(0, 2, 32)], q_lens=[2, 1], page_size=8)
    with pytest.raises(ValueError, match=r"seq_len 33 - q_len 2 = 31 < 32"):
        shared_prefix_reference(inp, SharedPrefix.single(32, 0, 2))


def test_not_a_shared_prefix_is_refused():
    inp, _ = _batch()
    with pytest.raises(TypeError, match="shared_prefix: expected a SharedPrefix"):
        shared_prefix_reference(inp, 32)
    with pytest.raises(TypeError, match="group 0 is a tuple"):
        shared_prefix_reference(inp, SharedPrefix(((0, 3, 32),)))
    with pytest.raises(ValueError, match="mode: must be one of"):
        plan_for_inputs(inp, SharedPrefix.single(16, 0, 3), mode="yes")


def test_zero_prefix_and_no_prefix_are_the_plain_path():
    inp, _ = _batch()
    for sp in (None, SharedPrefix.single(0, 0, 3), SharedPrefix(())):
        plan = plan_for_inputs(inp, sp, mode="on", device="cpu")
        assert not plan.use_shared and "no prefix shared" in plan.reason
        out, lse = shared_prefix_attention(inp, plan)
        ref_out, _ = dense_attention(inp)
        assert np.abs(out - ref_out).max() < 1e-5


def test_from_common_prefix_len_is_vllms_convention():
    inp, sp = shared_prefix_inputs(403, [40, 50, 60], [(0, 3, 24)], page_size=8)
    vsp = SharedPrefix.from_common_prefix_len(24, 3)
    g = check_shared_prefix(vsp, inp.seq_lens, inp.query_start_loc, 8, inp.block_table)
    np.testing.assert_array_equal(g.pages[0], inp.block_table[0, :3])
    np.testing.assert_array_equal(g.request_prefix, [24, 24, 24])
    o1, _ = shared_prefix_reference(inp, vsp)
    o2, _ = shared_prefix_reference(inp, sp)
    np.testing.assert_array_equal(o1, o2)


# --- the NumPy route -------------------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(CASES))
def test_numpy_route_passes_the_accuracy_rule(name):
    case = CASES[name]
    inp, sp = case.build()
    plan = plan_for_inputs(inp, sp, mode=case.mode, device="cpu", policy=case.policy)
    assert plan.use_shared
    out, lse = shared_prefix_attention(inp, plan)
    ref_out, ref_lse = dense_attention(inp)
    acc = check(out, lse, ref_out, ref_lse, plain_attention(inp), inp.dtype)
    assert acc.passed, acc.reason


def test_window_after_the_prefix_drops_the_group():
    """A window that starts after the prefix for every row of a group: nothing of it is read, the
    group is dropped (and with no group left the plan is plain, saying why)."""
    inp, sp = shared_prefix_inputs(404, [90, 95], [(0, 2, 32)], window_left=20, page_size=8)
    plan = plan_for_inputs(inp, sp, mode="on", device="cpu")
    assert not plan.use_shared and "window starts after every group's prefix" in plan.reason
    inp, sp = shared_prefix_inputs(405, [90, 95, 40, 45], [(0, 2, 32), (2, 4, 32)], window_left=20, page_size=8)
    plan = plan_for_inputs(inp, sp, mode="on", device="cpu")
    assert plan.use_shared and plan.groups.num_groups == 1 and int(plan.groups.first[0]) == 2
    out, _ = shared_prefix_attention(inp, plan)
    assert np.abs(out - dense_attention(inp)[0]).max() < 1e-5


def test_plan_layout_tail_slots_then_prefix_slots():
    inp, sp = CASES["shared-prefix/two-groups-and-loner"].build()
    plan = plan_for_inputs(inp, sp, mode="on", device="cpu", policy="size:16")
    tail_n = plan.tail.row_num_splits
    covered = plan.groups.request_prefix[plan.plain.row_request()] > 0
    np.testing.assert_array_equal(plan.row_prefix_slot >= 0, covered)
    np.testing.assert_array_equal(plan.row_prefix_slot[covered], (plan.row_slot_start + tail_n)[covered])
    ends = plan.row_slot_start + plan.row_num_splits
    assert (plan.row_slot_start[1:] == ends[:-1]).all() and ends[-1] == plan.num_slots
    np.testing.assert_array_equal(plan.prefix_rows, [0, 1, 3, 4])


# --- the planner's decision ---------------------------------------------------------------------

def _decide(B, prefix, tail, device="h200", **kw):
    seq = np.full(B, prefix + tail)
    return plan_shared_prefix(seq, np.arange(B + 1), SharedPrefix.single(prefix, batch_size=B), num_kv_heads=8,
                              page_size=16, num_q_heads=32, head_dim=128, device=device, **kw)


@pytest.mark.parametrize("device", ["h200", "910b2", "910b3"])
def test_auto_takes_the_shared_path_at_b64_4k_256(device):
    plan = _decide(64, 4096, 256, device)
    assert plan.use_shared, plan.reason
    e = plan.estimates_us
    assert e["shared_us"] < SHARED_MARGIN * e["plain_us"]
    assert f"on {device}" in plan.reason and "vs plain est." in plan.reason
    # the bytes: the plain path reads the prefix 64 times, the shared path about once per row block
    assert e["plain_bytes"] > 10 * e["unique_bytes"] > 0
    assert e["shared_bytes"] < 2 * e["unique_bytes"]


@pytest.mark.parametrize("B, prefix, tail", [(2, 1024, 256), (1, 4096, 256), (64, 256, 2048), (16, 256, 256)])
def test_auto_keeps_the_plain_path_where_shared_loses(B, prefix, tail):
    plan = _decide(B, prefix, tail)
    assert not plan.use_shared
    assert "not below" in plan.reason and plan.estimates_us["shared_us"] >= SHARED_MARGIN * plan.estimates_us["plain_us"]
    assert plan.prefix is None and plan.plain is not None


def test_the_plain_estimate_charges_a_prefix_re_read_at_the_l2_rate_where_the_profile_knows_it():
    """The plain step's re-reads of a shared prefix are L2 hits on a GPU (H100 run 136: 1,141 MB in
    177 µs at B64 x 4k x 256); a profile without ``l2_reread_gbps`` charges them at HBM bandwidth."""
    import dataclasses

    from splitkv_common.devices import get_profile
    gpu = get_profile("h200")
    assert gpu.l2_reread_gbps > gpu.bandwidth_gbps
    hbm_only = dataclasses.replace(gpu, name="h200-no-l2", l2_reread_gbps=0.0)
    with_l2 = _decide(64, 4096, 256, gpu).estimates_us
    without = _decide(64, 4096, 256, hbm_only).estimates_us
    assert with_l2["plain_bytes"] == without["plain_bytes"]
    reread_mb = (with_l2["plain_bytes"] - with_l2["unique_bytes"]) / 1e6
    saved = reread_mb / gpu.bandwidth_gbps * 1e3 - reread_mb / gpu.l2_reread_gbps * 1e3
    assert with_l2["plain_us"] == pytest.approx(without["plain_us"] - saved, rel=1e-3)
    assert with_l2["prefix_us"] <= without["prefix_us"]


def test_the_prefix_plan_takes_its_own_split_policy():
    """``prefix_policy`` splits the prefix plan alone; the plain and tail plans keep ``policy``."""
    base = _decide(64, 4096, 256, mode="on")
    own = _decide(64, 4096, 256, mode="on", prefix_policy="size:1024")
    assert own.prefix.max_splits == 4 and base.prefix.max_splits != 4
    np.testing.assert_array_equal(own.tail.item_kv_end, base.tail.item_kv_end)
    np.testing.assert_array_equal(own.plain.item_kv_end, base.plain.item_kv_end)
    lens = own.prefix.item_kv_end - own.prefix.item_kv_start
    assert lens.max() == 1024 and lens.sum() == 4096 * 8


@pytest.mark.parametrize("device", ["h200", "910b2"])
@pytest.mark.parametrize("B,prefix,tail", [(64, 4096, 256), (256, 4096, 64), (2, 16384, 256), (16, 1024, 64)])
def test_the_default_prefix_split_is_the_least_estimate_among_the_candidates(device, B, prefix, tail):
    """Under ``auto`` the prefix plan's split is the model's own choice (row blocks and partials
    counted): no other candidate length given as ``prefix_policy`` gives a lower shared estimate."""
    chosen = _decide(B, prefix, tail, device, mode="on")
    size = int((chosen.prefix.item_kv_end - chosen.prefix.item_kv_start).max())
    assert f"prefix split {size} tokens" in chosen.reason
    prof = get_profile(device)
    for c in [c for c in auto_candidates(prefix, prof.min_split_tokens, 16, prof.max_splits) if c] + [prefix]:
        other = _decide(B, prefix, tail, device, mode="on", prefix_policy=f"size:{c}")
        assert chosen.estimates_us["shared_us"] <= other.estimates_us["shared_us"] + 1e-9, c


def test_the_prefix_split_counts_row_blocks_and_partials_where_plain_auto_does_not():
    """At B 64 x 4k x 256 the plain planner's ``auto`` cuts the one 4k "request" into 16 splits to fill
    the device; counting its 4 row blocks a KV head and 64 x 4 partial rows a split, the model takes
    fewer, longer splits, and its estimate is lower."""
    model, plain_auto = _decide(64, 4096, 256, mode="on"), _decide(64, 4096, 256, mode="on", prefix_policy="auto")
    assert model.prefix.max_splits < plain_auto.prefix.max_splits
    assert model.estimates_us["shared_us"] < plain_auto.estimates_us["shared_us"]
    assert model.estimates_us["merge_us"] < plain_auto.estimates_us["merge_us"]


@pytest.mark.parametrize("B,prefix,tail,policy", [(64, 4096, 256, "auto"), (3, 48, 20, "size:16"), (16, 1024, 64, "none")])
def test_the_three_plans_are_the_numpy_planners(B, prefix, tail, policy):
    """The plain, prefix and tail plans (made through the C planner where it plans them) are the ones
    ``make_plan`` makes, array for array."""
    sp = _decide(B, prefix, tail, mode="on", policy=policy)
    seq = np.full(B, prefix + tail)
    common = dict(num_kv_heads=8, page_size=16, num_q_heads=32, head_dim=128)
    size = int((sp.prefix.item_kv_end - sp.prefix.item_kv_start).max())
    want = {"plain": make_plan(seq, policy=policy, **common),
            "prefix": make_plan(np.array([prefix]), query_start_loc=np.array([0, B]),
                                policy=policy if policy != "auto" else f"size:{size}", **common),
            "tail": make_plan(np.full(B, tail), policy=policy, **common)}
    for name, plan in want.items():
        got = getattr(sp, name)
        for f in ("item_request", "item_kv_head", "item_split", "item_kv_start", "item_kv_end", "num_splits",
                  "row_slot_start", "row_num_splits"):
            np.testing.assert_array_equal(getattr(got, f)[:got.num_valid_items] if f.startswith("item") else
                                          getattr(got, f), getattr(plan, f)[:plan.num_valid_items]
                                          if f.startswith("item") else getattr(plan, f), err_msg=f"{name}.{f}")
        assert got.num_slots == plan.num_slots and got.split_tokens == plan.split_tokens


def test_a_fixed_policy_still_splits_the_prefix_plan():
    """The model chooses only under ``auto``: a fixed policy is the prefix plan's too (batch invariance)."""
    fixed = _decide(64, 4096, 256, mode="on", policy="size:256")
    assert (fixed.prefix.item_kv_end - fixed.prefix.item_kv_start).max() == 256
    assert "prefix split" not in fixed.reason


@pytest.mark.parametrize("bad", ["bogus", "size:7", -3, "size:0"])
def test_a_bad_prefix_policy_is_refused_by_name(bad):
    with pytest.raises(ValueError, match="^prefix_policy: "):
        _decide(64, 4096, 256, mode="on", prefix_policy=bad)


def test_modes_on_and_off_override_the_estimate():
    assert _decide(2, 1024, 256, mode="on").use_shared
    off = _decide(64, 4096, 256, mode="off")
    assert not off.use_shared and "mode off" in off.reason


def test_the_decision_is_reproducible():
    a, b = _decide(64, 4096, 256), _decide(64, 4096, 256)
    assert a.reason == b.reason and a.estimates_us == b.estimates_us
    for f in ("row_slot_start", "row_num_splits", "row_prefix_slot", "prefix_rows"):
        np.testing.assert_array_equal(getattr(a, f), getattr(b, f))
    np.testing.assert_array_equal(a.prefix.item_kv_start, b.prefix.item_kv_start)


def test_graph_stable_plans_keep_their_shapes_across_lengths():
    """Graph replay: with graph_stable every array keeps its shape while the tails grow."""
    shapes = set()
    for tail in (100, 180, 250):
        p = _decide(64, 4096, tail, graph_stable=True, mode="on", policy="size:512")
        shapes.add((p.num_slots, p.row_slot_start.shape, p.prefix.num_items, p.tail.num_items,
                    p.prefix.num_slots, p.tail.num_slots, int(p.row_slot_start[1])))
    assert len(shapes) == 1


# --- the torch route ------------------------------------------------------------------------------

def _torch_run(inp, plan, **kw):
    torch = pytest.importorskip("torch")
    from splitkv_common import shared_prefix_torch
    from splitkv_common.torch_io import to_torch

    t = to_torch(inp, "cpu")
    out, lse = shared_prefix_torch.decode_attention(
        t["q"], t["k_cache"], t["v_cache"], t["block_table"], t["seq_lens"], t["query_start_loc"], splan=plan,
        scale=inp.scale, soft_cap=inp.soft_cap, window_left=inp.window_left, k_scale=t.get("k_scale"),
        v_scale=t.get("v_scale"), k_offset=t.get("k_offset"), v_offset=t.get("v_offset"), **kw)
    return out.float().numpy(), lse.numpy()


@pytest.mark.parametrize("name", sorted(CASES))
def test_torch_route_passes_the_accuracy_rule(name):
    case = CASES[name]
    inp, sp = case.build()
    plan = plan_for_inputs(inp, sp, mode=case.mode, device="cpu", policy=case.policy)
    out, lse = _torch_run(inp, plan)
    ref_out, ref_lse = dense_attention(inp)
    acc = check(out, lse, ref_out, ref_lse, plain_attention(inp), inp.dtype)
    assert acc.passed, acc.reason


def test_torch_route_checks_the_block_table_on_the_host():
    inp, sp = CASES["shared-prefix/one-group"].build()
    plan = plan_for_inputs(inp, sp, mode="on", device="cpu")
    inp.block_table[2, 1] = inp.block_table[3, 5]   # request 2 no longer starts with the prefix
    with pytest.raises(ValueError, match=r"request 2, whose block_table\[2, 1\]"):
        _torch_run(inp, plan)


def test_torch_route_nan_in_prefix_poisons_the_group_rows_only():
    inp, sp = CASES["shared-prefix/two-groups-and-loner"].build()
    inp.v_cache[inp.block_table[3, 1], 2, 1, 0] = np.inf
    plan = plan_for_inputs(inp, sp, mode="on", device="cpu", policy="size:16")
    out, lse = _torch_run(inp, plan)
    _, ref_lse = dense_attention(inp)
    np.testing.assert_array_equal(np.isnan(lse), np.isnan(ref_lse))
    assert np.isnan(lse).any() and not np.isnan(lse[[0, 1, 2, 5]]).any()
