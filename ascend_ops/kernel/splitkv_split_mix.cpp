// Split stage of split-KV decode attention, mixed AIC + AIV (one cube core : two vector cores per
// AI core, one launch of `blockDim` AI cores). Same plan and partial-workspace contract as the
// vector-only `splitkv_split` (docs/ascend-kernel.md); used when the tiling's kernelKind is 1.
//
// AI core c takes the plan's items [coreRange[c], coreRange[c + 1]) (contiguous ranges balanced
// by length on the host; graph mode, deviceSplitTokens > 0: items c, c + blockDim, ... of the grid
// derived from seqLens). An item (request b, KV head h, split, [start, end)) has M = q_len * G
// query rows (all query rows of the request and the whole GQA group): the M dimension of the cube.
// Per tile of TT tokens:
//   cube (AIC): K, V pages GM -> L1 through the block table (ND -> NZ, one copy per page segment;
//     what no row may see is copied from a zero row: masked page ids (never dereferenced), positions
//     before the window, the tail to a whole fractal; several query rows: V's causal band too, which
//     the vector cores add per row (AddBand));
//     S = Q K^T on the cube (fp16/bf16 in, fp32 out) -> scratch S slot, flag S;
//     after flag P: P (q's dtype) scratch -> L1 -> L0A, V -> L0B (transposed fractals),
//     O = P V -> scratch O slot, flag O.
//   vector (AIV sub-block v takes rows [v * ceil(M / 2), ...)): S rows -> UB, scale, soft cap,
//     masks (causal tail, window, tile tail, masked pages) as whole-row ranges, row max, exp, row
//     sum, all as vector instructions over [rows x tile]; the running m and l are updated per
//     (row, tile) by the scalar unit (one V->S round trip per tile, none per token); P -> scratch,
//     flag P; after flag O: acc = acc * alpha + O. NaN rule: a row whose visible scores or
//     accumulator hold NaN / inf writes NaN (out and lse; docs/conventions.md).
// The scratch (per AI core, after the partials in the workspace) holds two slots of S, P and O:
// the cube runs QK of tile j + 1 and loads K/V of tile j + 2 while the vector cores work on tile j.
// Cross-core flags: 1 S ready, 2 P ready, 3 O ready (all mode 2), 4 zero row ready (once).
// int8 KV (kvDtype INT8): the cube works in half on raw int8 values, the dequantisation is folded
// out of the per-token path (docs/ascend-kernel.md, "int8 KV on the mixed split stage"): per item
// the vector cores write q' = 2^e (q * k_scale) as two half rows, q'_hi + q'_lo (flag 5; the cube
// accumulates both products in L0C, ~22 bits of q'), and keep beta = q' . k_offset per row;
// per tile vector core 0 casts the K tile and vector core 1 the V tile int8 -> half into a scratch
// slot (flag 6, one Cast per page segment, no scale; the same zero rows as the cube's loads); scores s = scale 2^-e (q' K_int^T - beta); the
// output o = v_scale (P V_int / sum P) - v_scale v_offset, with sum P over the rounded P the cube
// multiplies (the lse keeps the float sum).
// NOT RUN ON AN NPU: type-checked against CANN 8.1 headers and run on the CPU twin only.
#include "splitkv_kernel_common.h"
#include "splitkv_combine_stage.h"

using namespace AscendC;

namespace splitkv {

constexpr uint16_t kFlagS = 1, kFlagP = 2, kFlagO = 3, kFlagZero = 4, kFlagQ = 5, kFlagKV = 6;
constexpr int32_t kQuantChunk = 64;  // int8 KV: tokens one vector core casts at a time (tiling.py)
constexpr int32_t kMaxVecRows = 64;  // rows one vector core holds (host: rows padded <= 128)
// Start of the running max: finite, so exp(m_old - m_new) is never formed from -inf - -inf; a row
// that sees nothing keeps l = 0 and writes o = 0, lse = -inf.
constexpr float kMaxStart = -3.0e38f;

struct MixItem {
    int32_t b, h, split, start, end, row0, qLen, seqLen;
};

struct MixCommon {
    SplitKVTiling t;
    int32_t G, D, TT, MP, core, w0, w1, wStep;
    bool quant;  // int8 KV: the cube reads q' and the half K/V tiles the vector cores write
    GlobalTensor<int32_t> planGm, btGm;
    GM_ADDR scratch;

    __aicore__ inline void Init(GM_ADDR blockTable, GM_ADDR plan, GM_ADDR workspace, const SplitKVTiling& tt,
                                int32_t coreIdx) {
        t = tt;
        G = t.groupSize;
        D = t.headDim;
        TT = t.mixTileTokens;
        MP = t.mixRowsPad;
        quant = t.kvDtype == SPLITKV_DT_INT8;
        core = coreIdx;
        planGm.SetGlobalBuffer(reinterpret_cast<__gm__ int32_t*>(plan), uint64_t(t.planWords));
        btGm.SetGlobalBuffer(reinterpret_cast<__gm__ int32_t*>(blockTable), uint64_t(t.batch) * t.maxPages);
        // items [w0, w1) step wStep: the host's balanced contiguous range, or in graph mode (items
        // derived from seqLens on the device) every blockDim-th item of the split-major grid, so the
        // first splits of all (request, KV head) pairs spread over the cores
        if (t.deviceSplitTokens > 0) {
            w0 = core;
            w1 = t.numItems;
            wStep = t.blockDim;
        } else {
            w0 = planGm.GetValue(t.coreRangeOffset + core);
            w1 = planGm.GetValue(t.coreRangeOffset + core + 1);
            wStep = 1;
        }
        scratch = workspace + t.scratchOffsetBytes + uint64_t(core) * t.scratchCoreBytes;
    }
    // false for padding items, requests without query rows and (graph mode) splits past the request
    __aicore__ inline bool ReadItem(int32_t w, MixItem& it) { return LoadItem(planGm, t, w, it); }
    __aicore__ inline int32_t Page(const MixItem& it, int32_t p) {
        return btGm.GetValue(uint64_t(it.b) * t.maxPages + p / t.pageSize);
    }
    __aicore__ inline bool PageOk(int32_t page) const { return page >= 0 && page < t.numPages; }
    // scratch layout (bytes): S [2][MP][TT] f32, P [2][MP][TT] T, O [2][MP][D] f32, zero row [D] T
    __aicore__ inline uint64_t SOff(int32_t slot) const { return uint64_t(slot) * MP * TT * 4; }
    __aicore__ inline uint64_t POff(int32_t slot, int32_t tb) const {
        return uint64_t(2) * MP * TT * 4 + uint64_t(slot) * MP * TT * tb;
    }
    __aicore__ inline uint64_t OOff(int32_t slot, int32_t tb) const {
        return uint64_t(2) * MP * TT * (4 + tb) + uint64_t(slot) * MP * D * 4;
    }
    __aicore__ inline uint64_t ZOff(int32_t tb) const { return uint64_t(2) * MP * (TT * (4 + tb) + D * 4); }
    // int8 KV only, after the zero row: q' [hi, lo][MP][D] half, then K/V tiles [2 slots][K, V][TT][D] half
    __aicore__ inline uint64_t QOff() const { return ZOff(2) + uint64_t(D) * 2; }
    __aicore__ inline uint64_t KVOff(int32_t slot, int32_t which) const {
        return QOff() + uint64_t(2) * MP * D * 2 + (uint64_t(slot) * 2 + which) * TT * D * 2;
    }
};

// ------------------------------------------------------------------------------------------------
// Cube core
template <typename T>
class MixCube {
public:
    __aicore__ inline void Init(GM_ADDR q, GM_ADDR k, GM_ADDR v, GM_ADDR bt, GM_ADDR plan, GM_ADDR ws,
                                const SplitKVTiling& t) {
        c_.Init(bt, plan, ws, t, static_cast<int32_t>(GetBlockIdx()));
        const int32_t MP = c_.MP, TT = c_.TT, D = c_.D;
        if (c_.quant) {  // q' and the half K/V tiles come from the vector cores through the scratch
            qGm_.SetGlobalBuffer(reinterpret_cast<__gm__ T*>(c_.scratch + c_.QOff()), uint64_t(2) * MP * D);
            kvGm_.SetGlobalBuffer(reinterpret_cast<__gm__ T*>(c_.scratch + c_.KVOff(0, 0)), uint64_t(4) * TT * D);
        } else {
            const uint64_t kvElems = uint64_t(t.numPages) * t.pageSize * t.numKVHeads * t.headDim;
            qGm_.SetGlobalBuffer(reinterpret_cast<__gm__ T*>(q), uint64_t(t.numRows) * t.numQHeads * t.headDim);
            kGm_.SetGlobalBuffer(reinterpret_cast<__gm__ T*>(k), kvElems);
            vGm_.SetGlobalBuffer(reinterpret_cast<__gm__ T*>(v), kvElems);
        }
        sGm_.SetGlobalBuffer(reinterpret_cast<__gm__ float*>(c_.scratch), uint64_t(2) * MP * TT);
        pGm_.SetGlobalBuffer(reinterpret_cast<__gm__ T*>(c_.scratch + c_.POff(0, sizeof(T))), uint64_t(2) * MP * TT);
        oGm_.SetGlobalBuffer(reinterpret_cast<__gm__ float*>(c_.scratch + c_.OOff(0, sizeof(T))), uint64_t(2) * MP * D);
        zGm_.SetGlobalBuffer(reinterpret_cast<__gm__ T*>(c_.scratch + c_.ZOff(sizeof(T))), uint64_t(D));
        const uint32_t qParts = c_.quant ? 2u : 1u;  // int8 KV: q'_hi and q'_lo
        pipe_.InitBuffer(qL1_, qParts * MP * D * sizeof(T));
        pipe_.InitBuffer(kL1_, 2u * TT * D * sizeof(T));
        pipe_.InitBuffer(vL1_, 2u * TT * D * sizeof(T));
        pipe_.InitBuffer(pL1_, uint32_t(MP) * TT * sizeof(T));
        pipe_.InitBuffer(qL0_, qParts * MP * D * sizeof(T));
        pipe_.InitBuffer(pL0_, uint32_t(MP) * TT * sizeof(T));
        pipe_.InitBuffer(bL0_, uint32_t(TT) * D * sizeof(T));
        pipe_.InitBuffer(sL0C_, uint32_t(MP) * TT * sizeof(float));
        pipe_.InitBuffer(oL0C_, uint32_t(MP) * D * sizeof(float));
    }

