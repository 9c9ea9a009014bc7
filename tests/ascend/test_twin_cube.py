"""The CPU twin's cube unit and mixed (AIC + AIV) launches, on planted kernels.

A small mixed kernel computes S = Q Kᵀ on the cube (GM -> L1 with ND->NZ, LoadData into L0A/L0B,
Mmad into L0C, Fixpipe to a GM workspace), hands it to its two vector cores with a cross-core
flag, and they take a row softmax of it; the result is checked against NumPy. Each planted mistake
must be rejected by its named rule and each legal counterpart must run, in every context order.
A test double: nothing here ran on an NPU.
"""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

sim = pytest.importorskip("ascend_ops.sim_backend")
pytestmark = pytest.mark.skipif(sim.compiler_missing() is not None, reason=str(sim.compiler_missing()))

M, D, N = 16, 64, 64          # query rows (a GQA group padded to one fractal row), head dim, tokens
REGION = 32768                # bytes of GM per AI core: Q, K, S workspace, softmax output
Q_OFF, K_OFF, S_OFF, O_OFF = 0, 2048, 10240, 14336

KERNELS = r'''
#include "kernel_operator.h"
using namespace AscendC;

#define ENTRY(name) extern "C" __global__ __aicore__ void name(GM_ADDR x)
// a free id of E (under a TPipe on the cube core, M_MTE1 ids 0-2 are the pipe's: FetchEventID skips them)
template <HardEvent E>
__aicore__ inline void Sync() { const int id = GetTPipePtr()->FetchEventID(E); SetFlag<E>(id); WaitFlag<E>(id); }
constexpr int M = 16, D = 64, N = 64, REGION = 32768;
constexpr int Q_OFF = 0, K_OFF = 2048, S_OFF = 10240, O_OFF = 14336;

// Bugs each kernel variant can plant (one at a time).
enum Bug { NONE, NO_MTE1_M, NO_M_FIX, L0A_OVERFLOW, K_FLOOR, K_OVER_4095, NO_CROSS_WAIT, EXTRA_SET,
           L0C_REUSE, FLAG_ID_11, WAIT_FOREVER, VEC_ON_AIC, MMAD_ON_AIV, FIXPIPE_TO_UB, TWO_ROUNDS_NO_RELEASE,
           TWO_ROUNDS };

// The cube half: S [M, N] = Q [M, k] x K [N, k]^T for the first k columns (k = D unless a bug says
// otherwise), written as float rows to this AI core's workspace, then flag 1 to both AIVs.
template <Bug bug>
__aicore__ inline void Cube(GM_ADDR base, int k) {
    TPipe pipe;
    TBuf<TPosition::A1> qL1; TBuf<TPosition::B1> kL1; TBuf<TPosition::A2> qL0; TBuf<TPosition::B2> kL0;
    TBuf<TPosition::CO1> sL0C;
    const int K1 = (k + 15) / 16, kLoad = bug == K_FLOOR ? k / 16 : K1;
    pipe.InitBuffer(qL1, M * K1 * 16 * 2); pipe.InitBuffer(kL1, N * K1 * 16 * 2);
    pipe.InitBuffer(qL0, bug == L0A_OVERFLOW ? 64 * 1024 + 512 : M * K1 * 16 * 2);
    pipe.InitBuffer(kL0, N * K1 * 16 * 2); pipe.InitBuffer(sL0C, M * N * 4);
    GlobalTensor<half> q, kk; GlobalTensor<float> s;
    q.SetGlobalBuffer((__gm__ half*)(base + Q_OFF), M * D);
    kk.SetGlobalBuffer((__gm__ half*)(base + K_OFF), N * D);
    s.SetGlobalBuffer((__gm__ float*)(base + S_OFF), M * N);
    LocalTensor<half> q1 = qL1.Get<half>(), k1 = kL1.Get<half>(), q0 = qL0.Get<half>(), k0 = kL0.Get<half>();
    LocalTensor<float> c0 = sL0C.Get<float>();
    // ND -> NZ: rows of k elements (source row stride D), 16-row fractal columns (C0 stride = rows)
    DataCopy(q1, q, Nd2NzParams(1, M, k, 0, D, M, 1, 0));
    DataCopy(k1, kk, Nd2NzParams(1, N, k, 0, D, N, 1, 0));
    Sync<HardEvent::MTE2_MTE1>();
    // L1 NZ -> L0A "ZZ" (one fractal row: same order) and L0B "ZN" (NZ fractals of K are Kᵀ's ZN)
    LoadData(q0, q1, LoadData2DParams(0, kLoad, 1, 0, 0, false, 0));
    LoadData(k0, k1, LoadData2DParams(0, kLoad * (N / 16), 1, 0, 0, false, 0));
    if (bug != NO_MTE1_M) Sync<HardEvent::MTE1_M>();
    Mmad(c0, q0, k0, MmadParams(M, N, bug == K_OVER_4095 ? 4096 : k, 0, false, true));
    if (bug != NO_M_FIX) Sync<HardEvent::M_FIX>();
    FixpipeParamsV220 fp(N, M, M, N, false);
    if (bug == FIXPIPE_TO_UB) { LocalTensor<float> ub(0, 4096); Fixpipe(ub, c0, fp); }
    Fixpipe<float, float, CFG_ROW_MAJOR>(s, c0, fp);
    if (bug == L0C_REUSE) {  // a second product into the same L0C while the Fixpipe may still read it
        Mmad(c0, q0, k0, MmadParams(M, N, k, 0, false, true));
        Sync<HardEvent::M_FIX>();
        Fixpipe<float, float, CFG_ROW_MAJOR>(s, c0, fp);
    }
    if (bug == NONE) {  // the legal reuse: FIX -> M before the next Mmad writes L0C
        Sync<HardEvent::FIX_M>();
        Mmad(c0, q0, k0, MmadParams(M, N, k, 0, false, true));
        Sync<HardEvent::M_FIX>();
        Fixpipe<float, float, CFG_ROW_MAJOR>(s, c0, fp);
    }
    if (bug == VEC_ON_AIC) { LocalTensor<float> ub(0, 4096); Duplicate(ub, 0.0f, 64); }
    CrossCoreSetFlag<2, PIPE_FIX>(bug == FLAG_ID_11 ? 11 : 1);
    if (bug == EXTRA_SET) CrossCoreSetFlag<2, PIPE_FIX>(2);
    if (bug == TWO_ROUNDS || bug == TWO_ROUNDS_NO_RELEASE) {  // round 2 reuses the workspace
        if (bug == TWO_ROUNDS) CrossCoreWaitFlag(3);  // both AIVs have read round 1
        Sync<HardEvent::FIX_M>();
        Mmad(c0, q0, k0, MmadParams(M, N, k, 0, false, true));
        Sync<HardEvent::M_FIX>();
        Fixpipe<float, float, CFG_ROW_MAJOR>(s, c0, fp);
        CrossCoreSetFlag<2, PIPE_FIX>(1);
    }
}

// The vector half: AIV sub-block v takes rows 8v .. 8v+7 of S and writes exp(s - max) / sum per row.
template <Bug bug>
__aicore__ inline void Vec(GM_ADDR base, int rounds) {
    TPipe pipe; TBuf<TPosition::VECCALC> tin, tout, tred, twork;
    pipe.InitBuffer(tin, 8 * N * 4); pipe.InitBuffer(tout, 8 * N * 4);
    pipe.InitBuffer(tred, 32); pipe.InitBuffer(twork, 32);
    LocalTensor<float> a = tin.Get<float>(), b = tout.Get<float>(), r = tred.Get<float>(), w = twork.Get<float>();
    const int row0 = 8 * GetSubBlockIdx();
    GlobalTensor<float> s, o;
    s.SetGlobalBuffer((__gm__ float*)(base + S_OFF) + row0 * N, 8 * N);
    o.SetGlobalBuffer((__gm__ float*)(base + O_OFF) + row0 * N, 8 * N);
    for (int round = 0; round < rounds; round++) {
        if (bug != NO_CROSS_WAIT) CrossCoreWaitFlag(bug == WAIT_FOREVER ? 5 : 1);
        if (round > 0) Sync<HardEvent::V_MTE2>();
        DataCopy(a, s, 8 * N);
        Sync<HardEvent::MTE2_V>();
        // this round's data is in UB: the cube may overwrite the workspace
        if (bug == TWO_ROUNDS && round + 1 < rounds) CrossCoreSetFlag<2, PIPE_MTE2>(3);
        if (round > 0) Sync<HardEvent::MTE3_V>();
        for (int i = 0; i < 8; i++) {
            ReduceMax(r, a[i * N], w, N);
            Sync<HardEvent::V_S>();
            const float mx = r.GetValue(0);
            Adds(b[i * N], a[i * N], -mx, N);
            PipeBarrier<PIPE_V>();
            Exp(b[i * N], b[i * N], N);
            PipeBarrier<PIPE_V>();
            ReduceSum(r, b[i * N], w, N);
            Sync<HardEvent::V_S>();
            const float sum = r.GetValue(0);
            Muls(b[i * N], b[i * N], 1.0f / sum, N);
        }
        Sync<HardEvent::V_MTE3>();
        DataCopy(o, b, 8 * N);
    }
    if (bug == MMAD_ON_AIV) Sync<HardEvent::M_FIX>();
}

template <Bug bug>
__aicore__ inline void Kernel(GM_ADDR x, int k = D) {
    GM_ADDR base = x + REGION * (GetBlockIdx() / (ASCEND_IS_AIV ? GetTaskRation() : 1));
    const int rounds = (bug == TWO_ROUNDS || bug == TWO_ROUNDS_NO_RELEASE) ? 2 : 1;
    if ASCEND_IS_AIC { Cube<bug>(base, k); }
    if ASCEND_IS_AIV { Vec<bug>(base, rounds); }
}

ENTRY(qk_softmax_ok) { Kernel<NONE>(x); }
ENTRY(qk_softmax_k24_ok) { Kernel<NONE>(x, 24); }
ENTRY(mte1_m_missing) { Kernel<NO_MTE1_M>(x); }
ENTRY(m_fix_missing) { Kernel<NO_M_FIX>(x); }
ENTRY(l0a_overflow) { Kernel<L0A_OVERFLOW>(x); }
ENTRY(mmad_k_unaligned_floor) { Kernel<K_FLOOR>(x, 24); }
ENTRY(mmad_k_over_4095) { Kernel<K_OVER_4095>(x); }
ENTRY(vector_reads_without_cross_wait) { Kernel<NO_CROSS_WAIT>(x); }
ENTRY(cross_flag_never_waited) { Kernel<EXTRA_SET>(x); }
ENTRY(l0c_reused_before_fixpipe) { Kernel<L0C_REUSE>(x); }
ENTRY(cross_flag_id_11) { Kernel<FLAG_ID_11>(x); }
ENTRY(cross_wait_forever) { Kernel<WAIT_FOREVER>(x); }
ENTRY(vector_op_on_aic) { Kernel<VEC_ON_AIC>(x); }
ENTRY(cube_event_on_aiv) { Kernel<MMAD_ON_AIV>(x); }
ENTRY(fixpipe_to_ub) { Kernel<FIXPIPE_TO_UB>(x); }
ENTRY(workspace_overwritten_before_read) { Kernel<TWO_ROUNDS_NO_RELEASE>(x); }
ENTRY(workspace_two_rounds_ok) { Kernel<TWO_ROUNDS>(x); }
ENTRY(l0a_full_ok) {  // exactly 64 KiB of L0A fits
    if ASCEND_IS_AIC { TPipe pipe; TBuf<TPosition::A2> a; pipe.InitBuffer(a, 64 * 1024); }
}
// 8 query rows: ND2NZ fills half of each fractal, Mmad m = 8 ignores the rest. T: input type,
// O: Fixpipe output type (float, or a cast to T with the matching quantPre unless `badQuant`).
template <typename T, typename O, bool badQuant = false>
__aicore__ inline void Gqa8(GM_ADDR x) {
    if ASCEND_IS_AIC {
        GM_ADDR base = x + REGION * GetBlockIdx();
        TPipe pipe; TBuf<TPosition::A1> qL1; TBuf<TPosition::B1> kL1; TBuf<TPosition::A2> qL0;
        TBuf<TPosition::B2> kL0; TBuf<TPosition::CO1> sL0C;
        pipe.InitBuffer(qL1, 16 * D * 2); pipe.InitBuffer(kL1, N * D * 2); pipe.InitBuffer(qL0, 16 * D * 2);
        pipe.InitBuffer(kL0, N * D * 2); pipe.InitBuffer(sL0C, 16 * N * 4);
        GlobalTensor<T> q, kk; GlobalTensor<O> s;
        q.SetGlobalBuffer((__gm__ T*)(base + Q_OFF), M * D);
        kk.SetGlobalBuffer((__gm__ T*)(base + K_OFF), N * D);
        s.SetGlobalBuffer((__gm__ O*)(base + S_OFF), M * N);
        LocalTensor<T> q1 = qL1.Get<T>(), k1 = kL1.Get<T>(), q0 = qL0.Get<T>(), k0 = kL0.Get<T>();
        LocalTensor<float> c0 = sL0C.Get<float>();
        DataCopy(q1, q, Nd2NzParams(1, 8, D, 0, D, 16, 1, 0));
        DataCopy(k1, kk, Nd2NzParams(1, N, D, 0, D, N, 1, 0));
        Sync<HardEvent::MTE2_MTE1>();
        LoadData(q0, q1, LoadData2DParams(0, D / 16, 1, 0, 0, false, 0));
        LoadData(k0, k1, LoadData2DParams(0, (D / 16) * (N / 16), 1, 0, 0, false, 0));
        Sync<HardEvent::MTE1_M>();
        Mmad(c0, q0, k0, MmadParams(8, N, D, 0, false, true));
        Sync<HardEvent::M_FIX>();
        FixpipeParamsV220 fp(N, 8, 16, N, false);
        if (!std::is_same<O, float>::value && !badQuant)
            fp.quantPre = std::is_same<O, half>::value ? QuantMode_t::F322F16 : QuantMode_t::F322BF16;
        Fixpipe<O, float, CFG_ROW_MAJOR>(s, c0, fp);
    }
}
ENTRY(gqa_8_rows_ok) { Gqa8<half, float>(x); }
ENTRY(gqa_8_rows_bf16_to_bf16_ok) { Gqa8<bfloat16_t, bfloat16_t>(x); }
ENTRY(fixpipe_cast_without_quant_pre) { Gqa8<half, half, true>(x); }
extern "C" __global__ __aicore__ void two_args_ok(GM_ADDR a, GM_ADDR b) {  // each AIV copies its slice of a to b
    if ASCEND_IS_AIV {
        TPipe pipe; TBuf<TPosition::VECCALC> t; pipe.InitBuffer(t, 256);
        GlobalTensor<float> ga, gb;
        ga.SetGlobalBuffer((__gm__ float*)a + 64 * GetBlockIdx(), 64);
        gb.SetGlobalBuffer((__gm__ float*)b + 64 * GetBlockIdx(), 64);
        LocalTensor<float> x = t.Get<float>();
        DataCopy(x, ga, 64);
        Sync<HardEvent::MTE2_MTE3>();
        DataCopy(gb, x, 64);
    }
}
// int8 on the cube (IFA's MSD route): S = A K^T and O = A V with V = K (tokens x D), int32 results.
// A [24, 64] int8 at Q_OFF, K [64, 64] int8 at K_OFF; S at S_OFF, O at I8_O_OFF (int32 rows).
constexpr int I8_ROWS = 24, I8_O_OFF = 16384;
template <bool transposeFlag>
__aicore__ inline void Int8Cube(GM_ADDR base) {
    if ASCEND_IS_AIV { return; }
    TPipe pipe;
    TBuf<TPosition::A1> aL1; TBuf<TPosition::B1> kL1; TBuf<TPosition::A2> aL0; TBuf<TPosition::B2> bL0;
    TBuf<TPosition::CO1> sL0C, oL0C;
    pipe.InitBuffer(aL1, 32 * 64); pipe.InitBuffer(kL1, 64 * 64); pipe.InitBuffer(aL0, 32 * 64);
    pipe.InitBuffer(bL0, 64 * 64); pipe.InitBuffer(sL0C, 32 * 64 * 4); pipe.InitBuffer(oL0C, 32 * 64 * 4);
    GlobalTensor<int8_t> a, k; GlobalTensor<int32_t> s, o;
    a.SetGlobalBuffer((__gm__ int8_t*)(base + Q_OFF), I8_ROWS * 64);
    k.SetGlobalBuffer((__gm__ int8_t*)(base + K_OFF), 64 * 64);
    s.SetGlobalBuffer((__gm__ int32_t*)(base + S_OFF), I8_ROWS * 64);
    o.SetGlobalBuffer((__gm__ int32_t*)(base + I8_O_OFF), I8_ROWS * 64);
    LocalTensor<int8_t> a1 = aL1.Get<int8_t>(), k1 = kL1.Get<int8_t>(), a0 = aL0.Get<int8_t>(), b0 = bL0.Get<int8_t>();
    LocalTensor<int32_t> c0 = sL0C.Get<int32_t>(), c1 = oL0C.Get<int32_t>();
    DataCopy(a1, a, Nd2NzParams(1, I8_ROWS, 64, 0, 64, 32, 1, 0));  // C0 = 32 int8, 32 rows (padded)
    DataCopy(k1, k, Nd2NzParams(1, 64, 64, 0, 64, 64, 1, 0));
    Sync<HardEvent::MTE2_MTE1>();
    for (int mb = 0; mb < 2; mb++)  // NZ (C0 stride 32 rows) -> ZZ, 16 x 32 fractals
        LoadData(a0[mb * 2 * 512], a1, LoadData2DParams(mb, 2, 2, 0, 0, false, 0));
    LoadData(b0, k1, LoadData2DParams(0, 8, 1, 0, 0, false, 0));  // NZ of K = ZN of K^T
    Sync<HardEvent::MTE1_M>();
    Mmad(c0, a0, b0, MmadParams(I8_ROWS, 64, 64, 0, false, true));
    Sync<HardEvent::M_MTE1>();
    // B = V (k = tokens, n = D): each 32 x 32 square of V's NZ transposed into two ZN fractals
    for (int kb = 0; kb < 2; kb++) {
        if (transposeFlag)
            LoadData(b0[2 * kb * 512], k1[kb * 64 * 32], LoadData2DParams(0, 2, 1, 0, 0, true, 0));
        else
            LoadDataWithTranspose(b0[2 * kb * 512], k1[kb * 64 * 32], LoadData2dTransposeParams(0, 2, 1, 3, 0));
    }
    Sync<HardEvent::MTE1_M>();
    Mmad(c1, a0, b0, MmadParams(I8_ROWS, 64, 64, 0, false, true));
    Sync<HardEvent::M_FIX>();
    Fixpipe<int32_t, int32_t, CFG_ROW_MAJOR>(s, c0, FixpipeParamsV220(64, I8_ROWS, 32, 64, false));
    Fixpipe<int32_t, int32_t, CFG_ROW_MAJOR>(o, c1, FixpipeParamsV220(64, I8_ROWS, 32, 64, false));
}
ENTRY(int8_qk_and_pv_ok) { Int8Cube<false>(x + REGION * GetBlockIdx()); }
ENTRY(int8_load_data_transpose_flag) { Int8Cube<true>(x + REGION * GetBlockIdx()); }
ENTRY(cube_in_vector_launch) {  // a cube buffer in a plain vector launch
    TPipe pipe; TBuf<TPosition::A1> a; pipe.InitBuffer(a, 512);
}
ENTRY(ids_and_sync_all_ok) {  // indices, then SyncAll<false> orders an AIV write before an AIC read
    GlobalTensor<float> g; g.SetGlobalBuffer((__gm__ float*)x, 64 * 1024);
    const int64_t id = GetBlockIdx();
    if ASCEND_IS_AIV {
        TPipe pipe; TBuf<TPosition::VECCALC> t; pipe.InitBuffer(t, 256);
        LocalTensor<float> a = t.Get<float>();
        Duplicate(a, float(100 * GetBlockNum() + 10 * GetTaskRation() + id), 64);
        Sync<HardEvent::V_MTE3>();
        DataCopy(g[64 * id], a, 64);
    }
    SyncAll<false>();
    if ASCEND_IS_AIC {
        TPipe pipe; TBuf<TPosition::A1> l1; pipe.InitBuffer(l1, 512);
        LocalTensor<half> a = l1.Get<half>();
        GlobalTensor<half> h; h.SetGlobalBuffer((__gm__ half*)x, 64 * 1024);
        DataCopy(a, h[2 * 64 * 2 * id], Nd2NzParams(1, 1, 16, 0, 16, 1, 1, 0));  // reads AIV 2*id's floats as bytes
        GlobalTensor<float> o; o.SetGlobalBuffer((__gm__ float*)x + 4096, 64);
        o.SetValue(id, float(1000 + 10 * GetTaskRation() + id));
    }
}
ENTRY(aiv_read_without_sync_all) {  // the same without SyncAll: the AIC's read races with the AIVs' writes
    GlobalTensor<float> g; g.SetGlobalBuffer((__gm__ float*)x, 64 * 1024);
    const int64_t id = GetBlockIdx();
    if ASCEND_IS_AIV {
        TPipe pipe; TBuf<TPosition::VECCALC> t; pipe.InitBuffer(t, 256);
        LocalTensor<float> a = t.Get<float>();
        Duplicate(a, 1.0f, 64);
        Sync<HardEvent::V_MTE3>();
        DataCopy(g[64 * id], a, 64);
    }
    if ASCEND_IS_AIC {
        TPipe pipe; TBuf<TPosition::A1> l1; pipe.InitBuffer(l1, 512);
        LocalTensor<half> a = l1.Get<half>();
        GlobalTensor<half> h; h.SetGlobalBuffer((__gm__ half*)x, 64 * 1024);
        DataCopy(a, h[2 * 64 * 2 * id], Nd2NzParams(1, 1, 16, 0, 16, 1, 1, 0));
    }
}
'''

