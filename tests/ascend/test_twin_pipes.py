"""The CPU twin's pipe model, cross-core checks and documented limits, on planted kernels.

Each class of mistake that passed the twin before it modelled pipes is planted in a tiny kernel
and must be rejected by its named rule; each has a legal counterpart that must run. The kernels
are compiled against the emulation exactly as the real ones are (a test double: nothing here ran
on an NPU).
"""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

sim = pytest.importorskip("ascend_ops.sim_backend")
pytestmark = pytest.mark.skipif(sim.compiler_missing() is not None, reason=str(sim.compiler_missing()))

SRC_NAME = "twin_pipes_kernels.cpp"
KERNELS = r'''
#include "kernel_operator.h"
using namespace AscendC;

#define ENTRY(name) extern "C" __global__ __aicore__ void name(GM_ADDR x)
template <HardEvent E>
__aicore__ inline void Sync() { SetFlag<E>(0); WaitFlag<E>(0); }
#define GM(g, n) GlobalTensor<float> g; g.SetGlobalBuffer((__gm__ float*)x, n)
#define MINE(g) GlobalTensor<float> g; g.SetGlobalBuffer((__gm__ float*)x + 64 * GetBlockIdx(), 64)

// ---- 1. a vector read of a DMA-filled buffer needs MTE2 -> V
ENTRY(mte2_v_missing) {
    TPipe pipe; TBuf<TPosition::VECCALC> t; pipe.InitBuffer(t, 512); MINE(g);
    LocalTensor<float> a = t.Get<float>(); DataCopy(a, g, 64);
    Muls(a[64], a, 2.0f, 64);
}
ENTRY(mte2_v_ok) {
    TPipe pipe; TBuf<TPosition::VECCALC> t; pipe.InitBuffer(t, 512); MINE(g);
    LocalTensor<float> a = t.Get<float>(); DataCopy(a, g, 64);
    Sync<HardEvent::MTE2_V>();
    Muls(a[64], a, 2.0f, 64);
}
// ---- 2. a scalar read of a vector result needs V -> S
ENTRY(v_s_missing) {
    TPipe pipe; TBuf<TPosition::VECCALC> t; pipe.InitBuffer(t, 256);
    LocalTensor<float> a = t.Get<float>(); Duplicate(a, 1.0f, 64);
    float v = a.GetValue(3); (void)v;
}
ENTRY(v_s_ok) {
    TPipe pipe; TBuf<TPosition::VECCALC> t; pipe.InitBuffer(t, 256);
    LocalTensor<float> a = t.Get<float>(); Duplicate(a, 1.0f, 64);
    Sync<HardEvent::V_S>();
    float v = a.GetValue(3); (void)v;
}
// ---- 3. a copy-out of a vector result needs V -> MTE3
ENTRY(v_mte3_missing) {
    TPipe pipe; TBuf<TPosition::VECCALC> t; pipe.InitBuffer(t, 256); MINE(g);
    LocalTensor<float> a = t.Get<float>(); Duplicate(a, 1.0f, 64);
    DataCopy(g, a, 64);
}
ENTRY(v_mte3_ok) {
    TPipe pipe; TBuf<TPosition::VECCALC> t; pipe.InitBuffer(t, 256); MINE(g);
    LocalTensor<float> a = t.Get<float>(); Duplicate(a, 1.0f, 64);
    Sync<HardEvent::V_MTE3>();
    DataCopy(g, a, 64);
}
// ---- 4. a DMA must not overwrite a buffer a pending vector instruction still reads (V -> MTE2)
ENTRY(dma_overwrites_vector_input) {
    TPipe pipe; TBuf<TPosition::VECCALC> t; pipe.InitBuffer(t, 512); MINE(g);
    LocalTensor<float> a = t.Get<float>(); DataCopy(a, g, 64);
    Sync<HardEvent::MTE2_V>();
    Muls(a[64], a, 2.0f, 64);
    DataCopy(a, g, 64);
}
ENTRY(dma_after_vector_input_ok) {
    TPipe pipe; TBuf<TPosition::VECCALC> t; pipe.InitBuffer(t, 512); MINE(g);
    LocalTensor<float> a = t.Get<float>(); DataCopy(a, g, 64);
    Sync<HardEvent::MTE2_V>();
    Muls(a[64], a, 2.0f, 64);
    Sync<HardEvent::V_MTE2>();
    DataCopy(a, g, 64);
}
ENTRY(queue_double_buffer_ok) {  // the TQue edges alone order a double-buffered loop
    TPipe pipe; TQue<TPosition::VECIN, 2> in; TQue<TPosition::VECOUT, 2> out;
    pipe.InitBuffer(in, 2, 128); pipe.InitBuffer(out, 2, 128); MINE(g);
    for (int i = 0; i < 4; i++) {
        LocalTensor<float> a = in.AllocTensor<float>(); DataCopy(a, g[(i % 2) * 32], 32); in.EnQue(a);
        LocalTensor<float> b = in.DeQue<float>(); LocalTensor<float> c = out.AllocTensor<float>();
        Muls(c, b, 2.0f, 32); in.FreeTensor(b); out.EnQue(c);
        LocalTensor<float> d = out.DeQue<float>(); DataCopy(g[32 * (i % 2)], d, 32); out.FreeTensor(d);
        Sync<HardEvent::MTE3_MTE2>();  // GM written by MTE3 is read by the next MTE2 copy
    }
}
// ---- 5. dependent vector instructions need PipeBarrier<PIPE_V>
ENTRY(v_barrier_missing) {
    TPipe pipe; TBuf<TPosition::VECCALC> t; pipe.InitBuffer(t, 512);
    LocalTensor<float> a = t.Get<float>(); Duplicate(a, 1.0f, 64);
    Adds(a[64], a, 1.0f, 64);
}
ENTRY(v_barrier_ok) {
    TPipe pipe; TBuf<TPosition::VECCALC> t; pipe.InitBuffer(t, 512);
    LocalTensor<float> a = t.Get<float>(); Duplicate(a, 1.0f, 64);
    PipeBarrier<PIPE_V>();
    Adds(a[64], a, 1.0f, 64);
}
ENTRY(scalar_write_vector_read_missing) {  // SetValue is visible to V only after S -> V
    TPipe pipe; TBuf<TPosition::VECCALC> t; pipe.InitBuffer(t, 512);
    LocalTensor<float> a = t.Get<float>();
    for (int i = 0; i < 8; i++) a.SetValue(i, 1.0f);
    Muls(a[64], a, 2.0f, 8);
}
ENTRY(scalar_write_vector_read_ok) {
    TPipe pipe; TBuf<TPosition::VECCALC> t; pipe.InitBuffer(t, 512);
    LocalTensor<float> a = t.Get<float>();
    for (int i = 0; i < 8; i++) a.SetValue(i, 1.0f);
    Sync<HardEvent::S_V>();
    Muls(a[64], a, 2.0f, 8);
}
// ---- 6. a SetFlag never waited
ENTRY(flag_never_waited) {
    TPipe pipe; TBuf<TPosition::VECCALC> t; pipe.InitBuffer(t, 256);
    LocalTensor<float> a = t.Get<float>(); Duplicate(a, 1.0f, 64);
    SetFlag<HardEvent::V_S>(1);
}
ENTRY(flag_waited_ok) {
    TPipe pipe; TBuf<TPosition::VECCALC> t; pipe.InitBuffer(t, 256);
    LocalTensor<float> a = t.Get<float>(); Duplicate(a, 1.0f, 64);
    SetFlag<HardEvent::V_S>(1); WaitFlag<HardEvent::V_S>(1);
}
// ---- 7. two blocks writing the same GM bytes
ENTRY(blocks_write_same_gm) {
    TPipe pipe; TBuf<TPosition::VECCALC> t; pipe.InitBuffer(t, 256); GM(g, 64);
    LocalTensor<float> a = t.Get<float>(); Duplicate(a, float(GetBlockIdx()), 64);
    Sync<HardEvent::V_MTE3>();
    DataCopy(g, a, 64);
}
ENTRY(blocks_read_other_block_gm) {  // block 1 reads what block 0 wrote, no SyncAll
    TPipe pipe; TBuf<TPosition::VECCALC> t; pipe.InitBuffer(t, 256); GM(g, 64);
    LocalTensor<float> a = t.Get<float>();
    if (GetBlockIdx() == 0) { Duplicate(a, 5.0f, 64); Sync<HardEvent::V_MTE3>(); DataCopy(g, a, 64); }
    else { DataCopy(a, g, 64); }
}
ENTRY(blocks_read_other_block_gm_mirror) {  // the highest block writes, the others read
    TPipe pipe; TBuf<TPosition::VECCALC> t; pipe.InitBuffer(t, 256); GM(g, 64);
    LocalTensor<float> a = t.Get<float>();
    if (GetBlockIdx() == GetBlockNum() - 1) { Duplicate(a, 5.0f, 64); Sync<HardEvent::V_MTE3>(); DataCopy(g, a, 64); }
    else { DataCopy(a, g, 64); }
}
ENTRY(blocks_syncall_ok) {  // block 0 writes, SyncAll, every block reads it; then each writes its own slice
    TPipe pipe; TBuf<TPosition::VECCALC> t; pipe.InitBuffer(t, 256); GM(g, 64); MINE(h);
    LocalTensor<float> a = t.Get<float>();
    if (GetBlockIdx() == 0) { Duplicate(a, 5.0f, 64); Sync<HardEvent::V_MTE3>(); DataCopy(g, a, 64); }
    SyncAll();
    DataCopy(a, g, 64);
    Sync<HardEvent::MTE2_V>();
    Adds(a, a, float(GetBlockIdx()), 64);
    Sync<HardEvent::V_MTE3>();
    SyncAll();  // every block read g before anyone overwrites its own 64-float slice
    DataCopy(h[0], a, 64);
}
ENTRY(syncall_mismatch) {  // block 1 never reaches SyncAll: the device would hang
    if (GetBlockIdx() == 0) SyncAll();
}
// ---- 8. a scalar read of GM written by this core's DMA needs the data-cache maintenance
ENTRY(scalar_gm_read_no_dcci) {
    TPipe pipe; TBuf<TPosition::VECCALC> t; pipe.InitBuffer(t, 256); MINE(g);
    LocalTensor<float> a = t.Get<float>(); Duplicate(a, 3.0f, 64);
    Sync<HardEvent::V_MTE3>();
    DataCopy(g, a, 64);
    Sync<HardEvent::MTE3_S>();
    float v = g.GetValue(0); (void)v;
}
ENTRY(scalar_gm_read_dcci_ok) {
    TPipe pipe; TBuf<TPosition::VECCALC> t; pipe.InitBuffer(t, 256); MINE(g);
    LocalTensor<float> a = t.Get<float>(); Duplicate(a, 3.0f, 64);
    Sync<HardEvent::V_MTE3>();
    DataCopy(g, a, 64);
    Sync<HardEvent::MTE3_S>();
    DataCacheCleanAndInvalid<float, CacheLine::SINGLE_CACHE_LINE, DcciDst::CACHELINE_OUT>(g);
    float v = g.GetValue(0); (void)v;
}
ENTRY(scalar_gm_read_no_wait) {  // the cache is clean but the copy may not have landed: MTE3 -> S
    TPipe pipe; TBuf<TPosition::VECCALC> t; pipe.InitBuffer(t, 256); MINE(g);
    LocalTensor<float> a = t.Get<float>(); Duplicate(a, 3.0f, 64);
    Sync<HardEvent::V_MTE3>();
    DataCopy(g, a, 64);
    DataCacheCleanAndInvalid<float, CacheLine::SINGLE_CACHE_LINE, DcciDst::CACHELINE_OUT>(g);
    float v = g.GetValue(0); (void)v;
}
ENTRY(scalar_gm_write_dma_read_no_dcci) {
    TPipe pipe; TBuf<TPosition::VECCALC> t; pipe.InitBuffer(t, 256); MINE(g);
    LocalTensor<float> a = t.Get<float>();
    for (int i = 0; i < 8; i++) g.SetValue(i, 1.0f);
    Sync<HardEvent::S_MTE2>();
    DataCopy(a, g, 8);
}
// ---- 9. DMA block count over the dav-c220 limit of 4095
ENTRY(dma_block_count_over_4095) {
    TPipe pipe; TBuf<TPosition::VECCALC> t; pipe.InitBuffer(t, 4096 * 32); GM(g, 64 * 1024);
    LocalTensor<float> a = t.Get<float>();
    DataCopy(a, g, DataCopyParams(4096, 1, 0, 0));
}
ENTRY(dma_block_count_4095_ok) {
    TPipe pipe; TBuf<TPosition::VECCALC> t; pipe.InitBuffer(t, 4096 * 32); GM(g, 64 * 1024);
    LocalTensor<float> a = t.Get<float>();
    if (GetBlockIdx() == 0) DataCopy(a, g, DataCopyParams(4095, 1, 0, 0));
}
// ---- 10. a pad copy whose byte length is not a multiple of the element size
ENTRY(pad_len_not_elem_multiple) {
    TPipe pipe; TBuf<TPosition::VECCALC> t; pipe.InitBuffer(t, 256); MINE(g);
    LocalTensor<float> a = t.Get<float>();
    DataCopyPad(a, g, DataCopyExtParams(1, 6, 0, 0, 0), DataCopyPadExtParams<float>(false, 0, 0, 0.0f));
}
ENTRY(pad_len_elem_multiple_ok) {
    TPipe pipe; TBuf<TPosition::VECCALC> t; pipe.InitBuffer(t, 256); MINE(g);
    LocalTensor<float> a = t.Get<float>();
    DataCopyPad(a, g, DataCopyExtParams(1, 8, 0, 0, 0), DataCopyPadExtParams<float>(false, 0, 0, 0.0f));
}
// ---- 11. cast (source, destination, round mode) triples dav-c220 does not have
ENTRY(cast_f32_bf16_none) {
    TPipe pipe; TBuf<TPosition::VECCALC> t; pipe.InitBuffer(t, 512);
    LocalTensor<float> a = t.Get<float>(); Duplicate(a, 1.5f, 64); PipeBarrier<PIPE_V>();
    Cast(a[64].ReinterpretCast<bfloat16_t>(), a, RoundMode::CAST_NONE, 64);
}
ENTRY(cast_bf16_f32_rint) {
    TPipe pipe; TBuf<TPosition::VECCALC> t; pipe.InitBuffer(t, 512);
    LocalTensor<float> a = t.Get<float>(); Duplicate(a, 1.5f, 64); PipeBarrier<PIPE_V>();
    LocalTensor<bfloat16_t> b = a[64].ReinterpretCast<bfloat16_t>();
    Cast(b, a, RoundMode::CAST_RINT, 64); PipeBarrier<PIPE_V>();
    Cast(a, b, RoundMode::CAST_RINT, 64);
}
ENTRY(cast_half_f32_rint) {
    TPipe pipe; TBuf<TPosition::VECCALC> t; pipe.InitBuffer(t, 512);
    LocalTensor<float> a = t.Get<float>(); Duplicate(a, 1.5f, 64); PipeBarrier<PIPE_V>();
    LocalTensor<half> b = a[64].ReinterpretCast<half>();
    Cast(b, a, RoundMode::CAST_NONE, 64); PipeBarrier<PIPE_V>();
    Cast(a, b, RoundMode::CAST_RINT, 64);
}
ENTRY(cast_ok) {
    TPipe pipe; TBuf<TPosition::VECCALC> t; pipe.InitBuffer(t, 512);
    LocalTensor<float> a = t.Get<float>(); Duplicate(a, 1.5f, 64); PipeBarrier<PIPE_V>();
    LocalTensor<bfloat16_t> b = a[64].ReinterpretCast<bfloat16_t>();
    Cast(b, a, RoundMode::CAST_RINT, 64); PipeBarrier<PIPE_V>();
    Cast(a, b, RoundMode::CAST_NONE, 64);
}
// ---- 12. vector repeat limits
ENTRY(repeat_times_over_255) {
    TPipe pipe; TBuf<TPosition::VECCALC> t; pipe.InitBuffer(t, 128 * 1024);
    LocalTensor<float> a = t.Get<float>(); Duplicate(a, 1.0f, 16384); PipeBarrier<PIPE_V>();
    Muls(a, a, 2.0f, 64, 256, UnaryRepeatParams(1, 1, 8, 8));
}
ENTRY(repeat_mask_over_256B) {
    TPipe pipe; TBuf<TPosition::VECCALC> t; pipe.InitBuffer(t, 1024);
    LocalTensor<float> a = t.Get<float>(); Duplicate(a, 1.0f, 256); PipeBarrier<PIPE_V>();
    Muls(a, a, 2.0f, 128, 1, UnaryRepeatParams(1, 1, 8, 8));
}
ENTRY(repeat_ok) {
    TPipe pipe; TBuf<TPosition::VECCALC> t; pipe.InitBuffer(t, 128 * 1024);
    LocalTensor<float> a = t.Get<float>(); Duplicate(a, 1.0f, 16320); PipeBarrier<PIPE_V>();
    Muls(a, a, 2.0f, 64, 255, UnaryRepeatParams(1, 1, 8, 8));
}
// ---- Brcb and the binary repeat forms (the mixed kernel's running state as row blocks): rows
// r = 0..7 of 8 values at x[64..128) minus their value x[r] spread by Brcb into block r; then
// x[128..192) times block 3 (one block against every block of the repeat)
template <bool barrier>
__aicore__ inline void BrcbRows(GM_ADDR x) {
    TPipe pipe; TBuf<TPosition::VECCALC> t; pipe.InitBuffer(t, 1024);
    GlobalTensor<float> all; all.SetGlobalBuffer((__gm__ float*)x + 64 * GetBlockIdx(), 256);
    LocalTensor<float> a = t.Get<float>();
    DataCopy(a, all, 192);
    Sync<HardEvent::MTE2_V>();
    Brcb(a[192], a, 1, BrcbRepeatParams(1, 8));
    if (barrier) PipeBarrier<PIPE_V>();
    Sub(a[64], a[64], a[192], 64, 1, BinaryRepeatParams(1, 1, 1, 8, 8, 8));
    Mul(a[128], a[128], a[192 + 24], 64, 1, BinaryRepeatParams(1, 1, 0, 8, 8, 0));
    Sync<HardEvent::V_MTE3>();
    DataCopy(all, a, 192);
}
ENTRY(brcb_rows_ok) { BrcbRows<true>(x); }
ENTRY(brcb_barrier_missing) { BrcbRows<false>(x); }
// ---- cost: the same element work per token with a scalar round trip, or on whole tiles (D 64, 128 tokens)
ENTRY(cost_per_token) {
    TPipe pipe; TBuf<TPosition::VECCALC> k, v, q, prod, acc, red, work;
    pipe.InitBuffer(k, 128 * 64 * 4); pipe.InitBuffer(v, 128 * 64 * 4); pipe.InitBuffer(q, 64 * 4);
    pipe.InitBuffer(prod, 64 * 4); pipe.InitBuffer(acc, 64 * 4); pipe.InitBuffer(red, 32); pipe.InitBuffer(work, 32);
    LocalTensor<float> K = k.Get<float>(), V = v.Get<float>(), Q = q.Get<float>(), P = prod.Get<float>(),
                       A = acc.Get<float>(), R = red.Get<float>(), W = work.Get<float>();
    Duplicate(K, 0.5f, 128 * 64); Duplicate(V, 0.25f, 128 * 64); Duplicate(Q, 1.0f, 64); Duplicate(A, 0.0f, 64);
    PipeBarrier<PIPE_V>();
    for (int j = 0; j < 128; j++) {
        Mul(P, Q, K[j * 64], 64); PipeBarrier<PIPE_V>();
        ReduceSum(R, P, W, 64);
        Sync<HardEvent::V_S>();
        const float s = R.GetValue(0);
        Axpy(A, V[j * 64], s, 64); PipeBarrier<PIPE_V>();
    }
}
ENTRY(cost_whole_tile) {
    TPipe pipe; TBuf<TPosition::VECCALC> k, v, q, prod;
    pipe.InitBuffer(k, 128 * 64 * 4); pipe.InitBuffer(v, 128 * 64 * 4); pipe.InitBuffer(q, 128 * 64 * 4);
    pipe.InitBuffer(prod, 128 * 64 * 4);
    LocalTensor<float> K = k.Get<float>(), V = v.Get<float>(), Q = q.Get<float>(), P = prod.Get<float>();
    Duplicate(K, 0.5f, 128 * 64); Duplicate(V, 0.25f, 128 * 64); Duplicate(Q, 1.0f, 128 * 64);
    PipeBarrier<PIPE_V>();
    Mul(P, Q, K, 128 * 64); PipeBarrier<PIPE_V>();   // all scores' products at once
    Mul(P, P, V, 128 * 64); PipeBarrier<PIPE_V>();   // the weighted values at once
    Add(P, P, V, 128 * 64);
    Sync<HardEvent::V_S>();                           // one round trip for the whole tile
    const float s = P.GetValue(0); (void)s;
}
'''

