// CPU twin of the Ascend C API subset the splitkv kernels use: a TEST DOUBLE, not the NPU.
//
// The kernels in ascend_ops/kernel/ include "kernel_operator.h". On an NPU node that is CANN's
// header (bisheng); for the type-check it is CANN's CPU-debug flavour (g++); for the twin it is
// THIS file (g++, -I ascend_ops/sim). The twin runs each block index in turn on the CPU.
//
// What it implements is the documented behaviour of each API (references below, CANN 8.0/8.1
// "Ascend C API reference", hiascend.com, page ids atlasascendc_api_07_XXXX), and it turns the
// documented constraints the type-check cannot see into errors (sim::Violation, rule names in []):
//   [ub-capacity]   sum of TPipe::InitBuffer sizes (each rounded up to 32 B) <= 192 KiB
//   [alignment]     UB operand start addresses 32-byte aligned (ReduceSum/ReduceMax/WholeReduceSum
//                   dst: element alignment, WholeReduceMax dst: two elements, BlockReduce dst: 16 /
//                   32 bytes); DataCopy lengths multiples of 32 bytes
//   [queue]         AllocTensor beyond the buffers given to InitBuffer, more than 8 outstanding
//                   allocations on one TPosition, EnQue beyond the depth or of a tensor not
//                   allocated from the queue, DeQue of an empty queue, FreeTensor of a tensor not
//                   allocated (or still queued, or freed twice)
//   [uninit-read]   a read of a UB byte no instruction has written since its buffer was
//                   allocated (AllocTensor content is "random" per the AllocTensor page)
//   [bounds]        an access past the end of a LocalTensor's buffer or a GlobalTensor's size
//   [flag]          WaitFlag without a matching SetFlag; a SetFlag never waited by the kernel's end;
//                   a SetFlag of a flag already set (one bit per event and id); ids outside 0..7;
//                   TPipe's M_MTE1 ids 0-2 on a cube core taken by hand (TPipe below)
//   [tpipe]         a second TPipe while one is alive (TPipe::Init resets every pool)
//   [pipe-race]     two accesses to the same UB or GM bytes from different pipes (or a V read of
//                   a V result) with no ordering edge between them (sim_pipes.h: the model)
//   [gm-race]       GM bytes written by one block and written or read by another with no
//                   SyncAll between (sim_runtime.cpp runs blocks in a chosen order)
//   [syncall]       a block ends while others wait in SyncAll
//   [dcache]        a scalar GM read of bytes this core's DMA wrote, or a DMA read of bytes a
//                   scalar GM write left in the data cache, without DataCacheCleanAndInvalid; a
//                   scalar read of a 64-byte line this core's data cache holds that was written since
//                   (by any other context, or by DMA), without DataCacheCleanAndInvalid of it
//   [dma-param]     DataCopy / DataCopyPad parameters outside their documented ranges
//   [vec-param]     repeat-form vector parameters outside their documented ranges
//   [cast]          a Cast (source, destination, round mode) dav-c220 does not support
// The cube unit and mixed launches (second half of this file; sim_runtime.cpp sim_launch_mix_1):
//   [cube-capacity] L1 / L0A / L0B / L0C buffers beyond 512 / 64 / 64 / 128 KiB
//   [cube-param]    Mmad m/n/k/unitFlag, Fixpipe, ND2NZ parameters outside their documented ranges
//   [gemv]          Mmad with m = 1 (GEMV mode on dav-c220); unwritten A rows / B columns poison their
//                   C rows / columns instead ([uninit-read] only when a poisoned element is read)
//   [mmad-barrier]  an Mmad accumulating onto the L0C a small previous Mmad wrote, no PipeBarrier<PIPE_M>
//   [unit-flag]     Mmad / Fixpipe unit flags that hang or would read the wrong product
//   [position]      an operand in the wrong memory (a vector API on L1/L0 data, Mmad operands not in
//                   A2/B2/CO1, Fixpipe L0C -> UB, which dav-c220 does not have)
//   [core-type]     a vector pipe (V, MTE3) or UB on a cube core, a cube pipe (MTE1, M, FIX) or
//                   L1/L0 on a vector core (or anywhere in a vector-only launch)
//   [cross-flag]    CrossCoreSetFlag/WaitFlag outside the documented ids/modes/pipes, a wait no set
//                   will satisfy (a hang), a set nobody waits for, a set that can run more than 15
//                   ahead of its counter's waits (happens-before, whatever the context order)
//   [pipe-race], [gm-race], [uninit-read], [alignment], [bounds] as for the vector core, on the
//                   cube memories and between the cube and vector contexts of a mixed launch
// Limits and tables, each with its source: sim_limits.h. Work counters (cost-model inputs):
// sim::Stats in sim_pipes.h, exported per block by sim_runtime.cpp.
// Not modelled: pipeline timing (the counters feed a paper estimate, splitkv_bench/npu_estimate.py);
// bank conflicts; the exact NPU Exp/Ln precision (libm is used); the cube's exact summation
// order (see Mmad); TQue on cube positions; int8 / float Mmad; Fixpipe quantisation and NZ output.
//
// References (semantics encoded below):
//   DataCopy          .../canncommercial/800/apiref/ascendcopapi/atlasascendc_api_07_0102.html
//   DataCopyPad       .../canncommercial/800/apiref/ascendcopapi/atlasascendc_api_07_0265.html
//   AllocTensor       .../CANNCommunityEdition/81RC1alpha002/apiref/ascendcopapi/atlasascendc_api_07_0138.html
//   ReduceSum         .../CANNCommunityEdition/81RC1alpha002/apiref/ascendcopapi/atlasascendc_api_07_0078.html
//   ReduceMax         .../canncommercial/850/API/ascendcopapi/atlasascendc_api_07_0075.html
//   WholeReduceSum    .../canncommercial/800/apiref/ascendcopapi/atlasascendc_api_07_0081.html
//   WholeReduceMax    .../canncommercial/800/apiref/ascendcopapi/atlasascendc_api_07_0079.html
//   BlockReduceMax    .../canncommercial/800/apiref/ascendcopapi/atlasascendc_api_07_0082.html
//   Axpy              .../canncommercial/800/apiref/ascendcopapi/atlasascendc_api_07_0063.html
//   Cast              .../canncommercial/900/API/ascendcopapi/atlasascendc_api_07_0073.html
//   (prefix https://www.hiascend.com/document/detail/zh/). The element-wise APIs (Add, Sub, Mul,
//   Div, Max, Adds, Muls, Exp, Ln, Duplicate) are the "calCount" (first n elements) prototypes of
//   the same reference; their common rule is a 32-byte aligned start address of every operand.
#ifndef SPLITKV_SIM_KERNEL_OPERATOR_H
#define SPLITKV_SIM_KERNEL_OPERATOR_H

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <deque>
#include <exception>
#include <limits>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "sim_pipes.h"

#define __aicore__
#define __global__
#define __gm__
#define GM_ADDR uint8_t*

// ---------------------------------------------------------------------------------------------
// Every element of emulated memory (UB, L1/L0, GM) is read and written through load_as / store_as
// (a memcpy of sizeof(T) bytes, one move at -O1 and above), never through a T*: the same bytes
// are reinterpreted as other types (ReinterpretCast, a float row written by DMA and read as int32,
// half zeros read as bfloat16), and typed pointer accesses of them would be strict-aliasing
// undefined behaviour that the optimiser may reorder.
namespace sim {
template <typename T>
inline T load_as(const void* p) {
    T v;
    std::memcpy(&v, p, sizeof(T));
    return v;
}
template <typename T>
inline void store_as(void* p, const T& v) { std::memcpy(p, &v, sizeof(T)); }

// 16-bit floating types (bit-exact conversions, round to nearest even)
inline uint16_t f32_to_f16(float f) {
    uint32_t x;
    std::memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000u;
    int32_t exp = int32_t((x >> 23) & 0xffu);
    uint32_t mant = x & 0x7fffffu;
    if (exp == 255) return uint16_t(sign | 0x7c00u | (mant ? 0x200u : 0u));
    int32_t e = exp - 127 + 15;
    if (e >= 31) return uint16_t(sign | 0x7c00u);
    if (e <= 0) {
        if (e < -10) return uint16_t(sign);
        mant |= 0x800000u;
        int shift = 14 - e;
        uint32_t h = mant >> shift, rem = mant & ((1u << shift) - 1u), halfway = 1u << (shift - 1);
        if (rem > halfway || (rem == halfway && (h & 1u))) h++;
        return uint16_t(sign | h);
    }
    uint32_t h = (uint32_t(e) << 10) | (mant >> 13), rem = mant & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) h++;
    return uint16_t(sign | h);
}
inline float f16_to_f32(uint16_t h) {
    uint32_t sign = uint32_t(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu, x;
    if (exp == 0) {
        if (mant == 0) {
            x = sign;
        } else {  // subnormal: normalise
            int e = -1;
            do { mant <<= 1; e++; } while (!(mant & 0x400u));
            x = sign | (uint32_t(127 - 15 - e) << 23) | ((mant & 0x3ffu) << 13);
        }
    } else if (exp == 31) {
        x = sign | 0x7f800000u | (mant << 13);
    } else {
        x = sign | ((exp + 127 - 15) << 23) | (mant << 13);
    }
    float f;
    std::memcpy(&f, &x, 4);
    return f;
}
inline uint16_t f32_to_bf16(float f) {
    uint32_t x;
    std::memcpy(&x, &f, 4);
    if (std::isnan(f)) return uint16_t((x >> 16) | 0x40u);
    x += 0x7fffu + ((x >> 16) & 1u);
    return uint16_t(x >> 16);
}
inline float bf16_to_f32(uint16_t b) {
    uint32_t x = uint32_t(b) << 16;
    float f;
    std::memcpy(&f, &x, 4);
    return f;
}
}  // namespace sim

struct half {
    uint16_t bits;
    half() = default;
    half(float f) : bits(sim::f32_to_f16(f)) {}
    operator float() const { return sim::f16_to_f32(bits); }
};
struct bfloat16_t {
    uint16_t bits;
    bfloat16_t() = default;
    bfloat16_t(float f) : bits(sim::f32_to_bf16(f)) {}
    operator float() const { return sim::bf16_to_f32(bits); }
};

// ---------------------------------------------------------------------------------------------
// The simulated core (sim_pipes.h): UB contents, its "written" map, the pipe shadow, counters.
namespace sim {
inline void mark(uint32_t addr, uint32_t n) { std::memset(core().written + addr, 1, n); }
inline void unmark(uint32_t addr, uint32_t n) { std::memset(core().written + addr, 0, n); }
inline void check_written(uint32_t addr, uint32_t n, const char* api) {
    const uint8_t* w = core().written + addr;
    const void* hole = std::memchr(w, 0, n);
    if (hole) {
        uint32_t at = addr + uint32_t(static_cast<const uint8_t*>(hole) - w);
        fail("uninit-read", std::string(api) + " reads UB byte " + std::to_string(at) +
                                " (operand at " + std::to_string(addr) + ", " + std::to_string(n) +
                                " bytes) that nothing has written since its buffer was allocated");
    }
}
inline void check_align(uint32_t addr, uint32_t align, const char* api, const char* what) {
    if (addr % align)
        fail("alignment", std::string(api) + ": " + what + " UB address " + std::to_string(addr) +
                              " is not " + std::to_string(align) + "-byte aligned");
}
inline void check_range(const char* rule, const char* api, const char* field, uint64_t v, uint64_t lo, uint64_t hi,
                        const char* source) {
    if (v < lo || v > hi)
        fail(rule, std::string(api) + ": " + field + " = " + std::to_string(v) + " outside its documented range [" +
                       std::to_string(lo) + ", " + std::to_string(hi) + "] (" + source + ")");
}
// Vector instruction bookkeeping: one instruction over `elems` elements of `bytes` bytes each.
inline void count_vec(uint64_t elems, uint32_t bytes) {
    Stats& st = core().st;
    st.vecElems += elems;
    st.vecRepeats += (elems * bytes + limits::kRepeatBytes - 1) / limits::kRepeatBytes;
}
}  // namespace sim

