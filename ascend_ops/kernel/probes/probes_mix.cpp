// Node-day probes of mixed (AIC + AIV) launches: the cross-core flag round trip, GM -> L1 latency,
// the Fixpipe -> GM -> MTE2 round trip, SyncAll<false>, an empty mixed launch. Each loops P_ITERS
// times and stamps its loop with GetSystemCycle (probe_layout.h); ascend_ops/node_day/probes.py
// launches them and reads the records. They pass the CPU twin's checks (tests/ascend/test_node_day.py);
// NOT RUN on an NPU.
#include "probe_layout.h"

using namespace AscendC;
using probe::Param;

namespace {
constexpr uint16_t kToAiv = 1, kToAic = 2;  // cross-core flag ids
constexpr uint32_t kTile = 16;              // the Fixpipe probe's tile: 16 x 16 float (1 KiB)
constexpr uint32_t kL1Cols = 128;           // the GM -> L1 probe's rows: 128 half (256 bytes, one K row of D 128)
}  // namespace

// AIC -> AIV -> AIC: the cube core sets a flag for both vector cores of its AI core and waits for
// theirs, P_ITERS times; its loop time is P_ITERS round trips.
extern "C" __global__ __aicore__ void probe_cross_core_flag(GM_ADDR buf) {
    KERNEL_TASK_TYPE_DEFAULT(KERNEL_TYPE_MIX_AIC_1_2);
    const int32_t iters = Param(buf, probe::P_ITERS);
    if ASCEND_IS_AIC {
        const int64_t start = probe::Stamp();
        for (int32_t i = 0; i < iters; i++) {
            CrossCoreSetFlag<2, PIPE_FIX>(kToAiv);
            CrossCoreWaitFlag(kToAic);
        }
        const int64_t end = probe::Stamp();
        probe::Record(buf, probe::Context<true>(), start, end, iters, 0);
    }
    if ASCEND_IS_AIV {
        for (int32_t i = 0; i < iters; i++) {
            CrossCoreWaitFlag(kToAiv);
            CrossCoreSetFlag<2, PIPE_MTE3>(kToAic);
        }
    }
}

// GM -> L1 latency on the cube core: P_ITERS copies (ND -> NZ) of P_BYTES / 256 rows of 128 half from
// scattered 4 KiB slots, each after the previous one completed (PipeBarrier<PIPE_MTE2>).
extern "C" __global__ __aicore__ void probe_gm_to_l1_latency(GM_ADDR buf) {
    KERNEL_TASK_TYPE_DEFAULT(KERNEL_TYPE_MIX_AIC_1_2);
    if ASCEND_IS_AIV { return; }
    const int32_t iters = Param(buf, probe::P_ITERS), bytes = Param(buf, probe::P_BYTES);
    const int32_t slots = Param(buf, probe::P_SLOTS);
    const uint16_t rows = uint16_t(bytes / int32_t(kL1Cols * 2));
    TPipe pipe;
    TBuf<TPosition::A1> l1;
    pipe.InitBuffer(l1, probe::kSlotBytes);
    LocalTensor<half> a = l1.Get<half>();
    GlobalTensor<half> data;
    data.SetGlobalBuffer((__gm__ half*)(buf + probe::kDataOffset), uint64_t(slots) * probe::kSlotBytes / 2);
    const uint32_t block = uint32_t(GetBlockIdx());
    const int64_t start = probe::Stamp();
    for (int32_t i = 0; i < iters; i++) {
        const uint32_t slot = (uint32_t(i) * 7u + block * 13u) % uint32_t(slots);
        DataCopy(a, data[slot * probe::kSlotBytes / 2], Nd2NzParams(1, rows, kL1Cols, 0, kL1Cols, 16, 1, 0));
        PipeBarrier<PIPE_MTE2>();
    }
    const int64_t end = probe::Stamp();
    probe::Record(buf, probe::Context<true>(), start, end, iters, int64_t(iters) * bytes);
}

