"""Hostile inputs: no input may crash, corrupt memory or leak across requests (docs/conventions.md,
"Hostile inputs").

Each case is one bad (or adversarial but legal) input. It runs on every entry point that accepts it
and expects either a clear error naming the argument (matched on the message) or the documented
result: values a row cannot see never change it (bit-identical to a clean run), NaN or inf a row
can see makes exactly that row NaN, an empty batch gives empty outputs.

Entry points: the NumPy split path and float64 reference, the torch backend, ``flash_compat``,
the Ascend wrapper's CPU path (its checks, then the op's CPU kernel), the op itself, the ``ascend-sim``
twin and the Triton interpreter (a few cases each), both merges, the planner and the ``splitkv``
CLI, ``PlanSpec.check_shapes`` and ``Plan.validate``.
"""

from __future__ import annotations

import dataclasses
import io
import os
import time
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass, field, replace

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from splitkv_common import cli  # noqa: E402
from splitkv_common.flash_compat import flash_attn_with_kvcache  # noqa: E402
from splitkv_common.inputs import DecodeInputs  # noqa: E402
from splitkv_common.merge import merge_states  # noqa: E402
from splitkv_common.plan import PlanSpec, make_plan  # noqa: E402
from splitkv_common.reference import dense_attention, split_attention  # noqa: E402
from splitkv_common.torch_eager import decode_attention as torch_decode  # noqa: E402
from splitkv_common.torch_eager import merge_states as torch_merge  # noqa: E402
from splitkv_common import validation as V  # noqa: E402

HQ, HKV, D, PAGE, NUM_PAGES = 4, 2, 16, 4, 10
GROUP = HQ // HKV


# ---------------------------------------------------------------------------------------------
# The problem and its clean variants
# ---------------------------------------------------------------------------------------------

@dataclass
class Problem:
    q: object
    k: object
    v: object
    bt: object
    seq: object
    qsl: object = None
    scale: object = None
    soft_cap: object = None
    window_left: object = None
    k_scale: object = None
    v_scale: object = None
    k_offset: object = None
    v_offset: object = None
    meta: dict = field(default_factory=dict)  # torch-only tweaks: device, strides


def base(kind: str = "single") -> Problem:
    """Three requests over a paged cache whose page 0 is the null block no request owns.

    request 0: 6 tokens on pages 3, 5 (page 5 slots 2-3 unused); request 1: 9 tokens on pages
    1, 2, 7 (page 7 slots 1-3 unused); request 2: empty (its block-table row is all 0, the null
    block). Pages 4, 6, 8, 9 are unassigned. ``multi``: request 0 has two query rows (the causal
    tail), request 2 none. ``window``: window_left = 2. ``int8``: an int8 cache with scales.
    """
    rng = np.random.default_rng(7)
    qsl = {"multi": [0, 2, 3, 3]}.get(kind, [0, 1, 2, 3])
    T = qsl[-1]
    p = Problem(
        q=rng.standard_normal((T, HQ, D)).astype(np.float32),
        k=rng.standard_normal((NUM_PAGES, PAGE, HKV, D)).astype(np.float32),
        v=rng.standard_normal((NUM_PAGES, PAGE, HKV, D)).astype(np.float32),
        bt=np.array([[3, 5, 0, 0], [1, 2, 7, 0], [0, 0, 0, 0]], np.int32),
        seq=np.array([6, 9, 0], np.int32),
        qsl=np.array(qsl, np.int32),
        window_left=2 if kind == "window" else None,
        soft_cap=5.0 if kind == "softcap" else None,
    )
    if kind == "int8":
        p.k = rng.integers(-100, 100, p.k.shape).astype(np.int8)
        p.v = rng.integers(-100, 100, p.v.shape).astype(np.int8)
        p.k_scale = np.full(HKV, 0.02, np.float32)
        p.v_scale = np.full(HKV, 0.03, np.float32)
    return p


def poke(p: Problem, name: str, index, value) -> Problem:
    """A copy of ``p`` with ``getattr(p, name)[index] = value``."""
    a = np.array(getattr(p, name), copy=True)
    a[index] = value
    return replace(p, **{name: a})


# ---------------------------------------------------------------------------------------------
# Entry points: each takes a Problem and returns (out, lse) as NumPy arrays, or raises
# ---------------------------------------------------------------------------------------------

def _dtype_name(a) -> str:
    return np.dtype(a.dtype).name if isinstance(a, np.ndarray) else "float32"


def _inputs(p: Problem) -> DecodeInputs:
    return DecodeInputs(q=p.q, k_cache=p.k, v_cache=p.v, block_table=p.bt, seq_lens=p.seq, query_start_loc=p.qsl,
                        dtype=_dtype_name(p.q), scale=p.scale, soft_cap=p.soft_cap, window_left=p.window_left,
                        k_scale=p.k_scale, v_scale=p.v_scale, k_offset=p.k_offset, v_offset=p.v_offset)


def _t(x, device="cpu"):
    if x is None or isinstance(x, torch.Tensor):
        return x
    return torch.from_numpy(np.array(x, copy=True)).to(device)


def _torch_args(p: Problem) -> dict:
    a = dict(q=_t(p.q), k_cache=_t(p.k), v_cache=_t(p.v), block_table=_t(p.bt), seq_lens=_t(p.seq),
             query_start_loc=_t(p.qsl), k_scale=_t(p.k_scale), v_scale=_t(p.v_scale), k_offset=_t(p.k_offset),
             v_offset=_t(p.v_offset))
    for name, fn in p.meta.items():
        a[name] = fn(a[name])
    return a


def _host(x):
    return x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)


def _np(out, lse):
    return np.asarray(_host(out), np.float32), np.asarray(_host(lse), np.float32)


def run_numpy(p):
    return _np(*split_attention(_inputs(p)))


def run_reference(p):
    return _np(*dense_attention(_inputs(p)))


def _plan(p: Problem, device="cpu"):
    """What a caller does: plan from the host lengths with the model's config."""
    qsl = None if p.qsl is None else _host(p.qsl)
    return make_plan(_host(p.seq), num_kv_heads=HKV, num_q_heads=HQ, head_dim=D, page_size=PAGE,
                     query_start_loc=qsl, policy="size:4", device=device, window_left=p.window_left)


def run_torch(p):
    a = _torch_args(p)
    out, lse = torch_decode(**a, plan=_plan(p), scale=p.scale, soft_cap=p.soft_cap, window_left=p.window_left)
    return _np(out, lse)


def run_flash(p):
    a = _torch_args(p)
    q = a["q"]
    out, lse = flash_attn_with_kvcache(
        q[:, None] if q.dim() == 3 else q, a["k_cache"], a["v_cache"],
        cache_seqlens=a["seq_lens"], block_table=a["block_table"], softmax_scale=p.scale,
        causal=True, window_size=(-1 if p.window_left is None else p.window_left, -1),
        softcap=0.0 if p.soft_cap is None else p.soft_cap, num_splits=3, return_softmax_lse=True)
    return _np(out.reshape(-1, HQ, D), lse.permute(0, 2, 1).reshape(-1, HQ))


