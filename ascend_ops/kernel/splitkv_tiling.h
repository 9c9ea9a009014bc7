// splitkv_tiling.h: the contract between the host (ascend_ops/tiling.py, the torch_npu launcher)
// and the two Ascend C kernels of the split-KV decode operator.
//
// Everything the kernels need besides the tensors is in two buffers the host builds:
//   * `tiling`: one SplitKVTiling (below), copied to device memory as raw bytes;
//   * `plan`:   int32 words, the shared Python Plan flattened (sections located by the *Offset
//               fields of the tiling, in int32 words from the start of the buffer):
//                 qsl     [batch + 1]    query_start_loc
//                 seqLens [batch]        valid KV tokens per request
//                 rowSlot [numRows]      first partial slot of each query row
//                 rowNum  [numRows]      number of partial slots (splits) of each query row
//                 coreRange [blockDim + 1]  mixed kernel: first item of each AI core
//                 items   [numItems, 5]  request, kv head, split index, kv start, kv end
//                                        (padding items have request -1 and are skipped)
//               The host writes them in this order, the items last, so that a graph-stable
//               step's words differ from the last step's only before its padding items.
// Both are produced by `ascend_ops.tiling.build_tiling(inputs, plan)`; the launcher copies them to
// the device unchanged. This header is plain C++ (no Ascend C include) so host code can use it.
//
// Kernel entries (declared at the bottom when the Ascend C headers are in scope):
//
//   splitkv_split(q, kCache, vCache, blockTable, kvQuant, plan, workspace, tiling)
//     q          [T, Hq, D]                    qDtype (float32 | float16 | bfloat16)
//     kCache     [numPages, pageSize, Hkv, D]  kvDtype (= qDtype, or int8)
//     vCache     [numPages, pageSize, Hkv, D]  kvDtype
//     blockTable int32 [batch, maxPages]
//     kvQuant    float32 [4, Hkv, D]: k scale, k offset, v scale, v offset (value = (x - offset) * scale);
//                read only when kvDtype is int8 (any valid pointer otherwise)
//     plan       int32 words (above)
//     workspace  float32, workspaceBytes (tiling field) bytes: partial o then partial lse (below)
//     tiling     SplitKVTiling bytes
//   splitkv_combine(workspace, plan, out, lse, tiling)
//     out        [T, Hq, D] qDtype;  lse float32 [T, Hq] (natural log; -inf for an empty row)
//
// The mixed split stage (kernelKind 1, splitkv_split_mix / the fused splitkv_attention_mix) is a
// mixed launch of `blockDim` AI cores (1 AIC + 2 AIV each) with a per-core scratch after the
// partials (scratchOffsetBytes, scratchCoreBytes) and the plan section coreRange; the combine
// takes combineBlockDim vector cores. The vector-only stage:
// Launch both on `blockDim` vector cores (AIV), one after the other on the same stream: the
// combine reads what the split stage wrote. No SyncAll, no system workspace.
//
// Graph mode (deviceSplitTokens = S > 0): the kernels make no use of the items, rowSlot and rowNum
// sections; they derive the work from seqLens (written on the device before each launch, so a
// captured graph replays with new lengths and no host work). Items form a grid of numItems =
// batch * numKVHeads * maxSplits, split-major: item w is split j = w / (batch * Hkv), request
// b = (w % (batch * Hkv)) / Hkv, KV head h = w % Hkv; its range is [max(j S, lo), min((j + 1) S,
// seqLen[b])) with lo the request's window start (0 without a window), and it exists only for
// lo / S <= j < min(ceil(seqLen / S), maxSplits). Query row r of request b has its partials in
// slots r * maxSplits + j for those j (the combine reads them; one of them: written directly by the
// fused launch). The host checks seqLen <= S * maxSplits where it knows the lengths.
//
// Workspace layout: the error section at byte 0 (SPLITKV_ERROR_BYTES: one SPLITKV_ERROR_SLOT_BYTES
// slot of int32 counters per launched block, at most SPLITKV_ERROR_SLOTS blocks; ErrorLog in
// splitkv_kernel_common.h; zeroed when the workspace is made, kept across launches until the host
// reads and resets it), then float32 o [numSlots, Hq, D] at byte SPLITKV_ERROR_BYTES, then lse
// [numSlots, Hq, 8] at byte lseOffsetBytes: each partial lse repeated 8 times so that every lse is
// one 32-byte block (the aligned-copy unit). Only the slots of valid work items are written and
// read. lseOffsetBytes, scratchOffsetBytes and workspaceBytes count from the workspace's start.
#ifndef SPLITKV_TILING_H
#define SPLITKV_TILING_H

#include <stdint.h>

// dtype codes (qDtype, kvDtype)
#define SPLITKV_DT_FLOAT32 0
#define SPLITKV_DT_FLOAT16 1
#define SPLITKV_DT_BFLOAT16 2
#define SPLITKV_DT_INT8 3

#define SPLITKV_TILING_VERSION 5

// the workspace's error section (see the layout above)
#define SPLITKV_ERROR_SLOT_BYTES 64
#define SPLITKV_ERROR_SLOTS 64
#define SPLITKV_ERROR_BYTES (SPLITKV_ERROR_SLOT_BYTES * SPLITKV_ERROR_SLOTS)

