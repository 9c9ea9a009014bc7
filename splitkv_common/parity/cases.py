"""The case catalog: named, seeded parity cases every backend runs.

Each :class:`Case` builds its :class:`~splitkv_common.inputs.DecodeInputs` deterministically from its
seed, names the split policy the harness plans it with, and carries a size tag: ``small`` cases are
cheap enough for CI (the Triton interpreter, the Ascend CPU twin); ``full`` adds long contexts and
production head counts for a GPU or NPU node.

Pages are shuffled in the block table, unused pages and the tail of each last page hold a large
finite poison value, so a backend that reads a position it must not, or walks the pages in the
wrong order, fails.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ..dtypes import round_to
from ..inputs import DecodeInputs

POISON = 1000.0


@dataclass(frozen=True)
class Case:
    """A parity case: ``build()`` gives the inputs; the harness plans them with ``policy``."""

    name: str
    build: Callable[[], DecodeInputs]
    size: str = "small"
    policy: str = "auto"
    plan_kwargs: dict = field(default_factory=dict)
    tags: tuple = ()
    doc: str = ""


def random_inputs(seed: int, seq_lens, *, num_q_heads: int = 4, num_kv_heads: int = 2, head_dim: int = 64,
                  page_size: int = 16, dtype: str = "float32", q_lens=None, kv_quant: str | None = None,
                  kv_offset: bool = False, soft_cap: float | None = None, window_left: int | None = None,
                  q_scale: float = 1.0, spare_pages: int = 3) -> DecodeInputs:
    """Seeded random decode inputs with a shuffled paged cache.

    Args:
        seq_lens: KV tokens per request; q_lens: query rows per request (default 1 each).
        kv_quant: None (KV in ``dtype``), ``'head'`` (int8, scale per KV head) or ``'channel'``
            (int8, scale per KV head and channel); kv_offset adds an offset.
        q_scale: multiplies q, to push scores to very large magnitudes.
    """
    rng = np.random.default_rng(seed)
    seq = np.asarray(seq_lens, np.int32)
    B = seq.shape[0]
    ql = np.ones(B, np.int32) if q_lens is None else np.asarray(q_lens, np.int32)
    qsl = np.concatenate([[0], np.cumsum(ql)]).astype(np.int32)
    pages_per = np.maximum(1, -(-seq // page_size))
    max_pages = int(pages_per.max(initial=1))
    num_pages = int(pages_per.sum()) + spare_pages
    perm = rng.permutation(num_pages).astype(np.int32)
    block_table = np.full((B, max_pages), -1, np.int32)  # unused entries are invalid on purpose
    nxt = 0
    for b in range(B):
        n = int(-(-seq[b] // page_size))
        block_table[b, :n] = perm[nxt:nxt + n]
        nxt += n
    shape = (num_pages, page_size, num_kv_heads, head_dim)
    valid = np.zeros((num_pages, page_size), bool)
    for b in range(B):
        pos = np.arange(seq[b])
        valid[block_table[b, pos // page_size], pos % page_size] = True
    kw = {}
    if kv_quant is None:
        k = round_to(rng.standard_normal(shape), dtype)
        v = round_to(rng.standard_normal(shape), dtype)
        k[~valid] = POISON
        v[~valid] = POISON
    else:
        k = rng.integers(-127, 128, shape).astype(np.int8)
        v = rng.integers(-127, 128, shape).astype(np.int8)
        k[~valid] = 127
        v[~valid] = 127
        sshape = (num_kv_heads,) if kv_quant == "head" else (num_kv_heads, head_dim)
        kw["k_scale"] = rng.uniform(0.005, 0.02, sshape).astype(np.float32)
        kw["v_scale"] = rng.uniform(0.005, 0.02, sshape).astype(np.float32)
        if kv_offset:
            kw["k_offset"] = rng.uniform(-8, 8, sshape).round().astype(np.float32)
            kw["v_offset"] = rng.uniform(-8, 8, sshape).round().astype(np.float32)
    q = round_to(rng.standard_normal((int(qsl[-1]), num_q_heads, head_dim)) * q_scale, dtype)
    return DecodeInputs(q=q, k_cache=k, v_cache=v, block_table=block_table, seq_lens=seq, query_start_loc=qsl,
                        dtype=dtype, soft_cap=soft_cap, window_left=window_left, **kw)


def worked_example(head_dim: int = 64, dtype: str = "float32") -> DecodeInputs:
    """The seed's example: scores ``[0, ln2, ln3, ln4]``, ``V = [1, 2, 4, 8]`` (every channel), two
    pages of two tokens (block A = positions 0-1, block B = 2-3). The answer is 4.9 everywhere."""
    s = np.log([1.0, 2.0, 3.0, 4.0])
    k = np.zeros((2, 2, 1, head_dim), np.float32)
    k[..., 0] = s.reshape(2, 2, 1)
    v = np.broadcast_to(np.array([1.0, 2.0, 4.0, 8.0], np.float32).reshape(2, 2, 1, 1), (2, 2, 1, head_dim)).copy()
    q = np.zeros((1, 1, head_dim), np.float32)
    q[0, 0, 0] = 1.0
    # stored in reverse page order: the block table must be followed
    return DecodeInputs(q=q, k_cache=round_to(k, dtype)[::-1].copy(), v_cache=v[::-1].copy(),
                        block_table=np.array([[1, 0]], np.int32),
                        seq_lens=np.array([4], np.int32), dtype=dtype, scale=1.0, meta={"expected_out": 4.9})


def _ri(seed, seq, **kw):
    return lambda: random_inputs(seed, seq, **kw)


def _build_catalog() -> list[Case]:
    C = []
    add = C.append
    add(Case("seed/worked-example", lambda: worked_example(), policy="size:2", tags=("seed",),
             doc="seed section 03/04: two blocks merge to 4.9, not the average 3.976"))
    add(Case("seed/worked-example-bf16", lambda: worked_example(dtype="bfloat16"), policy="size:2", tags=("seed",)))
    add(Case("seed/wrong-average-counterexample", _ri(11, [40], page_size=8), policy="size:32",
             tags=("seed", "counterexample"),
             doc="two splits of 32 and 8 tokens: their weight masses differ, so averaging outputs is wrong"))
    for dt in ("float32", "float16", "bfloat16"):
        add(Case(f"basic/vector-v-{dt}", _ri(1, [37, 100, 64], dtype=dt), policy="size:32", tags=("basic", dt),
                 doc="vector V, different q per request, lengths not aligned to pages or splits"))
    add(Case("basic/single-token", _ri(2, [1, 1]), policy="auto", tags=("basic",)))
    add(Case("basic/unaligned-lengths", _ri(3, [1, 15, 17, 33, 54, 97]), policy="size:32", tags=("lengths",),
             doc="lengths not multiples of the page (16) or the split (32)"))
    for ps in (1, 8, 16):
        add(Case(f"paging/page-size-{ps}", _ri(4 + ps, [54, 97, 16], page_size=ps), policy=f"size:{max(ps, 32)}",
                 tags=("paging",), doc="page boundaries, shuffled pages"))
    add(Case("paging/exact-page-multiples", _ri(21, [16, 32, 48]), policy="size:16", tags=("paging",)))
    for pol in ("none", "auto", "count:3", "count:7", "size:64"):
        add(Case(f"policy/{pol.replace(':', '-')}", _ri(22, [200, 7, 129]), policy=pol,
                 plan_kwargs={"min_split_tokens": 16}, tags=("policy",)))
    add(Case("mask/causal-tail-masked-split", _ri(23, [35, 9], q_lens=[4, 2], page_size=4), policy="size:4",
             tags=("mask", "multi-query"), doc="the last split holds positions later rows see and earlier rows do not"))
    add(Case("mask/sliding-window", _ri(24, [100, 30, 5], q_lens=[3, 1, 2], page_size=8, window_left=20),
             policy="size:8", tags=("mask", "window"), doc="splits partly outside a row's window"))
    add(Case("mask/sliding-window-later-rows", _ri(30, [60, 9], q_lens=[12, 2], page_size=4, window_left=3),
             policy="size:4", tags=("mask", "window", "multi-query"),
             doc="the first splits lie wholly outside the later rows' windows"))
    add(Case("mask/sliding-window-zero", _ri(25, [50, 3], page_size=8, window_left=0), policy="size:8",
             tags=("mask", "window"), doc="window_left 0: each row sees only its own position"))
    add(Case("scores/very-large", _ri(26, [70, 33], q_scale=60.0), policy="size:16", tags=("scores",),
             doc="scores in the hundreds: a naive exp overflows"))
    add(Case("scores/very-large-bf16", _ri(27, [70, 33], q_scale=60.0, dtype="bfloat16"), policy="size:16",
             tags=("scores", "bfloat16")))
    add(Case("scores/soft-cap", _ri(28, [90], q_scale=20.0, soft_cap=30.0), policy="size:32", tags=("scores", "soft-cap")))
    add(Case("scores/soft-cap-bf16", _ri(29, [65, 12], q_scale=20.0, soft_cap=50.0, dtype="bfloat16"),
             policy="size:16", tags=("scores", "soft-cap")))
    for hq, hkv in ((4, 1), (6, 2), (12, 4), (8, 8), (7, 7), (5, 1)):
        add(Case(f"gqa/{hq}-{hkv}", _ri(30 + hq + hkv, [45, 80], num_q_heads=hq, num_kv_heads=hkv),
                 policy="size:32", tags=("gqa",), doc=f"group size {hq // hkv}"))
    for d in (64, 80, 96, 128, 256):
        add(Case(f"head-dim/{d}", _ri(40 + d, [50, 21], head_dim=d, dtype="float16"), policy="size:32",
                 tags=("head-dim",)))
    add(Case("int8/per-head", _ri(50, [60, 17], kv_quant="head", dtype="float16"), policy="size:32", tags=("int8",)))
    add(Case("int8/per-channel-offset", _ri(51, [60, 17], kv_quant="channel", kv_offset=True, dtype="bfloat16"),
             policy="size:32", tags=("int8",)))
    add(Case("int8/per-head-offset-fp32", _ri(52, [33], kv_quant="head", kv_offset=True), policy="size:16",
             tags=("int8",)))
    add(Case("empty/some-rows", _ri(53, [0, 25, 0, 3]), policy="size:16", tags=("empty",),
             doc="seq_len 0 rows give out 0, lse -inf"))
    add(Case("empty/all-rows", _ri(54, [0, 0]), policy="auto", tags=("empty",)))
    add(Case("multi-query/ragged", _ri(55, [20, 64, 4], q_lens=[1, 3, 4], page_size=8), policy="size:16",
             tags=("multi-query",), doc="speculative-verification style rows with the causal tail"))
    add(Case("multi-query/gqa-bf16", _ri(56, [40, 70], q_lens=[2, 5], num_q_heads=8, num_kv_heads=2,
                                              dtype="bfloat16"), policy="size:32", tags=("multi-query",)))
    # MHA (group size 1) in 16-bit: one query row per KV head, the case dav-c220's cube would compute
    # in GEMV mode at m = 1 (the mixed Ascend kernel pads it to m = 16)
    for dt in ("float16", "bfloat16"):
        add(Case(f"mha/one-row-{dt}", _ri(57, [300, 77, 0], num_q_heads=4, num_kv_heads=4, head_dim=128, page_size=32,
                                          dtype=dt), policy="size:128", tags=("gqa", "mha")))
    add(Case("mha/several-rows-bf16", _ri(58, [90, 33], q_lens=[3, 1], num_q_heads=2, num_kv_heads=2,
                                          dtype="bfloat16"), policy="size:32", tags=("gqa", "mha", "multi-query")))
    # full size: production head counts and long contexts
    add(Case("full/llama-b1-16k", _ri(100, [16384], num_q_heads=32, num_kv_heads=8, head_dim=128, dtype="bfloat16"),
             size="full", policy="auto", plan_kwargs={}, tags=("full",)))
    add(Case("full/llama-b4-ragged", _ri(101, [4097, 1, 9000, 0], num_q_heads=32, num_kv_heads=8, head_dim=128,
                                              dtype="bfloat16"), size="full", policy="auto", tags=("full",)))
    add(Case("full/b16-mixed-fp16", _ri(102, list(np.random.default_rng(5).integers(0, 3000, 16)), num_q_heads=16,
                                             num_kv_heads=2, head_dim=128, dtype="float16"), size="full",
             policy="size:512", tags=("full",)))
    add(Case("full/d256-window-softcap", _ri(103, [5000, 3333], num_q_heads=8, num_kv_heads=4, head_dim=256,
                                                  dtype="bfloat16", window_left=1024, soft_cap=50.0),
             size="full", policy="size:256", tags=("full",)))
    add(Case("full/int8-channel-32k", _ri(104, [32768], num_q_heads=32, num_kv_heads=8, head_dim=128,
                                               kv_quant="channel", kv_offset=True, dtype="bfloat16"),
             size="full", policy="auto", tags=("full", "int8")))
    add(Case("full/mtp-d96", _ri(105, [3000, 2000], q_lens=[4, 4], num_q_heads=24, num_kv_heads=4, head_dim=96,
                                      dtype="float16", page_size=64), size="full", policy="count:5", tags=("full",)))
    return C


CATALOG: list[Case] = _build_catalog()


def catalog(sizes=("small",), pattern: str | None = None) -> list[Case]:
    """Cases of the given size tags (``('small',)``, ``('small', 'full')``), optionally filtered by a
    glob or substring ``pattern`` on the name (comma-separated alternatives)."""
    return select_cases(CATALOG, sizes, pattern)


def select_cases(cases, sizes=("small",), pattern: str | None = None) -> list:
    """The ``cases`` of the given size tags whose names match ``pattern`` (as :func:`catalog`)."""
    if isinstance(sizes, str):
        sizes = ("small", "full") if sizes == "all" else (sizes,)
    out = [c for c in cases if c.size in sizes]
    if pattern:
        pats = [p.strip() for p in pattern.split(",") if p.strip()]
        out = [c for c in out if any(fnmatch.fnmatch(c.name, p) or p in c.name for p in pats)]
    return out


def get_case(name: str) -> Case:
    for c in CATALOG:
        if c.name == name:
            return c
    raise ValueError(f"case: unknown {name!r}")



# --- shared-prefix cases (``splitkv_common.shared_prefix``) -----------------------------------------

def shared_prefix_inputs(seed: int, seq_lens, groups, **kw):
    """:func:`random_inputs` whose requests share prefixes: ``groups`` is ``[(first, end, prefix_len)]``
    (sorted, disjoint; ``prefix_len`` a multiple of the page size). Requests ``first + 1 .. end - 1``
    of a group read request ``first``'s prefix pages; the pages they held before are poisoned (no
    request maps them any more, so reading one shows up as an error). Returns ``(inputs,
    SharedPrefix)``."""
    from ..shared_prefix import PrefixGroup, SharedPrefix

    inp = random_inputs(seed, seq_lens, **kw)
    page = inp.k_cache.shape[1]
    bt = inp.block_table
    poison = 127 if inp.k_cache.dtype == np.int8 else POISON
    for first, end, L in groups:
        n = L // page
        for b in range(first + 1, end):
            old = bt[b, :n].copy()
            bt[b, :n] = bt[first, :n]
            inp.k_cache[old] = poison
            inp.v_cache[old] = poison
    return inp, SharedPrefix(tuple(PrefixGroup(f, e, L) for f, e, L in groups))


@dataclass(frozen=True)
class SharedPrefixCase:
    """A shared-prefix parity case: ``build()`` gives ``(inputs, SharedPrefix)``; ``mode`` is the
    planner's (``on``: the shared route whatever the estimate, so every case runs it)."""

    name: str
    build: Callable
    size: str = "small"
    policy: str = "auto"
    mode: str = "on"
    doc: str = ""


