"""Hostile inputs to the calls that change state (docs/conventions.md, "Calls that change state").

The companion of ``tests/test_hostile_inputs.py`` for calls that write: each class of failure is a
table of cases; every case expects a clear error naming the argument (matched on the message) or
the correct result, and a refused call must leave the state it would have changed byte-identical
(the cache, the wrapper's plan and buffers, a graph decoder's lengths, plans and buffers).

Classes and entry points:

* cache appends: ``flash_attn_with_kvcache`` with new ``k``/``v`` (stock torch, the Triton kernels,
  the Ascend operator's entry; the refusals run before any kernel, so they need no NPU);
* plans used for something else: ``cuda_ref.DecodeWrapper`` and ``AscendDecodeWrapper`` ``run()``;
* refused plans: ``plan()`` / ``set_plan()`` of both wrappers, ``GraphDecoder.refresh``;
* threads: both wrappers from a second thread;
* API hygiene: ``validate``, ``num_kv_heads=0``, ``splitkv plan --kv-bytes``, report files.
"""

from __future__ import annotations

import io
import os
import stat
import threading
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from splitkv_common import cli  # noqa: E402
from splitkv_common import flash_compat  # noqa: E402
from splitkv_common.guards import check_append_slots, check_validate  # noqa: E402
from splitkv_common.plan import PlanSpec, make_plan  # noqa: E402
from splitkv_common.reference import dense_attention  # noqa: E402
from splitkv_common.torch_eager import decode_attention as torch_decode  # noqa: E402

from test_hostile_inputs import HKV, HQ, NUM_PAGES, PAGE, D, _inputs, _torch_args, base  # noqa: E402

# ---------------------------------------------------------------------------------------------
# Snapshots: the bytes a refused call must leave as they were
# ---------------------------------------------------------------------------------------------


def _bytes(x) -> bytes:
    if isinstance(x, torch.Tensor):
        return x.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes() if x.numel() else b""
    if isinstance(x, np.ndarray):
        return x.tobytes()
    return repr(x).encode()


def snapshot(*tensors) -> list:
    return [_bytes(t) for t in tensors]


# ---------------------------------------------------------------------------------------------
# 1. Cache appends: flash_attn_with_kvcache(k=, v=) checks everything, then writes
# ---------------------------------------------------------------------------------------------

FLASH = {"torch": lambda: flash_compat.flash_attn_with_kvcache}


def _triton_fa():
    try:
        from cuda_ref.flash import flash_attn_with_kvcache
    except ImportError as e:
        pytest.skip(f"triton: {e}")
    return flash_attn_with_kvcache


def _ascend_fa():
    from ascend_ops.flash import flash_attn_with_kvcache

    return flash_attn_with_kvcache


FLASH.update(triton=_triton_fa, ascend=_ascend_fa)


@dataclass
class Append:
    """One call: the paged problem of ``base()`` (request 0: 6 tokens on pages 3, 5; request 1: 9 on
    1, 2, 7; request 2 empty) with one new token per request unless ``make`` says otherwise."""
    id: str
    make: object                    # () -> kwargs of flash_attn_with_kvcache (q, k_cache, v_cache, ...)
    expect: object                  # Refused(exc, match) or "ok" (checked against the float64 reference)
    entries: tuple = ("torch",)
    watch: object = None            # kwargs -> the tensors whose bytes a refusal keeps (default the caches)


@dataclass(frozen=True)
class Refused:
    exc: type | tuple
    match: str


def _paged(bt=None, seq=None, new=1, seed=0, dtype=torch.float32, k_dtype=None):
    p = base()
    g = torch.Generator().manual_seed(seed)
    bt = p.bt if bt is None else np.asarray(bt, np.int32)
    seq = p.seq if seq is None else np.asarray(seq, np.int32)
    B = bt.shape[0]
    kw = dict(q=torch.randn(B, 1, HQ, D, generator=g).to(dtype), k_cache=torch.from_numpy(p.k.copy()).to(dtype),
              v_cache=torch.from_numpy(p.v.copy()).to(dtype), block_table=torch.from_numpy(bt.copy()),
              cache_seqlens=torch.from_numpy(seq.copy()), causal=True)
    if new:
        kd = k_dtype or dtype
        kw["k"] = torch.randn(B, new, HKV, D, generator=g).to(kd)
        kw["v"] = torch.randn(B, new, HKV, D, generator=g).to(kd)
    return kw


