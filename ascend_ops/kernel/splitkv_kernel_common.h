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

// The tiling struct is plain 4-byte words in device memory: copy it word by word.
__aicore__ inline void LoadTiling(GM_ADDR tiling, SplitKVTiling& t) {
    const __gm__ int32_t* src = reinterpret_cast<const __gm__ int32_t*>(tiling);
    int32_t* dst = reinterpret_cast<int32_t*>(&t);
    for (int32_t i = 0; i < SPLITKV_TILING_WORDS; i++) {
        dst[i] = src[i];
    }
}

// Make the scalar unit / a copy engine wait for the instructions issued before (event pair).
template <AscendC::HardEvent E>
__aicore__ inline void WaitFor() {
    int32_t id = static_cast<int32_t>(GetTPipePtr()->FetchEventID(E));
    AscendC::SetFlag<E>(id);
    AscendC::WaitFlag<E>(id);
}

}  // namespace splitkv

#endif  // SPLITKV_KERNEL_COMMON_H