def _wrapper(p: Problem, a: dict, **kw):
    from ascend_ops.wrapper import AscendDecodeWrapper

    kv = torch.int8 if isinstance(p.k, np.ndarray) and p.k.dtype == np.int8 else torch.float32
    return AscendDecodeWrapper(HQ, HKV, D, PAGE, dtype=torch.float32, kv_dtype=kv, device="cpu", policy="size:4", **kw)


def run_ascend_wrapper(p):
    a = _torch_args(p)
    w = _wrapper(p, a)
    bt = a["block_table"]
    w.plan(_host(p.seq), query_start_loc=None if p.qsl is None else _host(p.qsl), window_left=p.window_left,
           scale=p.scale, soft_cap=p.soft_cap, max_pages=int(bt.shape[-1]), num_pages=int(a["k_cache"].shape[0]))
    # the value checks are run()'s (validate "auto": on a CPU); the op's CPU kernel checks its contract
    out, lse = w.run(a["q"], a["k_cache"], a["v_cache"], bt, k_scale=a["k_scale"], v_scale=a["v_scale"],
                     k_offset=a["k_offset"], v_offset=a["v_offset"], validate="auto")
    return _np(out, lse)


def run_ascend_sim(p):
    from ascend_ops.sim_backend import compiler_missing, run_twin

    if compiler_missing():
        pytest.skip(compiler_missing())
    inp = _inputs(p)
    return _np(*run_twin(inp, inp.plan("size:4", device="910b2")))


def run_triton(p):
    from splitkv_common.parity.registry import discover, unavailable_reason

    b = discover().get("triton")
    if b is None or unavailable_reason(b):
        pytest.skip("the triton backend is not available here")
    inp = _inputs(p)
    return _np(*b.run(inp, inp.plan("size:4", device=b.device)))


RUNNERS = {"numpy": run_numpy, "reference": run_reference, "torch": run_torch, "flash": run_flash,
           "ascend-wrapper": run_ascend_wrapper, "ascend-sim": run_ascend_sim, "triton": run_triton}
DEFAULT_ENTRIES = ("numpy", "reference", "torch", "flash", "ascend-wrapper")

# ---------------------------------------------------------------------------------------------
# Expectations
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Raises:
    exc: type | tuple
    match: str


@dataclass(frozen=True)
class SameAsClean:
    """Bit-identical to the clean run of ``base`` on the same entry point (NaN equal)."""
    base: str = "single"
    tol: float = 0.0


@dataclass(frozen=True)
class NaNRows:
    """Exactly the (row, query head) pairs listed are NaN (out and lse); the rest is bit-identical
    to the clean run of ``base``."""
    cells: tuple
    base: str = "single"


@dataclass(frozen=True)
class Empty:
    rows: int
    empty_rows: bool = False  # every row has no visible position: out 0, lse -inf


@dataclass(frozen=True)
class MatchesReference:
    tol: float = 2e-5


@dataclass
class Case:
    id: str
    make: object                      # () -> Problem
    expect: object
    entries: tuple = DEFAULT_ENTRIES
    override: dict = field(default_factory=dict)   # entry -> expectation
    xfail: dict = field(default_factory=dict)      # entry -> reason


def R(exc, match):
    return Raises(exc, match)


def _strided(x):
    big = torch.zeros(*x.shape[:-1], 2 * x.shape[-1], dtype=x.dtype)
    big[..., ::2] = x
    return big[..., ::2]


def _empty_batch():
    p = base()
    return replace(p, q=p.q[:0], bt=p.bt[:0], seq=p.seq[:0], qsl=p.qsl[:1])


def _no_rows():
    p = base()
    return replace(p, q=p.q[:0], qsl=np.zeros(4, np.int32))


def _shared_pages():
    p = base()
    bt = p.bt.copy()
    bt[1] = [3, 5, 7, 0]     # request 1's first two pages are request 0's (prefix caching)
    return replace(p, bt=bt)


def _int8(**kw):
    return lambda: replace(base("int8"), **kw)


NO_FLASH = ("numpy", "reference", "torch", "ascend-wrapper")      # flash_compat has no int8 / multi-row API
TORCH_ONLY = ("torch", "flash", "ascend-wrapper")
FLASH_SCALE = r"^(scale|softmax_scale):"
CAP = r"^(soft_cap|softcap):"
WINDOW = r"^(window_left|window_size):"
SEQ = r"^(seq_lens|cache_seqlens):"
INF, NAN = np.inf, np.nan

