"""The twin's cube, event and cross-core rules (round 2), each on a planted kernel and its legal twin.

Every defect below was let through by the twin before, and every legal kernel below was refused by
it; each is written after what CANN's headers, API pages or production kernels say (the rule's
source is cited in ``ascend_ops/sim/sim_limits.h`` / ``kernel_operator.h``). Verdicts must not
depend on the block order: a planted defect is rejected and a legal kernel runs in *every* order.
A test double: nothing here ran on an NPU.
"""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

sim = pytest.importorskip("ascend_ops.sim_backend")
pytestmark = pytest.mark.skipif(sim.compiler_missing() is not None, reason=str(sim.compiler_missing()))

D = 32                      # head dim of the small products
REGION = 16384              # GM bytes per AI core
Q_OFF, K_OFF, S_OFF = 0, 1024, 4096   # q [16, D] half, k [16, D] half, s [16, 16] float

KERNELS = r'''
#include "kernel_operator.h"
using namespace AscendC;

#define ENTRY(name) extern "C" __global__ __aicore__ void name(GM_ADDR x)
template <HardEvent E>
__aicore__ inline void Sync() { const int id = GetTPipePtr()->FetchEventID(E); SetFlag<E>(id); WaitFlag<E>(id); }
constexpr int D = 32, REGION = 16384, Q_OFF = 0, K_OFF = 1024, S_OFF = 4096;

// ---- the cube: S = q k^T for `rows` query rows (1 or 16) written by ND2NZ; Mmad's m and the
// Fixpipe's mSize as given; optional unit flags instead of the M_FIX flag.
struct Cube {
    TPipe pipe;
    TBuf<TPosition::A1> qL1; TBuf<TPosition::B1> kL1; TBuf<TPosition::A2> qL0; TBuf<TPosition::B2> kL0;
    TBuf<TPosition::CO1> sL0C;
    GlobalTensor<half> q, k; GlobalTensor<float> s;
    LocalTensor<half> q0, k0; LocalTensor<float> c0;
    __aicore__ inline Cube(GM_ADDR base, int rows) {
        pipe.InitBuffer(qL1, 16 * D * 2); pipe.InitBuffer(kL1, 16 * D * 2); pipe.InitBuffer(qL0, 16 * D * 2);
        pipe.InitBuffer(kL0, 16 * D * 2); pipe.InitBuffer(sL0C, 16 * 16 * 4);
        q.SetGlobalBuffer((__gm__ half*)(base + Q_OFF), 16 * D);
        k.SetGlobalBuffer((__gm__ half*)(base + K_OFF), 16 * D);
        s.SetGlobalBuffer((__gm__ float*)(base + S_OFF), 16 * 16);
        LocalTensor<half> q1 = qL1.Get<half>(), k1 = kL1.Get<half>();
        q0 = qL0.Get<half>(); k0 = kL0.Get<half>(); c0 = sL0C.Get<float>();
        DataCopy(q1, q, Nd2NzParams(1, rows, D, 0, D, 16, 1, 0));  // rows 1..15 of a one-row q stay unwritten
        DataCopy(k1, k, Nd2NzParams(1, 16, D, 0, D, 16, 1, 0));
        Sync<HardEvent::MTE2_MTE1>();
        LoadData(q0, q1, LoadData2DParams(0, D / 16, 1, 0, 0, false, 0));
        LoadData(k0, k1, LoadData2DParams(0, D / 16, 1, 0, 0, false, 0));
        Sync<HardEvent::MTE1_M>();
    }
    __aicore__ inline void Mm(int m, uint8_t unitFlag = 0, bool init = true) {
        Mmad(c0, q0, k0, MmadParams(m, 16, D, unitFlag, false, init));
    }
    __aicore__ inline void Fix(int mSize, uint8_t unitFlag = 0, uint16_t srcStride = 16) {
        FixpipeParamsV220 fp(16, mSize, srcStride, 16, false);
        fp.unitFlag = unitFlag;
        Fixpipe<float, float, CFG_ROW_MAJOR>(s, c0, fp);
    }
};
#define CUBE(rows) if ASCEND_IS_AIV { return; } Cube cb(x + REGION * GetBlockIdx(), rows)

// GEMV mode
ENTRY(gemv_m1) { CUBE(1); cb.Mm(1); Sync<HardEvent::M_FIX>(); cb.Fix(1); }
ENTRY(one_row_as_m16_ok) { CUBE(1); cb.Mm(16); Sync<HardEvent::M_FIX>(); cb.Fix(1); }
ENTRY(one_row_m16_reads_stale_rows) { CUBE(1); cb.Mm(16); Sync<HardEvent::M_FIX>(); cb.Fix(16); }
ENTRY(full_tile_ok) { CUBE(16); cb.Mm(16); Sync<HardEvent::M_FIX>(); cb.Fix(16); }
// small accumulating Mmads: (16 / 16) * (16 / 16) = 1 < 10 fractal pairs
ENTRY(small_mmad_accumulate_no_barrier) { CUBE(16); cb.Mm(16); cb.Mm(16, 0, false); Sync<HardEvent::M_FIX>(); cb.Fix(16); }
ENTRY(small_mmad_accumulate_ok) {
    CUBE(16); cb.Mm(16); PipeBarrier<PIPE_M>(); cb.Mm(16, 0, false); Sync<HardEvent::M_FIX>(); cb.Fix(16);
}
// unit flags: a 0b11 pair is the M -> FIX edge; the clearing Fixpipe the FIX -> M edge of the next
ENTRY(unit_flag_pair_ok) { CUBE(16); cb.Mm(16, 3); cb.Fix(16, 3); cb.Mm(16, 3); cb.Fix(16, 3); }
ENTRY(unit_flag_fixpipe_only) { CUBE(16); cb.Mm(16); cb.Fix(16, 3); }
ENTRY(unit_flag_mmad_only) { CUBE(16); cb.Mm(16, 3); cb.Fix(16); }
ENTRY(unit_flag_twice_before_fixpipe) { CUBE(16); cb.Mm(16, 3); cb.Mm(16, 3); cb.Fix(16, 3); }
ENTRY(unit_flag_value_1) { CUBE(16); cb.Mm(16, 1); }
// parameter ranges
ENTRY(fixpipe_src_stride_8) { CUBE(16); cb.Mm(16); Sync<HardEvent::M_FIX>(); cb.Fix(8, 0, 8); }
ENTRY(fixpipe_nd_num_0) {
    CUBE(16); cb.Mm(16); Sync<HardEvent::M_FIX>();
    FixpipeParamsV220 fp(16, 16, 16, 16, false); fp.ndNum = 0;
    Fixpipe<float, float, CFG_ROW_MAJOR>(cb.s, cb.c0, fp);
}
ENTRY(nd2nz_n_value_16385) {
    if ASCEND_IS_AIV { return; }
    TPipe pipe; TBuf<TPosition::A1> l1; pipe.InitBuffer(l1, 512);
    GlobalTensor<half> g; g.SetGlobalBuffer((__gm__ half*)x, 1 << 20);
    DataCopy(l1.Get<half>(), g, Nd2NzParams(1, 16385, 16, 0, 16, 16, 1, 0));
}

// ---- event flags: one bit per (event, id), ids 0..7; TPipe's M_MTE1 ids 0-2 on the cube core
ENTRY(flag_set_twice) {
    if ASCEND_IS_AIC { return; }
    TPipe pipe; SetFlag<HardEvent::V_S>(4); SetFlag<HardEvent::V_S>(4); WaitFlag<HardEvent::V_S>(4);
}
ENTRY(flag_set_wait_twice_ok) {
    if ASCEND_IS_AIC { return; }
    TPipe pipe;
    for (int i = 0; i < 2; i++) { SetFlag<HardEvent::V_S>(4); WaitFlag<HardEvent::V_S>(4); }
}
ENTRY(flag_id_8) {
    if ASCEND_IS_AIC { return; }
    TPipe pipe; SetFlag<HardEvent::V_S>(8); WaitFlag<HardEvent::V_S>(8);
}
ENTRY(m_mte1_id_0_by_hand_under_tpipe) {
    if ASCEND_IS_AIV { return; }
    TPipe pipe; SetFlag<HardEvent::M_MTE1>(0); WaitFlag<HardEvent::M_MTE1>(0);
}
ENTRY(m_mte1_preset_consumed_by_hand) {  // the pipe's own wait at Destroy finds its flag gone (a hang)
    if ASCEND_IS_AIV { return; }
    TPipe pipe; WaitFlag<HardEvent::M_MTE1>(1);
}
// FetchEventID<M_MTE1>: 3 on the cube core (ids 0-2 are the pipe's), 0 on a vector core; AllocEventID
// takes the id, so the next Fetch gives the one after; written to GM for the test to read.
ENTRY(event_ids_ok) {
    TPipe pipe;
    GlobalTensor<int32_t> g; g.SetGlobalBuffer((__gm__ int32_t*)x, 64);
    const int ctx = ASCEND_IS_AIC ? 0 : 1 + int(GetSubBlockIdx());
    if (GetBlockIdx() / GetTaskRation() != 0) return;
    const int fetched = pipe.FetchEventID(HardEvent::M_MTE1);
    TEventID held = pipe.AllocEventID<HardEvent::MTE2_V>();
    const int next = pipe.FetchEventID(HardEvent::MTE2_V);
    pipe.ReleaseEventID<HardEvent::MTE2_V>(held);
    g.SetValue(16 * ctx, fetched);
    g.SetValue(16 * ctx + 1, next);
    DataCacheCleanAndInvalid<int32_t, CacheLine::SINGLE_CACHE_LINE>(g[16 * ctx]);
}
ENTRY(release_unheld_event_id) {
    if ASCEND_IS_AIC { return; }
    TPipe pipe; pipe.ReleaseEventID<HardEvent::MTE2_V>(5);
}

// ---- TPipe scopes: one after the other reuse the same bytes (Init resets the pools; Destroy drains)
__aicore__ inline void write_row(GlobalTensor<float>& g, float v) {
    TPipe pipe; TBuf<TPosition::VECCALC> t; pipe.InitBuffer(t, 256);
    LocalTensor<float> a = t.Get<float>();
    Duplicate(a, v, 64); Sync<HardEvent::V_MTE3>(); DataCopy(g, a, 64);
}
ENTRY(two_tpipe_scopes_ok) {  // the second scope reads what the first wrote to GM: Destroy drained MTE3
    if ASCEND_IS_AIC {
        { TPipe p1; TBuf<TPosition::A1> a; p1.InitBuffer(a, 512 * 1024); }
        { TPipe p2; TBuf<TPosition::A1> b; p2.InitBuffer(b, 512 * 1024); }  // all of L1 again
        return;
    }
    GlobalTensor<float> g; g.SetGlobalBuffer((__gm__ float*)x + 64 * GetBlockIdx(), 64);
    write_row(g, 1.0f);
    TPipe pipe; TBuf<TPosition::VECCALC> t; pipe.InitBuffer(t, 192 * 1024);  // all of the UB again
    LocalTensor<float> a = t.Get<float>();
    DataCopy(a, g, 64); Sync<HardEvent::MTE2_V>(); Adds(a, a, 1.0f, 64); Sync<HardEvent::V_MTE3>(); DataCopy(g, a, 64);
}
ENTRY(second_scope_reads_stale_ub) {  // the first scope's UB bytes are garbage for the second
    if ASCEND_IS_AIC { return; }
    { TPipe p1; TBuf<TPosition::VECCALC> t; p1.InitBuffer(t, 256); Duplicate(t.Get<float>(), 1.0f, 64); PipeBarrier<PIPE_V>(); }
    TPipe p2; TBuf<TPosition::VECCALC> t; p2.InitBuffer(t, 256);
    LocalTensor<float> a = t.Get<float>(); Adds(a[64 * 0], a, 1.0f, 64);
}
ENTRY(two_live_tpipes) {
    if ASCEND_IS_AIC { return; }
    TPipe p1; TPipe p2;
}

// ---- every reader of a GM byte: x[0..64) read by the AIC and by AIV 0, then written by AIV 0
template <bool edge>
__aicore__ inline void ReadersThenWrite(GM_ADDR x) {
    if (GetBlockIdx() / GetTaskRation() != 0) return;
    if ASCEND_IS_AIC {
        TPipe pipe; TBuf<TPosition::A1> l1; pipe.InitBuffer(l1, 512);
        GlobalTensor<half> h; h.SetGlobalBuffer((__gm__ half*)x, 128);
        DataCopy(l1.Get<half>(), h, Nd2NzParams(1, 1, 128, 0, 128, 1, 1, 0));
        if (edge) CrossCoreSetFlag<2, PIPE_MTE2>(1);
        return;
    }
    TPipe pipe; TBuf<TPosition::VECCALC> t; pipe.InitBuffer(t, 256);
    GlobalTensor<float> g; g.SetGlobalBuffer((__gm__ float*)x, 64);
    LocalTensor<float> a = t.Get<float>();
    if (edge) CrossCoreWaitFlag(1);
    if (GetSubBlockIdx() != 0) return;
    DataCopy(a, g, 64); Sync<HardEvent::MTE2_V>(); Adds(a, a, 1.0f, 64); Sync<HardEvent::V_MTE3>();
    DataCopy(g, a, 64);
}
ENTRY(aic_read_then_aiv_write) { ReadersThenWrite<false>(x); }
ENTRY(aic_read_then_aiv_write_ok) { ReadersThenWrite<true>(x); }
// a vector launch: blocks 0 and 1 read x[0..64), block 1 writes it in the same SyncAll epoch
template <bool sync>
__aicore__ inline void VecReadersThenWrite(GM_ADDR x) {
    TPipe pipe; TBuf<TPosition::VECCALC> t; pipe.InitBuffer(t, 256);
    GlobalTensor<float> g; g.SetGlobalBuffer((__gm__ float*)x, 64);
    LocalTensor<float> a = t.Get<float>();
    DataCopy(a, g, 64);
    if (sync) SyncAll();
    if (GetBlockIdx() == 1) { Sync<HardEvent::MTE2_V>(); Adds(a, a, 1.0f, 64); Sync<HardEvent::V_MTE3>(); DataCopy(g, a, 64); }
}
ENTRY(blocks_read_then_one_writes) { VecReadersThenWrite<false>(x); }
ENTRY(blocks_read_sync_then_one_writes_ok) { VecReadersThenWrite<true>(x); }

// ---- the scalar data cache across cores: block 0 reads a word (its cache keeps the line), block 1
// rewrites it (DMA), block 0 reads it again: stale unless DataCacheCleanAndInvalid drops the line
template <bool dcci>
__aicore__ inline void StaleLine(GM_ADDR x) {
    TPipe pipe; TBuf<TPosition::VECCALC> t; pipe.InitBuffer(t, 256);
    GlobalTensor<float> g; g.SetGlobalBuffer((__gm__ float*)x, 64);
    GlobalTensor<float> out; out.SetGlobalBuffer((__gm__ float*)x + 64, 64);
    float first = 0.0f;
    if (GetBlockIdx() == 0) first = g.GetValue(0);
    SyncAll();
    if (GetBlockIdx() == 1) {
        LocalTensor<float> a = t.Get<float>(); Duplicate(a, 7.0f, 64); Sync<HardEvent::V_MTE3>(); DataCopy(g, a, 64);
    }
    SyncAll();
    if (GetBlockIdx() == 0) {
        if (dcci) DataCacheCleanAndInvalid<float, CacheLine::SINGLE_CACHE_LINE>(g);
        out.SetValue(0, first + g.GetValue(0));
        DataCacheCleanAndInvalid<float, CacheLine::SINGLE_CACHE_LINE>(out);
    }
}
ENTRY(other_block_wrote_cached_line) { StaleLine<false>(x); }
ENTRY(other_block_wrote_line_dcci_ok) { StaleLine<true>(x); }

// ---- cross-core run-ahead: the AIC sets flag 1 twenty times, each AIV waits twenty times. A
// counter holds 15 pending sets, so set 16 must be ordered after wait 1 (and so on): with `credit`,
// both AIVs acknowledge their first 5 waits (flag 2) and the AIC waits for an acknowledgement
// before each of its sets 16..20.
template <bool credit>
__aicore__ inline void RunAhead(GM_ADDR) {
    if ASCEND_IS_AIC {
        for (int k = 1; k <= 20; k++) {
            if (credit && k > 15) CrossCoreWaitFlag(2);
            CrossCoreSetFlag<2, PIPE_FIX>(1);
        }
    } else {
        for (int j = 1; j <= 20; j++) {
            CrossCoreWaitFlag(1);
            if (credit && j <= 5) CrossCoreSetFlag<2, PIPE_MTE2>(2);
        }
    }
}
// ---- SyncAll over every AI core: more blocks than the device has cores can never all arrive
ENTRY(sync_all_every_core) {
    if ASCEND_IS_AIV { TPipe pipe; }
    SyncAll<false>();
}
ENTRY(cross_sets_run_ahead) { RunAhead<false>(x); }
ENTRY(cross_sets_with_credit_ok) { RunAhead<true>(x); }
'''

