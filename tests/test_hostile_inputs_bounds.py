"""Hostile inputs at the limits: numbers near float32 / int32 / int64 bounds, the merges' one
contract, context parallel, the device-planned path and the vLLM side.

The companion of ``tests/test_hostile_inputs.py`` (whose problem, entry points and expectations it
reuses): each failure class is a table; each row runs on every entry point that accepts it and
expects a clear error naming the argument (matched on the message) or the documented result.

Classes and entry points:

* scalars at the limits (``scale`` over ``MAX_SCALE`` or float32, ``soft_cap`` over float32,
  ``window_left`` over int32 or near int64): the decode entry points of the hostile suite (NumPy
  split path, float64 reference, torch, ``flash_compat``, the Ascend wrapper's CPU path), the
  CPU twin and the Triton interpreter for a few;
* planner integers (``size:N`` / ``count:N`` past int32, ``max_splits``): ``make_plan``,
  ``SplitPolicy.parse``;
* the three merges (NumPy, torch, the ``splitkv::merge_states`` op): axis range, shapes, at
  least one state, float dtypes, the NaN rule;
* context parallel: ``cp_sharding.shard`` / ``localize``, ``context_parallel.make_batch``, two gloo
  ranks that disagree on the batch or of which one refuses its inputs (no hang);
* per-step lengths: ``StepInputs`` (Python and C writers), ``GraphDecoder.pad`` / ``layout``;
* the device-planned kernels' error counter (Triton interpreter): ``check_errors()`` names each;
* the vLLM settings (malformed policy at start-up), the adapter's plan cache, the error poll.
"""

from __future__ import annotations

import logging
from dataclasses import replace

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from splitkv_common import validation as V  # noqa: E402
from splitkv_common.merge import merge_states as np_merge  # noqa: E402
from splitkv_common.plan import SplitPolicy, make_plan  # noqa: E402
from splitkv_common.torch_eager import merge_states as torch_merge  # noqa: E402

from test_hostile_inputs import (CAP, DEFAULT_ENTRIES, FLASH_SCALE, RUNNERS, WINDOW, Case, R, SameAsClean,  # noqa: E402
                                 base, clean)

# ---------------------------------------------------------------------------------------------
# Scalars at the limits: every decode entry point
# ---------------------------------------------------------------------------------------------

WITH_TWIN = DEFAULT_ENTRIES + ("ascend-sim",)
SCALAR_CASES = [
    Case("scale-1e38", lambda: replace(base(), scale=1e38), R(ValueError, FLASH_SCALE + r".*MAX_SCALE"),
         entries=WITH_TWIN + ("triton",)),
    Case("scale-1e39-overflows-float32", lambda: replace(base(), scale=1e39),
         R(ValueError, FLASH_SCALE + r".*overflows float32"), entries=WITH_TWIN),
    Case("scale-just-over-max", lambda: replace(base(), scale=V.MAX_SCALE * 2), R(ValueError, FLASH_SCALE)),
    Case("scale-numpy-float64-1e38", lambda: replace(base(), scale=np.float64(1e38)), R(ValueError, FLASH_SCALE)),
    Case("soft-cap-1e39", lambda: replace(base(), soft_cap=1e39), R(ValueError, CAP + r".*float32"),
         entries=WITH_TWIN),
    Case("window-int64-max", lambda: replace(base(), window_left=2**63 - 1), R(ValueError, WINDOW + r".*MAX_SEQ_LEN"),
         entries=WITH_TWIN + ("triton",)),
    Case("window-2-pow-31", lambda: replace(base(), window_left=2**31), R(ValueError, WINDOW)),
    Case("window-python-2-pow-64", lambda: replace(base(), window_left=2**64), R(ValueError, WINDOW)),
    Case("window-np-int64-max", lambda: replace(base(), window_left=np.int64(2**63 - 1)), R(ValueError, WINDOW)),
    Case("window-int32-max-is-no-window", lambda: replace(base(), window_left=2**31 - 1), SameAsClean(tol=1e-6)),
]


def _scalar_params():
    return [pytest.param(c, e, id=f"{c.id}-{e}") for c in SCALAR_CASES for e in c.entries]


