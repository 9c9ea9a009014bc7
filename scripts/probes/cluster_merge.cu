// Probe (a measurement, not a backend): is the batch-1 merge cheaper inside a thread-block cluster?
//
// Stage 1 here is a plain CUDA-core split-KV decode program for one case: one query row per request,
// GQA group 4, head dim 128, bf16 K / V in the NHD page layout [P, 16, Hkv, 128], int32 block table
// and lengths. One program per (split, KV head, request), 128 threads: a 16-byte load per thread and
// token row (16 lanes a row, 8 rows a step, 64 tokens a chunk), the scores reduced across the row's
// 16 lanes by shuffles, an online softmax over the chunks (base 2), the 8 row groups' sums reduced
// through shared memory at the end. Its state per (query head): the normalised output and the lse.
//
// Two ways to merge the splits of one (request, KV head):
//   separate  stage 1 writes float32 partial states to global memory and a second kernel, launched
//             as a programmatic dependent launch (PDL), merges them (the Triton backend's shape);
//   cluster   the splits are one thread-block cluster; each program leaves its state in its shared
//             memory, and after one cluster barrier the programs merge the states of all of them
//             through distributed shared memory (no second kernel, no global round trip).
// The merge is the exact one of docs/conventions.md: m = max lse, w = exp2(lse - m),
// o = sum w o / sum w, lse = m + log2 sum w (returned in natural log).
//
// Built by scripts/h200_cluster_merge_probe.py on the GPU machine:
//   nvcc -O3 -arch=sm_90a -shared -Xcompiler -fPIC -o cluster_merge.so cluster_merge.cu

#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

namespace cg = cooperative_groups;

// the extern "C" entry points take it: outside the anonymous namespace
struct Params {
    const __nv_bfloat16 *q;     // [B, Hkv * G, D]
    const __nv_bfloat16 *k;     // [P, PAGE, Hkv, D]
    const __nv_bfloat16 *v;
    const int32_t *block_table;  // [B, bt_stride]
    const int32_t *seq_lens;     // [B]
    float *part_o;               // [B, Hkv * G, nsplit, D] (separate merge)
    float *part_lse;             // [B, Hkv * G, nsplit], base 2
    __nv_bfloat16 *out;          // [B, Hkv * G, D]
    float *lse;                  // [B, Hkv * G], natural log
    int32_t bt_stride, hkv, nsplit, split;  // split: tokens a split (a multiple of PAGE)
    float scale_log2;            // softmax scale * log2(e)
};

