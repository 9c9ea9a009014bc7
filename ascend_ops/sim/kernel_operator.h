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
//   [alignment]     UB operand start addresses 32-byte aligned (ReduceSum/ReduceMax dst: element
//                   alignment); DataCopy lengths multiples of 32 bytes
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
// Not modelled: pipeline timing (the counters feed a paper estimate, scripts/npu_estimate.py);
// bank conflicts; the exact NPU Exp/Ln precision (libm is used); the cube's exact summation
// order (see Mmad); TQue on cube positions; int8 / float Mmad; Fixpipe quantisation and NZ output.
//
// References (semantics encoded below):
//   DataCopy          .../canncommercial/800/apiref/ascendcopapi/atlasascendc_api_07_0102.html
//   DataCopyPad       .../canncommercial/800/apiref/ascendcopapi/atlasascendc_api_07_0265.html
//   AllocTensor       .../CANNCommunityEdition/81RC1alpha002/apiref/ascendcopapi/atlasascendc_api_07_0138.html
//   ReduceSum         .../CANNCommunityEdition/81RC1alpha002/apiref/ascendcopapi/atlasascendc_api_07_0078.html
//   ReduceMax         .../canncommercial/850/API/ascendcopapi/atlasascendc_api_07_0075.html
//   Axpy              .../canncommercial/800/apiref/ascendcopapi/atlasascendc_api_07_0063.html
//   Cast              .../canncommercial/900/API/ascendcopapi/atlasascendc_api_07_0073.html
//   (prefix https://www.hiascend.com/document/detail/zh/). The element-wise APIs (Add, Sub, Mul,
//   Div, Max, Adds, Muls, Exp, Ln, Duplicate) are the "calCount" (first n elements) prototypes of
//   the same reference; their common rule is a 32-byte aligned start address of every operand.
#ifndef SPLITKV_SIM_KERNEL_OPERATOR_H
#define SPLITKV_SIM_KERNEL_OPERATOR_H

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

// ---------------------------------------------------------------------------------------------
// The cube unit (AIC): GM -> L1 with ND->NZ, L1 -> L0A/L0B (LoadData 2D), Mmad into L0C, Fixpipe
// L0C -> GM. Pipes: MTE2 (GM -> L1), MTE1 (L1 -> L0A/L0B), M (Mmad), FIX (Fixpipe). Fractal
// layouts from the Mmad page of the Ascend C API reference (Atlas A2 section, asc-devkit
// docs/api/context/Mmad.md): a 16 x 16 fractal of 16-bit data is 512 bytes; A in L0A is "ZZ"
// (row-major inside a fractal, fractals row-major), B in L0B "ZN" (column-major inside, fractals
// row-major), C in L0C "NZ" (row-major inside, fractals column-major: column block j starts at
// j * ceil(m/16) fractals). L1 after ND2NZ is NZ with the strides of Nd2NzParams.
struct Nd2NzParams {
    uint16_t ndNum = 0, nValue = 0, dValue = 0, srcNdMatrixStride = 0, srcDValue = 0, dstNzC0Stride = 0,
             dstNzNStride = 0, dstNzMatrixStride = 0;
    Nd2NzParams() = default;
    Nd2NzParams(uint16_t nd, uint16_t n, uint16_t d, uint16_t sm, uint16_t sd, uint16_t c0, uint16_t ns, uint16_t dm)
        : ndNum(nd), nValue(n), dValue(d), srcNdMatrixStride(sm), srcDValue(sd), dstNzC0Stride(c0), dstNzNStride(ns),
          dstNzMatrixStride(dm) {}
};
struct LoadData2DParams {
    uint16_t startIndex = 0, dstGap = 0, srcStride = 0;
    bool ifTranspose = false;
    uint8_t repeatTimes = 0, sid = 0, addrMode = 0;
    LoadData2DParams() = default;
    LoadData2DParams(uint16_t st, uint8_t rep, uint16_t ss, uint8_t sid_, uint16_t gap, bool tr, uint8_t am)
        : startIndex(st), dstGap(gap), srcStride(ss), ifTranspose(tr), repeatTimes(rep), sid(sid_), addrMode(am) {}
};
struct MmadParams {
    uint16_t m = 0, n = 0, k = 0;
    bool isBias = false;  // deprecated: true = accumulate into C
    int32_t fmOffset = 0;
    bool enSsparse = false, enWinogradA = false, enWinogradB = false;
    uint8_t unitFlag = 0;
    bool kDirectionAlign = false;
    bool cmatrixSource = false;   // true: initial C from the bias table (not emulated)
    bool cmatrixInitVal = true;   // true: C starts at 0; false: C += A * B
    MmadParams() = default;
    MmadParams(uint16_t m_, uint16_t n_, uint16_t k_, uint8_t uf, bool src, bool init)
        : m(m_), n(n_), k(k_), unitFlag(uf), cmatrixSource(src), cmatrixInitVal(init) {}
};
enum class QuantMode_t : uint8_t { NoQuant = 0, F322F16, F322BF16, DEQF16, VDEQF16, QF322B8_PRE, VQF322B8_PRE, REQ8, VREQ8 };
enum class CO2Layout : uint8_t { NZ = 0, ROW_MAJOR, COLUMN_MAJOR };
struct FixpipeConfig { CO2Layout format; };
constexpr FixpipeConfig CFG_NZ = {CO2Layout::NZ};
constexpr FixpipeConfig CFG_ROW_MAJOR = {CO2Layout::ROW_MAJOR};
struct FixpipeParamsV220 {
    uint16_t nSize = 0, mSize = 0, srcStride = 0;
    uint32_t dstStride = 0;
    QuantMode_t quantPre = QuantMode_t::NoQuant;
    uint64_t deqScalar = 0;
    uint16_t ndNum = 1, srcNdStride = 0, dstNdStride = 0;
    bool reluEn = false;
    uint8_t unitFlag = 0;
    bool isChannelSplit = false;
    FixpipeParamsV220() = default;
    FixpipeParamsV220(uint16_t n, uint16_t m, uint16_t ss, uint32_t ds, bool relu)
        : nSize(n), mSize(m), srcStride(ss), dstStride(ds), reluEn(relu) {}
};

