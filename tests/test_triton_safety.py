"""Hostile inputs on the Triton entry points (interpreter on a CPU, where a wild access is a crash):
out-of-range page ids masked and counted, requests isolated from each other, strided index tensors
refused, plans and scalars checked, empty batches, the soft cap's accuracy at any cap."""

from __future__ import annotations

import dataclasses
import math
import os
import shutil

import numpy as np

import pytest

torch = pytest.importorskip("torch")
import cuda_ref  # noqa: E402  (selects the interpreter without a GPU: before anything imports triton)

triton = pytest.importorskip("triton")
import triton.language as tl  # noqa: E402

from cuda_ref import checks, kernels, ops  # noqa: E402,F401  (ops registers torch.ops.splitkv.*)
from cuda_ref.launch import DevicePlan  # noqa: E402
from cuda_ref.wrapper import DecodeWrapper  # noqa: E402
from splitkv_common.parity import accuracy, cases  # noqa: E402
from splitkv_common.reference import dense_attention, plain_attention  # noqa: E402
from splitkv_common.torch_io import to_torch  # noqa: E402

DEVICE = "cpu" if cuda_ref.INTERPRET else "cuda"
INT32_MAX = 2 ** 31 - 1
PAGE = 4


def _inputs(lens=(20, 13, 9), **kw):
    kw = dict(dict(num_q_heads=4, num_kv_heads=2, head_dim=16, page_size=PAGE), **kw)
    return cases.random_inputs(11, list(lens), **kw)


def _wrapper(inp, policy="size:8", **kw):
    T, Hq, D = inp.q.shape
    _, page, Hkv, _ = inp.k_cache.shape
    w = DecodeWrapper(Hq, Hkv, D, page, dtype=inp.dtype, device=DEVICE, policy=policy, **kw)
    w.plan(inp.seq_lens, query_start_loc=inp.query_start_loc, window_left=inp.window_left)
    return w


def _run(w, x, **kw):
    out, lse = w.run(**x, **kw)
    return out.clone(), lse.clone()