// ---------------------------------------------------------------------------------------------
namespace AscendC {

enum class TPosition : uint8_t { GM, A1, A2, B1, B2, C1, C2, CO1, CO2, VECIN, VECOUT, VECCALC, LCM = VECCALC };
using QuePosition = TPosition;
// HardEvent names are SRC_DST (ascendc/basic_api/impl/kernel_event.h lists the same names; the
// numeric values here are the twin's own).
#define SIM_EVENTS(X)                                                                                   \
    X(MTE2_V, MTE2, V) X(V_MTE2, V, MTE2) X(MTE3_V, MTE3, V) X(V_MTE3, V, MTE3) X(V_S, V, S) X(S_V, S, V) \
    X(MTE2_S, MTE2, S) X(S_MTE2, S, MTE2) X(MTE3_S, MTE3, S) X(S_MTE3, S, MTE3) X(MTE2_MTE3, MTE2, MTE3) \
    X(MTE3_MTE2, MTE3, MTE2) X(MTE2_MTE1, MTE2, MTE1) X(MTE1_MTE2, MTE1, MTE2) X(MTE1_M, MTE1, M)          \
    X(M_MTE1, M, MTE1) X(MTE2_M, MTE2, M) X(M_MTE2, M, MTE2) X(M_FIX, M, FIX) X(FIX_M, FIX, M)              \
    X(MTE2_FIX, MTE2, FIX) X(FIX_MTE2, FIX, MTE2) X(FIX_S, FIX, S) X(M_S, M, S) X(MTE1_FIX, MTE1, FIX)       \
    X(FIX_MTE1, FIX, MTE1) X(FIX_FIX, FIX, FIX) X(S_MTE1, S, MTE1) X(MTE1_S, MTE1, S)
#define SIM_EV_ENUM(n, a, b) n,
enum class HardEvent : uint8_t { SIM_EVENTS(SIM_EV_ENUM) MAX };
#undef SIM_EV_ENUM
static_assert(int(HardEvent::MAX) <= sim::kEvents, "twin: raise sim::kEvents");
enum class RoundMode { CAST_NONE = 0, CAST_RINT, CAST_FLOOR, CAST_CEIL, CAST_ROUND, CAST_TRUNC, CAST_ODD };
enum pipe_t { PIPE_S, PIPE_V, PIPE_M, PIPE_MTE1, PIPE_MTE2, PIPE_MTE3, PIPE_FIX, PIPE_ALL };
enum event_t : int { EVENT_ID0 = 0, EVENT_ID1, EVENT_ID2, EVENT_ID3, EVENT_ID4, EVENT_ID5, EVENT_ID6, EVENT_ID7 };
// DataCacheCleanAndInvalid template arguments (ascendc/basic_api/impl/kernel_reg.h).
enum class CacheLine : uint64_t { SINGLE_CACHE_LINE = 0, ENTIRE_DATA_CACHE };
enum class DcciDst : uint64_t { CACHELINE_ALL = 0, CACHELINE_UB, CACHELINE_OUT, CACHELINE_ATOMIC };
using TEventID = int8_t;

namespace detail {
#define SIM_EV_SRC(n, a, b) case HardEvent::n: return sim::P_##a;
#define SIM_EV_DST(n, a, b) case HardEvent::n: return sim::P_##b;
#define SIM_EV_NAME(n, a, b) #n,
constexpr sim::Pipe ev_src(HardEvent e) {
    switch (e) { SIM_EVENTS(SIM_EV_SRC) default: return sim::P_S; }
}
constexpr sim::Pipe ev_dst(HardEvent e) {
    switch (e) { SIM_EVENTS(SIM_EV_DST) default: return sim::P_S; }
}
inline const char* ev_name(HardEvent e) {
    static const char* n[] = {SIM_EVENTS(SIM_EV_NAME) "MAX"};
    return n[int(e)];
}
#undef SIM_EV_SRC
#undef SIM_EV_DST
#undef SIM_EV_NAME
constexpr sim::Pipe pipe_of(pipe_t p) {
    return p == PIPE_S ? sim::P_S : p == PIPE_V ? sim::P_V : p == PIPE_M ? sim::P_M : p == PIPE_MTE1 ? sim::P_MTE1
         : p == PIPE_MTE2 ? sim::P_MTE2 : p == PIPE_MTE3 ? sim::P_MTE3 : sim::P_FIX;
}
}  // namespace detail

// Mixed (AIC + AIV) kernels. The kernel type macro and meta types of
// ascendc/basic_api/impl/utils/kernel_utils_macros.h (KERNEL_TASK_TYPE_DEFAULT is a compile
// option there: a no-op here, the launcher decides); g_coreType / ASCEND_IS_AIC / ASCEND_IS_AIV
// are the running context's type. Indices as in dav_c220/kernel_operator_common_impl.h: an AIC's
// GetBlockIdx is its block b; an AIV's is b * GetTaskRation() + GetSubBlockIdx(), with
// GetTaskRation() 2 on an AIV and 1 on an AIC (get_subblockdim); GetBlockNum() is the launch's
// block count (AI cores, one AIC and two AIV each).
enum KernelMetaType : uint8_t {
    KERNEL_TYPE_AIV_ONLY, KERNEL_TYPE_AIC_ONLY, KERNEL_TYPE_MIX_AIV_1_0, KERNEL_TYPE_MIX_AIC_1_0,
    KERNEL_TYPE_MIX_AIC_1_1, KERNEL_TYPE_MIX_AIC_1_2, KERNEL_TYPE_AICORE, KERNEL_TYPE_VECTORCORE,
    KERNEL_TYPE_MIX_AICORE, KERNEL_TYPE_MIX_VECTOR_CORE, KERNEL_TYPE_MAX
};
#define KERNEL_TASK_TYPE_DEFAULT(value)
// IsSameType (ascendc/basic_api/interface/kernel_utils.h in CANN 8.1: the library's own type test)
template <typename T, typename U> struct IsSameType { static constexpr bool value = false; };
template <typename T> struct IsSameType<T, T> { static constexpr bool value = true; };
enum { AIV = sim::CT_AIV, AIC = sim::CT_AIC };
#define g_coreType (::sim::core().coreType)
#define ASCEND_IS_AIV (g_coreType == AscendC::AIV)
#define ASCEND_IS_AIC (g_coreType == AscendC::AIC)
#define ASCEND_IS_NOT_AIV (g_coreType != AscendC::AIV)
#define ASCEND_IS_NOT_AIC (g_coreType != AscendC::AIC)
inline int64_t GetSubBlockIdx() { return sim::core().coreType == sim::CT_AIV ? sim::core().subIdx : 0; }
inline int64_t GetTaskRation() { return sim::core().mixed && sim::core().coreType == sim::CT_AIV ? 2 : 1; }

inline int64_t GetBlockIdx() {
    const sim::Core& c = sim::core();
    return c.mixed && c.coreType == sim::CT_AIV ? c.blockIdx * 2 + c.subIdx : c.blockIdx;
}
inline int64_t GetBlockNum() { return sim::core().blockNum; }
// GetSystemCycle (Ascend C API reference, CANN 8.0, atlasascendc_api_07_0282; Atlas A2): the system
// counter, 50 ticks per microsecond (time in us = cycles / 50); a scalar (PIPE_S) instruction, so a
// timing of another pipe's work needs a PipeBarrier of that pipe first. The twin returns the host's
// steady clock in the same 50 MHz units: monotonic, and meaningless as a device time.
inline int64_t GetSystemCycle() {
    const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
        std::chrono::steady_clock::now().time_since_epoch()).count();
    return int64_t(ns / 20);
}

template <typename T>
class LocalTensor {
public:
    uint32_t addr_ = 0;   // byte address in its memory
    uint32_t bytes_ = 0;  // bytes from addr_ to the end of its buffer
    uint8_t mem_ = 0;     // sim::Mem: UB, or L1 / L0A / L0B / L0C on a cube core
    LocalTensor() = default;
    LocalTensor(uint32_t a, uint32_t b, uint8_t m = 0) : addr_(a), bytes_(b), mem_(m) {}
    LocalTensor operator[](uint32_t offset) const {
        uint64_t off = uint64_t(offset) * sizeof(T);
        if (off > bytes_) sim::fail("bounds", "LocalTensor[] offset " + std::to_string(offset) + " past its buffer");
        return LocalTensor(addr_ + uint32_t(off), bytes_ - uint32_t(off), mem_);
    }
    uint32_t GetSize() const { return bytes_ / sizeof(T); }
    // Scalar read of the UB (pipe S): needs the writer's pipe -> S edge.
    T GetValue(uint32_t i, sim::Loc loc = {}) const {
        ub_only("LocalTensor::GetValue");
        need(i + 1, "GetValue");
        sim::Ins in = sim::issue(sim::P_S, "LocalTensor::GetValue", loc);
        sim::core().st.sUbReads++;
        sim::check_written(addr_ + i * sizeof(T), sizeof(T), "LocalTensor::GetValue");
        sim::ub_read(in, addr_ + i * sizeof(T), sizeof(T));
        return at(i);
    }
    // Scalar write of the UB (pipe S): other pipes see it only after an S -> X edge.
    template <typename U>
    void SetValue(uint32_t i, U value, sim::Loc loc = {}) const {
        ub_only("LocalTensor::SetValue");
        need(i + 1, "SetValue");
        sim::Ins in = sim::issue(sim::P_S, "LocalTensor::SetValue", loc);
        sim::core().st.sUbWrites++;
        sim::ub_write(in, addr_ + i * sizeof(T), sizeof(T));
        put(i, T(value));
        sim::mark(addr_ + i * sizeof(T), sizeof(T));
    }
    template <typename U>
    LocalTensor<U> ReinterpretCast() const { return LocalTensor<U>(addr_, bytes_, mem_); }
    // twin internals
    void need(uint64_t elems, const char* api) const {
        if (elems * sizeof(T) > bytes_)
            sim::fail("bounds", std::string(api) + ": " + std::to_string(elems) + " elements exceed the " +
                                    std::to_string(bytes_) + " bytes left in the buffer at UB " + std::to_string(addr_));
    }
    void ub_only(const char* api) const {
        if (mem_ != sim::MEM_UB)
            sim::fail("position", std::string(api) + ": operand in " + sim::mem_name(mem_) +
                                      "; this API takes Unified Buffer (VECIN/VECOUT/VECCALC) tensors");
    }
    // the operand's first byte in its memory; element i through at / put (never a T*: see load_as)
    uint8_t* raw() const { return (mem_ == sim::MEM_UB ? sim::core().ub : sim::space(mem_).data.data()) + addr_; }
    T at(uint64_t i) const { return sim::load_as<T>(raw() + i * sizeof(T)); }
    void put(uint64_t i, const T& v) const { sim::store_as(raw() + i * sizeof(T), v); }
};

template <typename T>
class GlobalTensor {
public:
    T* base_ = nullptr;
    uint64_t size_ = 0;
    void SetGlobalBuffer(__gm__ T* buffer, uint64_t bufferSize) { base_ = buffer; size_ = bufferSize; }
    GlobalTensor operator[](uint64_t offset) const {
        if (offset > size_) sim::fail("bounds", "GlobalTensor[] offset " + std::to_string(offset) + " past its size " + std::to_string(size_));
        GlobalTensor g;
        g.base_ = base_ + offset;
        g.size_ = size_ - offset;
        return g;
    }
    uint64_t GetSize() const { return size_; }
    T* GetPhyAddr() const { return base_; }
    // Scalar GM access goes through the scalar data cache (see DataCacheCleanAndInvalid).
    T GetValue(uint64_t i, sim::Loc loc = {}) const {
        need(i + 1, "GlobalTensor::GetValue");
        sim::Ins in = sim::issue(sim::P_S, "GlobalTensor::GetValue", loc);
        sim::core().st.sGmReads++;
        sim::gm_access(in, base_ + i, sizeof(T), false);
        return sim::load_as<T>(base_ + i);
    }
    void SetValue(uint64_t i, T v, sim::Loc loc = {}) {
        need(i + 1, "GlobalTensor::SetValue");
        sim::Ins in = sim::issue(sim::P_S, "GlobalTensor::SetValue", loc);
        sim::core().st.sGmWrites++;
        sim::gm_access(in, base_ + i, sizeof(T), true);
        sim::store_as(base_ + i, v);
    }
    void need(uint64_t elems, const char* api) const {
        if (elems > size_)
            sim::fail("bounds", std::string(api) + ": " + std::to_string(elems) + " elements exceed the global buffer of " + std::to_string(size_));
    }
};