    __aicore__ inline void Process() {
        CrossCoreWaitFlag(kFlagZero);  // the vector cores wrote this core's zero row
        int32_t tile = 0;              // tiles of this core so far (scratch slot = tile % 2)
        for (int32_t w = c_.w0; w < c_.w1; w += c_.wStep) {
            MixItem it;
            if (!c_.ReadItem(w, it) || it.end <= it.start) {
                continue;
            }
            const int32_t M = it.qLen * c_.G;
            const int32_t nt = CeilDiv(it.end - it.start, c_.TT);
            WaitFor<HardEvent::MTE1_MTE2>();  // L1 (Q, K/V buffers) no longer read by LoadData
            LoadQ(it, M);
            LoadKV(it, 0, 0, tile);
            WaitFor<HardEvent::MTE2_MTE1>();
            QK(it, M, 0, tile, true);
            for (int32_t j = 0; j < nt; j++) {
                if (j + 1 < nt) {  // K/V of tile j + 1 stream in while the cube and vector cores work on j
                    WaitFor<HardEvent::MTE1_MTE2>();
                    LoadKV(it, j + 1, (j + 1) % 2, tile + j + 1);
                }
                PV(it, M, j, tile + j);
                if (j + 1 < nt) {
                    QK(it, M, j + 1, tile + j + 1, false);
                }
            }
            tile += nt;
        }
    }

private:
    __aicore__ inline int32_t Tokens(const MixItem& it, int32_t j) const {
        return Min(c_.TT, it.end - (it.start + j * c_.TT));
    }

    __aicore__ inline void LoadQ(const MixItem& it, int32_t M) {
        const int32_t G = c_.G, D = c_.D;
        const uint64_t off = (uint64_t(it.row0) * c_.t.numQHeads + uint64_t(it.h) * G) * D;
        LocalTensor<T> q1 = qL1_.Get<T>();
        if (c_.quant) {  // q'_hi and q'_lo rows [M][D] each (the vector cores' flag Q)
            CrossCoreWaitFlag(kFlagQ);
            const Nd2NzParams nz(1, static_cast<uint16_t>(M), static_cast<uint16_t>(D), 0, static_cast<uint16_t>(D),
                                 static_cast<uint16_t>(c_.MP), 1, 0);
            DataCopy(q1, qGm_, nz);
            DataCopy(q1[c_.MP * D], qGm_[uint64_t(c_.MP) * D], nz);
            return;
        }
        DataCopy(q1, qGm_[off],
                 Nd2NzParams(static_cast<uint16_t>(it.qLen), static_cast<uint16_t>(G), static_cast<uint16_t>(D),
                             static_cast<uint16_t>(c_.t.numQHeads * D), static_cast<uint16_t>(D),
                             static_cast<uint16_t>(c_.MP), 1, static_cast<uint16_t>(G * 16)));
    }

    // Tokens of tile j -> K and V buffers `buf` (NZ, token rows, C0 stride TT), one copy per page
    // segment. Zero rows (copied from the core's zero row, never from the cache) stand for what no
    // row of the item may see, so that P V never multiplies a value it must not see by 0 (0 * NaN
    // is NaN): a masked page (id outside [0, numPages)), the positions before the window of the
    // item's first query row, and the tile's tail up to a whole 16-token fractal. int8 KV: the
    // half tiles of scratch slot gTile % 2, whole fractals (the vector cores' flag KV; Convert
    // wrote the same zero rows, and the band's V rows as zeros).
    __aicore__ inline void LoadKV(const MixItem& it, int32_t j, int32_t buf, int32_t gTile) {
        const int32_t TT = c_.TT, D = c_.D, hkv = c_.t.numKVHeads, ps = c_.t.pageSize;
        const int32_t p0 = it.start + j * TT, n = Tokens(it, j);
        const int32_t loAll = c_.t.windowLeft >= 0 ? it.seqLen - it.qLen - c_.t.windowLeft : 0;
        LocalTensor<T> k1 = kL1_.Get<T>()[buf * TT * D];
        LocalTensor<T> v1 = vL1_.Get<T>()[buf * TT * D];
        if (c_.quant) {
            CrossCoreWaitFlag(kFlagKV);
            const Nd2NzParams nz(1, static_cast<uint16_t>(RoundUp(n, 16)), static_cast<uint16_t>(D), 0,
                                 static_cast<uint16_t>(D), static_cast<uint16_t>(TT), 1, 0);
            DataCopy(k1, kvGm_[uint64_t(gTile % 2) * 2 * TT * D], nz);
            DataCopy(v1, kvGm_[(uint64_t(gTile % 2) * 2 + 1) * TT * D], nz);
            return;
        }
        int32_t p = p0;
        while (p < p0 + RoundUp(n, 16)) {
            const bool tail = p >= p0 + n;
            const bool early = !tail && p < loAll;
            const int32_t page = tail || early ? -1 : c_.Page(it, p);
            const int32_t inPage = p % ps;
            const int32_t cnt = tail ? p0 + RoundUp(n, 16) - p
                                     : (early ? Min(loAll - p, p0 + n - p) : Min(ps - inPage, p0 + n - p));
            const int32_t at = (p - p0) * 16;
            if (c_.PageOk(page)) {
                const uint64_t off = ((uint64_t(page) * ps + inPage) * hkv + it.h) * D;
                const Nd2NzParams nz(1, static_cast<uint16_t>(cnt), static_cast<uint16_t>(D), 0,
                                     static_cast<uint16_t>(hkv * D), static_cast<uint16_t>(TT), 1, 0);
                DataCopy(k1[at], kGm_[off], nz);
                DataCopy(v1[at], vGm_[off], nz);
            } else {
                const Nd2NzParams nz(static_cast<uint16_t>(cnt), 1, static_cast<uint16_t>(D), 0,
                                     static_cast<uint16_t>(D), static_cast<uint16_t>(TT), 1, 16);
                DataCopy(k1[at], zGm_, nz);
                DataCopy(v1[at], zGm_, nz);
            }
            p += cnt;
        }
        // several query rows (MTP): the V rows of the causal band (positions the request's first query
        // row cannot see) are zero for the cube; the vector cores add them for the rows that see them
        const int32_t a = Max(p0, it.seqLen - it.qLen + 1);
        if (it.qLen > 1 && a < p0 + n) {
            DataCopy(v1[(a - p0) * 16], zGm_,
                     Nd2NzParams(static_cast<uint16_t>(p0 + n - a), 1, static_cast<uint16_t>(D), 0,
                                 static_cast<uint16_t>(D), static_cast<uint16_t>(TT), 1, 16));
        }
    }