BAD = [
    ("mte1_m_missing", "pipe-race", "MTE1_M"),
    ("m_fix_missing", "pipe-race", "M_FIX"),
    ("l0a_overflow", "cube-capacity", "L0A"),
    ("mmad_k_unaligned_floor", "uninit-read", "computed from A rows / B columns nothing wrote"),
    ("mmad_k_over_4095", "cube-param", "k = 4096"),
    ("vector_reads_without_cross_wait", "gm-race", "no cross-core edge"),
    ("cross_flag_never_waited", "cross-flag", "never waits"),
    ("l0c_reused_before_fixpipe", "pipe-race", "FIX_M"),
    ("cross_flag_id_11", "cross-flag", "outside 0..10"),
    ("cross_wait_forever", "cross-flag", "waits forever"),
    ("vector_op_on_aic", "core-type", "cube core (AIC)"),
    ("cube_event_on_aiv", "core-type", "vector core (AIV)"),
    ("fixpipe_to_ub", "position", "L0C->UB does not exist"),
    ("aiv_read_without_sync_all", "gm-race", "no cross-core edge"),
    ("fixpipe_cast_without_quant_pre", "cube-param", "quantPre"),
    ("int8_load_data_transpose_flag", "bounds", "LoadDataWithTranspose"),
]
GOOD = ["qk_softmax_ok", "qk_softmax_k24_ok", "workspace_two_rounds_ok", "l0a_full_ok", "ids_and_sync_all_ok",
        "gqa_8_rows_ok", "gqa_8_rows_bf16_to_bf16_ok", "int8_qk_and_pv_ok"]