BAD = [
    ("mte2_v_missing", "pipe-race", "MTE2_V"),
    ("v_s_missing", "pipe-race", "V_S"),
    ("v_mte3_missing", "pipe-race", "V_MTE3"),
    ("dma_overwrites_vector_input", "pipe-race", "V_MTE2"),
    ("v_barrier_missing", "pipe-race", "PipeBarrier<PIPE_V>"),
    ("brcb_barrier_missing", "pipe-race", "PipeBarrier<PIPE_V>"),
    ("scalar_write_vector_read_missing", "pipe-race", "S_V"),
    ("flag_never_waited", "flag", "never waited"),
    ("blocks_write_same_gm", "gm-race", "no SyncAll"),
    ("blocks_read_other_block_gm", "gm-race", "no SyncAll"),
    ("syncall_mismatch", "syncall", "SyncAll"),
    ("scalar_gm_read_no_dcci", "dcache", "DataCacheCleanAndInvalid"),
    ("scalar_gm_read_no_wait", "pipe-race", "MTE3_S"),
    ("scalar_gm_write_dma_read_no_dcci", "dcache", "DataCacheCleanAndInvalid"),
    ("dma_block_count_over_4095", "dma-param", "4095"),
    ("pad_len_not_elem_multiple", "dma-param", "multiple of the element size"),
    ("cast_f32_bf16_none", "cast", "float -> bfloat16_t with CAST_NONE"),
    ("cast_bf16_f32_rint", "cast", "bfloat16_t -> float with CAST_RINT"),
    ("cast_half_f32_rint", "cast", "half -> float with CAST_RINT"),
    ("repeat_times_over_255", "vec-param", "repeatTimes"),
    ("repeat_mask_over_256B", "vec-param", "mask"),
]
GOOD = ["mte2_v_ok", "v_s_ok", "v_mte3_ok", "dma_after_vector_input_ok", "queue_double_buffer_ok", "v_barrier_ok",
        "scalar_write_vector_read_ok", "flag_waited_ok", "blocks_syncall_ok", "scalar_gm_read_dcci_ok",
        "dma_block_count_4095_ok", "pad_len_elem_multiple_ok", "cast_ok", "repeat_ok"]