# (kernel, rule, words in the message); each must be rejected in every block order
BAD = [
    ("gemv_m1", "gemv", "GEMV mode"),
    ("one_row_m16_reads_stale_rows", "uninit-read", "computed from A rows / B columns nothing wrote"),
    ("small_mmad_accumulate_no_barrier", "mmad-barrier", "PipeBarrier<PIPE_M>"),
    ("unit_flag_fixpipe_only", "unit-flag", "waits forever"),
    ("unit_flag_mmad_only", "pipe-race", "M_FIX"),
    ("unit_flag_twice_before_fixpipe", "unit-flag", "earlier product"),
    ("unit_flag_value_1", "cube-param", "unitFlag 1"),
    ("fixpipe_src_stride_8", "cube-param", "not a multiple of 16"),
    ("fixpipe_nd_num_0", "cube-param", "ndNum = 0"),
    ("nd2nz_n_value_16385", "cube-param", "nValue = 16385"),
    ("flag_set_twice", "flag", "already set"),
    ("flag_id_8", "flag", "ids are 0..7"),
    ("m_mte1_id_0_by_hand_under_tpipe", "flag", "already set by TPipe (Init)"),
    ("m_mte1_preset_consumed_by_hand", "flag", "TPipe::Destroy"),
    ("release_unheld_event_id", "flag", "AllocEventID does not hold"),
    ("second_scope_reads_stale_ub", "uninit-read", "nothing has written"),
    ("two_live_tpipes", "tpipe", "second TPipe"),
    ("aic_read_then_aiv_write", "gm-race", "AIC 0"),
    ("other_block_wrote_cached_line", "dcache", "stale line"),
    ("cross_sets_run_ahead", "cross-flag", "runs ahead"),
]
GOOD = ["one_row_as_m16_ok", "full_tile_ok", "small_mmad_accumulate_ok", "unit_flag_pair_ok", "flag_set_wait_twice_ok",
        "event_ids_ok", "two_tpipe_scopes_ok", "aic_read_then_aiv_write_ok", "other_block_wrote_line_dcci_ok",
        "cross_sets_with_credit_ok"]
