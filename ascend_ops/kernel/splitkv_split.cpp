// Split stage of split-KV decode attention (Ascend C, vector cores only).
//
// Work items (request b, KV head h, split j, KV range [start, end)) come from the shared plan, or
// in graph mode (deviceSplitTokens > 0) from the grid over seqLens (splitkv_tiling.h);
// block k takes items k, k + blockNum, k + 2 * blockNum, ... For each item and each chunk of
// its query rows (q row i x group head g), K and V tiles of `tileTokens` positions are copied
// page by page through the block table (GM -> UB, two buffers per queue so the copy of tile t+1
// overlaps the compute of tile t), scores and an online softmax are computed in float32, and the
// partial (o = u / l, lse = m + ln l) of every row is written to the workspace slot
// rowSlot[row] + j. A row that sees no position of the range writes o = 0, lse = -inf; no
// exp(-inf - -inf) is ever formed (a tile's running max is taken over visible positions only).
// A row that sees a NaN or inf (in q, K or V) writes o = NaN, lse = NaN (docs/conventions.md):
// the sum of its visible scores (before the soft cap) and of its accumulator are checked.
// A block-table entry outside [0, numPages) is masked (docs/conventions.md, "Page ids"): its page
// is never copied, and its positions are invisible (each row updates over the runs of positions
// in valid pages only).
// Design and UB budget: docs/ascend-kernel.md.
#include "splitkv_kernel_common.h"

using namespace AscendC;

namespace splitkv {

template <typename QT, typename KVT>
class SplitStage {
public:
    __aicore__ inline void Init(GM_ADDR q, GM_ADDR k, GM_ADDR v, GM_ADDR blockTable, GM_ADDR kvQuant, GM_ADDR plan,
                                GM_ADDR workspace, const SplitKVTiling& t) {
        t_ = t;
        G_ = t.groupSize;
        D_ = t.headDim;
        TT_ = t.tileTokens;
        KR_ = t.kvRowElems;
        QR_ = t.qRowElems;
        RE_ = t.rowElems;
        R_ = t.rowChunk;
        const uint64_t kvElems = uint64_t(t.numPages) * t.pageSize * t.numKVHeads * t.headDim;
        qGm_.SetGlobalBuffer(reinterpret_cast<__gm__ QT*>(q), uint64_t(t.numRows) * t.numQHeads * t.headDim);
        kGm_.SetGlobalBuffer(reinterpret_cast<__gm__ KVT*>(k), kvElems);
        vGm_.SetGlobalBuffer(reinterpret_cast<__gm__ KVT*>(v), kvElems);
        btGm_.SetGlobalBuffer(reinterpret_cast<__gm__ int32_t*>(blockTable), uint64_t(t.batch) * t.maxPages);
        planGm_.SetGlobalBuffer(reinterpret_cast<__gm__ int32_t*>(plan), uint64_t(t.planWords));
        ws_ = workspace;
        wsO_.SetGlobalBuffer(reinterpret_cast<__gm__ float*>(workspace + SPLITKV_ERROR_BYTES),
                             uint64_t(t.numSlots) * t.numQHeads * t.headDim);
        wsL_.SetGlobalBuffer(reinterpret_cast<__gm__ float*>(workspace + t.lseOffsetBytes),
                             uint64_t(t.numSlots) * t.numQHeads * kLseRepeat);
        if constexpr (kInt8) {
            quantGm_.SetGlobalBuffer(reinterpret_cast<__gm__ float*>(kvQuant), uint64_t(4) * t.numKVHeads * t.headDim);
        }

        const uint32_t kvTile = uint32_t(TT_) * KR_ * sizeof(KVT);
        pipe_.InitBuffer(inK_, 2, kvTile);
        pipe_.InitBuffer(inV_, 2, kvTile);
        if constexpr (!kFloatKV) {
            pipe_.InitBuffer(kf_, uint32_t(TT_) * KR_ * sizeof(float));
            pipe_.InitBuffer(vf_, uint32_t(TT_) * KR_ * sizeof(float));
        }
        if constexpr (kInt8) {
            pipe_.InitBuffer(h16_, uint32_t(TT_) * KR_ * sizeof(half));
            pipe_.InitBuffer(quant_, 4u * KR_ * sizeof(float));
        }
        if constexpr (!kFloatQ) {
            pipe_.InitBuffer(qIn_, 1, uint32_t(R_) * QR_ * sizeof(QT));
        }
        pipe_.InitBuffer(qf_, uint32_t(R_) * QR_ * sizeof(float));
        pipe_.InitBuffer(acc_, uint32_t(R_) * RE_ * sizeof(float));
        pipe_.InitBuffer(stat_, 2u * RoundUp(R_, 8) * sizeof(float));
        pipe_.InitBuffer(sc_, uint32_t(RoundUp(TT_, 8)) * sizeof(float));
        pipe_.InitBuffer(prod_, uint32_t(RE_) * sizeof(float));
        pipe_.InitBuffer(red_, kBlockBytes);
        pipe_.InitBuffer(tmp_, kBlockBytes);
        pipe_.InitBuffer(work_, uint32_t(RoundUp(2 * CeilDiv(Max(TT_, D_), 64), 8)) * sizeof(float));
        if (t.softCap > 0.0f) {
            pipe_.InitBuffer(cap_, uint32_t(RoundUp(TT_, 8)) * sizeof(float));
        }
        pipe_.InitBuffer(outQ_, 2, uint32_t(RE_ + kLseRepeat) * sizeof(float));
    }

