"""Host tiling of the Ascend C kernels (ascend_ops.tiling): plan words, coverage, UB budgets,
workspace size, and agreement with what the kernels do on the CPU twin."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ascend_ops import tiling as tl
from splitkv_common.parity.cases import random_inputs
from splitkv_common.plan import make_plan

HEAD_DIMS = (64, 80, 96, 128, 256)
DTYPES = ("float32", "float16", "bfloat16")


def test_header_fields_are_the_struct():
    assert tl.TILING_BYTES == 4 * len(tl.FIELDS) == 46 * 4
    assert tl.FIELD_NAMES[0] == "version" and "workspaceBytes" in tl.FIELD_NAMES
    t = {n: (1.5 if k == "f" else i) for i, (n, k) in enumerate(tl.FIELDS)}
    assert tl.unpack_tiling(tl.pack_tiling(t)) == t


def _decode_items(words: np.ndarray, t: dict) -> np.ndarray:
    return words[t["itemsOffset"]:t["itemsOffset"] + 5 * t["numItems"]].reshape(-1, 5)


def _buffers(seq, *, page, hkv=2, hq=4, d=64, q_lens=None, policy="auto", window=None, graph_stable=False):
    plan = make_plan(seq, num_kv_heads=hkv, page_size=page, q_lens=q_lens, policy=policy, device="910b2",
                     num_q_heads=hq, head_dim=d, window_left=window, graph_stable=graph_stable,
                     min_split_tokens=page)
    max_pages = max(1, max(-(-s // page) for s in seq))
    t, _, words = tl.build_buffers(plan, seq_lens=np.asarray(seq, np.int32), num_q_heads=hq, head_dim=d,
                                   page_size=page, max_pages=max_pages, num_pages=max_pages * len(seq),
                                   dtype="float16", kv_dtype="float16", scale=0.125, window_left=window)
    return plan, t, words


@settings(max_examples=60, deadline=None)
@given(seq=st.lists(st.integers(0, 300), min_size=1, max_size=5), page=st.sampled_from([1, 3, 8, 16, 64]),
       policy=st.sampled_from(["auto", "none", "count:3", "count:7", "size"]),
       window=st.one_of(st.none(), st.integers(0, 40)), qmax=st.integers(1, 4), gs=st.booleans())
def test_every_kv_token_covered_exactly_once(seq, page, policy, window, qmax, gs):
    """Decoded from the words the kernel reads: per (request, KV head) the item ranges tile the
    visible span (from the page holding its first visible position) with no gap or overlap, and so
    do the kernel's UB tiles inside each item."""
    q_lens = [min(qmax, max(1, s)) for s in seq]
    pol = f"size:{page * 4}" if policy == "size" else policy
    plan, t, words = _buffers(seq, page=page, q_lens=q_lens, policy=pol, window=window, graph_stable=gs)
    items = _decode_items(words, t)
    qsl = words[t["qslOffset"]:t["qslOffset"] + t["batch"] + 1]
    sl = words[t["seqLensOffset"]:t["seqLensOffset"] + t["batch"]]
    assert list(sl) == seq and list(np.diff(qsl)) == q_lens
    for b, s in enumerate(seq):
        lo = 0 if window is None else max(0, s - q_lens[b] - window)
        want = np.zeros(s, np.int64)
        want[(lo // page) * page:] = 1
        for h in range(2):
            mine = items[(items[:, 0] == b) & (items[:, 1] == h)]
            assert len(mine) >= 1  # an empty request still gets its (empty) item
            cover = np.zeros(s, np.int64)
            tile_cover = np.zeros(s, np.int64)
            for _, _, j, a, e in mine:
                cover[a:e] += 1
                for p0 in range(a, e, t["tileTokens"]):  # the kernel's tile walk
                    tile_cover[p0:min(e, p0 + t["tileTokens"])] += 1
            np.testing.assert_array_equal(cover, want)
            np.testing.assert_array_equal(tile_cover, want)
            # partial slots of the request's rows stay inside the workspace
            for r in range(qsl[b], qsl[b + 1]):
                slot0 = words[t["rowSlotOffset"] + r]
                assert slot0 + mine[:, 2].max() < t["numSlots"]
    pad = items[items[:, 0] < 0]
    assert (pad[:, 3] == pad[:, 4]).all()


@pytest.mark.parametrize("d", HEAD_DIMS + (8, 16, 24, 40, 112, 160, 192))
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("int8", [False, True])
@pytest.mark.parametrize("rows", [1, 8, 64, 512])
def test_no_tile_over_the_ub_budget(d, dtype, int8, rows):
    kv = "int8" if int8 else dtype
    for cap in (False, True):
        tt, rc = tl.choose_tiles(d, dtype, kv, rows, cap)
        assert 1 <= rc <= rows and tt in tl.TILE_CANDIDATES
        assert sum(tl.split_ub_bytes(d, dtype, kv, tt, rc, cap).values()) <= tl.UB_BYTES
        if rows <= 8:  # small GQA groups are held whole with tiles of at least 32 tokens
            assert rc == rows and tt >= 32
    for splits in (1, 8, 32, 64):
        assert sum(tl.combine_ub_bytes(d, dtype, 64, splits).values()) <= tl.UB_BYTES
    assert all(v % 32 == 0 for v in tl.split_ub_bytes(d, dtype, kv, 32, 3, True).values())


def test_ub_rule_violations_raise_naming_the_rule():
    with pytest.raises(ValueError, match="UB budget.*192 KiB|UB budget.*Unified Buffer"):
        tl.choose_tiles(256, "float16", "int8", 4, True, ub_bytes=16 * 1024)
    plan = make_plan([5000], num_kv_heads=1, page_size=1, policy="count:2000", device="910b2", max_splits=2000)
    with pytest.raises(ValueError, match="UB budget: the combine kernel"):
        tl.build_buffers(plan, seq_lens=[5000], num_q_heads=1, head_dim=256, page_size=1, max_pages=5000,
                         num_pages=5000, dtype="float32", kv_dtype="float32", scale=1.0)
    with pytest.raises(ValueError, match="head dim 100"):
        tl.build_buffers(plan, seq_lens=[5000], num_q_heads=1, head_dim=100, page_size=1, max_pages=5000,
                         num_pages=5000, dtype="float32", kv_dtype="float32", scale=1.0)
    with pytest.raises(ValueError, match="kv_dtype"):
        tl.build_buffers(plan, seq_lens=[5000], num_q_heads=1, head_dim=64, page_size=1, max_pages=5000,
                         num_pages=5000, dtype="float16", kv_dtype="bfloat16", scale=1.0)


def test_workspace_layout():
    lse_off, total = tl.workspace_bytes(num_slots=7, num_q_heads=4, head_dim=80)
    assert tl.ERROR_BYTES == tl.ERROR_SLOTS * tl.ERROR_SLOT_BYTES and tl.ERROR_SLOT_BYTES % 64 == 0  # a cache line each
    assert lse_off == tl.ERROR_BYTES + 7 * 4 * 80 * 4 and total == lse_off + 7 * 4 * 8 * 4
    assert lse_off % 32 == 0


# ---- agreement with the kernels on the CPU twin -------------------------------------------------
sim = pytest.importorskip("ascend_ops.sim_backend")
needs_twin = pytest.mark.skipif(sim.compiler_missing() is not None, reason=str(sim.compiler_missing()))


@needs_twin
@pytest.mark.parametrize("d", HEAD_DIMS)
@pytest.mark.parametrize("dtype,kv", [("float32", None), ("float16", None), ("bfloat16", None),
                                      ("float16", "channel"), ("bfloat16", "head")])
def test_twin_ub_use_equals_host_budget(d, dtype, kv):
    """The kernel's own InitBuffer calls (measured by the twin) add up to the host's split budget."""
    inp = random_inputs(d + 1, [40, 7], num_q_heads=8, num_kv_heads=2, head_dim=d, dtype=dtype, kv_quant=kv,
                        soft_cap=30.0 if d == 96 else None, q_lens=[2, 1])
    plan = inp.plan("size:16", device="910b2")
    ws, peak, til = sim.run_split(inp, plan)
    want = til.fields["mixUbBytes"] if til.mixed else til.fields["splitUbBytes"]
    assert peak == want <= tl.UB_BYTES
    assert til.mixed == (dtype != "float32" and d % (32 if kv else 16) == 0)  # int8 KV: whole int8 fractals


@needs_twin
@pytest.mark.parametrize("head_dim", [72, 64])  # 72: vector kernel; 64: mixed kernel (+ scratch)
@pytest.mark.parametrize("graph_stable", [False, True])
def test_workspace_size_matches_what_the_kernel_writes(graph_stable, head_dim):
    """Every workspace byte of a used slot is written, none past workspaceBytes (guard intact)."""
    inp = random_inputs(3, [37, 0, 100, 5], num_q_heads=6, num_kv_heads=2, head_dim=head_dim, dtype="float16",
                        q_lens=[1, 1, 3, 2], page_size=8)
    plan = inp.plan("size:16", device="910b2", graph_stable=graph_stable, max_splits=8)
    guard = 4096
    ws, _, til = sim.run_split(inp, plan, guard_bytes=guard)
    assert til.mixed == (head_dim % 16 == 0)
    partials = tl.workspace_bytes(plan.num_slots, 6, head_dim)[1]
    if til.mixed:  # the per-AI-core scratch follows the partials, 512-byte aligned
        f = til.fields
        assert f["scratchOffsetBytes"] == -(-partials // 512) * 512
        assert til.workspace_bytes == f["scratchOffsetBytes"] + til.block_dim * f["scratchCoreBytes"]
        assert f["scratchCoreBytes"] == tl.mix_scratch_core_bytes(
            head_dim, "float16", f["mixTileTokens"] * f["mixStepTiles"], f["mixRowsPad"])
    else:
        assert til.workspace_bytes == partials
    total = til.workspace_bytes
    assert (ws[total:] == sim.WS_POISON).all(), "the split stage wrote past workspaceBytes"
    assert not ws[:tl.ERROR_BYTES].any(), "a clean launch counted errors"
    words = ws[tl.ERROR_BYTES:partials].view(np.uint32)
    written = words != 0xFFFFFFFF
    T, Hq, D = inp.q.shape
    o = written[: plan.num_slots * Hq * D].reshape(plan.num_slots, Hq, D)
    lse = written[plan.num_slots * Hq * D:].reshape(plan.num_slots, Hq, 8)
    used = np.zeros(plan.num_slots, bool)
    for t in range(T):
        used[plan.row_slot_start[t]:plan.row_slot_start[t] + plan.row_num_splits[t]] = True
    assert o[used].all() and lse[used].all()
    assert not o[~used].any() and not lse[~used].any()
    if not graph_stable:
        assert used.all()


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("soft_cap", [False, True])
@pytest.mark.parametrize("kv_dtype", [None, "int8"])
@pytest.mark.parametrize("multi_query", [False, True])
def test_mixed_tiles_fit_every_unit(dtype, soft_cap, kv_dtype, multi_query):
    """The mixed split stage's tile fits L1, L0A, L0B, L0C and the UB for every head dim and row count
    it takes (always up to 64 rows), with int8 KV's buffers (the expanded q and P rows, the int32
    results) and the causal band's V row buffers of several query rows (16-bit KV only) counted
    together; 256-token tiles for D <= 128 and the GQA groups of decode."""
    for d in range(32 if kv_dtype == "int8" else 16, 257, 32 if kv_dtype == "int8" else 16):
        for rows in (1, 4, 8, 16, 32, 64, 100, 128):
            got = tl.choose_mix_tiles(d, dtype, rows, soft_cap, kv_dtype=kv_dtype, multi_query=multi_query)
            if got is None:  # 128 rows at D 256 overflow L0A, and with int8 KV (3 expanded q rows and
                # 2 P rows per row, their UB buffers) 64 rows at D >= 128: the vector kernel serves those
                assert rows > 64 or (kv_dtype == "int8" and rows == 64 and d >= 128), (d, rows)
                continue
            tt, mp, steps = got
            assert mp % 16 == 0 and mp >= rows and tt % (32 if kv_dtype == "int8" else 16) == 0
            assert steps >= 1 and steps & (steps - 1) == 0 and tt * steps <= tl.MIX_MAX_STEP_TOKENS
            cube = tl.mix_cube_bytes(d, tt, mp, kv_dtype, tt * steps)
            assert cube["L1"] <= tl.L1_BYTES and cube["L0A"] <= tl.L0A_BYTES
            assert cube["L0B"] <= tl.L0B_BYTES and cube["L0C"] <= tl.L0C_BYTES
            ub = tl.mix_ub_bytes(d, dtype, tt * steps, mp, soft_cap, kv_dtype, multi_query)
            assert sum(ub.values()) <= tl.UB_BYTES
            assert any(k.startswith("vb") for k in ub) == (multi_query and kv_dtype is None)
            if d <= 128 and rows <= 16:
                assert tt == 256
                if kv_dtype is None:  # decode's GQA groups: the longest exchange step
                    assert tt * steps == tl.MIX_MAX_STEP_TOKENS, (d, rows, tt, steps)
            # a longer step would not fit
            if tt * steps * 2 <= tl.MIX_MAX_STEP_TOKENS:
                bigger = tl.mix_cube_bytes(d, tt, mp, kv_dtype, tt * steps * 2)["L1"] > tl.L1_BYTES or sum(
                    tl.mix_ub_bytes(d, dtype, tt * steps * 2, mp, soft_cap, kv_dtype, multi_query).values()) > tl.UB_BYTES
                assert bigger, (d, rows, tt, steps)
    assert tl.choose_mix_tiles(128, "bfloat16", 129, False) is None  # more rows: the vector kernel


def test_no_copy_over_the_dma_block_limit():
    """Every strided copy's blockCount stays within dav-c220's 4095 for the tilings the host builds,
    and a tiling that would exceed it is refused naming the copy."""
    inp = random_inputs(3, [5000, 64], num_q_heads=64, num_kv_heads=1, head_dim=128, page_size=16,
                              dtype="bfloat16")
    for kernel in ("vector", "mix"):
        til = tl.build_tiling(inp, inp.plan("size:512", device="910b2"), kernel=kernel)
        assert max(tl.dma_block_counts(til.fields).values()) <= tl.DMA_MAX_BLOCKS
    bad = dict(til.fields, maxSplits=4096)
    with pytest.raises(ValueError, match="DMA block count: combine"):
        tl.check_dma_block_counts(bad)


def test_every_kernel_entry_declares_its_task_type():
    """KERNEL_TASK_TYPE_DEFAULT on every entry (AIV only for the vector kernels, MIX_AIC_1_2 for the mixed)."""
    import re

    seen = set()
    for src in (tl.HEADER.parent).glob("*.cpp"):
        text = src.read_text()
        for m in re.finditer(r'extern "C" __global__ __aicore__ void (\w+)\(.*?\{(.*?)\n\}', text, re.S):
            name, body = m.group(1), m.group(2)
            want = "KERNEL_TYPE_MIX_AIC_1_2" if "mix" in name else "KERNEL_TYPE_AIV_ONLY"
            assert f"KERNEL_TASK_TYPE_DEFAULT({want})" in body, name
            seen.add(name)
    assert seen == {"splitkv_split", "splitkv_combine", "splitkv_split_mix", "splitkv_attention_mix"}
