// Offline stand-in (see ../README.md) for the header ascendc_library() generates from
// `extern "C" __global__ __aicore__ void splitkv_combine(GM_ADDR workspace, GM_ADDR plan, GM_ADDR out,
// GM_ADDR lse, GM_ADDR tiling)`.
#pragma once
#include <cstdint>
#include "torch_npu/csrc/core/npu/NPUStream.h"

#ifndef ACLRT_LAUNCH_KERNEL
#define ACLRT_LAUNCH_KERNEL(kernel_func) aclrtlaunch_##kernel_func
#endif

extern "C" uint32_t aclrtlaunch_splitkv_combine(uint32_t blockDim, aclrtStream stream, void *workspace, void *plan,
                                                void *out, void *lse, void *tiling);
