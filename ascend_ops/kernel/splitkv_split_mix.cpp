// Split stage of split-KV decode attention, mixed AIC + AIV (one cube core : two vector cores per
// AI core, one launch of `blockDim` AI cores). Same plan and partial-workspace contract as the
// vector-only `splitkv_split` (docs/ascend-kernel.md); used when the tiling's kernelKind is 1.
//
// AI core c takes the plan's items [coreRange[c], coreRange[c + 1]) (contiguous ranges balanced
// by length on the host; graph mode, deviceSplitTokens > 0: items c, c + blockDim, ... of the grid
// derived from seqLens). An item (request b, KV head h, split, [start, end)) has M = q_len * G
// query rows (all query rows of the request and the whole GQA group): the M dimension of the cube.
// The item's KV is exchanged between the cube and the vector cores in steps of ST = TT x
// mixStepTiles tokens (up to 2048; the tiling takes the longest step whose S / P rows fit the UB and
// L1), one S, P and O scratch slot per step, two slots each:
//   cube (AIC): S = Q K^T tile by tile (K pages GM -> L1 through the block table, ND -> NZ, one copy
//     per page segment, in a ring of two TT-token buffers whose next copy is issued before the
//     current tile is used; what no row may see is copied from a zero row: masked page ids (never
//     dereferenced), positions before the window, the tail to a whole fractal), fp16/bf16 in, fp32
//     out, each tile's columns Fixpiped into the step's S slot, then flag S. After flag P: P (q's
//     dtype) scratch -> L1, tile by tile -> L0A with V's tile (V's ring, its first two copies issued
//     before the wait for P; several query rows with 16-bit KV: V's causal band zero, which the
//     vector cores add per row (AddBand)), O = P V accumulated over the tiles in L0C -> O slot,
//     flag O. QK of step s + 1 is issued before the wait for P of step s (across the core's items
//     for 16-bit KV), so the cube multiplies while the vector cores run the softmax.
//   vector (AIV sub-block v takes rows [v * ceil(M / 2), ...)): S rows -> UB, scale, soft cap,
//     masks (causal tail, window, step tail, masked pages) as whole-row ranges, row max, exp, row
//     sum, all as vector instructions over [rows x step]; the running m, alpha and l as vectors of
//     row blocks (Brcb; no V->S round trip per step, one per item); P -> scratch, flag P; the
//     update of step s (after flag O: acc = acc * alpha_s + O) runs after the softmax of step
//     s + 1 (alpha kept per step parity; across items for 16-bit KV with one query row, two items'
//     state held at once; within an item for int8 KV). NaN rule: a row whose visible scores or
//     accumulator hold NaN / inf writes NaN (out and lse; docs/conventions.md).
// Cross-core flags: 1 S ready, 2 P ready, 3 O ready (all mode 2), 4 zero row ready (once), 5 the
// expanded q rows ready (int8 KV, once per item).
// int8 KV (kvDtype INT8), CANN IFA's MSD route: int8 x int8 -> int32 on the cube, the cube reading
// K and V straight from the cache as for 16-bit KV (docs/ascend-kernel.md, "int8 KV on the mixed
// split stage"). Per item the vector cores expand q' = q * k_scale of each row into kQSteps int8
// rows (x = 127 q' / max|q'|, x_0 = rint(x), r_1 = 254 (x - x_0), x_1 = rint(r_1), r_2 = 254 (r_1 - x_1),
// x_2 = rint(r_2), each in [-127, 127]; flag 5) and
// keep beta = q'^ . k_offset from the rows as the cube multiplies them; the cube computes the
// kQSteps row blocks of X K_int^T (int32) and the vector cores recombine
// s = scale (max|q'| / 127 sum_i 254^-i S_i - beta). P (in [0, 1] after the running max) is
// expanded the same way into kPSteps int8 rows (x = 127 p) and the cube computes X_P V_int; the
// output o = v_scale (sum_i 254^-i O_i / sum P^) - v_scale v_offset, with P^ = sum_i 254^-i x_i as
// the cube multiplies it (the common 1/127 cancels; the lse keeps the float sum of P). Integer
// products make no NaN, so the causal band needs no AddBand here: P = 0 where a row cannot see.
// NOT RUN ON AN NPU: type-checked against CANN 8.1 headers and run on the CPU twin only.
#include "splitkv_kernel_common.h"
#include "splitkv_combine_stage.h"

using namespace AscendC;

namespace splitkv {

constexpr uint16_t kFlagS = 1, kFlagP = 2, kFlagO = 3, kFlagZero = 4, kFlagQ = 5;
constexpr int32_t kMaxVecRows = 64;  // rows one vector core holds (host: rows padded <= 128)
constexpr int32_t kMaxRepeat = 255;   // repeatTimes of one vector instruction (MAX_REPEAT_TIMES)
// int8 KV (MSD): int8 rows per q row (~23 bits of q') and per P row (~15 bits of p); tiling.py
// MIX_Q_STEPS / MIX_P_STEPS
constexpr int32_t kQSteps = 3, kPSteps = 2;
constexpr float kStep = 254.0f, kInvStep = 1.0f / 254.0f;
// a q' row whose largest |value| is below this scores 0 (its true scores are below 1e-25 scale)
constexpr float kTinyRow = 1.0e-30f;
// Start of the running max: finite, so exp(m_old - m_new) is never formed from -inf - -inf; a row
// that sees nothing keeps l = 0 and writes o = 0, lse = -inf.
constexpr float kMaxStart = -3.0e38f;

struct MixItem {
    int32_t b, h, split, start, end, row0, qLen, seqLen;
};

struct MixCommon {
    SplitKVTiling t;
    int32_t G, D, TT, ST, MP, core, w0, w1, wStep;  // TT: tokens per cube tile (an L1 buffer); ST: per step
    bool quant;          // int8 KV: MSD (int8 x int8 on the cube, q and P expanded into int8 rows)
    int32_t SR, PR, NA;  // cube rows of an S slot, of a P / O slot; a tile's tail is padded to NA tokens
    GlobalTensor<int32_t> planGm, btGm;
    GM_ADDR scratch;

    __aicore__ inline void Init(GM_ADDR blockTable, GM_ADDR plan, GM_ADDR workspace, const SplitKVTiling& tt,
                                int32_t coreIdx) {
        t = tt;
        G = t.groupSize;
        D = t.headDim;
        TT = t.mixTileTokens;
        ST = TT * Max(1, t.mixStepTiles);
        MP = t.mixRowsPad;
        quant = t.kvDtype == SPLITKV_DT_INT8;
        SR = quant ? kQSteps * MP : MP;
        PR = quant ? kPSteps * MP : MP;
        NA = quant ? 32 : 16;  // whole int8 fractals (32 tokens) or 16-bit ones (16)
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
    // scratch layout (bytes; tb: the cube's element bytes): S [2][SR][ST] f32 / int32, P [2][PR][ST],
    // O [2][PR][D] f32 / int32, zero row [D]; int8 KV also the expanded q [kQSteps * MP][D] int8.
    // Rows of step i of an item with M query rows: i * M + r.
    __aicore__ inline uint64_t SOff(int32_t slot) const { return uint64_t(slot) * SR * ST * 4; }
    __aicore__ inline uint64_t POff(int32_t slot, int32_t tb) const {
        return uint64_t(2) * SR * ST * 4 + uint64_t(slot) * PR * ST * tb;
    }
    __aicore__ inline uint64_t OOff(int32_t slot, int32_t tb) const {
        return uint64_t(2) * (SR * ST * 4 + PR * ST * tb) + uint64_t(slot) * PR * D * 4;
    }
    __aicore__ inline uint64_t ZOff(int32_t tb) const { return uint64_t(2) * (SR * ST * 4 + PR * (ST * tb + D * 4)); }
    __aicore__ inline uint64_t QOff() const { return ZOff(1) + uint64_t(D); }
    __aicore__ inline int32_t Tail(int32_t n) const { return RoundUp(n, NA); }
};

// ------------------------------------------------------------------------------------------------
// Cube core: T the cube's input dtype (q's, or int8_t for int8 KV), A its accumulator (float, int32_t).
//
// The pipeline. An item's KV is exchanged with the vector cores in steps of ST = TT x mixStepTiles
// tokens (one S, P and O slot each); inside a step K and V stream GM -> L1 one TT-token tile at a
// time through rings of two buffers, the next tile's copy issued before the current one is used
// (event ids per buffer, so MTE2 runs ahead of MTE1 / M / FIX). The cube issues QK of step s + 1
// before it waits for the vector cores' P of step s (preload 2), across the core's items for 16-bit
// KV (int8 KV: within an item, as the vector cores expand the next item's q only after finishing
// the current one), and V's first tiles of step s before that wait.
template <typename T, typename A>
class MixCube {
public:
    static constexpr int32_t K0 = 32 / int32_t(sizeof(T));   // a fractal's inner extent: 16, int8 32
    static constexpr int32_t FE = 512 / int32_t(sizeof(T));  // elements of a 512-byte fractal