def _contiguous(idx, seq, new=1, seed=1):
    g = torch.Generator().manual_seed(seed)
    B = len(idx)
    kw = dict(q=torch.randn(B, 1, HQ, D, generator=g), k_cache=torch.randn(3, 16, HKV, D, generator=g),
              v_cache=torch.randn(3, 16, HKV, D, generator=g), cache_batch_idx=torch.tensor(idx, dtype=torch.int32),
              cache_seqlens=torch.tensor(seq, dtype=torch.int32), causal=True)
    if new:
        kw["k"], kw["v"] = torch.randn(B, new, HKV, D, generator=g), torch.randn(B, new, HKV, D, generator=g)
    return kw


def _expanded():
    kw = _contiguous([0, 1, 2], [4, 6, 2])
    kw["k_cache"] = kw["k_cache"][:1].expand(3, -1, -1, -1)
    return kw


def _same_tensor():
    kw = _paged()
    kw["v_cache"] = kw["k_cache"]
    return kw


def _overlapping_views():
    kw = _paged()
    buf = torch.randn(NUM_PAGES + 1, PAGE, HKV, D)
    kw["k_cache"], kw["v_cache"] = buf[:NUM_PAGES], buf[1:]
    kw["buf"] = buf
    return kw


def _interleaved(layout):
    """k and v as views of one buffer that do not overlap: FlashInfer's ``[P, 2, page, H, D]``
    (``kv[:, 0]``, ``kv[:, 1]``) or vLLM's ``[2, P, page, H, D]`` (``kv[0]``, ``kv[1]``)."""
    def make():
        kw = _paged()
        if layout == "flashinfer":
            kv = torch.stack([kw["k_cache"], kw["v_cache"]], dim=1)
            kw["k_cache"], kw["v_cache"] = kv[:, 0], kv[:, 1]
        else:
            kv = torch.stack([kw["k_cache"], kw["v_cache"]])
            kw["k_cache"], kw["v_cache"] = kv[0], kv[1]
        return kw
    return make


def _with(**over):
    def make():
        kw = _paged()
        for k, v in over.items():
            kw[k] = v(kw) if callable(v) else v
        return kw
    return make


BT = r"^block_table: "
ALL_FA = ("torch", "triton", "ascend")

APPENDS = [
    # --- slots written twice --------------------------------------------------------------------
    Append("duplicate-block-table-row", lambda: _paged(bt=[[3, 5, 0, 0], [3, 5, 0, 0], [0, 0, 0, 0]], seq=[6, 6, 0]),
           Refused(ValueError, BT + "request 0 .*and request 1 .*would both write page 5, slot 2"), ALL_FA),
    Append("two-empty-rows-on-one-page", lambda: _paged(bt=[[3, 5, 0, 0], [4, 0, 0, 0], [4, 0, 0, 0]], seq=[6, 0, 0]),
           Refused(ValueError, BT + "request 1 .*and request 2 .*would both write page 4, slot 0")),
    Append("own-row-aliased-new-tokens", lambda: _paged(bt=[[3, 3, 0, 0], [1, 2, 7, 0], [4, 6, 8, 9]],
                                                        seq=[0, 0, 0], new=5),
           Refused(ValueError, BT + r"request 0 \(new tokens 0 and 4\) would both write page 3, slot 0")),
    Append("cache-batch-idx-duplicate-empty", lambda: _contiguous([1, 1, 2], [0, 0, 3]),
           Refused(ValueError, r"^cache_batch_idx: request 0 .*and request 1 .*would both write page 1, slot 0"),
           ALL_FA),
    Append("expanded-cache", _expanded, Refused(ValueError, r"^k_cache: its elements overlap in memory"), ALL_FA),
    Append("k-v-cache-same-tensor", _same_tensor, Refused(ValueError, r"^k_cache, v_cache: share memory")),
    Append("k-v-cache-overlapping-views", _overlapping_views, Refused(ValueError, r"^k_cache, v_cache: share memory"),
           watch=lambda kw: [kw["buf"]]),
    # --- a page another request sees below its length ------------------------------------------
    Append("append-into-shared-page", lambda: _paged(bt=[[3, 5, 0, 0], [3, 5, 7, 0], [0, 0, 0, 0]]),
           Refused(ValueError, BT + "request 0 would write new tokens into page 5 .*request 1 sees it below its "
                   "length"),
           ALL_FA),
    Append("append-into-other-request-history", lambda: _paged(bt=[[3, 5, 0, 0], [1, 2, 7, 0], [2, 0, 0, 0]],
                                                               seq=[6, 9, 1]),
           Refused(ValueError, BT + "request 2 would write new tokens into page 2 .*request 1 sees it below")),
    Append("own-row-aliased-history", lambda: _paged(bt=[[3, 3, 0, 0], [1, 2, 7, 0], [0, 0, 0, 0]]),
           Refused(ValueError, BT + "request 0 would write new tokens into page 3 .*the same request also maps it")),
    Append("cache-batch-idx-duplicate-history", lambda: _contiguous([0, 0, 1], [4, 6, 2]),
           Refused(ValueError, r"^cache_batch_idx: request \d would write new tokens into page 0 .*sees it below")),
    # --- any other refusal comes before the write ----------------------------------------------
    Append("q-int32-with-new-tokens", _with(q=lambda kw: kw["q"].to(torch.int32)), Refused(TypeError, r"^q: dtype")),
    Append("k-float64-into-float32", lambda: _paged(k_dtype=torch.float64), Refused(TypeError, r"^k: dtype")),
    Append("k-not-a-tensor", _with(k=lambda kw: kw["k"].numpy()), Refused(TypeError, r"^k, v: must be tensors")),
    Append("new-token-past-capacity", lambda: _paged(seq=[6, 16, 0]), Refused(ValueError, r"^cache_seqlens: request 1"),
           ALL_FA),
    Append("new-token-on-page-id-minus-1",
           lambda: _paged(bt=[[3, -1, 0, 0], [1, 2, 7, 0], [0, 0, 0, 0]], seq=[4, 9, 0]),
           Refused(ValueError, r"^block_table: entry \[0, 1\] = -1")),
    Append("scale-nan-with-new-tokens", _with(softmax_scale=float("nan")), Refused(ValueError, r"^softmax_scale:")),
    Append("window-minus-2-with-new-tokens", _with(window_size=(-2, 0)), Refused(ValueError, r"^window_size:")),
    # --- legal: correct result -------------------------------------------------------------------
    Append("prefix-shared-full-page", lambda: _paged(bt=[[3, 5, 0, 0], [3, 2, 7, 0], [0, 0, 0, 0]]), "ok"),
    Append("cache-batch-idx-duplicate-read-only", lambda: _contiguous([0, 0, 1], [4, 6, 2], new=0), "ok"),
    Append("kv-views-flashinfer-layout", _interleaved("flashinfer"), "ok"),
    Append("kv-views-vllm-layout", _interleaved("vllm"), "ok"),
    Append("null-block-append-of-empty-request", lambda: _paged(), "ok"),
]