VECTOR_ONLY = {"blocks_read_then_one_writes", "blocks_read_sync_then_one_writes_ok", "other_block_wrote_cached_line",
               "other_block_wrote_line_dcci_ok"}
ORDERS = [0, 1, 12345, 777]  # forward, reverse, two seeded shuffles


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    dll = sim.load_kernels(KERNELS, tmp_path_factory.mktemp("cube2"), "twin_cube_rules")
    yield dll
    sim.set_block_order(dll, 0)


def inputs(blocks: int, seed: int = 0):
    """Per AI core: q [16, D] and k [16, D] half; the rest NaN-patterned (unwritten output shows)."""
    rng = np.random.default_rng(seed)
    buf = np.full(REGION * blocks, 0xFF, np.uint8)
    qk = []
    for b in range(blocks):
        q = rng.standard_normal((16, D)).astype(np.float16)
        k = rng.standard_normal((16, D)).astype(np.float16)
        buf[b * REGION + Q_OFF:b * REGION + Q_OFF + q.nbytes] = q.view(np.uint8).ravel()
        buf[b * REGION + K_OFF:b * REGION + K_OFF + k.nbytes] = k.view(np.uint8).ravel()
        qk.append((q, k))
    return buf, qk


def run(lib, name, order=0, blocks=2, buf=None):
    if buf is None:
        buf = inputs(blocks)[0]
    err = ctypes.create_string_buffer(4096)
    sim.set_block_order(lib, order)
    launch = lib.sim_launch_1 if name in VECTOR_ONLY else lib.sim_launch_mix_1
    rc = launch(ctypes.cast(getattr(lib, name), ctypes.c_void_p), ctypes.c_void_p(buf.ctypes.data), blocks, err,
                len(err))
    return rc, err.value.decode(), buf


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("name,rule,words", BAD, ids=[b[0] for b in BAD])
def test_planted_defect_is_rejected_in_every_order(lib, name, rule, words, order):
    rc, msg, _ = run(lib, name, order)
    assert rc == 1 and f"[{rule}]" in msg and words in msg, msg


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("name", GOOD + ["blocks_read_sync_then_one_writes_ok"])
def test_legal_kernel_runs_in_every_order(lib, name, order):
    rc, msg, _ = run(lib, name, order)
    assert rc == 0, msg