namespace {

constexpr int D = 128;                 // head dim
constexpr int G = 4;                   // query heads per KV head
constexpr int PAGE = 16;               // tokens a page
constexpr int THREADS = 128;
constexpr int VEC = 8;                 // bf16 a 16-byte load
constexpr int LANES = D / VEC;         // 16 lanes a token row
constexpr int ROWS = THREADS / LANES;  // 8 token rows a step
constexpr int PER = 8;                 // token rows a thread holds per chunk
constexpr int CHUNK = ROWS * PER;      // 64 tokens a chunk
#define NEG_INF (-__int_as_float(0x7f800000))



struct State {                   // one program's normalised state, as shared memory holds it
    float o[G][D];
    float lse[G];                // base 2; -inf: empty
};

struct Smem {
    float red[ROWS][G][D];       // the row groups' weighted sums
    float part_l[ROWS][G];
    float wmax[THREADS / 32][G];
    State st;
};

__device__ __forceinline__ void unpack(const uint4 &x, float f[VEC]) {
    const __nv_bfloat162 *h = reinterpret_cast<const __nv_bfloat162 *>(&x);
#pragma unroll
    for (int i = 0; i < VEC / 2; ++i) {
        float2 t = __bfloat1622float2(h[i]);
        f[2 * i] = t.x;
        f[2 * i + 1] = t.y;
    }
}

// Stage 1 for program (split, h, b): its state into s.st (every thread returns after a barrier).
__device__ void stage1(const Params &p, Smem &s, int split, int h, int b) {
    const int tid = threadIdx.x, row = tid / LANES, lane = tid % LANES, warp = tid / 32;
    const int len = p.seq_lens[b];
    const int start = split * p.split;
    const int end = min(len, start + p.split);
    const int hq0 = h * G;
    float qf[G][VEC];
#pragma unroll
    for (int g = 0; g < G; ++g) {
        uint4 x = *reinterpret_cast<const uint4 *>(p.q + ((int64_t)b * p.hkv * G + hq0 + g) * D + lane * VEC);
        unpack(x, qf[g]);
#pragma unroll
        for (int i = 0; i < VEC; ++i) qf[g][i] *= p.scale_log2;
    }
    float m[G], l[G], acc[G][VEC];
#pragma unroll
    for (int g = 0; g < G; ++g) {
        m[g] = NEG_INF;
        l[g] = 0.f;
#pragma unroll
        for (int i = 0; i < VEC; ++i) acc[g][i] = 0.f;
    }
    const int32_t *bt = p.block_table + (int64_t)b * p.bt_stride;
    for (int c = start; c < end; c += CHUNK) {
        uint4 kx[PER], vx[PER];
        int32_t pg[PER];
#pragma unroll
        for (int j = 0; j < PER; ++j) {
            int pos = c + row + ROWS * j;
            pg[j] = pos < end ? bt[pos / PAGE] : -1;
        }
#pragma unroll
        for (int j = 0; j < PER; ++j) {
            int pos = c + row + ROWS * j;
            if (pg[j] >= 0) {
                int64_t off = (((int64_t)pg[j] * PAGE + pos % PAGE) * p.hkv + h) * D + lane * VEC;
                kx[j] = *reinterpret_cast<const uint4 *>(p.k + off);
                vx[j] = *reinterpret_cast<const uint4 *>(p.v + off);
            } else {
                kx[j] = make_uint4(0, 0, 0, 0);
                vx[j] = make_uint4(0, 0, 0, 0);
            }
        }
        float sc[PER][G];
#pragma unroll
        for (int j = 0; j < PER; ++j) {
            float kf[VEC];
            unpack(kx[j], kf);
#pragma unroll
            for (int g = 0; g < G; ++g) {
                float t = 0.f;
#pragma unroll
                for (int i = 0; i < VEC; ++i) t = fmaf(qf[g][i], kf[i], t);
                sc[j][g] = t;
            }
        }
#pragma unroll
        for (int j = 0; j < PER; ++j)
#pragma unroll
            for (int g = 0; g < G; ++g) {
#pragma unroll
                for (int o = LANES / 2; o > 0; o /= 2) sc[j][g] += __shfl_xor_sync(0xffffffffu, sc[j][g], o);
                if (pg[j] < 0) sc[j][g] = NEG_INF;
            }
        // the chunk's max per head across the program
        float cm[G];
#pragma unroll
        for (int g = 0; g < G; ++g) {
            cm[g] = sc[0][g];
#pragma unroll
            for (int j = 1; j < PER; ++j) cm[g] = fmaxf(cm[g], sc[j][g]);
            cm[g] = fmaxf(cm[g], __shfl_xor_sync(0xffffffffu, cm[g], 16));
        }
        if (tid % 32 == 0)
#pragma unroll
            for (int g = 0; g < G; ++g) s.wmax[warp][g] = cm[g];
        __syncthreads();
#pragma unroll
        for (int g = 0; g < G; ++g) {
            float mx = s.wmax[0][g];
#pragma unroll
            for (int w = 1; w < THREADS / 32; ++w) mx = fmaxf(mx, s.wmax[w][g]);
            float mn = fmaxf(m[g], mx);
            float ref = mn == NEG_INF ? 0.f : mn;
            float alpha = exp2f(m[g] - ref);
            float ps = 0.f;
#pragma unroll
            for (int i = 0; i < VEC; ++i) acc[g][i] *= alpha;
#pragma unroll
            for (int j = 0; j < PER; ++j) {
                float pj = exp2f(sc[j][g] - ref);
                ps += pj;
                float vf[VEC];
                unpack(vx[j], vf);
#pragma unroll
                for (int i = 0; i < VEC; ++i) acc[g][i] = fmaf(pj, vf[i], acc[g][i]);
            }
            l[g] = l[g] * alpha + ps;
            m[g] = mn;
        }
        __syncthreads();  // wmax is rewritten by the next chunk
    }
#pragma unroll
    for (int g = 0; g < G; ++g) {
#pragma unroll
        for (int i = 0; i < VEC; ++i) s.red[row][g][lane * VEC + i] = acc[g][i];
        if (lane == 0) s.part_l[row][g] = l[g];
    }
    __syncthreads();
    // thread tid: column tid of each head
#pragma unroll
    for (int g = 0; g < G; ++g) {
        float lt = 0.f, o = 0.f;
#pragma unroll
        for (int r = 0; r < ROWS; ++r) {
            lt += s.part_l[r][g];
            o += s.red[r][g][tid];
        }
        bool empty = lt == 0.f;
        s.st.o[g][tid] = empty ? 0.f : o / lt;
        if (tid == 0) s.st.lse[g] = empty ? NEG_INF : m[g] + log2f(lt);
    }
    __syncthreads();
}

__global__ void __launch_bounds__(THREADS) stage1_separate(Params p) {
    asm volatile("griddepcontrol.launch_dependents;");
    __shared__ Smem s;
    const int split = blockIdx.x, h = blockIdx.y, b = blockIdx.z, tid = threadIdx.x;
    stage1(p, s, split, h, b);
#pragma unroll
    for (int g = 0; g < G; ++g) {
        int64_t row = ((int64_t)b * p.hkv * G + h * G + g) * p.nsplit + split;
        p.part_o[row * D + tid] = s.st.o[g][tid];
        if (tid == 0) p.part_lse[row] = s.st.lse[g];
    }
}

// one program per (query head, request), thread d: column d
__global__ void __launch_bounds__(D) merge_separate(Params p) {
    const int hq = blockIdx.x, b = blockIdx.y, d = threadIdx.x;
    const int64_t row = (int64_t)b * p.hkv * G + hq;
    asm volatile("griddepcontrol.wait;" ::: "memory");
    float mx = NEG_INF;
    for (int j = 0; j < p.nsplit; ++j) mx = fmaxf(mx, p.part_lse[row * p.nsplit + j]);
    float ref = mx == NEG_INF ? 0.f : mx, lt = 0.f, o = 0.f;
    for (int j = 0; j < p.nsplit; ++j) {
        float w = exp2f(p.part_lse[row * p.nsplit + j] - ref);
        lt += w;
        o = fmaf(w, p.part_o[(row * p.nsplit + j) * D + d], o);
    }
    bool empty = lt == 0.f;
    p.out[row * D + d] = __float2bfloat16(empty ? 0.f : o / lt);
    if (d == 0) p.lse[row] = empty ? NEG_INF : (ref + log2f(lt)) * 0.6931471805599453f;
}

// the cluster's programs: the splits of one (KV head, request), cluster rank = split
__global__ void __launch_bounds__(THREADS) stage1_cluster(Params p) {
    __shared__ Smem s;
    cg::cluster_group cluster = cg::this_cluster();
    const int split = blockIdx.x, h = blockIdx.y, b = blockIdx.z, tid = threadIdx.x;
    const int n = p.nsplit;
    stage1(p, s, split, h, b);
    cluster.sync();  // every program's state is in its shared memory
    // program r merges outputs r * THREADS + tid, (r + n) * THREADS + tid, ... of the G x D outputs
    for (int idx = split * THREADS + tid; idx < G * D; idx += n * THREADS) {
        const int g = idx / D, d = idx % D;
        float mx = NEG_INF;
        for (int j = 0; j < n; ++j) {
            State *o = cluster.map_shared_rank(&s.st, j);
            mx = fmaxf(mx, o->lse[g]);
        }
        float ref = mx == NEG_INF ? 0.f : mx, lt = 0.f, acc = 0.f;
        for (int j = 0; j < n; ++j) {
            State *o = cluster.map_shared_rank(&s.st, j);
            float w = exp2f(o->lse[g] - ref);
            lt += w;
            acc = fmaf(w, o->o[g][d], acc);
        }
        const int64_t row = (int64_t)b * p.hkv * G + h * G + g;
        bool empty = lt == 0.f;
        p.out[row * D + d] = __float2bfloat16(empty ? 0.f : acc / lt);
        if (d == 0) p.lse[row] = empty ? NEG_INF : (ref + log2f(lt)) * 0.6931471805599453f;
    }
    cluster.sync();  // no program leaves while another may still read its shared memory
}

}  // namespace