def _attention_without(inp, b, skip_page):
    """float64 attention of request ``b`` (one query row) with logical page ``skip_page`` left out."""
    L = int(inp.seq_lens[b])
    pos = np.array([p for p in range(L) if p // PAGE != skip_page])
    pages = inp.block_table[b, pos // PAGE]
    k = inp.k_cache[pages, pos % PAGE].astype(np.float64)  # [n, Hkv, D]
    v = inp.v_cache[pages, pos % PAGE].astype(np.float64)
    q = inp.q[inp.query_start_loc[b]].astype(np.float64)   # [Hq, D]
    g = q.shape[0] // k.shape[1]
    scale = inp.scale if inp.scale is not None else q.shape[1] ** -0.5
    out = np.empty_like(q)
    for h in range(q.shape[0]):
        s = scale * k[:, h // g] @ q[h]
        w = np.exp(s - s.max())
        out[h] = w @ v[:, h // g] / w.sum()
    return out


# -- out-of-range page ids: masked, counted, no other request touched ------------------------------

@pytest.fixture(scope="module")
def clean():
    inp = _inputs()
    w = _wrapper(inp)
    x = to_torch(inp, DEVICE)
    return inp, w, x, _run(w, x)


@pytest.mark.parametrize("bad", [-1, "num_pages", 10 ** 6, INT32_MAX])
def test_bad_page_id_is_masked_counted_and_isolated(clean, bad):
    inp, w, x, (out0, lse0) = clean
    bad = inp.k_cache.shape[0] if bad == "num_pages" else bad
    x = dict(x, block_table=x["block_table"].clone())
    x["block_table"][1, 1] = bad  # request 1, logical page 1 (tokens 4..7 of its 13)
    out, lse = _run(w, x)
    for r in (0, 2):  # other requests: the same bits as the clean run
        assert torch.equal(out[r], out0[r]) and torch.equal(lse[r], lse0[r])
    assert torch.isfinite(out).all() and torch.isfinite(lse).all()
    want = _attention_without(inp, 1, skip_page=1)  # as if the page's tokens were absent
    np.testing.assert_allclose(out[1].double().cpu().numpy(), want, rtol=1e-5, atol=1e-5)
    with pytest.raises(RuntimeError, match=rf"request 1, logical page 1, page id {bad}\b"):
        w.check_errors()
    w.check_errors()  # reset: nothing more to report
    out2, _ = _run(w, dict(x, block_table=clean[2]["block_table"]))
    assert torch.equal(out2, out0)
    w.check_errors()


# the three ways a tile meets the block table (kernels._tile_rows): whole pages per tile (one page id
# per page), a tile inside one page (one page id per tile), neither (one page id per token)
TILE_PAGE_MODES = [(4, 16), (8, 32), (1, 16), (64, 16), (3, 16)]


@pytest.mark.parametrize("page,block_n", TILE_PAGE_MODES)
def test_bad_page_id_in_every_tile_mode(page, block_n):
    from cuda_ref.launch import KernelConfig
    inp = cases.random_inputs(3, [150, 77, 100], num_q_heads=4, num_kv_heads=2, head_dim=16, page_size=page,
                              dtype="float32")
    w = DecodeWrapper(4, 2, 16, page, dtype="float32", device=DEVICE, policy=f"size:{page * max(1, 32 // page)}",
                      config=KernelConfig(block_n, 4, 2))
    w.plan(inp.seq_lens)
    x = to_torch(inp, DEVICE)
    out0, lse0 = _run(w, x)
    col = 40 // page  # a logical page of request 1 holding position 40
    xb = dict(x, block_table=x["block_table"].clone())
    xb["block_table"][1, col] = -3
    out, lse = _run(w, xb)
    assert all(torch.equal(out[r], out0[r]) and torch.equal(lse[r], lse0[r]) for r in (0, 2))
    assert torch.isfinite(out).all() and torch.isfinite(lse).all() and not torch.equal(out[1], out0[1])
    with pytest.raises(RuntimeError, match=rf"request 1, logical page {col}, page id -3\b"):
        w.check_errors()


@pytest.mark.parametrize("page,block_n", TILE_PAGE_MODES)
@pytest.mark.parametrize("q_lens,window", [([3, 1, 4], None), ([2, 3, 1], 5), ([1, 1, 1], 7)])
def test_every_tile_mode_matches_the_reference(page, block_n, q_lens, window):
    """Multi-query rows (the mixed-visibility loop) and windows, split and unsplit, in every tile mode."""
    from cuda_ref.launch import KernelConfig
    inp = cases.random_inputs(page + block_n, [130, 45, 77], num_q_heads=4, num_kv_heads=2, head_dim=16,
                              page_size=page, dtype="float32", q_lens=q_lens, window_left=window)
    ref_o, ref_l = dense_attention(inp)
    for policy in (f"size:{page * max(1, 32 // page)}", "none"):
        w = DecodeWrapper(4, 2, 16, page, dtype="float32", device=DEVICE, policy=policy,
                          config=KernelConfig(block_n, 4, 2))
        w.plan(inp.seq_lens, query_start_loc=inp.query_start_loc, window_left=window)
        out, lse = _run(w, to_torch(inp, DEVICE), window_left=window)
        acc = accuracy.check(out.float().cpu().numpy(), lse.cpu().numpy(), ref_o, ref_l, plain_attention(inp),
                             inp.dtype)
        assert acc.passed, (policy, acc.reason)


def test_graph_plan_for_one_row_refuses_several():
    """A graph-stable plan made for one query row per request compiles the kernel without the
    mixed-visibility loop: a refreshed plan with more rows per request is refused, not run wrong."""
    inp = _inputs()
    w = DecodeWrapper(4, 2, 16, PAGE, dtype=inp.dtype, device=DEVICE, policy="size:8", graph_stable=True,
                      max_splits=8)
    w.plan(inp.seq_lens)
    assert w.dplan.max_q_len == 1
    with pytest.raises(ValueError, match="captured for one per request"):
        w.plan(inp.seq_lens, query_start_loc=np.array([0, 2, 2, 3], np.int32))


def test_bad_page_ids_in_the_fused_merge_and_every_page():
    inp = _inputs()
    w = _wrapper(inp, fuse_merge=True)
    x = to_torch(inp, DEVICE)
    out0, _ = _run(w, x)
    x["block_table"][0, :] = -7  # every page of request 0
    out, lse = _run(w, x)
    assert (out[0] == 0).all() and torch.isneginf(lse[0]).all()  # no visible position left: 0, -inf
    assert torch.equal(out[1:], out0[1:])
    with pytest.raises(RuntimeError, match=r"request 0, logical page \d+, page id -7"):
        w.check_errors()


def test_debug_mode_checks_after_every_run(monkeypatch):
    inp = _inputs()
    monkeypatch.setenv("SPLITKV_DEBUG", "1")
    w = _wrapper(inp)
    assert w.debug
    x = to_torch(inp, DEVICE)
    w.run(**x)
    x["block_table"][2, 0] = 10 ** 6
    with pytest.raises(RuntimeError, match="request 2, logical page 0, page id 1000000"):
        w.run(**x)
    monkeypatch.delenv("SPLITKV_DEBUG")
    assert not _wrapper(inp).debug


@pytest.mark.parametrize("page,block_n", TILE_PAGE_MODES)
def test_one_requests_splits_read_no_page_past_its_length(page, block_n):
    # batch 1: splits derived from the program index, the KV loop bounded by the split length alone
    # (STATIC_LOOP), so its last tiles run past the request's length. The block table's columns past
    # the length hold ids out of range: never reported, never an address, the same bits as the arrays
    from cuda_ref.launch import KernelConfig
    inp = cases.random_inputs(5, [150], num_q_heads=4, num_kv_heads=2, head_dim=16, page_size=page, dtype="float32")
    x = to_torch(inp, DEVICE)
    cols = x["block_table"].shape[1]
    wide = torch.full((1, 2 * cols + 3), -7, dtype=torch.int32, device=DEVICE)
    wide[0, cols::2] = 10 ** 6
    wide[:, :cols] = x["block_table"]
    res = {}
    for on in (True, False):
        w = DecodeWrapper(4, 2, 16, page, dtype="float32", device=DEVICE, policy=f"size:{page * max(1, 48 // page)}",
                          config=KernelConfig(block_n, 4, 2))
        w.index_items = on
        w.plan(inp.seq_lens)
        res[on] = _run(w, dict(x, block_table=wide))
        assert w.last_launch.constexprs["STATIC_LOOP"] is on and w.host_plan.max_splits > 1
        assert w.last_launch.constexprs["HOST_SPLITS"] is on
        w.check_errors()   # nothing to report: the bad ids lie past the length
        assert torch.equal(res[on][0], _run(w, x)[0])
    assert torch.equal(res[True][0], res[False][0]) and torch.equal(res[True][1], res[False][1])
    want, _ = dense_attention(inp)
    np.testing.assert_allclose(res[True][0].double().cpu().numpy(), want, rtol=1e-5, atol=1e-5)
    # a bad id inside the length is masked and reported as on the arrays' path
    bad = wide.clone()
    bad[0, 100 // page] = -3
    _run(w, dict(x, block_table=bad))
    w.index_items = True
    w.plan(inp.seq_lens)
    out, _ = _run(w, dict(x, block_table=bad))
    assert torch.isfinite(out).all()
    with pytest.raises(RuntimeError, match=rf"request 0, logical page {100 // page}, page id -3\b"):
        w.check_errors()


@pytest.mark.parametrize("head_dim", [16, 144])
@pytest.mark.parametrize("lens", [[INT32_MAX], [-5], [0], [10 ** 6], [7]])
def test_one_requests_splits_with_lengths_the_plan_was_not_made_for(lens, head_dim):
    # batch 1, splits derived from the program index (HOST_SPLITS; the KV loop bounded by the split
    # length alone, STATIC_LOOP, at D <= 128): a device length past the block table, negative or
    # short stays inside the tensors, and every planned split writes its state, so the merge (the
    # plan's split count) reads no slot left from an earlier call
    inp = cases.random_inputs(5, [150], num_q_heads=4, num_kv_heads=2, head_dim=head_dim, page_size=PAGE,
                              dtype="float32")
    w = DecodeWrapper(4, 2, head_dim, PAGE, dtype="float32", device=DEVICE, policy="size:32")
    w.plan(inp.seq_lens)
    x = to_torch(inp, DEVICE)
    w.run(**x)   # the slots hold this call's states
    out, lse = w.run(**dict(x, seq_lens=torch.tensor(lens, dtype=torch.int32, device=DEVICE)))
    assert w.last_launch.constexprs["HOST_SPLITS"] and w.host_plan.max_splits == 5
    assert w.last_launch.constexprs["STATIC_LOOP"] is (head_dim <= 128)
    if lens[0] <= 0:   # nothing visible: the empty row's output and lse
        assert torch.equal(out, torch.zeros_like(out)) and torch.isneginf(lse).all()
    if lens == [7]:    # the first 7 positions, as a plan made for them
        w7 = DecodeWrapper(4, 2, head_dim, PAGE, dtype="float32", device=DEVICE, policy="size:32")
        w7.plan(np.array([7]))
        want, want_lse = w7.run(**dict(x, seq_lens=torch.tensor(lens, dtype=torch.int32, device=DEVICE)))
        torch.testing.assert_close(out, want, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(lse, want_lse, rtol=1e-6, atol=1e-6)


def test_device_values_the_plan_was_not_made_for_stay_in_bounds():
    # seq_lens / query_start_loc on the device disagree with the plan (only validate=True would
    # see it): results are wrong for those requests, but nothing outside the tensors is touched
    inp = _inputs()
    w = _wrapper(inp)
    x = to_torch(inp, DEVICE)
    x["seq_lens"] = torch.tensor([INT32_MAX, -5, 10 ** 6], dtype=torch.int32, device=DEVICE)
    x["query_start_loc"] = torch.tensor([0, 10 ** 6, -(10 ** 6), INT32_MAX], dtype=torch.int32, device=DEVICE)
    w.run(**x)
    w2 = _wrapper(inp, fuse_merge=True)
    w2.run(**x)
    with pytest.raises(ValueError, match="seq_lens: negative"):
        w.run(**x, validate=True)


# -- index tensors: strides ---------------------------------------------------------------------

def _strided(x, name):
    t = x[name]
    if name == "block_table":
        wide = torch.zeros(t.shape[0], 2 * t.shape[1], dtype=t.dtype, device=DEVICE)
        wide[:, ::2] = t
        return wide[:, ::2]
    wide = torch.zeros(2 * t.shape[0], dtype=t.dtype, device=DEVICE)
    wide[::2] = t
    return wide[::2]


@pytest.mark.parametrize("name", ["block_table", "seq_lens", "query_start_loc"])
@pytest.mark.parametrize("validate", [False, True])
def test_strided_index_tensor_is_refused(clean, name, validate):
    inp, w, x, _ = clean
    x = dict(x, **{name: _strided(x, name)})
    with pytest.raises(ValueError, match=f"{name}: the .* axis must have stride 1"):
        w.run(**x, validate=validate)
    data, shape = ops.plan_args(w.dplan)
    with pytest.raises(ValueError, match=f"{name}: the .* axis must have stride 1"):
        torch.ops.splitkv.decode_attention(x["q"], x["k_cache"], x["v_cache"], x["block_table"], x["seq_lens"],
                                           x["query_start_loc"], data, shape, 0.25)


def test_row_strided_block_table_view_is_correct(clean):
    inp, w, x, (out0, lse0) = clean
    bt = x["block_table"]
    wide = torch.full((bt.shape[0], bt.shape[1] + 5), -1, dtype=bt.dtype, device=DEVICE)
    wide[:, :bt.shape[1]] = bt
    out, lse = _run(w, dict(x, block_table=wide[:, :bt.shape[1]]))  # rows 5 entries apart
    assert torch.equal(out, out0) and torch.equal(lse, lse0)


# -- the op: metadata refused before any launch; plan values never trusted ------------------------

def _op_args(inp, policy="size:8"):
    x = to_torch(inp, DEVICE)
    dp = DevicePlan.from_plan(inp.plan(policy), inp.q.shape[1] // inp.k_cache.shape[2], DEVICE)
    data, shape = ops.plan_args(dp)
    return [x["q"], x["k_cache"], x["v_cache"], x["block_table"], x["seq_lens"], x["query_start_loc"], data, shape,
            inp.q.shape[2] ** -0.5]


def test_op_refuses_q_with_fewer_rows_than_the_plan():
    args = _op_args(_inputs())
    args[0] = args[0][:2]
    with pytest.raises(ValueError, match="q: the plan is for 3 query rows, q has 2"):
        torch.ops.splitkv.decode_attention(*args)


def test_op_after_a_call_that_passed_still_refuses_a_changed_call():
    """The op keeps a guard of the last call that passed: a call like it skips the rebuilt checks,
    a changed one (rows, a strided table, another dtype, a scalar, the plan's shape) is checked again."""
    args = _op_args(_inputs())
    torch.ops.splitkv.decode_attention(*args)
    torch.ops.splitkv.decode_attention(*[a.clone() if isinstance(a, torch.Tensor) else a for a in args])
    changed = {
        "q: the plan is for 3 query rows": lambda a: a.__setitem__(0, a[0][:2]),
        "block_table": lambda a: a.__setitem__(3, torch.cat([a[3], a[3]], 1)[:, ::2]),
        "q": lambda a: a.__setitem__(0, a[0].double()),
        "scale": lambda a: a.__setitem__(8, -1.0),
        "q: the plan is for 4 query rows": lambda a: a.__setitem__(7, [*a[7][:2], a[7][2] + 1, *a[7][3:]]),
    }
    for match, change in changed.items():
        a = list(args)
        change(a)
        with pytest.raises((ValueError, TypeError), match=match):
            torch.ops.splitkv.decode_attention(*a)
        torch.ops.splitkv.decode_attention(*args)   # the good call again: the guard is its


def test_op_refuses_int8_cache_without_scales():
    args = _op_args(_inputs(kv_quant="head"))
    with pytest.raises(ValueError, match="k_scale, v_scale: required"):
        torch.ops.splitkv.decode_attention(*args)


def test_op_refuses_a_plan_buffer_of_the_wrong_size():
    args = _op_args(_inputs())
    args[6] = args[6][:-1]
    with pytest.raises(ValueError, match="plan_data"):
        torch.ops.splitkv.decode_attention(*args)


def test_op_with_a_corrupt_plan_stays_in_bounds():
    inp = _inputs()
    args = _op_args(inp)
    dp = DevicePlan(args[6].clone(), *args[7][:7], bool(args[7][7]))
    dp.view("item_request")[0] = 10 ** 6
    dp.view("item_kv_head")[1] = -3
    dp.view("item_kv_end")[2] = INT32_MAX
    dp.view("item_split")[3] = 10 ** 6
    dp.view("row_slot_start")[0] = 10 ** 6
    dp.view("row_num_splits")[1] = INT32_MAX
    dp.view("num_splits")[2] = 10 ** 6
    args[6] = dp.data
    out, lse = torch.ops.splitkv.decode_attention(*args)  # wrong, but no wild access
    assert out.shape == inp.q.shape


# -- scalars ----------------------------------------------------------------------------------------

# messages: the rule's start, as both cuda_ref.checks and the shared validation word it
BAD_SCALARS = [("soft_cap", 0.0, "soft_cap: must be None or a finite"), ("soft_cap", -1.0, "soft_cap: must be None"),
               ("soft_cap", float("nan"), "soft_cap: must be None"), ("soft_cap", float("inf"), "soft_cap: must be None"),
               ("soft_cap", True, "soft_cap: must be None"), ("scale", 0.0, "scale: must be"),
               ("scale", float("nan"), "scale: must be"), ("scale", -0.5, "scale: must be"),
               ("window_left", -2, "window_left: must be None, -1"), ("window_left", 1.5, "window_left: must be"),
               ("window_left", True, "window_left: must be")]


@pytest.mark.parametrize("name,value,msg", BAD_SCALARS, ids=[f"{n}={v}" for n, v, _ in BAD_SCALARS])
def test_illegal_scalars_are_refused(clean, name, value, msg):
    if checks._shared_check_scalars is None and name == "soft_cap" and value == 0.0:
        with pytest.raises(ValueError, match=r"^soft_cap: must be None or a finite float > 0, got 0\.0$"):
            checks.check_scalars(None, 0.0, None)
    inp, w, x, _ = clean
    with pytest.raises(ValueError, match=msg.replace("(", r"\(").replace(".", r"\.")):
        w.run(**x, **{name: value})
    with pytest.raises(ValueError, match=msg.replace("(", r"\(").replace(".", r"\.")):
        w.run(**x, **{name: value})  # not remembered as checked
    args = _op_args(inp)
    kw = {"scale": args.pop(), name: value}
    if isinstance(value, bool) or isinstance(value, float) and name == "window_left":
        return  # the op's schema converts a bool to 1.0 and refuses a float window itself
    with pytest.raises(ValueError, match=msg.replace("(", r"\(").replace(".", r"\.")):
        torch.ops.splitkv.decode_attention(*args, **kw)


def test_legal_window_and_cap_spellings_run(clean):
    inp, w, x, (out0, _) = clean
    assert torch.equal(_run(w, dict(x), window_left=-1)[0], out0)
    _run(w, dict(x), soft_cap=30, window_left=0)


# -- the signature cache ------------------------------------------------------------------------------

def test_checks_run_once_per_signature(clean, monkeypatch):
    inp, w, x, _ = clean
    calls = []
    real = checks.check_launch
    monkeypatch.setattr("cuda_ref.call_checks.check_launch", lambda *a, **k: (calls.append(1), real(*a, **k)))
    w.forget_checks()
    w.run(**x)
    w.run(**x)
    assert len(calls) == 1
    w.run(**x, soft_cap=5.0)
    assert len(calls) == 2
    with pytest.raises(ValueError, match="stride 1"):
        w.run(**dict(x, seq_lens=_strided(x, "seq_lens")))


# -- check()'s guard: the last call that passed ------------------------------------------------------

GUARDS = ["torch", "python"] if checks.tensor_guard_kind() == "torch" else ["python"]
CALL_GUARDS = (["native"] if checks.call_guard_kind() == "native" else []) + GUARDS


@pytest.fixture(params=CALL_GUARDS)
def guarded(request, monkeypatch):
    """A fresh wrapper whose check() guard is each kind this machine has (the C++ one, torch's C one,
    the Python one), its inputs, and the calls that went past the guard (``_check_signature``)."""
    real_guard = checks.call_guard
    monkeypatch.setattr("cuda_ref.call_checks.call_guard", lambda *a: real_guard(*a, kind=request.param))
    inp = _inputs()
    w = _wrapper(inp)
    x = to_torch(inp, DEVICE)
    past = []
    real = w._check_signature
    w._check_signature = lambda *a: (past.append(1), real(*a))[1]
    return w, x, past


def _check(w, x, **kw):
    x = dict(x, **kw)
    scalars = {n: x.pop(n) for n in ("scale", "soft_cap", "window_left") if n in x}
    return w.check(x["q"], x["k_cache"], x["v_cache"], x["block_table"], x["seq_lens"], x["query_start_loc"],
                   x.get("k_scale"), x.get("v_scale"), x.get("k_offset"), x.get("v_offset"), **scalars)


def test_new_tensor_objects_of_the_same_metadata_take_the_guard(guarded):
    w, x, past = guarded
    key = _check(w, x)
    for _ in range(3):   # a model's layers: new views (or new tensors) of the same shapes each call
        assert _check(w, {n: t[:] if t is not None else None for n, t in x.items()}) == key
    assert _check(w, {n: t.clone() if t is not None else None for n, t in x.items()}) == key
    assert len(past) == 1
    _check(w, x, soft_cap=5.0)   # other scalars: past the guard, then guarded in turn
    _check(w, x, soft_cap=float("5"))
    assert len(past) == 2


def _transposed_head_dim(t):   # the same shape, the head-dim axis not contiguous
    return t.transpose(0, -1).contiguous().transpose(0, -1)


@pytest.mark.parametrize("change, error, msg", [
    (lambda x: dict(seq_lens=_strided(x, "seq_lens")), ValueError, "stride 1"),
    (lambda x: dict(block_table=_strided(x, "block_table")), ValueError, "stride 1"),
    (lambda x: dict(q=_transposed_head_dim(x["q"])), ValueError, "stride 1"),
    (lambda x: dict(v_cache=_transposed_head_dim(x["v_cache"])), ValueError, "v_cache"),
    (lambda x: dict(q=x["q"].double()), TypeError, "q"),
    (lambda x: dict(seq_lens=x["seq_lens"].long()), TypeError, "seq_lens"),
    (lambda x: dict(k_cache=x["k_cache"].to("meta")), ValueError, "k_cache"),
    (lambda x: dict(block_table=x["block_table"][:, :3]), ValueError, "plan: reads 5 pages"),
    (lambda x: dict(query_start_loc=x["query_start_loc"][:-1]), ValueError, "query_start_loc"),
    (lambda x: dict(k_scale=torch.ones(2)), ValueError, "k_scale"),
    (lambda x: dict(scale=-0.5), ValueError, "scale"),
    (lambda x: dict(window_left=True), ValueError, "window_left"),
], ids=["strided-seq_lens", "strided-block_table", "q-head-dim", "v-strides", "q-dtype", "seq_lens-dtype",
        "k-device", "narrow-block_table", "qsl-shape", "scale-without-int8", "negative-scale", "bool-window"])
def test_a_call_unlike_the_last_one_is_checked_again(guarded, change, error, msg):
    w, x, past = guarded
    _check(w, x, scale=0.5, window_left=1)
    _check(w, x, scale=0.5, window_left=1)
    assert len(past) == 1
    bad = change(x)
    kw = dict(dict(scale=0.5, window_left=1), **bad)
    with pytest.raises(error, match=msg):
        _check(w, x, **kw)
    with pytest.raises(error, match=msg):   # not remembered
        _check(w, x, **kw)
    _check(w, x, scale=0.5, window_left=1)


def test_a_new_plan_reading_more_pages_is_checked_against_the_guarded_block_table(guarded):
    w, x, past = guarded
    inp = _inputs()
    _check(w, x)
    w.plan(np.minimum(inp.seq_lens, 8), query_start_loc=inp.query_start_loc)   # reads 2 pages: the same batch
    narrow = x["block_table"][:, :2].contiguous()
    _check(w, x, block_table=narrow)
    _check(w, x, block_table=narrow)
    w.plan(inp.seq_lens, query_start_loc=inp.query_start_loc)   # 5 pages: the guarded call's table is too narrow
    with pytest.raises(ValueError, match="plan: reads 5 pages"):
        _check(w, x, block_table=narrow)


def test_the_guard_follows_torch_modes(guarded):
    w, x, past = guarded
    key = _check(w, x)
    with torch.inference_mode():
        assert _check(w, x) == key
        assert _check(w, x) == key
    with torch.no_grad():
        assert _check(w, x) == key
    with pytest.raises(ValueError, match="stride 1"):
        with torch.inference_mode():
            _check(w, x, seq_lens=_strided(x, "seq_lens"))


def test_int8_scales_are_guarded_with_the_rest(monkeypatch):
    inp = _inputs(kv_quant="channel", kv_offset=True)
    T, Hq, D = inp.q.shape
    _, page, Hkv, _ = inp.k_cache.shape
    w = DecodeWrapper(Hq, Hkv, D, page, dtype=inp.dtype, kv_dtype="int8", device=DEVICE, policy="size:8")
    w.plan(inp.seq_lens, query_start_loc=inp.query_start_loc)
    x = to_torch(inp, DEVICE)
    key = _check(w, x)
    assert _check(w, {n: t[:] for n, t in x.items()}) == key
    with pytest.raises(ValueError, match="k_offset, v_offset: give both or neither"):
        _check(w, x, v_offset=None)
    with pytest.raises(ValueError, match="k_scale"):
        _check(w, x, k_scale=x["k_scale"][:, :1].contiguous())
    with pytest.raises(ValueError, match="channel axis"):
        _check(w, x, k_scale=_transposed_head_dim(x["k_scale"]), v_scale=_transposed_head_dim(x["v_scale"]),
               k_offset=_transposed_head_dim(x["k_offset"]), v_offset=_transposed_head_dim(x["v_offset"]))
    assert _check(w, x) == key


def test_one_cache_for_k_and_v_takes_the_guard(guarded):
    w, x, past = guarded
    x = dict(x, v_cache=x["k_cache"])
    key = _check(w, x)
    assert _check(w, dict(x, q=x["q"][:])) == key
    assert len(past) == 1


def test_the_native_call_guard_is_built_here():
    """The C++ guard builds wherever the C++ compiler and torch's headers are (CI's machine has both):
    a failed build must not pass unnoticed behind the fallbacks."""
    if shutil.which(os.environ.get("CXX") or "c++") is None or os.environ.get("SPLITKV_NATIVE") == "0":
        pytest.skip("no C++ compiler, or SPLITKV_NATIVE=0")
    assert checks.call_guard_kind() == "native", checks.native_guard_status()


@pytest.mark.parametrize("kind", CALL_GUARDS)
def test_call_guard_compares_tensor_slots_and_scalars(kind):
    a, b = torch.empty(2, 3), torch.empty(4)
    same = checks.call_guard(3, a, None, b, 0.5, None, 7, kind=kind)
    assert same(torch.empty(2, 3), None, torch.empty(4), 0.5, None, 7)
    assert same(a[:], None, torch.empty(8)[:4], float("0.5"), None, 7)
    for i, other in [(0, a.t()), (0, a.double()), (0, a.to("meta")), (0, torch.nn.Parameter(a)), (0, None),
                     (1, b), (2, torch.empty(8)[::2]), (3, 0.25), (3, None), (3, 1), (4, 1.0), (5, 7.0),
                     (5, True), (0, 3)]:
        args = [a, None, b, 0.5, None, 7]
        args[i] = other
        assert not same(*args), (i, other)
    assert not same(a, None, b, 0.5, None) and not same(a, None, b, 0.5, None, 7, 8)
    kept = object()   # a scalar of another type never matches, not even itself: its value may change
    assert not checks.call_guard(1, a, kept, kind=kind)(a, kept)
    nan = float("nan")
    assert not checks.call_guard(1, a, nan, kind=kind)(a, nan) and not checks.call_guard(1, a, nan, kind=kind)(a, 1.0)
    with pytest.raises(TypeError):
        checks.call_guard(1, 3, kind=kind)


class _Sub(torch.Tensor):
    """A tensor subclass (same metadata, another Python type)."""


ODD_TENSORS = {
    "sparse": lambda t: t.to_sparse(),
    "subclass": lambda t: t.as_subclass(_Sub),
    "meta": lambda t: t.to("meta"),
    "complex": lambda t: t.to(torch.complex64),
    "0-d": lambda t: t.reshape(-1)[0],
    "double": lambda t: t.double(),
}


@pytest.mark.parametrize("kind", CALL_GUARDS)
@pytest.mark.parametrize("odd", list(ODD_TENSORS))
def test_call_guard_says_false_for_odd_tensors(kind, odd):
    a = torch.randn(2, 3)
    assert not checks.call_guard(1, a, kind=kind)(ODD_TENSORS[odd](a))


def test_the_native_guard_is_not_made_over_tensors_without_strides():
    if checks.call_guard_kind() != "native":
        pytest.skip("no C++ guard here")
    for t in (torch.eye(3).to_sparse(),
              torch.nested.nested_tensor([torch.zeros(2, 3), torch.zeros(4, 3)], layout=torch.jagged)):
        with pytest.raises(TypeError, match="not strided"):
            checks.call_guard(1, t)


@pytest.mark.parametrize("slot", ["q", "k_cache", "block_table", "seq_lens"])
@pytest.mark.parametrize("odd", ["sparse", "subclass", "meta", "complex", "double"])
def test_run_after_a_call_that_passed_refuses_odd_tensors_by_name(guarded, slot, odd):
    """The guard of the last call that passed lets none of these through: the full checks refuse each
    with the argument named (a subclass of the same metadata passes them, and runs)."""
    w, x, past = guarded
    w.run(**x)
    bad = ODD_TENSORS[odd](x[slot])
    if odd == "subclass":
        out, _ = w.run(**dict(x, **{slot: bad}))
        assert torch.isfinite(out).all() and len(past) == 2
        return
    with pytest.raises((TypeError, ValueError), match=f"^{slot}|{slot}:|{slot} "):
        w.run(**dict(x, **{slot: bad}))


def test_tensor_guard_compares_type_shape_strides_dtype_and_device():
    a = torch.empty(2, 3)
    for native in [n == "torch" for n in GUARDS]:
        same = checks.tensor_guard(a, torch.empty(4), native=native)
        assert same(torch.empty(2, 3), torch.empty(4)) and same(a[:], torch.empty(8)[:4])
        for other in (a.t(), torch.empty(2, 4)[:, :3], torch.empty(2, 3, 1), a.double(), a.to("meta"),
                      torch.nn.Parameter(a), None, 3):
            assert not same(other, torch.empty(4))
        assert not same(a, torch.empty(8)[::2])


# -- plans --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("field,index,value,msg", [
    # the shared Plan.validate wording, which set_plan runs first
    ("row_slot_start", 0, 10 ** 6, r"plan: row 0: slots \[1000000, 1000003\) are outside \[0, num_slots = 7\)"),
    ("row_slot_start", 1, -1, r"plan: row 1: slots \[-1, 1\) are outside"),
    ("item_request", 0, 3, r"plan: item_request\[0\] = 3 is out of range \[0, 3\)"),
    ("item_kv_head", 0, 2, r"plan: item_kv_head\[0\] = 2 is out of range \[0, 2\)"),
    ("item_split", 0, 9, "item_split"),
    ("item_kv_start", 0, -4, r"plan: item 0 has range \[-4, 8\)"),
    ("row_num_splits", 2, 7, "plan: row 2 merges 7 slots, its request 2 has 2 splits"),
])
def test_set_plan_refuses_an_inconsistent_plan(field, index, value, msg):
    inp = _inputs()
    w = _wrapper(inp)
    plan = inp.plan("size:8")
    arr = getattr(plan, field).copy()
    arr[index] = value
    with pytest.raises(ValueError, match=msg):
        w.set_plan(dataclasses.replace(plan, **{field: arr}))


def test_run_refuses_a_block_table_narrower_than_the_plan(clean):
    inp, w, x, _ = clean
    with pytest.raises(ValueError, match="plan: reads 5 pages"):
        w.run(**dict(x, block_table=x["block_table"][:, :3]))


def test_a_new_plan_reading_past_the_block_table_is_refused_after_a_call_that_passed(clean):
    """run()'s guard of the last call that passed still compares the block table's width with the
    pages a new plan of the same batch and rows reads: the same tensors are refused once the plan
    reads past them."""
    inp, w, x, _ = clean
    bt = x["block_table"][:, :3]
    lens = np.minimum(inp.seq_lens, 3 * PAGE)
    w.plan(lens, query_start_loc=inp.query_start_loc)
    w.run(**dict(x, block_table=bt, seq_lens=torch.as_tensor(lens, dtype=torch.int32, device=DEVICE)))
    w.plan(inp.seq_lens, query_start_loc=inp.query_start_loc)
    with pytest.raises(ValueError, match="plan: reads 5 pages"):
        w.run(**dict(x, block_table=bt, seq_lens=torch.as_tensor(lens, dtype=torch.int32, device=DEVICE)))


def test_a_plan_of_another_batch_forgets_the_guard_of_the_last_call(clean):
    """A call that passed, then a plan of fewer requests: the same tensors are refused (the guard of the
    last call that passed held for the old plan's batch and rows only)."""
    inp, w, x, _ = clean
    w.run(**x)
    w.plan(inp.seq_lens[:2], query_start_loc=inp.query_start_loc[:3])
    with pytest.raises(ValueError, match=r"plan: made for 2 requests, block_table has shape \(3, 5\)"):
        w.run(**x)


# -- empty batches ------------------------------------------------------------------------------------

def test_empty_batch_and_no_query_rows_give_empty_outputs():
    w = DecodeWrapper(4, 2, 16, PAGE, dtype="float32", device=DEVICE)
    w.plan(np.zeros(0, np.int32))
    i32 = dict(dtype=torch.int32, device=DEVICE)
    q = torch.zeros(0, 4, 16, device=DEVICE)
    kc = torch.zeros(3, PAGE, 2, 16, device=DEVICE)
    out, lse = w.run(q, kc, kc, torch.zeros(0, 2, **i32), torch.zeros(0, **i32))
    assert out.shape == (0, 4, 16) and lse.shape == (0, 4)
    # requests without query rows (T = 0, B = 2)
    w.plan(np.array([5, 3], np.int32), q_lens=np.array([0, 0]))
    qsl = torch.zeros(3, **i32)
    bt = torch.tensor([[0, 1], [2, 0]], **i32)
    out, lse = w.run(q, kc, kc, bt, torch.tensor([5, 3], **i32), qsl)
    assert out.shape == (0, 4, 16)
    # an empty q whose strides are all zero (e.g. from an empty NumPy array) is accepted
    out, _ = w.run(torch.zeros(0, 4, 16, device=DEVICE).as_strided((0, 4, 16), (0, 0, 0)), kc, kc, bt,
                   torch.tensor([5, 3], **i32), qsl)
    assert out.shape == (0, 4, 16)


# -- soft cap accuracy ----------------------------------------------------------------------------------

@triton.jit
def _capped(S, OUT, cap, inv_cap, N: tl.constexpr):
    offs = tl.arange(0, N)
    s = tl.load(S + offs)
    tl.store(OUT + offs, cap * kernels._tanh(s * inv_cap))


@triton.jit
def _capped_old(S, OUT, cap, inv_cap, N: tl.constexpr):
    offs = tl.arange(0, N)
    x = tl.load(S + offs) * inv_cap
    tl.store(OUT + offs, cap * (1.0 - 2.0 / (tl.exp2(x * (2.0 * 1.4426950408889634)) + 1.0)))


def _cap_error(kernel, cap):
    rng = np.random.default_rng(0)
    s = np.concatenate([rng.standard_normal(400) * 30, np.geomspace(1e-6, 1e7, 112), -np.geomspace(1e-6, 1e7, 112),
                        np.array([0.25, -0.25, 0.2499999, 0.2500001]) * cap]).astype(np.float32)
    s = s[s != 0][:1024]
    n = triton.next_power_of_2(s.size)
    s = np.pad(s, (0, n - s.size), constant_values=1.0)
    st = torch.from_numpy(s).to(DEVICE)
    out = torch.empty_like(st)
    kernel[(1,)](st, out, float(cap), float(1.0 / cap), N=n)
    ref = cap * np.tanh(s.astype(np.float64) / cap)
    return float(np.max(np.abs(out.cpu().numpy().astype(np.float64) - ref) / np.abs(ref)))


# both branches of the select are computed: the unselected one may overflow (inf, never selected)
@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")
@pytest.mark.parametrize("cap", [1e-2, 1e-1, 1.0, 30.0, 1e3, 1e5, 1e6])
def test_soft_cap_is_accurate_for_every_cap(cap):
    assert _cap_error(_capped, cap) < 2e-6


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")
def test_the_previous_soft_cap_formula_was_not():
    assert _cap_error(_capped_old, 1e3) > 1e-5  # the cancellation the polynomial branch removes


def test_large_soft_cap_end_to_end():
    inp = _inputs(soft_cap=1e5, q_scale=3.0)
    w = _wrapper(inp)
    out, lse = w.run(**to_torch(inp, DEVICE), soft_cap=1e5)
    ro, rl = dense_attention(inp)
    np.testing.assert_allclose(lse.cpu().numpy(), rl, rtol=2e-6, atol=2e-6)
    acc = accuracy.check(out.cpu().numpy(), lse.cpu().numpy(), ro, rl, plain_attention(inp), inp.dtype)
    assert acc.passed, acc.reason


def test_set_plan_calls_the_shared_plan_check_where_it_exists():
    inp = _inputs()
    w = _wrapper(inp)
    plan = inp.plan("size:8")
    seen = {}

    class WithValidate(type(plan)):
        def validate(self, seq_lens=None, *, num_kv_heads=None, coverage=True):
            seen.update(num_kv_heads=num_kv_heads, coverage=coverage)
            return self

    w.set_plan(WithValidate(**{f.name: getattr(plan, f.name) for f in dataclasses.fields(plan) if f.init}))
    assert seen == {"num_kv_heads": 2, "coverage": False}