namespace detail {
constexpr uint32_t kFractalBytes = sim::limits::kFractalBytes;
template <typename T>
inline void need_mem(const LocalTensor<T>& t, uint8_t m, const char* api, const char* what) {
    if (t.mem_ != m)
        sim::fail("position", std::string(api) + ": " + what + " is in " + sim::mem_name(t.mem_) + ", expected " +
                                  sim::mem_name(m));
}
inline void need_bytes(uint32_t have, uint64_t want, const char* api, const char* what) {
    if (want > have)
        sim::fail("bounds", std::string(api) + ": " + what + " needs " + std::to_string(want) + " bytes, its buffer has " +
                                std::to_string(have) + " from the operand's start");
}
inline void check_mem_align(uint32_t addr, uint32_t align, uint8_t m, const char* api, const char* what, const char* src) {
    if (addr % align)
        sim::fail("alignment", std::string(api) + ": " + what + " " + sim::mem_name(m) + " address " + std::to_string(addr) +
                                   " is not " + std::to_string(align) + "-byte aligned (" + src + ")");
}
template <typename T> constexpr bool is16() { return std::is_same<T, half>::value || std::is_same<T, bfloat16_t>::value; }
}  // namespace detail

// Unit flags (Mmad / Fixpipe unitFlag; the UnitFlag feature page of the Ascend C reference, sim_limits.h
// kUnitFlagSource): one bit per 512-byte block of L0C. An Mmad with unitFlag 2 or 3 waits while a
// block's bit is 1 and, with 3, sets it when done; a Fixpipe with unitFlag 2 or 3 waits while the
// bit is 0 and, with 3, clears it when done. A matching pair is therefore the M -> FIX edge of that
// L0C, and the clearing Fixpipe the FIX -> M edge of the next unit-flag Mmad: no M_FIX / FIX_M flag
// is needed (ops-transformer ifa_service_matmul_full_quant.h:1167, 1186). The twin runs in program
// order, so it refuses what that order cannot express: an Mmad onto a set bit (the Fixpipe after
// it would read the earlier product) and a Fixpipe onto a clear bit (it waits forever).
namespace detail {
template <typename F>
inline void unit_blocks(uint32_t lo, uint32_t hi, F f) {
    sim::Space& sc = sim::space(sim::MEM_L0C);
    for (uint32_t b = lo / 512; b * 512 < hi && b < sc.unit.size(); b++) f(sc, b);
}
inline void unit_flag_mmad(uint8_t flag, uint32_t lo, uint32_t hi, const char* api, const sim::Loc& loc) {
    if (flag != 2 && flag != 3) return;
    unit_blocks(lo, hi, [&](sim::Space& sc, uint32_t b) {
        if (sc.unit[b])
            sim::fail("unit-flag", std::string(api) + " (" + sim::site_str(sim::intern(api, loc)) + ") with unitFlag " +
                                       std::to_string(flag) + " writes L0C block " + std::to_string(b) +
                                       " whose unit flag " + sim::site_str(sc.unitSite[b]) +
                                       " set and no Fixpipe with unitFlag 3 cleared: it waits for a Fixpipe that "
                                       "would read the earlier product");
        sim::wait_on(sim::P_M, sc.unitVc[b]);
    });
}
inline void unit_flag_set(const sim::Ins& in, uint32_t lo, uint32_t hi) {
    sim::Core& c = sim::core();
    sim::VC done = c.know[sim::P_M];
    done.join(c.know[sim::P_S]);
    done.c[sim::P_M] = in.seq;
    unit_blocks(lo, hi, [&](sim::Space& sc, uint32_t b) { sc.unit[b] = 1; sc.unitVc[b] = done; sc.unitSite[b] = in.site; });
}
inline void unit_flag_fixpipe(uint8_t flag, uint32_t lo, uint32_t hi, const char* api, const sim::Loc& loc) {
    if (flag != 2 && flag != 3) return;
    unit_blocks(lo, hi, [&](sim::Space& sc, uint32_t b) {
        if (!sc.unit[b])
            sim::fail("unit-flag", std::string(api) + " (" + sim::site_str(sim::intern(api, loc)) + ") with unitFlag " +
                                       std::to_string(flag) + " reads L0C block " + std::to_string(b) +
                                       " whose unit flag no Mmad with unitFlag 3 set: it waits forever (a hang)");
        sim::wait_on(sim::P_FIX, sc.unitVc[b]);
    });
}
inline void unit_flag_clear(const sim::Ins& in, uint32_t lo, uint32_t hi) {
    sim::Core& c = sim::core();
    sim::VC done = c.know[sim::P_FIX];
    done.join(c.know[sim::P_S]);
    done.c[sim::P_FIX] = in.seq;
    unit_blocks(lo, hi, [&](sim::Space& sc, uint32_t b) { sc.unit[b] = 0; sc.unitVc[b] = done; sc.unitSite[b] = in.site; });
}
}  // namespace detail