    __aicore__ inline void Process() {
        const int32_t nb = static_cast<int32_t>(GetBlockNum());
        for (int32_t w = static_cast<int32_t>(GetBlockIdx()); w < t_.numItems; w += nb) {
            Item it;
            const bool ok = LoadItem(planGm_, t_, w, it);
            if (t_.deviceSplitTokens > 0 && it.split == 0 && it.h == 0) {
                err_.Length(t_, it.b, it.seqLen);  // graph mode: each request's device length, once
            }
            if (!ok) {
                continue;  // padding, no query rows, or (graph mode) outside the request's splits
            }
            if constexpr (kInt8) {
                LoadQuant(it.h);
            }
            const int32_t rows = it.qLen * G_;
            for (int32_t c0 = 0; c0 < rows; c0 += R_) {
                RunChunk(it, c0, Min(R_, rows - c0));
            }
        }
        err_.Flush(ws_, static_cast<int32_t>(GetBlockIdx()));
    }

private:
    static constexpr bool kFloatQ = sizeof(QT) == 4;
    static constexpr bool kFloatKV = sizeof(KVT) == 4;
    static constexpr bool kInt8 = sizeof(KVT) == 1;

    struct Item {
        int32_t b, h, split, start, end, row0, qLen, seqLen;
    };

    // k scale, k offset, v scale, v offset rows of KV head h -> quant_ rows 0..3 (float, KR_ stride;
    // only the first D_ of each row are ever read).
    __aicore__ inline void LoadQuant(int32_t h) {
        LocalTensor<float> qt = quant_.Get<float>();
        WaitFor<HardEvent::V_MTE2>();  // the previous item's vector reads of quant_ are done
        const uint8_t pad = static_cast<uint8_t>(RE_ - D_);
        for (int32_t s = 0; s < 4; s++) {
            DataCopyExtParams cp(1, uint32_t(D_) * sizeof(float), 0, 0, 0);
            DataCopyPadExtParams<float> pp(true, 0, pad, 0.0f);
            DataCopyPad(qt[s * KR_], quantGm_[(uint64_t(s) * t_.numKVHeads + h) * D_], cp, pp);
        }
        WaitFor<HardEvent::MTE2_V>();
    }

