/* The planner's common decode case in C: the plans of splitkv_common.planner._plan_fast, bit for bit.
 *
 * The common case is a batch without a sliding window under `auto` (the cost model on a GPU profile,
 * the NPU rule on an Ascend one), `size:N` or `none`, every input within the limits
 * (splitkv_common/validation.py). For it, plan() makes the
 * same work items, split counts and partial slots as the NumPy planner, in the same order, and the
 * same `auto` choice: every cost is the same IEEE double expression evaluated in the same order
 * (built with -ffp-contract=off, so no fused multiply-add changes a rounding). Anything else makes
 * plan() return None and the caller plans with NumPy, which reports the errors: this code raises
 * only for arguments of the wrong type. tests/test_native_plan.py holds it to the NumPy planner.
 *
 * Python side: splitkv_common/native/__init__.py (build, load, the settings struct) and
 * splitkv_common/plan_spec.py (NativePlanner: the Plan object over the arrays written here). The Refresher
 * type makes a captured plan's plan() in one call (cuda_ref.wrapper.DecodeWrapper, plan_in_graph), the
 * LengthsWriter type a device-planned step's lengths write (cuda_ref.wrapper.StepInputs, in_graph).
 * ascend_words() writes an Ascend plan's words for ascend_ops.tiling.TilingBuilder
 * (tests/ascend/test_tiling_builder.py).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <time.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef SPLITKV_NUMPY
/* NumPy arrays are read through their object's fields (the C API), not the buffer protocol: NumPy's
 * buffer export runs enough code that, with cold caches between two decode steps, it cost about a
 * tenth of a captured plan's refresh (five buffers; docs/benchmarks.md, runs 44-47). Built with
 * NumPy's headers where they are found. */
#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#include <numpy/arrayobject.h>
static int numpy_api = 0;   /* import_array() succeeded */
#endif

/* The wrapper's settings, packed once by NativePlanner (struct.pack "=22q6d"): every field an
 * int64 or a double, in this order. */
typedef struct {
    int64_t hkv, page, hq, token_bytes, merge_bytes;
    int64_t policy;           /* 0 auto, 1 fixed_size, 2 none, 3 auto on an Ascend profile (the NPU rule) */
    int64_t split_value;      /* fixed_size's tokens */
    int64_t min_split, cap, graph_stable;
    int64_t max_work_items;   /* -1: graph_capacity's default */
    int64_t graph_floor;      /* the default capacity's floor: graph_capacity's items per unit x units */
    int64_t slots, order_above;
    int64_t max_batch, max_query_rows, max_items_limit, max_partial_slots;
    int64_t units;            /* the profile's units */
    int64_t lone_min_tokens;  /* a candidate of at most `units` items, the longest at least this long, */
    double bw, unit_bw, launch_us, per_wave_us;
    double lone_unit_bw;      /* ... takes this per-item bandwidth (0: never; the profile's lone_*) */
    int64_t npu_cores;        /* the NPU rule (policy 3): the profile's cube cores, */
    int64_t npu_merge_bytes;  /* Hq x (D + 8) x 8, the combine's bytes a (request, split) */
    double npu_core_bw;       /* and one core's share of the bandwidth (bytes / µs) */
} Settings;

#define I32_LIMIT ((int64_t)1 << 31)
#define SMALL_B 256   /* batches up to this many requests plan in stack scratch (8 KiB) */

/* A C-contiguous integer array: a NumPy array's own fields, or any other object's exported buffer
 * (`held`: released by buf_release). */
typedef struct {
    Py_buffer view;
    int held;
    void *buf;
    Py_ssize_t itemsize, len;   /* bytes an entry, bytes in all */
    int ndim, is_int;           /* is_int: signed integer entries in native byte order */
    Py_ssize_t shape[2];        /* the first two dimensions (1 where there are fewer) */
} Buf;

/* 1: `obj` read into `b` (check is_int, itemsize and the shape); 0: not a C-contiguous buffer (or
 * not a writable one, with `writable`), the Python error cleared. */
static int buf_get(PyObject *obj, Buf *b, int writable) {
    b->held = 0;
#ifdef SPLITKV_NUMPY
    if (numpy_api && PyArray_CheckExact(obj)) {
        PyArrayObject *a = (PyArrayObject *)obj;
        int t = PyArray_TYPE(a);
        if (!PyArray_IS_C_CONTIGUOUS(a) || !PyArray_ISALIGNED(a) || (writable && !PyArray_ISWRITEABLE(a)))
            return 0;
        b->buf = PyArray_DATA(a);
        b->itemsize = PyArray_ITEMSIZE(a);
        b->len = PyArray_NBYTES(a);
        b->ndim = PyArray_NDIM(a);
        b->is_int = PyTypeNum_ISSIGNED(t) && PyArray_ISNOTSWAPPED(a);
        b->shape[0] = b->ndim > 0 ? PyArray_DIM(a, 0) : 1;
        b->shape[1] = b->ndim > 1 ? PyArray_DIM(a, 1) : 1;
        return 1;
    }
#endif
    if (PyObject_GetBuffer(obj, &b->view, (writable ? PyBUF_WRITABLE : 0) | PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) != 0) {
        PyErr_Clear();
        return 0;
    }
    b->held = 1;
    const char *f = b->view.format ? b->view.format : "B";
    if (*f == '<' || *f == '=' || *f == '@') f++;
    b->buf = b->view.buf;
    b->itemsize = b->view.itemsize;
    b->len = b->view.len;
    b->ndim = b->view.ndim;
    b->is_int = f[0] != '\0' && f[1] == '\0' && (*f == 'i' || *f == 'l' || *f == 'q');
    b->shape[0] = b->ndim > 0 ? b->view.shape[0] : 1;
    b->shape[1] = b->ndim > 1 ? b->view.shape[1] : 1;
    return 1;
}

static void buf_release(Buf *b) {
    if (b->held) PyBuffer_Release(&b->view);
    b->held = 0;
}

/* A 1-D int32 / int64 array read as int64 values. */
typedef struct {
    Buf b;
    int wide;   /* 8-byte entries, else 4 */
    Py_ssize_t n;
} IntIn;

static int int_in(PyObject *obj, IntIn *in) {
    /* 1: ok; 0: not a plain int32 / int64 1-D contiguous array (the NumPy path plans it). */
    if (!buf_get(obj, &in->b, 0)) return 0;
    if (in->b.ndim != 1 || !in->b.is_int || (in->b.itemsize != 8 && in->b.itemsize != 4)) return 0;
    in->wide = in->b.itemsize == 8;
    in->n = in->b.shape[0];
    return 1;
}

static inline int64_t at(const IntIn *in, Py_ssize_t i) {
    return in->wide ? ((const int64_t *)in->b.buf)[i] : (int64_t)((const int32_t *)in->b.buf)[i];
}

/* A writable C-contiguous int32 array of at least `need` entries (NULL, with a ValueError, if not). */
static int32_t *out_buf(PyObject *obj, Buf *b, Py_ssize_t need, const char *name) {
    if (!buf_get(obj, b, 1) || b->itemsize != 4 || !b->is_int || b->len / 4 < need) {
        buf_release(b);
        PyErr_Format(PyExc_ValueError, "%s: must be a writable int32 buffer of at least %zd entries", name, need);
        return NULL;
    }
    return (int32_t *)b->buf;
}

static inline int64_t floor_div(int64_t a, int64_t b) {   /* Python's // for b > 0 */
    int64_t q = a / b;
    return (a % b != 0 && a < 0) ? q - 1 : q;
}
static inline int64_t ceil_div(int64_t a, int64_t b) { return -floor_div(-a, b); }   /* -(-a // b) */
static inline int64_t round_up(int64_t x, int64_t m) { return -floor_div(-x, m) * m; }

/* x // d for 0 <= x < 2**31 and 0 < d < 2**32: a shift where d is a power of two (the usual split
 * lengths), else a 32-bit division (a 64-bit one costs several times more per request). */
typedef struct { uint32_t d; int shift; } Divisor;
static inline Divisor divisor(int64_t d) {
    Divisor r = {(uint32_t)d, -1};
    if ((d & (d - 1)) == 0) r.shift = __builtin_ctzll((unsigned long long)d);
    return r;
}
static inline int64_t div_by(int64_t x, Divisor d) {
    return d.shift >= 0 ? (int64_t)((uint32_t)x >> d.shift) : (int64_t)((uint32_t)x / d.d);
}