    // S = Q K^T for tile j (K/V already in L1 buffer j % 2) -> scratch S slot, flag S.
    __aicore__ inline void QK(const MixItem& it, int32_t M, int32_t j, int32_t gTile, bool firstTile) {
        const int32_t TT = c_.TT, D = c_.D, MP = c_.MP, n = Tokens(it, j);
        const int32_t M1 = MP / 16, K1 = D / 16, N1 = CeilDiv(n, 16);
        WaitFor<HardEvent::M_MTE1>();  // L0A / L0B no longer read by the previous Mmad
        LocalTensor<T> q0 = qL0_.Get<T>(), b0 = bL0_.Get<T>();
        if (firstTile) {
            for (int32_t part = 0; part < (c_.quant ? 2 : 1); part++) {
                LocalTensor<T> q1 = qL1_.Get<T>()[part * MP * D];
                for (int32_t mb = 0; mb < CeilDiv(M, 16); mb++) {  // NZ (C0 stride MP) -> ZZ
                    LoadData(q0[part * MP * D + mb * K1 * 256], q1,
                             LoadData2DParams(static_cast<uint16_t>(mb), static_cast<uint8_t>(K1),
                                              static_cast<uint16_t>(M1), 0, 0, false, 0));
                }
            }
        }
        LocalTensor<T> k1 = kL1_.Get<T>()[(j % 2) * TT * D];
        for (int32_t kb = 0; kb < K1; kb++) {  // NZ fractals of K are K^T's ZN fractals
            LoadData(b0[kb * N1 * 256], k1, LoadData2DParams(static_cast<uint16_t>(kb * (TT / 16)),
                                                              static_cast<uint8_t>(N1), 1, 0, 0, false, 0));
        }
        WaitFor<HardEvent::MTE1_M>();
        WaitFor<HardEvent::FIX_M>();  // the S region of L0C was read out
        LocalTensor<float> s0 = sL0C_.Get<float>();
        Mmad(s0, q0, b0, MmadParams(static_cast<uint16_t>(M), static_cast<uint16_t>(n), static_cast<uint16_t>(D), 0,
                                    false, true));
        if (c_.quant) {  // + q'_lo K^T, accumulated in L0C (the M pipe runs in order)
            Mmad(s0, q0[MP * D], b0, MmadParams(static_cast<uint16_t>(M), static_cast<uint16_t>(n),
                                                static_cast<uint16_t>(D), 0, false, false));
        }
        WaitFor<HardEvent::M_FIX>();
        // L0C column blocks are ceil(M / 16) fractals apart (the Mmad's own m)
        FixpipeParamsV220 fp(static_cast<uint16_t>(RoundUp(n, 16)), static_cast<uint16_t>(M),
                             static_cast<uint16_t>(RoundUp(M, 16)), uint32_t(TT), false);
        Fixpipe<float, float, CFG_ROW_MAJOR>(sGm_[(gTile % 2) * MP * TT], s0, fp);
        CrossCoreSetFlag<2, PIPE_FIX>(kFlagS);
    }

    // O = P V for tile j (after the vector cores' flag P) -> scratch O slot, flag O.
    __aicore__ inline void PV(const MixItem& it, int32_t M, int32_t j, int32_t gTile) {
        const int32_t TT = c_.TT, D = c_.D, MP = c_.MP, n = Tokens(it, j);
        const int32_t M1 = MP / 16, K1 = CeilDiv(n, 16), N1 = D / 16;
        CrossCoreWaitFlag(kFlagP);
        WaitFor<HardEvent::MTE1_MTE2>();  // the previous tile's LoadData of P from L1 is done
        LocalTensor<T> p1 = pL1_.Get<T>();
        DataCopy(p1, pGm_[(gTile % 2) * MP * TT],
                 Nd2NzParams(1, static_cast<uint16_t>(M), static_cast<uint16_t>(n), 0, static_cast<uint16_t>(TT),
                             static_cast<uint16_t>(MP), 1, 0));
        WaitFor<HardEvent::MTE2_MTE1>();
        WaitFor<HardEvent::M_MTE1>();
        LocalTensor<T> p0 = pL0_.Get<T>(), b0 = bL0_.Get<T>();
        for (int32_t mb = 0; mb < CeilDiv(M, 16); mb++) {
            LoadData(p0[mb * K1 * 256], p1, LoadData2DParams(static_cast<uint16_t>(mb), static_cast<uint8_t>(K1),
                                                              static_cast<uint16_t>(M1), 0, 0, false, 0));
        }
        LocalTensor<T> v1 = vL1_.Get<T>()[(j % 2) * TT * D];
        for (int32_t tb = 0; tb < K1; tb++) {  // V's NZ fractals, transposed, are the ZN fractals of B = V
            LoadData(b0[tb * N1 * 256], v1, LoadData2DParams(static_cast<uint16_t>(tb), static_cast<uint8_t>(N1),
                                                              static_cast<uint16_t>(TT / 16), 0, 0, true, 0));
        }
        WaitFor<HardEvent::MTE1_M>();
        WaitFor<HardEvent::FIX_M>();
        LocalTensor<float> o0 = oL0C_.Get<float>();
        Mmad(o0, p0, b0, MmadParams(static_cast<uint16_t>(M), static_cast<uint16_t>(D), static_cast<uint16_t>(n), 0,
                                    false, true));
        WaitFor<HardEvent::M_FIX>();
        FixpipeParamsV220 fp(static_cast<uint16_t>(D), static_cast<uint16_t>(M), static_cast<uint16_t>(RoundUp(M, 16)),
                             uint32_t(D), false);
        Fixpipe<float, float, CFG_ROW_MAJOR>(oGm_[(gTile % 2) * MP * D], o0, fp);
        CrossCoreSetFlag<2, PIPE_FIX>(kFlagO);
    }

    MixCommon c_;
    TPipe pipe_;
    TBuf<TPosition::A1> qL1_, pL1_;
    TBuf<TPosition::B1> kL1_, vL1_;
    TBuf<TPosition::A2> qL0_, pL0_;
    TBuf<TPosition::B2> bL0_;
    TBuf<TPosition::CO1> sL0C_, oL0C_;
    GlobalTensor<T> qGm_, kGm_, vGm_, kvGm_, pGm_, zGm_;
    GlobalTensor<float> sGm_, oGm_;
};

// ------------------------------------------------------------------------------------------------
// Vector cores: T is q's (and the output's) dtype, C the cube's (T, or half for int8 KV)
template <typename T, typename C>
class MixVec {
public:
    // out / lse: the fused launch's outputs (rows with one split are written there directly and the
    // combine skips them); nullptr for the split-only launch (every row goes to its partial slot).
    __aicore__ inline void Init(GM_ADDR v, GM_ADDR bt, GM_ADDR plan, GM_ADDR ws, const SplitKVTiling& t, GM_ADDR out,
                                GM_ADDR lse) {
        sub_ = static_cast<int32_t>(GetSubBlockIdx());
        direct_ = out != nullptr;
        c_.Init(bt, plan, ws, t, static_cast<int32_t>(GetBlockIdx() / GetTaskRation()));
        const int32_t MP = c_.MP, TT = c_.TT, D = c_.D;
        RH_ = MP / 2;
        sGm_.SetGlobalBuffer(reinterpret_cast<__gm__ float*>(c_.scratch), uint64_t(2) * MP * TT);
        pGm_.SetGlobalBuffer(reinterpret_cast<__gm__ C*>(c_.scratch + c_.POff(0, sizeof(C))), uint64_t(2) * MP * TT);
        oGm_.SetGlobalBuffer(reinterpret_cast<__gm__ float*>(c_.scratch + c_.OOff(0, sizeof(C))), uint64_t(2) * MP * D);
        zGm_.SetGlobalBuffer(reinterpret_cast<__gm__ C*>(c_.scratch + c_.ZOff(sizeof(C))), uint64_t(D));
        wsO_.SetGlobalBuffer(reinterpret_cast<__gm__ float*>(ws), uint64_t(t.numSlots) * t.numQHeads * D);
        wsL_.SetGlobalBuffer(reinterpret_cast<__gm__ float*>(ws + t.lseOffsetBytes),
                             uint64_t(t.numSlots) * t.numQHeads * kLseRepeat);
        pipe_.InitBuffer(s_, uint32_t(RH_) * TT * sizeof(float));
        pipe_.InitBuffer(p_, uint32_t(RH_) * TT * sizeof(C));
        pipe_.InitBuffer(o_, uint32_t(RH_) * D * sizeof(float));
        pipe_.InitBuffer(acc_, uint32_t(RH_) * D * sizeof(float));
        RHP_ = RoundUp(2 * RH_, 8);  // red: row maxima / sums [0, RHP_), score-check sums [RHP_, 2 RHP_)
        pipe_.InitBuffer(red_, 2u * RHP_ * sizeof(float));
        pipe_.InitBuffer(alpha_, uint32_t(RoundUp(RH_, 8)) * sizeof(float));
        pipe_.InitBuffer(work_, 64u * sizeof(float));
        if (t.softCap > 0.0f) {
            pipe_.InitBuffer(cap_, uint32_t(RH_) * TT * sizeof(float));
        }
        pipe_.InitBuffer(outQ_, 2, uint32_t(D + kLseRepeat) * sizeof(float));
        if (t.maxQLen > 1 && c_.quant) {  // the causal band's V rows (AddBand): int8 -> half -> float32
            pipe_.InitBuffer(vb_, uint32_t(RoundUp(D, kBlockBytes)));
            pipe_.InitBuffer(vh_, uint32_t(D) * sizeof(half));
            pipe_.InitBuffer(vf_, uint32_t(D) * sizeof(float));
        } else if (t.maxQLen > 1) {  // the causal band's V rows (AddBand): q's dtype -> float32
            vGm_.SetGlobalBuffer(reinterpret_cast<__gm__ T*>(v),
                                 uint64_t(t.numPages) * t.pageSize * t.numKVHeads * t.headDim);
            pipe_.InitBuffer(vb_, uint32_t(RoundUp(D * int32_t(sizeof(T)), kBlockBytes)));
            pipe_.InitBuffer(vf_, uint32_t(D) * sizeof(float));
        }
        if (direct_) {
            outGm_.SetGlobalBuffer(reinterpret_cast<__gm__ T*>(out), uint64_t(t.numRows) * t.numQHeads * D);
            lseGm_.SetGlobalBuffer(reinterpret_cast<__gm__ float*>(lse), uint64_t(t.numRows) * t.numQHeads);
            pipe_.InitBuffer(ob_, uint32_t(D) * sizeof(T));
        }
    }