ORDERS = [0, 1, 12345]  # forward, reverse, a seeded shuffle


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    dll = sim.load_kernels(KERNELS, tmp_path_factory.mktemp("pipes"), SRC_NAME.removesuffix(".cpp"))
    yield dll
    sim.set_block_order(dll, 0)


def run(lib, name, blocks=2, order=0):
    buf = np.arange(64 * 1024, dtype=np.float32)
    err = ctypes.create_string_buffer(4096)
    sim.set_block_order(lib, order)
    fn = ctypes.cast(getattr(lib, name), ctypes.c_void_p)
    rc = lib.sim_launch_1(fn, ctypes.c_void_p(buf.ctypes.data), blocks, err, len(err))
    return rc, err.value.decode(), buf


@pytest.mark.parametrize("name,rule,detail", BAD, ids=[b[0] for b in BAD])
def test_planted_kernel_is_rejected(lib, name, rule, detail):
    rc, msg, _ = run(lib, name)
    assert rc == 1 and f"[{rule}]" in msg and detail in msg, msg


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("name", GOOD)
def test_legal_counterpart_runs(lib, name, order):
    rc, msg, _ = run(lib, name, order=order)
    assert rc == 0, msg


@pytest.mark.parametrize("order", ORDERS)
def test_cross_block_write_write_found_in_every_order(lib, order):
    rc, msg, _ = run(lib, "blocks_write_same_gm", blocks=3, order=order)
    assert rc == 1 and "[gm-race]" in msg, (order, msg)