/* The `auto` choice (splitkv_common.policies.auto_candidates, _candidate_stats, _auto_costs,
 * _cheapest) for lengths `seq`, query rows `ql` (NULL: one each), `T` rows in all; -2 where a
 * cost's integer product would pass int64 (Python's are exact: the NumPy path plans it). */
static int64_t choose_auto(const Settings *s, const int64_t *seq, const int64_t *ql, int64_t B, int64_t T,
                           int64_t longest, int64_t lens_total, int64_t max_items) {
    int64_t cands[64], ncand = 0;
    cands[ncand++] = 0;
    int64_t c = round_up(s->min_split > s->page ? s->min_split : s->page, s->page);
    while (c < longest && ncand < 64) {
        if (ceil_div(longest, c) <= s->cap) cands[ncand++] = c;
        c *= 2;
    }
    int64_t max_last = longest > 0 ? longest - 1 : 0;
    int64_t bytes;   /* Python's products are exact: a product past int64 is the NumPy path's (-2) */
    if (__builtin_mul_overflow(lens_total, s->hkv, &bytes) || __builtin_mul_overflow(bytes, s->token_bytes, &bytes))
        return -2;
    double t_stream = (double)bytes / s->bw;
    int64_t best_c = -1, best_w = 0, fit_c = -1;
    double best_t = 0.0, fit_t = 0.0;
    for (int64_t k = 0; k < ncand; k++) {
        int64_t cc = cands[k], ranges, rows, most, lg;
        if (cc == 0) {
            ranges = B; rows = ql ? T : B; most = 1; lg = longest;
        } else {
            int64_t extra = 0, extra_rows = 0;
            Divisor dc = divisor(cc);
            for (int64_t b = 0; b < B; b++) {
                int64_t qq = div_by(seq[b] > 0 ? seq[b] - 1 : 0, dc);
                extra += qq;
                if (ql) extra_rows += qq * ql[b];
            }
            ranges = extra + B;
            rows = ql ? extra_rows + T : ranges;
            most = max_last / cc + 1;
            lg = cc < longest ? cc : longest;
        }
        int64_t w = ranges * s->hkv, lg_bytes, merge;
        if (__builtin_mul_overflow(lg, s->token_bytes, &lg_bytes) || __builtin_mul_overflow(rows, s->merge_bytes, &merge))
            return -2;
        double ubw = (s->lone_unit_bw > 0.0 && w <= s->units && lg >= s->lone_min_tokens) ? s->lone_unit_bw
                                                                                          : s->unit_bw;
        double x = (double)lg_bytes / ubw;
        double t_attn = s->launch_us + (x > t_stream ? x : t_stream) + (double)ceil_div(w, s->slots) * s->per_wave_us;
        double total = most > 1 ? t_attn + (s->launch_us + (double)merge / s->bw) : t_attn + 0.0;
        if (best_c < 0 || total < best_t * 0.97) { best_c = cc; best_t = total; best_w = w; }
        /* the same choice among the candidates that fit a capacity (no split always does) */
        if (max_items >= 0 && w > max_items && fit_c >= 0) continue;
        if (fit_c < 0 || total < fit_t * 0.97) { fit_c = cc; fit_t = total; }
    }
    if (max_items >= 0 && best_w > max_items) return fit_c;
    return best_c;
}

/* `auto` on an Ascend profile (splitkv_common.policies.npu_auto): the split length for `active` requests
 * that see a token, the longest `longest` tokens; -2 where a product would pass int64. */
static int64_t choose_npu(const Settings *s, int64_t active, int64_t longest) {
    int64_t items = active * s->hkv;
    if (items == 0) return 0;
    int64_t most = longest / (s->min_split > s->page ? s->min_split : s->page);
    if (most > s->cap) most = s->cap;
    if (most < 1) most = 1;
    int64_t best = -1;
    double best_t = 0.0;
    for (int64_t want = 1; want <= most; want++) {
        int64_t length = want == 1 ? 0 : round_up(ceil_div(longest, want), s->page);
        int64_t count = want == 1 ? 1 : ceil_div(longest, length);
        if (count != want) continue;   /* page rounding gave another count */
        int64_t work, merge;
        if (__builtin_mul_overflow(items, count, &work)) return -2;
        int64_t per_core = ceil_div(work, s->npu_cores);
        double t_attn = s->launch_us + (double)per_core * ((double)longest / (double)count * (double)s->token_bytes /
                                                           s->npu_core_bw + s->per_wave_us);
        double t_merge = 0.0;
        if (count != 1) {
            if (__builtin_mul_overflow(active, count, &merge) || __builtin_mul_overflow(merge, s->npu_merge_bytes, &merge))
                return -2;
            t_merge = (double)merge / s->bw;
        }
        if (best < 0 || t_attn + t_merge < best_t * 0.97) { best = length; best_t = t_attn + t_merge; }
    }
    return best;
}

/* The requests' order, longest first, ties in batch order (a stable sort, as NumPy's and Python's):
 * an LSD radix sort on 31 - bit keys, a byte a pass, skipping the bytes every key shares. `ord` and
 * `tmp`: [B] each. */
static void longest_first(const int64_t *seq, int64_t B, uint32_t *ord, uint32_t *tmp) {
    uint32_t all_or = 0, all_and = 0xFFFFFFFFu;
    for (int64_t b = 0; b < B; b++) {
        uint32_t k = 0x7FFFFFFFu - (uint32_t)seq[b];
        all_or |= k;
        all_and &= k;
        ord[b] = (uint32_t)b;
    }
    for (int pass = 0; pass < 4; pass++) {
        int sh = 8 * pass;
        if ((((all_or ^ all_and) >> sh) & 0xFFu) == 0) continue;   /* every key has this byte */
        size_t count[257] = {0};
        for (int64_t i = 0; i < B; i++) count[(((0x7FFFFFFFu - (uint32_t)seq[ord[i]]) >> sh) & 0xFFu) + 1]++;
        for (int d = 0; d < 256; d++) count[d + 1] += count[d];
        for (int64_t i = 0; i < B; i++) tmp[count[((0x7FFFFFFFu - (uint32_t)seq[ord[i]]) >> sh) & 0xFFu]++] = ord[i];
        memcpy(ord, tmp, sizeof(uint32_t) * (size_t)B);
    }
}

/* A plan's eight device arrays (see pack()) into `out` (5 * W4 + B4 + 2 * T4 entries, X4 = X rounded
 * up to 4) from `items` [5, cols >= W] and `small`; only the first `n` entries of each item array. */
static void pack_arrays(int32_t *out, const int32_t *items, int64_t cols, int64_t W, int64_t n, const int32_t *small,
                        int64_t B, int64_t T) {
    int64_t wp = (W + 3) & ~3LL, bp = (B + 3) & ~3LL, tp = (T + 3) & ~3LL;
    for (int f = 0; f < 5; f++) memcpy(out + f * wp, items + f * cols, sizeof(int32_t) * (size_t)n);
    int32_t *o = out + 5 * wp;
    memcpy(o, small, sizeof(int32_t) * (size_t)B);                                 /* num_splits */
    memcpy(o + bp, small + 2 * B + 1, sizeof(int32_t) * (size_t)T);                /* row_slot_start */
    memcpy(o + bp + tp, small + 2 * B + 1 + T, sizeof(int32_t) * (size_t)T);       /* row_num_splits */
}

static inline int64_t packed_size(int64_t W, int64_t B, int64_t T) {
    return 5 * ((W + 3) & ~3LL) + ((B + 3) & ~3LL) + 2 * ((T + 3) & ~3LL);
}

/* One batch planned in scratch (plan_batch): its sizes, the split length and each request's ranges.
 * batch_free() releases it. */
typedef struct {
    int64_t B, T, max_q, split, W, N, num_slots, longest, zeros;
    int increasing;
    int64_t *seq, *ql, *qsl, *nsp;   /* [B]; [B] (NULL: one row each); [B + 1]; [B] */
    int64_t *heap;                   /* the scratch past SMALL_B requests */
    IntIn sin, qin;
    int64_t stack[4 * SMALL_B + 1];  /* a decode batch's scratch (a cold malloc costs more than the plan) */
} Batch;

static void batch_free(Batch *bt) {
    buf_release(&bt->sin.b);
    buf_release(&bt->qin.b);
    free(bt->heap);
    bt->heap = NULL;
}