    // int8 KV: the raw q, K, V and kvQuant [4, Hkv, D] (k scale, k offset, v scale, v offset) and
    // the buffers of PrepQ and Convert (tiling.mix_ub_bytes lists the same).
    __aicore__ inline void InitQuant(GM_ADDR q, GM_ADDR k, GM_ADDR v, GM_ADDR kvQuant) {
        const SplitKVTiling& t = c_.t;
        const int32_t D = c_.D, KR = RoundUp(D, kBlockBytes);
        const uint64_t kvElems = uint64_t(t.numPages) * t.pageSize * t.numKVHeads * D;
        qGm_.SetGlobalBuffer(reinterpret_cast<__gm__ T*>(q), uint64_t(t.numRows) * t.numQHeads * D);
        kI8Gm_.SetGlobalBuffer(reinterpret_cast<__gm__ int8_t*>(k), kvElems);
        vI8Gm_.SetGlobalBuffer(reinterpret_cast<__gm__ int8_t*>(v), kvElems);
        quantGm_.SetGlobalBuffer(reinterpret_cast<__gm__ float*>(kvQuant), uint64_t(4) * t.numKVHeads * D);
        qsGm_.SetGlobalBuffer(reinterpret_cast<__gm__ half*>(c_.scratch + c_.QOff()), uint64_t(2) * c_.MP * D);
        kvGm_.SetGlobalBuffer(reinterpret_cast<__gm__ half*>(c_.scratch + c_.KVOff(0, 0)), uint64_t(4) * c_.TT * D);
        pipe_.InitBuffer(qT_, uint32_t(RH_) * D * sizeof(T));
        pipe_.InitBuffer(qf_, uint32_t(RH_) * D * sizeof(float));
        pipe_.InitBuffer(qh_, uint32_t(2) * RH_ * D * sizeof(half));  // q'_hi, q'_lo
        pipe_.InitBuffer(kvq_, uint32_t(4) * D * sizeof(float));
        pipe_.InitBuffer(i8_, uint32_t(kQuantChunk) * KR);
        pipe_.InitBuffer(h16_, uint32_t(kQuantChunk) * KR * sizeof(half));
    }

    __aicore__ inline void Process() {
        WriteZeroRow();
        int32_t tile = 0;
        for (int32_t w = c_.w0; w < c_.w1; w += c_.wStep) {
            MixItem it;
            if (!c_.ReadItem(w, it)) {
                continue;
            }
            const int32_t M = it.qLen * c_.G;
            const int32_t r0 = Min(M, sub_ * RH_), nr = Min(M, r0 + RH_) - r0;  // this core's rows
            StartItem(nr);
            const int32_t nt = it.end > it.start ? CeilDiv(it.end - it.start, c_.TT) : 0;
            if (c_.quant && nt > 0) {
                PrepQ(it, r0, nr);
                Convert(it, 0, tile);
            }
            for (int32_t j = 0; j < nt; j++) {
                if (c_.quant && j + 1 < nt) {  // the cube loads tile j + 1 before it needs P of tile j
                    Convert(it, j + 1, tile + j + 1);
                }
                Softmax(it, r0, nr, j, tile + j);
                Update(nr, r0, tile + j);
                AddBand(it, r0, nr, j);
            }
            tile += nt;
            Finish(it, r0, nr);
        }
    }

private:
    // sub-block 0 writes this AI core's zero row (read by the cube for masked pages); both set the flag
    __aicore__ inline void WriteZeroRow() {
        if (sub_ == 0) {
            LocalTensor<C> z = p_.Get<C>();
            Duplicate(z, C(0.0f), c_.D);
            WaitFor<HardEvent::V_MTE3>();
            DataCopy(zGm_, z, uint32_t(c_.D));
            WaitFor<HardEvent::MTE3_V>();
        }
        CrossCoreSetFlag<2, PIPE_MTE3>(kFlagZero);
    }