@pytest.mark.parametrize("name", ["blocks_read_other_block_gm", "blocks_read_other_block_gm_mirror"])
def test_cross_block_read_write_found_by_forward_or_reverse(lib, name):
    """A read/write pair is seen when the writer runs first: forward and reverse cover every pair."""
    found = [run(lib, name, blocks=3, order=o)[1] for o in (0, 1)]
    assert any("[gm-race]" in m for m in found), found


@pytest.mark.parametrize("order", ORDERS)
def test_brcb_and_binary_repeat_forms_compute_row_blocks(lib, order):
    """Brcb spreads 8 values into 8 blocks; a binary repeat form with source 1 strides 1 / 8 takes
    them block by block, with strides 0 / 0 one block against all (what the mixed kernel's running
    max, alpha and l do per row)."""
    rc, msg, buf = run(lib, "brcb_rows_ok", blocks=1, order=order)
    assert rc == 0, msg
    x = np.arange(64 * 1024, dtype=np.float32)
    rows = x[64:128].reshape(8, 8) - x[:8, None]
    np.testing.assert_array_equal(buf[64:128].reshape(8, 8), rows)
    np.testing.assert_array_equal(buf[128:192], x[128:192] * x[3])
    np.testing.assert_array_equal(buf[:64], x[:64])