namespace detail {
// Which memory a TPosition lives in (the TPosition table of the Ascend C programming guide: A1/B1/C1
// are L1, A2 L0A, B2 L0B, CO1 L0C; the VEC positions the UB). C2 (bias table) and CO2 are not emulated.
constexpr uint8_t mem_of(TPosition p) {
    return (p == TPosition::A1 || p == TPosition::B1 || p == TPosition::C1) ? sim::MEM_L1
         : p == TPosition::A2 ? sim::MEM_L0A : p == TPosition::B2 ? sim::MEM_L0B : p == TPosition::CO1 ? sim::MEM_L0C
         : sim::MEM_UB;
}
}  // namespace detail
class TPipe;
// the running context's live TPipe (one per core: GetTPipePtr)
inline TPipe*& current_pipe() { return reinterpret_cast<TPipe*&>(sim::core().pipe); }

// TQue: `num` buffers of `len` bytes from TPipe::InitBuffer; at most `depth` tensors queued.
// The queue carries the documented implicit edges (GetQueEvt, ascendc/basic_api/impl/kernel_event.h):
// VECIN: EnQue -> DeQue is MTE2 -> V, FreeTensor -> next AllocTensor of that buffer is V -> MTE2;
// VECOUT: EnQue -> DeQue is V -> MTE3, FreeTensor -> AllocTensor is MTE3 -> V. VECCALC: none.
template <TPosition pos, int32_t depth>
class TQue {
public:
    static constexpr TPosition kPos = pos;
    enum State : uint8_t { FREE, ALLOCATED, QUEUED, DEQUEUED };
    uint32_t base_ = 0, len_ = 0;
    int num_ = 0;
    State state_[16] = {FREE};
    bool freed_[16] = {false};
    sim::VC freeVc_[16];
    std::deque<std::pair<int, sim::VC>> fifo_;
    bool inited_ = false;

    static constexpr bool kIn = pos == TPosition::VECIN;
    static constexpr bool kOut = pos == TPosition::VECOUT;
    static constexpr sim::Pipe kProducer = kIn ? sim::P_MTE2 : sim::P_V;
    static constexpr sim::Pipe kConsumer = kIn ? sim::P_V : sim::P_MTE3;
    static constexpr bool kSync = kIn || kOut;

    template <typename T>
    LocalTensor<T> AllocTensor() {
        if (!inited_) sim::fail("queue", "AllocTensor on a queue TPipe::InitBuffer never set up");
        for (int i = 0; i < num_; i++) {
            if (state_[i] == FREE) {
                int& out = sim::core().allocs[int(pos)];
                if (out >= sim::kMaxAllocPerPosition)
                    sim::fail("queue", "more than 8 tensors allocated at once on one TPosition");
                out++;
                state_[i] = ALLOCATED;
                if (kSync && freed_[i]) {  // wait until the consumer released this buffer
                    sim::wait_on(kProducer, freeVc_[i]);
                    sim::core().st.queueWaits++;
                    freed_[i] = false;
                }
                sim::unmark(base_ + i * len_, len_);  // content is random after AllocTensor
                return LocalTensor<T>(base_ + i * len_, len_);
            }
        }
        sim::fail("queue", "AllocTensor beyond the " + std::to_string(num_) + " buffers given to InitBuffer (a FreeTensor is missing)");
    }
    template <typename T>
    bool EnQue(const LocalTensor<T>& t) {
        int i = index_of(t.addr_, "EnQue");
        if (state_[i] != ALLOCATED) sim::fail("queue", "EnQue of a tensor that is not freshly allocated from this queue");
        if (int(fifo_.size()) >= depth) sim::fail("queue", "EnQue beyond the queue depth " + std::to_string(depth));
        state_[i] = QUEUED;
        fifo_.push_back({i, kSync ? sim::source_done(kProducer) : sim::VC()});
        return true;
    }
    template <typename T>
    LocalTensor<T> DeQue() {
        if (fifo_.empty()) sim::fail("queue", "DeQue of an empty queue");
        auto e = fifo_.front();
        fifo_.pop_front();
        int i = e.first;
        if (kSync) {
            sim::wait_on(kConsumer, e.second);
            sim::core().st.queueWaits++;
        }
        state_[i] = DEQUEUED;
        return LocalTensor<T>(base_ + i * len_, len_);
    }
    template <typename T>
    void FreeTensor(LocalTensor<T>& t) {
        int i = index_of(t.addr_, "FreeTensor");
        if (state_[i] == FREE) sim::fail("queue", "FreeTensor of a tensor not allocated (double free?)");
        if (state_[i] == QUEUED) sim::fail("queue", "FreeTensor of a tensor still in the queue");
        if (kSync) {
            freeVc_[i] = sim::source_done(kConsumer);
            freed_[i] = true;
        }
        state_[i] = FREE;
        sim::core().allocs[int(pos)]--;
    }
    int index_of(uint32_t addr, const char* api) const {
        if (inited_ && addr >= base_ && addr < base_ + num_ * len_ && (addr - base_) % len_ == 0)
            return int((addr - base_) / len_);
        sim::fail("queue", std::string(api) + " of a tensor that does not start a buffer of this queue");
    }
};

// TBuf: one buffer, Get<T>() returns all of it; content persists between Get calls; no implicit sync.
template <TPosition pos = TPosition::VECCALC>
class TBuf {
public:
    static constexpr uint8_t kMem = detail::mem_of(pos);
    uint32_t base_ = 0, len_ = 0;
    bool inited_ = false;
    template <typename T>
    LocalTensor<T> Get() {
        if (!inited_) sim::fail("queue", "TBuf::Get before TPipe::InitBuffer");
        return LocalTensor<T>(base_, len_, kMem);
    }
    template <typename T>
    LocalTensor<T> Get(uint32_t len) {
        LocalTensor<T> t = Get<T>();
        t.need(len, "TBuf::Get");
        return LocalTensor<T>(base_, len * sizeof(T), kMem);
    }
};

// TPipe (CANN 8.1 ascendc/basic_api/impl/kernel_tpipe_impl.h, cited by line below):
//   * construction runs Init (:40-43), which starts with ResetPool (:59; :833-847): every buffer
//     pool starts again at its base and every event id is free. Two TPipes alive at once would hand
//     out the same addresses: the twin refuses the second ([tpipe]); one after the other is legal;
//   * on a cube core (AIC) Init then allocates M_MTE1 ids 0, 1, 2 and sets them (:63-75), so
//     FetchEventID / AllocEventID of M_MTE1 start at 3, and a kernel that sets those ids by hand
//     sets a set flag ([flag]);
//   * Destroy (:395-430; the destructor calls it unless done) waits M_MTE1 ids 0-2 on an AIC
//     (:405-415) and ends with pipe_barrier(PIPE_ALL) (:424-426): every pipe drained. The twin
//     also marks the pipe's bytes unwritten again, so the next pipe's buffers start as garbage;
//   * AllocEventID takes the lowest free id of the event's bitmap (:340-352), ReleaseEventID frees
//     it (:354-364), FetchEventID returns the lowest free id without taking it (:366-386); ids are
//     0..7 (QUE_MAX_EVENT, kernel_macros.h:101-104).
class TPipe {
public:
    explicit TPipe(sim::Loc loc = {}) {
        sim::Core& c = sim::core();
        if (current_pipe())
            sim::fail("tpipe", "a second TPipe (" + sim::site_str(sim::intern("TPipe", loc)) +
                                   ") while another is alive: TPipe::Init resets every buffer pool "
                                   "(kernel_tpipe_impl.h:59, ResetPool), so both would hand out the same addresses");
        current_pipe() = this;
        c.ubUsed = 0;
        for (sim::Space* sp : c.sp)
            if (sp) sp->used = 0;
        if (c.coreType == sim::CT_AIC) {
            for (int id = 0; id < kTPipeMte1Ids; id++) {
                occupy_[int(HardEvent::M_MTE1)] |= uint8_t(1u << id);
                preset(id, loc);
            }
        }
    }
    ~TPipe() noexcept(false) {
        if (!destroyed_) Destroy();
    }
    TPipe(const TPipe&) = delete;
    TPipe& operator=(const TPipe&) = delete;
    template <class Q>
    bool InitBuffer(Q& que, uint8_t num, uint32_t len) {
        if (Q::kPos != TPosition::VECIN && Q::kPos != TPosition::VECOUT && Q::kPos != TPosition::VECCALC)
            sim::fail("queue", "twin: TQue on cube positions (A1/B1/A2/B2/CO1) is not emulated; use TBuf with "
                               "explicit SetFlag/WaitFlag");
        if (num == 0 || num > 16) sim::fail("queue", "InitBuffer num must be 1..16");
        uint32_t l = round32(len);
        que.base_ = take(uint64_t(num) * l, "InitBuffer(queue)");
        que.len_ = l;
        que.num_ = num;
        que.inited_ = true;
        return true;
    }
    template <TPosition p>
    bool InitBuffer(TBuf<p>& buf, uint32_t len) {
        if (TBuf<p>::kMem != sim::MEM_UB) {
            buf.base_ = take_cube(TBuf<p>::kMem, len);
            buf.len_ = round_to(len, TBuf<p>::kMem == sim::MEM_L1 ? sim::limits::kL1Align : sim::limits::kL0Align);
            buf.inited_ = true;
            return true;
        }
        uint32_t l = round32(len);
        buf.base_ = take(l, "InitBuffer(TBuf)");
        buf.len_ = l;
        buf.inited_ = true;
        return true;
    }
    // The lowest id of `evt` no AllocEventID holds (not taken).
    TEventID FetchEventID(HardEvent evt, sim::Loc loc = {}) { return TEventID(free_id(evt, "FetchEventID", loc)); }
    template <HardEvent evt>
    TEventID FetchEventID(sim::Loc loc = {}) { return FetchEventID(evt, loc); }
    template <HardEvent evt>
    TEventID AllocEventID(sim::Loc loc = {}) {
        const int id = free_id(evt, "AllocEventID", loc);
        occupy_[int(evt)] |= uint8_t(1u << id);
        return TEventID(id);
    }
    template <HardEvent evt>
    void ReleaseEventID(TEventID id, sim::Loc loc = {}) {
        if (id < 0 || id >= kIds || !(occupy_[int(evt)] & (1u << id)))
            sim::fail("flag", "ReleaseEventID<" + std::string(detail::ev_name(evt)) + ">(" + std::to_string(id) +
                                  ") of an id AllocEventID does not hold (" +
                                  sim::site_str(sim::intern("ReleaseEventID", loc)) + ")");
        occupy_[int(evt)] &= uint8_t(~(1u << id));
    }
    void Destroy(sim::Loc loc = {});
    // ResetPool without the cube core's M_MTE1 presets (kernel_tpipe_impl.h:432-448).
    void Reset() { release_memory(); }

private:
    static constexpr int kIds = 8;            // QUE_MAX_EVENT
    static constexpr int kTPipeMte1Ids = 3;   // M_MTE1 ids 0-2 a TPipe holds on an AIC
    uint8_t occupy_[sim::kEvents] = {0};
    bool destroyed_ = false;
    void preset(int id, const sim::Loc& loc);
    int free_id(HardEvent evt, const char* api, const sim::Loc& loc) const {
        for (int id = 0; id < kIds; id++)
            if (!(occupy_[int(evt)] & (1u << id))) return id;
        sim::fail("flag", std::string(api) + "<" + detail::ev_name(evt) + ">: all 8 ids are allocated (" +
                              sim::site_str(sim::intern(api, loc)) + ")");
    }
    void release_memory() {
        sim::Core& c = sim::core();
        if (c.ubUsed) sim::unmark(0, c.ubUsed);  // the next pipe's bytes start unwritten
        c.ubUsed = 0;
        for (sim::Space* sp : c.sp)
            if (sp) {
                std::fill(sp->written.begin(), sp->written.begin() + sp->used, uint8_t(0));
                sp->used = 0;
            }
    }
    static uint32_t round32(uint32_t x) { return (x + 31u) / 32u * 32u; }
    static uint32_t round_to(uint32_t x, uint32_t a) { return (x + a - 1u) / a * a; }
    // L1 / L0A / L0B / L0C of a cube core: capacities of sim_limits.h; L1 buffers start 32-byte
    // aligned, L0 buffers 512-byte aligned (CheckDataCopyAlign, asc-tools kernel_data_copy_check.cpp).
    uint32_t take_cube(uint8_t m, uint64_t len) {
        sim::Core& c = sim::core();
        if (c.coreType != sim::CT_AIC)
            sim::fail("core-type", std::string("InitBuffer of a ") + sim::mem_name(m) +
                                       " buffer on a vector core (AIV): only the cube core (AIC) has L1/L0A/L0B/L0C");
        static const uint32_t caps[] = {0, sim::limits::kL1Bytes, sim::limits::kL0ABytes, sim::limits::kL0BBytes,
                                        sim::limits::kL0CBytes};
        if (!c.sp[m]) c.sp[m] = new sim::Space(caps[m]);
        sim::Space& sp = *c.sp[m];
        const uint32_t l = round_to(uint32_t(len), m == sim::MEM_L1 ? sim::limits::kL1Align : sim::limits::kL0Align);
        if (uint64_t(sp.used) + l > sp.cap)
            sim::fail("cube-capacity", std::string("InitBuffer(TBuf) in ") + sim::mem_name(m) + ": " +
                                           std::to_string(sp.used) + " + " + std::to_string(l) + " bytes exceed its " +
                                           std::to_string(sp.cap) + " bytes (sim_limits.h)");
        const uint32_t a = sp.used;
        sp.used += l;
        return a;
    }
    uint32_t take(uint64_t bytes, const char* api) {
        sim::Core& c = sim::core();
        if (c.coreType != sim::CT_AIV)
            sim::fail("core-type", std::string(api) + ": a Unified Buffer allocation on a cube core (AIC), which has none");
        if (uint64_t(c.ubUsed) + bytes > sim::kUbBytes)
            sim::fail("ub-capacity", std::string(api) + ": " + std::to_string(c.ubUsed) + " + " + std::to_string(bytes) +
                                         " bytes exceed the 192 KiB Unified Buffer");
        uint32_t a = c.ubUsed;
        c.ubUsed += uint32_t(bytes);
        c.ubPeak = c.ubUsed > c.ubPeak ? c.ubUsed : c.ubPeak;
        return a;
    }
};