def _expected(kw) -> np.ndarray:
    """FlashAttention's result in float64 from the call's own arguments (the new tokens appended to a
    copy of the cache; causal, one query row each)."""
    kc, vc = kw["k_cache"].double().clone(), kw["v_cache"].double().clone()
    B = kw["q"].shape[0]
    if "block_table" in kw:
        bt = kw["block_table"].long().numpy()
        page = kc.shape[1]
    else:
        bt = kw["cache_batch_idx"].long().numpy()[:, None]
        page = kc.shape[1]
    L = kw["cache_seqlens"].long().numpy().copy()
    if "k" in kw:
        for b in range(B):
            for j in range(kw["k"].shape[1]):
                pos = L[b] + j
                kc[bt[b, pos // page], pos % page] = kw["k"][b, j].double()
                vc[bt[b, pos // page], pos % page] = kw["v"][b, j].double()
        L = L + kw["k"].shape[1]
    out = np.zeros((B, HQ, D))
    q = kw["q"][:, 0].double()
    for b in range(B):
        if L[b] == 0:
            continue
        ks = torch.stack([kc[bt[b, p // page], p % page] for p in range(L[b])])   # [L, Hkv, D]
        vs = torch.stack([vc[bt[b, p // page], p % page] for p in range(L[b])])
        for h in range(HQ):
            s = ks[:, h // (HQ // HKV)] @ q[b, h] * D ** -0.5
            w = torch.softmax(s, 0)
            out[b, h] = (w @ vs[:, h // (HQ // HKV)]).numpy()
    return out


def _append_params():
    return [pytest.param(c, e, id=f"{c.id}-{e}") for c in APPENDS for e in c.entries]


@pytest.mark.parametrize("case, entry", _append_params())
def test_cache_append_all_or_nothing(case: Append, entry: str):
    kw = case.make()
    fa = FLASH[entry]()
    watched = case.watch(kw) if case.watch else [kw["k_cache"], kw["v_cache"]]
    kw.pop("buf", None)
    before = snapshot(*watched)
    if isinstance(case.expect, Refused):
        with pytest.raises(case.expect.exc, match=case.expect.match):
            fa(**kw)
        assert snapshot(*watched) == before, "a refused call wrote into the cache"
        return
    ref = _expected(kw)
    out = fa(**kw)
    np.testing.assert_allclose(out[:, 0].double().numpy(), ref, atol=2e-5)


def test_cache_append_restored_when_the_decode_fails_after_the_write():
    """The decode after the write fails (a backend error): the written slots get their old bytes back."""
    def failing(*a, **k):
        raise RuntimeError("backend failed")

    fa = flash_compat.make_flash_attn_with_kvcache(failing, "a failing backend")
    kw = _paged()
    before = snapshot(kw["k_cache"], kw["v_cache"])
    with pytest.raises(RuntimeError, match="backend failed"):
        fa(**kw)
    assert snapshot(kw["k_cache"], kw["v_cache"]) == before


SLOT_RULES = [
    # (id, block_table, lengths, new, page, match or None)
    ("distinct", [[0, 1], [2, 3]], [3, 5], 1, 4, None),
    ("prefix-shared-full-pages", [[0, 1], [0, 2]], [5, 6], 2, 4, None),
    ("partial-page-shared", [[0, 1], [0, 1]], [5, 6], 1, 4, r"request \d would write new tokens into page 1 .*sees it"),
    ("crossing-into-shared", [[0, 1], [5, 1]], [4, 6], 1, 4,
     "request 0 would write new tokens into page 1 .*request 1 sees it"),
    ("zero-new", [[0, 0], [0, 0]], [3, 3], 0, 4, None),
    ("empty-batch", np.zeros((0, 2)), [], 1, 4, None),
]


@pytest.mark.parametrize("bt, lengths, new, page, match", [c[1:] for c in SLOT_RULES], ids=[c[0] for c in SLOT_RULES])
def test_append_slot_rule(bt, lengths, new, page, match):
    bt = np.asarray(bt, np.int64).reshape(len(lengths), -1) if len(lengths) else np.zeros((0, 2), np.int64)
    if match is None:
        check_append_slots(bt, np.asarray(lengths, np.int64), new, page)
    else:
        with pytest.raises(ValueError, match="^block_table: " + match):
            check_append_slots(bt, np.asarray(lengths, np.int64), new, page)


# ---------------------------------------------------------------------------------------------
# 2. A plan runs only on what it was made for (wrappers' run())
# ---------------------------------------------------------------------------------------------

def _cuda_wrapper(device="cpu", **kw):
    pytest.importorskip("triton")
    from cuda_ref.wrapper import DecodeWrapper

    return DecodeWrapper(HQ, HKV, D, PAGE, dtype=torch.float32, device=device, policy="size:4", **kw)


def _ascend_wrapper(**kw):
    from ascend_ops.wrapper import AscendDecodeWrapper

    return AscendDecodeWrapper(HQ, HKV, D, PAGE, dtype=torch.float32, device="cpu", policy="size:4", **kw)


def _batch(kind="single"):
    p = base(kind)
    return p, _torch_args(p)


def _plan_cuda(w, p, **kw):
    w.plan(p.seq, query_start_loc=p.qsl, **kw)


def _plan_ascend(w, p, **kw):
    w.plan(p.seq, query_start_loc=p.qsl, max_pages=p.bt.shape[1], num_pages=NUM_PAGES, **kw)


def _run_cuda(w, a, **kw):
    return w.run(a["q"], a["k_cache"], a["v_cache"], a["block_table"], a["seq_lens"], a.get("query_start_loc"), **kw)


def _run_ascend(w, a, **kw):
    return w.run(a["q"], a["k_cache"], a["v_cache"], a["block_table"], seq_lens=a["seq_lens"],
                 query_start_loc=a.get("query_start_loc"), **kw)


WRAPPERS = {"cuda": (_cuda_wrapper, _plan_cuda, _run_cuda), "ascend": (_ascend_wrapper, _plan_ascend, _run_ascend)}


@dataclass
class Mismatch:
    id: str
    plan: dict                      # plan() keywords
    run: dict                       # run() keywords
    match: str
    kind: str = "single"            # the planned batch (base(kind))
    run_kind: str | None = None     # the batch run (default: the planned one)
    entries: tuple = ("cuda", "ascend")
    drop_qsl: bool = False


MISMATCHES = [
    Mismatch("window-planned-run-without", dict(window_left=5), dict(window_left=-1),
             r"^window_left: run with -1, (wider than the plan's window|the plan was made for) 5"),
    Mismatch("window-planned-run-without-none", dict(window_left=5), dict(window_left=None),
             r"^window_left: run with None", entries=("cuda",)),   # ascend: None means the planned window
    Mismatch("window-planned-run-without-validate", dict(window_left=5), dict(window_left=-1, validate=True),
             r"^window_left: run with -1"),
    Mismatch("window-planned-run-wider", dict(window_left=2), dict(window_left=5), r"^window_left: run with 5"),
    Mismatch("window-planned-run-narrower", dict(window_left=5), dict(window_left=2),
             r"^window_left: run with 2, the plan was made for 5", entries=("ascend",)),   # triton: masked, legal
    Mismatch("no-window-planned-run-with", {}, dict(window_left=2),
             r"^window_left: run with 2, the plan was made for no window", entries=("ascend",)),
    Mismatch("q-layout-default-qsl", {}, {}, r"^query_start_loc: required", kind="multi3", drop_qsl=True,
             entries=("cuda",)),
    Mismatch("q-layout-other-qsl-validate", {}, dict(validate=True), r"query_start_loc", kind="multi3",
             run_kind="single"),
    Mismatch("lengths-grew-validate", {}, dict(validate=True),
             r"^plan: covers 6 KV tokens of request 0, whose seq_len is 7",
             run_kind="longer"),
    Mismatch("rows-differ", {}, {}, r"^plan: made for 3 query rows", run_kind="rows4"),
]


def _kind(kind: str):
    """``multi3``: request 0 has two rows, request 1 one, request 2 none (3 rows, 3 requests: the same
    sizes as one row each); ``longer``: request 0 has 7 tokens."""
    if kind == "multi3":
        p = base()
        p.qsl = np.array([0, 2, 3, 3], np.int32)
        return p
    if kind == "rows4":
        p = base()
        p.qsl = np.array([0, 2, 3, 4], np.int32)
        p.q = np.concatenate([p.q, p.q[:1]])
        return p
    if kind == "longer":
        p = base()
        p.seq = np.array([7, 9, 0], np.int32)
        return p
    return base(kind)


@pytest.mark.parametrize("case, entry", [pytest.param(c, e, id=f"{c.id}-{e}") for c in MISMATCHES for e in c.entries])
def test_run_refuses_what_the_plan_was_not_made_for(case: Mismatch, entry: str):
    make, plan, run = WRAPPERS[entry]
    w = make()
    plan(w, _kind(case.kind), **case.plan)
    a = _torch_args(_kind(case.run_kind or case.kind))
    if case.drop_qsl:
        a.pop("query_start_loc")
    out_before = snapshot(*w._buffers.values())
    with pytest.raises(ValueError, match=case.match):
        run(w, a, **case.run)
    assert snapshot(*w._buffers.values()) == out_before, "a refused run() wrote"


@pytest.mark.parametrize("entry, planned, run", [("ascend", 2, None), ("ascend", 2, 2), ("ascend", -1, None),
                                                 ("cuda", None, 2)],
                         ids=["ascend-none-means-planned", "ascend-same", "ascend-minus-1-planned",
                              "triton-narrower-than-no-window"])
def test_run_with_a_window_the_plan_covers_is_correct(entry, planned, run):
    """The planned window, or on the Triton wrapper a narrower one (the plan covers it and the
    kernels mask the rest), gives the reference's result."""
    make, plan, run_ = WRAPPERS[entry]
    gpu = entry == "cuda" and torch.cuda.is_available()  # with a GPU the kernels run there, not in the interpreter
    w = make(device="cuda") if gpu else make()
    p, a = _batch()
    plan(w, p, window_left=planned)
    if gpu:
        a = {k: (v.cuda() if torch.is_tensor(v) else v) for k, v in a.items()}
    out, _ = run_(w, a, window_left=run)
    used = planned if run is None else run
    p.window_left = None if used is None or used < 0 else used
    np.testing.assert_allclose(out.cpu().numpy(), dense_attention(_inputs(p))[0], atol=2e-5)


# ---------------------------------------------------------------------------------------------
# 3. A refused plan() / set_plan() / refresh leaves the previous plan in use
# ---------------------------------------------------------------------------------------------

BAD_PLANS = [
    ("negative-length", dict(seq_lens=np.array([6, -1, 0])), r"^seq_lens"),
    ("length-2-pow-40", dict(seq_lens=np.array([6, 2**40, 0])), r"^seq_lens"),
    ("window-minus-2", dict(window_left=-2), r"^window_left"),
    ("qsl-not-from-0", dict(query_start_loc=np.array([1, 2, 3, 3])), r"^query_start_loc"),
    ("qsl-wrong-length", dict(query_start_loc=np.array([0, 1, 2])), r"^query_start_loc|^plan|^seq_lens"),
]


def _cuda_state(w):
    return (w.host_plan, w._plan_window, w._plan_one_row, w._plan_sig, _bytes(w.dplan.data))


def _ascend_state(w):
    return (w.host_plan, w._attn, w._pages, _bytes(w._buffers["meta"]), w._seq_lens.tobytes())


@pytest.mark.parametrize("entry", ["cuda", "ascend"])
@pytest.mark.parametrize("change, match", [c[1:] for c in BAD_PLANS], ids=[c[0] for c in BAD_PLANS])
def test_refused_plan_leaves_the_previous_plan(entry, change, match):
    make, _, _ = WRAPPERS[entry]
    w = make()
    p = base()
    args = dict(seq_lens=p.seq, query_start_loc=p.qsl)
    extra = dict(max_pages=4, num_pages=NUM_PAGES) if entry == "ascend" else {}
    w.plan(**args, window_left=2, **extra)
    state = _cuda_state if entry == "cuda" else _ascend_state
    before = state(w)
    with pytest.raises(ValueError, match=match):
        w.plan(**{**args, **change}, **extra)
    assert state(w) == before


@pytest.mark.parametrize("entry", ["cuda", "ascend"])
def test_refused_set_plan_leaves_the_previous_plan(entry):
    make, _, _ = WRAPPERS[entry]
    w = make()
    p = base()
    extra = dict(max_pages=4, num_pages=NUM_PAGES) if entry == "ascend" else {}
    w.plan(p.seq, query_start_loc=p.qsl, **extra)
    state = _cuda_state if entry == "cuda" else _ascend_state
    before = state(w)
    other = make_plan(p.seq, num_kv_heads=HKV + 2, page_size=PAGE)
    with pytest.raises(ValueError, match="^plan: made for Hkv=4"):
        w.set_plan(other)
    with pytest.raises(TypeError, match="^plan: expected a splitkv_common.plan.Plan"):
        w.set_plan("plan")
    assert state(w) == before


def test_ascend_graph_stable_plan_refused_by_its_tiling_keeps_the_previous_plan():
    """A graph-stable plan whose buffers would change size is refused by the tiling: the wrapper keeps
    the previous plan, tiling and buffers, and a run gives the previous result bit for bit."""
    w = _ascend_wrapper(graph_stable=True, max_splits=2, max_work_items=64)
    p, a = _batch()
    _plan_ascend(w, p)
    out0 = _run_ascend(w, a)[0].clone()
    before = _ascend_state(w)
    with pytest.raises(ValueError, match="^plan: .*changed .*under a graph-stable plan"):   # 4 rows
        w.plan(np.array([6, 9, 0]), query_start_loc=np.array([0, 2, 3, 4]))
    assert _ascend_state(w) == before
    assert torch.equal(_run_ascend(w, a)[0], out0)


def _graph(route="ascend", max_work_items=None):
    from splitkv_vllm.graph import GraphDecoder

    p = base()
    dec = GraphDecoder(num_tokens=3, max_reqs=4, max_splits=2, route=route, policy="size:4",
                       max_work_items=max_work_items)
    key = GraphDecoder.key(num_q_heads=HQ, num_kv_heads=HKV, head_dim=D, page_size=PAGE, dtype=torch.float32,
                           kv_dtype=torch.float32, scale=D ** -0.5, soft_cap=None, window_left=None)
    k = torch.from_numpy(p.k.copy())
    dec.add(key, k_cache=k, max_pages=4)
    dec.refresh(p.seq, p.qsl, torch.from_numpy(p.bt.copy()))
    return dec, key, p


def _graph_state(dec):
    w = next(iter(dec.wrappers.values()))
    bufs = [dec.block_table] + ([dec.seq_lens, dec.query_start_loc] if dec.seq_lens is not None else [])
    dplan = getattr(w, "dplan", None)   # the Triton route's device plan
    return (repr(dec._lengths), list(dec.plans.values()), w.host_plan, dec.max_q_len,
            snapshot(*bufs, *[b for b in w._buffers.values()], *([dplan.data] if dplan is not None else [])))


REFRESH_BAD = [
    ("block-table-width", lambda p: dict(block_table=torch.zeros(3, 5, dtype=torch.int32)), r"^block_table: 5 pages"),
    ("block-table-rows", lambda p: dict(block_table=torch.zeros(2, 4, dtype=torch.int32)), r"^block_table: 2 rows"),
    ("block-table-int64", lambda p: dict(block_table=torch.zeros(3, 4, dtype=torch.int64)), r"^block_table: dtype"),
    ("block-table-rank-1", lambda p: dict(block_table=torch.zeros(4, dtype=torch.int32)), r"^block_table: must be"),
    ("over-max-reqs", lambda p: dict(seq_lens=np.ones(5, np.int32), query_start_loc=np.array([0, 1, 2, 3, 3, 3]),
                                     block_table=torch.zeros(5, 4, dtype=torch.int32)), r"^max_reqs"),
    ("negative-length", lambda p: dict(seq_lens=np.array([6, -1, 0])), r"^seq_lens"),
    ("rows-not-num-tokens", lambda p: dict(query_start_loc=np.array([0, 1, 2, 2])), r"^query_start_loc"),
    ("over-max-work-items", lambda p: dict(seq_lens=np.array([16, 16, 16]),
                                           block_table=torch.tensor([[1, 2, 3, 4]] * 3, dtype=torch.int32)),
     r"^max_work_items: the batch needs 14 work items"),
]


@pytest.mark.parametrize("route", ["ascend", "triton"])
@pytest.mark.parametrize("change, match", [c[1:] for c in REFRESH_BAD], ids=[c[0] for c in REFRESH_BAD])
def test_graph_refresh_refused_keeps_the_previous_step(route, change, match):
    """The state is byte-identical after a refused refresh; on the Ascend route (the op's CPU kernel)
    the next run also gives the previous step's result bit for bit (the Triton route's run is left to
    the Triton tests: the interpreter is slow)."""
    if route == "triton":
        pytest.importorskip("triton")
    dec, key, p = _graph(route, max_work_items=12 if "max_work_items" in match else None)
    a = _torch_args(p)
    out0 = dec.run(key, a["q"], a["k_cache"], a["v_cache"])[0].clone() if route == "ascend" else None
    before = _graph_state(dec)
    args = dict(seq_lens=p.seq, query_start_loc=p.qsl, block_table=torch.from_numpy(p.bt.copy()))
    args.update(change(p))
    with pytest.raises((ValueError, TypeError), match=match):
        dec.refresh(args["seq_lens"], args["query_start_loc"], args["block_table"])
    assert _graph_state(dec) == before
    if out0 is not None:
        assert torch.equal(dec.run(key, a["q"], a["k_cache"], a["v_cache"])[0], out0)


# ---------------------------------------------------------------------------------------------
# 4. A wrapper is single-threaded
# ---------------------------------------------------------------------------------------------

def _in_thread(fn):
    box = {}

    def target():
        try:
            box["result"] = fn()
        except BaseException as e:   # noqa: BLE001 - handed to the test thread
            box["error"] = e

    t = threading.Thread(target=target)
    t.start()
    t.join()
    return box


@pytest.mark.parametrize("entry", ["cuda", "ascend"])
@pytest.mark.parametrize("call", ["run", "plan"])
def test_wrapper_used_from_a_second_thread_is_refused(entry, call):
    make, plan, run = WRAPPERS[entry]
    w = make()
    p, a = _batch()
    plan(w, p)
    before = snapshot(*w._buffers.values())
    box = _in_thread(lambda: run(w, a) if call == "run" else plan(w, p))
    assert isinstance(box.get("error"), RuntimeError) and "single-threaded" in str(box["error"])
    assert snapshot(*w._buffers.values()) == before
    w.release_thread()   # handed over explicitly: the other thread may plan (and then owns it)
    box = _in_thread(lambda: plan(w, p))
    assert "error" not in box, box


# ---------------------------------------------------------------------------------------------
# 5. API hygiene
# ---------------------------------------------------------------------------------------------

BAD_VALIDATE = ["yes", 1, 0, None, np.bool_(True), "True"]


def _validate_entries():
    def torch_eager(v):
        a = _torch_args(base())
        plan = make_plan(base().seq, num_kv_heads=HKV, num_q_heads=HQ, head_dim=D, page_size=PAGE, policy="size:4")
        torch_decode(**a, plan=plan, validate=v)

    def wrapper_run(entry):
        def call(v):
            make, plan, run = WRAPPERS[entry]
            w = make()
            plan(w, base())
            run(w, _torch_args(base()), validate=v)
        return call

    def wrapper_set_plan(entry):
        def call(v):
            make, _, _ = WRAPPERS[entry]
            w = make()
            w.set_plan(make_plan(base().seq, num_kv_heads=HKV, page_size=PAGE), validate=v)
        return call

    return {"torch_eager.decode_attention": torch_eager, "DecodeWrapper.run": wrapper_run("cuda"),
            "AscendDecodeWrapper.run": wrapper_run("ascend"), "DecodeWrapper.set_plan": wrapper_set_plan("cuda"),
            "AscendDecodeWrapper.set_plan": wrapper_set_plan("ascend")}


@pytest.mark.parametrize("value", BAD_VALIDATE, ids=[repr(v) for v in BAD_VALIDATE])
@pytest.mark.parametrize("entry", list(_validate_entries()))
def test_validate_takes_only_true_false_auto(entry, value):
    with pytest.raises(ValueError, match="^validate: must be True"):
        _validate_entries()[entry](value)


def test_validate_auto_and_bools_accepted():
    assert check_validate(True) is True and check_validate(False) is False and check_validate("auto") == "auto"
    with pytest.raises(ValueError, match="^validate: must be True or False"):
        check_validate("auto", allow_auto=False)


@pytest.mark.parametrize("entry", ["DecodeWrapper", "AscendDecodeWrapper", "make_plan", "PlanSpec", "check_gqa"])
def test_num_kv_heads_zero_is_a_clear_error(entry):
    from splitkv_common.validation import check_gqa

    calls = {
        "DecodeWrapper": lambda: __import__("cuda_ref.wrapper", fromlist=["DecodeWrapper"]).DecodeWrapper(
            HQ, 0, D, PAGE, device="cpu"),
        "AscendDecodeWrapper": lambda: __import__("ascend_ops.wrapper", fromlist=["AscendDecodeWrapper"])
        .AscendDecodeWrapper(HQ, 0, D, PAGE, dtype=torch.float32, device="cpu"),
        "make_plan": lambda: make_plan(np.array([5]), num_kv_heads=0, page_size=PAGE),
        "PlanSpec": lambda: PlanSpec(HQ, 0, D, PAGE).make([5]),
        "check_gqa": lambda: check_gqa(HQ, 0),
    }
    if entry == "DecodeWrapper":
        pytest.importorskip("triton")
    with pytest.raises(ValueError, match="^num_kv_heads: must be"):
        calls[entry]()


def _cli(*argv):
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        try:
            code = cli.main(list(argv))
        except SystemExit as e:
            code = e.code
    return code, out.getvalue(), err.getvalue()


@pytest.mark.parametrize("kv_bytes", ["0", "-1", "3", "8"])
def test_cli_plan_refuses_kv_bytes(kv_bytes):
    code, out, err = _cli("plan", "--seq-lens", "100", "--kv-bytes", kv_bytes)
    assert code == 2 and out == "" and err.startswith("error: --kv-bytes:")


def test_report_file_gets_the_umask_mode(tmp_path):
    from splitkv_common.parity.harness import ParityReport

    old = os.umask(0o022)
    try:
        ParityReport().write(str(tmp_path / "r.md"))
        os.umask(0o027)
        ParityReport().write(str(tmp_path / "s.json"))
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(tmp_path / "r.md").st_mode) == 0o644
    assert stat.S_IMODE(os.stat(tmp_path / "s.json").st_mode) == 0o640


REPORT_PATHS = [
    # (id, argv of --report paths (relative to tmp_path), error text)
    ("same-file-through-a-link", ["r.md", "link/../r.md"], None),
    ("name-too-long", ["x" * 300 + ".md"], "longer than"),
    ("dir-through-link-dotdot-missing", ["link/../missing/r.md"], "does not exist"),
    ("dir-is-a-file", ["keep.md/r.md"], "does not exist"),
    ("link-to-a-directory-with-force", ["dlink.md"], "not a regular file"),
]


@pytest.mark.parametrize("paths, text", [c[1:] for c in REPORT_PATHS], ids=[c[0] for c in REPORT_PATHS])
def test_cli_parity_report_paths_fully_checked_before_the_run(tmp_path, monkeypatch, paths, text):
    (tmp_path / "keep.md").write_text("precious")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "deeper").mkdir()
    os.symlink(tmp_path / "sub" / "deeper", tmp_path / "link")   # link/.. is sub, not tmp_path
    os.symlink(tmp_path / "sub", tmp_path / "dlink.md")
    monkeypatch.chdir(tmp_path)
    if paths[0] == "r.md":
        paths = ["sub/r.md", "link/../r.md"]     # two spellings of sub/r.md
    listing = sorted(os.listdir(tmp_path)), sorted(os.listdir(tmp_path / "sub"))
    code, out, err = _cli("parity", "--backend", "numpy", "--cases", "basic/*", "--force",
                          *[a for p in paths for a in ("--report", p)])
    assert code == 2 and out == "" and err.startswith("error:")
    assert (text or "given twice") in err
    assert (sorted(os.listdir(tmp_path)), sorted(os.listdir(tmp_path / "sub"))) == listing
    assert (tmp_path / "keep.md").read_text() == "precious"


def test_report_through_a_link_lands_where_the_link_points(tmp_path, monkeypatch):
    from splitkv_common.parity.harness import ParityReport

    (tmp_path / "sub" / "deeper").mkdir(parents=True)
    os.symlink(tmp_path / "sub" / "deeper", tmp_path / "link")
    monkeypatch.chdir(tmp_path)
    ParityReport().write("link/../r.md")
    assert (tmp_path / "sub" / "r.md").exists() and not (tmp_path / "r.md").exists()