/* The plan of seq_lens (`seq_obj`) and the query rows (`q_kind`, `q_obj`: plan()'s) into `bt`: 1, or 0
 * where the NumPy path must plan, or -1 with a Python error (a q_kind out of range). */
static int plan_batch(const Settings *s, PyObject *seq_obj, long q_kind, PyObject *q_obj, Batch *bt) {
    bt->heap = NULL;
    bt->sin.b.held = bt->qin.b.held = 0;
    if (!int_in(seq_obj, &bt->sin)) return 0;
    int64_t B = bt->B = bt->sin.n;
    if (B == 0 || B > s->max_batch || B * s->hkv > s->max_items_limit) return 0;
    int64_t *seq = bt->stack;
    if (B > SMALL_B) {
        seq = bt->heap = malloc(sizeof(int64_t) * (size_t)(4 * B + 1));
        if (!seq) { PyErr_NoMemory(); return -1; }
    }
    int64_t *ql = seq + B, *nsp = seq + 2 * B, *qsl = seq + 3 * B;
    bt->seq = seq, bt->nsp = nsp, bt->qsl = qsl;
    int64_t longest = 0, lens_total = 0, zeros = 0;
    int increasing = 0;
    for (int64_t b = 0; b < B; b++) {
        int64_t v = at(&bt->sin, b);
        if (v < 0 || v >= I32_LIMIT) return 0;
        seq[b] = v;
        if (v > longest) longest = v;
        lens_total += v;
        zeros += v == 0;
        if (b && seq[b - 1] < v) increasing = 1;
    }
    /* query rows */
    int64_t T, max_q = 1;
    qsl[0] = 0;
    if (q_kind == 0) {
        for (int64_t b = 0; b < B; b++) qsl[b + 1] = b + 1;
        T = B;
    } else {
        IntIn *qin = &bt->qin;
        if (!int_in(q_obj, qin)) return 0;
        if (q_kind == 2) {
            if (qin->n != B + 1 || at(qin, 0) != 0) return 0;
            max_q = 0;
            for (int64_t b = 0; b < B; b++) {
                int64_t a = at(qin, b), e = at(qin, b + 1);
                if (e < a || e > s->max_query_rows) return 0;
                ql[b] = e - a;
                qsl[b + 1] = e;
                if (ql[b] > max_q) max_q = ql[b];
            }
        } else if (q_kind == 1) {
            if (qin->n != B) return 0;
            max_q = 0;
            for (int64_t b = 0; b < B; b++) {
                int64_t v = at(qin, b);
                if (v < 0 || v > s->max_query_rows) return 0;
                ql[b] = v;
                qsl[b + 1] = qsl[b] + v;
                if (qsl[b + 1] > s->max_query_rows) return 0;
                if (v > max_q) max_q = v;
            }
        } else {
            PyErr_SetString(PyExc_ValueError, "plan: q_kind must be 0, 1 or 2");
            return -1;
        }
        T = qsl[B];
    }
    if (T > s->max_query_rows) return 0;
    const int64_t *qlp = q_kind == 0 ? NULL : ql;
    int64_t cap = s->cap;
    int64_t max_items = -1;   /* graph_capacity() */
    if (s->graph_stable) {
        if (s->max_work_items >= 0) max_items = s->max_work_items;
        else {
            int64_t worst = B * s->hkv * cap;
            if (s->policy == 2 || s->policy == 0) {
                int64_t want = 2 * B * s->hkv > s->graph_floor ? 2 * B * s->hkv : s->graph_floor;
                max_items = worst < want ? worst : want;
            } else max_items = worst;
        }
    }
    /* the split length */
    int64_t split = s->policy == 1 ? s->split_value
                  : s->policy == 2 ? 0
                  : s->policy == 3 ? choose_npu(s, B - zeros, longest)
                  : choose_auto(s, seq, qlp, B, T, longest, lens_total, max_items);
    if (split < 0) return 0;   /* a cost past int64 */
    /* ranges per request */
    int64_t R = 0, most = 1;
    Divisor ds = divisor(split > 0 ? split : 1);
    for (int64_t b = 0; b < B; b++) {
        int64_t n = split == 0 ? 1 : div_by(seq[b] > 0 ? seq[b] - 1 : 0, ds) + 1;
        nsp[b] = n;
        R += n;
        if (n > most) most = n;
    }
    if (most > cap) return 0;   /* the cap grows the split: the NumPy path */
    int64_t W = R * s->hkv;
    if (W > s->max_items_limit) return 0;
    int64_t N = W;
    if (s->graph_stable) {
        int64_t worst = s->max_work_items < 0 ? B * s->hkv * cap : max_items;
        if (W > max_items || worst > s->max_items_limit || T * cap > s->max_partial_slots) return 0;
        N = max_items;
    }
    int64_t num_slots = 0;
    if (T) {
        if (s->graph_stable) num_slots = T * cap;
        else if (!qlp) num_slots = R;
        else for (int64_t b = 0; b < B; b++) num_slots += nsp[b] * ql[b];
    }
    bt->ql = q_kind == 0 ? NULL : ql;
    bt->T = T, bt->max_q = max_q, bt->split = split, bt->W = W, bt->N = N, bt->num_slots = num_slots;
    bt->longest = longest, bt->zeros = zeros, bt->increasing = increasing;
    return 1;
}

/* `bt`'s plan into `req` (the [5, N] work-item buffer) and `small` (num_splits [B], query_start_loc
 * [B + 1], row_slot_start [T], row_num_splits [T]) and, where `out` is not NULL, packed into `out`
 * (pack()'s layout, then the batch's seq_lens [B] and, from a 16-byte boundary, query_start_loc
 * [B + 1]). prev_valid and packed_prev: plan()'s. 0, or -1 with a MemoryError. */
static int write_plan(const Settings *s, const Batch *bt, int32_t *req, int32_t *small, int32_t *out,
                      int64_t prev_valid, int64_t packed_prev) {
    const int64_t B = bt->B, T = bt->T, N = bt->N, W = bt->W, split = bt->split;
    const int64_t *seq = bt->seq, *nsp = bt->nsp, *ql = bt->ql;
    int32_t *head = req + N, *jsp = head + N, *ks = jsp + N, *ke = ks + N;
    /* the requests' order: the longest first in a plan the device runs in waves */
    uint32_t *ord = NULL;
    if (W - s->hkv * bt->zeros > s->order_above && bt->increasing) {
        ord = malloc(sizeof(uint32_t) * (size_t)B * 2);
        if (!ord) { PyErr_NoMemory(); return -1; }
        longest_first(seq, B, ord, ord + B);
    }
    int64_t i = 0;
    for (int64_t k = 0; k < B; k++) {
        int64_t b = ord ? (int64_t)ord[k] : k, n = nsp[b], len = seq[b];
        for (int64_t h = 0; h < s->hkv; h++) {
            for (int64_t j = 0; j < n; j++, i++) {
                req[i] = (int32_t)b;
                head[i] = (int32_t)h;
                jsp[i] = (int32_t)j;
                ks[i] = (int32_t)(j * split);
                ke[i] = (int32_t)(j + 1 < n ? (j + 1) * split : len);
            }
        }
    }
    free(ord);
    /* padding: request -1, empty ranges (only up to the last plan's items when it is there) */
    int64_t pad_to = prev_valid >= 0 ? (prev_valid < N ? (prev_valid > W ? prev_valid : W) : N) : N;
    for (int64_t p = W; p < pad_to; p++) {
        req[p] = -1;
        head[p] = jsp[p] = ks[p] = ke[p] = 0;
    }
    int32_t *rs = small + 2 * B + 1, *rn = rs + T;
    for (int64_t b = 0; b < B; b++) small[b] = (int32_t)nsp[b];
    for (int64_t b = 0; b <= B; b++) small[B + b] = (int32_t)bt->qsl[b];
    int64_t t = 0, acc = 0;
    for (int64_t b = 0; b < B; b++) {
        int64_t rows = ql ? ql[b] : 1;
        for (int64_t r = 0; r < rows; r++, t++) {
            rn[t] = (int32_t)nsp[b];
            rs[t] = (int32_t)(s->graph_stable ? t * s->cap : acc);
            acc += nsp[b];
        }
    }
    if (out) {   /* and into the device layout: the items up to the last pack's, then the lengths */
        int64_t at = packed_size(N, B, T), qat = at + ((B + 3) & ~3LL);
        int64_t upto = packed_prev < 0 ? N : (packed_prev > W ? (packed_prev < N ? packed_prev : N) : W);
        pack_arrays(out, req, N, N, upto, small, B, T);
        for (int64_t b = 0; b < B; b++) out[at + b] = (int32_t)seq[b];
        for (int64_t b = 0; b <= B; b++) out[qat + b] = (int32_t)bt->qsl[b];
    }
    return 0;
}