// SetFlag executes on the source pipe once everything issued to it before is complete; WaitFlag
// blocks the destination pipe until then. A set never waited by the end of the kernel is an error.
namespace detail {
inline void check_pipe_on_core(sim::Pipe p, const char* api) {
    const sim::Core& c = sim::core();
    const bool cube = p == sim::P_M || p == sim::P_MTE1 || p == sim::P_FIX, vec = p == sim::P_V || p == sim::P_MTE3;
    if ((c.coreType == sim::CT_AIV && cube) || (c.coreType == sim::CT_AIC && vec))
        sim::fail("core-type", std::string(api) + " names pipe " + sim::pipe_name(p) + ", which a " +
                                   (c.coreType == sim::CT_AIC ? "cube core (AIC)" : "vector core (AIV)") + " does not have");
}
}  // namespace detail
// A flag is one hardware bit per (event, id), ids 0..7 (kernel_event.h:505-506 and 540-541 assert
// 0 <= id < QUE_MAX_EVENT): SetFlag of a flag already set, with no WaitFlag between, is refused
// ([flag]; the SetFlag/WaitFlag page: SetFlag only sets the bit, and setting it twice is undefined).
namespace detail {
inline void check_event_id(int32_t id, HardEvent e, const char* api, const sim::Loc& loc) {
    if (id < 0 || id > 7)
        sim::fail("flag", std::string(api) + "<" + ev_name(e) + ">(" + std::to_string(id) +
                              "): event ids are 0..7 (QUE_MAX_EVENT, kernel_event.h) (" +
                              sim::site_str(sim::intern(api, loc)) + ")");
}
inline void set_flag(HardEvent e, int32_t id, const sim::Loc& loc, const char* api = "SetFlag") {
    sim::Core& c = sim::core();
    check_event_id(id, e, api, loc);
    auto& q = c.flags[int(e)][id];
    if (!q.empty())
        sim::fail("flag", std::string(api) + "<" + ev_name(e) + ">(" + std::to_string(id) + ") (" +
                              sim::site_str(sim::intern(api, loc)) + ") on a flag already set by " +
                              sim::site_str(q.front().site) +
                              " with no WaitFlag between: a flag is one bit per (event, id), the second set is lost");
    q.push_back({sim::source_done(ev_src(e)), sim::intern(api, loc)});
}
inline void wait_flag(HardEvent e, int32_t id, const sim::Loc& loc, const char* api = "WaitFlag") {
    sim::Core& c = sim::core();
    check_event_id(id, e, api, loc);
    auto& q = c.flags[int(e)][id];
    if (q.empty())
        sim::fail("flag", std::string(api) + "<" + ev_name(e) + ">(" + std::to_string(id) +
                              ") without a matching SetFlag (" + sim::site_str(sim::intern(api, loc)) + ")");
    sim::wait_on(ev_dst(e), q.front().vc);
    q.pop_front();
}
}  // namespace detail
template <HardEvent e>
inline void SetFlag(int32_t id, sim::Loc loc = {}) {
    sim::Core& c = sim::core();
    detail::check_pipe_on_core(detail::ev_src(e), "SetFlag");
    detail::check_pipe_on_core(detail::ev_dst(e), "SetFlag");
    detail::set_flag(e, id, loc);
    c.st.setFlags++;
}
template <HardEvent e>
inline void WaitFlag(int32_t id, sim::Loc loc = {}) {
    sim::Core& c = sim::core();
    detail::wait_flag(e, id, loc);
    c.st.waitFlags++;
    if (detail::ev_dst(e) == sim::P_S) c.st.waitsToS++;
    if (e == HardEvent::V_S) c.st.vToS++;
}
inline void TPipe::preset(int id, const sim::Loc& loc) { detail::set_flag(HardEvent::M_MTE1, id, loc, "TPipe (Init)"); }
inline void TPipe::Destroy(sim::Loc loc) {
    if (destroyed_) return;
    destroyed_ = true;
    if (current_pipe() == this) current_pipe() = nullptr;
    if (std::uncaught_exceptions()) return;  // unwinding a failed kernel: nothing to check
    sim::Core& c = sim::core();
    if (c.coreType == sim::CT_AIC)
        for (int id = 0; id < kTPipeMte1Ids; id++) detail::wait_flag(HardEvent::M_MTE1, id, loc, "TPipe::Destroy");
    sim::barrier_all();
    c.st.barrierAll++;
    release_memory();
}

template <pipe_t p>
inline void PipeBarrier() {
    sim::Core& c = sim::core();
    if (p == PIPE_ALL) {
        sim::barrier_all();
        c.st.barrierAll++;
        return;
    }
    constexpr sim::Pipe q = detail::pipe_of(p);
    sim::barrier(q);
    if (q == sim::P_V) c.st.barrierV++;
}

// SyncAll: every participating core reaches it before any goes on; the GM written before it by
// any of them may be read after it by any of them. The twin also drains this core's pipes (as
// SyncAllImpl in dav_c220/kernel_operator_sync_impl.h starts with PipeBarrier<PIPE_ALL>).
// Participants: SyncAll<true> (the default) all vector cores; SyncAll<false> in a mixed launch all
// cube and vector cores (SyncAllImpl: the AIC and AIV halves exchange hardware flags 11-14).
template <bool isAIVOnly = true>
inline void SyncAll(sim::Loc = {}) {
    sim::barrier_all();
    sim::Core& c = sim::core();
    c.st.syncAll++;
    if (c.mixed && isAIVOnly && c.coreType == sim::CT_AIC)
        sim::fail("syncall", "SyncAll<true> (vector cores only) called on a cube core (AIC)");
    sim::VC token = c.mixed ? sim::export_done(sim::P_S) : sim::VC();
    if (c.mixed) {  // everything every pipe of this core completed
        for (int q = 0; q < sim::P_NUM; q++) {
            sim::VC t = sim::export_done(sim::Pipe(q));
            token.join(t);
        }
    }
    if (sim::sync_all_hook()) {
        sim::VC got = sim::sync_all_hook()(isAIVOnly ? 0 : 1, token);
        if (c.mixed)
            for (int q = 0; q < sim::P_NUM; q++) sim::wait_on(sim::Pipe(q), got);
    }
}

// CrossCoreSetFlag / CrossCoreWaitFlag (dav-c220; interface/kernel_operator_common_intf.h,
// impl/dav_c220/kernel_operator_sync_impl.h; semantics from the CrossCoreSetFlag page of the
// Ascend C API reference, CANN 8.0, atlasascendc_api_07_0273): one counter per flag id, initially
// 0; a set adds 1 (on the issuing pipe, after everything that pipe issued before completed); a
// wait blocks while the counter is 0, then subtracts 1. Mode 0: all cores of one type; mode 1: the
// two AIVs of one AI core; mode 2: an AIC's set counts once for each of its two AIVs, and the AIC's
// counter goes up once both AIVs have set. Documented limits enforced: modeId 0..2, flagId 0..10
// on Atlas A2 (11-14 are taken by SyncAll's hardware flags), pipe neither PIPE_S nor PIPE_ALL, at
// most 15 pending sets per counter (the 9.0 page; the 8.0 page says 16). ASSUMPTION of the twin's
// scheduling: a wait that finds its counter at 0 holds the whole context (its scalar unit) until a
// set arrives, even when the wait names another pipe (e.g. PIPE_MTE2); the ordering it creates is
// on that pipe only. A kernel whose progress needs S to run past such a wait is reported as a hang.
template <uint8_t modeId, pipe_t pipe>
inline void CrossCoreSetFlag(uint16_t flagId, sim::Loc loc = {}) {
    static_assert(pipe != PIPE_S && pipe != PIPE_ALL, "CrossCoreSetFlag: pipe may be neither PIPE_S nor PIPE_ALL");
    sim::Core& c = sim::core();
    const std::string at = sim::site_str(sim::intern("CrossCoreSetFlag", loc));
    if (modeId > 2) sim::fail("cross-flag", "CrossCoreSetFlag modeId " + std::to_string(modeId) + " outside 0..2 (" + at + ")");
    if (flagId > sim::limits::kCrossFlagMaxId)
        sim::fail("cross-flag", "CrossCoreSetFlag flagId " + std::to_string(flagId) +
                                    " outside 0..10, the Atlas A2 range (" + at + ")");
    detail::check_pipe_on_core(detail::pipe_of(pipe), "CrossCoreSetFlag");
    if (!c.mixed || !sim::cross_set_hook())
        sim::fail("cross-flag", "twin: CrossCoreSetFlag is emulated only in a mixed launch (" + at + ")");
    c.st.crossSets++;
    sim::VC t = sim::export_done(detail::pipe_of(pipe));
    sim::cross_set_hook()(modeId, flagId * 65536 + int(sim::intern("CrossCoreSetFlag", loc)), t);
}
template <uint8_t modeId = 0, pipe_t pipe = PIPE_S>
inline void CrossCoreWaitFlag(uint16_t flagId, sim::Loc loc = {}) {
    sim::Core& c = sim::core();
    const std::string at = sim::site_str(sim::intern("CrossCoreWaitFlag", loc));
    if (flagId > sim::limits::kCrossFlagMaxId)
        sim::fail("cross-flag", "CrossCoreWaitFlag flagId " + std::to_string(flagId) +
                                    " outside 0..10, the Atlas A2 range (" + at + ")");
    detail::check_pipe_on_core(detail::pipe_of(pipe), "CrossCoreWaitFlag");
    if (!c.mixed || !sim::cross_wait_hook())
        sim::fail("cross-flag", "twin: CrossCoreWaitFlag is emulated only in a mixed launch (" + at + ")");
    c.st.crossWaits++;
    sim::VC t = sim::cross_wait_hook()(modeId, flagId * 65536 + int(sim::intern("CrossCoreWaitFlag", loc)));
    const sim::Pipe dst = pipe == PIPE_ALL ? sim::P_S : detail::pipe_of(pipe);
    sim::wait_on(dst, t);
}

// DataCacheCleanAndInvalid (ascendc/basic_api/interface/kernel_common.h): writes back and drops
// the scalar data cache lines of dst (SINGLE_CACHE_LINE: the 64-byte line at its start;
// ENTIRE_DATA_CACHE: all of this core's lines). Needed between a DMA write of GM and a scalar read
// of it, between a scalar write of GM and a DMA read of it, and before a scalar read of a line
// this core's cache may hold when another core may have written it since (the
// DataCacheCleanAndInvalid page; CANN 8.1 kernel_operator_group_barrier_impl.h:94-96 drops the
// line before every read of the other cores' arrival counter). Lines are 64 bytes
// (dav_c220/kfc/kfc_comm.h:482).
template <typename T, CacheLine entire, DcciDst dst = DcciDst::CACHELINE_OUT>
inline void DataCacheCleanAndInvalid(const GlobalTensor<T>& t) {
    sim::core().st.dcci++;
    const uintptr_t a = reinterpret_cast<uintptr_t>(t.base_) / 64 * 64;
    sim::gm_dcci(reinterpret_cast<const void*>(a), 64, entire == CacheLine::ENTIRE_DATA_CACHE);
}

