"""The plain PyTorch split-then-merge path: its merge equals the NumPy merge, its partials equal the
reference's, and it honours shapes, dtypes and plans."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from splitkv_common import merge  # noqa: E402
from splitkv_common import torch_eager, torch_io  # noqa: E402
from splitkv_common.torch_io import from_torch, to_torch  # noqa: E402
from splitkv_common.parity.cases import random_inputs, worked_example  # noqa: E402
from splitkv_common.reference import dense_attention, split_partials  # noqa: E402


def _states(seed, shape, d):
    rng = np.random.default_rng(seed)
    o = rng.standard_normal(shape + (d,)).astype(np.float32)
    lse = (rng.standard_normal(shape) * 20).astype(np.float32)
    flat = lse.reshape(-1)
    flat[::5] = -np.inf
    flat[1::7] = np.inf
    o.reshape(-1, d)[::5] = 3e4            # garbage in empty states (finite even in float16)
    return o, lse


def _both(o, lse, axis):
    a = merge.merge_states(o, lse, axis=axis)
    b = torch_eager.merge_states(torch.from_numpy(o), torch.from_numpy(lse), dim=axis)
    return a, (b[0].numpy(), b[1].numpy())


@pytest.mark.parametrize("shape, axis", [((6,), 0), ((4, 3), 0), ((3, 4), 1), ((3, 4), -1), ((2, 5, 3), 1),
                                         ((2, 3, 5), -1), ((7, 2, 3), 0)])
def test_merge_states_equals_the_numpy_merge(shape, axis):
    o, lse = _states(len(shape) * 10 + axis, shape, 8)
    (ao, al), (bo, bl) = _both(o, lse, axis)
    assert bo.shape == ao.shape and bl.shape == al.shape
    assert bo.dtype == np.float32 and bl.dtype == np.float32
    np.testing.assert_array_equal(np.isneginf(bl), np.isneginf(al))
    assert not np.isposinf(bl).any() and not np.isnan(bo).any()
    np.testing.assert_allclose(bo, ao, rtol=1e-5, atol=1e-6)
    fin = np.isfinite(al)
    np.testing.assert_allclose(bl[fin], al[fin], rtol=1e-6, atol=1e-6)


def test_merge_states_seed_numbers_and_all_empty():
    o = torch.tensor([[5 / 3], [44 / 7], [123.0]])
    lse = torch.tensor([np.log(3.0), np.log(7.0), float("inf")])
    out, l = torch_eager.merge_states(o, lse)
    assert float(out[0]) == pytest.approx(4.9, rel=1e-6) and float(l) == pytest.approx(np.log(10), rel=1e-6)
    out, l = torch_eager.merge_states(torch.full((3, 2, 4), 9.0), torch.tensor([[-np.inf, np.inf]] * 3))
    assert torch.all(out == 0) and torch.all(torch.isneginf(l))


def test_merge_states_accepts_low_precision_partials():
    o, lse = _states(3, (4, 3), 8)
    a = merge.merge_states(o.astype(np.float16).astype(np.float32), lse)
    b = torch_eager.merge_states(torch.from_numpy(o).half(), torch.from_numpy(lse))
    assert b[0].dtype == torch.float32
    np.testing.assert_allclose(b[0].numpy(), a[0], rtol=1e-5, atol=1e-6)


# --- decode_attention ---------------------------------------------------------------------------


def _run(inp, plan, **kw):
    t = to_torch(inp)
    return torch_eager.decode_attention(**t, plan=plan, scale=inp.scale, soft_cap=inp.soft_cap,
                                        window_left=inp.window_left, **kw)


@pytest.mark.parametrize("kw, policy", [
    (dict(seq_lens=[37, 0, 100], q_lens=[2, 1, 3]), "size:16"),
    (dict(seq_lens=[45, 80], num_q_heads=6, num_kv_heads=2, window_left=20), "count:3"),
    (dict(seq_lens=[60, 17], kv_quant="channel", kv_offset=True, dtype="bfloat16"), "size:32"),
    (dict(seq_lens=[33, 9], page_size=1, soft_cap=10.0, q_scale=5.0), "size:4"),
])
def test_partials_equal_the_reference_partials(kw, policy):
    inp = random_inputs(7, kw.pop("seq_lens"), **kw)
    plan = inp.plan(policy)
    out, lse, (po, pl) = _run(inp, plan, return_partials=True)
    npo, npl = split_partials(inp, plan)
    assert tuple(po.shape) == npo.shape and tuple(pl.shape) == npl.shape
    np.testing.assert_array_equal(torch.isneginf(pl).numpy(), np.isneginf(npl))
    fin = np.isfinite(npl)
    np.testing.assert_allclose(pl.numpy()[fin], npl[fin], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(po.numpy(), npo, rtol=1e-4, atol=1e-5)
    # and the merged result is the merge of those partials
    mo, ml = merge.merge_rows(po.numpy(), pl.numpy(), plan.row_slot_start, plan.row_num_splits)
    np.testing.assert_allclose(out.float().numpy(), mo, rtol=1e-2 if inp.dtype != "float32" else 1e-6,
                               atol=1e-2 if inp.dtype != "float32" else 1e-6)
    np.testing.assert_array_equal(np.isneginf(lse.numpy()), np.isneginf(ml))
    np.testing.assert_allclose(lse.numpy()[np.isfinite(ml)], ml[np.isfinite(ml)], rtol=1e-6)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_out_dtype_is_q_dtype(dtype):
    inp = random_inputs(8, [20, 5], dtype=dtype)
    out, lse = _run(inp, inp.plan("size:16"))
    assert out.dtype == torch_io.torch_dtype(dtype) and lse.dtype == torch.float32
    ref, _ = dense_attention(inp)
    o, _ = from_torch(out, lse)
    np.testing.assert_allclose(o, ref, atol={"float32": 1e-5, "float16": 2e-3, "bfloat16": 2e-2}[dtype])


def test_graph_stable_plan_and_empty_rows():
    inp = random_inputs(9, [0, 50, 3], q_lens=[2, 1, 2], page_size=8)
    ref, ref_lse = dense_attention(inp)
    plan = inp.plan("size:16", graph_stable=True, max_splits=6)
    assert plan.num_items > plan.num_valid_items
    out, lse = from_torch(*_run(inp, plan))
    np.testing.assert_allclose(out, ref, atol=2e-5)
    np.testing.assert_array_equal(np.isneginf(lse), np.isneginf(ref_lse))
    assert np.all(out[:2] == 0) and not np.isnan(out).any()


def test_all_empty_and_empty_batch():
    inp = random_inputs(10, [0, 0])
    out, lse = _run(inp, inp.plan("auto"))
    assert torch.all(out == 0) and torch.all(torch.isneginf(lse))
    empty = random_inputs(10, [])
    out, lse = _run(empty, empty.plan("auto"))
    assert tuple(out.shape) == (0, 4, 64) and tuple(lse.shape) == (0, 4)


def test_worked_example():
    inp = worked_example(head_dim=8)
    out, lse = _run(inp, inp.plan("size:2"))
    np.testing.assert_allclose(out.numpy(), 4.9, rtol=1e-6)
    assert float(lse[0, 0]) == pytest.approx(np.log(10), rel=1e-6)


def test_plan_tensors_hold_valid_items_only():
    inp = random_inputs(11, [40, 9], page_size=8)
    plan = inp.plan("size:16", graph_stable=True, max_splits=5)
    p = torch_eager.plan_tensors(plan, "cpu")
    assert all(t.dtype == torch.int64 for t in p.values())
    assert p["request"].numel() == plan.num_valid_items and torch.all(p["request"] >= 0)
    np.testing.assert_array_equal(p["row_slot_start"].numpy(), plan.row_slot_start)
    assert torch_io.torch_dtype("int8") is torch.int8