/* The entries a refresh writes into its packed buffer: the plan's (pack()'s layout), the batch's
 * seq_lens and, from a 16-byte boundary, its query_start_loc. */
static inline int64_t packed_with_lengths(int64_t N, int64_t B, int64_t T) {
    return packed_size(N, B, T) + ((B + 3) & ~3LL) + B + 1;
}

/* plan(settings, seq_lens, q_kind, q, items, small, prev_valid)
 *
 * seq_lens: [B] int32 / int64; q_kind 0: one row each (q ignored), 1: q = q_lens [B], 2: q =
 * query_start_loc [B + 1]. items: a writable int32 [5, N] buffer (its rows the work-item arrays) or
 * None; small: a writable int32 buffer for num_splits [B], query_start_loc [B + 1], row_slot_start
 * [T] and row_num_splits [T], one after the other, or None. prev_valid: the valid items `items`
 * holds from an earlier plan of the same capacity (its padding is there already), or -1.
 *
 * With five more arguments (packed, packed_prev, B, T, max_q_limit: the refresh of a captured plan)
 * the plan is also packed into `packed` (write_plan()'s `out`; its item arrays only up to the larger
 * of this plan's valid items and `packed_prev`, the last pack's, beyond which the padding is there
 * already); nothing is written unless the batch has B requests, T rows and at most max_q_limit rows
 * in one request. (Refresher.refresh does the same with its buffers fixed at its making.)
 *
 * Returns None where the NumPy path must plan; else (W valid items, N items with padding, split
 * length, num_slots, B, T, the most query rows of one request, the largest item end, filled):
 * `filled` is False when `items` or `small` was None or too short (nothing written; the sizes say
 * what to allocate: [5, N] and 2B + 1 + 2T entries). */
static PyObject *plan(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 7 && nargs != 12) {
        PyErr_SetString(PyExc_TypeError, "plan: 7 or 12 arguments");
        return NULL;
    }
    PyObject *packed = nargs == 12 ? args[7] : Py_None;
    long long packed_prev = -1, expect_b = -1, expect_t = -1, max_q_limit = -1;
    if (packed != Py_None) {
        packed_prev = PyLong_AsLongLong(args[8]);
        expect_b = PyLong_AsLongLong(args[9]);
        expect_t = PyLong_AsLongLong(args[10]);
        max_q_limit = PyLong_AsLongLong(args[11]);
        if (PyErr_Occurred()) return NULL;
    }
    char *raw;
    Py_ssize_t rawlen;
    if (PyBytes_AsStringAndSize(args[0], &raw, &rawlen) != 0) return NULL;
    if (rawlen != (Py_ssize_t)sizeof(Settings)) {
        PyErr_SetString(PyExc_ValueError, "plan: settings of another layout");
        return NULL;
    }
    Settings st;
    memcpy(&st, raw, sizeof st);
    long q_kind = PyLong_AsLong(args[2]);
    long long prev_valid = PyLong_AsLongLong(args[6]);
    if (PyErr_Occurred()) return NULL;

    Batch bt;
    int ok = plan_batch(&st, args[1], q_kind, args[3], &bt);
    if (ok <= 0) {
        batch_free(&bt);
        if (ok < 0) return NULL;
        Py_RETURN_NONE;
    }
    const int64_t B = bt.B, T = bt.T, N = bt.N;
    PyObject *result = NULL;
    Buf items_v = {0}, small_v = {0}, packed_v = {0};
    int filled = 0;
    if (args[4] != Py_None && args[5] != Py_None && !buf_get(args[4], &items_v, 1)) {
        /* not a writable buffer (a read-only one): nothing written, the caller allocates */
    } else if (args[4] != Py_None && args[5] != Py_None) {
        if (items_v.itemsize != 4 || !items_v.is_int || items_v.ndim != 2 || items_v.shape[0] != 5) {
            PyErr_SetString(PyExc_ValueError, "items: must be a writable C-contiguous int32 [5, N] buffer");
            goto done;
        }
        int32_t *small = NULL;
        if (items_v.shape[1] == N) {
            small = out_buf(args[5], &small_v, 0, "small");
            if (!small) goto done;
            if (small_v.len / 4 < 2 * B + 1 + 2 * T) small = NULL;
        }
        if (packed != Py_None && (B != expect_b || T != expect_t || bt.max_q > max_q_limit)) small = NULL;
        int32_t *out = NULL;
        if (small && packed != Py_None) {   /* checked before anything is written */
            out = out_buf(packed, &packed_v, packed_with_lengths(N, B, T), "packed");
            if (!out) goto done;
        }
        if (small) {
            if (write_plan(&st, &bt, (int32_t *)items_v.buf, small, out, prev_valid, packed_prev) < 0) goto done;
            filled = 1;
        }
    }
    result = Py_BuildValue("(LLLLLLLLO)", (long long)bt.W, (long long)N, (long long)bt.split,
                           (long long)bt.num_slots, (long long)B, (long long)T, (long long)bt.max_q,
                           (long long)bt.longest, filled ? Py_True : Py_False);
done:
    buf_release(&items_v);
    buf_release(&small_v);
    buf_release(&packed_v);
    batch_free(&bt);
    return result;
}

/* pack(items, W, upto, small, B, T, out): a plan's eight device arrays (cuda_ref.launch.DevicePlan's
 * layout: item_request, item_kv_head, item_split, item_kv_start, item_kv_end [W] each, num_splits
 * [B], row_slot_start [T], row_num_splits [T], each from a 16-byte boundary) into the int32 buffer
 * `out`, from `items` [5, >= W] and `small` (plan()'s layout). `upto` >= 0: only the first `upto`
 * entries of the item arrays (`out` holds the rest). Returns the entries spanned. */
static PyObject *pack(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "pack: 7 arguments");
        return NULL;
    }
    long long W = PyLong_AsLongLong(args[1]), upto = PyLong_AsLongLong(args[2]);
    long long B = PyLong_AsLongLong(args[4]), T = PyLong_AsLongLong(args[5]);
    if (PyErr_Occurred()) return NULL;
    if (W < 0 || B < 0 || T < 0 || upto > W) {
        PyErr_SetString(PyExc_ValueError, "pack: sizes must be >= 0 and upto <= W");
        return NULL;
    }
    Buf iv = {0}, sv = {0}, ov = {0};
    PyObject *ret = NULL;
    if (!buf_get(args[0], &iv, 0) || iv.itemsize != 4 || iv.ndim != 2 || iv.shape[0] != 5 || iv.shape[1] < W) {
        PyErr_SetString(PyExc_ValueError, "items: must be a C-contiguous int32 [5, >= W] buffer");
        goto out;
    }
    long long total = packed_size(W, B, T);
    if (!buf_get(args[3], &sv, 0) || sv.itemsize != 4 || sv.len / 4 < 2 * B + 1 + 2 * T) {
        PyErr_SetString(PyExc_ValueError, "small: must be an int32 buffer of 2B + 1 + 2T entries");
        goto out;
    }
    int32_t *out = out_buf(args[6], &ov, total, "out");
    if (!out) goto out;
    pack_arrays(out, iv.buf, iv.shape[1], W, upto >= 0 ? upto : W, sv.buf, B, T);
    ret = PyLong_FromLongLong(total);
out:
    buf_release(&iv);
    buf_release(&sv);
    buf_release(&ov);
    return ret;
}

/* An item's weight as balance_items computes it in NumPy: int32 arithmetic (wrapping), 0 for padding. */
static inline int64_t item_weight(int32_t req, int32_t ks, int32_t ke, int64_t overhead) {
    int32_t len = (int32_t)((uint32_t)ke - (uint32_t)ks);
    return req >= 0 ? (int64_t)(int32_t)((uint32_t)(len > 0 ? len : 0) + (uint32_t)overhead) : 0;
}

/* The prefix sums of the item weights (balance_items' `c`), kept across calls: the module is only
 * called with the GIL held. */
static int64_t *prefix_buf = NULL;
static int64_t prefix_cap = 0;