// ---------------------------------------------------------------------------------------------
// Data movement
struct DataCopyParams {
    uint16_t blockCount = 1;
    uint16_t blockLen = 0;   // in 32-byte blocks
    uint16_t srcStride = 0;  // gap between blocks, 32-byte blocks
    uint16_t dstStride = 0;
    DataCopyParams() = default;
    DataCopyParams(uint16_t c, uint16_t l, uint16_t s, uint16_t d) : blockCount(c), blockLen(l), srcStride(s), dstStride(d) {}
};
struct DataCopyExtParams {
    uint16_t blockCount = 1;
    uint32_t blockLen = 0;   // bytes
    uint32_t srcStride = 0;  // GM side: bytes; UB side: 32-byte blocks
    uint32_t dstStride = 0;  // GM side: bytes; UB side: 32-byte blocks
    uint32_t rsv = 0;
    DataCopyExtParams() = default;
    DataCopyExtParams(uint16_t c, uint32_t l, uint32_t s, uint32_t d, uint32_t r)
        : blockCount(c), blockLen(l), srcStride(s), dstStride(d), rsv(r) {}
};
template <typename T>
struct DataCopyPadExtParams {
    bool isPad = false;
    uint8_t leftPadding = 0;   // elements
    uint8_t rightPadding = 0;  // elements
    T paddingValue = T(0);
    DataCopyPadExtParams() = default;
    DataCopyPadExtParams(bool p, uint8_t l, uint8_t r, T v) : isPad(p), leftPadding(l), rightPadding(r), paddingValue(v) {}
};

namespace detail {
inline void dma_stats(sim::Pipe p, uint64_t bytes, uint64_t bursts) {
    sim::Stats& st = sim::core().st;
    st.dmaBytes[p] += bytes;
    st.dmaBursts[p] += bursts;
}
constexpr const char* kSrcDataCopy = "CheckDataCopyParams, dav_c220/kernel_operator_data_copy_impl.h";
constexpr const char* kSrcDataCopyPad = "CheckDataCopyPadParams, dav_c220/kernel_operator_data_copy_impl.h";
inline void check_copy_params(const char* api, uint32_t count, uint32_t len) {
    sim::check_range("dma-param", api, "blockCount", count, 1, sim::limits::kDataCopyMaxBlockCount, kSrcDataCopy);
    sim::check_range("dma-param", api, "blockLen (32-byte blocks)", len, 1, sim::limits::kDataCopyMaxBlockLen, kSrcDataCopy);
}
template <typename T>
inline void check_pad_params(const char* api, const DataCopyExtParams& p, bool gmToUb) {
    sim::check_range("dma-param", api, "blockCount", p.blockCount, 0, sim::limits::kDataCopyPadMaxBlockCount, kSrcDataCopyPad);
    sim::check_range("dma-param", api, "blockLen (bytes)", p.blockLen, 0, sim::limits::kDataCopyPadMaxBlockLen, kSrcDataCopyPad);
    if (gmToUb && p.blockLen % sizeof(T))
        sim::fail("dma-param", std::string(api) + " GM->UB: blockLen " + std::to_string(p.blockLen) +
                                   " bytes is not a multiple of the element size " + std::to_string(sizeof(T)) + " (" +
                                   kSrcDataCopyPad + ")");
}
}  // namespace detail

// DataCopy, contiguous: calCount * sizeof(T) must be a multiple of 32 bytes; UB address 32-aligned.
// One burst of calCount * sizeof(T) / 32 blocks (so at most 65535 blocks).
template <typename T>
inline void DataCopy(const LocalTensor<T>& dst, const GlobalTensor<T>& src, uint32_t calCount, sim::Loc loc = {}) {
    uint32_t n = calCount * sizeof(T);
    if (n % sim::kBlock) sim::fail("alignment", "DataCopy GM->UB of " + std::to_string(n) + " bytes: not a multiple of 32 bytes");
    dst.ub_only("DataCopy"); sim::check_align(dst.addr_, 32, "DataCopy", "destination");
    detail::check_copy_params("DataCopy GM->UB", 1, n / sim::kBlock);
    dst.need(calCount, "DataCopy");
    src.need(calCount, "DataCopy");
    sim::Ins in = sim::issue(sim::P_MTE2, "DataCopy GM->UB", loc);
    sim::gm_access(in, src.base_, n, false);
    sim::ub_write(in, dst.addr_, n);
    detail::dma_stats(sim::P_MTE2, n, 1);
    std::memcpy(dst.raw(), src.base_, n);
    sim::mark(dst.addr_, n);
}
template <typename T>
inline void DataCopy(const GlobalTensor<T>& dst, const LocalTensor<T>& src, uint32_t calCount, sim::Loc loc = {}) {
    uint32_t n = calCount * sizeof(T);
    if (n % sim::kBlock) sim::fail("alignment", "DataCopy UB->GM of " + std::to_string(n) + " bytes: not a multiple of 32 bytes");
    src.ub_only("DataCopy"); sim::check_align(src.addr_, 32, "DataCopy", "source");
    detail::check_copy_params("DataCopy UB->GM", 1, n / sim::kBlock);
    src.need(calCount, "DataCopy");
    dst.need(calCount, "DataCopy");
    sim::check_written(src.addr_, n, "DataCopy UB->GM");
    sim::Ins in = sim::issue(sim::P_MTE3, "DataCopy UB->GM", loc);
    sim::ub_read(in, src.addr_, n);
    sim::gm_access(in, dst.base_, n, true);
    detail::dma_stats(sim::P_MTE3, n, 1);
    std::memcpy(dst.base_, src.raw(), n);
}
// DataCopy with DataCopyParams, GM->UB: blockCount blocks of blockLen * 32 bytes; gaps in 32 B units.
template <typename T>
inline void DataCopy(const LocalTensor<T>& dst, const GlobalTensor<T>& src, const DataCopyParams& p, sim::Loc loc = {}) {
    dst.ub_only("DataCopy"); sim::check_align(dst.addr_, 32, "DataCopy", "destination");
    detail::check_copy_params("DataCopy(DataCopyParams) GM->UB", p.blockCount, p.blockLen);
    sim::Ins in = sim::issue(sim::P_MTE2, "DataCopy(DataCopyParams) GM->UB", loc);
    const uint32_t blk = p.blockLen * 32u;
    for (uint32_t i = 0; i < p.blockCount; i++) {
        uint64_t s = uint64_t(i) * (p.blockLen + p.srcStride) * 32u, d = uint64_t(i) * (p.blockLen + p.dstStride) * 32u;
        if ((s + blk) > src.size_ * sizeof(T)) sim::fail("bounds", "DataCopy(params) reads past the global buffer");
        if ((d + blk) > dst.bytes_) sim::fail("bounds", "DataCopy(params) writes past the local buffer");
        sim::gm_access(in, reinterpret_cast<const uint8_t*>(src.base_) + s, blk, false);
        sim::ub_write(in, dst.addr_ + uint32_t(d), blk);
        std::memcpy(dst.raw() + d, reinterpret_cast<const uint8_t*>(src.base_) + s, blk);
        sim::mark(dst.addr_ + uint32_t(d), blk);
    }
    detail::dma_stats(sim::P_MTE2, uint64_t(blk) * p.blockCount, p.blockCount);
}
// DataCopy with DataCopyParams, UB->GM.
template <typename T>
inline void DataCopy(const GlobalTensor<T>& dst, const LocalTensor<T>& src, const DataCopyParams& p, sim::Loc loc = {}) {
    src.ub_only("DataCopy"); sim::check_align(src.addr_, 32, "DataCopy", "source");
    detail::check_copy_params("DataCopy(DataCopyParams) UB->GM", p.blockCount, p.blockLen);
    sim::Ins in = sim::issue(sim::P_MTE3, "DataCopy(DataCopyParams) UB->GM", loc);
    const uint32_t blk = p.blockLen * 32u;
    for (uint32_t i = 0; i < p.blockCount; i++) {
        uint64_t s = uint64_t(i) * (p.blockLen + p.srcStride) * 32u, d = uint64_t(i) * (p.blockLen + p.dstStride) * 32u;
        if ((s + blk) > src.bytes_) sim::fail("bounds", "DataCopy(params) reads past the local buffer");
        if ((d + blk) > dst.size_ * sizeof(T)) sim::fail("bounds", "DataCopy(params) writes past the global buffer");
        sim::check_written(src.addr_ + uint32_t(s), blk, "DataCopy(params) UB->GM");
        sim::ub_read(in, src.addr_ + uint32_t(s), blk);
        sim::gm_access(in, reinterpret_cast<uint8_t*>(dst.base_) + d, blk, true);
        std::memcpy(reinterpret_cast<uint8_t*>(dst.base_) + d, src.raw() + s, blk);
    }
    detail::dma_stats(sim::P_MTE3, uint64_t(blk) * p.blockCount, p.blockCount);
}
// DataCopyPad GM->UB: blockLen bytes per block (a multiple of the element size), each block starts
// on a 32-byte boundary in UB (plus dstStride blocks); rightPadding elements after the data get
// paddingValue when isPad, otherwise stay undefined (the page: "random values").
template <typename T>
inline void DataCopyPad(const LocalTensor<T>& dst, const GlobalTensor<T>& src, const DataCopyExtParams& p,
                        const DataCopyPadExtParams<T>& pad, sim::Loc loc = {}) {
    dst.ub_only("DataCopyPad"); sim::check_align(dst.addr_, 32, "DataCopyPad", "destination");
    detail::check_pad_params<T>("DataCopyPad", p, true);
    if (pad.leftPadding) sim::fail("bounds", "DataCopyPad leftPadding is not emulated");
    if (pad.rightPadding * sizeof(T) > sim::limits::kDataCopyPadMaxPadBytes)
        sim::fail("dma-param", "DataCopyPad rightPadding over 32 bytes (CheckPadParamters, asc-tools kernel_data_copy_pad_check.cpp)");
    const uint32_t blkUb = (p.blockLen + 31u) / 32u * 32u;
    if (p.blockLen + pad.rightPadding * sizeof(T) > blkUb)
        sim::fail("bounds", "DataCopyPad data plus rightPadding overflow the 32-byte aligned block");
    sim::Ins in = sim::issue(sim::P_MTE2, "DataCopyPad GM->UB", loc);
    for (uint32_t i = 0; i < p.blockCount; i++) {
        uint64_t s = uint64_t(i) * (p.blockLen + p.srcStride), d = uint64_t(i) * (blkUb + p.dstStride * 32u);
        if (s + p.blockLen > src.size_ * sizeof(T)) sim::fail("bounds", "DataCopyPad reads past the global buffer");
        if (d + blkUb > dst.bytes_) sim::fail("bounds", "DataCopyPad writes past the local buffer");
        uint8_t* out = dst.raw() + d;
        sim::gm_access(in, reinterpret_cast<const uint8_t*>(src.base_) + s, p.blockLen, false);
        const uint32_t padBytes = pad.isPad ? pad.rightPadding * uint32_t(sizeof(T)) : 0u;
        sim::ub_write(in, dst.addr_ + uint32_t(d), p.blockLen + padBytes);
        std::memcpy(out, reinterpret_cast<const uint8_t*>(src.base_) + s, p.blockLen);
        sim::mark(dst.addr_ + uint32_t(d), p.blockLen);
        if (pad.isPad) {
            for (uint32_t k = 0; k < pad.rightPadding; k++)
                std::memcpy(out + p.blockLen + k * sizeof(T), &pad.paddingValue, sizeof(T));
            sim::mark(dst.addr_ + uint32_t(d) + p.blockLen, pad.rightPadding * sizeof(T));
        }
    }
    detail::dma_stats(sim::P_MTE2, uint64_t(p.blockLen) * p.blockCount, p.blockCount);
}
// DataCopyPad UB->GM: blockLen bytes per block; UB blocks 32-byte aligned (srcStride in blocks),
// GM gap dstStride in bytes.
template <typename T>
inline void DataCopyPad(const GlobalTensor<T>& dst, const LocalTensor<T>& src, const DataCopyExtParams& p,
                        sim::Loc loc = {}) {
    src.ub_only("DataCopyPad"); sim::check_align(src.addr_, 32, "DataCopyPad", "source");
    detail::check_pad_params<T>("DataCopyPad", p, false);
    sim::Ins in = sim::issue(sim::P_MTE3, "DataCopyPad UB->GM", loc);
    const uint32_t blkUb = (p.blockLen + 31u) / 32u * 32u;
    for (uint32_t i = 0; i < p.blockCount; i++) {
        uint64_t s = uint64_t(i) * (blkUb + p.srcStride * 32u), d = uint64_t(i) * (p.blockLen + p.dstStride);
        if (s + p.blockLen > src.bytes_) sim::fail("bounds", "DataCopyPad reads past the local buffer");
        if (d + p.blockLen > dst.size_ * sizeof(T)) sim::fail("bounds", "DataCopyPad writes past the global buffer");
        sim::check_written(src.addr_ + uint32_t(s), p.blockLen, "DataCopyPad UB->GM");
        sim::ub_read(in, src.addr_ + uint32_t(s), p.blockLen);
        sim::gm_access(in, reinterpret_cast<uint8_t*>(dst.base_) + d, p.blockLen, true);
        std::memcpy(reinterpret_cast<uint8_t*>(dst.base_) + d, src.raw() + s, p.blockLen);
    }
    detail::dma_stats(sim::P_MTE3, uint64_t(p.blockLen) * p.blockCount, p.blockCount);
}

