// The CPU twin's pipe model: which pipe issued each access to local (UB) and global memory, the
// ordering edges the program creates, and the race check. Also the per-core work counters the
// cost estimate reads (scripts/npu_estimate.py). A TEST DOUBLE: nothing here ran on an NPU.
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
enum Pipe : uint8_t { P_S = 0, P_V, P_M, P_MTE1, P_MTE2, P_MTE3, P_FIX, P_NUM };
inline const char* pipe_name(int p) {
    static const char* n[] = {"S", "V", "M", "MTE1", "MTE2", "MTE3", "FIX"};
    return p >= 0 && p < P_NUM ? n[p] : "?";
}
struct VC {
    uint32_t c[P_NUM] = {0};
    void join(const VC& o) {
        for (int i = 0; i < P_NUM; i++)
            if (o.c[i] > c[i]) c[i] = o.c[i];
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
    uint64_t queueWaits = 0;         // implicit TQue waits (DeQue, AllocTensor after FreeTensor)
    uint64_t syncAll = 0;
    uint64_t dcci = 0;
};

// ---- global memory shadow (per launch): byte -> last writer (block, epoch, pipe, seq, site),
// pending cache state. Pages of 4 KiB allocated on first write.
struct GmPage {
    static constexpr uint32_t kBytes = 4096;
    uint16_t wblock[kBytes];  // writer block + 1 (0: written by nobody in this launch)
    uint16_t wepoch[kBytes];  // SyncAll epoch of the write
    uint32_t wseq[kBytes];
    uint16_t wsite[kBytes];
    uint8_t wpipe[kBytes];
    uint16_t dmaw[kBytes];    // block + 1 whose DMA wrote it and has not invalidated its data cache since
    uint16_t sdirty[kBytes];  // block + 1 whose scalar wrote it and has not cleaned its data cache since
};
struct Gm {
    std::unordered_map<uintptr_t, GmPage*> pages;
    uint16_t epoch = 0;
    void clear() {
        for (auto& kv : pages) std::free(kv.second);
        pages.clear();
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
constexpr int kEvents = 16;

struct FlagEntry {
    VC vc;
    uint16_t site;
};

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
    uint32_t ubUsed = 0;
    int allocs[16] = {0};
    std::deque<FlagEntry> flags[kEvents][8];
    uint32_t issued[P_NUM] = {0};
    VC know[P_NUM];
    Stats st;

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

// Hook set by the launcher: SyncAll hands the turn to the other blocks (sim_runtime.cpp).
inline void (*&sync_all_hook())() {
    static void (*h)() = nullptr;
    return h;
}

// ---- issuing and ordering
inline Ins issue(Pipe p, const char* api, const Loc& loc) {
    Core& c = core();
    Ins i;
    i.pipe = p;
    i.seq = ++c.issued[p];
    i.site = intern(api, loc);
    i.k = c.know[p];
    i.k.join(c.know[P_S]);
    c.st.ins[p]++;
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

// Global memory: `block` is the running block; cross-block conflicts need a SyncAll between.
inline void gm_access(const Ins& i, const void* ptr, uint64_t n, bool write) {
    Core& c = core();
    Gm& g = gm();
    const uint16_t me = uint16_t(c.blockIdx + 1);
    const uintptr_t a0 = reinterpret_cast<uintptr_t>(ptr);
    for (uintptr_t a = a0; a < a0 + n;) {
        const uintptr_t pg = a / GmPage::kBytes;
        const uintptr_t end = std::min<uintptr_t>(a0 + n, (pg + 1) * GmPage::kBytes);
        GmPage* p = write ? g.get(pg) : g.find(pg);
        if (p) {
            for (uintptr_t x = a; x < end; x++) {
                const uint32_t o = uint32_t(x % GmPage::kBytes);
                const uint16_t wb = p->wblock[o];
                if (wb && wb != me && p->wepoch[o] == g.epoch)
                    fail("gm-race", std::string(write ? "write" : "read") + " of GM byte " + std::to_string(x - a0) +
                                        " of an operand by block " + std::to_string(me - 1) + " (" + site_str(i.site) +
                                        ") and a write of it by block " + std::to_string(wb - 1) + " (" +
                                        site_str(p->wsite[o]) + ") with no SyncAll between");
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
                if (write) {
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
            }
        }
        a = end;
    }
}
// DataCacheCleanAndInvalid: the lines [ptr, ptr + n) (or the whole cache) of this core are
// written back and dropped.
inline void gm_dcci(const void* ptr, uint64_t n, bool entire) {
    Core& c = core();
    Gm& g = gm();
    const uint16_t me = uint16_t(c.blockIdx + 1);
    auto clean = [me](GmPage* p, uint32_t o0, uint32_t o1) {
        for (uint32_t o = o0; o < o1; o++) {
            if (p->dmaw[o] == me) p->dmaw[o] = 0;
            if (p->sdirty[o] == me) p->sdirty[o] = 0;
        }
    };
    if (entire) {
        for (auto& kv : g.pages) clean(kv.second, 0, GmPage::kBytes);
        return;
    }
    const uintptr_t a0 = reinterpret_cast<uintptr_t>(ptr), a1 = a0 + n;
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

}  // namespace sim

#endif  // SPLITKV_SIM_PIPES_H