@pytest.mark.parametrize("order", ORDERS)
def test_a_write_after_two_blocks_read_is_a_race_in_every_order(lib, order):
    """Before, a vector launch kept no reader of a GM byte: the race was found only when the writing
    block happened to run before the other reader (then as a read of another block's write)."""
    rc, msg, _ = run(lib, "blocks_read_then_one_writes", order)
    assert rc == 1 and "[gm-race]" in msg, msg
    if order == 0:  # block 0 read first: the write is the second access
        assert "block 0 may still read it" in msg, msg


def products(lib, name, order):
    """Run a legal product kernel on two AI cores: per core, its S [16, 16] float and its (q, k)."""
    buf, qk = inputs(2, seed=order)
    rc, msg, buf = run(lib, name, order, buf=buf)
    assert rc == 0, msg
    return [(buf[b * REGION + S_OFF:b * REGION + S_OFF + 16 * 16 * 4].view(np.float32).reshape(16, 16), qk[b])
            for b in range(2)]


@pytest.mark.parametrize("order", ORDERS)
def test_one_query_row_as_m16_gives_the_product_of_row_0(lib, order):
    """CANN's workaround for GEMV mode: one row in L1, m = 16, the Fixpipe writes row 0 only."""
    for s, (q, k) in products(lib, "one_row_as_m16_ok", order):
        np.testing.assert_allclose(s[0], q[0].astype(np.float64) @ k.astype(np.float64).T, rtol=0, atol=1e-4)
        assert np.isnan(s[1:]).all()  # rows the Fixpipe did not write