    __aicore__ inline void Init(GM_ADDR q, GM_ADDR k, GM_ADDR v, GM_ADDR bt, GM_ADDR plan, GM_ADDR ws,
                                const SplitKVTiling& t) {
        c_.Init(bt, plan, ws, t, static_cast<int32_t>(GetBlockIdx()));
        ws_ = ws;
        const int32_t MP = c_.MP, SR = c_.SR, PR = c_.PR, TT = c_.TT, ST = c_.ST, D = c_.D;
        const uint64_t kvElems = uint64_t(t.numPages) * t.pageSize * t.numKVHeads * t.headDim;
        if (c_.quant) {  // the expanded q rows come from the vector cores through the scratch
            qGm_.SetGlobalBuffer(reinterpret_cast<__gm__ T*>(c_.scratch + c_.QOff()), uint64_t(kQSteps) * MP * D);
        } else {
            qGm_.SetGlobalBuffer(reinterpret_cast<__gm__ T*>(q), uint64_t(t.numRows) * t.numQHeads * t.headDim);
        }
        kGm_.SetGlobalBuffer(reinterpret_cast<__gm__ T*>(k), kvElems);
        vGm_.SetGlobalBuffer(reinterpret_cast<__gm__ T*>(v), kvElems);
        sGm_.SetGlobalBuffer(reinterpret_cast<__gm__ A*>(c_.scratch), uint64_t(2) * SR * ST);
        pGm_.SetGlobalBuffer(reinterpret_cast<__gm__ T*>(c_.scratch + c_.POff(0, sizeof(T))), uint64_t(2) * PR * ST);
        oGm_.SetGlobalBuffer(reinterpret_cast<__gm__ A*>(c_.scratch + c_.OOff(0, sizeof(T))), uint64_t(2) * PR * D);
        zGm_.SetGlobalBuffer(reinterpret_cast<__gm__ T*>(c_.scratch + c_.ZOff(sizeof(T))), uint64_t(D));
        pipe_.InitBuffer(qL1_, uint32_t(SR) * D * sizeof(T));
        pipe_.InitBuffer(kL1_, 2u * TT * D * sizeof(T));
        pipe_.InitBuffer(vL1_, 2u * TT * D * sizeof(T));
        pipe_.InitBuffer(pL1_, uint32_t(PR) * ST * sizeof(T));
        pipe_.InitBuffer(qL0_, uint32_t(SR) * D * sizeof(T));
        pipe_.InitBuffer(pL0_, uint32_t(PR) * TT * sizeof(T));
        pipe_.InitBuffer(bL0_, uint32_t(TT) * D * sizeof(T));
        pipe_.InitBuffer(sL0C_, uint32_t(SR) * TT * sizeof(A));
        pipe_.InitBuffer(oL0C_, uint32_t(PR) * D * sizeof(A));
        for (int32_t b = 0; b < 2; b++) {
            k_.full[b] = pipe_.template AllocEventID<HardEvent::MTE2_MTE1>();
            k_.free[b] = pipe_.template AllocEventID<HardEvent::MTE1_MTE2>();
            v_.full[b] = pipe_.template AllocEventID<HardEvent::MTE2_MTE1>();
            v_.free[b] = pipe_.template AllocEventID<HardEvent::MTE1_MTE2>();
        }
        pFull_ = pipe_.template AllocEventID<HardEvent::MTE2_MTE1>();
        pFree_ = pipe_.template AllocEventID<HardEvent::MTE1_MTE2>();
    }

    __aicore__ inline void Process() {
        CrossCoreWaitFlag(kFlagZero);  // the vector cores wrote this core's zero row
        Cursor qk, pv;                 // the next step to issue QK for, and PV for
        qk.counts = true;
        First(qk);
        First(pv);
        int32_t nq = 0, np = 0;  // steps issued so far (scratch slot = step % 2)
        while (pv.ok) {
            // QK up to one step ahead of PV: steps np and np + 1 (the next item's first step too,
            // for 16-bit KV)
            while (qk.ok && nq <= np + 1 && (!c_.quant || qk.w == pv.w)) {
                QK(qk, nq);
                nq++;
                Next(qk);
            }
            // the next QK's first K tiles are copied while PV waits for P
            PV(pv, np, qk.ok && (!c_.quant || qk.w == pv.w) ? &qk : nullptr, nq);
            np++;
            Next(pv);
        }
        Drain(k_);
        Drain(v_);
        if (pFreePending_) {
            WaitFlag<HardEvent::MTE1_MTE2>(pFree_);
        }
        err_.Flush(ws_, c_.core);
    }

private:
    // A step of the core's stream: item w (it), its step j of nt
    struct Cursor {
        bool ok;
        int32_t w, j, nt, M;
        MixItem it;
        bool counts = false;  // the cursor that reports graph mode's device lengths (each item once)
    };
    __aicore__ inline bool Load(Cursor& c) {
        for (; c.w < c_.w1; c.w += c_.wStep) {
            const bool ok = c_.ReadItem(c.w, c.it);
            if (c.counts && c_.t.deviceSplitTokens > 0 && c.it.split == 0 && c.it.h == 0) {
                err_.Length(c_.t, c.it.b, c.it.seqLen);
            }
            if (ok && c.it.end > c.it.start) {
                c.j = 0;
                c.nt = CeilDiv(c.it.end - c.it.start, c_.ST);
                c.M = c.it.qLen * c_.G;
                return true;
            }
        }
        return false;
    }
    __aicore__ inline void First(Cursor& c) {
        c.w = c_.w0;
        c.ok = Load(c);
    }
    __aicore__ inline void Next(Cursor& c) {
        if (++c.j < c.nt) {
            return;
        }
        c.w += c_.wStep;
        c.ok = Load(c);
    }

    // Two L1 tile buffers streamed by MTE2 and read by MTE1: per buffer an event a LoadData waits
    // for (its copy landed) and one the next copy into it waits for (its LoadData is done).
    struct Ring {
        TEventID full[2], free[2];
        bool freePending[2] = {false, false};
        int32_t next = 0;  // buffer of the next copy
    };
    __aicore__ inline int32_t RingAcquire(Ring& r) {  // the buffer for the next copy, once free
        const int32_t b = r.next;
        r.next = 1 - b;
        if (r.freePending[b]) {
            WaitFlag<HardEvent::MTE1_MTE2>(r.free[b]);
            r.freePending[b] = false;
        }
        return b;
    }
    __aicore__ inline void RingFilled(Ring& r, int32_t b) { SetFlag<HardEvent::MTE2_MTE1>(r.full[b]); }
    __aicore__ inline void RingWaitFull(Ring& r, int32_t b) { WaitFlag<HardEvent::MTE2_MTE1>(r.full[b]); }
    __aicore__ inline void RingRelease(Ring& r, int32_t b) {
        SetFlag<HardEvent::MTE1_MTE2>(r.free[b]);
        r.freePending[b] = true;
    }
    __aicore__ inline void Drain(Ring& r) {
        for (int32_t b = 0; b < 2; b++) {
            if (r.freePending[b]) {
                WaitFlag<HardEvent::MTE1_MTE2>(r.free[b]);
                r.freePending[b] = false;
            }
        }
    }

    __aicore__ inline int32_t StepTokens(const Cursor& c) const {
        return Min(c_.ST, c.it.end - (c.it.start + c.j * c_.ST));
    }
    __aicore__ inline int32_t Tiles(int32_t n) const { return CeilDiv(n, c_.TT); }
    // rows of the cube's QK product (int8 KV: kQSteps blocks of M) and the C0 stride of q in L1
    __aicore__ inline int32_t QRows(int32_t M) const { return c_.quant ? kQSteps * M : M; }
    // Mmad's m for `rows` rows of A: dav-c220 computes m = 1 in GEMV mode (A read as one contiguous
    // vector, not ZZ fractals), so one row (MHA, one query) is computed as m = 16, as CANN's decode
    // kernels do: rows 1-15 of A are stale and feed only C rows the Fixpipe (mSize = rows) never reads.
    __aicore__ static inline uint16_t MmadRows(int32_t rows) { return static_cast<uint16_t>(rows == 1 ? 16 : rows); }
    __aicore__ inline int32_t QStride(int32_t M) const { return c_.quant ? RoundUp(kQSteps * M, 16) : c_.MP; }

    // q rows of the item -> L1 (NZ) -> L0A (ZZ), once per item.
    __aicore__ inline void LoadQ(const MixItem& it, int32_t M) {
        const int32_t G = c_.G, D = c_.D;
        LocalTensor<T> q1 = qL1_.Get<T>();
        WaitFor<HardEvent::MTE1_MTE2>();  // the previous item's LoadData of q from L1 is done
        if (c_.quant) {  // the expanded rows [kQSteps * M][D] (the vector cores' flag Q)
            CrossCoreWaitFlag(kFlagQ);
            DataCopy(q1, qGm_,
                     Nd2NzParams(1, static_cast<uint16_t>(QRows(M)), static_cast<uint16_t>(D), 0,
                                 static_cast<uint16_t>(D), static_cast<uint16_t>(QStride(M)), 1, 0));
        } else {
            const uint64_t off = (uint64_t(it.row0) * c_.t.numQHeads + uint64_t(it.h) * G) * D;
            DataCopy(q1, qGm_[off],
                     Nd2NzParams(static_cast<uint16_t>(it.qLen), static_cast<uint16_t>(G), static_cast<uint16_t>(D),
                                 static_cast<uint16_t>(c_.t.numQHeads * D), static_cast<uint16_t>(D),
                                 static_cast<uint16_t>(c_.MP), 1, static_cast<uint16_t>(G * 16)));
        }
        WaitFor<HardEvent::MTE2_MTE1>();  // q landed (and the copies before it)
        WaitFor<HardEvent::M_MTE1>();     // L0A no longer read by the previous Mmad
        const int32_t rows = QRows(M), K1 = D / K0;
        LocalTensor<T> q0 = qL0_.Get<T>();
        for (int32_t mb = 0; mb < CeilDiv(rows, 16); mb++) {  // NZ -> ZZ
            LoadData(q0[mb * K1 * FE], q1, LoadData2DParams(static_cast<uint16_t>(mb), static_cast<uint8_t>(K1),
                                                            static_cast<uint16_t>(QStride(M) / 16), 0, 0, false, 0));
        }
    }

