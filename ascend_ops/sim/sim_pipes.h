// The CPU twin's pipe model: which pipe issued each access to local (UB) and global memory, the
// ordering edges the program creates, and the race check. Also the per-core work counters the
// cost estimate reads (splitkv_bench/npu_estimate.py). A TEST DOUBLE: nothing here ran on an NPU.
//
// Model (the Ascend C programming model of a vector core, as documented for SetFlag/WaitFlag,
// PipeBarrier and TQue in the Ascend C API reference, "同步控制" pages):
//   * the scalar unit S runs the program in order and issues every other instruction to its pipe
//     (V vector, MTE2 GM->local copies, MTE3 local->GM copies; M, MTE1, FIX on the cube core);
//   * each pipe executes its instructions in order; for MTE2/MTE3 an instruction starts after the
//     previous one of the same pipe completed; the V pipe is pipelined, so a V instruction that
//     reads what an earlier V instruction wrote needs PipeBarrier<PIPE_V> in between (the
//     PipeBarrier page's example is exactly this read-after-write); a later V write to what an
//     earlier V instruction read or wrote is in order and needs nothing;
//   * between pipes the only order is an edge: SetFlag<A_B>(id) (executes on A once every earlier
//     A instruction completed) matched by WaitFlag<A_B>(id) (blocks B); PipeBarrier<PIPE_ALL>
//     (S waits for every pipe); the implicit flags of TQue (EnQue/DeQue carry MTE2->V on VECIN and
//     V->MTE3 on VECOUT; FreeTensor/AllocTensor carry V->MTE2 and MTE3->V back to the producer:
//     GetQueEvt in ascendc/basic_api/impl/kernel_event.h); SyncAll between cores;
//   * an instruction inherits what S knew when it issued it (S waited for it), so a V->S wait also
//     orders every later instruction of any pipe after those V instructions;
//   * scalar UB/GM reads (GetValue) complete before S issues anything else (assumption: the scalar
//     load is blocking); scalar writes (SetValue) do not become visible to other pipes without an
//     S->X flag (the documented reason for SetFlag<S_V>/<S_MTE3> after SetValue).
// Each (pipe, sequence number) is a point in a vector clock; "ordered" means the accessing
// instruction's clock covers the earlier access.
#ifndef SPLITKV_SIM_PIPES_H
#define SPLITKV_SIM_PIPES_H

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "sim_limits.h"