@pytest.mark.parametrize("case, entry", _scalar_params())
def test_scalars_at_the_limits(case: Case, entry: str):
    p = case.make()
    if isinstance(case.expect, SameAsClean):
        out, lse = RUNNERS[entry](p)
        c_out, c_lse = clean(entry, "single")
        np.testing.assert_allclose(out, c_out, rtol=0, atol=case.expect.tol)
        np.testing.assert_allclose(lse, c_lse, rtol=0, atol=case.expect.tol)
        return
    with pytest.raises(case.expect.exc, match=case.expect.match):
        RUNNERS[entry](p)


def test_check_scalars_bounds_directly():
    V.check_scalars(scale=V.MAX_SCALE, soft_cap=V.FLOAT32_MAX, window_left=V.MAX_SEQ_LEN)   # the limits are legal
    for kw, match in [(dict(scale=1e38), "^scale: .*MAX_SCALE"), (dict(scale=1e39), "^scale: .*overflows float32"),
                      (dict(soft_cap=1e39), "^soft_cap: .*float32"), (dict(window_left=2**63 - 1), "^window_left: ")]:
        with pytest.raises(ValueError, match=match):
            V.check_scalars(**kw)


# ---------------------------------------------------------------------------------------------
# Planner integers: policy values, num_splits bounds (never an OverflowError)
# ---------------------------------------------------------------------------------------------

PLAN_INT_CASES = [
    ("size-past-int64", dict(policy="size:99999999999999999999999"), r"^policy: .*MAX_SEQ_LEN"),
    ("size-past-int32", dict(policy="size:2147483648"), r"^policy: .*MAX_SEQ_LEN"),
    ("count-past-int64", dict(policy="count:99999999999999999999999"), r"^policy: .*MAX_WORK_ITEMS"),
    ("size-zero", dict(policy="size:0"), r"^policy: .*positive"),
    ("size-negative", dict(policy="size:-8"), r"^policy: .*positive"),
    ("size-float", dict(policy="size:8.5"), r"^policy: cannot parse"),
    ("window-int64-max", dict(window_left=2**63 - 1), r"^window_left: .*MAX_SEQ_LEN"),
    ("window-2-pow-64", dict(window_left=2**64), r"^window_left: "),
    ("max-splits-2-pow-40", dict(max_splits=2**40), r"^max_splits: .*MAX_WORK_ITEMS"),
]


@pytest.mark.parametrize("name, kw, match", PLAN_INT_CASES, ids=[c[0] for c in PLAN_INT_CASES])
def test_planner_integers_refused_by_name(name, kw, match):
    with pytest.raises(ValueError, match=match):
        make_plan(np.array([100, 20]), num_kv_heads=2, page_size=8, **kw)


def test_split_policy_value_must_be_an_int():
    with pytest.raises(ValueError, match="^policy: fixed_size needs an integer value"):
        SplitPolicy("fixed_size", 8.0)
    assert SplitPolicy("fixed_size", np.int64(16)).value == 16


# ---------------------------------------------------------------------------------------------
# The merges: one contract (merge.check_merge_inputs) for NumPy, torch and the op
# ---------------------------------------------------------------------------------------------

def _op_merge(o, lse, axis=0):
    pytest.importorskip("triton")
    import cuda_ref.ops  # noqa: F401  (registers torch.ops.splitkv)

    if axis != 0:
        pytest.skip("the op merges axis 0")
    if torch.cuda.is_available():  # with a GPU the op's Triton kernel runs there, not in the interpreter
        out, l = torch.ops.splitkv.merge_states(o.cuda(), lse.cuda())
        return out.cpu(), l.cpu()
    return torch.ops.splitkv.merge_states(o, lse)


def _call(impl, o, lse, axis=0):
    if impl == "numpy":
        return np_merge(o.numpy(), lse.numpy(), axis=axis)
    if impl == "torch":
        return torch_merge(o, lse, dim=axis)
    return _op_merge(o, lse, axis)