    // Query rows c0 .. c0 + nr of the item (row r = q row r / G, head h * G + r % G) -> qf_ (float).
    __aicore__ inline void LoadQ(const Item& it, int32_t c0, int32_t nr) {
        LocalTensor<float> qf = qf_.Get<float>();
        LocalTensor<QT> dst;
        if constexpr (kFloatQ) {
            dst = qf.template ReinterpretCast<QT>();
        } else {
            dst = qIn_.template AllocTensor<QT>();
        }
        const uint8_t pad = static_cast<uint8_t>(QR_ - D_);
        int32_t r = c0;
        while (r < c0 + nr) {
            const int32_t qi = r / G_, g = r % G_;
            const int32_t run = Min(G_ - g, c0 + nr - r);
            const uint64_t off = (uint64_t(it.row0 + qi) * t_.numQHeads + uint64_t(it.h) * G_ + g) * D_;
            DataCopyExtParams cp(static_cast<uint16_t>(run), uint32_t(D_) * sizeof(QT), 0, 0, 0);
            DataCopyPadExtParams<QT> pp(true, 0, pad, QT(0.0f));
            DataCopyPad(dst[(r - c0) * QR_], qGm_[off], cp, pp);
            r += run;
        }
        if constexpr (kFloatQ) {
            WaitFor<HardEvent::MTE2_V>();
        } else {
            qIn_.EnQue(dst);
            LocalTensor<QT> staged = qIn_.template DeQue<QT>();
            Cast(qf, staged, RoundMode::CAST_NONE, uint32_t(nr) * QR_);
            qIn_.FreeTensor(staged);
        }
    }

    // Positions [p0, p0 + n) of request b, KV head h -> one K and one V tile (rows of KR_ elements).
    __aicore__ inline void CopyTileIn(const Item& it, int32_t p0, int32_t n) {
        LocalTensor<KVT> kt = inK_.template AllocTensor<KVT>();
        LocalTensor<KVT> vt = inV_.template AllocTensor<KVT>();
        const uint8_t pad = static_cast<uint8_t>(KR_ - D_);
        const uint32_t rowBytes = uint32_t(D_) * sizeof(KVT);
        const uint32_t gapBytes = uint32_t(t_.numKVHeads - 1) * rowBytes;
        bool zeroed = false;
        int32_t p = p0;
        while (p < p0 + n) {
            const int32_t page = PageAt(it, p);
            const int32_t inPage = p % t_.pageSize;
            const int32_t cnt = Min(t_.pageSize - inPage, p0 + n - p);
            if (PageOk(page)) {  // a masked page is not copied (its rows are never read: RowTile)
                const uint64_t off = ((uint64_t(page) * t_.pageSize + inPage) * t_.numKVHeads + it.h) * D_;
                DataCopyExtParams cp(static_cast<uint16_t>(cnt), rowBytes, gapBytes, 0, 0);
                DataCopyPadExtParams<KVT> pp(true, 0, pad, KVT(0));
                DataCopyPad(kt[(p - p0) * KR_], kGm_[off], cp, pp);
                DataCopyPad(vt[(p - p0) * KR_], vGm_[off], cp, pp);
            } else {  // zeros instead, so that every byte the tile's conversions read is defined
                err_.Page(it.b, p / t_.pageSize, page);
                const uint32_t halves = uint32_t(cnt) * KR_ * sizeof(KVT) / 2;
                Duplicate(kt[(p - p0) * KR_].template ReinterpretCast<half>(), half(0), halves);
                Duplicate(vt[(p - p0) * KR_].template ReinterpretCast<half>(), half(0), halves);
                zeroed = true;
            }
            p += cnt;
        }
        if (zeroed) {
            PipeBarrier<PIPE_V>();  // the zeros land before the conversions read the tile
        }
        inK_.EnQue(kt);
        inV_.EnQue(vt);
    }

    // Tile in KV dtype -> float rows (int8: (x - offset) * scale, per channel).
    __aicore__ inline LocalTensor<float> ToFloat(LocalTensor<KVT>& raw, TBuf<TPosition::VECCALC>& f, int32_t n,
                                                 int32_t scaleRow) {
        if constexpr (kFloatKV) {
            return raw.template ReinterpretCast<float>();
        } else {
            LocalTensor<float> out = f.Get<float>();
            const uint32_t cnt = uint32_t(n) * KR_;
            if constexpr (kInt8) {
                LocalTensor<half> h = h16_.Get<half>();
                Cast(h, raw, RoundMode::CAST_NONE, cnt);
                PipeBarrier<PIPE_V>();
                Cast(out, h, RoundMode::CAST_NONE, cnt);
                PipeBarrier<PIPE_V>();
                LocalTensor<float> qt = quant_.Get<float>();
                for (int32_t j = 0; j < n; j++) {
                    Sub(out[j * KR_], out[j * KR_], qt[(scaleRow + 1) * KR_], D_);
                    PipeBarrier<PIPE_V>();
                    Mul(out[j * KR_], out[j * KR_], qt[scaleRow * KR_], D_);
                }
                PipeBarrier<PIPE_V>();
            } else {
                Cast(out, raw, RoundMode::CAST_NONE, cnt);
                PipeBarrier<PIPE_V>();
            }
            return out;
        }
    }

