// The combine stage's class (Ascend C, vector cores), shared by the combine launch
// (splitkv_combine.cpp) and the fused mixed launch (splitkv_split_mix.cpp: after SyncAll).
// Merge rule: see splitkv_combine.cpp.
#ifndef SPLITKV_COMBINE_STAGE_H
#define SPLITKV_COMBINE_STAGE_H

#include "splitkv_kernel_common.h"

using namespace AscendC;

namespace splitkv {

template <typename QT>
class CombineStage {
public:
    __aicore__ inline void Init(GM_ADDR workspace, GM_ADDR plan, GM_ADDR out, GM_ADDR lse, const SplitKVTiling& t) {
        t_ = t;
        D_ = t.headDim;
        RE_ = t.rowElems;
        QR_ = t.qRowElems;
        S_ = t.maxSplits;
        wsO_.SetGlobalBuffer(reinterpret_cast<__gm__ float*>(workspace), uint64_t(t.numSlots) * t.numQHeads * t.headDim);
        wsL_.SetGlobalBuffer(reinterpret_cast<__gm__ float*>(workspace + t.lseOffsetBytes),
                             uint64_t(t.numSlots) * t.numQHeads * kLseRepeat);
        planGm_.SetGlobalBuffer(reinterpret_cast<__gm__ int32_t*>(plan), uint64_t(t.planWords));
        outGm_.SetGlobalBuffer(reinterpret_cast<__gm__ QT*>(out), uint64_t(t.numRows) * t.numQHeads * t.headDim);
        lseGm_.SetGlobalBuffer(reinterpret_cast<__gm__ float*>(lse), uint64_t(t.numRows) * t.numQHeads);

        pipe_.InitBuffer(lseQ_, 2, uint32_t(S_) * kLseRepeat * sizeof(float));
        pipe_.InitBuffer(oQ_, 2, uint32_t(S_) * RE_ * sizeof(float));
        pipe_.InitBuffer(outQ_, 2, uint32_t(QR_) * sizeof(QT));
        pipe_.InitBuffer(w_, uint32_t(S_) * kLseRepeat * sizeof(float));
        pipe_.InitBuffer(acc_, uint32_t(RE_) * sizeof(float));
        pipe_.InitBuffer(red_, kBlockBytes);
        pipe_.InitBuffer(tmp_, kBlockBytes);
        pipe_.InitBuffer(work_, uint32_t(RoundUp(2 * CeilDiv(S_ * kLseRepeat, 64), 8)) * sizeof(float));
        pipe_.InitBuffer(lseRow_, uint32_t(RoundUp(t.numQHeads, 8)) * sizeof(float));
    }