CASES = [
    # --- ranks and shapes -----------------------------------------------------------------------
    Case("q-rank-2", lambda: replace(base(), q=base().q[:, 0]), R(ValueError, r"^q:"), entries=NO_FLASH),
    Case("q-rank-4", lambda: replace(base(), q=base().q[None]), R(ValueError, r"^q:"), entries=NO_FLASH),
    Case("k-rank-3", lambda: replace(base(), k=base().k[0]), R(ValueError, r"^(k_cache|q, k_cache)")),
    Case("v-shape", lambda: replace(base(), v=base().v[:-1]), R(ValueError, r"^(v_cache|k_cache, v_cache|q, k_cache)")),
    Case("head-dim-mismatch", lambda: replace(base(), k=base().k[..., :8], v=base().v[..., :8]),
         R(ValueError, r"^(k_cache|q)")),
    Case("gqa-ratio", lambda: replace(base(), q=np.zeros((3, 3, D), np.float32)), R(ValueError, r"^q:")),
    Case("zero-heads", lambda: replace(base(), q=np.zeros((3, 0, D), np.float32)), R(ValueError, r"^q")),
    Case("block-table-rank-1", lambda: replace(base(), bt=base().bt[0]), R(ValueError, r"^block_table:"),
         entries=("numpy", "reference", "torch", "ascend-wrapper")),
    Case("seq-lens-length", lambda: replace(base(), seq=base().seq[:2]), R(ValueError, r"^(seq_lens|cache_seqlens|plan|query_start_loc)")),
    Case("qsl-length", lambda: replace(base(), qsl=base().qsl[:3]), R(ValueError, r"^query_start_loc:"), entries=NO_FLASH),
    Case("qsl-not-from-0", lambda: poke(base(), "qsl", 0, 1), R(ValueError, r"^query_start_loc:"), entries=NO_FLASH),
    Case("qsl-decreasing", lambda: replace(base(), qsl=np.array([0, 2, 1, 3], np.int32)),
         R(ValueError, r"^query_start_loc:"), entries=NO_FLASH),
    Case("qsl-past-T", lambda: poke(base(), "qsl", 3, 4), R(ValueError, r"^(query_start_loc|plan):"), entries=NO_FLASH),
    # --- dtypes ----------------------------------------------------------------------------------
    Case("q-int32", lambda: replace(base(), q=base().q.astype(np.int32)), R(TypeError, r"^q:"),
         override={"flash": R((TypeError, ValueError), r"^(q|k_cache)")}),
    Case("q-float64", lambda: replace(base(), q=base().q.astype(np.float64)), R(TypeError, r"^q:"),
         override={"flash": R((TypeError, ValueError), r"^(q|k_cache)")}),
    Case("k-float16", lambda: replace(base(), k=base().k.astype(np.float16), v=base().v.astype(np.float16)),
         R(TypeError, r"^k_cache"), entries=TORCH_ONLY),
    Case("v-dtype-differs", lambda: replace(base(), v=base().v.astype(np.float16)), R(TypeError, r"^(v_cache|k_cache)"),
         entries=TORCH_ONLY),
    Case("block-table-float", lambda: replace(base(), bt=base().bt.astype(np.float32)), R(TypeError, r"^block_table:")),
    Case("seq-lens-float", lambda: replace(base(), seq=base().seq.astype(np.float32)),
         R((TypeError, ValueError), r"^(seq_lens|cache_seqlens)"), entries=("numpy", "reference", "torch", "flash")),
    Case("int8-without-scales", _int8(k_scale=None, v_scale=None), R(ValueError, r"^k_scale"), entries=NO_FLASH),
    Case("int8-without-v-scale", _int8(v_scale=None), R(ValueError, r"^(v_scale|k_scale, v_scale)"), entries=NO_FLASH),
    Case("scale-with-float-cache", lambda: replace(base(), k_scale=np.ones(HKV, np.float32), v_scale=np.ones(HKV, np.float32)),
         R(ValueError, r"^k_scale"), entries=NO_FLASH),
    Case("k-scale-shape", _int8(k_scale=np.ones(HKV + 1, np.float32)), R(ValueError, r"^k_scale"), entries=NO_FLASH),
    Case("k-scale-float64", _int8(k_scale=np.ones(HKV)), R(TypeError, r"^k_scale"), entries=NO_FLASH),
    Case("k-offset-shape", _int8(k_offset=np.ones((HKV, D), np.float32)), R(ValueError, r"^k_offset"), entries=NO_FLASH),
    # --- devices and strides (torch entry points) -------------------------------------------------
    Case("q-on-meta", lambda: replace(base(), meta={"q": lambda x: x.to("meta")}), R(ValueError, r"device|on meta"),
         entries=TORCH_ONLY),
    Case("block-table-on-meta", lambda: replace(base(), meta={"block_table": lambda x: x.to("meta")}),
         R(ValueError, r"device|on meta"), entries=TORCH_ONLY),
    Case("q-strided", lambda: replace(base(), meta={"q": _strided}), SameAsClean(tol=1e-6), entries=TORCH_ONLY,
         override={"ascend-wrapper": R(ValueError, r"^q: must be contiguous")}),
    Case("k-cache-strided", lambda: replace(base(), meta={"k_cache": _strided}), SameAsClean(tol=1e-6),
         entries=TORCH_ONLY, override={"ascend-wrapper": R(ValueError, r"^k_cache: must be contiguous")}),
    Case("block-table-strided", lambda: replace(base(), meta={"block_table": lambda x: x.t().contiguous().t()}),
         SameAsClean(), entries=TORCH_ONLY, override={"ascend-wrapper": R(ValueError, r"^block_table: must be contiguous")}),
    # --- page ids ----------------------------------------------------------------------------------
    Case("page-id-minus-1", lambda: poke(base(), "bt", (1, 2), -1), R(ValueError, r"^block_table: entry \[1, 2\]"),
         entries=DEFAULT_ENTRIES + ("ascend-sim", "triton")),
    Case("page-id-num-pages", lambda: poke(base(), "bt", (0, 1), NUM_PAGES), R(ValueError, r"^block_table: entry \[0, 1\]"),
         entries=DEFAULT_ENTRIES + ("ascend-sim", "triton")),
    Case("page-id-very-negative", lambda: poke(base(), "bt", (0, 0), -(2**31)), R(ValueError, r"^block_table: entry")),
    Case("page-id-int64-huge", lambda: replace(base(), bt=poke(base(), "bt", (1, 0), 0).bt.astype(np.int64) + np.array(
        [[0, 0, 0, 0], [2**40, 0, 0, 0], [0, 0, 0, 0]])), R((ValueError, TypeError), r"^block_table:")),
    Case("page-id-minus-1-unused", lambda: poke(base(), "bt", (0, 3), -1), SameAsClean(),
         entries=DEFAULT_ENTRIES + ("ascend-sim",)),
    Case("page-id-garbage-empty-request", lambda: poke(base(), "bt", 2, [-7, 99, -1, 10**6]), SameAsClean(),
         entries=DEFAULT_ENTRIES + ("ascend-sim", "triton")),
    # --- lengths -----------------------------------------------------------------------------------
    Case("seq-over-capacity", lambda: poke(base(), "seq", 0, 17), R(ValueError, SEQ),
         entries=DEFAULT_ENTRIES + ("ascend-sim", "triton")),
    Case("seq-negative", lambda: poke(base(), "seq", 1, -1), R(ValueError, SEQ)),
    Case("seq-2-pow-31", lambda: replace(base(), seq=np.array([6, 2**31, 0], np.int64)), R(ValueError, SEQ)),
    Case("seq-2-pow-40", lambda: replace(base(), seq=np.array([6, 2**40, 0], np.int64)), R(ValueError, SEQ)),
    Case("seq-int64-min", lambda: replace(base(), seq=np.array([6, -(2**63), 0], np.int64)), R(ValueError, SEQ)),
    # --- scalars -----------------------------------------------------------------------------------
    Case("soft-cap-0", lambda: replace(base(), soft_cap=0.0), R(ValueError, CAP),
         entries=DEFAULT_ENTRIES + ("triton",), override={"flash": SameAsClean()}),
    Case("soft-cap-negative", lambda: replace(base(), soft_cap=-1.0), R(ValueError, CAP)),
    Case("soft-cap-nan", lambda: replace(base(), soft_cap=NAN), R(ValueError, CAP)),
    Case("soft-cap-inf", lambda: replace(base(), soft_cap=INF), R(ValueError, CAP)),
    Case("soft-cap-str", lambda: replace(base(), soft_cap="30"), R(ValueError, CAP)),
    Case("window-minus-2", lambda: replace(base(), window_left=-2), R(ValueError, WINDOW),
         entries=DEFAULT_ENTRIES + ("ascend-sim", "triton")),
    Case("window-minus-5", lambda: replace(base(), window_left=-5), R(ValueError, WINDOW)),
    Case("window-float", lambda: replace(base(), window_left=2.5), R(ValueError, WINDOW)),
    Case("window-bool", lambda: replace(base(), window_left=True), R(ValueError, WINDOW)),
    Case("scale-0", lambda: replace(base(), scale=0.0), R(ValueError, FLASH_SCALE)),
    Case("scale-nan", lambda: replace(base(), scale=NAN), R(ValueError, FLASH_SCALE)),
    Case("scale-negative", lambda: replace(base(), scale=-0.25), R(ValueError, FLASH_SCALE)),
    Case("scale-inf", lambda: replace(base(), scale=INF), R(ValueError, FLASH_SCALE)),
    Case("scale-str", lambda: replace(base(), scale="0.25"), R(ValueError, FLASH_SCALE)),
    # --- values no row may see: bit-identical to a clean run -----------------------------------
    Case("nan-null-block", lambda: poke(poke(base(), "k", 0, NAN), "v", 0, NAN), SameAsClean(),
         entries=DEFAULT_ENTRIES + ("ascend-sim", "triton")),
    Case("inf-null-block", lambda: poke(poke(base(), "k", 0, INF), "v", 0, -INF), SameAsClean(),
         entries=DEFAULT_ENTRIES + ("ascend-sim", "triton")),
    Case("nan-null-slot-0", lambda: poke(base(), "v", (0, 0), NAN), SameAsClean(),
         entries=DEFAULT_ENTRIES + ("ascend-sim",)),
    Case("nan-past-seq-len", lambda: poke(poke(base(), "k", (5, slice(2, 4)), NAN), "v", (5, slice(2, 4)), INF),
         SameAsClean(), entries=DEFAULT_ENTRIES + ("ascend-sim", "triton")),
    Case("nan-last-page-tail", lambda: poke(base(), "v", (7, slice(1, 4)), NAN), SameAsClean(),
         entries=DEFAULT_ENTRIES + ("ascend-sim",)),
    Case("nan-unassigned-pages", lambda: poke(poke(base(), "k", [4, 6, 8, 9], NAN), "v", [4, 6, 8, 9], NAN),
         SameAsClean(), entries=DEFAULT_ENTRIES + ("ascend-sim",)),
    Case("nan-causally-masked", lambda: poke(replace(base("multi")), "v", (5, 1, 0), NAN),
         NaNRows(((1, 0), (1, 1)), base="multi"), entries=NO_FLASH + ("ascend-sim", "triton"),
),
    Case("nan-k-causally-masked", lambda: poke(replace(base("multi")), "k", (5, 1, 1), NAN),
         NaNRows(((1, 2), (1, 3)), base="multi"), entries=NO_FLASH + ("ascend-sim",)),
    Case("nan-windowed-out", lambda: poke(replace(base("window")), "v", (2, 1), NAN), SameAsClean(base="window"),
         entries=DEFAULT_ENTRIES + ("ascend-sim", "triton")),
    Case("nan-before-window-page", lambda: poke(replace(base("window")), "k", 1, NAN), SameAsClean(base="window"),
         entries=DEFAULT_ENTRIES + ("ascend-sim",)),
    Case("inf-q-of-empty-request", lambda: poke(base(), "q", 2, INF), SameAsClean()),
    # --- values a row can see: that row is NaN, the others bit-identical ------------------------
    Case("nan-k-visible", lambda: poke(base(), "k", (2, 1, 1), NAN), NaNRows(((1, 2), (1, 3))),
         entries=DEFAULT_ENTRIES + ("ascend-sim", "triton")),
    Case("inf-v-visible", lambda: poke(base(), "v", (3, 0, 0), INF), NaNRows(((0, 0), (0, 1))),
         entries=DEFAULT_ENTRIES + ("ascend-sim", "triton")),
    Case("minus-inf-k-visible", lambda: poke(base(), "k", (7, 0, 0), -INF), NaNRows(((1, 0), (1, 1))),
         entries=DEFAULT_ENTRIES + ("ascend-sim", "triton")),
    Case("minus-inf-k-visible-soft-cap", lambda: replace(poke(base(), "k", (7, 0, 0), -INF), soft_cap=5.0),
         NaNRows(((1, 0), (1, 1)), base="softcap"), entries=DEFAULT_ENTRIES + ("ascend-sim",)),
    Case("nan-q-one-head", lambda: poke(base(), "q", (0, 3, 5), NAN), NaNRows(((0, 3),)),
         entries=DEFAULT_ENTRIES + ("ascend-sim", "triton")),
    Case("nan-k-visible-window", lambda: poke(replace(base("window")), "k", (2, 2, 0), NAN),
         NaNRows(((1, 0), (1, 1)), base="window"), entries=DEFAULT_ENTRIES + ("ascend-sim",)),
    Case("nan-int8-scale", _int8(k_scale=np.array([NAN, 0.02], np.float32)),
         NaNRows(((0, 0), (0, 1), (1, 0), (1, 1)), base="int8"), entries=NO_FLASH + ("ascend-sim",)),
    # --- empty batches and shared pages --------------------------------------------------------
    Case("empty-batch", _empty_batch, Empty(0), entries=DEFAULT_ENTRIES + ("ascend-sim", "triton")),
    Case("no-query-rows", _no_rows, Empty(0), entries=NO_FLASH + ("ascend-sim", "triton")),
    Case("all-lengths-zero", lambda: replace(base(), seq=np.zeros(3, np.int32)), Empty(3, empty_rows=True),
         entries=DEFAULT_ENTRIES + ("ascend-sim", "triton")),
    Case("shared-pages", _shared_pages, MatchesReference(), entries=DEFAULT_ENTRIES + ("ascend-sim", "triton")),
]