// DataCopy GM -> L1 (A1/B1) with ND->NZ (copy_gm_to_cbuf_multi_nd2nz in the CCE intrinsic
// reference): for each of ndNum matrices, each of nValue rows, each 32-byte C0 block k of the row
// (C0 = 32 / sizeof(T) elements): source element offset i * srcNdMatrixStride + j * srcDValue +
// k * C0; destination offset i * dstNzMatrixStride + j * dstNzNStride * C0 + k * dstNzC0Stride * C0
// (elements). A row whose dValue is not a multiple of C0 is zero-padded to C0 in L1 (same page).
template <typename T>
inline void DataCopy(const LocalTensor<T>& dst, const GlobalTensor<T>& src, const Nd2NzParams& p, sim::Loc loc = {}) {
    const char* api = "DataCopy GM->L1 (Nd2NzParams)";
    detail::need_mem(dst, sim::MEM_L1, api, "destination");
    detail::check_mem_align(dst.addr_, sim::limits::kL1Align, sim::MEM_L1, api, "destination", "CheckDataCopyAlign");
    const char* kNd2Nz = sim::limits::kNd2NzSource;
    sim::check_range("cube-param", api, "ndNum", p.ndNum, 0, sim::limits::kNd2NzMaxNdNum, kNd2Nz);
    sim::check_range("cube-param", api, "nValue", p.nValue, 0, sim::limits::kNd2NzMaxStride, kNd2Nz);
    sim::check_range("cube-param", api, "dstNzC0Stride", p.dstNzC0Stride, 0, sim::limits::kNd2NzMaxStride, kNd2Nz);
    sim::check_range("cube-param", api, "dstNzNStride", p.dstNzNStride, 0, sim::limits::kNd2NzMaxStride, kNd2Nz);
    sim::check_range("cube-param", api, "dstNzMatrixStride", p.dstNzMatrixStride, 0, sim::limits::kNd2NzMaxStride,
                     kNd2Nz);
    sim::Ins in = sim::issue(sim::P_MTE2, api, loc);
    const uint32_t c0 = 32 / sizeof(T), blocks = (p.dValue + c0 - 1) / c0;
    uint64_t bytes = 0;
    for (uint32_t i = 0; i < p.ndNum; i++)
        for (uint32_t j = 0; j < p.nValue; j++) {
            const uint64_t s = uint64_t(i) * p.srcNdMatrixStride + uint64_t(j) * p.srcDValue;
            src.need(s + p.dValue, api);
            sim::gm_access(in, src.base_ + s, uint64_t(p.dValue) * sizeof(T), false);
            for (uint32_t k = 0; k < blocks; k++) {
                const uint64_t d = uint64_t(i) * p.dstNzMatrixStride + uint64_t(j) * p.dstNzNStride * c0 +
                                   uint64_t(k) * p.dstNzC0Stride * c0;
                detail::need_bytes(dst.bytes_, (d + c0) * sizeof(T), api, "the NZ destination");
                T blk[32];
                for (uint32_t e = 0; e < c0; e++) blk[e] = (k * c0 + e < p.dValue) ? sim::load_as<T>(src.base_ + s + k * c0 + e) : T(0.0f);
                sim::sp_write(in, sim::MEM_L1, dst.addr_ + uint32_t(d * sizeof(T)), 32);
                std::memcpy(sim::space(sim::MEM_L1).data.data() + dst.addr_ + d * sizeof(T), blk, 32);
                bytes += 32;
            }
        }
    detail::dma_stats(sim::P_MTE2, bytes, uint64_t(p.ndNum) * p.nValue);
    sim::core().st.l1InBytes += bytes;
}