    __aicore__ inline void RunChunk(const Item& it, int32_t c0, int32_t nr) {
        LoadQ(it, c0, nr);
        LocalTensor<float> acc = acc_.Get<float>();
        LocalTensor<float> stat = stat_.Get<float>();
        const int32_t mBase = 0, lBase = RoundUp(R_, 8);
        Duplicate(acc, 0.0f, nr * RE_);
        for (int32_t r = 0; r < nr; r++) {
            stat.SetValue(mBase + r, kNegInf);
            stat.SetValue(lBase + r, 0.0f);
        }
        PipeBarrier<PIPE_V>();

        const int32_t numTiles = CeilDiv(it.end - it.start, TT_);
        if (numTiles > 0) {
            CopyTileIn(it, it.start, Min(TT_, it.end - it.start));
        }
        for (int32_t tile = 0; tile < numTiles; tile++) {
            const int32_t p0 = it.start + tile * TT_;
            const int32_t n = Min(TT_, it.end - p0);
            if (tile + 1 < numTiles) {  // prefetch: the copy engine fills the second buffer meanwhile
                const int32_t p1 = p0 + TT_;
                CopyTileIn(it, p1, Min(TT_, it.end - p1));
            }
            LocalTensor<KVT> kt = inK_.template DeQue<KVT>();
            LocalTensor<KVT> vt = inV_.template DeQue<KVT>();
            LocalTensor<float> kf = ToFloat(kt, kf_, n, 0);
            LocalTensor<float> vf = ToFloat(vt, vf_, n, 2);
            for (int32_t r = 0; r < nr; r++) {
                RowTile(it, c0 + r, r, p0, n, kf, vf);
            }
            inK_.FreeTensor(kt);
            inV_.FreeTensor(vt);
        }
        WriteRows(it, c0, nr);
    }

    __aicore__ inline int32_t PageAt(const Item& it, int32_t p) {
        return btGm_.GetValue(uint64_t(it.b) * t_.maxPages + p / t_.pageSize);
    }
    __aicore__ inline bool PageOk(int32_t page) const { return page >= 0 && page < t_.numPages; }

    // Online softmax update of local row r (item row `row`) with the visible part of one tile: its
    // window and causal range, less the positions of masked pages (one update per run of valid pages).
    __aicore__ inline void RowTile(const Item& it, int32_t row, int32_t r, int32_t p0, int32_t n,
                                   const LocalTensor<float>& kf, const LocalTensor<float>& vf) {
        const int32_t qi = row / G_;
        const int32_t qpos = it.seqLen - it.qLen + qi;  // the query's own position
        const int32_t lo = t_.windowLeft >= 0 ? qpos - t_.windowLeft : 0;
        const int32_t js = Max(p0, lo) - p0;
        const int32_t je = Min(p0 + n, qpos + 1) - p0;
        int32_t a = js;
        while (a < je) {  // [a, b): positions in consecutive valid pages
            int32_t b = a;
            while (b < je && PageOk(PageAt(it, p0 + b))) {
                b = Min(je, ((p0 + b) / t_.pageSize + 1) * t_.pageSize - p0);
            }
            if (b > a) {
                RowRun(r, a, b, kf, vf);
                a = b;
            } else {  // a masked page: skip to its end
                a = Min(je, ((p0 + a) / t_.pageSize + 1) * t_.pageSize - p0);
            }
        }
    }

