// The combine stage's class (Ascend C, vector cores), shared by the combine launch
// (splitkv_combine.cpp) and the fused mixed launch (splitkv_split_mix.cpp: after SyncAll).
// Merge rule: see splitkv_combine.cpp. Vectorised over the G query heads of a KV head (combineHeads
// at a time) and over the splits; rows with one split are skipped by the fused launch.
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
        S_ = t.maxSplits;
        GC_ = t.combineHeads;
        wsO_.SetGlobalBuffer(reinterpret_cast<__gm__ float*>(workspace + SPLITKV_ERROR_BYTES),
                             uint64_t(t.numSlots) * t.numQHeads * t.headDim);
        wsL_.SetGlobalBuffer(reinterpret_cast<__gm__ float*>(workspace + t.lseOffsetBytes),
                             uint64_t(t.numSlots) * t.numQHeads * kLseRepeat);
        planGm_.SetGlobalBuffer(reinterpret_cast<__gm__ int32_t*>(plan), uint64_t(t.planWords));
        outGm_.SetGlobalBuffer(reinterpret_cast<__gm__ QT*>(out), uint64_t(t.numRows) * t.numQHeads * t.headDim);
        lseGm_.SetGlobalBuffer(reinterpret_cast<__gm__ float*>(lse), uint64_t(t.numRows) * t.numQHeads);

        const uint32_t blk = uint32_t(GC_) * kLseRepeat * sizeof(float);  // one lse block per head
        pipe_.InitBuffer(lseQ_, 1, uint32_t(S_) * blk);
        pipe_.InitBuffer(oQ_, 1, uint32_t(S_) * GC_ * D_ * sizeof(float));
        pipe_.InitBuffer(outQ_, 2, uint32_t(RoundUp(GC_ * D_ * int32_t(sizeof(QT)), kBlockBytes)));
        pipe_.InitBuffer(w_, uint32_t(S_) * blk);
        pipe_.InitBuffer(m_, blk);
        pipe_.InitBuffer(sum_, blk);
        pipe_.InitBuffer(lv_, blk);
        pipe_.InitBuffer(acc_, uint32_t(GC_) * D_ * sizeof(float));
        pipe_.InitBuffer(lseRow_, uint32_t(RoundUp(t.numQHeads, 8)) * sizeof(float));
    }

    // Block k merges the units k, k + N, ... of (query row, KV head): the G query heads of one KV
    // head of one row, so all vector cores share the work even for one row (B = 1 decode).
    __aicore__ inline void Process() {
        Process(static_cast<int32_t>(GetBlockIdx()), static_cast<int32_t>(GetBlockNum()));
    }
    // units first, first + nb, ... (the fused launch passes its vector-core index and count,
    // and skipSingle: its split stage wrote the rows with one split directly; and the first unit's
    // splits, read before its SyncAll so that no plan read is left on the path after it: firstS0,
    // firstNs; firstNs < 0: read them here)
    __aicore__ inline void Process(int32_t first, int32_t nb, bool skipSingle = false, int32_t firstS0 = 0,
                                   int32_t firstNs = -1) {
        const int32_t hkv = t_.numKVHeads, G = t_.groupSize;
        LocalTensor<float> lseRow = lseRow_.Get<float>();
        for (int32_t u = first; u < t_.numRows * hkv; u += nb) {
            const int32_t row = u / hkv, h = u % hkv;
            int32_t s0 = firstS0, ns = firstNs;
            if (u != first || ns < 0) {
                RowSplits(planGm_, t_, row, s0, ns);
            }
            if (skipSingle && ns == 1) {
                continue;
            }
            for (int32_t g0 = 0; g0 < G; g0 += GC_) {
                MergeHeads(row, h * G + g0, Min(GC_, G - g0), s0, ns, lseRow[g0]);
            }
            WaitFor<HardEvent::S_MTE3>();
            DataCopyExtParams cp(1, uint32_t(G) * sizeof(float), 0, 0, 0);
            DataCopyPad(lseGm_[uint64_t(row) * t_.numQHeads + uint64_t(h) * G], lseRow, cp);
            WaitFor<HardEvent::MTE3_S>();  // lseRow is rewritten by the next unit
        }
    }

