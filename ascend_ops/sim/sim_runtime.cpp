// Host side of the CPU twin: runs a kernel entry once per block index, in turn, on a fresh
// simulated core (empty 192 KiB UB, nothing written), and reports the first rule violation.
// Built with the kernel sources into one shared library driven from Python (ctypes).
#include <algorithm>
#include <cstdio>
#include <functional>

#include "kernel_operator.h"
#include "splitkv_tiling.h"

#ifdef SPLITKV_SIM_KERNELS
extern "C" void splitkv_split(GM_ADDR q, GM_ADDR kCache, GM_ADDR vCache, GM_ADDR blockTable, GM_ADDR kvQuant,
                              GM_ADDR plan, GM_ADDR workspace, GM_ADDR tiling);
extern "C" void splitkv_combine(GM_ADDR workspace, GM_ADDR plan, GM_ADDR out, GM_ADDR lse, GM_ADDR tiling);
#endif

namespace {
// Run fn for block 0 .. blockDim - 1. Returns 0, or 1 with the violation in err.
int launch(int blockDim, const std::function<void()>& fn, char* err, int errLen, unsigned* ubPeak) {
    unsigned peak = 0;
    for (int b = 0; b < blockDim; b++) {
        sim::reset_core(b, blockDim);
        try {
            fn();
        } catch (const sim::Violation& e) {
            std::snprintf(err, size_t(errLen), "block %d: %s", b, e.what());
            return 1;
        } catch (const std::exception& e) {
            std::snprintf(err, size_t(errLen), "block %d: unexpected C++ exception: %s", b, e.what());
            return 2;
        }
        peak = std::max(peak, sim::core().ubUsed);
    }
    if (ubPeak) *ubPeak = peak;
    return 0;
}
}  // namespace

#ifdef SPLITKV_SIM_KERNELS
extern "C" int sim_launch_split(int blockDim, uint8_t* q, uint8_t* k, uint8_t* v, uint8_t* bt, uint8_t* quant,
                                uint8_t* plan, uint8_t* ws, uint8_t* tiling, char* err, int errLen, unsigned* ubPeak) {
    return launch(blockDim, [&] { splitkv_split(q, k, v, bt, quant, plan, ws, tiling); }, err, errLen, ubPeak);
}

extern "C" int sim_launch_combine(int blockDim, uint8_t* ws, uint8_t* plan, uint8_t* out, uint8_t* lse,
                                  uint8_t* tiling, char* err, int errLen, unsigned* ubPeak) {
    return launch(blockDim, [&] { splitkv_combine(ws, plan, out, lse, tiling); }, err, errLen, ubPeak);
}

#endif  // SPLITKV_SIM_KERNELS

// For the twin's own tests: run any one-argument kernel entry.
extern "C" int sim_launch_1(void (*fn)(uint8_t*), uint8_t* arg, int blockDim, char* err, int errLen) {
    return launch(blockDim, [&] { fn(arg); }, err, errLen, nullptr);
}