    // The update of local row r with tile positions [js, je), all visible.
    __aicore__ inline void RowRun(int32_t r, int32_t js, int32_t je, const LocalTensor<float>& kf,
                                  const LocalTensor<float>& vf) {
        const int32_t c = je - js;
        LocalTensor<float> qrow = qf_.Get<float>()[r * QR_];
        LocalTensor<float> sc = sc_.Get<float>();
        LocalTensor<float> prod = prod_.Get<float>();
        LocalTensor<float> red = red_.Get<float>();
        LocalTensor<float> tmp = tmp_.Get<float>();
        LocalTensor<float> work = work_.Get<float>();
        LocalTensor<float> stat = stat_.Get<float>();
        LocalTensor<float> accRow = acc_.Get<float>()[r * RE_];

        // s_j = scale * <q, k_j> (then the soft cap), j over the visible positions
        for (int32_t j = 0; j < c; j++) {
            Mul(prod, qrow, kf[(js + j) * KR_], D_);
            PipeBarrier<PIPE_V>();
            ReduceSum(sc[j], prod, work, D_);
            PipeBarrier<PIPE_V>();
        }
        Muls(sc, sc, t_.scale, c);
        PipeBarrier<PIPE_V>();
        // non-finite check of the visible scores, before the soft cap (which would turn -inf and
        // +inf into finite values): their sum is NaN or inf iff one of them is (K or q held NaN or
        // inf); read with the running max below (no extra round trip)
        ReduceSum(tmp, sc, work, c);
        if (t_.softCap > 0.0f) {  // cap * tanh(s / cap), accurate for any cap (SoftCapInPlace)
            SoftCapInPlace(sc, cap_.Get<float>(), t_.softCap, c);
        }
        // running max over visible scores only: m_new is finite, so exp(s - m_new) is safe
        ReduceMax(red, sc, work, c);
        WaitFor<HardEvent::V_S>();
        const int32_t lBase = RoundUp(R_, 8);
        if (!IsFinite(tmp.GetValue(0))) {
            stat.SetValue(lBase + r, kNaN);  // the row saw a NaN / inf: NaN from here on (sticky)
            return;
        }
        const float mOld = stat.GetValue(r);
        const float mTile = red.GetValue(0);
        const float mNew = mOld > mTile ? mOld : mTile;
        Adds(sc, sc, -mNew, c);
        PipeBarrier<PIPE_V>();
        Exp(sc, sc, c);
        PipeBarrier<PIPE_V>();
        ReduceSum(red, sc, work, c);
        float alpha = 0.0f;  // exp(mOld - mNew); 0 when nothing was seen before (acc is 0 then)
        if (mOld != kNegInf) {
            Duplicate(tmp, mOld - mNew, kLseRepeat);
            PipeBarrier<PIPE_V>();
            Exp(tmp, tmp, kLseRepeat);
        }
        WaitFor<HardEvent::V_S>();
        const float lTile = red.GetValue(0);
        if (mOld != kNegInf) {
            alpha = tmp.GetValue(0);
            Muls(accRow, accRow, alpha, D_);
            PipeBarrier<PIPE_V>();
        }
        stat.SetValue(r, mNew);
        stat.SetValue(lBase + r, stat.GetValue(lBase + r) * alpha + lTile);
        // u += p_j * v_j
        for (int32_t j = 0; j < c; j++) {
            const float p = sc.GetValue(j);
            Axpy(accRow, vf[(js + j) * KR_], p, D_);
            PipeBarrier<PIPE_V>();
        }
    }

    // o = u / l and lse = m + ln(l) (or 0 and -inf) of rows c0 .. c0 + nr -> workspace.
    __aicore__ inline void WriteRows(const Item& it, int32_t c0, int32_t nr) {
        LocalTensor<float> acc = acc_.Get<float>();
        LocalTensor<float> stat = stat_.Get<float>();
        LocalTensor<float> red = red_.Get<float>();
        LocalTensor<float> work = work_.Get<float>();
        const int32_t lBase = RoundUp(R_, 8);
        for (int32_t r = 0; r < nr; r++) {
            const int32_t row = c0 + r, qi = row / G_, g = row % G_;
            // a NaN / inf value row v_j the row saw reached its accumulator: NaN / inf in the sum
            ReduceSum(red, acc[r * RE_], work, D_);
            WaitFor<HardEvent::V_S>();
            const float m = stat.GetValue(r);
            const float l = IsFinite(red.GetValue(0)) ? stat.GetValue(lBase + r) : kNaN;
            LocalTensor<float> o = outQ_.template AllocTensor<float>();
            if (l != l) {  // NaN rule (docs/conventions.md): out and lse NaN
                Duplicate(o, kNaN, RE_ + kLseRepeat);
            } else if (l > 0.0f) {
                Muls(o, acc[r * RE_], 1.0f / l, D_);
                Duplicate(o[RE_], l, kLseRepeat);
                PipeBarrier<PIPE_V>();
                Ln(o[RE_], o[RE_], kLseRepeat);
                PipeBarrier<PIPE_V>();
                Adds(o[RE_], o[RE_], m, kLseRepeat);
            } else {
                Duplicate(o, 0.0f, D_);
                Duplicate(o[RE_], kNegInf, kLseRepeat);
            }
            outQ_.EnQue(o);
            LocalTensor<float> ready = outQ_.template DeQue<float>();
            const int32_t slot = SlotOf(planGm_, t_, it.row0 + qi, it.split);
            const uint64_t hq = uint64_t(slot) * t_.numQHeads + uint64_t(it.h) * G_ + g;
            DataCopy(wsO_[hq * D_], ready, uint32_t(D_));
            DataCopy(wsL_[hq * kLseRepeat], ready[RE_], uint32_t(kLseRepeat));
            outQ_.FreeTensor(ready);
        }
    }

