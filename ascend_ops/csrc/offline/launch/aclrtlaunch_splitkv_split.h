// Offline stand-in (see ../README.md) for the header ascendc_library() generates from
// `extern "C" __global__ __aicore__ void splitkv_split(GM_ADDR q, GM_ADDR kCache, GM_ADDR vCache,
// GM_ADDR blockTable, GM_ADDR kvQuant, GM_ADDR plan, GM_ADDR workspace, GM_ADDR tiling)`:
// the launch function takes blockDim and the stream, then one void * per GM_ADDR.
#pragma once
#include <cstdint>
#include "torch_npu/csrc/core/npu/NPUStream.h"

#ifndef ACLRT_LAUNCH_KERNEL
#define ACLRT_LAUNCH_KERNEL(kernel_func) aclrtlaunch_##kernel_func
#endif

extern "C" uint32_t aclrtlaunch_splitkv_split(uint32_t blockDim, aclrtStream stream, void *q, void *kCache,
                                              void *vCache, void *blockTable, void *kvQuant, void *plan,
                                              void *workspace, void *tiling);