@pytest.mark.parametrize("order", ORDERS)
def test_unit_flag_pair_orders_the_fixpipe_after_the_mmad(lib, order):
    for s, (q, k) in products(lib, "unit_flag_pair_ok", order):
        np.testing.assert_allclose(s, q.astype(np.float64) @ k.astype(np.float64).T, rtol=0, atol=1e-4)


def test_fetch_event_id_skips_the_tpipes_m_mte1_ids_on_the_cube_core(lib):
    buf = np.zeros(REGION * 2, np.uint8)
    rc, msg, buf = run(lib, "event_ids_ok", buf=buf)
    assert rc == 0, msg
    words = buf.view(np.int32)
    assert list(words[[0, 1]]) == [3, 1]             # AIC: M_MTE1 ids 0-2 held by the pipe; MTE2_V id 0 allocated
    assert list(words[[16, 17, 32, 33]]) == [0, 1, 0, 1]  # AIVs: nothing preset


@pytest.mark.parametrize("order", ORDERS)
def test_the_second_tpipe_scope_reads_what_the_first_wrote(lib, order):
    buf = np.zeros(REGION * 2, np.uint8)
    rc, msg, buf = run(lib, "two_tpipe_scopes_ok", order, buf=buf)
    assert rc == 0, msg
    np.testing.assert_array_equal(buf.view(np.float32)[:4 * 64], 2.0)