    SplitKVTiling t_;
    int32_t G_ = 1, D_ = 0, TT_ = 0, KR_ = 0, QR_ = 0, RE_ = 0, R_ = 0;
    TPipe pipe_;
    TQue<TPosition::VECIN, 2> inK_, inV_;
    TQue<TPosition::VECIN, 1> qIn_;
    TQue<TPosition::VECOUT, 2> outQ_;
    TBuf<TPosition::VECCALC> kf_, vf_, h16_, quant_, qf_, acc_, stat_, sc_, prod_, red_, tmp_, work_, cap_;
    GlobalTensor<QT> qGm_;
    GlobalTensor<KVT> kGm_, vGm_;
    GlobalTensor<int32_t> btGm_, planGm_;
    GlobalTensor<float> wsO_, wsL_, quantGm_;
    ErrorLog err_;
    GM_ADDR ws_ = nullptr;  // the workspace (its error section)
};

template <typename QT, typename KVT>
__aicore__ inline void RunSplit(GM_ADDR q, GM_ADDR k, GM_ADDR v, GM_ADDR bt, GM_ADDR quant, GM_ADDR plan,
                                GM_ADDR ws, const SplitKVTiling& t) {
    SplitStage<QT, KVT> op;
    op.Init(q, k, v, bt, quant, plan, ws, t);
    op.Process();
}

}  // namespace splitkv

extern "C" __global__ __aicore__ void splitkv_split(GM_ADDR q, GM_ADDR kCache, GM_ADDR vCache, GM_ADDR blockTable,
                                                    GM_ADDR kvQuant, GM_ADDR plan, GM_ADDR workspace,
                                                    GM_ADDR tiling) {
    KERNEL_TASK_TYPE_DEFAULT(KERNEL_TYPE_AIV_ONLY);
    SplitKVTiling t;
    splitkv::LoadTiling(tiling, t);
    const bool int8kv = t.kvDtype == SPLITKV_DT_INT8;
    if (t.qDtype == SPLITKV_DT_FLOAT16) {
        if (int8kv) {
            splitkv::RunSplit<half, int8_t>(q, kCache, vCache, blockTable, kvQuant, plan, workspace, t);
        } else {
            splitkv::RunSplit<half, half>(q, kCache, vCache, blockTable, kvQuant, plan, workspace, t);
        }
    } else if (t.qDtype == SPLITKV_DT_BFLOAT16) {
        if (int8kv) {
            splitkv::RunSplit<bfloat16_t, int8_t>(q, kCache, vCache, blockTable, kvQuant, plan, workspace, t);
        } else {
            splitkv::RunSplit<bfloat16_t, bfloat16_t>(q, kCache, vCache, blockTable, kvQuant, plan, workspace, t);
        }
    } else {
        if (int8kv) {
            splitkv::RunSplit<float, int8_t>(q, kCache, vCache, blockTable, kvQuant, plan, workspace, t);
        } else {
            splitkv::RunSplit<float, float>(q, kCache, vCache, blockTable, kvQuant, plan, workspace, t);
        }
    }
}