def test_race_names_both_instructions_with_file_and_line(lib):
    _, msg, _ = run(lib, "mte2_v_missing")
    assert "Muls at " + SRC_NAME in msg and "DataCopy GM->UB at " + SRC_NAME in msg, msg
    line = KERNELS.split("\n").index(next(ln for ln in KERNELS.split("\n") if "Muls(a[64], a, 2.0f, 64);" in ln)) + 1
    assert f"{SRC_NAME}:{line}" in msg, msg
    _, msg, _ = run(lib, "blocks_write_same_gm")
    assert msg.count("DataCopy UB->GM at " + SRC_NAME) == 2 and "block 0" in msg and "block 1" in msg, msg


def test_syncall_result_is_the_same_in_every_order(lib):
    outs = []
    for order in ORDERS:
        rc, msg, buf = run(lib, "blocks_syncall_ok", blocks=4, order=order)
        assert rc == 0, msg
        outs.append(buf[:256].copy())
    for o in outs[1:]:
        np.testing.assert_array_equal(o, outs[0])
    np.testing.assert_array_equal(outs[0].reshape(4, 64), np.repeat(5.0 + np.arange(4, dtype=np.float32)[:, None], 64, 1))


def test_counters_are_exported(lib):
    rc, msg, _ = run(lib, "queue_double_buffer_ok", blocks=2)
    assert rc == 0, msg
    st = sim.last_stats(lib)
    assert len(st) == 2
    s = st[0]
    assert s["dma_bytes"]["MTE2"] == 4 * 32 * 4 and s["dma_bytes"]["MTE3"] == 4 * 32 * 4
    assert s["ins"]["V"] == 4 and s["vec_elems"] == 4 * 32 and s["queue_waits"] >= 8