// All fields are 4 bytes (int32 or float32), no padding; tiling.py reads this declaration to pack
// the bytes, so keep one field per line in the form `type name;  // comment`.
struct SplitKVTiling {
    int32_t version;          // SPLITKV_TILING_VERSION
    int32_t blockDim;         // vector cores to launch (the kernels read GetBlockNum() anyway)
    int32_t batch;            // B
    int32_t numRows;          // T, query rows
    int32_t numQHeads;        // Hq
    int32_t numKVHeads;       // Hkv
    int32_t groupSize;        // Hq / Hkv
    int32_t headDim;          // D (multiple of 8, at most 256)
    int32_t pageSize;         // tokens per KV page
    int32_t maxPages;         // block table row length
    int32_t numPages;         // pages in the KV cache (bounds)
    int32_t numItems;         // work items including padding
    int32_t numSlots;         // partial slots
    int32_t maxQLen;          // longest q_len of the batch
    int32_t qDtype;           // SPLITKV_DT_*
    int32_t kvDtype;          // SPLITKV_DT_*
    int32_t windowLeft;       // sliding window, -1 for none
    float scale;              // softmax scale
    float softCap;            // logits soft cap, 0 for none
    int32_t tileTokens;       // KV tokens per UB tile (split stage)
    int32_t rowChunk;         // query rows (q row x group head) held in UB at once
    int32_t kvRowElems;       // UB row stride of a KV tile, elements of kvDtype (D padded to 32 B)
    int32_t qRowElems;        // UB row stride of staged q / out rows, elements of qDtype
    int32_t rowElems;         // UB row stride of float32 rows (D rounded up to 8)
    int32_t maxSplits;        // most slots one query row merges (combine stage)
    int32_t itemsOffset;      // plan sections, in int32 words
    int32_t qslOffset;
    int32_t seqLensOffset;
    int32_t rowSlotOffset;
    int32_t rowNumOffset;
    int32_t planWords;        // int32 words in the plan buffer
    int32_t lseOffsetBytes;   // workspace byte offset of the lse section
    int32_t workspaceBytes;   // workspace bytes the kernels address
    int32_t splitUbBytes;     // UB the split stage reserves (checked on the host)
    int32_t combineUbBytes;   // UB the combine stage reserves
    int32_t kernelKind;       // split stage: 0 vector cores only (splitkv_split), 1 mixed AIC + AIV (splitkv_split_mix)
    int32_t mixTileTokens;    // mixed: KV tokens per cube tile, one L1 buffer of K or V (multiple of 16)
    int32_t mixRowsPad;       // mixed: most query rows of an item (q_len x G), padded to 16
    int32_t scratchOffsetBytes;  // mixed: workspace byte offset of the per-AI-core scratch (S, P, O slots)
    int32_t scratchCoreBytes;    // mixed: scratch bytes per AI core
    int32_t coreRangeOffset;  // mixed: plan section coreRange [blockDim + 1] (first item of each AI core)
    int32_t mixUbBytes;       // mixed: UB one vector core reserves
    int32_t combineBlockDim;  // vector cores the combine uses (units of (row, KV head); any count works)
    int32_t deviceSplitTokens;  // graph mode: split size S > 0: items, ranges and slots from seqLens (below); 0 off
    int32_t combineHeads;     // query heads of one KV head the combine merges at once (<= groupSize; UB-bound)
    int32_t mixStepTiles;     // mixed: cube tiles per cube <-> vector exchange step (step = mixTileTokens x this)
};

#define SPLITKV_TILING_WORDS 46

#ifdef __cplusplus
static_assert(sizeof(SplitKVTiling) == SPLITKV_TILING_WORDS * 4, "SplitKVTiling must be 4-byte fields only");
#endif

#if defined(GM_ADDR)
extern "C" __global__ __aicore__ void splitkv_split(GM_ADDR q, GM_ADDR kCache, GM_ADDR vCache, GM_ADDR blockTable,
                                                    GM_ADDR kvQuant, GM_ADDR plan, GM_ADDR workspace,
                                                    GM_ADDR tiling);
extern "C" __global__ __aicore__ void splitkv_split_mix(GM_ADDR q, GM_ADDR kCache, GM_ADDR vCache, GM_ADDR blockTable,
                                                        GM_ADDR kvQuant, GM_ADDR plan, GM_ADDR workspace,
                                                        GM_ADDR tiling);
// The fused mixed launch: splitkv_split_mix, SyncAll, then the combine (out, lse as splitkv_combine).
extern "C" __global__ __aicore__ void splitkv_attention_mix(GM_ADDR q, GM_ADDR kCache, GM_ADDR vCache,
                                                            GM_ADDR blockTable, GM_ADDR kvQuant, GM_ADDR plan,
                                                            GM_ADDR workspace, GM_ADDR tiling, GM_ADDR out,
                                                            GM_ADDR lse);
extern "C" __global__ __aicore__ void splitkv_combine(GM_ADDR workspace, GM_ADDR plan, GM_ADDR out, GM_ADDR lse,
                                                      GM_ADDR tiling);
#endif

#endif  // SPLITKV_TILING_H
