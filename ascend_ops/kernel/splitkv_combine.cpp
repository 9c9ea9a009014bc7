// Combine stage of split-KV decode attention (Ascend C, vector cores only), a second launch.
//
// Block k merges the (query row, KV head) units k, k + blockNum, ... For row t and query head hq it reads the
// row's rowNum[t] partials (slots rowSlot[t] ..) from the workspace and applies the shared rule:
//   m = max_i lse_i;  w_i = exp(lse_i - m) (0 for an empty split, lse_i = -inf);
//   lse = m + ln(sum_i w_i);  out = sum_i w_i o_i / sum_i w_i;  all empty: out = 0, lse = -inf.
// out is written in q's dtype (round to nearest even), lse as float32 [T, Hq].
#include "splitkv_combine_stage.h"


extern "C" __global__ __aicore__ void splitkv_combine(GM_ADDR workspace, GM_ADDR plan, GM_ADDR out, GM_ADDR lse,
                                                      GM_ADDR tiling) {
    KERNEL_TASK_TYPE_DEFAULT(KERNEL_TYPE_AIV_ONLY);
    SplitKVTiling t;
    splitkv::LoadTiling(tiling, t);
    if (t.qDtype == SPLITKV_DT_FLOAT16) {
        splitkv::RunCombine<half>(workspace, plan, out, lse, t);
    } else if (t.qDtype == SPLITKV_DT_BFLOAT16) {
        splitkv::RunCombine<bfloat16_t>(workspace, plan, out, lse, t);
    } else {
        splitkv::RunCombine<float>(workspace, plan, out, lse, t);
    }
}
