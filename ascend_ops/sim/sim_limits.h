// Documented limits and tables of the Ascend 910B (dav-c220, __CCE_AICORE__ == 220) that the CPU
// twin enforces. Every figure names where it is written down; paths are inside a CANN 8.1.RC1
// toolkit's Ascend C headers (<toolkit>/<arch>-linux/ascendc/include/, abbreviated "ascendc/") or
// in CANN's public CPU-debug checker (GitHub hicann/asc-tools, "asc-tools/"). Facts only: no code
// from either is copied. Nothing here was measured on an NPU.
#ifndef SPLITKV_SIM_LIMITS_H
#define SPLITKV_SIM_LIMITS_H

#include <cstdint>

namespace sim {
namespace limits {

// ---- Buffer capacities per core (asc-tools/cpudebug/src/api_check/inc/ascend910B1_ini.h,
// PlatFormParams: UB_SIZE, L1_SIZE, L0A_SIZE, L0B_SIZE, L0C_SIZE; same figures in
// ascendc/basic_api/impl/utils/kernel_utils_constants.h TOTAL_L0A_SIZE / TOTAL_L0B_SIZE).
constexpr uint32_t kUbBytes = 196608;   // Unified Buffer, per vector core (AIV)
constexpr uint32_t kL1Bytes = 524288;   // L1, per cube core (AIC)
constexpr uint32_t kL0ABytes = 65536;   // L0A, per cube core
constexpr uint32_t kL0BBytes = 65536;   // L0B, per cube core
constexpr uint32_t kL0CBytes = 131072;  // L0C, per cube core

// ---- Alignment of local operands (asc-tools/cpudebug/src/api_check/kernel_data_copy_check.cpp,
// CheckDataCopyAlign: GM 1 byte, UB and L1 32 bytes, L0A/L0B/L0C 512 bytes for 16-bit data;
// ascend910B1_ini.h: UB_BLOCK_SIZE = ONE_BLK_SIZE = 32, ONE_REP_BYTE_SIZE = 256).
constexpr uint32_t kUbAlign = 32;
constexpr uint32_t kL1Align = 32;
constexpr uint32_t kL0Align = 512;
constexpr uint32_t kRepeatBytes = 256;  // one vector repeat: 8 blocks of 32 bytes

// ---- DMA parameter ranges.
// DataCopy with DataCopyParams (ascendc/basic_api/impl/dav_c220/kernel_operator_data_copy_impl.h,
// CheckDataCopyParams: blockCount in [1, UINT12_MAX], blockLen in [1, UINT16_MAX]; UINT12_MAX =
// 4095 in ascendc/basic_api/impl/utils/kernel_utils_constants.h). blockLen, srcStride, dstStride
// are in 32-byte blocks for UB/L1 <-> GM copies (DataCopy page, DataCopyParams table).
constexpr uint32_t kDataCopyMaxBlockCount = 4095;
constexpr uint32_t kDataCopyMaxBlockLen = 65535;
// DataCopyPad with DataCopyExtParams (same file, CheckDataCopyPadParams: blockCount in
// [0, 4095], blockLen in [0, 2097151] bytes (21 bits), and GM -> UB: blockLen % sizeof(T) == 0).
constexpr uint32_t kDataCopyPadMaxBlockCount = 4095;
constexpr uint32_t kDataCopyPadMaxBlockLen = 2097151;
// DataCopyPadExtParams left/right padding: at most 32 bytes of elements each
// (asc-tools/cpudebug/src/api_check/kernel_data_copy_pad_check.cpp, CheckPadParamters).
constexpr uint32_t kDataCopyPadMaxPadBytes = 32;

// ---- Vector repeat forms (ascendc/basic_api/impl/utils/kernel_utils_constants.h:
// MAX_REPEAT_TIMES = 255, MIN_REPEAT_TIMES = 0; a repeat covers ONE_REP_BYTE_SIZE = 256 bytes
// (ascend910B1_ini.h), so a continuous mask is 1 .. 256 / sizeof(T) elements; the twin takes
// repeatTimes as int32 so that a value the real uint8 parameter would silently wrap is caught).
constexpr uint32_t kMaxRepeatTimes = 255;
// Reduction repeat forms (WholeReduceSum / WholeReduceMax / BlockReduceSum / BlockReduceMax):
// repeatTimes in [0, 255] (ASCENDC_CHECK_VALUE_RANGE in ascendc/basic_api/inner_interface/
// inner_kernel_operator_vec_reduce_intf.cppm); dstRepStride and srcBlkStride are uint16_t in the
// CPU-debug checks (CheckFunVecReduceOther / CheckFunVecReduceOtherWhl,
// ascendc/basic_api/impl/utils/kernel_check_vec.h) and in the vcadd / vcmax / vcbmax prototypes
// (<toolkit>/tools/tikicpulib/lib/include/stub_fun.h). srcRepStride is uint16_t there too;
// ASSUMPTION: the twin holds it to the 8-bit range of the other repeat forms' repeat strides
// (uint8_t in UnaryRepeatParams / BinaryRepeatParams), stricter than the prototype, as no page
// states the reduction's own field width.
constexpr uint32_t kMaxReduceSrcRepStride = 255;
constexpr uint32_t kMaxReduceStride16 = 65535;

// ---- Cube unit (AIC).
// Mmad: m, n, k are 12-bit fields, each in [0, 4095] (MmadParams table of the Mmad page;
// asc-tools/cpudebug/src/api_check/kernel_mmad_check.cpp, CheckMmadParamsRange). Operand start
// alignment: L0A/L0B 512 bytes, a float L0C 1024 bytes (CheckMmadAlign,
// ascendc/basic_api/impl/kernel_operator_mm_check.h). A 16 x 16 fractal of 16-bit data is 512
// bytes (BYTE_PER_FRACTAL; asc-tools kernel_loaddata_check.cpp); M, K, N are padded to 16 for
// half / bfloat16_t (the Mmad page's alignment table, Atlas A2 section).
constexpr uint32_t kMmadMaxMNK = 4095;
constexpr uint32_t kMmadL0ABAlign = 512;
constexpr uint32_t kMmadL0CFloatAlign = 1024;
constexpr uint32_t kFractalBytes = 512;
// Fixpipe L0C -> GM (CheckCommonFixpipeParam, ascendc/basic_api/impl/dav_c220/
// kernel_operator_fixpipe_v2_impl.h): L0C source 16 x sizeof(float) = 64-byte aligned
// (L0C_SRC_ALIGN); nSize in [1, 4095] (UINT12_MAX); mSize in [1, 8192] for ROW_MAJOR output;
// dstStride != 0.
// GEMV mode: on dav-c220 an Mmad with m = 1 reads A as one contiguous vector, not ZZ fractals, and
// the mode cannot be switched off; CANN's decode kernels pad one query row to m = 16 for that reason
// (hicann/ops-transformer attention/common/op_kernel/matmul.h:330-331 and 499-500,
// incre_flash_attention_preload.h:3537-3538 and 3913-3914; the Mmad GEMV feature page).
constexpr const char* kGemvSource =
    "ops-transformer attention/common/op_kernel/matmul.h:330, incre_flash_attention_preload.h:3537";
// DataCopy GM -> L1 with ND2NZ (CANN 8.1 ascendc/include/basic_api/inner_interface/
// inner_kernel_operator_data_copy_intf.cppm:71-78): ndNum in [0, 4095]; nValue, dstNzC0Stride,
// dstNzNStride in [0, 16384]; dstNzMatrixStride in [0, 16384] (the ND2NZ DataCopy page).
constexpr uint32_t kNd2NzMaxNdNum = 4095;
constexpr uint32_t kNd2NzMaxStride = 16384;
constexpr const char* kNd2NzSource = "CheckDataCopyNd2Nz ranges, inner_kernel_operator_data_copy_intf.cppm:71-78";
// Fixpipe (V220 parameter table of the L0C-to-GM Fixpipe page): ndNum in [1, 65535]; srcStride in
// C0 units, mSize rounded up to 16 (ops-transformer incre_flash_attention_preload.h:3556 sets
// ((mSize + 15) / 16) * 16): the twin requires whole fractals, a multiple of 16.
constexpr const char* kFixpipeDocSource = "FixpipeParamsV220 table, L0C-to-GM Fixpipe page";
// unitFlag of Mmad / Fixpipe: 0 (off), 2 or 3 (the Mmad page's parameter table; UnitFlag feature page).
constexpr const char* kUnitFlagSource = "Mmad / Fixpipe unitFlag, UnitFlag feature page";
// An Mmad with (m / 16) * (n / 16) < 10 needs PipeBarrier<PIPE_M> before the next Mmad that
// accumulates onto its L0C (CANN 8.1 highlevel_api/impl/matmul/stage/compute/mmad_compute.h:59-60,
// LIMIT_MNSIZE = 10; ops-transformer attention/common/op_kernel/matmul.h:511-512).
constexpr const char* kSmallMmadSource = "mmad_compute.h:59 LIMIT_MNSIZE, ops-transformer matmul.h:511";
constexpr uint32_t kFixpipeSrcAlign = 64;
constexpr uint32_t kFixpipeMaxN = 4095;
constexpr uint32_t kFixpipeMaxMRowMajor = 8192;
// CrossCoreSetFlag / CrossCoreWaitFlag on Atlas A2 (CrossCoreSetFlag page, CANN 8.0 reference,
// atlasascendc_api_07_0273): flagId 0..10 (ids 11-14 are the hardware flags of SyncAll:
// SYNC_AIC_FLAG ... SYNC_AIV_ONLY_ALL in ascendc/basic_api/impl/dav_c220/kernel_operator_sync_impl.h),
// modeId 0..2; at most 15 pending sets per counter (the CANN 9.0 page; the 8.0 page says 16: the
// twin takes the stricter figure).
constexpr uint32_t kCrossFlagMaxId = 10;
constexpr uint32_t kCrossFlagMaxPending = 15;

// ---- Cast: supported (source, destination, round mode) on dav-c220. Read off the switch of each
// CastIntrinsicsImpl overload in ascendc/basic_api/impl/dav_c220/kernel_operator_vec_vconv_impl.h
// (a mode is supported when its case issues a vconv intrinsic, unsupported when it asserts).
// Bit i set = RoundMode value i allowed, in the order CAST_NONE, RINT, FLOOR, CEIL, ROUND, TRUNC, ODD.
enum CastType : int { CT_F32, CT_F16, CT_BF16, CT_S8, CT_U8, CT_S16, CT_S32, CT_S64, CT_OTHER };
constexpr uint32_t kNone = 1u << 0, kRint = 1u << 1, kFloor = 1u << 2, kCeil = 1u << 3, kRound = 1u << 4,
                   kTrunc = 1u << 5, kOdd = 1u << 6;
constexpr uint32_t kDirected = kRint | kFloor | kCeil | kRound | kTrunc;
inline uint32_t cast_modes(CastType src, CastType dst) {
    switch (src) {
        case CT_F32:
            if (dst == CT_F16) return kNone | kDirected | kOdd;   // vconv_f322f16{,r,f,c,a,z,o}
            if (dst == CT_BF16) return kDirected;                 // NONE and ODD assert
            if (dst == CT_F32) return kDirected;                  // rounding to integral values
            if (dst == CT_S32 || dst == CT_S16 || dst == CT_S64) return kDirected;
            return 0;
        case CT_F16:
            if (dst == CT_F32) return kNone;                      // only CAST_NONE
            if (dst == CT_S32 || dst == CT_S16) return kDirected;
            if (dst == CT_S8 || dst == CT_U8) return kNone | kDirected;
            return 0;
        case CT_BF16:
            if (dst == CT_F32) return kNone;                      // only CAST_NONE
            if (dst == CT_S32) return kDirected;
            return 0;
        case CT_S8:
        case CT_U8:
            return dst == CT_F16 ? kNone : 0;                     // only CAST_NONE
        case CT_S16:
            if (dst == CT_F16) return kNone | kDirected;
            if (dst == CT_F32) return kNone;
            return 0;                                            // s16 -> s8/u8: "not support"
        case CT_S32:
            if (dst == CT_F32) return kNone | kDirected;
            if (dst == CT_S16 || dst == CT_S64) return kNone;
            return 0;
        case CT_S64:
            if (dst == CT_F32) return kDirected;
            if (dst == CT_S32) return kNone;
            return 0;
        default:
            return 0;
    }
}

}  // namespace limits
}  // namespace sim

#endif  // SPLITKV_SIM_LIMITS_H