// ---------------------------------------------------------------------------------------------
// Vector instructions, "first calCount elements" prototypes. Each operand: 32-byte aligned,
// inside its buffer; inputs must have been written; the result is marked written. Each call is
// one instruction on pipe V: inputs are read (ordering checked), then the output is written.
namespace detail {
template <typename T>
inline float ld(const LocalTensor<T>& t, uint32_t i) { return float(t.at(i)); }
template <typename T>
inline void st(const LocalTensor<T>& t, uint32_t i, float v) { t.put(i, T(v)); }
template <typename T>
inline void in(const sim::Ins& ins, const LocalTensor<T>& t, int32_t n, const char* api) {
    t.ub_only(api);
    sim::check_align(t.addr_, 32, api, "source");
    t.need(uint32_t(n), api);
    sim::check_written(t.addr_, uint32_t(n) * sizeof(T), api);
    sim::ub_read(ins, t.addr_, uint32_t(n) * sizeof(T));
}
template <typename T>
inline void out(const LocalTensor<T>& t, int32_t n, const char* api, uint32_t align = 32) {
    t.ub_only(api);
    sim::check_align(t.addr_, align, api, "destination");
    t.need(uint32_t(n), api);
}
template <typename T>
inline void done(const sim::Ins& ins, const LocalTensor<T>& t, int32_t n) {
    sim::ub_write(ins, t.addr_, uint32_t(n) * sizeof(T));
    sim::mark(t.addr_, uint32_t(n) * sizeof(T));
}
template <typename T, typename F>
inline void binary(const LocalTensor<T>& d, const LocalTensor<T>& a, const LocalTensor<T>& b, int32_t n, const char* api,
                   const sim::Loc& loc, F f) {
    sim::Ins ins = sim::issue(sim::P_V, api, loc);
    out(d, n, api); in(ins, a, n, api); in(ins, b, n, api);
    sim::count_vec(uint64_t(n), sizeof(T));
    std::vector<float> r(n);
    for (int32_t i = 0; i < n; i++) r[i] = f(ld(a, i), ld(b, i));
    for (int32_t i = 0; i < n; i++) st(d, i, r[i]);
    done(ins, d, n);
}
template <typename T, typename F>
inline void unary(const LocalTensor<T>& d, const LocalTensor<T>& a, int32_t n, const char* api, const sim::Loc& loc, F f) {
    sim::Ins ins = sim::issue(sim::P_V, api, loc);
    out(d, n, api); in(ins, a, n, api);
    sim::count_vec(uint64_t(n), sizeof(T));
    for (int32_t i = 0; i < n; i++) st(d, i, f(ld(a, i)));
    done(ins, d, n);
}
}  // namespace detail

template <typename T>
inline void Add(const LocalTensor<T>& d, const LocalTensor<T>& a, const LocalTensor<T>& b, const int32_t& n, sim::Loc loc = {}) {
    detail::binary(d, a, b, n, "Add", loc, [](float x, float y) { return x + y; });
}
template <typename T>
inline void Sub(const LocalTensor<T>& d, const LocalTensor<T>& a, const LocalTensor<T>& b, const int32_t& n, sim::Loc loc = {}) {
    detail::binary(d, a, b, n, "Sub", loc, [](float x, float y) { return x - y; });
}
template <typename T>
inline void Mul(const LocalTensor<T>& d, const LocalTensor<T>& a, const LocalTensor<T>& b, const int32_t& n, sim::Loc loc = {}) {
    detail::binary(d, a, b, n, "Mul", loc, [](float x, float y) { return x * y; });
}
template <typename T>
inline void Div(const LocalTensor<T>& d, const LocalTensor<T>& a, const LocalTensor<T>& b, const int32_t& n, sim::Loc loc = {}) {
    detail::binary(d, a, b, n, "Div", loc, [](float x, float y) { return x / y; });
}
template <typename T>
inline void Max(const LocalTensor<T>& d, const LocalTensor<T>& a, const LocalTensor<T>& b, const int32_t& n, sim::Loc loc = {}) {
    detail::binary(d, a, b, n, "Max", loc, [](float x, float y) { return x > y ? x : y; });
}
template <typename T, typename U>
inline void Adds(const LocalTensor<T>& d, const LocalTensor<T>& a, const U& s, const int32_t& n, sim::Loc loc = {}) {
    float sv = float(s);
    detail::unary(d, a, n, "Adds", loc, [sv](float x) { return x + sv; });
}
template <typename T, typename U>
inline void Muls(const LocalTensor<T>& d, const LocalTensor<T>& a, const U& s, const int32_t& n, sim::Loc loc = {}) {
    float sv = float(s);
    detail::unary(d, a, n, "Muls", loc, [sv](float x) { return x * sv; });
}
template <typename T>
inline void Exp(const LocalTensor<T>& d, const LocalTensor<T>& a, const int32_t& n, sim::Loc loc = {}) {
    detail::unary(d, a, n, "Exp", loc, [](float x) { return std::exp(x); });
}
template <typename T>
inline void Ln(const LocalTensor<T>& d, const LocalTensor<T>& a, const int32_t& n, sim::Loc loc = {}) {
    detail::unary(d, a, n, "Ln", loc, [](float x) { return std::log(x); });
}
template <typename T, typename U>
inline void Duplicate(const LocalTensor<T>& d, const U& s, const int32_t& n, sim::Loc loc = {}) {
    sim::Ins ins = sim::issue(sim::P_V, "Duplicate", loc);
    detail::out(d, n, "Duplicate");
    sim::count_vec(uint64_t(n), sizeof(T));
    for (int32_t i = 0; i < n; i++) d.put(uint32_t(i), T(s));
    detail::done(ins, d, n);
}
// Axpy: dst[i] = src[i] * scalar + dst[i] (dst is read too); float/float and half/half used here.
template <typename T, typename U>
inline void Axpy(const LocalTensor<T>& d, const LocalTensor<U>& a, const U& s, const int32_t& n, sim::Loc loc = {}) {
    sim::Ins ins = sim::issue(sim::P_V, "Axpy", loc);
    detail::out(d, n, "Axpy");
    detail::in(ins, a, n, "Axpy");
    detail::in(ins, d, n, "Axpy");
    sim::count_vec(uint64_t(n), sizeof(T));
    float sv = float(s);
    for (int32_t i = 0; i < n; i++) detail::st(d, i, detail::ld(a, i) * sv + detail::ld(d, i));
    detail::done(ins, d, n);
}

// Repeat forms (mask = number of leading elements per repeat, continuous mode):
// dst/src advance by repStride 32-byte blocks per repeat, blocks inside a repeat by blkStride.
// Limits: repeatTimes <= 255, mask 1 .. 256 / sizeof(T) (sim_limits.h).
struct UnaryRepeatParams {
    uint16_t dstBlkStride = 1, srcBlkStride = 1;
    uint8_t dstRepStride = 8, srcRepStride = 8;
    UnaryRepeatParams() = default;
    UnaryRepeatParams(uint16_t db, uint16_t sb, uint8_t dr, uint8_t sr)
        : dstBlkStride(db), srcBlkStride(sb), dstRepStride(dr), srcRepStride(sr) {}
};
namespace detail {
template <typename T, typename F>
inline void unary_rep(const LocalTensor<T>& d, const LocalTensor<T>& a, uint64_t mask, int32_t repeatTimes,
                      const UnaryRepeatParams& p, const char* api, const sim::Loc& loc, F f) {
    const uint64_t perRep = sim::limits::kRepeatBytes / sizeof(T);
    sim::check_range("vec-param", api, "repeatTimes", uint64_t(repeatTimes < 0 ? ~0ull : uint64_t(repeatTimes)), 0,
                     sim::limits::kMaxRepeatTimes, "MAX_REPEAT_TIMES, impl/utils/kernel_utils_constants.h");
    sim::check_range("vec-param", api, "mask (continuous)", mask, 1, perRep, "ONE_REP_BYTE_SIZE / sizeof(T)");
    d.ub_only(api); a.ub_only(api);
    sim::check_align(d.addr_, 32, api, "destination");
    sim::check_align(a.addr_, 32, api, "source");
    sim::Ins ins = sim::issue(sim::P_V, api, loc);
    const uint32_t perBlk = 32 / sizeof(T);
    for (int32_t r = 0; r < repeatTimes; r++) {
        for (uint64_t e = 0; e < mask; e++) {
            const uint64_t blk = e / perBlk, off = e % perBlk;
            const uint64_t si = (uint64_t(r) * p.srcRepStride * perBlk) + blk * p.srcBlkStride * perBlk + off;
            const uint64_t di = (uint64_t(r) * p.dstRepStride * perBlk) + blk * p.dstBlkStride * perBlk + off;
            a.need(si + 1, api);
            d.need(di + 1, api);
            sim::check_written(a.addr_ + uint32_t(si * sizeof(T)), sizeof(T), api);
            sim::ub_read(ins, a.addr_ + uint32_t(si * sizeof(T)), sizeof(T));
            detail::st(d, uint32_t(di), f(detail::ld(a, uint32_t(si))));
            sim::ub_write(ins, d.addr_ + uint32_t(di * sizeof(T)), sizeof(T));
            sim::mark(d.addr_ + uint32_t(di * sizeof(T)), sizeof(T));
        }
    }
    sim::Stats& st = sim::core().st;
    st.vecElems += uint64_t(repeatTimes) * mask;
    st.vecRepeats += uint64_t(repeatTimes);
}
}  // namespace detail
template <typename T, typename U>
inline void Adds(const LocalTensor<T>& d, const LocalTensor<T>& a, const U& s, uint64_t mask, int32_t repeatTimes,
                 const UnaryRepeatParams& p, sim::Loc loc = {}) {
    float sv = float(s);
    detail::unary_rep(d, a, mask, repeatTimes, p, "Adds(repeat)", loc, [sv](float x) { return x + sv; });
}
template <typename T, typename U>
inline void Muls(const LocalTensor<T>& d, const LocalTensor<T>& a, const U& s, uint64_t mask, int32_t repeatTimes,
                 const UnaryRepeatParams& p, sim::Loc loc = {}) {
    float sv = float(s);
    detail::unary_rep(d, a, mask, repeatTimes, p, "Muls(repeat)", loc, [sv](float x) { return x * sv; });
}