    // int8 KV, once per item: the kvQuant rows of KV head h (row 3 becomes v_scale * v_offset), and
    // q' = 2^e (q * k_scale) of this core's rows (e: the power of two that puts max |q'| in
    // [2^13, 2^14), inside half's range) as q'_hi = half(q') and q'_lo = half(q' - q'_hi) -> the
    // scratch q' rows, flag Q; beta[r] = (q'_hi + q'_lo) . k_offset (from what the cube multiplies,
    // so that the offset error is relative to the dequantised K) and sScale_ = scale 2^-e.
    __aicore__ inline void PrepQ(const MixItem& it, int32_t r0, int32_t nr) {
        const int32_t D = c_.D, G = c_.G;
        LocalTensor<float> kvq = kvq_.Get<float>();
        WaitFor<HardEvent::V_MTE2>();  // the previous item's reads of kvq and qT are done
        for (int32_t s = 0; s < 4; s++) {
            DataCopy(kvq[s * D], quantGm_[(uint64_t(s) * c_.t.numKVHeads + it.h) * D], uint32_t(D));
        }
        LocalTensor<T> qt = qT_.Get<T>();
        for (int32_t r = 0; r < nr; r++) {
            const int32_t row = r0 + r;
            const uint64_t qrow = uint64_t(it.row0 + row / G) * c_.t.numQHeads + uint64_t(it.h) * G + row % G;
            DataCopy(qt[r * D], qGm_[qrow * D], uint32_t(D));
        }
        WaitFor<HardEvent::MTE2_V>();
        Mul(kvq[3 * D], kvq[2 * D], kvq[3 * D], D);
        sScale_ = c_.t.scale;
        vBad_ = false;
        if (nr > 0) {
            LocalTensor<float> qf = qf_.Get<float>(), tmp = o_.Get<float>(), red = red_.Get<float>();
            LocalTensor<float> work = work_.Get<float>();
            LocalTensor<half> qh = qh_.Get<half>();
            const uint32_t cnt = uint32_t(nr) * D;
            // NaN rule: a NaN / inf V scale or offset makes every dequantised V value of the head
            // non-finite (0 * x is 0 for a finite x, NaN otherwise; read with the row maxima below)
            PipeBarrier<PIPE_V>();
            Muls(tmp, kvq[2 * D], 0.0f, 2 * D);
            PipeBarrier<PIPE_V>();
            ReduceSum(red[RHP_], tmp, work, 2 * D);
            Cast(qf, qt, RoundMode::CAST_NONE, cnt);
            PipeBarrier<PIPE_V>();
            for (int32_t r = 0; r < nr; r++) {
                Mul(qf[r * D], qf[r * D], kvq, D);
            }
            PipeBarrier<PIPE_V>();
            Muls(tmp, qf, -1.0f, cnt);  // |q'| = max(q', -q')
            PipeBarrier<PIPE_V>();
            Max(tmp, tmp, qf, cnt);
            PipeBarrier<PIPE_V>();
            for (int32_t r = 0; r < nr; r++) {
                ReduceMax(red[2 * r], tmp[r * D], work, D);
            }
            WaitFor<HardEvent::V_S>();
            vBad_ = !IsFinite(red.GetValue(RHP_));
            float mx = 0.0f;  // over the finite rows: a NaN / inf row (NaN rule) leaves the others' e alone
            for (int32_t r = 0; r < nr; r++) {
                const float x = red.GetValue(2 * r);
                mx = x > mx && IsFinite(x) ? x : mx;
            }
            const float f = PowerOfTwoFor(mx);
            sScale_ = c_.t.scale / f;
            Muls(qf, qf, f, cnt);
            PipeBarrier<PIPE_V>();
            WaitFor<HardEvent::MTE3_V>();  // the previous item's copy-out of qh is done
            LocalTensor<half> lo = qh[RH_ * D];
            Cast(qh, qf, RoundMode::CAST_NONE, cnt);  // q'_hi
            PipeBarrier<PIPE_V>();
            Cast(tmp, qh, RoundMode::CAST_NONE, cnt);
            PipeBarrier<PIPE_V>();
            Sub(tmp, qf, tmp, cnt);  // q' - q'_hi, exact in float
            PipeBarrier<PIPE_V>();
            Cast(lo, tmp, RoundMode::CAST_NONE, cnt);  // q'_lo
            PipeBarrier<PIPE_V>();
            Cast(qf, qh, RoundMode::CAST_NONE, cnt);
            Cast(tmp, lo, RoundMode::CAST_NONE, cnt);
            PipeBarrier<PIPE_V>();
            Add(qf, qf, tmp, cnt);  // q'_hi + q'_lo: what the cube multiplies
            PipeBarrier<PIPE_V>();
            for (int32_t r = 0; r < nr; r++) {
                Mul(tmp[r * D], qf[r * D], kvq[D], D);
            }
            PipeBarrier<PIPE_V>();
            for (int32_t r = 0; r < nr; r++) {
                ReduceSum(red[2 * r], tmp[r * D], work, D);
            }
            WaitFor<HardEvent::V_MTE3>();
            DataCopy(qsGm_[uint64_t(r0) * D], qh, cnt);
            DataCopy(qsGm_[uint64_t(c_.MP + r0) * D], lo, cnt);
            WaitFor<HardEvent::V_S>();
            for (int32_t r = 0; r < nr; r++) {
                beta_[r] = red.GetValue(2 * r);
            }
        }
        CrossCoreSetFlag<2, PIPE_MTE3>(kFlagQ);
    }

    // 2^(13 - floor(log2 x)) for a finite x > 0 (x 2^.. in [2^13, 2^14)), clamped to float's normal
    // exponents; 1 for 0, inf or NaN (a NaN or inf q then reaches the scores unchanged).
    __aicore__ static inline float PowerOfTwoFor(float x) {
        if (!(x > 0.0f) || !(x < 3.0e38f)) {
            return 1.0f;
        }
        union {
            float f;
            uint32_t u;
        } b;
        b.f = x;
        int32_t e = 13 - (static_cast<int32_t>((b.u >> 23) & 0xff) - 127);
        e = Max(-126, Min(127, e));
        b.u = static_cast<uint32_t>(e + 127) << 23;
        return b.f;
    }

    // int8 KV: tile j of the item, K (sub-block 0) or V (sub-block 1), int8 -> half into the scratch
    // slot gTile % 2, whole 16-token fractals, flag KV. Chunks of kQuantChunk tokens; per page
    // segment one DataCopyPad (rows of D bytes at a stride of Hkv * D, each landing on a 32-byte row)
    // and one Cast. Zero rows, never read from the cache, as the cube's LoadKV: masked pages, the
    // positions before the window of the item's first query row, the tile's tail up to a whole
    // fractal, and for V the causal band of several query rows (AddBand adds it). No scale or offset
    // here: they are folded into q', the scores and the output.
    __aicore__ inline void Convert(const MixItem& it, int32_t j, int32_t gTile) {
        const int32_t TT = c_.TT, D = c_.D, KR = RoundUp(D, kBlockBytes), ps = c_.t.pageSize;
        const int32_t p0 = it.start + j * TT, n = Min(TT, it.end - p0), n16 = RoundUp(n, 16);
        // cache rows [lo, hi) of the tile; the rest are zero
        const int32_t lo = c_.t.windowLeft >= 0 ? it.seqLen - it.qLen - c_.t.windowLeft : 0;
        const int32_t hi = sub_ == 1 && it.qLen > 1 ? Min(p0 + n, it.seqLen - it.qLen + 1) : p0 + n;
        const GlobalTensor<int8_t>& src = sub_ == 0 ? kI8Gm_ : vI8Gm_;
        LocalTensor<int8_t> i8 = i8_.Get<int8_t>();
        LocalTensor<half> h = h16_.Get<half>();
        const uint64_t dst = (uint64_t(gTile % 2) * 2 + sub_) * TT * D;
        for (int32_t c = 0; c < n16; c += kQuantChunk) {
            const int32_t cn = Min(kQuantChunk, n16 - c);
            WaitFor<HardEvent::V_MTE2>();  // the previous chunk's Cast has read i8
            for (int32_t p = p0 + c; p < p0 + c + cn;) {
                int32_t cnt;
                const int32_t page = Segment(it, p, p0 + c + cn, lo, hi, cnt), inPage = p % ps;
                if (c_.PageOk(page)) {
                    const uint64_t off = ((uint64_t(page) * ps + inPage) * c_.t.numKVHeads + it.h) * D;
                    DataCopyExtParams cp(static_cast<uint16_t>(cnt), uint32_t(D), uint32_t(c_.t.numKVHeads - 1) * D,
                                         0, 0);
                    DataCopyPadExtParams<int8_t> pp(true, 0, static_cast<uint8_t>(KR - D), 0);
                    DataCopyPad(i8[(p - p0 - c) * KR], src[off], cp, pp);
                }
                p += cnt;
            }
            WaitFor<HardEvent::MTE2_V>();
            WaitFor<HardEvent::MTE3_V>();  // the previous chunk's copy-out has read h
            for (int32_t p = p0 + c; p < p0 + c + cn;) {
                int32_t cnt;
                const int32_t page = Segment(it, p, p0 + c + cn, lo, hi, cnt);
                const int32_t at = (p - p0 - c) * KR;
                if (c_.PageOk(page)) {
                    Cast(h[at], i8[at], RoundMode::CAST_NONE, uint32_t(cnt) * KR);
                } else {
                    Duplicate(h[at], half(0.0f), cnt * KR);
                }
                p += cnt;
            }
            WaitFor<HardEvent::V_MTE3>();
            DataCopy(kvGm_[dst + uint64_t(c) * D], h,
                     DataCopyParams(static_cast<uint16_t>(cn), static_cast<uint16_t>(D * 2 / kBlockBytes),
                                    static_cast<uint16_t>((KR - D) * 2 / kBlockBytes), 0));
        }
        CrossCoreSetFlag<2, PIPE_MTE3>(kFlagKV);
    }

    // The segment of Convert's rows at position p (before pe): its page id, or -1 for zero rows
    // (outside the cache rows [lo, hi)), and in cnt its length (within one page).
    __aicore__ inline int32_t Segment(const MixItem& it, int32_t p, int32_t pe, int32_t lo, int32_t hi,
                                      int32_t& cnt) {
        if (p < lo) {
            cnt = Min(lo, pe) - p;
            return -1;
        }
        if (p >= hi) {
            cnt = pe - p;
            return -1;
        }
        cnt = Min(c_.t.pageSize - p % c_.t.pageSize, Min(hi, pe) - p);
        return c_.Page(it, p);
    }

    __aicore__ inline void StartItem(int32_t nr) {
        if (nr > 0) {
            Duplicate(acc_.Get<float>(), 0.0f, nr * c_.D);
        }
        for (int32_t r = 0; r < nr; r++) {
            m_[r] = kMaxStart;
            l_[r] = 0.0f;
            lr_[r] = 0.0f;
        }
    }