def _sp(seed, seq, groups, **kw):
    return lambda: shared_prefix_inputs(seed, seq, groups, **kw)


def _build_shared_prefix_catalog() -> list:
    C = []
    add = C.append
    add(SharedPrefixCase("shared-prefix/one-group", _sp(301, [70, 90, 75, 49], [(0, 4, 48)], page_size=8),
                         doc="four requests share 48 tokens (6 pages of 8), tails 1-42 tokens"))
    add(SharedPrefixCase("shared-prefix/two-groups-and-loner", _sp(302, [40, 57, 33, 80, 66, 20],
                                                                    [(0, 2, 32), (3, 5, 64)], page_size=16),
                         policy="size:16", doc="two prefix groups, requests 2 and 5 on their own"))
    add(SharedPrefixCase("shared-prefix/gqa3-multi-query", _sp(303, [61, 70, 64], [(0, 3, 40)], num_q_heads=6,
                                                               num_kv_heads=2, q_lens=[2, 3, 1], page_size=8),
                         doc="GQA 3, multi-query requests (causal tails after the prefix)"))
    add(SharedPrefixCase("shared-prefix/window-inside-prefix", _sp(304, [72, 80, 60], [(0, 3, 48)], q_lens=[1, 2, 1],
                                                                   window_left=30, page_size=8),
                         doc="a window of 30 starts inside the 48-token prefix for every row, at different places"))
    add(SharedPrefixCase("shared-prefix/soft-cap-bf16", _sp(305, [50, 45, 66], [(0, 3, 32)], soft_cap=8.0,
                                                            q_scale=4.0, dtype="bfloat16", page_size=16)))
    add(SharedPrefixCase("shared-prefix/int8-channel-offset", _sp(306, [40, 55, 70], [(0, 3, 32)], kv_quant="channel",
                                                                  kv_offset=True, dtype="float16", page_size=8)))
    add(SharedPrefixCase("shared-prefix/page1-empty-tail", _sp(307, [9, 13, 10], [(0, 3, 9)], q_lens=[0, 1, 1],
                                                               page_size=1),
                         doc="page size 1; request 0 has no query rows"))
    return C


SHARED_PREFIX_CATALOG: list = _build_shared_prefix_catalog()