// LoadData (2D) L1 -> L0A / L0B: repeatTimes fractals of 512 bytes (16 x 16 of 16-bit data, 16 x 32
// of int8); source fractal startIndex + r * srcStride, destination fractal r * (1 + dstGap) (the
// asc-tools LoadData check computes the same extents: kernel_loaddata_check.cpp). ifTranspose
// transposes each 16 x 16 fractal (16-bit types only; int8 transposes through
// LoadDataWithTranspose). Range: repeatTimes is 8 bits (1..255; 0 copies nothing).
template <typename T>
inline void LoadData(const LocalTensor<T>& dst, const LocalTensor<T>& src, const LoadData2DParams& p, sim::Loc loc = {}) {
    const char* api = "LoadData L1->L0";
    static_assert(detail::is16<T>() || std::is_same<T, int8_t>::value, "twin: LoadData emulated for half / bfloat16_t / int8_t");
    if (p.ifTranspose && !detail::is16<T>())
        sim::fail("bounds", "twin: LoadData ifTranspose is emulated for 16-bit data only (int8: LoadDataWithTranspose)");
    if (dst.mem_ != sim::MEM_L0A && dst.mem_ != sim::MEM_L0B)
        sim::fail("position", std::string(api) + ": destination in " + sim::mem_name(dst.mem_) + ", expected A2 (L0A) or B2 (L0B)");
    detail::need_mem(src, sim::MEM_L1, api, "source");
    if (p.addrMode != 0) sim::fail("bounds", "twin: LoadData addrMode != 0 is not emulated");
    detail::check_mem_align(dst.addr_, sim::limits::kL0Align, dst.mem_, api, "destination", "CheckDataCopyAlign");
    detail::check_mem_align(src.addr_, sim::limits::kL1Align, sim::MEM_L1, api, "source", "CheckDataCopyAlign");
    sim::Ins in = sim::issue(sim::P_MTE1, api, loc);
    uint8_t buf[detail::kFractalBytes];
    for (uint32_t r = 0; r < p.repeatTimes; r++) {
        const uint64_t s = (uint64_t(p.startIndex) + uint64_t(r) * p.srcStride) * detail::kFractalBytes;
        const uint64_t d = uint64_t(r) * (1u + p.dstGap) * detail::kFractalBytes;
        detail::need_bytes(src.bytes_, s + detail::kFractalBytes, api, "the source fractals");
        detail::need_bytes(dst.bytes_, d + detail::kFractalBytes, api, "the destination fractals");
        // The whole fractal moves; bytes never written in L1 (e.g. rows past nValue of an ND2NZ
        // copy) stay "unwritten" in L0, so only an Mmad that uses them is an [uninit-read].
        sim::sp_read(in, sim::MEM_L1, src.addr_ + uint32_t(s), detail::kFractalBytes);
        const uint8_t* sp = sim::space(sim::MEM_L1).data.data() + src.addr_ + s;
        const uint8_t* sw = sim::space(sim::MEM_L1).written.data() + src.addr_ + s;
        uint8_t wbuf[detail::kFractalBytes];
        if (p.ifTranspose) {
            for (int i = 0; i < 16; i++)
                for (int j = 0; j < 16; j++) {
                    std::memcpy(buf + (j * 16 + i) * 2, sp + (i * 16 + j) * 2, 2);
                    std::memcpy(wbuf + (j * 16 + i) * 2, sw + (i * 16 + j) * 2, 2);
                }
        } else {
            std::memcpy(buf, sp, detail::kFractalBytes);
            std::memcpy(wbuf, sw, detail::kFractalBytes);
        }
        sim::sp_write(in, dst.mem_, dst.addr_ + uint32_t(d), detail::kFractalBytes);
        std::memcpy(sim::space(dst.mem_).data.data() + dst.addr_ + d, buf, detail::kFractalBytes);
        std::memcpy(sim::space(dst.mem_).written.data() + dst.addr_ + d, wbuf, detail::kFractalBytes);
    }
    sim::core().st.l0Bytes += uint64_t(p.repeatTimes) * detail::kFractalBytes;
}