Z = torch.zeros
MERGE_CONTRACT = [
    # (id, o, lse, axis, exception, message); o of the op is [S, N, H, D]
    ("axis-past-rank", Z(2, 1, 3, 4), Z(2, 1, 3), 3, ValueError, r"^axis: 3 is out of range"),
    ("axis-below-rank", Z(2, 1, 3, 4), Z(2, 1, 3), -4, ValueError, r"^axis: -4 is out of range"),
    ("axis-bool", Z(2, 1, 3, 4), Z(2, 1, 3), True, TypeError, r"^axis: must be an int"),
    ("lse-broadcastable", Z(2, 1, 3, 4), Z(2, 1, 1), 0, ValueError, r"^o: shape .* must be lse.shape"),
    ("lse-extra-dim", Z(2, 1, 3, 4), Z(2, 1, 3, 1), 0, ValueError, r"^o: shape"),
    ("no-states", Z(0, 1, 3, 4), Z(0, 1, 3), 0, ValueError, r"at least one state"),
    ("scalar-lse", Z(4), Z(()), 0, ValueError, r"^(lse: needs a split axis|o: must be)"),
    ("int-o", torch.zeros(2, 1, 3, 4, dtype=torch.int32), Z(2, 1, 3), 0, TypeError, r"^o: dtype"),
    ("int-lse", Z(2, 1, 3, 4), torch.zeros(2, 1, 3, dtype=torch.int64), 0, TypeError, r"^lse: dtype"),
]
MERGE_IMPLS = ("numpy", "torch", "op")


@pytest.mark.parametrize("impl", MERGE_IMPLS)
@pytest.mark.parametrize("name, o, lse, axis, exc, match", MERGE_CONTRACT, ids=[c[0] for c in MERGE_CONTRACT])
def test_merge_contract(impl, name, o, lse, axis, exc, match):
    if impl == "op" and o.dim() != 4:
        match = r"^o: must be \[S, N, H, D\]"
    with pytest.raises(exc, match=match):
        _call(impl, o, lse, axis)


NAN, INF = float("nan"), float("inf")
MERGE_NAN_RULE = [
    # (id, o [2 states, 1 row, 1 head, 2 channels] per state, lse per state, want out, want lse)
    ("inf-o-live-is-nan", [[INF, 1.0], [3.0, 4.0]], [0.0, 0.0], [NAN, 2.5], 0.0 + np.log(2.0)),
    ("minus-inf-o-live-is-nan", [[-INF, 1.0], [3.0, 4.0]], [0.0, 0.0], [NAN, 2.5], np.log(2.0)),
    ("nan-lse-is-nan", [[1.0, 1.0], [3.0, 4.0]], [0.0, NAN], [NAN, NAN], NAN),
    ("inf-o-empty-ignored", [[INF, INF], [3.0, 4.0]], [-INF, 0.0], [3.0, 4.0], 0.0),
    ("all-empty", [[NAN, 7.0], [INF, 4.0]], [-INF, INF], [0.0, 0.0], -INF),
]


@pytest.mark.parametrize("impl", MERGE_IMPLS)
@pytest.mark.parametrize("name, o, lse, want_out, want_lse", MERGE_NAN_RULE, ids=[c[0] for c in MERGE_NAN_RULE])
def test_merge_nan_rule(impl, name, o, lse, want_out, want_lse):
    o_t = torch.tensor(o, dtype=torch.float32).reshape(2, 1, 1, 2)
    l_t = torch.tensor(lse, dtype=torch.float32).reshape(2, 1, 1)
    out, l = _call(impl, o_t, l_t)
    out, l = np.asarray(out).reshape(2), float(np.asarray(l).reshape(()))
    np.testing.assert_allclose(out, np.array(want_out, np.float32), rtol=1e-6, equal_nan=True)
    np.testing.assert_allclose(l, want_lse, rtol=1e-6, equal_nan=True)


# ---------------------------------------------------------------------------------------------
# Context parallel: page ids and lengths on the host, ranks that disagree
# ---------------------------------------------------------------------------------------------

from splitkv_common import cp_sharding  # noqa: E402