namespace sim {

struct Violation : std::runtime_error {
    explicit Violation(const std::string& m) : std::runtime_error(m) {}
};
// Thrown into a block that waits while another block failed (unwinds it; never reported).
struct Abort : std::exception {};

[[noreturn]] inline void fail(const char* rule, const std::string& msg) {
    throw Violation(std::string("[") + rule + "] " + msg);
}

// ---- call sites: interned (api, file, line); instructions carry the id
struct Loc {
    const char* file;
    int line;
    Loc(const char* f = __builtin_FILE(), int l = __builtin_LINE()) : file(f), line(l) {}
};
struct SiteInfo {
    const char* api;
    const char* file;
    int line;
};
inline std::vector<SiteInfo>& sites() {
    static std::vector<SiteInfo>* s = new std::vector<SiteInfo>{{"(none)", "?", 0}};
    return *s;
}
inline uint16_t intern(const char* api, const Loc& loc) {
    static std::map<std::tuple<const void*, const void*, int>, uint16_t>* m =
        new std::map<std::tuple<const void*, const void*, int>, uint16_t>();
    auto key = std::make_tuple(static_cast<const void*>(api), static_cast<const void*>(loc.file), loc.line);
    auto it = m->find(key);
    if (it != m->end()) return it->second;
    if (sites().size() >= 65535) return 0;
    uint16_t id = uint16_t(sites().size());
    sites().push_back({api, loc.file, loc.line});
    (*m)[key] = id;
    return id;
}
inline std::string site_str(uint16_t id) {
    const SiteInfo& s = sites()[id < sites().size() ? id : 0];
    const char* f = s.file;
    for (const char* p = s.file; *p; p++)
        if (*p == '/') f = p + 1;
    return std::string(s.api) + " at " + f + ":" + std::to_string(s.line);
}

// ---- pipes and clocks
// P_XW is no pipe: the clock entry that counts a context's CrossCoreWaitFlag calls, so that a
// cross-core set can be checked against the waits it is ordered after (sim_runtime.cpp).
enum Pipe : uint8_t { P_S = 0, P_V, P_M, P_MTE1, P_MTE2, P_MTE3, P_FIX, P_XW, P_NUM };
constexpr int kHwPipes = P_XW;  // the pipes instructions issue to
inline const char* pipe_name(int p) {
    static const char* n[] = {"S", "V", "M", "MTE1", "MTE2", "MTE3", "FIX", "cross-core waits"};
    return p >= 0 && p < P_NUM ? n[p] : "?";
}
// c: this core's pipes. x: only in a mixed (AIC + AIV) launch: what is known complete on every
// execution context of the launch, context-major (x[ctx * P_NUM + pipe] = sequence number); it
// grows only through cross-core edges (CrossCoreWaitFlag, SyncAll) and is carried by every local
// edge like c.
struct VC {
    uint32_t c[P_NUM] = {0};
    std::vector<uint32_t> x;
    void join(const VC& o) {
        for (int i = 0; i < P_NUM; i++)
            if (o.c[i] > c[i]) c[i] = o.c[i];
        if (o.x.size() > x.size()) x.resize(o.x.size(), 0);
        for (size_t i = 0; i < o.x.size(); i++)
            if (o.x[i] > x[i]) x[i] = o.x[i];
    }
};
struct Ins {
    uint8_t pipe;
    uint32_t seq;
    uint16_t site;
    VC k;  // what is known complete when this instruction starts
};

// ---- per-core work counters (cost-model inputs; counts, not times)
struct Stats {
    uint64_t ins[P_NUM] = {0};       // instructions issued per pipe (S: scalar memory operations)
    uint64_t dmaBytes[P_NUM] = {0};  // MTE2: GM -> UB bytes; MTE3: UB -> GM bytes
    uint64_t dmaBursts[P_NUM] = {0}; // contiguous bursts (DataCopy blocks) per DMA pipe
    uint64_t vecRepeats = 0;         // 256-byte repeats of vector instructions
    uint64_t vecElems = 0;           // elements processed by vector instructions
    uint64_t sUbReads = 0, sUbWrites = 0, sGmReads = 0, sGmWrites = 0;
    uint64_t setFlags = 0, waitFlags = 0;
    uint64_t waitsToS = 0;           // waits whose destination is S (X -> S round trips)
    uint64_t vToS = 0;               // V -> S waits: a vector result the scalar unit reads
    uint64_t barrierV = 0, barrierAll = 0;
    uint64_t vecReduces = 0;         // count-mode ReduceSum / ReduceMax: each waits for its own result (a V drain)
    uint64_t queueWaits = 0;         // implicit TQue waits (DeQue, AllocTensor after FreeTensor)
    uint64_t syncAll = 0;
    uint64_t dcci = 0;
    // cube core (AIC) work
    uint64_t mmadCalls = 0;
    uint64_t cubeFractalMacs = 0;    // 16x16x16 fp16/bf16 multiply-accumulate blocks issued to M
    uint64_t cubeMacs = 0;           // m * n * k as given (without padding)
    uint64_t l1InBytes = 0;          // GM -> L1 bytes written (MTE2, incl. ND2NZ zero padding)
    uint64_t l0Bytes = 0;            // L1 -> L0A/L0B bytes (MTE1)
    uint64_t fixBytes = 0;           // L0C -> GM bytes written (FIX)
    uint64_t fixRows = 0;            // rows (bursts) written by Fixpipe
    uint64_t crossSets = 0, crossWaits = 0;  // CrossCoreSetFlag / CrossCoreWaitFlag
    uint64_t crossBlocked = 0;       // CrossCoreWaitFlag calls that found the counter at 0 (had to wait)
    uint64_t l2Bytes = 0;            // DMA / Fixpipe GM bytes inside the launch's L2-resident range
};

// A GM range the launcher marks as L2-resident for the cost model (the mixed kernel's per-core
// scratch: small, rewritten every tile); only counted (Stats::l2Bytes), no behaviour changes.
struct L2Range { uintptr_t lo = 0, hi = 0; };
inline L2Range& l2_range() { static L2Range r; return r; }

// ---- global memory shadow (per launch): byte -> last writer (block, epoch, pipe, seq, site),
// every reader since that write, pending cache state. Pages of 4 KiB allocated on first access.
//
// Readers: the first reader of a byte since its last write is kept inline (r0); any other
// (context, pipe) that reads it before the next write goes on a list in Gm::readers. A write
// checks every one of them, so the verdict does not depend on which reader came last (or on the
// block order): another context's read needs a SyncAll (vector launch: a read in this SyncAll
// epoch) or a cross-core edge (mixed launch) before the write; this context's own read on
// another pipe needs a local edge.
struct GmReader {
    uint16_t ctx = 0;  // context + 1 (block + 1 in a vector launch); 0: none
    uint8_t pipe = 0;
    uint16_t site = 0;
    uint16_t epoch = 0;
    uint32_t seq = 0;
    uint32_t next = 0;  // index + 1 in Gm::readers of the next reader of the same byte
};
struct GmPage {
    static constexpr uint32_t kBytes = 4096;
    static constexpr uint32_t kLine = 64;  // scalar data cache line (DataCacheCleanAndInvalid)
    uint16_t wblock[kBytes];  // writer block + 1 (0: written by nobody in this launch)
    uint16_t wepoch[kBytes];  // SyncAll epoch of the write
    uint32_t wseq[kBytes];
    uint16_t wsite[kBytes];
    uint8_t wpipe[kBytes];
    uint16_t dmaw[kBytes];    // block + 1 whose DMA wrote it and has not invalidated its data cache since
    uint16_t sdirty[kBytes];  // block + 1 whose scalar wrote it and has not cleaned its data cache since
    GmReader r0[kBytes];      // the first reader since the last write (ctx 0: none); its .next: more readers
    uint32_t lver[kBytes / kLine];  // writes to each 64-byte line so far (data cache staleness)
};
struct Gm {
    std::unordered_map<uintptr_t, GmPage*> pages;
    std::vector<GmReader> readers;  // overflow reader lists (GmReader::next)
    uint16_t epoch = 0;
    void clear() {
        for (auto& kv : pages) std::free(kv.second);
        pages.clear();
        readers.clear();
        epoch = 0;
    }
    GmPage* find(uintptr_t pg) const {
        auto it = pages.find(pg);
        return it == pages.end() ? nullptr : it->second;
    }
    GmPage* get(uintptr_t pg) {
        GmPage*& p = pages[pg];
        if (!p) p = static_cast<GmPage*>(std::calloc(1, sizeof(GmPage)));
        return p;
    }
};
inline Gm& gm() {
    static Gm* g = new Gm();
    return *g;
}

// ---- the simulated vector core
constexpr uint32_t kUbBytes = limits::kUbBytes;
constexpr uint32_t kBlock = limits::kUbAlign;
constexpr int kMaxAllocPerPosition = 8;  // AllocTensor page: A2 products, at most 8 outstanding
constexpr int kEvents = 40;  // HardEvent values (kernel_operator.h)

struct FlagEntry {
    VC vc;
    uint16_t site;
};

// Local memories of the cube core (AIC): L1, L0A, L0B, L0C, each with its contents, a "written"
// map and a shadow (last writer; last reader on MTE1, M and FIX) like the UB's.
enum Mem : uint8_t { MEM_UB = 0, MEM_L1, MEM_L0A, MEM_L0B, MEM_L0C, MEM_NUM };
inline const char* mem_name(int m) {
    static const char* n[] = {"UB", "L1", "L0A", "L0B", "L0C"};
    return m >= 0 && m < MEM_NUM ? n[m] : "?";
}
constexpr int kReaders = 3;  // reader pipes of cube memories: MTE1, M, FIX
inline int reader_slot(uint8_t p) { return p == P_MTE1 ? 0 : p == P_M ? 1 : p == P_FIX ? 2 : -1; }
constexpr uint8_t kReaderPipe[kReaders] = {P_MTE1, P_M, P_FIX};
struct Space {
    uint32_t cap = 0, used = 0;
    std::vector<uint8_t> data, written, wpipe;
    std::vector<uint32_t> wseq;
    std::vector<uint16_t> wsite;
    std::vector<uint32_t> rseq[kReaders];
    std::vector<uint16_t> rsite[kReaders];
    // L0C: the Mmad (site) that computed an unwritten ("poisoned") byte from operand elements nothing
    // wrote (a row of A or a column of B, e.g. rows 1-15 of CANN's m = 16 for one query row)
    std::vector<uint16_t> poison;
    // L0C unit flags (Mmad / Fixpipe unitFlag), one per 512-byte block: the bit, and the clock of the
    // Mmad that set it or the Fixpipe that cleared it (the edge the next Fixpipe / Mmad inherits)
    std::vector<uint8_t> unit;
    std::vector<VC> unitVc;
    std::vector<uint16_t> unitSite;
    explicit Space(uint32_t n)
        : cap(n), data(n, 0xA5), written(n, 0), wpipe(n, 0), wseq(n, 0), wsite(n, 0), poison(n, 0),
          unit(n / 512, 0), unitVc(n / 512), unitSite(n / 512, 0) {
        for (int r = 0; r < kReaders; r++) { rseq[r].assign(n, 0); rsite[r].assign(n, 0); }
    }
};
enum CoreType : int { CT_AIV = 0, CT_AIC = 1 };

struct Core {
    uint8_t* ub = nullptr;       // contents
    uint8_t* written = nullptr;  // 1 = written since allocation
    // UB shadow: last writer, last V reader, last MTE3 reader of every byte
    uint32_t* wseq = nullptr;
    uint16_t* wsite = nullptr;
    uint8_t* wpipe = nullptr;
    uint32_t* rseqV = nullptr;
    uint16_t* rsiteV = nullptr;
    uint32_t* rseqM3 = nullptr;
    uint16_t* rsiteM3 = nullptr;
    int64_t blockIdx = 0;
    int64_t blockNum = 1;
    // mixed launches: the core type, the sub-block index of an AIV (0/1), the context index in the
    // launch (AIC b: 3b, AIV (b, s): 3b + 1 + s), the number of contexts; cube memories on an AIC
    int coreType = CT_AIV;
    int subIdx = 0;
    bool mixed = false;
    int ctx = 0;
    int nctx = 0;
    Space* sp[MEM_NUM] = {nullptr};
    void* pipe = nullptr;  // the live AscendC::TPipe (kernel_operator.h: one at a time)
    // the last Mmad issued: its M sequence number, L0C byte range, whether it was small
    // ((m / 16) * (n / 16) < 10: an accumulating Mmad after it needs PipeBarrier<PIPE_M>)
    struct LastMmad { uint32_t seq = 0, lo = 0, hi = 0; bool small = false; uint16_t site = 0; } lastMmad;
    uint32_t ubUsed = 0;  // UB bytes held by the live TPipe
    uint32_t ubPeak = 0;  // the most held at once (what one kernel needs)
    int allocs[16] = {0};
    std::deque<FlagEntry> flags[kEvents][8];
    uint32_t issued[P_NUM] = {0};
    VC know[P_NUM];
    Stats st;
    // scalar data cache: 64-byte GM line -> (its write count when a scalar access brought it in,
    // that access's call site); a line written since (by anyone but this core's scalar) is stale
    struct CachedLine { uint32_t ver; uint16_t site; };
    std::unordered_map<uintptr_t, CachedLine> dcache;