// LoadDataWithTranspose L1 -> L0A / L0B, int8 (LoadDataWithTranspose page, Atlas A2; impl
// dav_c220/kernel_operator_mm_impl.h, LoadData2DL12L0BTransposeCal): each of repeatTimes iterations
// joins two consecutive 16 x 32 source fractals into one 32 x 32 square (source square
// startIndex + r * srcStride, in 1024-byte units), transposes it and splits it into two 16 x 32
// fractals: the first at destination fractal r * (1 + dstGap), the second 1 + dstFracGap fractals
// after it (512-byte units). The twin emulates int8 with startIndex 0 (offset the tensors instead).
struct LoadData2dTransposeParams {
    uint16_t startIndex = 0;
    uint8_t repeatTimes = 0;
    uint16_t srcStride = 0, dstGap = 0, dstFracGap = 0;
    uint8_t addrMode = 0;
    LoadData2dTransposeParams() = default;
    LoadData2dTransposeParams(uint16_t st, uint8_t rep, uint16_t ss, uint16_t gap, uint16_t fracGap)
        : startIndex(st), repeatTimes(rep), srcStride(ss), dstGap(gap), dstFracGap(fracGap) {}
    LoadData2dTransposeParams(uint16_t st, uint8_t rep, uint16_t ss, uint16_t gap, uint16_t fracGap, uint8_t am)
        : startIndex(st), repeatTimes(rep), srcStride(ss), dstGap(gap), dstFracGap(fracGap), addrMode(am) {}
};
template <typename T>
inline void LoadDataWithTranspose(const LocalTensor<T>& dst, const LocalTensor<T>& src, const LoadData2dTransposeParams& p,
                                  sim::Loc loc = {}) {
    const char* api = "LoadDataWithTranspose L1->L0";
    static_assert(std::is_same<T, int8_t>::value, "twin: LoadDataWithTranspose emulated for int8_t");
    if (dst.mem_ != sim::MEM_L0A && dst.mem_ != sim::MEM_L0B)
        sim::fail("position", std::string(api) + ": destination in " + sim::mem_name(dst.mem_) + ", expected A2 (L0A) or B2 (L0B)");
    detail::need_mem(src, sim::MEM_L1, api, "source");
    if (p.startIndex != 0 || p.addrMode != 0) sim::fail("bounds", "twin: LoadDataWithTranspose startIndex / addrMode != 0 is not emulated");
    detail::check_mem_align(dst.addr_, sim::limits::kL0Align, dst.mem_, api, "destination", "CheckDataCopyAlign");
    detail::check_mem_align(src.addr_, sim::limits::kL1Align, sim::MEM_L1, api, "source", "CheckDataCopyAlign");
    sim::Ins in = sim::issue(sim::P_MTE1, api, loc);
    constexpr uint32_t F = detail::kFractalBytes;
    for (uint32_t r = 0; r < p.repeatTimes; r++) {
        const uint64_t s = uint64_t(r) * p.srcStride * 2 * F;
        const uint64_t d0 = uint64_t(r) * (1u + p.dstGap) * F, d1 = d0 + (1u + p.dstFracGap) * F;
        detail::need_bytes(src.bytes_, s + 2 * F, api, "the source square");
        detail::need_bytes(dst.bytes_, (d0 > d1 ? d0 : d1) + F, api, "the destination fractals");
        sim::sp_read(in, sim::MEM_L1, src.addr_ + uint32_t(s), 2 * F);
        const uint8_t* sp = sim::space(sim::MEM_L1).data.data() + src.addr_ + s;
        const uint8_t* sw = sim::space(sim::MEM_L1).written.data() + src.addr_ + s;
        uint8_t buf[2 * F], wbuf[2 * F];
        for (int i = 0; i < 32; i++)  // square row i (source fractal i / 16), column j -> row j, column i
            for (int j = 0; j < 32; j++) {
                buf[j * 32 + i] = sp[i * 32 + j];
                wbuf[j * 32 + i] = sw[i * 32 + j];
            }
        for (int half_ = 0; half_ < 2; half_++) {
            const uint64_t d = half_ ? d1 : d0;
            sim::sp_write(in, dst.mem_, dst.addr_ + uint32_t(d), F);
            std::memcpy(sim::space(dst.mem_).data.data() + dst.addr_ + d, buf + half_ * F, F);
            std::memcpy(sim::space(dst.mem_).written.data() + dst.addr_ + d, wbuf + half_ * F, F);
        }
    }
    sim::core().st.l0Bytes += uint64_t(p.repeatTimes) * 2 * F;
}