    // Set positions [a, b) of a UB row to `value`: a vector Duplicate over the 32-byte-aligned part, the
    // scalar unit for the at most 7 positions before it (only at a window or causal edge).
    __aicore__ inline void MaskRange(const LocalTensor<float>& row, int32_t a, int32_t b, float value,
                                     bool& scalarPending) {
        if (b <= a) {
            return;
        }
        const int32_t a8 = Min(RoundUp(a, 8), b);
        const int32_t b8 = b - (b - a8) % 8;
        if (b8 > a8) {
            Duplicate(row[a8], value, b8 - a8);
        }
        if (a8 > a || b > b8) {
            scalarPending = true;
        }
    }
    __aicore__ inline void MaskRangeScalar(const LocalTensor<float>& row, int32_t a, int32_t b, float value) {
        if (b <= a) {
            return;
        }
        const int32_t a8 = Min(RoundUp(a, 8), b);
        const int32_t b8 = b - (b - a8) % 8;
        for (int32_t i = a; i < a8; i++) {
            row.SetValue(i, value);
        }
        for (int32_t i = b8 > a8 ? b8 : a8; i < b; i++) {
            row.SetValue(i, value);
        }
    }

    // Columns outside each row's visible interval (causal tail, window), the tile tail [n, n16)
    // and the columns of masked pages -> `value`, over the [nr x n16] block (then a V barrier).
    __aicore__ inline void Mask(const MixItem& it, const LocalTensor<float>& s, int32_t r0, int32_t nr, int32_t p0,
                                int32_t n, int32_t n16, float value) {
        bool scalarPending = false;
        for (int32_t r = 0; r < nr; r++) {
            int32_t js, je;
            Visible(it, r0 + r, p0, n, js, je);
            MaskRange(s[r * n16], 0, js, value, scalarPending);
            MaskRange(s[r * n16], je, n16, value, scalarPending);
        }
        bool pagesMasked = false;
        for (int32_t p = p0; p < p0 + n;) {  // one block-table read per page segment of the tile
            const int32_t cntp = Min(c_.t.pageSize - p % c_.t.pageSize, p0 + n - p);
            if (!c_.PageOk(c_.Page(it, p))) {
                pagesMasked = true;
                for (int32_t r = 0; r < nr; r++) {
                    MaskRange(s[r * n16], p - p0, p - p0 + cntp, value, scalarPending);
                }
            }
            p += cntp;
        }
        if (scalarPending) {
            WaitFor<HardEvent::V_S>();
            for (int32_t r = 0; r < nr; r++) {
                int32_t js, je;
                Visible(it, r0 + r, p0, n, js, je);
                MaskRangeScalar(s[r * n16], 0, js, value);
                MaskRangeScalar(s[r * n16], je, n16, value);
            }
            if (pagesMasked) {
                for (int32_t p = p0; p < p0 + n;) {
                    const int32_t cntp = Min(c_.t.pageSize - p % c_.t.pageSize, p0 + n - p);
                    if (!c_.PageOk(c_.Page(it, p))) {
                        for (int32_t r = 0; r < nr; r++) {
                            MaskRangeScalar(s[r * n16], p - p0, p - p0 + cntp, value);
                        }
                    }
                    p += cntp;
                }
            }
            WaitFor<HardEvent::S_V>();
        }
        PipeBarrier<PIPE_V>();
    }

    // The row's visible columns of tile [p0, p0 + n): [js, je) (causal tail and window are intervals).
    __aicore__ inline void Visible(const MixItem& it, int32_t row, int32_t p0, int32_t n, int32_t& js, int32_t& je) {
        const int32_t qpos = it.seqLen - it.qLen + row / c_.G;
        const int32_t lo = c_.t.windowLeft >= 0 ? qpos - c_.t.windowLeft : 0;
        js = Min(n, Max(0, lo - p0));
        je = Max(js, Min(n, qpos + 1 - p0));
    }

    // cap * tanh(x / cap) without cancellation when the cap is large against the scores: x / cap
    // clamped to [-10, 10] (tanh is 1 in float beyond), halved 9 times, tanh of the small argument
    // (|y| < 0.02) by its Taylor series y (1 + y^2 (-1/3 + 2 y^2 / 15)) (next term < 1e-13
    // relative), then doubled back 9 times with tanh(2y) = 2 t / (1 + t^2) (condition number at
    // most 1: relative errors do not grow). Whole-block vector instructions only.
    __aicore__ inline void SoftCap(const LocalTensor<float>& s, int32_t cnt) {
        const float cap = c_.t.softCap;
        LocalTensor<float> u = cap_.Get<float>();
        Muls(s, s, 1.0f / cap, cnt);
        Duplicate(u, -10.0f, cnt);
        PipeBarrier<PIPE_V>();
        Max(s, s, u, cnt);  // x >= -10
        PipeBarrier<PIPE_V>();
        Muls(s, s, -1.0f, cnt);
        PipeBarrier<PIPE_V>();
        Max(s, s, u, cnt);  // -x >= -10
        PipeBarrier<PIPE_V>();
        Muls(s, s, -1.0f / 512.0f, cnt);  // y = x / 2^9
        PipeBarrier<PIPE_V>();
        Mul(u, s, s, cnt);
        PipeBarrier<PIPE_V>();
        Muls(u, u, 2.0f / 15.0f, cnt);
        PipeBarrier<PIPE_V>();
        Adds(u, u, -1.0f / 3.0f, cnt);
        PipeBarrier<PIPE_V>();
        Mul(u, u, s, cnt);
        PipeBarrier<PIPE_V>();
        Mul(u, u, s, cnt);
        PipeBarrier<PIPE_V>();
        Adds(u, u, 1.0f, cnt);
        PipeBarrier<PIPE_V>();
        Mul(s, s, u, cnt);  // t = tanh(y)
        for (int32_t i = 0; i < 9; i++) {
            PipeBarrier<PIPE_V>();
            Mul(u, s, s, cnt);
            Muls(s, s, 2.0f, cnt);
            PipeBarrier<PIPE_V>();
            Adds(u, u, 1.0f, cnt);
            PipeBarrier<PIPE_V>();
            Div(s, s, u, cnt);
        }
        PipeBarrier<PIPE_V>();
        Muls(s, s, cap, cnt);
        PipeBarrier<PIPE_V>();
    }