@pytest.mark.parametrize("order", ORDERS)
def test_sync_all_launch_beyond_the_devices_cores_is_a_hang(lib, order):
    """A 910B3 has 20 AI cores: a fused launch of 24 (the 910B2's) would wait in SyncAll forever."""
    lib.sim_set_cores.argtypes = [ctypes.c_int, ctypes.c_int]
    try:
        lib.sim_set_cores(2, 4)
        assert run(lib, "sync_all_every_core", order, blocks=2)[0] == 0
        lib.sim_set_cores(1, 2)
        rc, msg, _ = run(lib, "sync_all_every_core", order, blocks=2)
        assert rc == 1 and "[syncall]" in msg and "a launch of 2 AI cores on a device with 1" in msg, msg
    finally:
        lib.sim_set_cores(0, 0)


def test_the_tiling_never_launches_more_ai_cores_than_the_device_has():
    from ascend_ops import tiling as tl
    from splitkv_common.parity.cases import random_inputs

    inp = random_inputs(3, [4000, 900], num_q_heads=16, num_kv_heads=4, head_dim=128, page_size=64, dtype="bfloat16")
    plan = inp.plan("size:128", device="910b3")
    til = tl.build_tiling(inp, plan, "910b3")
    assert til.mixed and til.block_dim == 20  # every one of the 910B3's cube cores, no more
    with pytest.raises(ValueError, match="block_dim: 24 AI cores .* has 20"):
        tl.build_tiling(inp, plan, "910b3", block_dim=24)