// Mmad: C (CO1) = A (A2) x B (B2) [+ C], A m x k, B k x n: float <- half x half, float <- bfloat16_t x
// bfloat16_t, or int32_t <- int8_t x int8_t (the Mmad page's Atlas A2 type table; asc-tools
// kernel_mmad_check.cpp). Documented: m, n, k in [0, 4095] (12-bit fields: MmadParams table); A and
// B 512-byte aligned, C 1024-byte aligned (CheckMmadAlign, impl/kernel_operator_mm_check.h); the
// operands are padded to whole fractals (M and N to 16, K to 16 for 16-bit data and 32 for int8: a
// fractal is 512 bytes, 16 x 16 or 16 x 32) and the padding "is ignored" (Mmad page): the twin reads
// only the elements inside m x k and k x n (an unwritten one is an [uninit-read]) and fills C's
// padding rows/columns with NaN (float) or INT32_MIN (int32; their hardware value is not
// specified). Layouts: A "ZZ" (fractal row-major, 16 rows x K0), B "ZN" (fractal column-major:
// column c of a K0 x 16 fractal at c * K0), C "NZ". Initial C: 0 when cmatrixInitVal and not isBias
// (impl/dav_c220/kernel_operator_mm_impl.h, MmadCal), else the C in L0C.
// Arithmetic: 16-bit inputs: each product is exact in float (11 x 11 or 8 x 8 significand bits); the
// sum over k is taken in float in increasing k, one rounding per addition, added to the initial C
// last. ASSUMPTION: the cube's adder order and any wider internal precision are not documented, so
// the last bits of a long sum may differ from the hardware. int8: exact in int32 (wrapping, as
// two's complement hardware would; the kernels stay far inside the range).
template <typename T, typename U, typename S>
inline void Mmad(const LocalTensor<T>& c, const LocalTensor<U>& a, const LocalTensor<S>& b, const MmadParams& p,
                 sim::Loc loc = {}) {
    const char* api = "Mmad";
    constexpr bool kInt = std::is_same<T, int32_t>::value;
    static_assert(std::is_same<U, S>::value &&
                      ((std::is_same<T, float>::value && detail::is16<U>()) || (kInt && std::is_same<U, int8_t>::value)),
                  "twin: Mmad emulated for float <- half x half, float <- bfloat16_t x bfloat16_t, int32_t <- int8_t x int8_t");
    detail::need_mem(c, sim::MEM_L0C, api, "dst (CO1)");
    detail::need_mem(a, sim::MEM_L0A, api, "fm (A2)");
    detail::need_mem(b, sim::MEM_L0B, api, "filter (B2)");
    const char* kSrc = "MmadParams: 12-bit m/n/k, asc-tools kernel_mmad_check.cpp";
    sim::check_range("cube-param", api, "m", p.m, 0, sim::limits::kMmadMaxMNK, kSrc);
    sim::check_range("cube-param", api, "n", p.n, 0, sim::limits::kMmadMaxMNK, kSrc);
    sim::check_range("cube-param", api, "k", p.k, 0, sim::limits::kMmadMaxMNK, kSrc);
    if (p.cmatrixSource) sim::fail("bounds", "twin: Mmad with the C matrix from the bias table is not emulated");
    if (p.unitFlag != 0 && p.unitFlag != 2 && p.unitFlag != 3)
        sim::fail("cube-param", std::string(api) + ": unitFlag " + std::to_string(p.unitFlag) + " is not 0, 2 or 3 (" +
                                    sim::limits::kUnitFlagSource + ")");
    if (p.m == 1)
        sim::fail("gemv", std::string(api) + " with m = 1 (" + sim::site_str(sim::intern(api, loc)) +
                              "): dav-c220 computes it in GEMV mode, reading A as one contiguous 1 x k vector instead "
                              "of ZZ fractals; pad the rows to m = 16 and read back only row 0 (" +
                              sim::limits::kGemvSource + ")");
    detail::check_mem_align(a.addr_, sim::limits::kMmadL0ABAlign, sim::MEM_L0A, api, "fmLocal", "CheckMmadAlign");
    detail::check_mem_align(b.addr_, sim::limits::kMmadL0ABAlign, sim::MEM_L0B, api, "filterLocal", "CheckMmadAlign");
    detail::check_mem_align(c.addr_, sim::limits::kMmadL0CFloatAlign, sim::MEM_L0C, api, "dstLocal", "CheckMmadAlign");
    constexpr uint32_t K0 = 32 / sizeof(U), E = sizeof(U);  // fractal columns of A (rows of B), element bytes
    const uint32_t M1 = (p.m + 15) / 16, N1 = (p.n + 15) / 16, K1 = (p.k + K0 - 1) / K0;
    detail::need_bytes(a.bytes_, uint64_t(M1) * K1 * 512, api, "A (ceil(m/16) x ceil(k/K0) fractals)");
    detail::need_bytes(b.bytes_, uint64_t(K1) * N1 * 512, api, "B (ceil(k/K0) x ceil(n/16) fractals)");
    detail::need_bytes(c.bytes_, uint64_t(M1) * N1 * 1024, api, "C (ceil(m/16) x ceil(n/16) 4-byte fractals)");
    const bool init = p.cmatrixInitVal && !p.isBias;
    sim::Core& core = sim::core();
    const uint32_t cLo = c.addr_, cHi = c.addr_ + M1 * N1 * 1024;
    const sim::Core::LastMmad last = core.lastMmad;
    if (!init && last.small && last.lo < cHi && cLo < last.hi && core.know[sim::P_M].c[sim::P_M] < last.seq)
        sim::fail("mmad-barrier", std::string(api) + " (" + sim::site_str(sim::intern(api, loc)) +
                                      ") accumulates into L0C the previous Mmad (" + sim::site_str(last.site) +
                                      ") wrote, which was small ((m / 16) * (n / 16) < 10), with no "
                                      "PipeBarrier<PIPE_M> between (" + sim::limits::kSmallMmadSource + ")");
    detail::unit_flag_mmad(p.unitFlag, cLo, cHi, api, loc);
    sim::Ins in = sim::issue(sim::P_M, api, loc);
    core.lastMmad = {in.seq, cLo, cHi, (p.m / 16) * (p.n / 16) < 10, in.site};
    auto aoff = [&](uint32_t r, uint32_t kk) { return ((r / 16) * K1 + kk / K0) * 16u * K0 + (r % 16) * K0 + kk % K0; };
    auto boff = [&](uint32_t kk, uint32_t col) { return ((kk / K0) * N1 + col / 16) * 16u * K0 + (col % 16) * K0 + kk % K0; };
    auto coff = [&](uint32_t r, uint32_t col) { return ((col / 16) * M1 + r / 16) * 256u + (r % 16) * 16u + col % 16; };
    // Reads (ordering) of the valid elements. An element nothing wrote does not fail here: it
    // poisons the C row (A) or column (B) it feeds, and only a later read of a poisoned C element
    // fails ([uninit-read]): CANN's one-query-row product pads m to 16 with stale A rows whose C
    // rows nobody reads (see the [gemv] rule above).
    sim::Space& sa = sim::space(sim::MEM_L0A);
    sim::Space& sb = sim::space(sim::MEM_L0B);
    sim::Space& sc = sim::space(sim::MEM_L0C);
    std::vector<uint8_t> badRow(p.m, 0), badCol(p.n, 0);
    for (uint32_t r = 0; r < p.m; r++)
        for (uint32_t kk = 0; kk < p.k; kk++) {
            const uint32_t o = a.addr_ + aoff(r, kk) * E;
            if (std::memchr(sa.written.data() + o, 0, E)) badRow[r] = 1;
            sim::sp_read(in, sim::MEM_L0A, o, E);
        }
    for (uint32_t kk = 0; kk < p.k; kk++)
        for (uint32_t col = 0; col < p.n; col++) {
            const uint32_t o = b.addr_ + boff(kk, col) * E;
            if (std::memchr(sb.written.data() + o, 0, E)) badCol[col] = 1;
            sim::sp_read(in, sim::MEM_L0B, o, E);
        }
    const uint8_t *pa = a.raw(), *pb = b.raw(), *pc = c.raw();
    auto A = [pa](uint32_t i) { return sim::load_as<U>(pa + i * sizeof(U)); };
    auto B = [pb](uint32_t i) { return sim::load_as<U>(pb + i * sizeof(U)); };
    auto C = [pc](uint32_t i) { return sim::load_as<T>(pc + i * sizeof(T)); };
    const T pad = kInt ? T(std::numeric_limits<int32_t>::min()) : T(std::numeric_limits<float>::quiet_NaN());
    std::vector<T> out(size_t(M1) * N1 * 256, pad);
    std::vector<uint8_t> poisoned(out.size(), 0);
    for (uint32_t r = 0; r < p.m; r++)
        for (uint32_t col = 0; col < p.n; col++) {
            T acc = T(0);
            if constexpr (kInt) {
                uint32_t u = 0;  // two's complement wrap without signed overflow
                for (uint32_t kk = 0; kk < p.k; kk++)
                    u += uint32_t(int32_t(A(aoff(r, kk))) * int32_t(B(boff(kk, col))));
                acc = T(int32_t(u));
            } else {
                for (uint32_t kk = 0; kk < p.k; kk++) acc += float(A(aoff(r, kk))) * float(B(boff(kk, col)));
            }
            const uint32_t co = coff(r, col);
            poisoned[co] = badRow[r] | badCol[col];
            if (!init) {
                if (std::memchr(sc.written.data() + c.addr_ + co * 4, 0, 4)) poisoned[co] = 1;
                sim::sp_read(in, sim::MEM_L0C, c.addr_ + co * 4, 4);
                if constexpr (kInt) acc = T(int32_t(uint32_t(C(co)) + uint32_t(acc)));
                else acc = C(co) + acc;
            }
            out[co] = acc;
        }
    sim::sp_write(in, sim::MEM_L0C, c.addr_, M1 * N1 * 1024);
    std::memcpy(c.raw(), out.data(), out.size() * sizeof(T));
    for (size_t e = 0; e < out.size(); e++) {
        const uint32_t byte = c.addr_ + uint32_t(e) * 4;
        if (poisoned[e]) std::memset(sc.written.data() + byte, 0, 4);
        for (uint32_t q = 0; q < 4; q++) sc.poison[byte + q] = poisoned[e] ? in.site : 0;
    }
    if (p.unitFlag == 3) detail::unit_flag_set(in, cLo, cHi);
    sim::Stats& st = sim::core().st;
    st.mmadCalls++;
    st.cubeFractalMacs += uint64_t(M1) * N1 * K1;  // one 16 x 16 x K0 block: 16-bit 16 x 16 x 16, int8 16 x 16 x 32
    st.cubeMacs += uint64_t(p.m) * p.n * p.k;
}