    // Tile j of the item: S rows -> P rows (q's dtype) in the scratch, flag P; m, l, alpha updated.
    __aicore__ inline void Softmax(const MixItem& it, int32_t r0, int32_t nr, int32_t j, int32_t gTile) {
        const int32_t TT = c_.TT, MP = c_.MP;
        const int32_t p0 = it.start + j * TT, n = Min(TT, it.end - p0), n16 = RoundUp(n, 16);
        CrossCoreWaitFlag(kFlagS);
        if (nr == 0) {  // no rows on this vector core: keep the flag protocol
            CrossCoreSetFlag<2, PIPE_MTE3>(kFlagP);
            return;
        }
        LocalTensor<float> s = s_.Get<float>();
        const int32_t cnt = nr * n16;  // rows of n16 columns, packed
        WaitFor<HardEvent::V_MTE2>();  // the previous tile's vector reads of s are done
        DataCopy(s, sGm_[(gTile % 2) * MP * TT + r0 * TT],
                 DataCopyParams(static_cast<uint16_t>(nr), static_cast<uint16_t>(n16 / 8),
                                static_cast<uint16_t>((TT - n16) / 8), 0));
        WaitFor<HardEvent::MTE2_V>();
        if (c_.quant) {  // q . k = 2^-e (q' . k_int - beta): the K offset, exactly, on every column
            for (int32_t r = 0; r < nr; r++) {
                Adds(s[r * n16], s[r * n16], -beta_[r], n16);
            }
            PipeBarrier<PIPE_V>();
        }
        Muls(s, s, c_.quant ? sScale_ : c_.t.scale, cnt);
        PipeBarrier<PIPE_V>();
        // NaN rule: the visible scores are checked before the soft cap (which would make -inf and
        // +inf finite): the masked columns are set to 0 first, so a row's sum is NaN or inf iff a
        // score it sees is (q or K held NaN / inf); the sums are read with the row maxima below.
        LocalTensor<float> red = red_.Get<float>(), work = work_.Get<float>(), alpha = alpha_.Get<float>();
        Mask(it, s, r0, nr, p0, n, n16, 0.0f);
        for (int32_t r = 0; r < nr; r++) {
            ReduceSum(red[RHP_ + 2 * r], s[r * n16], work, n16);
        }
        if (c_.t.softCap > 0.0f) {
            SoftCap(s, cnt);
        }
        Mask(it, s, r0, nr, p0, n, n16, kNegInf);
        // row max (one instruction per row), then the running max on the scalar unit: once per tile
        for (int32_t r = 0; r < nr; r++) {
            ReduceMax(red[2 * r], s[r * n16], work, n16);
        }
        WaitFor<HardEvent::V_S>();
        for (int32_t r = 0; r < nr; r++) {
            if (!IsFinite(red.GetValue(RHP_ + 2 * r))) {
                l_[r] = kNaN;  // sticky: l * alpha + sum stays NaN; Finish writes a NaN row
            }
            const float mt = red.GetValue(2 * r);
            const float mNew = m_[r] > mt ? m_[r] : mt;  // >= kMaxStart: finite
            alpha.SetValue(r, m_[r] - mNew);
            m_[r] = mNew;
        }
        WaitFor<HardEvent::S_V>();
        for (int32_t r = 0; r < nr; r++) {
            Adds(s[r * n16], s[r * n16], -m_[r], n16);
        }
        Exp(alpha, alpha, nr);
        PipeBarrier<PIPE_V>();
        Exp(s, s, cnt);  // masked columns: exp(-inf) = 0
        PipeBarrier<PIPE_V>();
        for (int32_t r = 0; r < nr; r++) {
            ReduceSum(red[2 * r], s[r * n16], work, n16);
        }
        LocalTensor<C> p = p_.Get<C>();
        WaitFor<HardEvent::MTE3_V>();  // the previous tile's P copy-out has read p
        if constexpr (sizeof(C) == 2 && !IsSameType<C, half>::value) {
            Cast(p, s, RoundMode::CAST_RINT, uint32_t(cnt));
        } else {
            Cast(p, s, RoundMode::CAST_NONE, uint32_t(cnt));
        }
        if (c_.quant) {  // lr sums the rounded P the cube multiplies: sum_j P_j / lr = 1 for the V offset
            PipeBarrier<PIPE_V>();
            Cast(s, p, RoundMode::CAST_NONE, uint32_t(cnt));
            PipeBarrier<PIPE_V>();
            for (int32_t r = 0; r < nr; r++) {
                ReduceSum(red[2 * r + 1], s[r * n16], work, n16);
            }
        }
        WaitFor<HardEvent::V_MTE3>();
        DataCopy(pGm_[(gTile % 2) * MP * TT + r0 * TT], p,
                 DataCopyParams(static_cast<uint16_t>(nr), static_cast<uint16_t>(n16 * sizeof(C) / 32), 0,
                                static_cast<uint16_t>((TT - n16) * sizeof(C) / 32)));
        CrossCoreSetFlag<2, PIPE_MTE3>(kFlagP);
        WaitFor<HardEvent::V_S>();
        for (int32_t r = 0; r < nr; r++) {
            a_[r] = alpha.GetValue(r);
            l_[r] = l_[r] * a_[r] + red.GetValue(2 * r);
            lr_[r] = c_.quant ? lr_[r] * a_[r] + red.GetValue(2 * r + 1) : l_[r];
        }
    }

    static constexpr bool IsHalf() { return IsSameType<T, half>::value; }

    // acc = acc * alpha + O for the rows of this vector core (after the cube's flag O).
    __aicore__ inline void Update(int32_t nr, int32_t r0, int32_t gTile) {
        const int32_t D = c_.D, MP = c_.MP;
        CrossCoreWaitFlag(kFlagO);
        if (nr == 0) {
            return;
        }
        LocalTensor<float> o = o_.Get<float>(), acc = acc_.Get<float>();
        WaitFor<HardEvent::V_MTE2>();
        DataCopy(o, oGm_[(gTile % 2) * MP * D + r0 * D], uint32_t(nr * D));
        for (int32_t r = 0; r < nr; r++) {
            Muls(acc[r * D], acc[r * D], a_[r], D);
        }
        WaitFor<HardEvent::MTE2_V>();
        PipeBarrier<PIPE_V>();
        Add(acc, acc, o, nr * D);
        PipeBarrier<PIPE_V>();
    }

    // Several query rows (MTP): the causal band's V rows (positions the request's first query row
    // cannot see) were zero in the cube's P V, so that no row multiplies a value it cannot see by 0;
    // here each row adds p * v of the band positions it sees (Axpy, p from the tile's probabilities,
    // still in s). A masked page contributes nothing.
    __aicore__ inline void AddBand(const MixItem& it, int32_t r0, int32_t nr, int32_t j) {
        const int32_t D = c_.D, p0 = it.start + j * c_.TT, n = Min(c_.TT, it.end - p0);
        const int32_t a = Max(p0, it.seqLen - it.qLen + 1);
        if (it.qLen <= 1 || nr == 0 || a >= p0 + n) {
            return;
        }
        const int32_t n16 = RoundUp(n, 16), ps = c_.t.pageSize;
        LocalTensor<float> s = s_.Get<float>(), acc = acc_.Get<float>(), vf = vf_.Get<float>();
        WaitFor<HardEvent::V_S>();  // the probabilities in s are readable (int8 KV: the rounded P)
        for (int32_t p = a; p < p0 + n; p++) {
            const int32_t page = c_.Page(it, p);
            if (!c_.PageOk(page)) {
                continue;
            }
            LoadBandRow(((uint64_t(page) * ps + p % ps) * c_.t.numKVHeads + it.h) * D, vf);
            for (int32_t r = 0; r < nr; r++) {
                const int32_t qpos = it.seqLen - it.qLen + (r0 + r) / c_.G;
                if (p > qpos || (c_.t.windowLeft >= 0 && p < qpos - c_.t.windowLeft)) {
                    continue;  // this row cannot see p
                }
                Axpy(acc[r * D], vf, s.GetValue(r * n16 + (p - p0)), D);
                PipeBarrier<PIPE_V>();
            }
        }
    }

    // One V row of the cache (element offset off) -> vf as float32: q's dtype cast, or for int8 KV
    // the raw integers (int8 -> half -> float; the V scale and offset are applied in Finish, as for
    // the cube's P V_int).
    __aicore__ inline void LoadBandRow(uint64_t off, const LocalTensor<float>& vf) {
        const int32_t D = c_.D;
        WaitFor<HardEvent::V_MTE2>();  // the previous band row's Cast has read vb
        if (c_.quant) {
            LocalTensor<int8_t> vb = vb_.Get<int8_t>();
            LocalTensor<half> vh = vh_.Get<half>();
            DataCopyExtParams cp(1, uint32_t(D), 0, 0, 0);
            DataCopyPadExtParams<int8_t> pp(true, 0, static_cast<uint8_t>(RoundUp(D, kBlockBytes) - D), 0);
            DataCopyPad(vb, vI8Gm_[off], cp, pp);
            WaitFor<HardEvent::MTE2_V>();
            Cast(vh, vb, RoundMode::CAST_NONE, uint32_t(D));
            PipeBarrier<PIPE_V>();
            Cast(vf, vh, RoundMode::CAST_NONE, uint32_t(D));
        } else {
            LocalTensor<T> vb = vb_.Get<T>();
            DataCopy(vb, vGm_[off], uint32_t(D));
            WaitFor<HardEvent::MTE2_V>();
            Cast(vf, vb, RoundMode::CAST_NONE, uint32_t(D));
        }
        PipeBarrier<PIPE_V>();
    }