    // Block k merges the units k, k + N, ... of (query row, KV head): the G query heads of one KV
    // head of one row, so all vector cores share the work even for one row (B = 1 decode).
    __aicore__ inline void Process() {
        Process(static_cast<int32_t>(GetBlockIdx()), static_cast<int32_t>(GetBlockNum()));
    }
    // units first, first + nb, ... (the fused launch passes its vector-core index and count, and
    // skipSingle: its split stage wrote the rows with one split directly)
    __aicore__ inline void Process(int32_t first, int32_t nb, bool skipSingle = false) {
        const int32_t hkv = t_.numKVHeads, G = t_.groupSize;
        LocalTensor<float> lseRow = lseRow_.Get<float>();
        for (int32_t u = first; u < t_.numRows * hkv; u += nb) {
            const int32_t row = u / hkv, h = u % hkv;
            int32_t s0, ns;
            RowSplits(planGm_, t_, row, s0, ns);
            if (skipSingle && ns == 1) {
                continue;
            }
            for (int32_t g = 0; g < G; g++) {
                lseRow.SetValue(g, MergeHead(row, h * G + g, s0, ns));
            }
            WaitFor<HardEvent::S_MTE3>();
            DataCopyExtParams cp(1, uint32_t(G) * sizeof(float), 0, 0, 0);
            DataCopyPad(lseGm_[uint64_t(row) * t_.numQHeads + uint64_t(h) * G], lseRow, cp);
            WaitFor<HardEvent::MTE3_S>();  // lseRow is rewritten by the next unit
        }
    }

private:
    // Merge the ns partials of (row, hq); writes out[row, hq, :] and returns the merged lse.
    __aicore__ inline float MergeHead(int32_t row, int32_t hq, int32_t s0, int32_t ns) {
        if (ns <= 0) {  // graph mode: a request that sees nothing has no partials
            return WriteEmpty(row, hq);
        }
        const uint64_t first = uint64_t(s0) * t_.numQHeads + hq;
        LocalTensor<float> lseIn = lseQ_.template AllocTensor<float>();
        DataCopy(lseIn, wsL_[first * kLseRepeat],
                 DataCopyParams(static_cast<uint16_t>(ns), 1, static_cast<uint16_t>(t_.numQHeads - 1), 0));
        lseQ_.EnQue(lseIn);
        LocalTensor<float> oIn = oQ_.template AllocTensor<float>();
        const uint16_t rowBlocks = static_cast<uint16_t>(D_ * sizeof(float) / kBlockBytes);
        DataCopy(oIn, wsO_[first * D_],
                 DataCopyParams(static_cast<uint16_t>(ns), rowBlocks,
                                static_cast<uint16_t>((t_.numQHeads - 1) * rowBlocks),
                                static_cast<uint16_t>((RE_ - D_) * sizeof(float) / kBlockBytes)));
        oQ_.EnQue(oIn);

        LocalTensor<float> lses = lseQ_.template DeQue<float>();
        LocalTensor<float> red = red_.Get<float>();
        LocalTensor<float> w = w_.Get<float>();
        LocalTensor<float> work = work_.Get<float>();
        LocalTensor<float> acc = acc_.Get<float>();
        const int32_t n8 = ns * kLseRepeat;  // each lse is repeated 8 times: max and exp work on all
        ReduceMax(red, lses, work, n8);
        WaitFor<HardEvent::V_S>();
        const float m = red.GetValue(0);
        float sum = 0.0f;
        // NaN rule: a NaN partial lse (a split that saw a NaN / inf) makes the head NaN. A NaN max
        // (a reduction that propagates NaN) gives NaN weights below; a NaN-ignoring one that found
        // nothing else (m = -inf) is checked here, on the scalar unit (rare path).
        bool nanSeen = m != m;
        if (m == kNegInf) {
            for (int32_t i = 0; i < ns && !nanSeen; i++) {
                const float x = lses.GetValue(i * kLseRepeat);
                nanSeen = x != x;
            }
        }
        if (m != kNegInf && !nanSeen) {
            Adds(w, lses, -m, n8);
            PipeBarrier<PIPE_V>();
            Exp(w, w, n8);
            WaitFor<HardEvent::V_S>();
        }
        lseQ_.FreeTensor(lses);

        LocalTensor<float> os = oQ_.template DeQue<float>();
        Duplicate(acc, 0.0f, D_);
        PipeBarrier<PIPE_V>();
        if (m != kNegInf && !nanSeen) {
            for (int32_t i = 0; i < ns; i++) {
                const float wi = w.GetValue(i * kLseRepeat);
                if (wi != wi) {
                    nanSeen = true;
                    break;
                }
                if (wi > 0.0f) {
                    sum += wi;
                    Axpy(acc, os[i * RE_], wi, D_);
                    PipeBarrier<PIPE_V>();
                }
            }
        }
        oQ_.FreeTensor(os);

        float lse = kNegInf;
        if (nanSeen) {
            Duplicate(acc, kNaN, D_);
            lse = kNaN;
        } else if (sum > 0.0f) {
            Muls(acc, acc, 1.0f / sum, D_);
            LocalTensor<float> tmp = tmp_.Get<float>();
            Duplicate(tmp, sum, kLseRepeat);
            PipeBarrier<PIPE_V>();
            Ln(tmp, tmp, kLseRepeat);
            WaitFor<HardEvent::V_S>();
            lse = m + tmp.GetValue(0);
        }
        PipeBarrier<PIPE_V>();

        LocalTensor<QT> o = outQ_.template AllocTensor<QT>();
        if constexpr (sizeof(QT) == 4) {
            Adds(o, acc, 0.0f, D_);
        } else {
            Cast(o, acc, RoundMode::CAST_RINT, uint32_t(D_));
        }
        outQ_.EnQue(o);
        LocalTensor<QT> ready = outQ_.template DeQue<QT>();
        DataCopyExtParams cp(1, uint32_t(D_) * sizeof(QT), 0, 0, 0);
        DataCopyPad(outGm_[(uint64_t(row) * t_.numQHeads + hq) * D_], ready, cp);
        outQ_.FreeTensor(ready);
        return lse;
    }

    // out[row, hq, :] = 0; returns lse = -inf (a row without partials)
    __aicore__ inline float WriteEmpty(int32_t row, int32_t hq) {
        LocalTensor<QT> o = outQ_.template AllocTensor<QT>();
        Duplicate(o, QT(0.0f), D_);
        outQ_.EnQue(o);
        LocalTensor<QT> ready = outQ_.template DeQue<QT>();
        DataCopyExtParams cp(1, uint32_t(D_) * sizeof(QT), 0, 0, 0);
        DataCopyPad(outGm_[(uint64_t(row) * t_.numQHeads + hq) * D_], ready, cp);
        outQ_.FreeTensor(ready);
        return kNegInf;
    }

    SplitKVTiling t_;
    int32_t D_ = 0, RE_ = 0, QR_ = 0, S_ = 1;
    TPipe pipe_;
    TQue<TPosition::VECIN, 2> lseQ_, oQ_;
    TQue<TPosition::VECOUT, 2> outQ_;
    TBuf<TPosition::VECCALC> w_, acc_, red_, tmp_, work_, lseRow_;
    GlobalTensor<float> wsO_, wsL_, lseGm_;
    GlobalTensor<int32_t> planGm_;
    GlobalTensor<QT> outGm_;
};

template <typename QT>
__aicore__ inline void RunCombine(GM_ADDR ws, GM_ADDR plan, GM_ADDR out, GM_ADDR lse, const SplitKVTiling& t) {
    CombineStage<QT> op;
    op.Init(ws, plan, out, lse, t);
    op.Process();
}

}  // namespace splitkv

#endif  // SPLITKV_COMBINE_STAGE_H
