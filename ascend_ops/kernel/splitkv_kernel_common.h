// Helpers shared by the split and combine kernels (Ascend C, vector cores).
#ifndef SPLITKV_KERNEL_COMMON_H
#define SPLITKV_KERNEL_COMMON_H

#include "kernel_operator.h"
#include "splitkv_tiling.h"

namespace splitkv {

constexpr int32_t kBlockBytes = 32;        // UB alignment unit and DataCopy granule
constexpr int32_t kLseRepeat = 8;          // each workspace lse fills one 32-byte block
constexpr float kNegInf = -__builtin_huge_valf();
constexpr float kNaN = __builtin_nanf("");

// false for NaN and +-inf (x - x is NaN for both)
__aicore__ inline bool IsFinite(float x) { return x - x == 0.0f; }

__aicore__ inline int32_t CeilDiv(int32_t a, int32_t b) { return (a + b - 1) / b; }
__aicore__ inline int32_t RoundUp(int32_t a, int32_t b) { return CeilDiv(a, b) * b; }
__aicore__ inline int32_t Min(int32_t a, int32_t b) { return a < b ? a : b; }
__aicore__ inline int32_t Max(int32_t a, int32_t b) { return a > b ? a : b; }

// The tiling struct is plain 4-byte words in device memory: read it word by word (scalar GM loads
// of int32, as CANN's samples do) and place each word's bytes in the struct with a 4-byte memcpy.
// Storing through an int32_t* into the struct instead (the samples' pattern) writes its float
// fields (scale, softCap) through the wrong type, undefined behaviour an optimiser (bisheng's
// included) may act on. __builtin_memcpy of a constant
// 4 bytes between locals is one load and one store on every compiler we build with.
__aicore__ inline void LoadTiling(GM_ADDR tiling, SplitKVTiling& t) {
    const __gm__ int32_t* src = reinterpret_cast<const __gm__ int32_t*>(tiling);
    uint8_t* dst = reinterpret_cast<uint8_t*>(&t);
    for (int32_t i = 0; i < SPLITKV_TILING_WORDS; i++) {
        const int32_t word = src[i];
        __builtin_memcpy(dst + 4 * i, &word, 4);
    }
}

// s = cap * tanh(s / cap) on the first cnt floats (u: cnt floats of scratch), without cancellation
// when the cap is large against the scores: s / cap clamped to [-10, 10] (tanh is 1 in float
// beyond), halved 9 times, tanh of the small argument (|y| < 0.02) by its Taylor series
// y (1 + y^2 (-1/3 + 2 y^2 / 15)) (next term < 1e-13 relative), then doubled back 9 times with
// tanh(2y) = 2 t / (1 + t^2) (condition number at most 1: relative errors do not grow). Whole-block
// vector instructions only; s must be ordered after its writer (PipeBarrier<PIPE_V>) before the call,
// and is again after it. (cap - 2 cap / (exp(2 s / cap) + 1) loses the scores' low bits to
// cancellation: 8e-5 in lse at cap 1000 on float32.)
__aicore__ inline void SoftCapInPlace(const AscendC::LocalTensor<float>& s, const AscendC::LocalTensor<float>& u,
                                      float cap, int32_t cnt) {
    using namespace AscendC;
    Muls(s, s, 1.0f / cap, cnt);
    Duplicate(u, -10.0f, cnt);
    PipeBarrier<PIPE_V>();
    Max(s, s, u, cnt);  // x >= -10
    PipeBarrier<PIPE_V>();
    Muls(s, s, -1.0f, cnt);
    PipeBarrier<PIPE_V>();
    Max(s, s, u, cnt);  // -x >= -10
    PipeBarrier<PIPE_V>();
    Muls(s, s, -1.0f / 512.0f, cnt);  // y = x / 2^9
    PipeBarrier<PIPE_V>();
    Mul(u, s, s, cnt);
    PipeBarrier<PIPE_V>();
    Muls(u, u, 2.0f / 15.0f, cnt);
    PipeBarrier<PIPE_V>();
    Adds(u, u, -1.0f / 3.0f, cnt);
    PipeBarrier<PIPE_V>();
    Mul(u, u, s, cnt);
    PipeBarrier<PIPE_V>();
    Mul(u, u, s, cnt);
    PipeBarrier<PIPE_V>();
    Adds(u, u, 1.0f, cnt);
    PipeBarrier<PIPE_V>();
    Mul(s, s, u, cnt);  // t = tanh(y)
    for (int32_t i = 0; i < 9; i++) {
        PipeBarrier<PIPE_V>();
        Mul(u, s, s, cnt);
        Muls(s, s, 2.0f, cnt);
        PipeBarrier<PIPE_V>();
        Adds(u, u, 1.0f, cnt);
        PipeBarrier<PIPE_V>();
        Div(s, s, u, cnt);
    }
    PipeBarrier<PIPE_V>();
    Muls(s, s, cap, cnt);
    PipeBarrier<PIPE_V>();
}

// Make the scalar unit / a copy engine wait for the instructions issued before (event pair).
template <AscendC::HardEvent E>
__aicore__ inline void WaitFor() {
    int32_t id = static_cast<int32_t>(GetTPipePtr()->FetchEventID(E));
    AscendC::SetFlag<E>(id);
    AscendC::WaitFlag<E>(id);
}

// The request of query row `row`: the last b with qsl[b] <= row (binary search over the plan's
// query_start_loc section; requests without rows share their successor's start).
__aicore__ inline int32_t RowRequest(const AscendC::GlobalTensor<int32_t>& plan, const SplitKVTiling& t,
                                     int32_t row) {
    int32_t lo = 0, hi = t.batch - 1;
    while (lo < hi) {
        const int32_t mid = (lo + hi + 1) / 2;
        if (plan.GetValue(t.qslOffset + mid) <= row) {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    return lo;
}

// The positions a block-table row holds (maxPages * pageSize): a device length past it is read
// only up to it (graph mode; the host refuses it where it knows the lengths), so that a row never
// reads another request's block-table entries.
__aicore__ inline int32_t KvCap(const SplitKVTiling& t) { return t.maxPages * t.pageSize; }

// Graph mode (deviceSplitTokens S > 0): the splits [jlo, jhi) of a request of seqLen tokens and
// qLen query rows, and where its first range starts (`lo`): the first position any of its rows
// sees, moved down to a page boundary as the host planner's ranges (so both cut the same tiles).
// Positions past the block-table row (KvCap) are in no split.
__aicore__ inline void DeviceSplits(const SplitKVTiling& t, int32_t seqLen, int32_t qLen, int32_t& jlo,
                                    int32_t& jhi, int32_t& lo) {
    const int32_t S = t.deviceSplitTokens;
    lo = t.windowLeft >= 0 ? Max(0, seqLen - qLen - t.windowLeft) / t.pageSize * t.pageSize : 0;
    jhi = Min(CeilDiv(Max(Min(seqLen, KvCap(t)), 0), S), t.maxSplits);
    jlo = Min(lo / S, jhi);
}

// Values a kernel met that the host could not refuse (a device block table, graph mode's device
// lengths; docs/conventions.md), counted per launched block in the block's own 64-byte slot of the
// workspace's error section (SPLITKV_ERROR_BYTES at its start: no two blocks share a slot or a
// scalar cache line, so no atomics), summed on the host (splitkv_common.device_errors). The first
// 8 words of a slot, as the Triton kernels' ERRORS: [0] masked block-table reads, [1..3] the first
// one's (request, logical page, page id); [4] the OR of request bits, [5] requests counted, [6..7]
// the first one's (request, bits). Request bits: 1 a length past the block-table row, 2 a negative
// length, 16 a length past what the graph's plan covers (maxSplits * deviceSplitTokens).
struct ErrorLog {
    int32_t v[8] = {0, 0, 0, 0, 0, 0, 0, 0};

    __aicore__ inline void Page(int32_t b, int32_t col, int32_t id) {
        if (v[0]++ == 0) {
            v[1] = b;
            v[2] = col;
            v[3] = id;
        }
    }
    // graph mode: a request's device length (checked once per request, by its item (split 0, head 0))
    __aicore__ inline void Length(const SplitKVTiling& t, int32_t b, int32_t seqLen) {
        const int32_t bits = (seqLen > KvCap(t) ? 1 : 0) | (seqLen < 0 ? 2 : 0) |
                             (seqLen > t.maxSplits * t.deviceSplitTokens ? 16 : 0);
        if (bits != 0) {
            v[4] |= bits;
            if (v[5]++ == 0) {
                v[6] = b;
                v[7] = bits;
            }
        }
    }
    // Add this block's counts to its slot (only when it counted anything: no GM traffic otherwise).
    __aicore__ inline void Flush(GM_ADDR workspace, int32_t slot) {
        if (v[0] == 0 && v[5] == 0) {
            return;
        }
        AscendC::GlobalTensor<int32_t> g;
        g.SetGlobalBuffer(reinterpret_cast<__gm__ int32_t*>(workspace) + slot * kErrorSlotWords, kErrorSlotWords);
        // drop a line this core may hold from before (the slot persists across launches)
        AscendC::DataCacheCleanAndInvalid<int32_t, AscendC::CacheLine::SINGLE_CACHE_LINE>(g);
        int32_t old[8];
        for (int32_t i = 0; i < 8; i++) {
            old[i] = g.GetValue(i);
        }
        if (v[0] != 0) {
            g.SetValue(0, old[0] + v[0]);
            if (old[0] == 0) {
                g.SetValue(1, v[1]);
                g.SetValue(2, v[2]);
                g.SetValue(3, v[3]);
            }
        }
        if (v[5] != 0) {
            g.SetValue(4, old[4] | v[4]);
            g.SetValue(5, old[5] + v[5]);
            if (old[5] == 0) {
                g.SetValue(6, v[6]);
                g.SetValue(7, v[7]);
            }
        }
        AscendC::DataCacheCleanAndInvalid<int32_t, AscendC::CacheLine::SINGLE_CACHE_LINE>(g);  // write back
    }
    static constexpr int32_t kErrorSlotWords = SPLITKV_ERROR_SLOT_BYTES / 4;
};

// The partial slots of query row `row`: [s0, s0 + ns). From the plan's rowSlot / rowNum sections,
// or in graph mode from seqLens (slots row * maxSplits + j for the request's splits j).
__aicore__ inline void RowSplits(const AscendC::GlobalTensor<int32_t>& plan, const SplitKVTiling& t, int32_t row,
                                 int32_t& s0, int32_t& ns) {
    if (t.deviceSplitTokens <= 0) {
        s0 = plan.GetValue(t.rowSlotOffset + row);
        ns = plan.GetValue(t.rowNumOffset + row);
        return;
    }
    const int32_t b = RowRequest(plan, t, row);
    const int32_t qLen = plan.GetValue(t.qslOffset + b + 1) - plan.GetValue(t.qslOffset + b);
    int32_t jlo, jhi, lo;
    DeviceSplits(t, plan.GetValue(t.seqLensOffset + b), qLen, jlo, jhi, lo);
    s0 = row * t.maxSplits + jlo;
    ns = jhi - jlo;
}

// The partial slot of split `split` of query row `row` (graph mode: row * maxSplits + split).
__aicore__ inline int32_t SlotOf(const AscendC::GlobalTensor<int32_t>& plan, const SplitKVTiling& t, int32_t row,
                                 int32_t split) {
    return (t.deviceSplitTokens > 0 ? row * t.maxSplits : plan.GetValue(t.rowSlotOffset + row)) + split;
}

// Work item w (request b, KV head h, split, [start, end), first row, rows, seqLen) from the plan's
// items section, or in graph mode from the grid (splitkv_tiling.h). False for padding items,
// requests without query rows, and grid items outside their request's splits.
template <typename Item>
__aicore__ inline bool LoadItem(const AscendC::GlobalTensor<int32_t>& plan, const SplitKVTiling& t, int32_t w,
                                Item& it) {
    if (t.deviceSplitTokens > 0) {
        const int32_t bh = t.batch * t.numKVHeads;
        it.split = w / bh;
        it.b = (w % bh) / t.numKVHeads;
        it.h = w % t.numKVHeads;
    } else {
        const int32_t base = t.itemsOffset + 5 * w;
        it.b = plan.GetValue(base);
        if (it.b < 0) {
            return false;  // padding item of a graph-stable plan
        }
        it.h = plan.GetValue(base + 1);
        it.split = plan.GetValue(base + 2);
        it.start = plan.GetValue(base + 3);
        it.end = plan.GetValue(base + 4);
    }
    it.row0 = plan.GetValue(t.qslOffset + it.b);
    it.qLen = plan.GetValue(t.qslOffset + it.b + 1) - it.row0;
    it.seqLen = plan.GetValue(t.seqLensOffset + it.b);
    if (t.deviceSplitTokens > 0) {
        int32_t jlo, jhi, lo;
        DeviceSplits(t, it.seqLen, it.qLen, jlo, jhi, lo);
        if (it.split < jlo || it.split >= jhi) {
            return false;
        }
        it.start = Max(it.split * t.deviceSplitTokens, lo);
        it.end = Min((it.split + 1) * t.deviceSplitTokens, Min(it.seqLen, KvCap(t)));
    }
    return it.qLen > 0;
}

}  // namespace splitkv

#endif  // SPLITKV_KERNEL_COMMON_H