BT = np.array([[3, 5, -1], [1, 2, 7]], np.int64)
SEQ = np.array([6, 9], np.int64)
CP_SHARD_CASES = [
    ("used-minus-one", dict(block_table=np.array([[3, -1, 0], [1, 2, 7]]), seq_lens=SEQ),
     r"^block_table: entry \[0, 1\] = -1 .*-1 marks only entries past"),
    ("page-id-past-int32", dict(block_table=np.array([[3, 2**32 + 3, 0], [1, 2, 7]], np.int64), seq_lens=SEQ),
     r"^block_table: entry \[0, 1\] = 4294967299 .*fit int32"),
    ("page-id-uint64", dict(block_table=np.array([[3, 2**64 - 1, 0], [1, 2, 7]], np.uint64), seq_lens=SEQ),
     r"^block_table: entry \[0, 1\] .*fit int32"),
    ("seq-past-int32", dict(block_table=BT, seq_lens=np.array([6, 2**32 + 9], np.int64)), r"^seq_lens: .*MAX_SEQ_LEN"),
    ("seq-python-huge", dict(block_table=BT, seq_lens=[6, 2**70]), r"^seq_lens: "),
    ("seq-float", dict(block_table=BT, seq_lens=np.array([6.5, 9.0])), r"^seq_lens: must be integers"),
    ("block-table-float", dict(block_table=BT.astype(np.float64), seq_lens=SEQ), r"^block_table: dtype"),
]


@pytest.mark.parametrize("name, kw, match", CP_SHARD_CASES, ids=[c[0] for c in CP_SHARD_CASES])
def test_cp_shard_refuses(name, kw, match):
    with pytest.raises((ValueError, TypeError), match=match):
        cp_sharding.shard(kw["block_table"], kw["seq_lens"], 0, 2, page_size=4)