def _params():
    out = []
    for c in CASES:
        for e in c.entries:
            marks = [pytest.mark.xfail(strict=False, reason=c.xfail[e])] if e in c.xfail else []
            out.append(pytest.param(c, e, id=f"{c.id}-{e}", marks=marks))
    return out


_CLEAN: dict = {}


def clean(entry: str, kind: str):
    if (entry, kind) not in _CLEAN:
        _CLEAN[entry, kind] = RUNNERS[entry](base(kind))
    return _CLEAN[entry, kind]


@pytest.mark.parametrize("case, entry", _params())
def test_decode_entry_points(case: Case, entry: str):
    expect = case.override.get(entry, case.expect)
    p = case.make()
    run = RUNNERS[entry]
    if isinstance(expect, Raises):
        with pytest.raises(expect.exc, match=expect.match):
            run(p)
        return
    out, lse = run(p)
    if isinstance(expect, Empty):
        assert out.shape == (expect.rows, HQ, D) and lse.shape == (expect.rows, HQ)
        if expect.empty_rows:
            assert np.all(out == 0) and np.all(np.isneginf(lse))
        return
    if isinstance(expect, MatchesReference):
        ref_out, ref_lse = dense_attention(_inputs(p))
        np.testing.assert_allclose(out, ref_out, rtol=0, atol=expect.tol)
        np.testing.assert_allclose(lse, ref_lse, rtol=0, atol=expect.tol)  # -inf where the reference has it
        return
    c_out, c_lse = clean(entry, expect.base)
    if isinstance(expect, SameAsClean):
        if expect.tol:
            np.testing.assert_allclose(out, c_out, rtol=0, atol=expect.tol)
            np.testing.assert_allclose(lse, c_lse, rtol=0, atol=expect.tol)
        else:
            assert np.array_equal(out, c_out, equal_nan=True), "a value no row may see changed the output"
            assert np.array_equal(lse, c_lse, equal_nan=True)
        assert np.isfinite(out).all()
        return
    assert isinstance(expect, NaNRows)
    poisoned = np.zeros(lse.shape, bool)
    for t, h in expect.cells:
        poisoned[t, h] = True
    assert np.isnan(out[poisoned]).all() and np.isnan(lse[poisoned]).all(), "a visible NaN/inf must give NaN"
    assert np.array_equal(out[~poisoned], c_out[~poisoned]), "another row changed"
    assert np.array_equal(lse[~poisoned], c_lse[~poisoned], equal_nan=True)
    assert not np.isnan(out[~poisoned]).any()