private:
    // Merge the ns partials of query heads hq0 .. hq0 + gc of one row, all heads at once: per split one
    // vector instruction over the gc heads' lse blocks (max, weight, sum), one Ln for the gc merged
    // lse; the weighted sum of the o rows takes one Axpy per (split, head) with a weight > 0. Writes
    // out[row, hq0 .. hq0 + gc, :] (one copy) and the gc lse values to lseRow (the caller writes them).
    //   m = max(max_i lse_i, -3e38) (finite: an all-empty head gives w = exp(-inf) = 0, never NaN)
    //   w_i = exp(lse_i - m);  lse = m + ln(sum_i w_i) (-inf when all are empty);  out = sum_i w_i o_i / sum_i w_i
    // NaN rule: a NaN partial lse gives NaN weights, sum and lse; that head's out is NaN.
    __aicore__ inline void MergeHeads(int32_t row, int32_t hq0, int32_t gc, int32_t s0, int32_t ns,
                                      const LocalTensor<float>& lseOut) {
        const int32_t Hq = t_.numQHeads, n8 = gc * kLseRepeat;
        LocalTensor<float> acc = acc_.Get<float>();
        if (ns <= 0) {  // graph mode: a request that sees nothing has no partials
            Duplicate(acc, 0.0f, gc * D_);
            WaitFor<HardEvent::V_S>();  // lseOut (read by the previous unit's copy) is written below
            for (int32_t g = 0; g < gc; g++) {
                lseOut.SetValue(g, kNegInf);
            }
            WriteOut(row, hq0, gc);
            return;
        }
        const uint64_t first = uint64_t(s0) * Hq + hq0;
        LocalTensor<float> lseIn = lseQ_.template AllocTensor<float>();
        DataCopy(lseIn, wsL_[first * kLseRepeat],
                 DataCopyParams(static_cast<uint16_t>(ns), static_cast<uint16_t>(gc), static_cast<uint16_t>(Hq - gc),
                                0));
        lseQ_.EnQue(lseIn);
        LocalTensor<float> oIn = oQ_.template AllocTensor<float>();
        const int32_t rowBlocks = D_ * int32_t(sizeof(float)) / kBlockBytes;
        DataCopy(oIn, wsO_[first * D_],
                 DataCopyParams(static_cast<uint16_t>(ns), static_cast<uint16_t>(gc * rowBlocks),
                                static_cast<uint16_t>((Hq - gc) * rowBlocks), 0));
        oQ_.EnQue(oIn);

        LocalTensor<float> l = lseQ_.template DeQue<float>();
        LocalTensor<float> w = w_.Get<float>(), m = m_.Get<float>(), sum = sum_.Get<float>(), lv = lv_.Get<float>();
        Duplicate(m, kMergeFloor, n8);
        PipeBarrier<PIPE_V>();
        for (int32_t i = 0; i < ns; i++) {
            Max(m, m, l[i * n8], n8);
            PipeBarrier<PIPE_V>();
        }
        for (int32_t i = 0; i < ns; i++) {
            Sub(w[i * n8], l[i * n8], m, n8);
        }
        PipeBarrier<PIPE_V>();
        Exp(w, w, ns * n8);
        PipeBarrier<PIPE_V>();
        lseQ_.FreeTensor(l);
        Adds(sum, w, 0.0f, n8);
        PipeBarrier<PIPE_V>();
        for (int32_t i = 1; i < ns; i++) {
            Add(sum, sum, w[i * n8], n8);
            PipeBarrier<PIPE_V>();
        }
        Ln(lv, sum, n8);
        PipeBarrier<PIPE_V>();
        Add(lv, lv, m, n8);  // the gc merged lse values, each 8 times
        Duplicate(acc, 0.0f, gc * D_);
        PipeBarrier<PIPE_V>();
        WaitFor<HardEvent::V_S>();  // weights, sums and lse to the scalar unit: one round trip per chunk

        LocalTensor<float> o = oQ_.template DeQue<float>();
        for (int32_t g = 0; g < gc; g++) {
            for (int32_t i = 0; i < ns; i++) {
                const float wi = w.GetValue((i * gc + g) * kLseRepeat);
                if (wi > 0.0f) {
                    Axpy(acc[g * D_], o[(i * gc + g) * D_], wi, D_);
                    PipeBarrier<PIPE_V>();
                }
            }
            const float sg = sum.GetValue(g * kLseRepeat);
            if (sg != sg) {
                Duplicate(acc[g * D_], kNaN, D_);
            } else if (sg > 0.0f) {
                Muls(acc[g * D_], acc[g * D_], 1.0f / sg, D_);
            }
            lseOut.SetValue(g, lv.GetValue(g * kLseRepeat));
        }
        oQ_.FreeTensor(o);
        PipeBarrier<PIPE_V>();
        WriteOut(row, hq0, gc);
    }

    // acc [gc, D] (float) -> out[row, hq0 .. hq0 + gc, :] in q's dtype (round to nearest even), one copy
    __aicore__ inline void WriteOut(int32_t row, int32_t hq0, int32_t gc) {
        LocalTensor<float> acc = acc_.Get<float>();
        LocalTensor<QT> ob = outQ_.template AllocTensor<QT>();
        if constexpr (sizeof(QT) == 4) {
            Adds(ob, acc, 0.0f, gc * D_);
        } else {
            Cast(ob, acc, RoundMode::CAST_RINT, uint32_t(gc * D_));
        }
        outQ_.EnQue(ob);
        LocalTensor<QT> ready = outQ_.template DeQue<QT>();
        DataCopyExtParams cp(1, uint32_t(gc * D_) * sizeof(QT), 0, 0, 0);
        DataCopyPad(outGm_[(uint64_t(row) * t_.numQHeads + hq0) * D_], ready, cp);
        outQ_.FreeTensor(ready);
    }

    static constexpr float kMergeFloor = -3.0e38f;
    SplitKVTiling t_;
    int32_t D_ = 0, S_ = 1, GC_ = 1;
    TPipe pipe_;
    TQue<TPosition::VECIN, 1> lseQ_, oQ_;
    TQue<TPosition::VECOUT, 2> outQ_;
    TBuf<TPosition::VECCALC> w_, m_, sum_, lv_, acc_, lseRow_;
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
