// Host launch function of the fused mixed kernel (split stage on the cube and vector cores, SyncAll,
// combine)
//   extern "C" __global__ __aicore__ void splitkv_attention_mix(GM_ADDR q, GM_ADDR kCache, GM_ADDR vCache,
//       GM_ADDR blockTable, GM_ADDR kvQuant, GM_ADDR plan, GM_ADDR workspace, GM_ADDR tiling, GM_ADDR out,
//       GM_ADDR lse)
// blockDim (AI cores), the stream, then one void * per GM_ADDR; returns 0 on success. This is the
// signature CANN's ascendc_library() generates (the CMake route uses the generated header, not this
// one); the bisheng route defines it in ../launch_attention_mix.asc; offline, ../offline/stub_runtime.cpp does.
#pragma once
#include <cstdint>
#include "acl/acl_base.h"

#ifndef ACLRT_LAUNCH_KERNEL
#define ACLRT_LAUNCH_KERNEL(kernel_func) aclrtlaunch_##kernel_func
#endif

extern "C" uint32_t aclrtlaunch_splitkv_attention_mix(uint32_t blockDim, aclrtStream stream, void *q, void *kCache,
                                                      void *vCache, void *blockTable, void *kvQuant, void *plan,
                                                      void *workspace, void *tiling, void *out, void *lse);