// Binary repeat forms (BinaryRepeatParams: dst/src0/src1 block strides within a repeat, repeat
// strides between repeats, in 32-byte blocks; mask = leading elements per repeat, continuous mode):
// src1BlkStride = src1RepStride = 0 reads one 32-byte block (e.g. a row's value broadcast by Brcb)
// against every block of src0. Limits as the unary forms.
struct BinaryRepeatParams {
    uint8_t dstBlkStride = 1, src0BlkStride = 1, src1BlkStride = 1;
    uint8_t dstRepStride = 8, src0RepStride = 8, src1RepStride = 8;
    BinaryRepeatParams() = default;
    BinaryRepeatParams(uint8_t db, uint8_t s0b, uint8_t s1b, uint8_t dr, uint8_t s0r, uint8_t s1r)
        : dstBlkStride(db), src0BlkStride(s0b), src1BlkStride(s1b), dstRepStride(dr), src0RepStride(s0r),
          src1RepStride(s1r) {}
};
namespace detail {
template <typename T, typename F>
inline void binary_rep(const LocalTensor<T>& d, const LocalTensor<T>& a, const LocalTensor<T>& b, uint64_t mask,
                       int32_t repeatTimes, const BinaryRepeatParams& p, const char* api, const sim::Loc& loc, F f) {
    const uint64_t perRep = sim::limits::kRepeatBytes / sizeof(T);
    sim::check_range("vec-param", api, "repeatTimes", uint64_t(repeatTimes < 0 ? ~0ull : uint64_t(repeatTimes)), 0,
                     sim::limits::kMaxRepeatTimes, "MAX_REPEAT_TIMES, impl/utils/kernel_utils_constants.h");
    sim::check_range("vec-param", api, "mask (continuous)", mask, 1, perRep, "ONE_REP_BYTE_SIZE / sizeof(T)");
    d.ub_only(api); a.ub_only(api); b.ub_only(api);
    sim::check_align(d.addr_, 32, api, "destination");
    sim::check_align(a.addr_, 32, api, "source 0");
    sim::check_align(b.addr_, 32, api, "source 1");
    sim::Ins ins = sim::issue(sim::P_V, api, loc);
    const uint32_t perBlk = 32 / sizeof(T);
    std::vector<std::pair<uint64_t, float>> res;  // all reads before any write, as one instruction
    for (int32_t r = 0; r < repeatTimes; r++) {
        for (uint64_t e = 0; e < mask; e++) {
            const uint64_t blk = e / perBlk, off = e % perBlk;
            const uint64_t ai = uint64_t(r) * p.src0RepStride * perBlk + blk * p.src0BlkStride * perBlk + off;
            const uint64_t bi = uint64_t(r) * p.src1RepStride * perBlk + blk * p.src1BlkStride * perBlk + off;
            const uint64_t di = uint64_t(r) * p.dstRepStride * perBlk + blk * p.dstBlkStride * perBlk + off;
            a.need(ai + 1, api);
            b.need(bi + 1, api);
            d.need(di + 1, api);
            for (const auto& x : {std::make_pair(&a, ai), std::make_pair(&b, bi)}) {
                sim::check_written(x.first->addr_ + uint32_t(x.second * sizeof(T)), sizeof(T), api);
                sim::ub_read(ins, x.first->addr_ + uint32_t(x.second * sizeof(T)), sizeof(T));
            }
            res.emplace_back(di, f(detail::ld(a, uint32_t(ai)), detail::ld(b, uint32_t(bi))));
        }
    }
    for (const auto& x : res) {
        detail::st(d, uint32_t(x.first), x.second);
        sim::ub_write(ins, d.addr_ + uint32_t(x.first * sizeof(T)), sizeof(T));
        sim::mark(d.addr_ + uint32_t(x.first * sizeof(T)), sizeof(T));
    }
    sim::Stats& st = sim::core().st;
    st.vecElems += uint64_t(repeatTimes) * mask;
    st.vecRepeats += uint64_t(repeatTimes);
}
}  // namespace detail
template <typename T>
inline void Sub(const LocalTensor<T>& d, const LocalTensor<T>& a, const LocalTensor<T>& b, uint64_t mask,
                int32_t repeatTimes, const BinaryRepeatParams& p, sim::Loc loc = {}) {
    detail::binary_rep(d, a, b, mask, repeatTimes, p, "Sub(repeat)", loc, [](float x, float y) { return x - y; });
}
template <typename T>
inline void Mul(const LocalTensor<T>& d, const LocalTensor<T>& a, const LocalTensor<T>& b, uint64_t mask,
                int32_t repeatTimes, const BinaryRepeatParams& p, sim::Loc loc = {}) {
    detail::binary_rep(d, a, b, mask, repeatTimes, p, "Mul(repeat)", loc, [](float x, float y) { return x * y; });
}

// Brcb (kernel_operator_vec_brcb_intf.h): per repeat, 8 elements of src, each broadcast into one
// 32-byte block of dst; block i of repeat r at (r * dstRepStride + i * dstBlkStride) blocks. 16- and
// 32-bit types; src 32-byte aligned (8 elements a repeat read), repeatTimes <= 255.
struct BrcbRepeatParams {
    uint16_t dstBlkStride = 1, dstRepStride = 8;
    BrcbRepeatParams() = default;
    BrcbRepeatParams(uint16_t db, uint16_t dr) : dstBlkStride(db), dstRepStride(dr) {}
};
template <typename T>
inline void Brcb(const LocalTensor<T>& d, const LocalTensor<T>& a, const uint8_t repeatTimes, const BrcbRepeatParams& p,
                 sim::Loc loc = {}) {
    const char* api = "Brcb";
    static_assert(sizeof(T) == 2 || sizeof(T) == 4, "Brcb: b16 / b32 data");
    d.ub_only(api); a.ub_only(api);
    sim::check_align(d.addr_, 32, api, "destination");
    sim::check_align(a.addr_, 32, api, "source");
    sim::Ins ins = sim::issue(sim::P_V, api, loc);
    const uint32_t perBlk = 32 / sizeof(T);
    for (uint32_t r = 0; r < repeatTimes; r++)
        for (uint32_t i = 0; i < 8; i++) {
            const uint64_t si = uint64_t(r) * 8 + i;
            a.need(si + 1, api);
            sim::check_written(a.addr_ + uint32_t(si * sizeof(T)), sizeof(T), api);
            sim::ub_read(ins, a.addr_ + uint32_t(si * sizeof(T)), sizeof(T));
            const T v = a.at(si);
            const uint64_t d0 = (uint64_t(r) * p.dstRepStride + uint64_t(i) * p.dstBlkStride) * perBlk;
            d.need(d0 + perBlk, api);
            for (uint32_t e = 0; e < perBlk; e++) d.put(d0 + e, v);
            sim::ub_write(ins, d.addr_ + uint32_t(d0 * sizeof(T)), 32);
            sim::mark(d.addr_ + uint32_t(d0 * sizeof(T)), 32);
        }
    sim::Stats& st = sim::core().st;
    st.vecElems += uint64_t(repeatTimes) * 8 * perBlk;
    st.vecRepeats += repeatTimes;
}

// Cast: the (source, destination, round mode) triples of sim_limits.h (dav-c220 table) are
// accepted, anything else is a [cast] error. Emulated conversions: float <-> half/bfloat16, int8 <->
// half, int32 -> float and float -> float (rounding to integral values); CAST_NONE/CAST_RINT round
// to nearest even, other modes are rejected as not emulated ([bounds]) rather than computed
// wrongly. half -> int8 saturates to [-128, 127] (ASSUMPTION: the vconv_f162s8 saturation is not
// spelled out) and gives 0 for NaN (ASSUMPTION: unspecified; the kernels never rely on it).
namespace detail {
template <typename T> constexpr sim::limits::CastType cast_type() {
    return std::is_same<T, float>::value ? sim::limits::CT_F32 : std::is_same<T, half>::value ? sim::limits::CT_F16
         : std::is_same<T, bfloat16_t>::value ? sim::limits::CT_BF16 : std::is_same<T, int8_t>::value ? sim::limits::CT_S8
         : std::is_same<T, uint8_t>::value ? sim::limits::CT_U8 : std::is_same<T, int16_t>::value ? sim::limits::CT_S16
         : std::is_same<T, int32_t>::value ? sim::limits::CT_S32 : std::is_same<T, int64_t>::value ? sim::limits::CT_S64
         : sim::limits::CT_OTHER;
}
template <typename T> const char* type_name() {
    return std::is_same<T, float>::value ? "float" : std::is_same<T, half>::value ? "half"
         : std::is_same<T, bfloat16_t>::value ? "bfloat16_t" : std::is_same<T, int8_t>::value ? "int8_t" : "int";
}
inline const char* mode_name(RoundMode m) {
    static const char* n[] = {"CAST_NONE", "CAST_RINT", "CAST_FLOOR", "CAST_CEIL", "CAST_ROUND", "CAST_TRUNC", "CAST_ODD"};
    return n[int(m)];
}
template <typename D, typename S>
struct CastOk : std::false_type {};
template <> struct CastOk<float, half> : std::true_type {};
template <> struct CastOk<float, bfloat16_t> : std::true_type {};
template <> struct CastOk<half, int8_t> : std::true_type {};
template <> struct CastOk<half, float> : std::true_type {};
template <> struct CastOk<bfloat16_t, float> : std::true_type {};
template <> struct CastOk<float, int32_t> : std::true_type {};
template <> struct CastOk<float, float> : std::true_type {};
template <> struct CastOk<int8_t, half> : std::true_type {};
template <typename D, typename S>
inline D cast_one(S x) {
    if constexpr (std::is_same<D, float>::value && std::is_same<S, float>::value) {
        return std::nearbyint(x);  // to integral, ties to even (the default rounding mode)
    } else if constexpr (std::is_same<D, int8_t>::value) {
        const float f = float(x);
        if (f != f) return D(0);
        const float r = std::nearbyint(f);
        return D(r < -128.0f ? -128.0f : (r > 127.0f ? 127.0f : r));
    } else {
        return D(float(x));
    }
}
}  // namespace detail
template <typename D, typename S>
inline void Cast(const LocalTensor<D>& d, const LocalTensor<S>& s, const RoundMode& mode, const uint32_t n, sim::Loc loc = {}) {
    static_assert(detail::CastOk<D, S>::value, "twin: Cast pair not emulated");
    const uint32_t modes = sim::limits::cast_modes(detail::cast_type<S>(), detail::cast_type<D>());
    if (!(modes & (1u << int(mode))))
        sim::fail("cast", std::string("Cast ") + detail::type_name<S>() + " -> " + detail::type_name<D>() + " with " +
                              detail::mode_name(mode) +
                              " is not supported on dav-c220 (CastIntrinsicsImpl, dav_c220/kernel_operator_vec_vconv_impl.h)");
    if (mode != RoundMode::CAST_RINT && mode != RoundMode::CAST_NONE)
        sim::fail("bounds", "twin: only RINT/NONE rounding is emulated");
    sim::Ins ins = sim::issue(sim::P_V, "Cast", loc);
    detail::out(d, int32_t(n), "Cast");
    detail::in(ins, s, int32_t(n), "Cast");
    sim::count_vec(n, sizeof(D) > sizeof(S) ? sizeof(D) : sizeof(S));
    std::vector<D> r(n);
    for (uint32_t i = 0; i < n; i++) r[i] = detail::cast_one<D>(s.at(i));
    std::memcpy(d.raw(), r.data(), n * sizeof(D));
    detail::done(ins, d, int32_t(n));
}

// ReduceSum (first `count` elements): the A2 "方式二" order: a binary tree inside each 256-byte
// repeat, repeats summed in order. dst[0] = sum. dst: element-aligned; src, work: 32-byte aligned;
// work needs at least one element per repeat, rounded up to a 32-byte block.
template <typename T>
inline void ReduceSum(const LocalTensor<T>& d, const LocalTensor<T>& s, const LocalTensor<T>& work, const int32_t count,
                      sim::Loc loc = {}) {
    const int32_t per = 256 / int32_t(sizeof(T)), blk = 32 / int32_t(sizeof(T));
    const int32_t reps = (count + per - 1) / per;
    sim::Ins ins = sim::issue(sim::P_V, "ReduceSum", loc);
    detail::out(d, 1, "ReduceSum", sizeof(T));
    detail::out(work, (reps + blk - 1) / blk * blk, "ReduceSum");
    detail::in(ins, s, count, "ReduceSum");
    sim::count_vec(uint64_t(count), sizeof(T));
    sim::core().st.vecRepeats += 1;  // the second pass over the per-repeat partials (assumption)
    float acc = 0.f;
    std::vector<float> lane(per);
    for (int32_t r = 0; r < reps; r++) {
        for (int32_t i = 0; i < per; i++) lane[i] = (r * per + i < count) ? detail::ld(s, r * per + i) : 0.f;
        for (int32_t w = per; w > 1; w /= 2)
            for (int32_t i = 0; i < w / 2; i++) lane[i] = float(T(lane[2 * i] + lane[2 * i + 1]));
        acc = (r == 0) ? lane[0] : float(T(acc + lane[0]));
    }
    detail::st(d, 0, acc);
    detail::done(ins, work, reps);
    detail::done(ins, d, 1);
}
// ReduceMax (first `count` elements), calIndex = false: dst[0] = max. dst: 8-byte (float) /
// 4-byte (half) aligned (value and index slots); work: two elements per repeat, 32-byte rounded.
template <typename T>
inline void ReduceMax(const LocalTensor<T>& d, const LocalTensor<T>& s, const LocalTensor<T>& work, const int32_t count,
                      bool calIndex = false, sim::Loc loc = {}) {
    const int32_t per = 256 / int32_t(sizeof(T)), blk = 32 / int32_t(sizeof(T));
    const int32_t reps = (count + per - 1) / per;
    sim::Ins ins = sim::issue(sim::P_V, "ReduceMax", loc);
    detail::out(d, 2, "ReduceMax", 2 * sizeof(T));
    detail::out(work, (2 * reps + blk - 1) / blk * blk, "ReduceMax");
    detail::in(ins, s, count, "ReduceMax");
    if (calIndex) sim::fail("bounds", "twin: ReduceMax calIndex not emulated");
    sim::count_vec(uint64_t(count), sizeof(T));
    sim::core().st.vecRepeats += 1;
    float m = detail::ld(s, 0);
    for (int32_t i = 1; i < count; i++) m = std::fmax(m, detail::ld(s, i));
    detail::st(d, 0, m);
    detail::done(ins, d, 1);
    detail::done(ins, work, 2 * reps);
}


