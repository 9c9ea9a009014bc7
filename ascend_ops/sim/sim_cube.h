// CPU twin: the cube unit (AIC) of the Ascend C API subset the kernels use: GM -> L1 (ND2NZ),
// L1 -> L0A / L0B (LoadData), Mmad into L0C, Fixpipe L0C -> GM, and their unit flags. Included by
// kernel_operator.h (its rule list and references cover this file too). A TEST DOUBLE, not the NPU.
#ifndef SPLITKV_SIM_CUBE_H
#define SPLITKV_SIM_CUBE_H

#ifndef SPLITKV_SIM_KERNEL_OPERATOR_H
#error "include kernel_operator.h, not sim_cube.h"
#endif

namespace AscendC {

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
// After the Mmad (bit 1) or Fixpipe (bit 0) `in`: the blocks' bit, and the clock of `in` done.
inline void unit_flag_mark(const sim::Ins& in, uint32_t lo, uint32_t hi, uint8_t bit) {
    sim::Core& c = sim::core();
    sim::VC done = c.know[in.pipe];
    done.join(c.know[sim::P_S]);
    done.c[in.pipe] = in.seq;
    unit_blocks(lo, hi, [&](sim::Space& sc, uint32_t b) { sc.unit[b] = bit; sc.unitVc[b] = done; sc.unitSite[b] = in.site; });
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
    if (p.unitFlag == 3) detail::unit_flag_mark(in, cLo, cHi, 1);
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
    if (p.unitFlag == 3) detail::unit_flag_mark(in, fLo, fHi, 0);
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

#endif  // SPLITKV_SIM_CUBE_H