extern "C" {

int probe_param_bytes() { return (int)sizeof(Params); }

// stage 1, then (merge != 0) the merge; merge 2: as a programmatic dependent launch
int probe_separate(const Params *p, cudaStream_t stream, int batch, int merge) {
    dim3 grid(p->nsplit, p->hkv, batch);
    stage1_separate<<<grid, THREADS, 0, stream>>>(*p);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess || !merge) return (int)e;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(p->hkv * G, batch, 1);
    cfg.blockDim = dim3(D, 1, 1);
    cfg.stream = stream;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = merge == 2 ? 1 : 0;
    Params copy = *p;
    return (int)cudaLaunchKernelEx(&cfg, merge_separate, copy);
}

}  // extern "C"

namespace {

// stage1_cluster's launch: clusters of nsplit programs (up to 8 portable, 16 with the non-portable
// attribute, which is set here)
struct ClusterLaunch {
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute attr[1];
    cudaError_t opened;

    ClusterLaunch(const Params *p, int batch, cudaStream_t stream) {
        static cudaError_t once =   // the first call (outside any graph capture: the script checks first)
            cudaFuncSetAttribute(stage1_cluster, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
        opened = once;
        cfg.gridDim = dim3(p->nsplit, p->hkv, batch);
        cfg.blockDim = dim3(THREADS, 1, 1);
        cfg.stream = stream;
        attr[0].id = cudaLaunchAttributeClusterDimension;
        attr[0].val.clusterDim.x = p->nsplit;
        attr[0].val.clusterDim.y = 1;
        attr[0].val.clusterDim.z = 1;
        cfg.attrs = attr;
        cfg.numAttrs = 1;
    }
};

}  // namespace

extern "C" {

// one launch
int probe_cluster(const Params *p, cudaStream_t stream, int batch) {
    ClusterLaunch l(p, batch, stream);
    if (l.opened != cudaSuccess) return (int)l.opened;
    Params copy = *p;
    return (int)cudaLaunchKernelEx(&l.cfg, stage1_cluster, copy);
}

// how many clusters of nsplit programs fit on the GPU at once (0: none; -1: the query failed)
int probe_max_clusters(const Params *p, int batch) {
    ClusterLaunch l(p, batch, 0);
    int n = 0;
    if (l.opened != cudaSuccess || cudaOccupancyMaxActiveClusters(&n, stage1_cluster, &l.cfg) != cudaSuccess) return -1;
    return n;
}

}  // extern "C"