// Reduction repeat forms, "mask continuous" prototypes (kernel_operator_vec_reduce_intf.h), one
// instruction each on pipe V (vcadd / vcmax / vcbadd / vcbmax: no wait for their own result, unlike
// the count-mode ReduceSum / ReduceMax above). Repeat r reads the first `mask` elements of 8 data
// blocks, block b at (r * srcRepStride + b * srcBlkStride) 32-byte blocks from src.
//   WholeReduceSum: one sum per repeat, at dst + r * dstRepStride elements (the unit is one repeat's
//     result: sizeof(T)); dst element-aligned (2 B half, 4 B float).
//   WholeReduceMax: one maximum per repeat; ORDER_VALUE_INDEX writes (value, index) and
//     ORDER_INDEX_VALUE (index, value), a unit of 2 elements; ORDER_ONLY_VALUE the value, a unit of
//     one element. The index is the lane (0 .. mask - 1) inside the repeat, its integer bits stored in
//     the element slot. dst 4-byte (half) / 8-byte (float) aligned. ORDER_ONLY_INDEX is not emulated.
//   BlockReduceSum / BlockReduceMax: one result per data block, the 8 results of repeat r at dst +
//     r * dstRepStride units of 8 elements; dst 16-byte (half) / 32-byte (float) aligned. A block with
//     no lane inside the mask is not written.
// src 32-byte aligned; limits (sim_limits.h): repeatTimes <= 255, mask 1 .. 256 / sizeof(T), source
// repeat stride <= 255 blocks (an assumption), the other strides <= 65535.
// ASSUMPTIONS (the reduction order and NaN handling of the units are not documented): a sum adds
// lanes pairwise, a binary tree over the repeat's 64 (float) lanes or a block's 8, masked lanes as 0,
// rounding to T at each step (ReduceSum's A2 order above); a maximum skips NaN lanes (std::fmax, as
// ReduceMax above); index ties go to the lowest lane.
enum class ReduceOrder : uint8_t { ORDER_VALUE_INDEX = 0, ORDER_INDEX_VALUE, ORDER_ONLY_VALUE, ORDER_ONLY_INDEX };
namespace detail {
enum class RedKind { WholeSum, WholeMax, BlockSum, BlockMax };
template <typename T>
inline void reduce_rep(const LocalTensor<T>& d, const LocalTensor<T>& s, int32_t mask, int32_t repeatTimes,
                       int32_t dstRepStride, int32_t srcBlkStride, int32_t srcRepStride, RedKind kind,
                       ReduceOrder order, const char* api, const sim::Loc& loc) {
    static_assert(std::is_same<T, float>::value || std::is_same<T, half>::value, "reductions: half / float");
    const int32_t perRep = int32_t(sim::limits::kRepeatBytes / sizeof(T)), perBlk = 32 / int32_t(sizeof(T));
    auto u = [](int32_t v) { return v < 0 ? ~0ull : uint64_t(v); };
    const char* kRep = "ASCENDC_CHECK_VALUE_RANGE, inner_kernel_operator_vec_reduce_intf.cppm";
    sim::check_range("vec-param", api, "repeatTimes", u(repeatTimes), 0, sim::limits::kMaxRepeatTimes, kRep);
    sim::check_range("vec-param", api, "mask (continuous)", u(mask), 1, uint64_t(perRep), "ONE_REP_BYTE_SIZE / sizeof(T)");
    sim::check_range("vec-param", api, "srcRepStride", u(srcRepStride), 0, sim::limits::kMaxReduceSrcRepStride,
                     "ASSUMPTION: the 8-bit repeat stride of the other repeat forms (sim_limits.h)");
    sim::check_range("vec-param", api, "srcBlkStride", u(srcBlkStride), 0, sim::limits::kMaxReduceStride16,
                     "uint16_t, kernel_check_vec.h");
    sim::check_range("vec-param", api, "dstRepStride", u(dstRepStride), 0, sim::limits::kMaxReduceStride16,
                     "uint16_t, kernel_check_vec.h");
    if (kind == RedKind::WholeMax && order == ReduceOrder::ORDER_ONLY_INDEX)
        sim::fail("bounds", "twin: WholeReduceMax ORDER_ONLY_INDEX not emulated");
    const bool whole = kind == RedKind::WholeSum || kind == RedKind::WholeMax;
    const bool isMax = kind == RedKind::WholeMax || kind == RedKind::BlockMax;
    const bool pair = kind == RedKind::WholeMax && order != ReduceOrder::ORDER_ONLY_VALUE;
    const uint32_t dAlign = kind == RedKind::WholeSum ? sizeof(T)
                          : kind == RedKind::WholeMax ? 2 * sizeof(T) : 8 * sizeof(T);
    d.ub_only(api); s.ub_only(api);
    sim::check_align(d.addr_, dAlign, api, "destination");
    sim::check_align(s.addr_, 32, api, "source");
    sim::Ins ins = sim::issue(sim::P_V, api, loc);
    const uint64_t unit = whole ? (pair ? 2 : 1) : 8;  // dst elements per dstRepStride step
    std::vector<std::pair<uint64_t, T>> res;              // all reads before any write, as one instruction
    auto sum_tree = [](std::vector<float> v) {           // pairwise, rounding to T
        for (size_t w = v.size(); w > 1; w /= 2)
            for (size_t i = 0; i < w / 2; i++) v[i] = float(T(v[2 * i] + v[2 * i + 1]));
        return v[0];
    };
    for (int32_t r = 0; r < repeatTimes; r++) {
        std::vector<float> lane(perRep, 0.0f);
        std::vector<bool> on(perRep, false);
        for (int32_t e = 0; e < mask; e++) {
            const uint64_t si = (uint64_t(r) * uint64_t(srcRepStride) + uint64_t(e / perBlk) * uint64_t(srcBlkStride)) *
                                    uint64_t(perBlk) + uint64_t(e % perBlk);
            s.need(si + 1, api);
            sim::check_written(s.addr_ + uint32_t(si * sizeof(T)), sizeof(T), api);
            sim::ub_read(ins, s.addr_ + uint32_t(si * sizeof(T)), sizeof(T));
            lane[e] = detail::ld(s, uint32_t(si));
            on[e] = true;
        }
        const uint64_t d0 = uint64_t(r) * uint64_t(dstRepStride) * unit;
        if (whole) {
            if (!isMax) {
                res.emplace_back(d0, T(sum_tree(lane)));
                continue;
            }
            int32_t at = 0;
            float m = lane[0];
            for (int32_t e = 1; e < mask; e++)
                if (lane[e] > m || (m != m && lane[e] == lane[e])) m = lane[e], at = e;  // fmax; ties: lowest lane
            if (!pair) {
                res.emplace_back(d0, T(m));
                continue;
            }
            T idx;
            std::memset(&idx, 0, sizeof(T));
            const uint32_t bits = uint32_t(at);
            std::memcpy(&idx, &bits, sizeof(T) < 4 ? sizeof(T) : 4);  // little-endian low bytes
            const bool vi = order == ReduceOrder::ORDER_VALUE_INDEX;
            res.emplace_back(d0 + (vi ? 0 : 1), T(m));
            res.emplace_back(d0 + (vi ? 1 : 0), idx);
            continue;
        }
        for (int32_t b = 0; b < perRep / perBlk; b++) {
            if (!on[b * perBlk]) continue;  // no lane of this block inside the mask
            std::vector<float> blk(lane.begin() + b * perBlk, lane.begin() + (b + 1) * perBlk);
            float v;
            if (isMax) {
                v = blk[0];
                for (int32_t e = 1; e < perBlk && on[b * perBlk + e]; e++) v = std::fmax(v, blk[e]);
            } else {
                v = sum_tree(blk);
            }
            res.emplace_back(d0 + uint64_t(b), T(v));
        }
    }
    for (const auto& x : res) {
        d.need(x.first + 1, api);
        d.put(x.first, x.second);
        sim::ub_write(ins, d.addr_ + uint32_t(x.first * sizeof(T)), sizeof(T));
        sim::mark(d.addr_ + uint32_t(x.first * sizeof(T)), sizeof(T));
    }
    sim::Stats& st = sim::core().st;
    st.vecElems += uint64_t(repeatTimes) * uint64_t(mask);
    st.vecRepeats += uint64_t(repeatTimes);
}
}  // namespace detail
template <typename T, bool isSetMask = true>
inline void WholeReduceSum(const LocalTensor<T>& d, const LocalTensor<T>& s, const int32_t mask, const int32_t repeatTimes,
                           const int32_t dstRepStride, const int32_t srcBlkStride, const int32_t srcRepStride,
                           sim::Loc loc = {}) {
    static_assert(isSetMask, "twin: only the mask set by the call is emulated");
    detail::reduce_rep(d, s, mask, repeatTimes, dstRepStride, srcBlkStride, srcRepStride, detail::RedKind::WholeSum,
                       ReduceOrder::ORDER_ONLY_VALUE, "WholeReduceSum", loc);
}
template <typename T, bool isSetMask = true>
inline void WholeReduceMax(const LocalTensor<T>& d, const LocalTensor<T>& s, const int32_t mask, const int32_t repeatTimes,
                           const int32_t dstRepStride, const int32_t srcBlkStride, const int32_t srcRepStride,
                           ReduceOrder order = ReduceOrder::ORDER_VALUE_INDEX, sim::Loc loc = {}) {
    static_assert(isSetMask, "twin: only the mask set by the call is emulated");
    detail::reduce_rep(d, s, mask, repeatTimes, dstRepStride, srcBlkStride, srcRepStride, detail::RedKind::WholeMax,
                       order, "WholeReduceMax", loc);
}
template <typename T, bool isSetMask = true>
inline void BlockReduceSum(const LocalTensor<T>& d, const LocalTensor<T>& s, const int32_t repeatTimes, const int32_t mask,
                           const int32_t dstRepStride, const int32_t srcBlkStride, const int32_t srcRepStride,
                           sim::Loc loc = {}) {
    static_assert(isSetMask, "twin: only the mask set by the call is emulated");
    detail::reduce_rep(d, s, mask, repeatTimes, dstRepStride, srcBlkStride, srcRepStride, detail::RedKind::BlockSum,
                       ReduceOrder::ORDER_ONLY_VALUE, "BlockReduceSum", loc);
}
template <typename T, bool isSetMask = true>
inline void BlockReduceMax(const LocalTensor<T>& d, const LocalTensor<T>& s, const int32_t repeatTimes, const int32_t mask,
                           const int32_t dstRepStride, const int32_t srcBlkStride, const int32_t srcRepStride,
                           sim::Loc loc = {}) {
    static_assert(isSetMask, "twin: only the mask set by the call is emulated");
    detail::reduce_rep(d, s, mask, repeatTimes, dstRepStride, srcBlkStride, srcRepStride, detail::RedKind::BlockMax,
                       ReduceOrder::ORDER_ONLY_VALUE, "BlockReduceMax", loc);
}

}  // namespace AscendC

// The cube unit (AIC): sim_cube.h.
#include "sim_cube.h"

// Global, as in CANN's kernel_common.h.
inline AscendC::TPipe* GetTPipePtr() { return AscendC::current_pipe(); }

#endif  // SPLITKV_SIM_KERNEL_OPERATOR_H
