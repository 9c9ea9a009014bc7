// Node-day probe kernels: the layout of their one GM buffer, shared with ascend_ops/node_day/probes.py.
//
//   bytes [0, 64)                 parameters, int32 words (ParamWord)
//   bytes [1024, 1024 + 64 * 192) one 64-byte record per context, int64 words (RecordWord): context
//                                 block * 3 (AIC) and block * 3 + 1 + sub-block (AIV) in a mixed
//                                 launch, the block in a vector launch
//   bytes [16384, ...)            data the probe reads (and, for the Fixpipe probe, writes)
//
// Times are GetSystemCycle() ticks (50 per microsecond on Atlas A2, CANN's API reference).
#ifndef SPLITKV_PROBE_LAYOUT_H
#define SPLITKV_PROBE_LAYOUT_H

#include "kernel_operator.h"

namespace probe {
using namespace AscendC;

constexpr uint32_t kParamsOffset = 0;
constexpr uint32_t kRecordsOffset = 1024;
constexpr uint32_t kRecordBytes = 64;
constexpr uint32_t kMaxContexts = 192;  // 64 AI cores x (1 AIC + 2 AIV)
constexpr uint32_t kDataOffset = 16384;
constexpr uint32_t kSlotBytes = 4096;   // one latency probe copy slot (copies of 1-4 KiB)

enum ParamWord : uint32_t {
    P_ITERS = 0,      // loop count
    P_BYTES = 1,      // bytes per copy (latency probes)
    P_SLOTS = 2,      // copy slots of kSlotBytes in the data region (latency probes)
    P_ROWS = 3,       // rows per page (bandwidth probe)
    P_ROW_BYTES = 4,  // bytes per row, a multiple of 32 (bandwidth probe)
    P_ROW_STRIDE = 5, // bytes between rows in GM, a multiple of 32 (bandwidth probe)
    P_PAGES = 6,      // pages in the data region (bandwidth probe)
    P_NUM = 16
};
enum RecordWord : uint32_t { R_START = 0, R_END = 1, R_ITERS = 2, R_BYTES = 3, R_RAN = 4 };

__aicore__ inline int32_t Param(GM_ADDR buf, uint32_t word) {
    GlobalTensor<int32_t> p;
    p.SetGlobalBuffer((__gm__ int32_t*)(buf + kParamsOffset), P_NUM);
    return p.GetValue(word);
}

// This context's record index: see the layout above.
template <bool mixed>
__aicore__ inline uint32_t Context() {
    if (!mixed) return uint32_t(GetBlockIdx());
    if ASCEND_IS_AIC { return uint32_t(GetBlockIdx()) * 3; }
    return uint32_t(GetBlockIdx() / 2) * 3 + 1 + uint32_t(GetSubBlockIdx());
}

__aicore__ inline void Record(GM_ADDR buf, uint32_t ctx, int64_t start, int64_t end, int64_t iters, int64_t bytes) {
    GlobalTensor<int64_t> r;
    r.SetGlobalBuffer((__gm__ int64_t*)(buf + kRecordsOffset + ctx * kRecordBytes), kRecordBytes / 8);
    r.SetValue(R_START, start);
    r.SetValue(R_END, end);
    r.SetValue(R_ITERS, iters);
    r.SetValue(R_BYTES, bytes);
    r.SetValue(R_RAN, 1);
    DataCacheCleanAndInvalid<int64_t, CacheLine::SINGLE_CACHE_LINE>(r);
}

// GetSystemCycle is a scalar instruction: every pipe drained first, so the stamp follows the work.
__aicore__ inline int64_t Stamp() {
    PipeBarrier<PIPE_ALL>();
    return GetSystemCycle();
}
}  // namespace probe

#endif  // SPLITKV_PROBE_LAYOUT_H