def test_the_suite_is_large_enough():
    decode = sum(len(c.entries) for c in CASES)
    assert len(CASES) >= 60 and decode >= 300


# ---------------------------------------------------------------------------------------------
# The merges: NumPy and torch agree (NaN propagates; empty states' o is ignored)
# ---------------------------------------------------------------------------------------------

def _merge_np(o, lse):
    return merge_states(o, lse)


def _merge_torch(o, lse):
    out, l = torch_merge(torch.as_tensor(np.asarray(o, np.float32)), torch.as_tensor(np.asarray(lse, np.float32)))
    return out.numpy(), l.numpy()


MERGES = {"numpy": _merge_np, "torch": _merge_torch}
O2 = np.array([[1.0, 2.0], [3.0, 4.0]], np.float32)
MERGE_CASES = [
    ("nan-lse", O2, [0.0, NAN], "nan", "nan"),
    ("nan-o-live", np.array([[NAN, 1.0], [3.0, 4.0]], np.float32), [0.0, 0.0], "nan-channel-0", "finite"),
    ("inf-o-live", np.array([[INF, 1.0], [3.0, 4.0]], np.float32), [0.0, 0.0], "nan-channel-0", "finite"),
    ("nan-o-empty-minus-inf", np.array([[NAN, NAN], [3.0, 4.0]], np.float32), [-INF, 0.0], [3.0, 4.0], 0.0),
    ("nan-o-empty-plus-inf", np.array([[NAN, NAN], [3.0, 4.0]], np.float32), [INF, 1.5], [3.0, 4.0], 1.5),
    ("all-empty", np.array([[NAN, 7.0], [INF, 4.0]], np.float32), [-INF, INF], [0.0, 0.0], -INF),
    ("huge-lse-gap", O2, [1e30, -1e30], [1.0, 2.0], 1e30),
]


@pytest.mark.parametrize("impl", sorted(MERGES))
@pytest.mark.parametrize("name, o, lse, want_out, want_lse", MERGE_CASES, ids=[c[0] for c in MERGE_CASES])
def test_merges_agree(impl, name, o, lse, want_out, want_lse):
    out, l = MERGES[impl](o, np.array(lse, np.float32))
    if isinstance(want_out, str):
        if want_out == "nan-channel-0":  # a non-finite o channel poisons that channel of the merged row
            assert np.isnan(out[0]) and out[1] == np.float32(2.5)
        else:
            assert np.isnan(out).all() if want_out == "nan" else np.isfinite(out).all()
    else:
        assert np.array_equal(out, np.array(want_out, np.float32))
    if isinstance(want_lse, str):
        assert np.isnan(l) if want_lse == "nan" else np.isfinite(l)
    else:
        assert l == np.float32(want_lse)


@pytest.mark.parametrize("o, lse, match", [
    (np.zeros((2, 3, 4)), np.zeros((2, 4)), "^o: shape"),
    (np.zeros((0, 4)), np.zeros(0), "split axis is empty"),
    (np.zeros(4), np.zeros(()), "^lse"),
], ids=["shape", "no-states", "scalar-lse"])
def test_numpy_merge_refuses_malformed(o, lse, match):
    with pytest.raises(ValueError, match=match):
        merge_states(o, lse)


# ---------------------------------------------------------------------------------------------
# The planner and the CLI: absurd sizes refused in milliseconds, naming the limit
# ---------------------------------------------------------------------------------------------

PLAN_CASES = [
    ("batch-10M", dict(seq_lens=np.ones(10_000_000, np.int32)), "MAX_BATCH"),
    ("seq-2-pow-31", dict(seq_lens=np.array([2**31], np.int64)), "MAX_SEQ_LEN"),
    ("seq-python-huge", dict(seq_lens=[2**70]), "^seq_lens"),
    ("seq-uint64-huge", dict(seq_lens=np.array([2**64 - 1], np.uint64)), "^seq_lens"),
    ("size-16-over-2-pow-31-minus-1", dict(seq_lens=np.array([2**31 - 1]), policy="size:16"), "MAX_WORK_ITEMS"),
    ("count-huge", dict(seq_lens=np.array([2**30]), policy="count:100000000"), "MAX_WORK_ITEMS"),
    ("many-kv-heads", dict(seq_lens=np.ones(1000), num_kv_heads=100_000), "MAX_KV_HEADS"),
    ("items-at-least", dict(seq_lens=np.ones(100_000), num_kv_heads=64), "MAX_WORK_ITEMS"),
    ("graph-stable-capacity", dict(seq_lens=np.ones(4), graph_stable=True, max_work_items=10**9), "MAX_WORK_ITEMS"),
    ("graph-stable-capacity-float", dict(seq_lens=np.ones(4), graph_stable=True, max_work_items=1.5),
     "max_work_items: must be an integer"),
    ("graph-stable-capacity-str", dict(seq_lens=np.ones(4), graph_stable=True, max_work_items="10"),
     "max_work_items: must be an integer"),
    ("graph-stable-slots", dict(seq_lens=np.ones(4), q_lens=np.full(4, 1_000_000), graph_stable=True,
                                max_splits=1000), "MAX_PARTIAL_SLOTS|MAX_QUERY_ROWS"),
    ("max-splits-huge", dict(seq_lens=np.ones(4), max_splits=10**12), "MAX_WORK_ITEMS"),
    ("q-rows-huge", dict(seq_lens=np.ones(2), q_lens=np.array([2**40, 1])), "MAX_QUERY_ROWS"),
    ("window-minus-5", dict(seq_lens=np.ones(2), window_left=-5), "^window_left"),
    ("window-minus-2", dict(seq_lens=np.ones(2), window_left=-2), "^window_left"),
    ("page-size-0", dict(seq_lens=np.ones(2), page_size=0), "^page_size"),
    ("page-size-float", dict(seq_lens=np.ones(2), page_size=16.0), "^page_size"),
    ("kv-heads-0", dict(seq_lens=np.ones(2), num_kv_heads=0), "^num_kv_heads"),
    ("seq-negative", dict(seq_lens=np.array([4, -1])), "^seq_lens"),
    ("seq-float-fraction", dict(seq_lens=np.array([4.5])), "^seq_lens"),
    ("seq-2d", dict(seq_lens=np.ones((2, 2))), "^seq_lens: must be 1-D"),
    ("seq-scalar", dict(seq_lens=5), "^seq_lens: must be 1-D"),
    ("q-lens-2d", dict(seq_lens=np.ones(4), q_lens=np.ones((2, 2))), "^q_lens: must be 1-D"),
    ("qsl-2d", dict(seq_lens=np.ones(2), query_start_loc=np.array([[0, 1, 2]])), "^query_start_loc: must be 1-D"),
    ("size-not-page-multiple", dict(seq_lens=np.array([40]), policy="size:10"), "^split_size"),
    ("min-split-negative", dict(seq_lens=np.array([4096]), min_split_tokens=-5), "^min_split_tokens"),
    ("min-split-negative-numpy", dict(seq_lens=np.array([4096]), min_split_tokens=np.int64(-1)), "^min_split_tokens"),
]