// Fixpipe -> GM -> MTE2: the cube core writes a 16 x 16 float tile from L0C to this AI core's GM
// slot and flags both vector cores; each reads it into UB (MTE2) and flags back once the read is
// done; P_ITERS times. The loop time is P_ITERS x (Fixpipe write + flag + MTE2 read + flag).
// The data region holds per AI core: q [16, 16] half (512 B), k [16, 16] half (512 B), the tile
// (1 KiB): 2 KiB.
extern "C" __global__ __aicore__ void probe_fixpipe_gm_mte2(GM_ADDR buf) {
    KERNEL_TASK_TYPE_DEFAULT(KERNEL_TYPE_MIX_AIC_1_2);
    const int32_t iters = Param(buf, probe::P_ITERS);
    const uint32_t core = uint32_t(GetBlockIdx() / (ASCEND_IS_AIV ? GetTaskRation() : 1));
    GM_ADDR base = buf + probe::kDataOffset + core * 2048;
    if ASCEND_IS_AIC {
        TPipe pipe;
        TBuf<TPosition::A1> qL1, kL1;
        TBuf<TPosition::A2> qL0;
        TBuf<TPosition::B2> kL0;
        TBuf<TPosition::CO1> sL0C;
        pipe.InitBuffer(qL1, 512); pipe.InitBuffer(kL1, 512); pipe.InitBuffer(qL0, 512);
        pipe.InitBuffer(kL0, 512); pipe.InitBuffer(sL0C, kTile * kTile * 4);
        GlobalTensor<half> q, k;
        GlobalTensor<float> s;
        q.SetGlobalBuffer((__gm__ half*)base, kTile * kTile);
        k.SetGlobalBuffer((__gm__ half*)(base + 512), kTile * kTile);
        s.SetGlobalBuffer((__gm__ float*)(base + 1024), kTile * kTile);
        LocalTensor<half> q1 = qL1.Get<half>(), k1 = kL1.Get<half>(), q0 = qL0.Get<half>(), k0 = kL0.Get<half>();
        LocalTensor<float> c0 = sL0C.Get<float>();
        DataCopy(q1, q, Nd2NzParams(1, kTile, kTile, 0, kTile, kTile, 1, 0));
        DataCopy(k1, k, Nd2NzParams(1, kTile, kTile, 0, kTile, kTile, 1, 0));
        SetFlag<HardEvent::MTE2_MTE1>(EVENT_ID0);
        WaitFlag<HardEvent::MTE2_MTE1>(EVENT_ID0);
        LoadData(q0, q1, LoadData2DParams(0, 1, 1, 0, 0, false, 0));
        LoadData(k0, k1, LoadData2DParams(0, 1, 1, 0, 0, false, 0));
        SetFlag<HardEvent::MTE1_M>(EVENT_ID0);
        WaitFlag<HardEvent::MTE1_M>(EVENT_ID0);
        Mmad(c0, q0, k0, MmadParams(kTile, kTile, kTile, 0, false, true));
        SetFlag<HardEvent::M_FIX>(EVENT_ID0);
        WaitFlag<HardEvent::M_FIX>(EVENT_ID0);
        const FixpipeParamsV220 fp(kTile, kTile, kTile, kTile, false);
        const int64_t start = probe::Stamp();
        for (int32_t i = 0; i < iters; i++) {
            Fixpipe<float, float, CFG_ROW_MAJOR>(s, c0, fp);
            CrossCoreSetFlag<2, PIPE_FIX>(kToAiv);
            CrossCoreWaitFlag(kToAic);
        }
        const int64_t end = probe::Stamp();
        probe::Record(buf, probe::Context<true>(), start, end, iters, int64_t(iters) * kTile * kTile * 4);
    }
    if ASCEND_IS_AIV {
        TPipe pipe;
        TBuf<TPosition::VECCALC> t;
        pipe.InitBuffer(t, kTile * kTile * 4);
        LocalTensor<float> ub = t.Get<float>();
        GlobalTensor<float> s;
        s.SetGlobalBuffer((__gm__ float*)(base + 1024), kTile * kTile);
        for (int32_t i = 0; i < iters; i++) {
            CrossCoreWaitFlag(kToAiv);
            DataCopy(ub, s, kTile * kTile);
            CrossCoreSetFlag<2, PIPE_MTE2>(kToAic);  // on MTE2: after the read completed
        }
    }
}

// SyncAll<false> (every cube and vector core of the launch), P_ITERS times in a row.
extern "C" __global__ __aicore__ void probe_syncall_mix(GM_ADDR buf) {
    KERNEL_TASK_TYPE_DEFAULT(KERNEL_TYPE_MIX_AIC_1_2);
    const int32_t iters = Param(buf, probe::P_ITERS);
    SyncAll<false>();  // every core has started before the clock does
    const int64_t start = probe::Stamp();
    for (int32_t i = 0; i < iters; i++) SyncAll<false>();
    const int64_t end = probe::Stamp();
    probe::Record(buf, probe::Context<true>(), start, end, iters, 0);
}

// An empty mixed launch: timed by the host around back-to-back launches.
extern "C" __global__ __aicore__ void probe_empty_mix(GM_ADDR buf) {
    KERNEL_TASK_TYPE_DEFAULT(KERNEL_TYPE_MIX_AIC_1_2);
    (void)buf;
}