static int64_t *prefix_scratch(int64_t n) {
    if (n > prefix_cap) {
        int64_t cap = n > 2 * prefix_cap ? n : 2 * prefix_cap;
        int64_t *p = realloc(prefix_buf, sizeof(int64_t) * (size_t)cap);
        if (!p) return NULL;
        prefix_buf = p;
        prefix_cap = cap;
    }
    return prefix_buf;
}

/* The items' words (`out` [hi, 5] from `f` [5, W]) and, with `cores` > 0, each AI core's first item
 * under ascend_ops.tiling.balance_items into `bounds` [cores + 1], in one pass over the items: the
 * weights' prefix sums are kept, then each core's bound is a binary search of the doubled midpoints
 * (item i goes to core k or later when (c[i - 1] + c[i]) * cores >= 2 * total * k). Returns 0 where
 * 2 * total * cores passes int64 or a weight wraps (the caller balances with NumPy), -1
 * when out of memory (MemoryError set), else 1. Needs nv <= hi. */
static int words_and_balance(const int32_t *f, int64_t W, int64_t nv, int64_t hi, int64_t cores,
                             int64_t overhead, int32_t *out, int32_t *bounds) {
    const int32_t *req = f, *ks = f + 3 * W, *ke = f + 4 * W;
    int64_t *c = NULL, total = 0;
    int negative = 0;
    if (cores) {
        c = prefix_scratch(nv > 0 ? nv : 1);
        if (!c) {
            PyErr_NoMemory();
            return -1;
        }
    }
    for (int64_t i = 0; i < hi; i++) {
        for (int k = 0; k < 5; k++) out[5 * i + k] = f[k * W + i];
        if (c && i < nv) {   /* |weight| <= 2**31, nv < 2**31 items: the sum stays within int64 */
            int64_t w = item_weight(req[i], ks[i], ke[i], overhead);
            negative |= w < 0;
            total += w;
            c[i] = total;
        }
    }
    if (!cores) return 1;
    if (negative) return 0;   /* a weight wrapped past int32: the sums are not sorted, NumPy decides */
    memset(bounds, 0, sizeof(int32_t) * (size_t)(cores + 1));
    bounds[cores] = (int32_t)W;
    if (nv == 0 || total <= 0) return 1;
    int64_t step, top;   /* every midpoint is at most 2 * total: no product below passes int64 */
    if (__builtin_mul_overflow(total, 2, &step) || __builtin_mul_overflow(step, cores, &top)) return 0;
    int64_t lo = 0;
    for (int64_t k = 1; k < cores; k++) {   /* the first item at or after `lo` whose midpoint reaches k */
        int64_t a = lo, b = nv, target = step * k;
        while (a < b) {
            int64_t m = a + (b - a) / 2;
            if ((c[m] + (m ? c[m - 1] : 0)) * cores >= target) b = m;
            else a = m + 1;
        }
        bounds[k] = (int32_t)(lo = a);
    }
    return 1;
}

/* ascend_words(items, nv, hi, qsl, seq, row_slot, row_num, cores, overhead, out): an Ascend plan's
 * words (ascend_ops.tiling.plan_words' layout) into the int32 buffer `out`: query_start_loc, seq_lens,
 * row_slot_start, row_num_splits, with `cores` > 0 each AI core's first item (balance_items,
 * `overhead` tokens an item), then the items [W, 5] (from `items` [5, W], only the first `hi`: `out`
 * holds the rest). Returns the words written, or None where the NumPy path must write them (a product
 * past int64, a weight past int32). */
static PyObject *ascend_words(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 10) {
        PyErr_SetString(PyExc_TypeError, "ascend_words: 10 arguments");
        return NULL;
    }
    long long nv = PyLong_AsLongLong(args[1]), hi = PyLong_AsLongLong(args[2]);
    long long cores = PyLong_AsLongLong(args[7]), overhead = PyLong_AsLongLong(args[8]);
    if (PyErr_Occurred()) return NULL;
    Buf iv = {0}, ov = {0};
    IntIn in[4] = {{.b = {.held = 0}}, {.b = {.held = 0}}, {.b = {.held = 0}}, {.b = {.held = 0}}};
    PyObject *ret = NULL;
    if (!buf_get(args[0], &iv, 0) || iv.itemsize != 4 || !iv.is_int || iv.ndim != 2 || iv.shape[0] != 5) {
        PyErr_SetString(PyExc_ValueError, "items: must be a C-contiguous int32 [5, W] buffer");
        goto out;
    }
    int64_t W = iv.shape[1];
    if (nv < 0 || nv > W || hi < 0 || hi > W || cores < 0 || cores >= I32_LIMIT || overhead < 0) {
        PyErr_SetString(PyExc_ValueError, "ascend_words: need 0 <= nv, hi <= W and cores, overhead >= 0");
        goto out;
    }
    int64_t total = 5 * W + (cores ? cores + 1 : 0);
    for (int k = 0; k < 4; k++) {
        if (!int_in(args[3 + k], &in[k])) {
            PyErr_SetString(PyExc_ValueError, "ascend_words: the plan's arrays must be 1-D int32 / int64 arrays");
            goto out;
        }
        total += in[k].n;
    }
    int32_t *o = out_buf(args[9], &ov, total, "out");
    if (!o) goto out;
    int32_t *items_out = o + total - 5 * W;   /* the items last, the core ranges before them */
    int bal = words_and_balance((const int32_t *)iv.buf, W, nv, hi > nv ? hi : nv, cores, overhead, items_out,
                                items_out - (cores ? cores + 1 : 0));
    if (bal < 0) goto out;
    if (bal == 0) {
        Py_INCREF(Py_None);
        ret = Py_None;
        goto out;
    }
    int32_t *p = o;
    for (int k = 0; k < 4; k++)
        for (Py_ssize_t i = 0; i < in[k].n; i++) *p++ = (int32_t)at(&in[k], i);
    ret = PyLong_FromLongLong(total);
out:
    buf_release(&iv);
    buf_release(&ov);
    for (int k = 0; k < 4; k++) buf_release(&in[k].b);
    return ret;
}

/* Refresher: plan() of a captured host plan (cuda_ref.wrapper.DecodeWrapper with plan_in_graph) in
 * one C call, with everything fixed at the capture held here: the settings, the captured sizes, the
 * pinned buffer the captured copy reads, the wrapper's two plans whose buffers take turns (the one
 * in use and the spare), the event the last copy recorded and the driver's query for it.
 *
 * A refresh waits for the last replay's copy to have read the pinned buffer (the event queried; not
 * done yet or an error: the wrapper's wait(), which synchronises or raises), plans the batch into the
 * spare plan's buffers and packs it with the batch's lengths into the pinned buffer (plan()'s
 * refresh), then sets what plan()'s Python did: the spare plan object's fields, the wrapper's plans in
 * use and the uploader's record of its last pack. Between two decode steps everything a step reads is
 * cold, and each object or page touched costs (docs/benchmarks.md, bench_plan_context): one call on
 * one struct touches fewer than the same steps in Python. */

/* The event that the last copy out of a pinned buffer records, and how to wait for it: the common
 * prefix of Refresher and LengthsWriter (which share set_event, event and copy_wait). */
typedef struct {
    void *event;              /* the CUevent (NULL: none yet) */
    int (*query)(void *);     /* cuEventQuery (NULL: wait() whenever there is an event) */
    PyObject *wait;           /* called when the query does not say the copy is done: synchronises or raises */
} CopyEvent;

typedef struct {
    PyObject_HEAD
    CopyEvent copy;
} WithCopyEvent;

/* 0 once the last copy has read the buffer (the event queried; not done yet, or an error: wait()),
 * -1 with wait()'s error. */
static int copy_wait(CopyEvent *c) {
    if (!c->event || (c->query && c->query(c->event) == 0)) return 0;
    PyObject *x = PyObject_CallNoArgs(c->wait);
    if (!x) return -1;
    Py_DECREF(x);
    return 0;
}

/* set_event(event, query): the CUevent the copy records (an int, 0: none) and the address of
 * cuEventQuery (0: call wait() whenever there is an event). */
static PyObject *copy_set_event(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "set_event: 2 arguments");
        return NULL;
    }
    void *ev = PyLong_AsVoidPtr(args[0]), *q = PyLong_AsVoidPtr(args[1]);
    if (PyErr_Occurred()) return NULL;
    CopyEvent *c = &((WithCopyEvent *)self)->copy;
    c->event = ev;
    c->query = (int (*)(void *))q;
    Py_RETURN_NONE;
}