    Core() {
        ub = static_cast<uint8_t*>(std::malloc(kUbBytes));
        written = static_cast<uint8_t*>(std::calloc(kUbBytes, 1));
        wseq = static_cast<uint32_t*>(std::calloc(kUbBytes, 4));
        wsite = static_cast<uint16_t*>(std::calloc(kUbBytes, 2));
        wpipe = static_cast<uint8_t*>(std::calloc(kUbBytes, 1));
        rseqV = static_cast<uint32_t*>(std::calloc(kUbBytes, 4));
        rsiteV = static_cast<uint16_t*>(std::calloc(kUbBytes, 2));
        rseqM3 = static_cast<uint32_t*>(std::calloc(kUbBytes, 4));
        rsiteM3 = static_cast<uint16_t*>(std::calloc(kUbBytes, 2));
        std::memset(ub, 0xA5, kUbBytes);  // stale garbage, never to be read
    }
    ~Core() {
        for (Space* p : sp) delete p;
        for (void* p : {static_cast<void*>(ub), static_cast<void*>(written), static_cast<void*>(wseq),
                        static_cast<void*>(wsite), static_cast<void*>(wpipe), static_cast<void*>(rseqV),
                        static_cast<void*>(rsiteV), static_cast<void*>(rseqM3), static_cast<void*>(rsiteM3)})
            std::free(p);
    }
    Core(const Core&) = delete;
    Core& operator=(const Core&) = delete;
};

inline Core*& cur_core() {
    static Core* c = nullptr;
    return c;
}
inline Core& core() {
    Core*& c = cur_core();
    if (!c) c = new Core();  // a kernel called outside the launcher (never in the tests)
    return *c;
}

// Hook set by the launcher: SyncAll hands the turn to the other blocks (sim_runtime.cpp). In a
// mixed launch it also exchanges clocks: `kind` 0 = AIV-only SyncAll, 1 = all cores; `token` is
// what this context exports; the result is the union over the participants (empty otherwise).
inline VC (*&sync_all_hook())(int, const VC&) {
    static VC (*h)(int, const VC&) = nullptr;
    return h;
}

// ---- issuing and ordering
inline Ins issue(Pipe p, const char* api, const Loc& loc) {
    Core& c = core();
    // AIV pipes: S, V, MTE2 (GM -> UB), MTE3; AIC pipes: S, MTE2 (GM -> L1), MTE1, M, FIX.
    const bool cubePipe = p == P_M || p == P_MTE1 || p == P_FIX, vecPipe = p == P_V || p == P_MTE3;
    if ((c.coreType == CT_AIV && cubePipe) || (c.coreType == CT_AIC && vecPipe))
        fail("core-type", std::string(api) + " issues to pipe " + pipe_name(p) + ", which a " +
                              (c.coreType == CT_AIC ? "cube core (AIC)" : "vector core (AIV)") +
                              " does not have (" + site_str(intern(api, loc)) + ")" +
                              (c.mixed ? "" : "; the cube exists only in a mixed launch (sim_launch_mix)"));
    Ins i;
    i.pipe = p;
    i.seq = ++c.issued[p];
    i.site = intern(api, loc);
    i.k = c.know[p];
    i.k.join(c.know[P_S]);
    c.st.ins[p]++;
    if (p == P_V && std::strncmp(api, "Reduce", 6) == 0) c.st.vecReduces++;
    return i;
}
// Is the earlier access (pipe q, seq n) complete before instruction `i` starts?
inline bool ordered(const Ins& i, uint8_t q, uint32_t n) {
    if (n == 0) return true;
    if (q == i.pipe && q != P_V) return true;  // in-order pipes (and S with itself)
    return i.k.c[q] >= n;
}
inline std::string missing_edge(uint8_t from, uint8_t to) {
    if (from == to) return std::string("PipeBarrier<PIPE_") + pipe_name(from) + ">";
    return std::string("SetFlag/WaitFlag<HardEvent::") + pipe_name(from) + "_" + pipe_name(to) +
           "> (or a queue EnQue/DeQue carrying it)";
}
[[noreturn]] inline void race(const char* kind, const Ins& i, uint8_t q, uint16_t qsite, const char* mem,
                              uint64_t addr, uint32_t n) {
    fail("pipe-race", std::string(kind) + " on " + mem + " byte " + std::to_string(addr) + " (operand of " +
                          std::to_string(n) + " bytes): " + site_str(i.site) + " [pipe " + pipe_name(i.pipe) +
                          "] is not ordered after " + site_str(qsite) + " [pipe " + pipe_name(q) + "]; missing " +
                          missing_edge(q, i.pipe));
}

inline void ub_read(const Ins& i, uint32_t addr, uint32_t n) {
    Core& c = core();
    for (uint32_t b = addr; b < addr + n; b++) {
        if (!ordered(i, c.wpipe[b], c.wseq[b])) race("read-after-write", i, c.wpipe[b], c.wsite[b], "UB", b, n);
    }
    if (i.pipe == P_V) {
        for (uint32_t b = addr; b < addr + n; b++) { c.rseqV[b] = i.seq; c.rsiteV[b] = i.site; }
    } else if (i.pipe == P_MTE3) {
        for (uint32_t b = addr; b < addr + n; b++) { c.rseqM3[b] = i.seq; c.rsiteM3[b] = i.site; }
    }
}
inline void ub_write(const Ins& i, uint32_t addr, uint32_t n) {
    Core& c = core();
    for (uint32_t b = addr; b < addr + n; b++) {
        const uint8_t wp = c.wpipe[b];
        if (!(wp == P_V && i.pipe == P_V) && !ordered(i, wp, c.wseq[b]))
            race("write-after-write", i, wp, c.wsite[b], "UB", b, n);
        if (i.pipe != P_V && !ordered(i, P_V, c.rseqV[b])) race("write-after-read", i, P_V, c.rsiteV[b], "UB", b, n);
        if (!ordered(i, P_MTE3, c.rseqM3[b])) race("write-after-read", i, P_MTE3, c.rsiteM3[b], "UB", b, n);
        c.wpipe[b] = i.pipe;
        c.wseq[b] = i.seq;
        c.wsite[b] = i.site;
    }
}

// Cube memories (L1, L0A, L0B, L0C): the same rules as the UB. Readers are MTE1 (L1), M (L0A,
// L0B, L0C when accumulating) and FIX (L0C); a write must be ordered after the last read on every
// other reader pipe (write-after-read), and after the last write (write-after-write).
inline Space& space(uint8_t m) {
    Core& c = core();
    if (m == MEM_UB || m >= MEM_NUM || !c.sp[m]) fail("position", std::string("no ") + mem_name(m) + " on this core");
    return *c.sp[m];
}
inline void sp_check_written(uint8_t m, uint32_t addr, uint32_t n, const char* api) {
    Space& s = space(m);
    const void* hole = std::memchr(s.written.data() + addr, 0, n);
    if (hole) {
        uint32_t at = addr + uint32_t(static_cast<const uint8_t*>(hole) - (s.written.data() + addr));
        fail("uninit-read", std::string(api) + " reads " + mem_name(m) + " byte " + std::to_string(at) +
                                " (operand at " + std::to_string(addr) + ", " + std::to_string(n) + " bytes) that " +
                                (s.poison[at] ? site_str(s.poison[at]) +
                                                    " computed from A rows / B columns nothing wrote (the unwritten "
                                                    "operand elements reach only the C rows / columns read here)"
                                              : std::string("nothing has written")));
    }
}
inline void sp_read(const Ins& i, uint8_t m, uint32_t addr, uint32_t n) {
    Space& s = space(m);
    const int slot = reader_slot(i.pipe);
    for (uint32_t b = addr; b < addr + n; b++) {
        if (!ordered(i, s.wpipe[b], s.wseq[b])) race("read-after-write", i, s.wpipe[b], s.wsite[b], mem_name(m), b, n);
        if (slot >= 0) { s.rseq[slot][b] = i.seq; s.rsite[slot][b] = i.site; }
    }
}
inline void sp_write(const Ins& i, uint8_t m, uint32_t addr, uint32_t n) {
    Space& s = space(m);
    for (uint32_t b = addr; b < addr + n; b++) {
        if (!ordered(i, s.wpipe[b], s.wseq[b])) race("write-after-write", i, s.wpipe[b], s.wsite[b], mem_name(m), b, n);
        for (int r = 0; r < kReaders; r++)
            if (kReaderPipe[r] != i.pipe && !ordered(i, kReaderPipe[r], s.rseq[r][b]))
                race("write-after-read", i, kReaderPipe[r], s.rsite[r][b], mem_name(m), b, n);
        s.wpipe[b] = i.pipe;
        s.wseq[b] = i.seq;
        s.wsite[b] = i.site;
        s.written[b] = 1;
    }
}

// The identity of the running execution context in the GM shadow: its block index + 1, or in a
// mixed launch its context index + 1 (AIC and AIV block indices overlap).
inline uint16_t gm_me() {
    Core& c = core();
    return uint16_t((c.mixed ? c.ctx : c.blockIdx) + 1);
}
inline std::string ctx_name(bool mixed, int id) {
    if (!mixed) return "block " + std::to_string(id);
    const int b = id / 3, s = id % 3;
    if (s == 0) return "AIC " + std::to_string(b);
    return "AIV " + std::to_string(2 * b + s - 1) + " (sub-block " + std::to_string(s - 1) + " of AIC " +
           std::to_string(b) + ")";
}
// Is the access `i` of this context ordered after (context wctx, pipe q, seq n) of another one?
// Only cross-core edges of a mixed launch (CrossCoreSetFlag/WaitFlag, SyncAll) can say so.
inline bool x_ordered(const Ins& i, int wctx, uint8_t q, uint32_t n) {
    const size_t at = size_t(wctx) * P_NUM + q;
    return at < i.k.x.size() && i.k.x[at] >= n;
}

// Global memory: `block` is the running block; cross-block conflicts need a SyncAll between (or,
// in a mixed launch, a cross-core edge: then the reader's clock must cover the write, and a write
// must be ordered after every read of another context since the last write).
[[noreturn]] inline void gm_war(const Ins& i, bool mixed, uint16_t me, const GmReader& r, uint64_t at) {
    if (r.ctx == me) race("write-after-read", i, r.pipe, r.site, "GM", at, 0);
    fail("gm-race", "write of GM byte " + std::to_string(at) + " of an operand by " + ctx_name(mixed, me - 1) + " (" +
                        site_str(i.site) + ") while " + ctx_name(mixed, r.ctx - 1) + " may still read it (" +
                        site_str(r.site) + "): no " +
                        (mixed ? "cross-core edge (CrossCoreSetFlag/CrossCoreWaitFlag) or SyncAll" : "SyncAll") +
                        " between the read and the write");
}
// Is a write `i` by `me` ordered after the read `r`?
inline bool gm_war_ok(const Ins& i, bool mixed, uint16_t me, uint16_t epoch, const GmReader& r) {
    // (a scalar read completes before S issues anything else: the model's assumption above)
    if (r.ctx == me) return r.pipe == i.pipe || r.pipe == P_S || ordered(i, r.pipe, r.seq);
    if (mixed) return x_ordered(i, r.ctx - 1, r.pipe, r.seq);
    return r.epoch != epoch;  // vector launch: only a SyncAll orders blocks
}
inline void gm_note_read(Gm& g, GmReader& head, const Ins& i, uint16_t me) {
    const GmReader mine{me, i.pipe, i.site, g.epoch, i.seq, 0};
    if (!head.ctx) {
        head = mine;
        return;
    }
    for (GmReader* r = &head;; r = &g.readers[r->next - 1]) {
        if (r->ctx == me && r->pipe == i.pipe) {  // the later read of the same context and pipe stands for both
            r->site = i.site;
            r->seq = i.seq;
            r->epoch = g.epoch;
            return;
        }
        if (!r->next) break;
    }
    GmReader extra = mine;
    extra.next = head.next;
    g.readers.push_back(extra);
    head.next = uint32_t(g.readers.size());
}
inline void gm_access(const Ins& i, const void* ptr, uint64_t n, bool write) {
    Core& c = core();
    Gm& g = gm();
    const uint16_t me = gm_me();
    const bool mixed = c.mixed;
    const uintptr_t a0 = reinterpret_cast<uintptr_t>(ptr);
    if (i.pipe != P_S && a0 >= l2_range().lo && a0 + n <= l2_range().hi) c.st.l2Bytes += n;
    for (uintptr_t a = a0; a < a0 + n;) {
        const uintptr_t pg = a / GmPage::kBytes;
        const uintptr_t end = std::min<uintptr_t>(a0 + n, (pg + 1) * GmPage::kBytes);
        GmPage* p = g.get(pg);
        for (uintptr_t x = a; x < end; x++) {
            const uint32_t o = uint32_t(x % GmPage::kBytes);
            const uint16_t wb = p->wblock[o];
            if (wb && wb != me && p->wepoch[o] == g.epoch && !(mixed && x_ordered(i, wb - 1, p->wpipe[o], p->wseq[o])))
                fail("gm-race", std::string(write ? "write" : "read") + " of GM byte " + std::to_string(x - a0) +
                                    " of an operand by " + ctx_name(mixed, me - 1) + " (" + site_str(i.site) +
                                    ") and a write of it by " + ctx_name(mixed, wb - 1) + " (" + site_str(p->wsite[o]) +
                                    ") with " +
                                    (mixed ? "no cross-core edge (CrossCoreSetFlag/CrossCoreWaitFlag) or SyncAll"
                                           : "no SyncAll") + " between");
            if (wb == me && p->wepoch[o] == g.epoch) {
                const uint8_t wp = p->wpipe[o];
                if (!(write && wp == P_V && i.pipe == P_V) && !ordered(i, wp, p->wseq[o]))
                    race(write ? "write-after-write" : "read-after-write", i, wp, p->wsite[o], "GM", x - a0,
                         uint32_t(n));
            }
            if (!write && i.pipe == P_S && p->dmaw[o] == me)
                fail("dcache", "scalar read of GM (" + site_str(i.site) + ") of bytes this core's DMA wrote (" +
                                   site_str(p->wsite[o]) +
                                   ") without DataCacheCleanAndInvalid: the scalar data cache may hold the old line");
            if (!write && i.pipe != P_S && p->sdirty[o])
                fail("dcache", "DMA read of GM (" + site_str(i.site) + ") of bytes a scalar SetValue wrote (" +
                                   site_str(p->wsite[o]) +
                                   ") without DataCacheCleanAndInvalid: the line may still sit in the data cache");
            if (!write) {
                gm_note_read(g, p->r0[o], i, me);
                continue;
            }
            for (const GmReader* r = &p->r0[o]; r && r->ctx; r = r->next ? &g.readers[r->next - 1] : nullptr)
                if (!gm_war_ok(i, mixed, me, g.epoch, *r)) gm_war(i, mixed, me, *r, x - a0);
            p->r0[o] = GmReader();
            p->wblock[o] = me;
            p->wepoch[o] = g.epoch;
            p->wpipe[o] = i.pipe;
            p->wseq[o] = i.seq;
            p->wsite[o] = i.site;
            if (i.pipe == P_S) {
                p->sdirty[o] = me;
                p->dmaw[o] = 0;
            } else {
                p->dmaw[o] = me;
                p->sdirty[o] = 0;
            }
        }
        // the scalar data cache, by 64-byte line: a write makes every other copy of the line stale
        // (this core's scalar write updates its own copy); a scalar read of a stale copy fails,
        // else it caches the line
        for (uintptr_t line = a / GmPage::kLine; line * GmPage::kLine < end; line++) {
            uint32_t& ver = p->lver[(line * GmPage::kLine % GmPage::kBytes) / GmPage::kLine];
            if (write) ver++;
            if (i.pipe != P_S) continue;
            auto it = c.dcache.find(line);
            if (!write && it != c.dcache.end() && it->second.ver != ver) {
                const uint64_t at = std::max<uintptr_t>(line * GmPage::kLine, a0) - a0;
                const uint32_t o = uint32_t((a0 + at) % GmPage::kBytes);
                fail("dcache", "scalar read of GM (" + site_str(i.site) + ") of a 64-byte line this core's data cache "
                                   "holds since " + site_str(it->second.site) + ", written since by " +
                                   ctx_name(mixed, p->wblock[o] ? p->wblock[o] - 1 : me - 1) + " (" +
                                   site_str(p->wsite[o]) +
                                   ") with no DataCacheCleanAndInvalid between: the read returns the stale line");
            }
            c.dcache[line] = Core::CachedLine{ver, i.site};
        }
        a = end;
    }
}
// DataCacheCleanAndInvalid: the lines [ptr, ptr + n) (or the whole cache) of this core are
// written back and dropped.
inline void gm_dcci(const void* ptr, uint64_t n, bool entire) {
    Gm& g = gm();
    Core& c = core();
    const uint16_t me = gm_me();
    auto clean = [me](GmPage* p, uint32_t o0, uint32_t o1) {
        for (uint32_t o = o0; o < o1; o++) {
            if (p->dmaw[o] == me) p->dmaw[o] = 0;
            if (p->sdirty[o] == me) p->sdirty[o] = 0;
        }
    };
    if (entire) {
        for (auto& kv : g.pages) clean(kv.second, 0, GmPage::kBytes);
        c.dcache.clear();
        return;
    }
    const uintptr_t a0 = reinterpret_cast<uintptr_t>(ptr), a1 = a0 + n;
    for (uintptr_t line = a0 / GmPage::kLine; line * GmPage::kLine < a1; line++) c.dcache.erase(line);
    for (uintptr_t a = a0; a < a1;) {
        const uintptr_t pg = a / GmPage::kBytes;
        const uintptr_t end = std::min<uintptr_t>(a1, (pg + 1) * GmPage::kBytes);
        if (GmPage* p = g.find(pg)) clean(p, uint32_t(a % GmPage::kBytes), uint32_t((end - 1) % GmPage::kBytes) + 1);
        a = end;
    }
}

// Edges. A flag's knowledge: everything its source pipe issued so far is complete.
inline VC source_done(Pipe src) {
    Core& c = core();
    VC f = c.know[src];
    f.join(c.know[P_S]);
    f.c[src] = c.issued[src];
    return f;
}
inline void wait_on(Pipe dst, const VC& f) { core().know[dst].join(f); }
inline void barrier(Pipe p) {
    Core& c = core();
    c.know[p].c[p] = c.issued[p];
}
inline void barrier_all() {
    Core& c = core();
    VC f;
    for (int p = 0; p < P_NUM; p++) {
        f.join(c.know[p]);
        f.c[p] = c.issued[p];
    }
    for (int p = 0; p < P_NUM; p++) c.know[p].join(f);
}

// ---- cross-core edges (mixed launches)
// What this context exports through a cross-core edge issued on `src`: everything `src` has
// completed (and what it knew), as entries of the launch-wide clock x; local entries stay local.
inline VC export_done(Pipe src) {
    Core& c = core();
    VC f = source_done(src);
    VC t;
    t.x = f.x;
    if (t.x.size() < size_t(c.nctx) * P_NUM) t.x.resize(size_t(c.nctx) * P_NUM, 0);
    for (int q = 0; q < P_NUM; q++) {
        uint32_t& e = t.x[size_t(c.ctx) * P_NUM + q];
        if (f.c[q] > e) e = f.c[q];
    }
    return t;
}
// Runtime hooks (sim_runtime.cpp): a cross-core set (mode, flag id, token), a wait (mode, flag id;
// returns the token it consumed), SyncAll (kind 0: all AIV (or all blocks of a vector launch),
// 1: every context of a mixed launch; token in, union of the participants' tokens out).
inline void (*&cross_set_hook())(int, int, const VC&) {
    static void (*h)(int, int, const VC&) = nullptr;
    return h;
}
inline VC (*&cross_wait_hook())(int, int) {
    static VC (*h)(int, int) = nullptr;
    return h;
}

}  // namespace sim

#endif  // SPLITKV_SIM_PIPES_H