    // Tokens [p0, p0 + n) of the item's KV head -> `dst` (NZ, token rows, C0 stride TT), one copy per
    // page segment. Zero rows (copied from the core's zero row, never from the cache) stand for what
    // no row of the item may see, so that P V never multiplies a value it must not see by 0 (0 * NaN
    // is NaN): a masked page (id outside [0, numPages)), the positions before the window of the
    // item's first query row, and the tile's tail up to a whole fractal (16 tokens; int8 32).
    // `isV`, several query rows (MTP), 16-bit KV: the V rows of the causal band (positions the
    // request's first query row cannot see) are zero for the cube; the vector cores add them for the
    // rows that see them. int8 KV needs none of this: an integer product is never NaN, and P is 0 there.
    __aicore__ inline void LoadTile(const MixItem& it, int32_t p0, int32_t n, const LocalTensor<T>& dst,
                                    const GlobalTensor<T>& src, bool isV) {
        const int32_t TT = c_.TT, D = c_.D, hkv = c_.t.numKVHeads, ps = c_.t.pageSize, nA = c_.Tail(n);
        const int32_t loAll = c_.t.windowLeft >= 0 ? it.seqLen - it.qLen - c_.t.windowLeft : 0;
        int32_t p = p0;
        while (p < p0 + nA) {
            const bool tail = p >= p0 + n;
            const bool early = !tail && p < loAll;
            const int32_t page = tail || early ? -1 : c_.Page(it, p);
            const int32_t inPage = p % ps;
            const int32_t cnt = tail ? p0 + nA - p
                                     : (early ? Min(loAll - p, p0 + n - p) : Min(ps - inPage, p0 + n - p));
            const int32_t at = (p - p0) * K0;
            if (!isV && !tail && !early && !c_.PageOk(page)) {
                err_.Page(it.b, p / ps, page);  // counted once per tile, on K's copy
            }
            if (c_.PageOk(page)) {
                const uint64_t off = ((uint64_t(page) * ps + inPage) * hkv + it.h) * D;
                DataCopy(dst[at], src[off], Nd2NzParams(1, static_cast<uint16_t>(cnt), static_cast<uint16_t>(D), 0,
                                                        static_cast<uint16_t>(hkv * D), static_cast<uint16_t>(TT), 1, 0));
            } else {
                DataCopy(dst[at], zGm_, Nd2NzParams(static_cast<uint16_t>(cnt), 1, static_cast<uint16_t>(D), 0,
                                                    static_cast<uint16_t>(D), static_cast<uint16_t>(TT), 1,
                                                    static_cast<uint16_t>(K0)));
            }
            p += cnt;
        }
        const int32_t a = Max(p0, it.seqLen - it.qLen + 1);
        if (isV && !c_.quant && it.qLen > 1 && a < p0 + n) {
            DataCopy(dst[(a - p0) * K0], zGm_,
                     Nd2NzParams(static_cast<uint16_t>(p0 + n - a), 1, static_cast<uint16_t>(D), 0,
                                 static_cast<uint16_t>(D), static_cast<uint16_t>(TT), 1, static_cast<uint16_t>(K0)));
        }
    }
    // Tile `tile` of the step at cursor c: K or V -> the ring's next buffer; returns the buffer.
    __aicore__ inline int32_t Fetch(const Cursor& c, int32_t tile, bool isV) {
        Ring& r = isV ? v_ : k_;
        const int32_t b = RingAcquire(r);
        const int32_t p0 = c.it.start + c.j * c_.ST + tile * c_.TT;
        const int32_t n = Min(c_.TT, c.it.start + c.j * c_.ST + StepTokens(c) - p0);
        LocalTensor<T> dst = (isV ? vL1_ : kL1_).Get<T>()[b * c_.TT * c_.D];
        LoadTile(c.it, p0, n, dst, isV ? vGm_ : kGm_, isV);
        RingFilled(r, b);
        return b;
    }

    // S = Q K^T for the step (tile by tile, the next tile's K copy issued first) -> scratch S slot,
    // flag S.
    __aicore__ inline void QK(const Cursor& c, int32_t step) {
        const int32_t TT = c_.TT, D = c_.D, ST = c_.ST, rows = QRows(c.M), K1 = D / K0;
        if (c.j == 0) {
            LoadQ(c.it, c.M);
        }
        const int32_t n = StepTokens(c), tiles = Tiles(n);
        const int32_t pre = kPreStep_ == step ? kPreN_ : 0;  // tiles PrefetchK copied already
        kPreStep_ = -1;
        int32_t buf = pre > 0 ? kPre_[0] : Fetch(c, 0, false);
        for (int32_t i = 0; i < tiles; i++) {
            const int32_t nb = i + 1 < tiles ? (i + 1 < pre ? kPre_[i + 1] : Fetch(c, i + 1, false)) : -1;
            const int32_t nt = Min(TT, n - i * TT), nA = c_.Tail(nt), N1 = nA / 16;
            WaitFor<HardEvent::M_MTE1>();  // L0B no longer read by the previous Mmad
            RingWaitFull(k_, buf);
            LocalTensor<T> b0 = bL0_.Get<T>(), k1 = kL1_.Get<T>()[buf * TT * D];
            for (int32_t kb = 0; kb < K1; kb++) {  // NZ fractals of K are K^T's ZN fractals
                LoadData(b0[kb * N1 * FE], k1, LoadData2DParams(static_cast<uint16_t>(kb * (TT / 16)),
                                                                 static_cast<uint8_t>(N1), 1, 0, 0, false, 0));
            }
            RingRelease(k_, buf);
            WaitFor<HardEvent::MTE1_M>();
            WaitFor<HardEvent::FIX_M>();  // the S region of L0C was read out
            LocalTensor<A> s0 = sL0C_.Get<A>();
            Mmad(s0, qL0_.Get<T>(), b0, MmadParams(MmadRows(rows), static_cast<uint16_t>(c_.quant ? nA : nt),
                                                   static_cast<uint16_t>(D), 0, false, true));
            WaitFor<HardEvent::M_FIX>();
            // L0C column blocks are ceil(rows / 16) fractals apart (the Mmad's own m)
            FixpipeParamsV220 fp(static_cast<uint16_t>(RoundUp(nA, 16)), static_cast<uint16_t>(rows),
                                 static_cast<uint16_t>(RoundUp(rows, 16)), uint32_t(ST), false);
            Fixpipe<A, A, CFG_ROW_MAJOR>(sGm_[(step % 2) * c_.SR * ST + i * TT], s0, fp);
            buf = nb;
        }
        CrossCoreSetFlag<2, PIPE_FIX>(kFlagS);
    }

    // The first (up to) two K tiles of the QK of step `step` at cursor c, into K's ring.
    __aicore__ inline void PrefetchK(const Cursor& c, int32_t step) {
        const int32_t tiles = Tiles(StepTokens(c));
        kPreN_ = tiles > 1 ? 2 : 1;
        for (int32_t i = 0; i < kPreN_; i++) {
            kPre_[i] = Fetch(c, i, false);
        }
        kPreStep_ = step;
    }