static PyObject *copy_event(PyObject *self, void *closure) {
    return PyLong_FromVoidPtr(((WithCopyEvent *)self)->copy.event);
}

#define COPY_EVENT_METHOD {"set_event", (PyCFunction)(void (*)(void))copy_set_event, METH_FASTCALL, \
    "set_event(event, query): the copy's CUevent and cuEventQuery's address (ints, 0: none)."}
#define COPY_EVENT_GETSET {"event", (getter)copy_event, NULL, "the CUevent queried (0: none)", NULL}

typedef struct {
    PyObject *plan, *dict;    /* the plan object and its __dict__ */
    PyObject *items, *small;  /* its arrays (held: the pointers below are theirs) */
    int32_t *items_p, *small_p;
    int64_t valid;            /* the valid items its items buffer holds (its padding is there past them) */
    PyObject *why;            /* auto: its `_why`, (reason_of, (spec, plan)), which reads the plan when asked */
} Slot;

typedef struct {
    PyObject_HEAD
    CopyEvent copy;           /* first: WithCopyEvent's layout */
    Settings s;
    int64_t B, T, most, N, size, page, last_valid, refreshes;
    PyObject *packed;         /* the pinned buffer's int32 NumPy view (held) */
    int32_t *packed_p;
    PyTypeObject *ndarray;    /* numpy.ndarray: refresh() takes exactly it for seq_lens */
    Slot slot[2];
    int spare;                /* slot[spare]: the plan written next; slot[1 - spare]: the one in use */
    PyObject *wrapper_dict, *uploader_dict, *layout;   /* the wrapper's and the uploader's __dict__, its _layout */
    double marks[4];          /* host clocks of the last refresh (s): start, copy waited for, planned, end */
} Refresher;

enum { K_VALID, K_SPLIT, K_SLOTS, K_MAXQ, K_MAXEND, K_KIND, K_WHY, K_REASON, K_EST, K_SPARE, K_MINE, K_MADE,
       K_HOST_PLAN, K_PAGES, K_REFRESHES, K_PENDING, K_CAPTURED, K_COUNT };
static const char *const key_names[K_COUNT] = {
    "num_valid_items", "split_tokens", "num_slots", "_max_q", "_max_end", "_kind", "_why", "reason",
    "estimates_us", "_spare", "_mine", "_made", "host_plan", "_plan_pages", "plan_refreshes", "pending",
    "copied_in_capture"};
static PyObject *keys[K_COUNT];   /* interned at the module's import */

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);   /* time.perf_counter's clock on Linux */
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* A writable C-contiguous int32 NumPy-or-buffer array of at least `need` entries, its data pointer
 * (the object must stay alive: the caller holds it); NULL with a ValueError naming `name`. */
static int32_t *held_int32(PyObject *obj, Py_ssize_t need, int ndim, const char *name) {
    Buf b = {0};
    int32_t *p = out_buf(obj, &b, need, name);
    if (p && b.ndim != ndim) {
        PyErr_Format(PyExc_ValueError, "%s: must have %d dimension(s)", name, ndim);
        p = NULL;
    }
    buf_release(&b);   /* a NumPy array's data does not move while it is referenced */
    return p;
}

static int slot_init(Slot *sl, PyObject *plan, int64_t N, int64_t small_n, const char *which) {
    PyObject *d = PyObject_GenericGetDict(plan, NULL);
    if (!d) return -1;
    sl->plan = plan, sl->dict = d;
    Py_INCREF(plan);
    PyObject *items = PyDict_GetItemString(d, "items"), *small = PyDict_GetItemString(d, "_small");
    PyObject *valid = PyDict_GetItemString(d, "num_valid_items");
    if (!items || !small || !valid) {
        PyErr_Format(PyExc_ValueError, "%s: not a plan of the C planner", which);
        return -1;
    }
    sl->items = items, sl->small = small;
    Py_INCREF(items);
    Py_INCREF(small);
    sl->valid = PyLong_AsLongLong(valid);
    if (sl->valid == -1 && PyErr_Occurred()) return -1;
    Buf b = {0};
    if (!buf_get(items, &b, 1) || b.ndim != 2 || b.shape[0] != 5 || b.shape[1] != N || b.itemsize != 4 || !b.is_int) {
        buf_release(&b);
        PyErr_Format(PyExc_ValueError, "%s: items must be a writable C-contiguous int32 [5, %lld] array", which,
                     (long long)N);
        return -1;
    }
    sl->items_p = (int32_t *)b.buf;
    buf_release(&b);
    sl->small_p = held_int32(small, small_n, 1, "small");
    return sl->small_p ? 0 : -1;
}

static int refresher_traverse(Refresher *r, visitproc visit, void *arg) {
    for (int k = 0; k < 2; k++) {
        Py_VISIT(r->slot[k].plan);
        Py_VISIT(r->slot[k].dict);
        Py_VISIT(r->slot[k].items);
        Py_VISIT(r->slot[k].small);
        Py_VISIT(r->slot[k].why);
    }
    Py_VISIT(r->packed);
    Py_VISIT(r->ndarray);
    Py_VISIT(r->wrapper_dict);
    Py_VISIT(r->uploader_dict);
    Py_VISIT(r->layout);
    Py_VISIT(r->copy.wait);
    return 0;
}

static int refresher_clear(Refresher *r) {
    for (int k = 0; k < 2; k++) {
        Py_CLEAR(r->slot[k].plan);
        Py_CLEAR(r->slot[k].dict);
        Py_CLEAR(r->slot[k].items);
        Py_CLEAR(r->slot[k].small);
        Py_CLEAR(r->slot[k].why);
    }
    Py_CLEAR(r->packed);
    Py_CLEAR(r->ndarray);
    Py_CLEAR(r->wrapper_dict);
    Py_CLEAR(r->uploader_dict);
    Py_CLEAR(r->layout);
    Py_CLEAR(r->copy.wait);
    return 0;
}

static void refresher_dealloc(Refresher *r) {
    PyObject_GC_UnTrack(r);
    refresher_clear(r);
    Py_TYPE(r)->tp_free((PyObject *)r);
}

/* Refresher(settings, B, T, most, packed, size, page, spare, mine, wrapper_dict, uploader_dict, layout,
 *           why, spec, wait)
 *
 * B, T: the captured batch's requests and query rows; most: the most query rows one request may have;
 * packed: the pinned buffer's int32 view; size: the packed plan's entries (the uploader's record);
 * page: the page size; spare, mine: the wrapper's spare plan and the plan in use (both made by the C
 * planner at these sizes); layout: the uploader's _layout list (its [0]: (items, size, valid items) of
 * the last pack, or None); why, spec: for an `auto` plan, reason_of(spec, plan) (a plan's reason and
 * estimates, read from the plan when asked: each plan's `_why`) and the PlanSpec, else None;
 * wait: called when the event's query does not say the copy is done. */