@pytest.mark.parametrize("kw, match", [c[1:] for c in PLAN_CASES], ids=[c[0] for c in PLAN_CASES])
def test_planner_refuses_in_milliseconds(kw, match):
    kw = {"num_kv_heads": 8, "page_size": 16, **kw}
    t0 = time.perf_counter()
    with pytest.raises((ValueError, TypeError), match=match):
        make_plan(**kw)
    assert time.perf_counter() - t0 < 1.0


def _cli(*argv):
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = cli.main(list(argv))
    return code, out.getvalue(), err.getvalue()


CLI_PLAN_CASES = [
    ("batch-10M", ["--batch", "10000000", "--seq-lens", "100"], "MAX_BATCH"),
    ("seq-2-pow-31", ["--seq-lens", str(2**31)], "MAX_SEQ_LEN"),
    ("seq-huge", ["--seq-lens", str(10**30)], "seq_lens"),
    ("size-16", ["--seq-lens", str(2**31 - 1), "--policy", "size:16"], "MAX_WORK_ITEMS"),
    ("window-minus-5", ["--seq-lens", "100", "--window-left", "-5"], "window_left"),
    ("negative-batch", ["--batch", "-1", "--seq-lens", "100"], "--batch"),
    ("max-splits-huge", ["--seq-lens", "100", "--max-splits", str(10**12)], "MAX_WORK_ITEMS"),
]


@pytest.mark.parametrize("argv, match", [c[1:] for c in CLI_PLAN_CASES], ids=[c[0] for c in CLI_PLAN_CASES])
def test_cli_plan_refuses_in_milliseconds(argv, match):
    t0 = time.perf_counter()
    code, _, err = _cli("plan", *argv)
    assert code == 2 and match in err and err.startswith("error:")
    assert time.perf_counter() - t0 < 1.0


@pytest.mark.parametrize("name", ["exists", "missing-dir", "bad-suffix", "is-a-dir", "twice"])
def test_cli_parity_report_paths_checked_before_the_run(tmp_path, name):
    keep = tmp_path / "keep.md"
    keep.write_text("precious")
    (tmp_path / "d.md").mkdir()
    argv = {"exists": [str(keep)], "missing-dir": [str(tmp_path / "no" / "r.md")], "bad-suffix": [str(tmp_path / "r.txt")],
            "is-a-dir": [str(tmp_path / "d.md")], "twice": [str(tmp_path / "r.md")] * 2}[name]
    extra = ["--force"] if name == "is-a-dir" else []
    t0 = time.perf_counter()
    code, out, err = _cli("parity", "--backend", "numpy", "--cases", "basic/*", *extra,
                          *[a for p in argv for a in ("--report", p)])
    assert code == 2 and err.startswith("error:") and out == ""
    assert time.perf_counter() - t0 < 2.0  # before any case runs
    assert keep.read_text() == "precious"
    assert sorted(os.listdir(tmp_path)) == ["d.md", "keep.md"]


def test_report_written_atomically_and_only_with_force(tmp_path):
    from splitkv_common.parity.harness import ParityReport

    path = tmp_path / "r.json"
    ParityReport().write(str(path))
    assert path.read_text().startswith("{")
    with pytest.raises(FileExistsError, match="--force"):
        ParityReport().write(str(path))
    ParityReport().write(str(path), force=True)
    assert sorted(os.listdir(tmp_path)) == ["r.json"]  # no temporary file left


# ---------------------------------------------------------------------------------------------
# PlanSpec.check_shapes and Plan.validate
# ---------------------------------------------------------------------------------------------

def _good_plan(p: Problem | None = None, **kw):
    p = p or base()
    return make_plan(p.seq, num_kv_heads=HKV, num_q_heads=HQ, head_dim=D, page_size=PAGE, query_start_loc=p.qsl,
                     policy="size:4", device="cpu", **kw)


SPEC = PlanSpec(HQ, HKV, D, PAGE, policy="size:4", device="cpu")
CHECK_SHAPES = [
    ("q-rank", dict(q=np.zeros((3, HQ))), "^q:"),
    ("q-heads", dict(q=np.zeros((3, HQ + 1, D))), "^q:"),
    ("q-rows", dict(q=np.zeros((5, HQ, D))), "^plan: made for 3 query rows"),
    ("k-page", dict(k=np.zeros((NUM_PAGES, PAGE + 1, HKV, D))), "^k_cache:"),
    ("k-rank", dict(k=np.zeros((NUM_PAGES, PAGE, HKV))), "^k_cache:"),
    ("v-shape", dict(v=np.zeros((NUM_PAGES - 1, PAGE, HKV, D))), "^v_cache:"),
    ("block-table-batch", dict(bt=np.zeros((4, 4), np.int32)), "^plan: made for 3 requests"),
    ("block-table-rank", dict(bt=np.zeros(3, np.int32)), "^plan: made for 3 requests"),
    ("seq-lens-shape", dict(seq=np.zeros(4, np.int32)), "^plan: made for 3 requests, seq_lens"),
    ("qsl-shape", dict(qsl=np.zeros(3, np.int32)), "^plan: made for 3 requests, query_start_loc"),
]