    // O = P V for the step (after the vector cores' flag P): V tile by tile (the first two copies
    // issued before the wait, then the next QK's first K tiles: `next`, step `nextStep`), the
    // products accumulated in L0C -> scratch O slot, flag O.
    __aicore__ inline void PV(const Cursor& c, int32_t step, const Cursor* next, int32_t nextStep) {
        const int32_t TT = c_.TT, D = c_.D, ST = c_.ST, M = c.M, n = StepTokens(c), tiles = Tiles(n);
        const int32_t rows = c_.quant ? kPSteps * M : M, stride = c_.quant ? RoundUp(rows, 16) : c_.MP;
        const int32_t N1 = D / 16;
        int32_t bufs[2];
        bufs[0] = Fetch(c, 0, true);
        if (tiles > 1) {
            bufs[1] = Fetch(c, 1, true);
        }
        if (next != nullptr) {
            PrefetchK(*next, nextStep);
        }
        CrossCoreWaitFlag(kFlagP);
        if (pFreePending_) {  // the previous step's LoadData of P from L1 is done
            WaitFlag<HardEvent::MTE1_MTE2>(pFree_);
            pFreePending_ = false;
        }
        const int32_t nkAll = c_.quant ? c_.Tail(n) : n;  // int8: the vector cores wrote P's tail as zeros
        LocalTensor<T> p1 = pL1_.Get<T>();
        DataCopy(p1, pGm_[(step % 2) * c_.PR * ST],
                 Nd2NzParams(1, static_cast<uint16_t>(rows), static_cast<uint16_t>(nkAll), 0, static_cast<uint16_t>(ST),
                             static_cast<uint16_t>(stride), 1, 0));
        SetFlag<HardEvent::MTE2_MTE1>(pFull_);  // waited for after V's first tile moved to L0B
        LocalTensor<A> o0 = oL0C_.Get<A>();
        for (int32_t i = 0; i < tiles; i++) {
            const int32_t nt = Min(TT, n - i * TT), nA = c_.Tail(nt), nk = c_.quant ? nA : nt;
            const int32_t K1 = CeilDiv(nk, K0), buf = bufs[i % 2];
            WaitFor<HardEvent::M_MTE1>();
            LocalTensor<T> p0 = pL0_.Get<T>(), b0 = bL0_.Get<T>();
            // V's tile first: its L1 buffer is free for the copy after next before P's copy lands
            // (which queues behind the copies issued ahead of the wait for P)
            RingWaitFull(v_, buf);
            LocalTensor<T> v1 = vL1_.Get<T>()[buf * TT * D];
            if constexpr (sizeof(T) == 1) {
                // B = V (k = tokens, n = D) in ZN fractals of 32 tokens x 16 columns: per 32-column block of
                // V's NZ, its 32 x 32 squares (consecutive in L1) transposed, one per 32 tokens, each into
                // the fractals (token block, 2 cb) and (token block, 2 cb + 1) of B, N1 fractals apart
                for (int32_t cb = 0; cb < D / 32; cb++) {
                    LoadDataWithTranspose(b0[2 * cb * FE], v1[cb * TT * 32],
                                          LoadData2dTransposeParams(0, static_cast<uint8_t>(nA / 32), 1,
                                                                    static_cast<uint16_t>(N1 - 1), 0));
                }
            } else {
                for (int32_t tb = 0; tb < K1; tb++) {  // V's NZ fractals, transposed, are the ZN fractals of B = V
                    LoadData(b0[tb * N1 * FE], v1, LoadData2DParams(static_cast<uint16_t>(tb), static_cast<uint8_t>(N1),
                                                                     static_cast<uint16_t>(TT / 16), 0, 0, true, 0));
                }
            }
            RingRelease(v_, buf);
            if (i + 2 < tiles) {
                bufs[i % 2] = Fetch(c, i + 2, true);
            }
            if (i == 0) {
                WaitFlag<HardEvent::MTE2_MTE1>(pFull_);  // the step's P rows landed in L1
            }
            for (int32_t mb = 0; mb < CeilDiv(rows, 16); mb++) {  // P's tile i: fractal columns i * TT / K0 ...
                LoadData(p0[mb * K1 * FE], p1,
                         LoadData2DParams(static_cast<uint16_t>(mb + (i * TT / K0) * (stride / 16)),
                                          static_cast<uint8_t>(K1), static_cast<uint16_t>(stride / 16), 0, 0, false, 0));
            }
            WaitFor<HardEvent::MTE1_M>();
            if (i == 0) {
                WaitFor<HardEvent::FIX_M>();  // the O region of L0C was read out
            }
            Mmad(o0, p0, b0, MmadParams(MmadRows(rows), static_cast<uint16_t>(D), static_cast<uint16_t>(nk), 0,
                                        false, i == 0));  // tiles after the first accumulate in L0C
        }
        SetFlag<HardEvent::MTE1_MTE2>(pFree_);
        pFreePending_ = true;
        WaitFor<HardEvent::M_FIX>();
        FixpipeParamsV220 fp(static_cast<uint16_t>(D), static_cast<uint16_t>(rows), static_cast<uint16_t>(RoundUp(rows, 16)),
                             uint32_t(D), false);
        Fixpipe<A, A, CFG_ROW_MAJOR>(oGm_[(step % 2) * c_.PR * D], o0, fp);
        CrossCoreSetFlag<2, PIPE_FIX>(kFlagO);
    }