ORDERS = [0, 1, 12345]  # forward, reverse, a seeded shuffle


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    dll = sim.load_kernels(KERNELS, tmp_path_factory.mktemp("cube"), "twin_cube_kernels")
    yield dll
    sim.set_block_order(dll, 0)


def inputs(blocks: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    buf = np.full(REGION * blocks, 0xFF, np.uint8)  # NaN-patterned: unwritten output shows up
    qs, ks = [], []
    for b in range(blocks):
        q = rng.standard_normal((M, D)).astype(np.float16)
        k = rng.standard_normal((N, D)).astype(np.float16)
        buf[b * REGION + Q_OFF:b * REGION + K_OFF] = q.view(np.uint8).ravel()
        buf[b * REGION + K_OFF:b * REGION + S_OFF] = k.view(np.uint8).ravel()
        qs.append(q)
        ks.append(k)
    return buf, qs, ks


def run(lib, name, blocks=2, order=0, buf=None, mixed=True):
    if buf is None:
        buf = inputs(blocks)[0]
    err = ctypes.create_string_buffer(4096)
    sim.set_block_order(lib, order)
    fn = ctypes.cast(getattr(lib, name), ctypes.c_void_p)
    launch = lib.sim_launch_mix_1 if mixed else lib.sim_launch_1
    rc = launch(fn, ctypes.c_void_p(buf.ctypes.data), blocks, err, len(err))
    return rc, err.value.decode(), buf


def region(buf, b, off, shape):
    start = b * REGION + off
    return buf[start:start + 4 * int(np.prod(shape))].view(np.float32).reshape(shape)


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("k", [D, 24])
def test_qk_on_the_cube_then_softmax_on_the_vector_cores_matches_numpy(lib, order, k):
    blocks = 2
    buf, qs, ks = inputs(blocks, seed=order)
    rc, msg, buf = run(lib, "qk_softmax_ok" if k == D else "qk_softmax_k24_ok", blocks, order, buf)
    assert rc == 0, msg
    for b in range(blocks):
        q64 = qs[b][:, :k].astype(np.float64)
        k64 = ks[b][:, :k].astype(np.float64)
        s_ref = q64 @ k64.T
        s = region(buf, b, S_OFF, (M, N))
        # fp32 accumulation of exact fp16 products: a few float ulps of the largest partial sum
        np.testing.assert_allclose(s, s_ref, rtol=0, atol=1e-5 * np.abs(q64).max() * np.abs(k64).max() * k)
        e = np.exp(s_ref - s_ref.max(axis=1, keepdims=True))
        np.testing.assert_allclose(region(buf, b, O_OFF, (M, N)), e / e.sum(axis=1, keepdims=True),
                                   rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("order", ORDERS)
def test_int8_products_on_the_cube_are_exact(lib, order):
    """int8 x int8 -> int32 (IFA's MSD route): Q Kᵀ with K's NZ fractals as they are, and P V with
    V's 32 x 32 squares transposed by LoadDataWithTranspose, both equal to NumPy's integers."""
    blocks, rows = 2, 24
    rng = np.random.default_rng(order)
    buf = np.full(REGION * blocks, 0xFF, np.uint8)
    want = []
    for b in range(blocks):
        a = rng.integers(-127, 128, (rows, 64), dtype=np.int8)
        k = rng.integers(-127, 128, (64, 64), dtype=np.int8)
        buf[b * REGION + Q_OFF:b * REGION + Q_OFF + a.size] = a.view(np.uint8).ravel()
        buf[b * REGION + K_OFF:b * REGION + K_OFF + k.size] = k.view(np.uint8).ravel()
        want.append((a.astype(np.int64) @ k.astype(np.int64).T, a.astype(np.int64) @ k.astype(np.int64)))
    rc, msg, buf = run(lib, "int8_qk_and_pv_ok", blocks, order, buf)
    assert rc == 0, msg
    for b in range(blocks):
        s = buf[b * REGION + S_OFF:b * REGION + S_OFF + rows * 64 * 4].view(np.int32).reshape(rows, 64)
        o = buf[b * REGION + 16384:b * REGION + 16384 + rows * 64 * 4].view(np.int32).reshape(rows, 64)
        np.testing.assert_array_equal(s, want[b][0])
        np.testing.assert_array_equal(o, want[b][1])


def test_the_twins_sum_is_float32_in_increasing_k(lib):
    """The stated ordering assumption, checked bit for bit against a NumPy float32 loop."""
    buf, qs, ks = inputs(1, seed=7)
    rc, msg, buf = run(lib, "qk_softmax_ok", 1, 0, buf)
    assert rc == 0, msg
    acc = np.zeros((M, N), np.float32)
    for j in range(D):
        acc = acc + qs[0][:, j:j + 1].astype(np.float32) * ks[0][:, j].astype(np.float32)[None, :]
    np.testing.assert_array_equal(region(buf, 0, S_OFF, (M, N)), acc)


@pytest.mark.parametrize("name,rule,detail", BAD, ids=[b[0] for b in BAD])
def test_planted_cube_kernel_is_rejected(lib, name, rule, detail):
    found = [run(lib, name, order=o)[1] for o in ORDERS]
    assert any(f"[{rule}]" in m and detail in m for m in found), found


@pytest.mark.parametrize("order", ORDERS)
def test_missing_cross_core_wait_found_in_every_order(lib, order):
    rc, msg, _ = run(lib, "vector_reads_without_cross_wait", order=order)
    assert rc == 1 and "[gm-race]" in msg, msg


def test_workspace_overwritten_before_the_vector_read_is_found(lib):
    """Round 2 of the cube overwrites the workspace without the AIVs' release flag."""
    found = [run(lib, "workspace_overwritten_before_read", order=o)[1] for o in ORDERS]
    assert any("[gm-race]" in m and "may still read it" in m for m in found), found


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("name", GOOD)
def test_legal_counterpart_runs(lib, name, order):
    rc, msg, _ = run(lib, name, order=order)
    assert rc == 0, msg


def test_gqa_group_of_8_rows_padded_to_one_fractal(lib):
    buf, qs, ks = inputs(2, seed=3)
    rc, msg, buf = run(lib, "gqa_8_rows_ok", 2, 0, buf)
    assert rc == 0, msg
    for b in range(2):
        ref = qs[b][:8].astype(np.float64) @ ks[b].astype(np.float64).T
        np.testing.assert_allclose(region(buf, b, S_OFF, (M, N))[:8], ref, rtol=0, atol=1e-3)
        assert np.isnan(region(buf, b, S_OFF, (M, N))[8:]).all()  # rows the Fixpipe did not write


def to_bf16_bits(a):
    return (np.ascontiguousarray(a, np.float32).view(np.uint32) >> 16).astype(np.uint16)  # truncation: exact values


def test_bf16_inputs_and_a_bf16_fixpipe_cast(lib):
    rng = np.random.default_rng(5)
    buf = np.full(REGION * 2, 0xFF, np.uint8)
    refs = []
    for b in range(2):
        q = (to_bf16_bits(rng.standard_normal((M, D))).astype(np.uint32) << 16).view(np.float32)
        k = (to_bf16_bits(rng.standard_normal((N, D))).astype(np.uint32) << 16).view(np.float32)
        buf[b * REGION + Q_OFF:b * REGION + K_OFF] = to_bf16_bits(q).view(np.uint8).ravel()
        buf[b * REGION + K_OFF:b * REGION + S_OFF] = to_bf16_bits(k).view(np.uint8).ravel()
        refs.append(q[:8].astype(np.float64) @ k.astype(np.float64).T)
    rc, msg, buf = run(lib, "gqa_8_rows_bf16_to_bf16_ok", 2, 0, buf)
    assert rc == 0, msg
    for b in range(2):
        start = b * REGION + S_OFF
        bits = buf[start:start + 2 * M * N].view(np.uint16).reshape(M, N)[:8]
        got = (bits.astype(np.uint32) << 16).view(np.float32)
        # one bf16 rounding of the float result: within half a bf16 ulp (2^-8 relative) plus the fp32 sum's error
        np.testing.assert_allclose(got, refs[b], rtol=2.0 ** -8, atol=1e-4)


def test_block_and_sub_block_indices(lib):
    buf = np.zeros(64 * 1024 * 4, np.uint8)
    rc, msg, buf = run(lib, "ids_and_sync_all_ok", blocks=2, buf=buf)
    assert rc == 0, msg
    f = buf.view(np.float32)
    # AIV GetBlockIdx = block * 2 + sub-block, GetBlockNum = 2 AI cores, GetTaskRation = 2 on an AIV
    for v in range(4):
        assert f[64 * v] == 100 * 2 + 10 * 2 + v
    # AIC GetBlockIdx = its block, GetTaskRation = 1
    assert list(f[4096:4098]) == [1000 + 10 + 0, 1000 + 10 + 1]


def test_mixed_launch_with_several_gm_arguments(lib):
    lib.sim_launch_mix_n.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.POINTER(ctypes.c_void_p), ctypes.c_int,
                                     ctypes.c_char_p, ctypes.c_int]
    a = np.arange(4 * 64, dtype=np.float32)
    b = np.zeros_like(a)
    args = (ctypes.c_void_p * 2)(a.ctypes.data, b.ctypes.data)
    err = ctypes.create_string_buffer(1024)
    fn = ctypes.cast(lib.two_args_ok, ctypes.c_void_p)
    rc = lib.sim_launch_mix_n(fn, 2, args, 2, err, len(err))
    assert rc == 0, err.value.decode()
    np.testing.assert_array_equal(a, b)


def test_cube_buffers_refused_in_a_vector_launch(lib):
    rc, msg, _ = run(lib, "cube_in_vector_launch", mixed=False)
    assert rc == 1 and "[core-type]" in msg, msg


def test_cube_counters_are_exported(lib):
    rc, msg, _ = run(lib, "qk_softmax_ok", blocks=1)
    assert rc == 0, msg
    st = sim.last_stats(lib)
    assert [s["core_type"] for s in st] == ["AIC", "AIV", "AIV"]
    aic = st[0]
    # two Mmads (the second after the legal FIX -> M reuse) of 1 x 4 x 4 fractals each
    assert aic["mmad_calls"] == 2 and aic["cube_fractal_macs"] == 2 * 16 and aic["cube_macs"] == 2 * M * N * D
    assert aic["l1_in_bytes"] == (M + N) * D * 2 and aic["l0_bytes"] == (M + N) * D * 2
    assert aic["fix_bytes"] == 2 * M * N * 4 and aic["cross_sets"] == 1
    assert all(s["cross_waits"] == 1 for s in st[1:])
    assert aic["ins"]["M"] == 2 and aic["ins"]["MTE1"] == 2 and aic["ins"]["FIX"] == 2 and aic["ins"]["V"] == 0


def test_cube_cost_model_reads_the_cube_counters(lib):
    """Estimates (paper constants): the AIC's M pipe is its fractal blocks at one per cycle plus a cost per Mmad."""
    from splitkv_bench import npu_estimate as est

    rc, msg, _ = run(lib, "qk_softmax_ok", blocks=1)
    assert rc == 0, msg
    st = sim.last_stats(lib)
    c = est.C
    aic = est.context_time_us(st[0], active_cores=3)
    cycles = st[0]["cube_fractal_macs"] / c.cube_fractal_macs_per_cycle + st[0]["mmad_calls"] * c.mmad_issue_cycles
    assert aic["pipes_us"]["M"] == pytest.approx(cycles / c.clock_hz * 1e6)
    assert set(aic["pipes_us"]) == {"MTE2", "MTE1", "M", "FIX", "GM", "S"}
    assert aic["pipes_us"]["GM"] == pytest.approx(aic["pipes_us"]["MTE2"] + aic["pipes_us"]["FIX"])
    stage = est.stage_time_us(st)
    assert stage["cores"] == 3 and stage["us"] > c.launch_us
