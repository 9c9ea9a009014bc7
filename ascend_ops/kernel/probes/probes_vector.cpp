// Node-day probes on the vector cores (vector-only launches): GM -> UB latency, MTE2 bandwidth of
// paged rows, SyncAll<true>, an empty launch. Each loops P_ITERS times and stamps its loop with
// GetSystemCycle (probe_layout.h); ascend_ops/node_day/probes.py launches them and reads the records.
// They pass the CPU twin's checks (tests/ascend/test_node_day.py); NOT RUN on an NPU.
#include "probe_layout.h"

using namespace AscendC;
using probe::Param;

// GM -> UB latency: P_ITERS copies of P_BYTES bytes (1-4 KiB) from scattered 4 KiB slots, each after
// the previous one completed (PipeBarrier<PIPE_MTE2> between them): the loop time is P_ITERS latencies.
extern "C" __global__ __aicore__ void probe_gm_to_ub_latency(GM_ADDR buf) {
    KERNEL_TASK_TYPE_DEFAULT(KERNEL_TYPE_AIV_ONLY);
    const int32_t iters = Param(buf, probe::P_ITERS), bytes = Param(buf, probe::P_BYTES);
    const int32_t slots = Param(buf, probe::P_SLOTS);
    TPipe pipe;
    TBuf<TPosition::VECCALC> t;
    pipe.InitBuffer(t, probe::kSlotBytes);
    LocalTensor<int32_t> ub = t.Get<int32_t>();
    GlobalTensor<int32_t> data;
    data.SetGlobalBuffer((__gm__ int32_t*)(buf + probe::kDataOffset), uint64_t(slots) * probe::kSlotBytes / 4);
    const uint32_t block = uint32_t(GetBlockIdx());
    const int64_t start = probe::Stamp();
    for (int32_t i = 0; i < iters; i++) {
        const uint32_t slot = (uint32_t(i) * 7u + block * 13u) % uint32_t(slots);
        DataCopy(ub, data[slot * probe::kSlotBytes / 4], uint32_t(bytes) / 4);
        PipeBarrier<PIPE_MTE2>();
    }
    const int64_t end = probe::Stamp();
    probe::Record(buf, probe::Context<false>(), start, end, iters, int64_t(iters) * bytes);
}

// MTE2 bandwidth for paged rows: each core streams P_ITERS pages of P_ROWS rows (P_ROW_BYTES each,
// P_ROW_STRIDE apart in GM: one KV head's rows of a page of a [pages, page_size, Hkv, D] cache), one
// strided DataCopy per page into two alternating UB buffers, back to back.
extern "C" __global__ __aicore__ void probe_mte2_paged_bw(GM_ADDR buf) {
    KERNEL_TASK_TYPE_DEFAULT(KERNEL_TYPE_AIV_ONLY);
    const int32_t iters = Param(buf, probe::P_ITERS), rows = Param(buf, probe::P_ROWS);
    const int32_t rowBytes = Param(buf, probe::P_ROW_BYTES), stride = Param(buf, probe::P_ROW_STRIDE);
    const int32_t pages = Param(buf, probe::P_PAGES);
    const uint32_t pageBytes = uint32_t(rows) * uint32_t(rowBytes);
    TPipe pipe;
    TBuf<TPosition::VECCALC> t;
    pipe.InitBuffer(t, 2 * pageBytes);
    LocalTensor<int32_t> ub = t.Get<int32_t>();
    GlobalTensor<int32_t> data;
    const uint64_t pageSpan = uint64_t(rows) * uint64_t(stride);
    data.SetGlobalBuffer((__gm__ int32_t*)(buf + probe::kDataOffset), uint64_t(pages) * pageSpan / 4);
    const DataCopyParams rowsOfPage(uint16_t(rows), uint16_t(rowBytes / 32), uint16_t((stride - rowBytes) / 32), 0);
    const uint32_t block = uint32_t(GetBlockIdx());
    const int64_t start = probe::Stamp();
    for (int32_t i = 0; i < iters; i++) {
        const uint64_t page = (uint64_t(block) * uint64_t(iters) + uint64_t(i)) * 2654435761ull % uint64_t(pages);
        DataCopy(ub[(uint32_t(i) & 1u) * pageBytes / 4], data[page * pageSpan / 4], rowsOfPage);
    }
    const int64_t end = probe::Stamp();
    probe::Record(buf, probe::Context<false>(), start, end, iters, int64_t(iters) * int64_t(pageBytes));
}

// SyncAll<true> (all vector cores of the launch), P_ITERS times in a row.
extern "C" __global__ __aicore__ void probe_syncall_vector(GM_ADDR buf) {
    KERNEL_TASK_TYPE_DEFAULT(KERNEL_TYPE_AIV_ONLY);
    const int32_t iters = Param(buf, probe::P_ITERS);
    SyncAll<true>();  // every core has started before the clock does
    const int64_t start = probe::Stamp();
    for (int32_t i = 0; i < iters; i++) SyncAll<true>();
    const int64_t end = probe::Stamp();
    probe::Record(buf, probe::Context<false>(), start, end, iters, 0);
}

// An empty vector-only launch: timed by the host around back-to-back launches.
extern "C" __global__ __aicore__ void probe_empty(GM_ADDR buf) {
    KERNEL_TASK_TYPE_DEFAULT(KERNEL_TYPE_AIV_ONLY);
    (void)buf;
}