    MixCommon c_;
    TPipe pipe_;
    TBuf<TPosition::A1> qL1_, pL1_;
    TBuf<TPosition::B1> kL1_, vL1_;
    TBuf<TPosition::A2> qL0_, pL0_;
    TBuf<TPosition::B2> bL0_;
    TBuf<TPosition::CO1> sL0C_, oL0C_;
    GlobalTensor<T> qGm_, kGm_, vGm_, pGm_, zGm_;
    GlobalTensor<A> sGm_, oGm_;
    Ring k_, v_;
    ErrorLog err_;
    GM_ADDR ws_ = nullptr;  // the workspace (its error section)
    int32_t kPre_[2] = {0, 0}, kPreN_ = 0, kPreStep_ = -1;  // K tiles copied ahead for QK of step kPreStep_
    TEventID pFull_ = 0, pFree_ = 0;
    bool pFreePending_ = false;
};

// ------------------------------------------------------------------------------------------------
// Vector cores: T is q's (and the output's) dtype, C the cube's input (T, or int8_t for int8 KV),
// A the cube's accumulator (float, or int32_t for int8 KV)
template <typename T, typename C, typename A>
class MixVec {
public:
    // out / lse: the fused launch's outputs (rows with one split are written there directly and the
    // combine skips them); nullptr for the split-only launch (every row goes to its partial slot).
    __aicore__ inline void Init(GM_ADDR v, GM_ADDR bt, GM_ADDR plan, GM_ADDR ws, const SplitKVTiling& t, GM_ADDR out,
                                GM_ADDR lse) {
        sub_ = static_cast<int32_t>(GetSubBlockIdx());
        direct_ = out != nullptr;
        c_.Init(bt, plan, ws, t, static_cast<int32_t>(GetBlockIdx() / GetTaskRation()));
        const int32_t MP = c_.MP, TT = c_.ST, D = c_.D;  // S / P rows of a whole step
        RH_ = MP / 2;
        sGm_.SetGlobalBuffer(reinterpret_cast<__gm__ A*>(c_.scratch), uint64_t(2) * c_.SR * TT);
        pGm_.SetGlobalBuffer(reinterpret_cast<__gm__ C*>(c_.scratch + c_.POff(0, sizeof(C))), uint64_t(2) * c_.PR * TT);
        oGm_.SetGlobalBuffer(reinterpret_cast<__gm__ A*>(c_.scratch + c_.OOff(0, sizeof(C))), uint64_t(2) * c_.PR * D);
        zGm_.SetGlobalBuffer(reinterpret_cast<__gm__ C*>(c_.scratch + c_.ZOff(sizeof(C))), uint64_t(D));
        wsO_.SetGlobalBuffer(reinterpret_cast<__gm__ float*>(ws + SPLITKV_ERROR_BYTES), uint64_t(t.numSlots) * t.numQHeads * D);
        wsL_.SetGlobalBuffer(reinterpret_cast<__gm__ float*>(ws + t.lseOffsetBytes),
                             uint64_t(t.numSlots) * t.numQHeads * kLseRepeat);
        pipe_.InitBuffer(s_, uint32_t(RH_) * TT * sizeof(float));
        pipe_.InitBuffer(p_, uint32_t(c_.quant ? kPSteps : 1) * RH_ * TT * sizeof(C));
        pipe_.InitBuffer(o_, uint32_t(RH_) * D * sizeof(float));
        pipe_.InitBuffer(acc_, uint32_t(Items()) * RH_ * D * sizeof(float));  // 16-bit KV: two items' (Process)
        RHP_ = RoundUp(2 * RH_, 8);  // red: row maxima / sums at 2 r in [0, RHP_), other sums at RHP_ + 2 r
        pipe_.InitBuffer(red_, 2u * RHP_ * sizeof(float));
        // the running state as vectors: per row one 32-byte block holding the row's value 8 times
        // (row r at block 2 r, as Brcb spreads red's pitch-2 values), NumBlocks() of RHP_ blocks each
        pipe_.InitBuffer(blk_, uint32_t(NumBlocks()) * RHP_ * 8 * sizeof(float));
        pipe_.InitBuffer(work_, 64u * sizeof(float));
        if (t.softCap > 0.0f) {
            pipe_.InitBuffer(cap_, uint32_t(RH_) * TT * sizeof(float));
        }
        pipe_.InitBuffer(outQ_, 2, uint32_t(D + kLseRepeat) * sizeof(float));
        if (t.maxQLen > 1 && !c_.quant) {  // the causal band's V rows (AddBand): q's dtype -> float32
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

    // int8 KV: q and kvQuant [4, Hkv, D] (k scale, k offset, v scale, v offset) and the buffers of
    // PrepQ and of the int32 results (tiling.mix_ub_bytes lists the same).
    __aicore__ inline void InitQuant(GM_ADDR q, GM_ADDR kvQuant) {
        const SplitKVTiling& t = c_.t;
        const int32_t D = c_.D, TT = c_.ST;
        qGm_.SetGlobalBuffer(reinterpret_cast<__gm__ T*>(q), uint64_t(t.numRows) * t.numQHeads * D);
        quantGm_.SetGlobalBuffer(reinterpret_cast<__gm__ float*>(kvQuant), uint64_t(4) * t.numKVHeads * D);
        qxGm_.SetGlobalBuffer(reinterpret_cast<__gm__ int8_t*>(c_.scratch + c_.QOff()), uint64_t(kQSteps) * c_.MP * D);
        pipe_.InitBuffer(qT_, uint32_t(RH_) * D * sizeof(T));
        pipe_.InitBuffer(qf_, uint32_t(RH_) * D * sizeof(float));
        pipe_.InitBuffer(qe_, uint32_t(RH_) * D * sizeof(float));
        pipe_.InitBuffer(qr_, uint32_t(RH_) * D * sizeof(float));
        pipe_.InitBuffer(qh_, uint32_t(RH_) * D * sizeof(half));
        pipe_.InitBuffer(qx_, uint32_t(kQSteps) * RH_ * D);
        pipe_.InitBuffer(kvq_, uint32_t(4) * D * sizeof(float));
        pipe_.InitBuffer(si_, uint32_t(kQSteps) * RH_ * TT * sizeof(int32_t));
        pipe_.InitBuffer(pf_, uint32_t(RH_) * TT * sizeof(float));
        pipe_.InitBuffer(ph_, uint32_t(kPSteps) * RH_ * TT * sizeof(half));
        pipe_.InitBuffer(oi_, uint32_t(kPSteps) * RH_ * D * sizeof(int32_t));
        pipe_.InitBuffer(of_, uint32_t(RH_) * D * sizeof(float));
    }

    __aicore__ inline void Process() {
        WriteZeroRow();
        Duplicate(red_.Get<float>(), 0.0f, 2 * RHP_);  // the odd slots Brcb spreads into the unused blocks
        PipeBarrier<PIPE_V>();
        int32_t tile = 0, par = 0;  // steps so far (scratch slot = step % 2); the item's state parity
        Pending pend;               // the step whose update waits for the next softmax
        for (int32_t w = c_.w0; w < c_.w1; w += c_.wStep) {
            MixItem it;
            if (!c_.ReadItem(w, it)) {
                continue;
            }
            const int32_t M = it.qLen * c_.G;
            const int32_t nt = it.end > it.start ? CeilDiv(it.end - it.start, c_.ST) : 0;
            // this core's rows: half each, the first ceil(M / 2) to sub-block 0 (at most RH_ = MP / 2),
            // so both vector cores work for any M > 1 (a split at MP / 2 left sub-block 1 idle for M <= 8)
            const int32_t first = CeilDiv(M, 2), r0 = sub_ ? first : 0, nr = sub_ ? M - first : first;
            // The update of a step runs after the next step's softmax (which the cube's QK, issued
            // before its P V of the step, makes ready), so the vector cores compute while the cube
            // multiplies: across items for 16-bit KV with one query row per request (two items'
            // state, by item parity), within an item for int8 KV (whose next item's q expansion
            // waits for this one's output). Several query rows with 16-bit KV keep the order
            // softmax, update, band per step (the band reads the step's probabilities from s).
            const bool lag = c_.quant || it.qLen == 1;
            const bool crossLag = !c_.quant && it.qLen == 1 && nt > 0;
            if (!crossLag) {
                Flush(pend);
            }
            par = Items() - 1 - par;  // alternate (int8 KV: always 0)
            StartItem(nr, par);
            if (c_.quant && nt > 0) {
                PrepQ(it, M, r0, nr);
            }
            for (int32_t j = 0; j < nt; j++) {
                Softmax(it, M, r0, nr, j, tile + j, par);
                Flush(pend);
                const bool last = j + 1 == nt;
                if (lag && (crossLag || !last)) {
                    pend = Pending{true, last, it, M, r0, nr, j, tile + j, par};
                } else {
                    Update(M, nr, r0, tile + j, par);
                    AddBand(it, r0, nr, j, par);
                    if (last) {
                        Finish(it, r0, nr, par);
                    }
                }
            }
            if (nt == 0) {
                Finish(it, r0, nr, par);
            }
            tile += nt;
        }
        Flush(pend);
    }

private:
    // sub-block 0 writes this AI core's zero row (read by the cube for masked pages); both set the flag
    __aicore__ inline void WriteZeroRow() {
        if (sub_ == 0) {
            LocalTensor<C> z = p_.Get<C>();
            Duplicate(z.template ReinterpretCast<half>(), half(0.0f), c_.D * int32_t(sizeof(C)) / 2);
            WaitFor<HardEvent::V_MTE3>();
            DataCopy(zGm_, z, uint32_t(c_.D));
            WaitFor<HardEvent::MTE3_V>();
        }
        CrossCoreSetFlag<2, PIPE_MTE3>(kFlagZero);
    }

    // int8 KV, once per item: the kvQuant rows of KV head h (row 3 becomes v_scale * v_offset), and
    // for this core's rows q' = q * k_scale expanded into kQSteps int8 rows (x = q' 127 / max|q'|,
    // x_0 = rint(x), x_i = rint(254 (x_{i-1} - x_0..)) -> the scratch rows i * M + r, flag Q;
    // rowMul_[r] = max|q'| / 127 (0 for a row below kTinyRow) and beta[r] = q'^ . k_offset with
    // q'^ = rowMul sum_i 254^-i x_i, what the cube multiplies (so the offset error is relative to the
    // dequantised K). NaN rule: a row whose q', or beta, is not finite (q, a K scale or a K offset
    // held NaN / inf) is rowBad_, its scores 0; Finish writes it NaN if it saw any position.
    __aicore__ inline void PrepQ(const MixItem& it, int32_t M, int32_t r0, int32_t nr) {
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
        vBad_ = false;
        if (nr > 0) {
            LocalTensor<float> qf = qf_.Get<float>(), e = qe_.Get<float>(), rec = qr_.Get<float>();
            LocalTensor<float> tmp = o_.Get<float>(), red = red_.Get<float>(), work = work_.Get<float>();
            LocalTensor<half> qh = qh_.Get<half>();
            LocalTensor<int8_t> qx = qx_.Get<int8_t>();
            const int32_t cnt = nr * D;
            // NaN rule: a NaN / inf V scale or offset makes every dequantised V value of the head
            // non-finite (0 * x is 0 for a finite x, NaN otherwise; read with the row maxima below)
            PipeBarrier<PIPE_V>();
            Muls(tmp, kvq[2 * D], 0.0f, 2 * D);
            PipeBarrier<PIPE_V>();
            ReduceSum(red[RHP_], tmp, work, 2 * D);
            Cast(qf, qt, RoundMode::CAST_NONE, uint32_t(cnt));
            PipeBarrier<PIPE_V>();
            for (int32_t r = 0; r < nr; r++) {
                Mul(qf[r * D], qf[r * D], kvq, D);
            }
            PipeBarrier<PIPE_V>();
            Muls(tmp, qf, -1.0f, cnt);  // |q'| = max(q', -q')
            PipeBarrier<PIPE_V>();
            Max(tmp, tmp, qf, cnt);
            PipeBarrier<PIPE_V>();
            RowsReduce<true>(red, tmp, e, nr, D);  // e: free until the q steps below
            WaitFor<HardEvent::V_S>();
            vBad_ = !IsFinite(red.GetValue(RHP_));
            float mul[kMaxVecRows];
            for (int32_t r = 0; r < nr; r++) {
                const float a = red.GetValue(2 * r);
                const bool tiny = !(a >= kTinyRow);  // NaN too
                rowBad_[r] = !IsFinite(a);
                rowMul_[r] = tiny || rowBad_[r] ? 0.0f : a / 127.0f;
                mul[r] = tiny || rowBad_[r] ? 0.0f : 127.0f / a;
            }
            WaitFor<HardEvent::S_V>();
            for (int32_t r = 0; r < nr; r++) {  // x = 127 q' / max|q'| in [-127, 127]; bad or tiny rows 0
                if (mul[r] > 0.0f) {
                    Muls(qf[r * D], qf[r * D], mul[r], D);
                } else {
                    Duplicate(qf[r * D], 0.0f, D);
                }
            }
            WaitFor<HardEvent::MTE3_V>();  // the previous item's copy-out of qx is done
            for (int32_t i = 0; i < kQSteps; i++) {
                PipeBarrier<PIPE_V>();
                Cast(e, qf, RoundMode::CAST_RINT, uint32_t(cnt));  // x_i, integral, in [-127, 127]
                PipeBarrier<PIPE_V>();
                Cast(qh, e, RoundMode::CAST_NONE, uint32_t(cnt));  // exact
                if (i == 0) {
                    Muls(rec, e, 1.0f, cnt);
                } else {  // rec += 254^-i x_i
                    Axpy(rec, e, i == 1 ? kInvStep : kInvStep * kInvStep, cnt);
                }
                if (i + 1 < kQSteps) {  // the residual, scaled: in [-127, 127]
                    Sub(qf, qf, e, cnt);
                    PipeBarrier<PIPE_V>();
                    Muls(qf, qf, kStep, cnt);
                }
                PipeBarrier<PIPE_V>();
                Cast(qx[i * cnt], qh, RoundMode::CAST_NONE, uint32_t(cnt));  // exact
            }
            PipeBarrier<PIPE_V>();
            for (int32_t r = 0; r < nr; r++) {
                Mul(tmp[r * D], rec[r * D], kvq[D], D);
            }
            PipeBarrier<PIPE_V>();
            RowsReduce<false>(red, tmp, e, nr, D);  // e: read for the last time above
            WaitFor<HardEvent::V_MTE3>();
            for (int32_t i = 0; i < kQSteps; i++) {
                DataCopy(qxGm_[(uint64_t(i) * M + r0) * D], qx[i * cnt], uint32_t(cnt));
            }
            WaitFor<HardEvent::V_S>();
            for (int32_t r = 0; r < nr; r++) {  // a NaN / inf K offset: the row's scores are not finite
                const float b = rowMul_[r] * red.GetValue(2 * r);
                rowBad_[r] = rowBad_[r] || !IsFinite(b);
                beta_[r] = rowBad_[r] ? 0.0f : b;
                rowMul_[r] = rowBad_[r] ? 0.0f : rowMul_[r];
            }
        }
        CrossCoreSetFlag<2, PIPE_MTE3>(kFlagQ);
    }

    struct Pending {
        bool on = false, last = false;  // a step waits for its update; it is its item's last
        MixItem it;
        int32_t M = 0, r0 = 0, nr = 0, j = 0, gTile = 0, par = 0;
    };
    // The pending step's update (and, after an item's last step, the item's output).
    __aicore__ inline void Flush(Pending& p) {
        if (!p.on) {
            return;
        }
        p.on = false;
        Update(p.M, p.nr, p.r0, p.gTile, p.par);
        AddBand(p.it, p.r0, p.nr, p.j, p.par);
        if (p.last) {
            Finish(p.it, p.r0, p.nr, p.par);
        }
    }

    __aicore__ inline void StartItem(int32_t nr, int32_t par) {
        if (nr > 0) {
            Duplicate(Acc(par), 0.0f, nr * c_.D);
            Duplicate(Blk(kM + cur_[par], par), kMaxStart, 16 * nr);
            Duplicate(Blk(kL, par), 0.0f, 16 * nr);
            Duplicate(Blk(kLR, par), 0.0f, 16 * nr);
        }
    }

    // The block vectors (see Init): per item parity the running max (two, alternating per step), l
    // and lr; then alpha (two: a step's alpha is read by its update, which runs after the next
    // step's softmax) and two sums.
    // (int8 KV: one item's state, as its items never overlap)
    static constexpr int32_t kM = 0, kL = 2, kLR = 3, kItemBlocks = 4;
    __aicore__ inline int32_t Items() const { return c_.quant ? 1 : 2; }
    __aicore__ inline int32_t AlphaBlk() const { return Items() * kItemBlocks; }
    __aicore__ inline int32_t SumBlk() const { return AlphaBlk() + 2; }
    __aicore__ inline int32_t Sum2Blk() const { return AlphaBlk() + 3; }
    __aicore__ inline int32_t NumBlocks() const { return AlphaBlk() + 4; }
    __aicore__ inline LocalTensor<float> Blk(int32_t which, int32_t par = 0) {
        return blk_.Get<float>()[(which + (which < kItemBlocks ? par * kItemBlocks : 0)) * RHP_ * 8];
    }
    __aicore__ inline LocalTensor<float> Acc(int32_t par) { return acc_.Get<float>()[par * RH_ * c_.D]; }

    // Row reductions of a tile: each of `nr` rows of n floats, packed at pitch n (row r at src[r n]),
    // summed (kMax: its maximum) into dst[2 r] (the pitch-2 slots Brcb spreads), in a number of
    // vector instructions that does not grow with nr. While a row holds more than 64 values,
    // BlockReduceSum / BlockReduceMax over the whole tile (repeats walk it contiguously, one value per
    // 32-byte block: a row of m values becomes m / 8, still whole blocks when m is a multiple of 64)
    // into tmp (at most n nr 9 / 64 floats), then one WholeReduceSum / WholeReduceMax with a repeat
    // per row (source repeat stride: the row pitch in blocks). A row width that does not stay whole
    // blocks (m > 64 not a multiple of 64 at some level: an item's last, partial tile, or a head dim
    // such as 80), or more rows than one instruction repeats, takes one count-mode ReduceSum /
    // ReduceMax per row instead (each waits for its own result); so do nr rows when nr is no more
    // than the levels (each level ends with a PipeBarrier, one drain, as a row's ReduceSum is, and the
    // levels take one instruction more). The caller orders src's writes
    // before (PipeBarrier) and reads dst after a PipeBarrier or a V -> S wait.
    template <bool kMax>
    __aicore__ inline void RowsReduce(const LocalTensor<float>& dst, const LocalTensor<float>& src,
                                      const LocalTensor<float>& tmp, int32_t nr, int32_t n) {
        int32_t m = n, levels = 0;
        bool block = nr <= kMaxRepeat && n % 8 == 0;
        while (block && m > 64) {
            block = m % 64 == 0;
            m /= 8;
            levels++;
        }
        if (!block || nr <= levels) {  // (nr <= levels: as few drains per row, and fewer instructions)
            LocalTensor<float> work = work_.Get<float>();
            for (int32_t r = 0; r < nr; r++) {
                if constexpr (kMax) {
                    ReduceMax(dst[2 * r], src[r * n], work, n);
                } else {
                    ReduceSum(dst[2 * r], src[r * n], work, n);
                }
            }
            return;
        }
        // levels: src -> tmp[0] -> tmp[half] -> tmp[0] ..., each output an eighth of its input
        const int32_t half = nr * n / 8;
        LocalTensor<float> in = src;
        int32_t cnt = nr * n, at = 0;
        for (int32_t l = 0; l < levels; l++) {
            LocalTensor<float> out = tmp[at];
            const int32_t reps = cnt / 64;
            for (int32_t k = 0; k < reps; k += kMaxRepeat) {
                const int32_t rk = Min(kMaxRepeat, reps - k);
                if constexpr (kMax) {
                    BlockReduceMax(out[k * 8], in[k * 64], rk, 64, 1, 1, 8);
                } else {
                    BlockReduceSum(out[k * 8], in[k * 64], rk, 64, 1, 1, 8);
                }
            }
            PipeBarrier<PIPE_V>();
            in = out;
            cnt /= 8;
            at = at == 0 ? half : 0;
        }
        if constexpr (kMax) {
            WholeReduceMax(dst, in, m, nr, 2, 1, m / 8, ReduceOrder::ORDER_ONLY_VALUE);
        } else {
            WholeReduceSum(dst, in, m, nr, 2, 1, m / 8);
        }
    }
    // Scratch of the softmax's row reductions: the P buffer (16-bit KV: free once the previous tile's
    // P copy-out has read it, MTE3 -> V), for int8 KV the P residual buffer (vector work only).
    __aicore__ inline LocalTensor<float> SoftmaxRedTmp() {
        return c_.quant ? pf_.Get<float>() : p_.Get<C>().template ReinterpretCast<float>();
    }

    // row[0, n) op= the 32-byte block `b` (a row's value broadcast): Sub or Mul, in at most two
    // instructions (whole 64-element repeats, then the tail), n a multiple of 8
    __aicore__ inline void RowOp(bool mul, const LocalTensor<float>& row, const LocalTensor<float>& b, int32_t n) {
        const BinaryRepeatParams bc(1, 1, 0, 8, 8, 0);
        const int32_t full = n / 64, tail = n % 64;
        if (full > 0) {
            if (mul) {
                Mul(row, row, b, 64, full, bc);
            } else {
                Sub(row, row, b, 64, full, bc);
            }
        }
        if (tail > 0) {
            if (mul) {
                Mul(row[full * 64], row[full * 64], b, uint64_t(tail), 1, bc);
            } else {
                Sub(row[full * 64], row[full * 64], b, uint64_t(tail), 1, bc);
            }
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

    __aicore__ inline void SoftCap(const LocalTensor<float>& s, int32_t cnt) {
        SoftCapInPlace(s, cap_.Get<float>(), c_.t.softCap, cnt);
    }

    // Tile j of the item: S rows -> P rows (the cube's dtype; int8 KV: kPSteps int8 rows each) in the
    // scratch, flag P; m, l, alpha updated.
    __aicore__ inline void Softmax(const MixItem& it, int32_t M, int32_t r0, int32_t nr, int32_t j, int32_t gTile,
                                   int32_t par) {
        const int32_t TT = c_.ST;  // a step's tokens
        const int32_t p0 = it.start + j * TT, n = Min(TT, it.end - p0), n16 = c_.Tail(n);  // int8: 32-aligned
        CrossCoreWaitFlag(kFlagS);
        if (nr == 0) {  // no rows on this vector core: keep the flag protocol
            CrossCoreSetFlag<2, PIPE_MTE3>(kFlagP);
            return;
        }
        LocalTensor<float> s = s_.Get<float>();
        const int32_t cnt = nr * n16;  // rows of n16 columns, packed
        const DataCopyParams rowsIn(static_cast<uint16_t>(nr), static_cast<uint16_t>(n16 / 8),
                                    static_cast<uint16_t>((TT - n16) / 8), 0);
        WaitFor<HardEvent::V_MTE2>();  // the previous tile's vector reads of s (int8 KV: si) are done
        if constexpr (IsSameType<A, float>::value) {
            DataCopy(s, sGm_[(gTile % 2) * c_.SR * TT + r0 * TT], rowsIn);
            WaitFor<HardEvent::MTE2_V>();
            Muls(s, s, c_.t.scale, cnt);
        } else {  // int8 KV: s = scale (max|q'| / 127 sum_i 254^-i S_i - beta), Horner from the last step
            static_assert(kQSteps == 3, "the Horner steps below are written for three q steps");
            LocalTensor<int32_t> si = si_.Get<int32_t>();
            LocalTensor<float> f = pf_.Get<float>(), g = si_.Get<float>()[2 * cnt];
            for (int32_t i = 0; i < kQSteps; i++) {
                DataCopy(si[i * cnt], sGm_[(gTile % 2) * c_.SR * TT + (uint64_t(i) * M + r0) * TT], rowsIn);
            }
            WaitFor<HardEvent::MTE2_V>();
            Cast(s, si[2 * cnt], RoundMode::CAST_NONE, uint32_t(cnt));  // exact: |S_i| < 2^24
            Cast(f, si[cnt], RoundMode::CAST_NONE, uint32_t(cnt));
            PipeBarrier<PIPE_V>();
            Axpy(f, s, kInvStep, cnt);  // S_1 + S_2 / 254
            Cast(g, si, RoundMode::CAST_NONE, uint32_t(cnt));  // S_0, over S_2's int32 rows (read above)
            PipeBarrier<PIPE_V>();
            Axpy(g, f, kInvStep, cnt);  // S_0 + (S_1 + S_2 / 254) / 254
            PipeBarrier<PIPE_V>();
            for (int32_t r = 0; r < nr; r++) {
                Muls(s[r * n16], g[r * n16], rowMul_[r] * c_.t.scale, n16);
            }
            if (c_.t.softCap > 0.0f) {  // the K offset on every column (the soft cap is not shift-invariant;
                PipeBarrier<PIPE_V>();    // without it the softmax is, and Finish shifts the lse instead)
                for (int32_t r = 0; r < nr; r++) {
                    Adds(s[r * n16], s[r * n16], -beta_[r] * c_.t.scale, n16);
                }
            }
        }
        PipeBarrier<PIPE_V>();
        // NaN rule, 16-bit KV: the visible scores are checked before the soft cap (which would make
        // -inf and +inf finite): the masked columns are set to 0 first, so a row's sum is NaN or inf
        // iff a score it sees is (q or K held NaN / inf); the sums are read with the row maxima
        // below. int8 KV needs no check per tile: integer products are finite, and a row whose q,
        // K scale or K offset is not finite is known from PrepQ (rowBad_, its scores 0).
        LocalTensor<float> red = red_.Get<float>(), rt = SoftmaxRedTmp();
        if (!c_.quant) {
            WaitFor<HardEvent::MTE3_V>();  // the previous tile's P copy-out has read p (rt below)
            Mask(it, s, r0, nr, p0, n, n16, 0.0f);
            RowsReduce<false>(red[RHP_], s, rt, nr, n16);
        }
        if (c_.t.softCap > 0.0f) {
            SoftCap(s, cnt);
        }
        Mask(it, s, r0, nr, p0, n, n16, kNegInf);
        // the rows' maxima (RowsReduce: all rows at once); the running max, alpha, l and lr as vectors
        // of row blocks (no round trip to the scalar unit per tile): m_new = max(m, rowmax),
        // alpha = exp(m - m_new), s - m_new by each row's block
        RowsReduce<true>(red, s, rt, nr, n16);
        const int32_t bn = 16 * nr;  // the rows' blocks, row r at block 2 r
        const uint8_t brep = static_cast<uint8_t>(CeilDiv(2 * nr, 8));
        LocalTensor<float> mOld = Blk(kM + cur_[par], par), mNew = Blk(kM + 1 - cur_[par], par);
        LocalTensor<float> aB = Blk(AlphaBlk() + gTile % 2), tB = Blk(SumBlk());
        PipeBarrier<PIPE_V>();
        Brcb(tB, red, brep, BrcbRepeatParams(1, 8));
        PipeBarrier<PIPE_V>();
        Max(mNew, mOld, tB, bn);  // >= kMaxStart: finite
        PipeBarrier<PIPE_V>();
        Sub(aB, mOld, mNew, bn);
        for (int32_t r = 0; r < nr; r++) {
            RowOp(false, s[r * n16], mNew[16 * r], n16);
        }
        PipeBarrier<PIPE_V>();
        Exp(aB, aB, bn);
        Exp(s, s, cnt);  // masked columns: exp(-inf) = 0
        PipeBarrier<PIPE_V>();
        cur_[par] = 1 - cur_[par];
        RowsReduce<false>(red, s, rt, nr, n16);
        LocalTensor<C> p = p_.Get<C>();
        if constexpr (sizeof(C) == 1) {
            // int8 KV: x = 127 p in [0, 127], x_0 = rint(x), x_1 = rint(254 (x - x_0)); lr sums
            // x_0 + x_1 / 254 (the P the cube multiplies, times 127 as the O rows): acc / lr = o.
            // Independent instructions share the stretches between barriers.
            static_assert(kPSteps == 2, "the steps below are written for two P steps");
            LocalTensor<float> f = pf_.Get<float>(), e = si_.Get<float>();
            LocalTensor<half> h = ph_.Get<half>();
            Muls(f, s, 127.0f, cnt);
            PipeBarrier<PIPE_V>();
            Cast(e, f, RoundMode::CAST_RINT, uint32_t(cnt));
            WaitFor<HardEvent::MTE3_V>();  // the previous tile's P copy-out has read p
            PipeBarrier<PIPE_V>();
            Sub(f, f, e, cnt);
            Cast(h, e, RoundMode::CAST_NONE, uint32_t(cnt));  // exact
            PipeBarrier<PIPE_V>();
            Muls(f, f, kStep, cnt);
            Cast(p, h, RoundMode::CAST_NONE, uint32_t(cnt));  // exact
            PipeBarrier<PIPE_V>();
            Cast(e[cnt], f, RoundMode::CAST_RINT, uint32_t(cnt));
            PipeBarrier<PIPE_V>();
            Cast(h[cnt], e[cnt], RoundMode::CAST_NONE, uint32_t(cnt));
            Axpy(e, e[cnt], kInvStep, cnt);
            PipeBarrier<PIPE_V>();
            Cast(p[cnt], h[cnt], RoundMode::CAST_NONE, uint32_t(cnt));
            RowsReduce<false>(red[RHP_], e, f, nr, n16);  // f: read for the last time above
            WaitFor<HardEvent::V_MTE3>();
            for (int32_t i = 0; i < kPSteps; i++) {
                DataCopy(pGm_[(gTile % 2) * c_.PR * TT + (uint64_t(i) * M + r0) * TT], p[i * cnt],
                         DataCopyParams(static_cast<uint16_t>(nr), static_cast<uint16_t>(n16 / 32), 0,
                                        static_cast<uint16_t>((TT - n16) / 32)));
            }
        } else {  // the previous tile's P copy-out has read p: waited before the reductions above (a
                  // V write after the sums' V reads of p is in order)
            if constexpr (!IsSameType<C, half>::value) {
                Cast(p, s, RoundMode::CAST_RINT, uint32_t(cnt));
            } else {
                Cast(p, s, RoundMode::CAST_NONE, uint32_t(cnt));
            }
            WaitFor<HardEvent::V_MTE3>();
            DataCopy(pGm_[(gTile % 2) * c_.PR * TT + r0 * TT], p,
                     DataCopyParams(static_cast<uint16_t>(nr), static_cast<uint16_t>(n16 * sizeof(C) / 32), 0,
                                    static_cast<uint16_t>((TT - n16) * sizeof(C) / 32)));
        }
        CrossCoreSetFlag<2, PIPE_MTE3>(kFlagP);
        // l = l alpha + rowsum; int8 KV: lr = lr alpha + its sums; 16-bit KV: l += 0 * (the visible
        // scores' sum), NaN exactly when a score the row sees was NaN / inf (sticky, as l alpha + ...)
        LocalTensor<float> lB = Blk(kL, par), lrB = Blk(kLR, par), cB = Blk(Sum2Blk());
        PipeBarrier<PIPE_V>();
        Brcb(tB, red, brep, BrcbRepeatParams(1, 8));
        Brcb(cB, red[RHP_], brep, BrcbRepeatParams(1, 8));
        Mul(lB, lB, aB, bn);
        if (c_.quant) {
            Mul(lrB, lrB, aB, bn);
        }
        PipeBarrier<PIPE_V>();
        Add(lB, lB, tB, bn);
        if (c_.quant) {
            Add(lrB, lrB, cB, bn);
        } else {
            Muls(cB, cB, 0.0f, bn);
            PipeBarrier<PIPE_V>();
            Add(lB, lB, cB, bn);
        }
    }

    // acc = acc * alpha + O for the rows of this vector core (after the cube's flag O); int8 KV:
    // O = O_0 + O_1 / 254 from the int32 rows of the kPSteps blocks.
    __aicore__ inline void Update(int32_t M, int32_t nr, int32_t r0, int32_t gTile, int32_t par) {
        const int32_t D = c_.D, cnt = nr * D;
        CrossCoreWaitFlag(kFlagO);
        if (nr == 0) {
            return;
        }
        LocalTensor<float> o = o_.Get<float>(), acc = Acc(par);
        const uint64_t slot = uint64_t(gTile % 2) * c_.PR * D;
        WaitFor<HardEvent::V_MTE2>();
        if constexpr (IsSameType<A, float>::value) {
            DataCopy(o, oGm_[slot + r0 * D], uint32_t(cnt));
        } else {
            LocalTensor<int32_t> oi = oi_.Get<int32_t>();
            for (int32_t i = 0; i < kPSteps; i++) {
                DataCopy(oi[i * cnt], oGm_[slot + (uint64_t(i) * M + r0) * D], uint32_t(cnt));
            }
        }
        LocalTensor<float> aB = Blk(AlphaBlk() + gTile % 2);
        for (int32_t r = 0; r < nr; r++) {  // acc * alpha, each row by its block
            RowOp(true, acc[r * D], aB[16 * r], D);
        }
        WaitFor<HardEvent::MTE2_V>();
        if constexpr (!IsSameType<A, float>::value) {
            LocalTensor<int32_t> oi = oi_.Get<int32_t>();
            LocalTensor<float> f = of_.Get<float>();
            Cast(f, oi[cnt], RoundMode::CAST_NONE, uint32_t(cnt));  // exact: |O_i| < 2^24
            Cast(o, oi, RoundMode::CAST_NONE, uint32_t(cnt));
            PipeBarrier<PIPE_V>();
            Axpy(o, f, kInvStep, cnt);  // O_0 + O_1 / 254
        }
        PipeBarrier<PIPE_V>();
        Add(acc, acc, o, cnt);
        PipeBarrier<PIPE_V>();
    }

    // Several query rows (MTP): the causal band's V rows (positions the request's first query row
    // cannot see) were zero in the cube's P V, so that no row multiplies a value it cannot see by 0;
    // here each row adds p * v of the band positions it sees (Axpy, p from the tile's probabilities,
    // still in s). A masked page contributes nothing.
    __aicore__ inline void AddBand(const MixItem& it, int32_t r0, int32_t nr, int32_t j, int32_t par) {
        const int32_t D = c_.D, p0 = it.start + j * c_.ST, n = Min(c_.ST, it.end - p0);
        const int32_t a = Max(p0, it.seqLen - it.qLen + 1);
        if (c_.quant || it.qLen <= 1 || nr == 0 || a >= p0 + n) {  // int8 KV: the cube's integer P V has it
            return;
        }
        const int32_t n16 = RoundUp(n, 16), ps = c_.t.pageSize;
        LocalTensor<float> s = s_.Get<float>(), acc = Acc(par), vf = vf_.Get<float>();
        WaitFor<HardEvent::V_S>();  // the probabilities in s are readable
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

    // One V row of the cache (element offset off) -> vf as float32.
    __aicore__ inline void LoadBandRow(uint64_t off, const LocalTensor<float>& vf) {
        const int32_t D = c_.D;
        WaitFor<HardEvent::V_MTE2>();  // the previous band row's Cast has read vb
        LocalTensor<T> vb = vb_.Get<T>();
        DataCopy(vb, vGm_[off], uint32_t(D));
        WaitFor<HardEvent::MTE2_V>();
        Cast(vf, vb, RoundMode::CAST_NONE, uint32_t(D));
        PipeBarrier<PIPE_V>();
    }

    // o = acc / l and lse = m + ln l of each row -> the item's partial slot (o = 0, lse = -inf for a
    // row that saw nothing).
    __aicore__ inline void Finish(const MixItem& it, int32_t r0, int32_t nr, int32_t par) {
        const int32_t D = c_.D, G = c_.G;
        LocalTensor<float> acc = Acc(par);
        // the running state to the scalar unit (one round trip per item); NaN rule, 16-bit KV: a NaN
        // / inf value row the row saw reached its accumulator (the rows' sums); int8 values are
        // finite (their scales: vBad_)
        if (nr > 0) {
            LocalTensor<float> red = red_.Get<float>();
            LocalTensor<float> mB = Blk(kM + cur_[par], par), lB = Blk(kL, par), lrB = Blk(kLR, par);
            PipeBarrier<PIPE_V>();  // acc's and the blocks' last writes
            if (!c_.quant) {  // scratch: o (the last update has read it)
                RowsReduce<false>(red[RHP_], acc, o_.Get<float>(), nr, D);
            }
            WaitFor<HardEvent::V_S>();
            for (int32_t r = 0; r < nr; r++) {
                m_[r] = mB.GetValue(16 * r);
                l_[r] = lB.GetValue(16 * r);
                lr_[r] = c_.quant ? lrB.GetValue(16 * r) : l_[r];
                if (!c_.quant && !IsFinite(red.GetValue(RHP_ + 2 * r))) {
                    l_[r] = kNaN;
                }
            }
        }
        for (int32_t r = 0; r < nr; r++) {
            const int32_t row = r0 + r, qi = row / G, g = row % G;
            LocalTensor<float> o = outQ_.template AllocTensor<float>();
            if (l_[r] != l_[r] || (l_[r] > 0.0f && (vBad_ || (c_.quant && rowBad_[r])))) {  // NaN (conventions)
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
                // int8 KV without a soft cap: the scores kept the K offset term, which the lse drops here
                const float shift = c_.quant && !(c_.t.softCap > 0.0f) ? -beta_[r] * c_.t.scale : 0.0f;
                Adds(o[D], o[D], m_[r] + shift, kLseRepeat);
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
    int32_t cur_[2] = {0, 0};  // per item parity: which running-max block vector is current
    float m_[kMaxVecRows], l_[kMaxVecRows], beta_[kMaxVecRows];  // m_, l_, lr_: read at the item's end
    float lr_[kMaxVecRows];      // the sum of P as the cube multiplies it (int8 KV: x_0 + x_1 / 254), else l_
    float rowMul_[kMaxVecRows];  // int8 KV: max|q'| / 127 of each row
    bool rowBad_[kMaxVecRows];   // int8 KV: the row's q', or its K offset term, is NaN or inf
    bool vBad_ = false;          // int8 KV: a V scale or offset of the item's KV head is NaN or inf
    TPipe pipe_;
    TBuf<TPosition::VECCALC> s_, p_, o_, acc_, red_, blk_, work_, cap_, ob_, vb_, vf_;
    TBuf<TPosition::VECCALC> qT_, qf_, qe_, qr_, qh_, qx_, kvq_, si_, pf_, ph_, oi_, of_;  // int8 KV only
    TQue<TPosition::VECOUT, 2> outQ_;
    GlobalTensor<C> pGm_, zGm_;
    GlobalTensor<A> sGm_, oGm_;
    GlobalTensor<T> outGm_, qGm_, vGm_;
    GlobalTensor<int8_t> qxGm_;
    GlobalTensor<float> wsO_, wsL_, lseGm_, quantGm_;
};

}  // namespace splitkv

// T: q's dtype; C: the cube's input (T, or int8_t for int8 KV); A: the cube's accumulator
template <typename T, typename C, typename A>
__aicore__ inline void RunSplitMix(GM_ADDR q, GM_ADDR k, GM_ADDR v, GM_ADDR bt, GM_ADDR kvQuant, GM_ADDR plan,
                                   GM_ADDR ws, const SplitKVTiling& t, GM_ADDR out = nullptr, GM_ADDR lse = nullptr) {
    if ASCEND_IS_AIC {
        splitkv::MixCube<C, A> op;
        op.Init(q, k, v, bt, plan, ws, t);
        op.Process();
    }
    if ASCEND_IS_AIV {
        splitkv::MixVec<T, C, A> op;
        op.Init(v, bt, plan, ws, t, out, lse);
        if (t.kvDtype == SPLITKV_DT_INT8) {
            op.InitQuant(q, kvQuant);
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
    const bool i8 = t.kvDtype == SPLITKV_DT_INT8;
    if (t.qDtype == SPLITKV_DT_FLOAT16) {
        if (i8) {
            RunSplitMix<half, int8_t, int32_t>(q, kCache, vCache, blockTable, kvQuant, plan, workspace, t);
        } else {
            RunSplitMix<half, half, float>(q, kCache, vCache, blockTable, kvQuant, plan, workspace, t);
        }
    } else if (i8) {
        RunSplitMix<bfloat16_t, int8_t, int32_t>(q, kCache, vCache, blockTable, kvQuant, plan, workspace, t);
    } else {
        RunSplitMix<bfloat16_t, bfloat16_t, float>(q, kCache, vCache, blockTable, kvQuant, plan, workspace, t);
    }
}

// The fused launch: the mixed split stage, SyncAll (cube and vector cores), then the combine on the
// 2 * blockDim vector cores in the same launch (as IFA), saving the second launch. Same buffers as
// splitkv_split_mix followed by splitkv_combine.
template <typename T, typename C, typename A>
__aicore__ inline void RunAttentionMix(GM_ADDR q, GM_ADDR k, GM_ADDR v, GM_ADDR bt, GM_ADDR kvQuant, GM_ADDR plan,
                                       GM_ADDR ws, GM_ADDR out, GM_ADDR lse, const SplitKVTiling& t) {
    RunSplitMix<T, C, A>(q, k, v, bt, kvQuant, plan, ws, t, out, lse);  // rows with one split: written directly
    // the combine's first unit (row, KV head): its splits are read from the plan (fixed for the
    // launch) before the barrier, so that the partials' loads are the first thing after it
    const int32_t first = static_cast<int32_t>(GetBlockIdx());
    int32_t s0 = 0, ns = -1;
    if ASCEND_IS_AIV {
        if (first < t.numRows * t.numKVHeads) {
            GlobalTensor<int32_t> planGm;
            planGm.SetGlobalBuffer(reinterpret_cast<__gm__ int32_t*>(plan), uint64_t(t.planWords));
            splitkv::RowSplits(planGm, t, first / t.numKVHeads, s0, ns);
        }
    }
    SyncAll<false>();
    if ASCEND_IS_AIV {
        PipeBarrier<PIPE_ALL>();  // the split stage's UB use is over before the combine's pipe reuses it
        splitkv::CombineStage<T> op;
        op.Init(ws, plan, out, lse, t);
        op.Process(first, static_cast<int32_t>(GetBlockNum() * GetTaskRation()), true, s0, ns);
    }
}

extern "C" __global__ __aicore__ void splitkv_attention_mix(GM_ADDR q, GM_ADDR kCache, GM_ADDR vCache,
                                                            GM_ADDR blockTable, GM_ADDR kvQuant, GM_ADDR plan,
                                                            GM_ADDR workspace, GM_ADDR tiling, GM_ADDR out,
                                                            GM_ADDR lse) {
    KERNEL_TASK_TYPE_DEFAULT(KERNEL_TYPE_MIX_AIC_1_2);
    SplitKVTiling t;
    splitkv::LoadTiling(tiling, t);
    const bool i8 = t.kvDtype == SPLITKV_DT_INT8;
    if (t.qDtype == SPLITKV_DT_FLOAT16) {
        if (i8) {
            RunAttentionMix<half, int8_t, int32_t>(q, kCache, vCache, blockTable, kvQuant, plan, workspace, out, lse, t);
        } else {
            RunAttentionMix<half, half, float>(q, kCache, vCache, blockTable, kvQuant, plan, workspace, out, lse, t);
        }
    } else if (i8) {
        RunAttentionMix<bfloat16_t, int8_t, int32_t>(q, kCache, vCache, blockTable, kvQuant, plan, workspace, out, lse, t);
    } else {
        RunAttentionMix<bfloat16_t, bfloat16_t, float>(q, kCache, vCache, blockTable, kvQuant, plan, workspace, out, lse,
                                                       t);
    }
}