@pytest.mark.parametrize("change, match", [c[1:] for c in CHECK_SHAPES], ids=[c[0] for c in CHECK_SHAPES])
def test_plan_spec_check_shapes(change, match):
    p = replace(base(), **change)
    with pytest.raises(ValueError, match=match):
        SPEC.check_shapes(_good_plan(), p.q, p.k, p.v, p.bt, p.seq, p.qsl)


def _edit(plan, **arrays):
    return dataclasses.replace(plan, **{k: (np.asarray(v, np.int32) if not isinstance(v, int) else v)
                                        for k, v in arrays.items()})


def _items(plan):
    return {k: getattr(plan, k).copy() for k in ("item_request", "item_kv_head", "item_split", "item_kv_start",
                                                  "item_kv_end")}


def _with_item(plan, w, **values):
    a = _items(plan)
    for k, v in values.items():
        a[k][w] = v
    return _edit(plan, **a)


def _drop_item(plan, w):
    a = {k: np.delete(v, w) for k, v in _items(plan).items()}
    return _edit(plan, num_valid_items=plan.num_valid_items - 1, **a)


def _dup_item(plan, w):
    a = {k: np.insert(v, w, v[w]) for k, v in _items(plan).items()}
    return _edit(plan, num_valid_items=plan.num_valid_items + 1, **a)


def _first(plan, b, h, j=0):
    return int(np.flatnonzero((plan.item_request == b) & (plan.item_kv_head == h) & (plan.item_split == j))[0])


VALIDATE = [
    ("request-out-of-range", lambda p: _with_item(p, 0, item_request=3), "item_request"),
    ("request-negative-valid", lambda p: _with_item(p, 0, item_request=-1), "item_request"),
    ("head-out-of-range", lambda p: _with_item(p, 0, item_kv_head=HKV), "item_kv_head"),
    ("split-out-of-range", lambda p: _with_item(p, 0, item_split=9), "item_split"),
    ("range-reversed", lambda p: _with_item(p, 0, item_kv_start=4, item_kv_end=2), "0 <= start <= end"),
    ("ranges-overlap", lambda p: _with_item(p, _first(p, 1, 0, 1), item_kv_start=3), "overlap or leave a gap"),
    ("ranges-gap", lambda p: _with_item(p, _first(p, 1, 0, 1), item_kv_start=5), "overlap or leave a gap"),
    ("range-short", lambda p: _with_item(p, _first(p, 1, 1, 2), item_kv_end=8), "ends at 8"),
    ("range-past-seq-len", lambda p: _with_item(p, _first(p, 0, 0, 1), item_kv_end=8), "ends at 8"),
    ("missing-item", lambda p: _drop_item(p, _first(p, 1, 0, 1)), "has 2 work items, its num_splits is 3"),
    ("duplicate-item", lambda p: _dup_item(p, 0), "same \\(request, KV head, split\\)"),
    ("num-splits-lie", lambda p: _edit(p, num_splits=[2, 3, 2]), "num_splits"),
    ("row-slots-overflow", lambda p: _edit(p, row_slot_start=[0, 2, 6]), "outside \\[0, num_slots"),
    ("rows-share-slots", lambda p: _edit(p, row_slot_start=[0, 1, 4]), "share partial slots"),
    ("row-merges-too-few", lambda p: _edit(p, row_num_splits=[2, 2, 1]), "row 1 merges 2 slots"),
    ("num-valid-past-items", lambda p: _edit(p, num_valid_items=p.num_items + 1), "num_valid_items"),
    ("qsl-not-from-0", lambda p: _edit(p, query_start_loc=[1, 1, 2, 3]), "query_start_loc"),
    ("row-arrays-length", lambda p: _edit(p, row_slot_start=[0, 2]), "row_slot_start and row_num_splits"),
    ("num-slots-negative", lambda p: _edit(p, num_slots=-1, row_slot_start=[0, 0, 0], row_num_splits=[0, 0, 0]),
     "row 0 merges 0|num_slots"),
]


@pytest.mark.parametrize("edit, match", [c[1:] for c in VALIDATE], ids=[c[0] for c in VALIDATE])
def test_plan_validate_refuses(edit, match):
    good = _good_plan()
    good.validate(base().seq, base().qsl)
    with pytest.raises(ValueError, match=match):
        edit(good).validate(base().seq, base().qsl)


@pytest.mark.parametrize("entry", ["validate", "check_batch", "shard"])
def test_batch_vectors_of_two_dimensions_refused(entry):
    """``seq_lens`` / ``query_start_loc`` of shape ``[B, 1]`` / ``[1, B + 1]`` given to a plan's checks or to
    the context-parallel sharding are refused naming the argument (they were flattened)."""
    from splitkv_common.cp_sharding import shard

    seq = np.array([5, 9, 0])
    plan = make_plan(seq, num_kv_heads=2, page_size=4)
    bt = np.arange(9).reshape(3, 3)
    calls = {"validate": lambda s, q: plan.validate(s, q), "check_batch": lambda s, q: plan.check_batch(s, q),
             "shard": lambda s, q: shard(bt, s, 0, 2, page_size=4)}
    with pytest.raises(ValueError, match="^seq_lens: must be 1-D"):
        calls[entry](seq.reshape(-1, 1), None)
    if entry != "shard":
        with pytest.raises(ValueError, match="^query_start_loc: must be 1-D"):
            calls[entry](None, plan.query_start_loc.reshape(1, -1))
        calls[entry](seq, plan.query_start_loc)   # the same as vectors: accepted
    else:
        calls[entry](seq, None)


def test_plan_validate_padding_and_window_and_batch():
    p = base()
    gs = _good_plan(graph_stable=True, max_splits=4)
    gs.validate(p.seq, p.qsl)
    a = _items(gs)
    a["item_kv_end"][-1] = 4  # a padding item with a range
    with pytest.raises(ValueError, match="must be padding"):
        _edit(gs, **a).validate(p.seq)
    with pytest.raises(ValueError, match="starts at 4"):  # planned with a window, run without
        _good_plan(window_left=2).validate(p.seq, window_left=None)
    with pytest.raises(ValueError, match="made for 2 KV heads"):
        _good_plan().validate(num_kv_heads=4)
    with pytest.raises(ValueError, match="made for 3 requests, seq_lens has 2"):
        _good_plan().validate(p.seq[:2])
    with pytest.raises(ValueError, match="ends at 9"):  # the batch grew since the plan
        _good_plan().validate(np.array([6, 10, 0]))