def test_cp_unused_minus_one_is_fine_and_ids_stay_exact():
    """-1 past a request's length is legal; an int64 id that fits int32 is kept exactly."""
    s = cp_sharding.shard(np.array([[3, 5, -1], [1, 2, 2**31 - 1]], np.int64), SEQ, 1, 2, page_size=4)
    assert s.block_table[1, :s.seq_lens[1] // 4 + 1].max() == 2**31 - 1


def test_cp_localize_and_make_batch_refuse_ids_past_the_cache():
    from splitkv_common.context_parallel import make_batch

    k = torch.zeros(8, 4, 2, 16)
    s = cp_sharding.shard(np.array([[3, 5, 0], [1, 2, 7]]), SEQ, 0, 1, page_size=4)
    with pytest.raises(ValueError, match=r"^shard.block_table: entry \[0, 1\] = 5 .*out of range \[0, 4\)"):
        cp_sharding.localize(s, k[:4], k[:4])
    bad = replace(s, block_table=np.where(s.block_table == 5, -1, s.block_table).astype(np.int32))
    q = torch.zeros(2, 4, 16)
    with pytest.raises(ValueError, match=r"^shard.block_table: entry \[0, 1\] = -1"):  # every shard backend refuses
        make_batch(bad, q, k, k)
    with pytest.raises(ValueError, match=r"^query_start_loc: must be non-decreasing"):
        make_batch(s, q, k, k, query_start_loc=np.array([0, 2, 1]))
    with pytest.raises(ValueError, match=r"^query_start_loc: "):
        make_batch(s, q, k, k, query_start_loc=np.array([0, 2**32 + 1, 2]))


def _disagreeing_worker(rank, world, what):
    from splitkv_common.context_parallel import cp_decode
    from splitkv_common.cp_sharding import localize, shard

    rng = np.random.default_rng(0)
    T = 2 + (rank if what == "rows" else 0)
    seq = np.array([9, 5], np.int64) if what != "lengths" or rank == 0 else np.array([9, 6], np.int64)
    bt = np.array([[0, 1, 2], [3, 4, 0]], np.int64)
    if what == "refused" and rank == 1:
        bt = np.array([[0, 1, -1], [3, 4, 0]], np.int64)   # this rank's shard holds page 2: used -1
    k = torch.as_tensor(rng.standard_normal((5, 4, 1, 8)).astype(np.float32))
    q = torch.as_tensor(rng.standard_normal((T, 2, 8)).astype(np.float32))
    qsl = torch.tensor([0, 1, T], dtype=torch.int32)
    try:
        if what == "refused":
            s = shard(np.array([[0, 1, 2], [3, 4, 0]]), seq, rank, world, page_size=4)
            s = replace(s, block_table=np.where(s.block_table == 2, -1, s.block_table).astype(np.int32)) if rank == 1 \
                else s
        else:
            s = shard(bt, seq, rank, world, page_size=4)
        s, kl, vl = (s, k, k) if what == "refused" else localize(s, k, k)
        cp_decode(q, kl, vl, s, query_start_loc=qsl)
        return "ran"
    except ValueError as e:
        return str(e)


@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed is not available")
@pytest.mark.parametrize("what, match", [
    ("rows", r"disagree on query rows \(T\)"),
    ("lengths", r"disagree on global seq_lens"),
    ("refused", r"(refused their inputs|^shard.block_table: entry)"),
])
def test_cp_ranks_that_disagree_fail_before_the_collective(what, match):
    """Two gloo ranks given different batches (query rows, lengths) or one refusing its inputs: every
    rank raises a clear error within the test's time (no wait until the group's timeout)."""
    import re

    from splitkv_common.context_parallel import launch_local

    results = launch_local(_disagreeing_worker, 2, what, backend="gloo", timeout_s=30)
    assert all(re.search(match, r) for r in results), results
    if what == "refused":
        assert re.search(r"^shard.block_table: entry \[0, 0\] = -1", results[1])   # the rank's own error
        assert "rank(s) [1] refused" in results[0]


# ---------------------------------------------------------------------------------------------
# Per-step lengths into int32 buffers: StepInputs, GraphDecoder.pad / layout
# ---------------------------------------------------------------------------------------------

STEP_CASES = [
    ("seq-past-int32", [2**32 + 40, 3], [0, 1, 2], r"^seq_lens: request 0 has 4294967336 tokens"),
    ("seq-int64-array-past-int32", np.array([2**32 + 40, 3]), np.array([0, 1, 2]), r"^seq_lens: request 0"),
    ("seq-float-cut", [4.5, 3], [0, 1, 2], r"^seq_lens: must be integers"),
    ("seq-negative", np.array([-1, 3], np.int32), np.array([0, 1, 2], np.int32), r"^seq_lens: request 0 has -1"),
    ("qsl-decreasing", np.array([1, 3], np.int32), np.array([0, 2, 1], np.int32), r"^query_start_loc: must start"),
    ("qsl-not-from-zero", [1, 3], [1, 2, 3], r"^query_start_loc: must start at 0"),
    ("qsl-past-int32", [1, 3], [0, 1, 2**32], r"^query_start_loc: "),
    ("seq-python-huge", [2**70, 3], [0, 1, 2], r"^seq_lens: "),
    ("wrong-length", [1, 2, 3], [0, 1, 2], r"^seq_lens: 2 entries expected"),
]


@pytest.mark.parametrize("in_graph", [False, True], ids=["update", "write"])
@pytest.mark.parametrize("name, sl, qsl, match", STEP_CASES, ids=[c[0] for c in STEP_CASES])
def test_step_inputs_refuse_before_writing(name, sl, qsl, match, in_graph):
    from cuda_ref.wrapper import StepInputs

    si = StepInputs(2, "cpu", in_graph=in_graph)
    write = si.write if in_graph else si.update
    write(np.array([5, 7], np.int32), np.array([0, 1, 2], np.int32))
    before = [a.copy() for a in si._host[0][1:]]
    with pytest.raises(ValueError, match=match):
        write(sl, qsl)
    for a, b in zip(si._host[0][1:], before):   # nothing was written (ring slot 0: in_graph's only one)
        if in_graph:
            np.testing.assert_array_equal(a, b)


GRAPH_PAD_CASES = [(n, sl, qsl, m) for n, sl, qsl, m in STEP_CASES if n != "wrong-length"]


@pytest.mark.parametrize("method", ["pad", "layout"])
@pytest.mark.parametrize("name, sl, qsl, match", GRAPH_PAD_CASES, ids=[c[0] for c in GRAPH_PAD_CASES])
def test_graph_decoder_lengths_refused(name, sl, qsl, match, method):
    from splitkv_vllm.graph import GraphDecoder

    dec = GraphDecoder(num_tokens=2, max_reqs=4, max_splits=2, route="triton", policy="size:4")
    with pytest.raises(ValueError, match=match):
        getattr(dec, method)(sl, qsl)


# ---------------------------------------------------------------------------------------------
# The device-planned kernels' error counter (Triton interpreter, tiny)
# ---------------------------------------------------------------------------------------------

DEVICE_PLAN_CASES = [
    # (id, seq_lens, query_start_loc, T, max_q_len, message)
    ("seq-past-the-row", [5, 9], [0, 1, 2], 2, None, r"seq_lens: a length past its block-table row.*request 1"),
    ("seq-negative", [-3, 8], [0, 1, 2], 2, None, r"seq_lens: a negative length.*request 0"),
    ("qsl-decreasing", [5, 8], [0, 2, 1], 2, None, r"query_start_loc: not non-decreasing.*request 1"),
    ("rows-over-max-q-len", [5, 8], [0, 11, 12], 12, 1, r"more query rows than the launch packs.*request 0"),
]


@pytest.mark.parametrize("name, sl, qsl, T, max_q, match", DEVICE_PLAN_CASES, ids=[c[0] for c in DEVICE_PLAN_CASES])
def test_device_plan_counts_what_it_cannot_honour(name, sl, qsl, T, max_q, match):
    pytest.importorskip("triton")
    from cuda_ref import INTERPRET
    from cuda_ref.wrapper import DecodeWrapper

    if not INTERPRET and not torch.cuda.is_available():
        pytest.skip("no CUDA device and not the interpreter")
    dev = "cpu" if INTERPRET else "cuda"
    g = torch.Generator().manual_seed(0)
    w = DecodeWrapper(2, 1, 16, 4, dtype=torch.float32, policy="size:8", device_plan=True, max_q_len=max_q, device=dev)
    k = torch.randn(4, 4, 1, 16, generator=g).to(dev)
    bt = torch.tensor([[0, 1], [2, 3]], dtype=torch.int32, device=dev)
    q = torch.randn(T, 2, 16, generator=g).to(dev)
    i32 = dict(dtype=torch.int32, device=dev)
    w.run(q, k, k, bt, torch.tensor([5, 8], **i32), torch.tensor([0, T // 2, T], **i32))
    w.check_errors()   # a clean batch: nothing
    w.run(q, k, k, bt, torch.tensor(sl, **i32), torch.tensor(qsl, **i32))
    with pytest.raises(RuntimeError, match=match):
        w.check_errors()
    w.check_errors()   # reset


# ---------------------------------------------------------------------------------------------
# The vLLM side: settings parsed at start-up, the adapter's plan cache, the error poll
# ---------------------------------------------------------------------------------------------

SETTINGS_CASES = [
    ("policy-bogus", "bogus", 8, "auto"),
    ("policy-size-7-blocks-8", "size:7", 8, "auto"),
    ("policy-size-past-int32", "size:4294967296", 8, "auto"),
    ("policy-count-past-int64", "count:99999999999999999999999", 8, "auto"),
    ("policy-size-16-blocks-8", "size:16", 8, "size:16"),
]


@pytest.mark.parametrize("name, value, block, want", SETTINGS_CASES, ids=[c[0] for c in SETTINGS_CASES])
def test_vllm_policy_checked_at_start_up(name, value, block, want, monkeypatch, caplog):
    from types import SimpleNamespace

    from splitkv_vllm import settings

    settings.reset()
    monkeypatch.setenv("SPLITKV_VLLM_POLICY", value)
    try:
        settings.configure(SimpleNamespace(cache_config=SimpleNamespace(block_size=block), additional_config={}))
        with caplog.at_level(logging.WARNING):
            got = settings.current().policy
        assert got == want
        if want != value:
            assert "SPLITKV_VLLM_POLICY" in caplog.text or "ignored" in caplog.text or got == "auto"
        make_plan(np.array([100, 20]), num_kv_heads=2, page_size=block, policy=got)   # a routed step plans
    finally:
        settings.reset()


def test_vllm_adapter_replans_a_reused_metadata_object():
    from test_vllm_shapes import make_step

    from splitkv_vllm.adapter import make_batch

    step = make_step([1, 1], [300, 40], block_size=16)
    kw = dict(num_q_heads=8, num_kv_heads=2, head_dim=64, page_size=16)
    a = make_batch(step.meta, **kw)
    step.meta.seq_lens_list = [40, 300]   # the same object, new lengths
    if step.meta.seq_lens is not None:
        step.meta.seq_lens = torch.tensor([40, 300], dtype=torch.int32)
    b = make_batch(step.meta, **kw)
    assert b is not a and b.seq_lens.tolist() == [40, 300]
    assert b.plan.num_splits.tolist() == make_plan(np.array([40, 300]), num_kv_heads=2, page_size=16,
                                                   query_start_loc=np.array([0, 1, 2]), num_q_heads=8, head_dim=64,
                                                   kv_elem_bytes=step.key_cache.element_size(),
                                                   **__import__("splitkv_vllm.adapter").adapter.plan_options()
                                                   ).num_splits.tolist()
    assert make_batch(step.meta, **kw) is b   # the layers of one step share it


def test_vllm_error_poll_reads_the_shared_counter(monkeypatch):
    pytest.importorskip("triton")
    from splitkv_vllm import errors, settings

    errors.reset()
    settings.reset()
    try:
        buf = errors.shared_buffer("cpu")
        monkeypatch.setenv("SPLITKV_VLLM_ERROR_CHECK_STEPS", "3")
        errors.tick("cpu")
        errors.tick("cpu")
        buf[4], buf[5], buf[6], buf[7] = 1, 1, 2, 1   # what a kernel writes for a length past its row
        assert errors.poll("cpu") is not None and int(buf.sum()) == 0   # read, logged and cleared
        buf[0], buf[1], buf[2], buf[3] = 1, 0, 1, -5
        monkeypatch.setenv("SPLITKV_VLLM_STRICT", "1")
        with pytest.raises(RuntimeError, match=r"page id -5"):
            errors.tick("cpu", 3)   # the third step polls
        assert errors.poll("cpu") is None
    finally:
        errors.reset()
        settings.reset()


def test_vllm_error_poll_reads_the_ascend_wrappers_error_sections(monkeypatch):
    """The Ascend route's wrappers count into their workspace's error section; the poll asks each
    registered one (check_errors), logs or (strict) raises what it found, and it is reset."""
    pytest.importorskip("torch")
    import torch

    from ascend_ops.wrapper import AscendDecodeWrapper
    from ascend_ops import tiling as tl
    from splitkv_vllm import errors, settings

    errors.reset()
    settings.reset()
    try:
        w = AscendDecodeWrapper(8, 2, 64, 16, dtype=torch.float16, device="cpu")
        w.plan([40, 300], max_pages=20, num_pages=64)
        errors.attach_ascend(w, "cpu")
        errors.attach_ascend(w, "cpu")   # once only
        assert errors.poll("cpu") is None
        section = w._stores["workspace"][:tl.ERROR_BYTES // 4].view(torch.int32).view(tl.ERROR_SLOTS, -1)
        section[3, :4] = torch.tensor([2, 1, 7, 99], dtype=torch.int32)   # what a block writes for masked pages
        msg = errors.poll("cpu")
        assert "request 1, logical page 7, page id 99" in msg and "2 block-table reads" in msg
        assert not section.any()
        section[0, 4:8] = torch.tensor([2, 1, 0, 2], dtype=torch.int32)   # a negative device length
        monkeypatch.setenv("SPLITKV_VLLM_STRICT", "1")
        with pytest.raises(RuntimeError, match="negative"):
            errors.poll("cpu")
    finally:
        errors.reset()
        settings.reset()


def test_the_bounds_suite_size():
    """The size by class (rows x entry points), for the closing note."""
    sizes = {"scalars": len(_scalar_params()), "planner": len(PLAN_INT_CASES) + 1,
             "merges": (len(MERGE_CONTRACT) + len(MERGE_NAN_RULE)) * len(MERGE_IMPLS),
             "context-parallel": len(CP_SHARD_CASES) + 2 + 3, "step-lengths": 2 * len(STEP_CASES) + 2 * len(GRAPH_PAD_CASES),
             "device-plan": len(DEVICE_PLAN_CASES), "vllm": len(SETTINGS_CASES) + 2}
    assert sum(sizes.values()) >= 130, sizes