// Fixpipe L0C -> GM, ROW_MAJOR (NZ -> ND on the way): row r, column c of the result is read at
// L0C element (c / 16) * srcStride * 16 + r * 16 + c % 16 (srcStride: rows per 16-column block,
// in 16-element units: FixpipeL0cToOut in impl/dav_c220/kernel_operator_fixpipe_v2_impl.h) and
// written to GM element r * dstStride + c (GetGMLength there: ROW_MAJOR dstStride in elements).
// Limits (CheckCommonFixpipeParam, same file): the L0C source 64-byte aligned; nSize 1..4095;
// mSize 1..8192 for ROW_MAJOR; dstStride != 0; quantPre NoQuant for float out (and for int32 out of
// an int32 L0C, the Tuple<int32_t, int32_t> case there), F322F16 for half, F322BF16 for bfloat16_t. Casts round to nearest even (ASSUMPTION: the rounding of the FIX cast is
// not documented). L0C -> UB does not exist on dav-c220 ("Fixpipe doesn't support L0C to UB on
// current device", FixpipeL0C2UBImpl) and is refused; ndNum > 1, NZ output, quantisation and the
// channel split are not emulated.
template <typename D, typename S, const FixpipeConfig& config = CFG_ROW_MAJOR>
inline void Fixpipe(const GlobalTensor<D>& dst, const LocalTensor<S>& src, const FixpipeParamsV220& p, sim::Loc loc = {}) {
    const char* api = "Fixpipe L0C->GM";
    static_assert(std::is_same<S, float>::value || (std::is_same<S, int32_t>::value && std::is_same<D, int32_t>::value),
                  "twin: Fixpipe emulated from a float L0C, or int32 L0C -> int32 GM without quantisation");
    detail::need_mem(src, sim::MEM_L0C, api, "source (CO1)");
    if (config.format != CO2Layout::ROW_MAJOR) sim::fail("bounds", "twin: Fixpipe only with CFG_ROW_MAJOR is emulated");
    sim::check_range("cube-param", api, "ndNum", p.ndNum, 1, 65535, sim::limits::kFixpipeDocSource);
    if (p.ndNum > 1 || p.isChannelSplit) sim::fail("bounds", "twin: Fixpipe ndNum > 1 / isChannelSplit not emulated");
    if (p.srcStride % 16)
        sim::fail("cube-param", std::string(api) + ": srcStride " + std::to_string(p.srcStride) +
                                    " is not a multiple of 16 (whole fractals: mSize rounded up to 16; " +
                                    sim::limits::kFixpipeDocSource + ")");
    if (p.unitFlag != 0 && p.unitFlag != 2 && p.unitFlag != 3)
        sim::fail("cube-param", std::string(api) + ": unitFlag " + std::to_string(p.unitFlag) + " is not 0, 2 or 3 (" +
                                    sim::limits::kUnitFlagSource + ")");
    const char* kSrc = "CheckCommonFixpipeParam, dav_c220/kernel_operator_fixpipe_v2_impl.h";
    detail::check_mem_align(src.addr_, sim::limits::kFixpipeSrcAlign, sim::MEM_L0C, api, "srcLocal", kSrc);
    sim::check_range("cube-param", api, "nSize", p.nSize, 1, sim::limits::kFixpipeMaxN, kSrc);
    sim::check_range("cube-param", api, "mSize (ROW_MAJOR)", p.mSize, 1, sim::limits::kFixpipeMaxMRowMajor, kSrc);
    if (p.dstStride == 0) sim::fail("cube-param", std::string(api) + ": dstStride 0 (" + kSrc + ")");
    if (p.srcStride < p.mSize)
        sim::fail("cube-param", std::string(api) + ": srcStride " + std::to_string(p.srcStride) +
                                    " (rows per 16-column block in L0C) is below mSize " + std::to_string(p.mSize));
    const QuantMode_t want = std::is_same<D, float>::value || std::is_same<D, int32_t>::value ? QuantMode_t::NoQuant
                           : std::is_same<D, half>::value ? QuantMode_t::F322F16 : QuantMode_t::F322BF16;
    static_assert(std::is_same<D, float>::value || std::is_same<D, int32_t>::value || detail::is16<D>(),
                  "twin: Fixpipe out float / half / bfloat16_t / int32_t");
    if (p.quantPre != want) sim::fail("cube-param", std::string(api) + ": quantPre does not match the output type (" + kSrc + ")");
    const uint32_t N1 = (p.nSize + 15) / 16;
    detail::need_bytes(src.bytes_, (uint64_t(N1 - 1) * p.srcStride * 16 + uint64_t(p.mSize) * 16) * 4, api, "the L0C source");
    dst.need(uint64_t(p.mSize - 1) * p.dstStride + p.nSize, api);
    // the L0C bytes read: mSize rows of each 16-column block
    const uint32_t fLo = src.addr_, fHi = src.addr_ + (uint32_t(N1 - 1) * p.srcStride * 16u + p.mSize * 16u) * 4u;
    detail::unit_flag_fixpipe(p.unitFlag, fLo, fHi, api, loc);
    sim::Ins in = sim::issue(sim::P_FIX, api, loc);
    std::vector<D> row(p.nSize);
    const uint8_t* pc = src.raw();
    for (uint32_t r = 0; r < p.mSize; r++) {
        for (uint32_t col = 0; col < p.nSize; col++) {
            const uint32_t e = (col / 16) * p.srcStride * 16u + r * 16u + col % 16;
            sim::sp_check_written(sim::MEM_L0C, src.addr_ + e * 4, 4, api);
            sim::sp_read(in, sim::MEM_L0C, src.addr_ + e * 4, 4);
            S v = sim::load_as<S>(pc + e * sizeof(S));
            if (p.reluEn && v < S(0)) v = S(0);
            row[col] = D(v);
        }
        sim::gm_access(in, dst.base_ + uint64_t(r) * p.dstStride, uint64_t(p.nSize) * sizeof(D), true);
        std::memcpy(dst.base_ + uint64_t(r) * p.dstStride, row.data(), p.nSize * sizeof(D));
    }
    if (p.unitFlag == 3) detail::unit_flag_clear(in, fLo, fHi);
    sim::Stats& st = sim::core().st;
    st.fixBytes += uint64_t(p.mSize) * p.nSize * sizeof(D);
    st.fixRows += p.mSize;
}
template <typename D, typename S, const FixpipeConfig& config = CFG_ROW_MAJOR>
inline void Fixpipe(const LocalTensor<D>& dst, const LocalTensor<S>&, const FixpipeParamsV220&, sim::Loc = {}) {
    if (dst.mem_ == sim::MEM_UB)
        sim::fail("position", "Fixpipe L0C->UB does not exist on dav-c220 (FixpipeL0C2UBImpl, "
                              "dav_c220/kernel_operator_fixpipe_v2_impl.h): go through GM");
    sim::fail("bounds", "twin: Fixpipe L0C->L1 is not emulated");
}

}  // namespace AscendC

// Global, as in CANN's kernel_common.h.
inline AscendC::TPipe* GetTPipePtr() { return AscendC::current_pipe(); }

#endif  // SPLITKV_SIM_KERNEL_OPERATOR_H