static PyObject *refresher_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
    PyObject *settings, *packed, *spare, *mine, *wd, *ud, *layout, *why, *spec, *wait;
    long long B, T, most, size, page;
    if (kw && PyDict_GET_SIZE(kw)) {
        PyErr_SetString(PyExc_TypeError, "Refresher: positional arguments only");
        return NULL;
    }
    if (!PyArg_ParseTuple(args, "SLLLOLLOOO!O!O!OOO:Refresher", &settings, &B, &T, &most, &packed, &size, &page,
                          &spare, &mine, &PyDict_Type, &wd, &PyDict_Type, &ud, &PyList_Type, &layout, &why, &spec,
                          &wait))
        return NULL;
    if (PyBytes_GET_SIZE(settings) != (Py_ssize_t)sizeof(Settings)) {
        PyErr_SetString(PyExc_ValueError, "Refresher: settings of another layout");
        return NULL;
    }
    if (B < 1 || T < 1 || most < 1 || page < 1 || PyList_GET_SIZE(layout) < 1 || !PyCallable_Check(wait) ||
        spare == mine) {
        PyErr_SetString(PyExc_ValueError, "Refresher: B, T, most and page must be >= 1, layout a non-empty list, "
                        "wait callable, spare and mine two plans");
        return NULL;
    }
    Refresher *r = (Refresher *)type->tp_alloc(type, 0);
    if (!r) return NULL;
    memcpy(&r->s, PyBytes_AS_STRING(settings), sizeof(Settings));
    r->B = B, r->T = T, r->most = most, r->size = size, r->page = page;
    r->spare = 0;
    PyObject *items = NULL;
    PyObject *d = PyObject_GenericGetDict(mine, NULL);
    if (d) {
        items = PyDict_GetItemString(d, "items");
        Py_DECREF(d);
    }
    if (!items) {
        PyErr_SetString(PyExc_ValueError, "mine: not a plan of the C planner");
        goto fail;
    }
    Buf b = {0};
    if (!buf_get(items, &b, 0) || b.ndim != 2) {
        buf_release(&b);
        PyErr_SetString(PyExc_ValueError, "mine: items must be a C-contiguous [5, N] array");
        goto fail;
    }
    r->N = b.shape[1];
    buf_release(&b);
    int64_t small_n = 2 * B + 1 + 2 * T;
    if (slot_init(&r->slot[0], spare, r->N, small_n, "spare") < 0 || slot_init(&r->slot[1], mine, r->N, small_n, "mine") < 0)
        goto fail;
    r->packed_p = held_int32(packed, packed_with_lengths(r->N, B, T), 1, "packed");
    if (!r->packed_p) goto fail;
    r->packed = packed, r->ndarray = Py_TYPE(packed);
    Py_INCREF(packed);
    Py_INCREF(r->ndarray);
    PyObject *last = PyList_GET_ITEM(layout, 0);
    r->last_valid = -1;
    if (last != Py_None) {
        if (!PyTuple_Check(last) || PyTuple_GET_SIZE(last) != 3) {
            PyErr_SetString(PyExc_ValueError, "layout[0]: must be None or (items, size, valid items)");
            goto fail;
        }
        r->last_valid = PyLong_AsLongLong(PyTuple_GET_ITEM(last, 2));
        if (r->last_valid == -1 && PyErr_Occurred()) goto fail;
    }
    r->wrapper_dict = wd, r->uploader_dict = ud, r->layout = layout, r->copy.wait = wait;
    Py_INCREF(wd);
    Py_INCREF(ud);
    Py_INCREF(layout);
    Py_INCREF(wait);
    for (int k = 0; why != Py_None && k < 2; k++) {   /* each plan's reason, read from it when asked */
        Slot *sl = &r->slot[k];
        if (!(sl->why = Py_BuildValue("(O(OO))", why, spec, sl->plan))) goto fail;
        int known = PyDict_Contains(sl->dict, keys[K_REASON]);   /* already read: it is this plan's */
        if (known < 0 || (!known && PyDict_SetItem(sl->dict, keys[K_WHY], sl->why))) goto fail;
    }
    return (PyObject *)r;
fail:
    Py_DECREF(r);
    return NULL;
}

/* 1 if `a` may still be written (its owner may have made it read-only since). */
static int still_writable(PyObject *a) {
#ifdef SPLITKV_NUMPY
    if (numpy_api && PyArray_CheckExact(a)) return PyArray_ISWRITEABLE((PyArrayObject *)a);
#endif
    Buf b = {0};
    int ok = buf_get(a, &b, 1);
    buf_release(&b);
    return ok;
}

static int set_int(PyObject *d, int key, long long v) {
    PyObject *o = PyLong_FromLongLong(v);
    if (!o) return -1;
    int rc = PyDict_SetItem(d, keys[key], o);
    Py_DECREF(o);
    return rc;
}

/* refresh(seq_lens, q_lens, query_start_loc): the refreshed plan (the wrapper's spare plan object,
 * now in use), or None where plan() must take the full way (nothing written): seq_lens not a NumPy
 * array, a batch the C planner hands back, other sizes than captured or more query rows in one
 * request, the spare plan's arrays made read-only since. */
static PyObject *refresher_refresh(Refresher *r, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "refresh: 3 arguments (seq_lens, q_lens, query_start_loc)");
        return NULL;
    }
    if (Py_TYPE(args[0]) != r->ndarray) Py_RETURN_NONE;
    long kind = args[2] != Py_None ? 2 : args[1] != Py_None ? 1 : 0;
    PyObject *q = kind == 2 ? args[2] : args[1];
    double t0 = now_s();
    if (copy_wait(&r->copy) < 0) return NULL;   /* the last replay's copy has read the pinned buffer */
    double t1 = now_s();
    Slot *sp = &r->slot[r->spare], *cur = &r->slot[1 - r->spare];
    if (!still_writable(sp->items) || !still_writable(sp->small)) Py_RETURN_NONE;
    Batch bt;
    int ok = plan_batch(&r->s, args[0], kind, q, &bt);
    if (ok > 0 && (bt.B != r->B || bt.T != r->T || bt.max_q > r->most || bt.N != r->N)) ok = 0;
    if (ok > 0 && write_plan(&r->s, &bt, sp->items_p, sp->small_p, r->packed_p, sp->valid, r->last_valid) < 0)
        ok = -1;
    batch_free(&bt);
    if (ok <= 0) {
        if (ok < 0) return NULL;
        Py_RETURN_NONE;
    }
    double t2 = now_s();
    const int64_t W = bt.W;
    sp->valid = r->last_valid = W;
    /* the spare plan object as the plan just written (NativePlanner.make's fields) */
    PyObject *d = sp->dict;
    if (set_int(d, K_VALID, W) || set_int(d, K_SPLIT, bt.split) || set_int(d, K_SLOTS, bt.num_slots) ||
        set_int(d, K_MAXQ, bt.max_q) || set_int(d, K_MAXEND, bt.longest) || set_int(d, K_KIND, kind))
        return NULL;
    if (sp->why) {   /* auto: the reason read from the plan when asked (one read before is stale) */
        int known = PyDict_Contains(d, keys[K_REASON]);
        if (known < 0 || (known && (PyDict_DelItem(d, keys[K_REASON]) || PyDict_DelItem(d, keys[K_EST]))))
            return NULL;
        PyObject *was = PyDict_GetItemWithError(d, keys[K_WHY]);
        if (was != sp->why && (PyErr_Occurred() || PyDict_SetItem(d, keys[K_WHY], sp->why))) return NULL;
    }
    /* the wrapper: this plan in use, the other one spare */
    PyObject *wd = r->wrapper_dict, *n = PyDict_GetItemWithError(wd, keys[K_REFRESHES]);
    long long count = n ? PyLong_AsLongLong(n) : 0;
    if (PyErr_Occurred() || PyDict_SetItem(wd, keys[K_SPARE], cur->plan) || PyDict_SetItem(wd, keys[K_MINE], sp->plan) ||
        PyDict_SetItem(wd, keys[K_MADE], sp->plan) || PyDict_SetItem(wd, keys[K_HOST_PLAN], sp->plan) ||
        set_int(wd, K_PAGES, ceil_div(bt.longest, r->page)) || set_int(wd, K_REFRESHES, count + 1))
        return NULL;
    /* the uploader: a pack not copied yet, of these items */
    PyObject *last = Py_BuildValue("(LLL)", (long long)r->N, (long long)r->size, (long long)W);
    if (!last || PyList_SetItem(r->layout, 0, last) || PyDict_SetItem(r->uploader_dict, keys[K_PENDING], Py_True) ||
        PyDict_SetItem(r->uploader_dict, keys[K_CAPTURED], Py_False))
        return NULL;
    r->spare = 1 - r->spare;
    r->refreshes++;
    r->marks[0] = t0, r->marks[1] = t1, r->marks[2] = t2, r->marks[3] = now_s();
    Py_INCREF(sp->plan);
    return sp->plan;
}

/* parts: host µs of the last refresh, {"wait", "plan", "after"}; {} before the first. */
static PyObject *refresher_parts(Refresher *r, void *closure) {
    if (!r->refreshes) return PyDict_New();
    const double *m = r->marks;
    return Py_BuildValue("{sdsdsd}", "wait", (m[1] - m[0]) * 1e6, "plan", (m[2] - m[1]) * 1e6, "after",
                         (m[3] - m[2]) * 1e6);
}

static PyMethodDef refresher_methods[] = {
    {"refresh", (PyCFunction)(void (*)(void))refresher_refresh, METH_FASTCALL,
     "refresh(seq_lens, q_lens, query_start_loc): the refreshed plan, or None (the full way)."},
    COPY_EVENT_METHOD,
    {NULL, NULL, 0, NULL},
};