    // o = acc / l and lse = m + ln l of each row -> the item's partial slot (o = 0, lse = -inf for a
    // row that saw nothing).
    __aicore__ inline void Finish(const MixItem& it, int32_t r0, int32_t nr) {
        const int32_t D = c_.D, G = c_.G;
        LocalTensor<float> acc = acc_.Get<float>();
        // NaN rule: a NaN / inf value row the row saw reached its accumulator (one sum per row,
        // one round trip per item)
        if (nr > 0) {
            LocalTensor<float> red = red_.Get<float>(), work = work_.Get<float>();
            PipeBarrier<PIPE_V>();  // acc's last write (Update, or StartItem's zeros)
            for (int32_t r = 0; r < nr; r++) {
                ReduceSum(red[RHP_ + 2 * r], acc[r * D], work, D);
            }
            WaitFor<HardEvent::V_S>();
            for (int32_t r = 0; r < nr; r++) {
                if (!IsFinite(red.GetValue(RHP_ + 2 * r))) {
                    l_[r] = kNaN;
                }
            }
        }
        for (int32_t r = 0; r < nr; r++) {
            const int32_t row = r0 + r, qi = row / G, g = row % G;
            LocalTensor<float> o = outQ_.template AllocTensor<float>();
            if (l_[r] != l_[r] || (l_[r] > 0.0f && vBad_)) {  // out and lse NaN (docs/conventions.md)
                Duplicate(o, kNaN, D + kLseRepeat);
            } else if (l_[r] > 0.0f) {
                Muls(o, acc[r * D], 1.0f / lr_[r], D);
                if (c_.quant) {  // o = v_scale (P V_int / lr) - v_scale v_offset
                    LocalTensor<float> kvq = kvq_.Get<float>();
                    PipeBarrier<PIPE_V>();
                    Mul(o, o, kvq[2 * D], D);
                    PipeBarrier<PIPE_V>();
                    Sub(o, o, kvq[3 * D], D);
                }
                Duplicate(o[D], l_[r], kLseRepeat);
                PipeBarrier<PIPE_V>();
                Ln(o[D], o[D], kLseRepeat);
                PipeBarrier<PIPE_V>();
                Adds(o[D], o[D], m_[r], kLseRepeat);
            } else {
                Duplicate(o, 0.0f, D);
                Duplicate(o[D], kNegInf, kLseRepeat);
            }
            const int32_t qrow = it.row0 + qi;
            int32_t s0 = 0, ns = 0;
            if (direct_) {
                RowSplits(c_.planGm, c_.t, qrow, s0, ns);
            }
            const bool direct = direct_ && ns == 1;
            LocalTensor<T> ob;
            if (direct) {  // the row's only split: final output in q's dtype (as the combine rounds)
                ob = ob_.Get<T>();
                WaitFor<HardEvent::MTE3_V>();  // the previous row's copy-out of ob is done
                PipeBarrier<PIPE_V>();
                Cast(ob, o, RoundMode::CAST_RINT, uint32_t(D));
            }
            outQ_.EnQue(o);
            LocalTensor<float> ready = outQ_.template DeQue<float>();
            const uint64_t hqRow = uint64_t(it.h) * G + g;
            if (direct) {
                DataCopy(outGm_[(uint64_t(qrow) * c_.t.numQHeads + hqRow) * D], ob, uint32_t(D));
                DataCopyExtParams cp(1, uint32_t(sizeof(float)), 0, 0, 0);
                DataCopyPad(lseGm_[uint64_t(qrow) * c_.t.numQHeads + hqRow], ready[D], cp);
            } else {
                const int32_t slot = SlotOf(c_.planGm, c_.t, qrow, it.split);
                const uint64_t hq = uint64_t(slot) * c_.t.numQHeads + hqRow;
                DataCopy(wsO_[hq * D], ready, uint32_t(D));
                DataCopy(wsL_[hq * kLseRepeat], ready[D], uint32_t(kLseRepeat));
            }
            outQ_.FreeTensor(ready);
        }
    }

    MixCommon c_;
    bool direct_ = false;
    int32_t sub_ = 0, RH_ = 0, RHP_ = 8;
    float m_[kMaxVecRows], l_[kMaxVecRows], a_[kMaxVecRows], beta_[kMaxVecRows];
    float lr_[kMaxVecRows];  // the sum of P as the cube multiplies it (rounded; int8 KV), else l_
    float sScale_ = 0.0f;
    bool vBad_ = false;  // int8 KV: a V scale or offset of the item's KV head is NaN or inf
    TPipe pipe_;
    TBuf<TPosition::VECCALC> s_, p_, o_, acc_, red_, alpha_, work_, cap_, ob_, vb_, vh_, vf_;
    TBuf<TPosition::VECCALC> qT_, qf_, qh_, kvq_, i8_, h16_;  // int8 KV only
    TQue<TPosition::VECOUT, 2> outQ_;
    GlobalTensor<C> pGm_, zGm_;
    GlobalTensor<T> outGm_, qGm_, vGm_;
    GlobalTensor<int8_t> kI8Gm_, vI8Gm_;
    GlobalTensor<half> qsGm_, kvGm_;
    GlobalTensor<float> sGm_, oGm_, wsO_, wsL_, lseGm_, quantGm_;
};

}  // namespace splitkv

// T: q's dtype; C: the cube's (T, or half for int8 KV, whose integer values half holds exactly)
template <typename T, typename C>
__aicore__ inline void RunSplitMix(GM_ADDR q, GM_ADDR k, GM_ADDR v, GM_ADDR bt, GM_ADDR kvQuant, GM_ADDR plan,
                                   GM_ADDR ws, const SplitKVTiling& t, GM_ADDR out = nullptr, GM_ADDR lse = nullptr) {
    if ASCEND_IS_AIC {
        splitkv::MixCube<C> op;
        op.Init(q, k, v, bt, plan, ws, t);
        op.Process();
    }
    if ASCEND_IS_AIV {
        splitkv::MixVec<T, C> op;
        op.Init(v, bt, plan, ws, t, out, lse);
        if (t.kvDtype == SPLITKV_DT_INT8) {
            op.InitQuant(q, k, v, kvQuant);
        }
        op.Process();
    }
}

extern "C" __global__ __aicore__ void splitkv_split_mix(GM_ADDR q, GM_ADDR kCache, GM_ADDR vCache, GM_ADDR blockTable,
                                                        GM_ADDR kvQuant, GM_ADDR plan, GM_ADDR workspace,
                                                        GM_ADDR tiling) {
    KERNEL_TASK_TYPE_DEFAULT(KERNEL_TYPE_MIX_AIC_1_2);
    SplitKVTiling t;
    splitkv::LoadTiling(tiling, t);
    if (t.qDtype == SPLITKV_DT_FLOAT16) {  // fp16 KV or int8 KV: the cube works in half
        RunSplitMix<half, half>(q, kCache, vCache, blockTable, kvQuant, plan, workspace, t);
    } else if (t.kvDtype == SPLITKV_DT_INT8) {
        RunSplitMix<bfloat16_t, half>(q, kCache, vCache, blockTable, kvQuant, plan, workspace, t);
    } else {
        RunSplitMix<bfloat16_t, bfloat16_t>(q, kCache, vCache, blockTable, kvQuant, plan, workspace, t);
    }
}

// The fused launch: the mixed split stage, SyncAll (cube and vector cores), then the combine on the
// 2 * blockDim vector cores in the same launch (as IFA), saving the second launch. Same buffers as
// splitkv_split_mix followed by splitkv_combine.
template <typename T, typename C>
__aicore__ inline void RunAttentionMix(GM_ADDR q, GM_ADDR k, GM_ADDR v, GM_ADDR bt, GM_ADDR kvQuant, GM_ADDR plan,
                                       GM_ADDR ws, GM_ADDR out, GM_ADDR lse, const SplitKVTiling& t) {
    RunSplitMix<T, C>(q, k, v, bt, kvQuant, plan, ws, t, out, lse);  // rows with one split: written directly
    SyncAll<false>();
    if ASCEND_IS_AIV {
        PipeBarrier<PIPE_ALL>();  // the split stage's UB use is over before the combine's pipe reuses it
        splitkv::CombineStage<T> op;
        op.Init(ws, plan, out, lse, t);
        op.Process(static_cast<int32_t>(GetBlockIdx()), static_cast<int32_t>(GetBlockNum() * GetTaskRation()),
                   true);
    }
}

extern "C" __global__ __aicore__ void splitkv_attention_mix(GM_ADDR q, GM_ADDR kCache, GM_ADDR vCache,
                                                            GM_ADDR blockTable, GM_ADDR kvQuant, GM_ADDR plan,
                                                            GM_ADDR workspace, GM_ADDR tiling, GM_ADDR out,
                                                            GM_ADDR lse) {
    KERNEL_TASK_TYPE_DEFAULT(KERNEL_TYPE_MIX_AIC_1_2);
    SplitKVTiling t;
    splitkv::LoadTiling(tiling, t);
    if (t.qDtype == SPLITKV_DT_FLOAT16) {
        RunAttentionMix<half, half>(q, kCache, vCache, blockTable, kvQuant, plan, workspace, out, lse, t);
    } else if (t.kvDtype == SPLITKV_DT_INT8) {
        RunAttentionMix<bfloat16_t, half>(q, kCache, vCache, blockTable, kvQuant, plan, workspace, out, lse, t);
    } else {
        RunAttentionMix<bfloat16_t, bfloat16_t>(q, kCache, vCache, blockTable, kvQuant, plan, workspace, out, lse, t);
    }
}