@pytest.mark.parametrize("entry", ["numpy", "torch", "ascend-wrapper", "ascend-op-api", "harness"])
def test_entry_points_refuse_an_overlapping_plan(entry):
    p = base()
    bad = _with_item(_good_plan(), _first(_good_plan(), 1, 0, 1), item_kv_start=3)
    with pytest.raises(ValueError, match="^plan: .*(overlap or leave a gap|ends at 0)"):
        if entry == "numpy":
            split_attention(_inputs(p), bad)
        elif entry == "torch":
            torch_decode(**_torch_args(p), plan=bad)
        elif entry == "ascend-wrapper":
            _wrapper(p, {}).set_plan(bad, seq_lens=p.seq)
        elif entry == "ascend-op-api":
            import ascend_ops

            a = _torch_args(p)
            ascend_ops.decode_attention(a["q"], a["k_cache"], a["v_cache"], a["block_table"], a["seq_lens"],
                                        a["query_start_loc"], plan=bad)
        else:
            from splitkv_common.parity.cases import catalog
            from splitkv_common.parity.harness import run_case
            from splitkv_common.parity.backends import numpy_backend

            case = catalog(("small",), "basic/*")[0]
            inputs = case.build()
            run_case(numpy_backend, case, plan=_with_item(inputs.plan("none", device="cpu"), 0, item_kv_end=0))


# ---------------------------------------------------------------------------------------------
# torch.ops.splitkv_ascend.decode_attention: metadata checks before any kernel
# ---------------------------------------------------------------------------------------------

def _op_args():
    p = base()
    a = _torch_args(p)
    w = _wrapper(p, a)
    w.plan(p.seq, query_start_loc=p.qsl, max_pages=4, num_pages=NUM_PAGES)
    b = w._buffers
    return dict(q=a["q"], k_cache=a["k_cache"], v_cache=a["v_cache"], block_table=a["block_table"], kv_quant=None,
                plan=b["plan"], tiling=b["tiling"], workspace=b["workspace"], out=torch.empty(3, HQ, D),
                lse=torch.empty(3, HQ), block_dim=int(w.tiling["blockDim"]))


OP_CASES = [
    ("q-rank", dict(q=lambda a: a["q"][0]), ValueError, "^q:"),
    ("q-dtype", dict(q=lambda a: a["q"].double()), (TypeError, ValueError), "^(q|out)"),
    ("q-strided", dict(q=lambda a: _strided(a["q"])), ValueError, "^q: must be contiguous"),
    ("q-rows-vs-plan", dict(q=lambda a: a["q"][:2], out=lambda a: a["out"][:2], lse=lambda a: a["lse"][:2]),
     ValueError, "^q: has numRows = 2"),
    ("q-on-meta", dict(q=lambda a: a["q"].to("meta")), ValueError, "on q's device|^k_cache"),
    ("k-shape", dict(k_cache=lambda a: a["k_cache"][:, :, :, :8]), ValueError, "^k_cache"),
    ("k-pages-vs-tiling", dict(k_cache=lambda a: a["k_cache"][:5], v_cache=lambda a: a["v_cache"][:5]), ValueError,
     "^k_cache: has numPages = 5"),
    ("int8-without-kv-quant", dict(k_cache=lambda a: a["k_cache"].to(torch.int8),
                                   v_cache=lambda a: a["v_cache"].to(torch.int8)), ValueError, "^kv_quant: required"),
    ("kv-quant-with-float", dict(kv_quant=lambda a: torch.ones(4, HKV, D)), ValueError, "^kv_quant: only"),
    ("kv-quant-shape", dict(k_cache=lambda a: a["k_cache"].to(torch.int8), v_cache=lambda a: a["v_cache"].to(torch.int8),
                            kv_quant=lambda a: torch.ones(4, HKV)), ValueError, "^kv_quant: must be"),
    ("block-table-int64", dict(block_table=lambda a: a["block_table"].long()), TypeError, "^block_table"),
    ("block-table-batch", dict(block_table=lambda a: a["block_table"][:2]), ValueError, "^block_table: has batch"),
    ("plan-truncated", dict(plan=lambda a: a["plan"][:5]), ValueError, "^plan: 5 words"),
    ("plan-dtype", dict(plan=lambda a: a["plan"].long()), TypeError, "^plan"),
    ("tiling-size", dict(tiling=lambda a: a["tiling"][:-1]), TypeError, "^tiling"),
    ("workspace-small", dict(workspace=lambda a: a["workspace"][:1]), ValueError, "^workspace"),
    ("out-shape", dict(out=lambda a: a["out"][:, :2]), ValueError, "^out:"),
    ("out-dtype", dict(out=lambda a: a["out"].half()), ValueError, "^out:"),
    ("lse-dtype", dict(lse=lambda a: a["lse"].double()), ValueError, "^lse:"),
    ("lse-shape", dict(lse=lambda a: a["lse"][:2]), ValueError, "^lse:"),
    ("block-dim-0", dict(block_dim=lambda a: 0), ValueError, "^block_dim"),
    ("block-dim-huge", dict(block_dim=lambda a: 1 << 20), ValueError, "^block_dim"),
]


@pytest.mark.parametrize("change, exc, match", [c[1:] for c in OP_CASES], ids=[c[0] for c in OP_CASES])
def test_op_checks_metadata_before_any_kernel(change, exc, match):
    a = _op_args()
    out_before = a["out"].clone()
    for k, fn in change.items():
        a[k] = fn(a)
    with pytest.raises(exc, match=match):
        torch.ops.splitkv_ascend.decode_attention(**a)
    if a["out"].shape == out_before.shape and a["out"].dtype == out_before.dtype:
        assert torch.equal(a["out"].nan_to_num(), out_before.nan_to_num())  # nothing was written


def test_op_runs_with_good_buffers():
    a = _op_args()
    torch.ops.splitkv_ascend.decode_attention(**a)
    ref_out, _ = dense_attention(_inputs(base()))
    assert np.abs(a["out"].numpy() - ref_out).max() < 2e-5


@pytest.mark.parametrize("name, kw, match", [
    ("out-shape", dict(out=torch.empty(2, HQ, D)), "^out:"),
    ("lse-dtype", dict(lse=torch.empty(3, HQ, dtype=torch.float64)), "^lse:"),
    ("soft-cap-0-at-run", dict(soft_cap=0.0), "^soft_cap"),
    ("window-minus-2-at-run", dict(window_left=-2), "^window_left"),
])
def test_wrapper_run_checks_outputs_and_scalars(name, kw, match):
    p = base()
    a = _torch_args(p)
    w = _wrapper(p, a)
    w.plan(p.seq, query_start_loc=p.qsl, max_pages=4, num_pages=NUM_PAGES)
    with pytest.raises(ValueError, match=match):
        w.run(a["q"], a["k_cache"], a["v_cache"], a["block_table"], **kw)


def test_all_entry_points_listed():
    """The entry points this file exercises (the report's count)."""
    assert set(RUNNERS) | {"merge-numpy", "merge-torch", "make_plan", "splitkv plan", "splitkv parity",
                           "PlanSpec.check_shapes", "Plan.validate", "torch.ops.splitkv_ascend"} >= set(RUNNERS)