static PyMemberDef refresher_members[] = {
    {"batch_size", T_LONGLONG, offsetof(Refresher, B), READONLY, "the captured batch's requests"},
    {"num_rows", T_LONGLONG, offsetof(Refresher, T), READONLY, "the captured batch's query rows"},
    {"most_rows", T_LONGLONG, offsetof(Refresher, most), READONLY, "the most query rows one request may have"},
    {"refreshes", T_LONGLONG, offsetof(Refresher, refreshes), READONLY, "refreshes made"},
    {NULL, 0, 0, 0, NULL},
};

static PyGetSetDef refresher_getset[] = {
    {"parts", (getter)refresher_parts, NULL, "host µs of the last refresh: wait, plan, after", NULL},
    COPY_EVENT_GETSET,
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject RefresherType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "_splitkv_plan.Refresher",
    .tp_basicsize = sizeof(Refresher),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "A captured host plan's plan() in one C call (see plan_fast.c).",
    .tp_new = refresher_new,
    .tp_dealloc = (destructor)refresher_dealloc,
    .tp_traverse = (traverseproc)refresher_traverse,
    .tp_clear = (inquiry)refresher_clear,
    .tp_methods = refresher_methods,
    .tp_members = refresher_members,
    .tp_getset = refresher_getset,
};

/* LengthsWriter: cuda_ref.wrapper.StepInputs(in_graph=True).write() in one C call: a step's seq_lens
 * [B] and query_start_loc [B + 1] (int32 / int64 NumPy arrays) into the pinned buffer a captured copy
 * reads, once the last replay's copy has read it (the event queried as the Refresher does). Anything
 * else (another length or dtype, a list) is declined, and StepInputs writes it (or reports it). */
typedef struct {
    PyObject_HEAD
    CopyEvent copy;                 /* first: WithCopyEvent's layout */
    PyObject *seq_dst, *qsl_dst;    /* the pinned buffer's two int32 views (held) */
    int32_t *seq_p, *qsl_p;
    int64_t B;
} LengthsWriter;

static int writer_traverse(LengthsWriter *w, visitproc visit, void *arg) {
    Py_VISIT(w->seq_dst);
    Py_VISIT(w->qsl_dst);
    Py_VISIT(w->copy.wait);
    return 0;
}

static int writer_clear(LengthsWriter *w) {
    Py_CLEAR(w->seq_dst);
    Py_CLEAR(w->qsl_dst);
    Py_CLEAR(w->copy.wait);
    return 0;
}

static void writer_dealloc(LengthsWriter *w) {
    PyObject_GC_UnTrack(w);
    writer_clear(w);
    Py_TYPE(w)->tp_free((PyObject *)w);
}

/* LengthsWriter(seq_dst, qsl_dst, wait): seq_dst an int32 [B] view, qsl_dst an int32 [B + 1] view of
 * the pinned buffer (B >= 1); wait() is called when the event's query does not say the copy is done. */
static PyObject *writer_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
    PyObject *seq, *qsl, *wait;
    if ((kw && PyDict_GET_SIZE(kw)) || !PyArg_ParseTuple(args, "OOO:LengthsWriter", &seq, &qsl, &wait)) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "LengthsWriter: positional arguments only");
        return NULL;
    }
    Buf b = {0};
    int ok = buf_get(seq, &b, 1);
    Py_ssize_t n = ok ? b.shape[0] : 0;
    buf_release(&b);
    if (!ok || n < 1 || !PyCallable_Check(wait)) {
        PyErr_SetString(PyExc_ValueError, "LengthsWriter: seq_dst must be a writable int32 [B >= 1] buffer, wait callable");
        return NULL;
    }
    LengthsWriter *w = (LengthsWriter *)type->tp_alloc(type, 0);
    if (!w) return NULL;
    w->B = n;
    if (!(w->seq_p = held_int32(seq, n, 1, "seq_dst")) || !(w->qsl_p = held_int32(qsl, n + 1, 1, "qsl_dst"))) {
        Py_DECREF(w);
        return NULL;
    }
    w->seq_dst = seq, w->qsl_dst = qsl, w->copy.wait = wait;
    Py_INCREF(seq);
    Py_INCREF(qsl);
    Py_INCREF(wait);
    return (PyObject *)w;
}

/* write(seq_lens, query_start_loc): True when written; False (nothing written) for anything but 1-D
 * C-contiguous int32 / int64 arrays of B and B + 1 entries. Values are stored as int32 the way
 * NumPy's assignment casts them. */
static PyObject *writer_write(LengthsWriter *w, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "write: 2 arguments (seq_lens, query_start_loc)");
        return NULL;
    }
    IntIn a = {.b = {.held = 0}}, q = {.b = {.held = 0}};
    PyObject *ret = Py_False;
    if (!int_in(args[0], &a) || !int_in(args[1], &q) || a.n != w->B || q.n != w->B + 1) goto out;
    /* values the int32 buffer cannot hold, or offsets out of order: StepInputs writes (and refuses) them */
    for (int64_t i = 0; i < w->B; i++) {
        int64_t x = at(&a, i);
        if (x < 0 || x > INT32_MAX) goto out;
    }
    if (at(&q, 0) != 0) goto out;
    for (int64_t i = 1; i <= w->B; i++) {
        int64_t x = at(&q, i);
        if (x < at(&q, i - 1) || x > INT32_MAX) goto out;
    }
    if (copy_wait(&w->copy) < 0) {
        ret = NULL;
        goto out;
    }
    for (int64_t i = 0; i < w->B; i++) w->seq_p[i] = (int32_t)at(&a, i);
    for (int64_t i = 0; i <= w->B; i++) w->qsl_p[i] = (int32_t)at(&q, i);
    ret = Py_True;
out:
    buf_release(&a.b);
    buf_release(&q.b);
    Py_XINCREF(ret);
    return ret;
}

static PyMethodDef writer_methods[] = {
    {"write", (PyCFunction)(void (*)(void))writer_write, METH_FASTCALL,
     "write(seq_lens, query_start_loc): True when written, False where StepInputs must write it."},
    COPY_EVENT_METHOD,
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef writer_getset[] = {
    COPY_EVENT_GETSET,
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject LengthsWriterType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "_splitkv_plan.LengthsWriter",
    .tp_basicsize = sizeof(LengthsWriter),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "StepInputs(in_graph=True).write() in one C call (see plan_fast.c).",
    .tp_new = writer_new,
    .tp_dealloc = (destructor)writer_dealloc,
    .tp_traverse = (traverseproc)writer_traverse,
    .tp_clear = (inquiry)writer_clear,
    .tp_methods = writer_methods,
    .tp_getset = writer_getset,
};

static PyMethodDef methods[] = {
    {"plan", (PyCFunction)(void (*)(void))plan, METH_FASTCALL, "The common-case plan (see the file's comment)."},
    {"pack", (PyCFunction)(void (*)(void))pack, METH_FASTCALL, "A plan's device arrays into one int32 buffer."},
    {"ascend_words", (PyCFunction)(void (*)(void))ascend_words, METH_FASTCALL, "An Ascend plan's words (balanced)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_splitkv_plan", NULL, -1, methods};

PyMODINIT_FUNC PyInit__splitkv_plan(void) {
#ifdef SPLITKV_NUMPY
    numpy_api = _import_array() >= 0;   /* without it, every array goes through the buffer protocol */
    if (!numpy_api) PyErr_Clear();
#endif
    for (int k = 0; k < K_COUNT; k++)
        if (!keys[k] && !(keys[k] = PyUnicode_InternFromString(key_names[k]))) return NULL;
    if (PyType_Ready(&RefresherType) < 0 || PyType_Ready(&LengthsWriterType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m && (PyModule_AddObjectRef(m, "Refresher", (PyObject *)&RefresherType) != 0 ||
              PyModule_AddObjectRef(m, "LengthsWriter", (PyObject *)&LengthsWriterType) != 0)) {
        Py_DECREF(m);
        return NULL;
    }
#ifdef SPLITKV_NUMPY
    if (m && PyModule_AddIntConstant(m, "NUMPY_API", numpy_api) != 0) {
        Py_DECREF(m);
        return NULL;
    }
#else
    if (m && PyModule_AddIntConstant(m, "NUMPY_API", 0) != 0) {
        Py_DECREF(m);
        return NULL;
    }
#endif
    if (m && PyModule_AddIntConstant(m, "SETTINGS_BYTES", (long)sizeof(Settings)) != 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