KERNEL_CASES = [
    dict(seed=1, seq_lens=[200, 37, 0, 5], num_q_heads=8, num_kv_heads=2, head_dim=64, dtype="bfloat16"),
    dict(seed=2, seq_lens=[130, 64], num_q_heads=4, num_kv_heads=1, head_dim=128, dtype="float16",
         kv_quant="channel", kv_offset=True, q_lens=[2, 1]),
    dict(seed=3, seq_lens=[90, 300], num_q_heads=4, num_kv_heads=2, head_dim=32, dtype="float32", window_left=40,
         soft_cap=30.0),
]


@pytest.mark.parametrize("kw", KERNEL_CASES, ids=lambda k: f"{k['dtype']}-d{k['head_dim']}")
def test_kernels_pass_the_pipe_model_in_every_block_order(kw):
    """The split and combine kernels: no race, no unwaited flag, and the same bytes whatever the order."""
    from splitkv_common.parity import cases

    kw = dict(kw)
    seed, seq = kw.pop("seed"), kw.pop("seq_lens")
    inp = cases.random_inputs(seed, seq, **kw)
    plan = inp.plan("size:32", device="910b2")
    lib = sim.twin_library()
    results = []
    try:
        for order in ORDERS:
            sim.set_block_order(lib, order)
            results.append(sim.run_twin(inp, plan))
    finally:
        sim.set_block_order(lib, 0)
    for out, lse in results[1:]:
        np.testing.assert_array_equal(out, results[0][0])
        np.testing.assert_array_equal(lse, results[0][1])


def test_cost_model_per_token_round_trips_at_least_10x_slower(lib):
    """Estimates: per-token scalar round trips vs the same element work on whole tiles."""
    from splitkv_bench import npu_estimate as est

    times = {}
    for name in ("cost_per_token", "cost_whole_tile"):
        rc, msg, _ = run(lib, name, blocks=1)
        assert rc == 0, msg
        (st,) = sim.last_stats(lib)
        times[name] = est.core_time_us(st, active_cores=1)["core_us"]
    assert st["vec_elems"] > 0
    print("estimated µs:", times)
    assert times["cost_per_token"] >= 10 * times["cost_whole_tile"], times
