// Host side of the CPU twin: runs a kernel entry once per block index on a fresh simulated core
// (empty 192 KiB UB, nothing written, no pipe history) and reports the first rule violation.
// Built with the kernel sources into one shared library driven from Python (ctypes).
//
// Blocks run one at a time, each on its own thread, in a chosen order (forward, reverse, or a
// seeded shuffle: sim_set_block_order). A block calling SyncAll() hands the turn to the next
// block; when every block has reached it, the SyncAll epoch advances and they go on. Global
// memory written by two blocks in one epoch, or written by one and read by another, is a
// [gm-race]; a block that ends while others wait in SyncAll is a [syncall] error (a hang on the
// device). At the end of each block, a SetFlag never waited is a [flag] error.
// sim_last_stats() returns the per-block work counters of the last launch as JSON.
#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <functional>
#include <memory>
#include <mutex>
#include <random>
#include <sstream>
#include <thread>

#include "kernel_operator.h"
#include "splitkv_tiling.h"

#ifdef SPLITKV_SIM_KERNELS
extern "C" void splitkv_split(GM_ADDR q, GM_ADDR kCache, GM_ADDR vCache, GM_ADDR blockTable, GM_ADDR kvQuant,
                              GM_ADDR plan, GM_ADDR workspace, GM_ADDR tiling);
extern "C" void splitkv_combine(GM_ADDR workspace, GM_ADDR plan, GM_ADDR out, GM_ADDR lse, GM_ADDR tiling);
#endif

namespace {
int g_order = 0;  // 0 forward, 1 reverse, >= 2: shuffle seeded with the value
std::string g_stats = "[]";

struct Sched {
    std::mutex m;
    std::condition_variable cv;
    std::vector<int> order;
    std::vector<int> state;  // 0 ready, 1 waiting in SyncAll, 2 finished
    std::vector<std::unique_ptr<sim::Core>> cores;
    int cur = -1;
    bool abort = false;
    std::string err;
    int errBlock = -1;
    int rc = 0;

    int pick() const {
        for (int b : order)
            if (state[b] == 0) return b;
        return -1;
    }
    // Called with the lock held by the block giving up its turn.
    void next() {
        cur = pick();
        if (cur < 0) {
            bool waiting = false;
            for (int s : state) waiting |= s == 1;
            bool finished = false;
            for (int s : state) finished |= s == 2;
            if (waiting && finished) {
                if (!abort) {
                    for (size_t b = 0; b < state.size(); b++)
                        if (state[b] == 2) {
                            fail_locked(int(b), 1, "[syncall] block " + std::to_string(b) +
                                                       " finished while other blocks wait in SyncAll (a hang on the device)");
                            break;
                        }
                }
            } else if (waiting) {  // everyone arrived: the next epoch
                sim::gm().epoch++;
                for (int& s : state) s = 0;
                cur = pick();
            }
        }
        if (cur >= 0) sim::cur_core() = cores[cur].get();
        cv.notify_all();
    }
    void fail_locked(int b, int code, const std::string& msg) {
        if (!abort) {
            abort = true;
            err = msg;
            errBlock = b;
            rc = code;
        }
        cur = -1;
        cv.notify_all();
    }
};
Sched* g_sched = nullptr;

void sync_all_turn() {
    Sched& s = *g_sched;
    std::unique_lock<std::mutex> lk(s.m);
    const int me = s.cur;
    s.state[me] = 1;
    s.next();
    s.cv.wait(lk, [&] { return s.abort || s.cur == me; });
    if (s.abort) throw sim::Abort();
    sim::cur_core() = s.cores[me].get();
}

void end_of_block_checks() {
    sim::Core& c = sim::core();
    static const char* names[] = {"MTE2_V", "V_MTE2", "MTE3_V", "V_MTE3", "V_S", "S_V",
                                  "MTE2_S", "S_MTE2", "MTE3_S", "S_MTE3", "MTE2_MTE3", "MTE3_MTE2"};
    for (int e = 0; e < 12; e++)
        for (int id = 0; id < 8; id++)
            if (!c.flags[e][id].empty())
                sim::fail("flag", std::string("SetFlag<HardEvent::") + names[e] + ">(" + std::to_string(id) + ") (" +
                                      sim::site_str(c.flags[e][id].front().site) +
                                      ") never waited by the end of the kernel");
}

std::string stats_json(const std::vector<std::unique_ptr<sim::Core>>& cores) {
    std::ostringstream o;
    o << "[";
    for (size_t b = 0; b < cores.size(); b++) {
        const sim::Stats& s = cores[b]->st;
        if (b) o << ",";
        o << "{\"block\":" << b << ",\"ins\":{";
        for (int p = 0; p < sim::P_NUM; p++) o << (p ? "," : "") << "\"" << sim::pipe_name(p) << "\":" << s.ins[p];
        o << "},\"dma_bytes\":{\"MTE2\":" << s.dmaBytes[sim::P_MTE2] << ",\"MTE3\":" << s.dmaBytes[sim::P_MTE3]
          << "},\"dma_bursts\":{\"MTE2\":" << s.dmaBursts[sim::P_MTE2] << ",\"MTE3\":" << s.dmaBursts[sim::P_MTE3]
          << "},\"vec_repeats\":" << s.vecRepeats << ",\"vec_elems\":" << s.vecElems << ",\"s_ub_reads\":" << s.sUbReads
          << ",\"s_ub_writes\":" << s.sUbWrites << ",\"s_gm_reads\":" << s.sGmReads << ",\"s_gm_writes\":" << s.sGmWrites
          << ",\"set_flags\":" << s.setFlags << ",\"wait_flags\":" << s.waitFlags << ",\"waits_to_s\":" << s.waitsToS
          << ",\"v_to_s\":" << s.vToS << ",\"barrier_v\":" << s.barrierV << ",\"barrier_all\":" << s.barrierAll
          << ",\"queue_waits\":" << s.queueWaits << ",\"sync_all\":" << s.syncAll << ",\"dcci\":" << s.dcci
          << ",\"ub_used\":" << cores[b]->ubUsed << "}";
    }
    o << "]";
    return o.str();
}

// Run fn for every block index. Returns 0, or 1 with the violation in err (2: unexpected error).
int launch(int blockDim, const std::function<void()>& fn, char* err, int errLen, unsigned* ubPeak) {
    Sched s;
    s.order.resize(size_t(blockDim));
    for (int b = 0; b < blockDim; b++) s.order[size_t(b)] = b;
    if (g_order == 1) std::reverse(s.order.begin(), s.order.end());
    if (g_order >= 2) std::shuffle(s.order.begin(), s.order.end(), std::mt19937(unsigned(g_order)));
    s.state.assign(size_t(blockDim), 0);
    for (int b = 0; b < blockDim; b++) {
        s.cores.emplace_back(new sim::Core());
        s.cores.back()->blockIdx = b;
        s.cores.back()->blockNum = blockDim;
    }
    sim::gm().clear();
    g_sched = &s;
    sim::sync_all_hook() = &sync_all_turn;

    auto body = [&s, &fn](int b) {
        {
            std::unique_lock<std::mutex> lk(s.m);
            s.cv.wait(lk, [&] { return s.abort || s.cur == b; });
            if (s.abort) {
                s.state[size_t(b)] = 2;
                return;
            }
            sim::cur_core() = s.cores[size_t(b)].get();
        }
        int code = 0;
        std::string msg;
        try {
            fn();
            end_of_block_checks();
        } catch (const sim::Violation& e) {
            code = 1;
            msg = e.what();
        } catch (const sim::Abort&) {
            code = -1;
        } catch (const std::exception& e) {
            code = 2;
            msg = std::string("unexpected C++ exception: ") + e.what();
        }
        std::unique_lock<std::mutex> lk(s.m);
        s.state[size_t(b)] = 2;
        if (code > 0) {
            s.fail_locked(b, code, msg);
        } else if (!s.abort) {
            s.next();
        }
    };
    std::vector<std::thread> threads;
    for (int b = 0; b < blockDim; b++) threads.emplace_back(body, b);
    {
        std::unique_lock<std::mutex> lk(s.m);
        s.cur = s.pick();
        if (s.cur >= 0) sim::cur_core() = s.cores[size_t(s.cur)].get();
        s.cv.notify_all();
    }
    for (auto& t : threads) t.join();
    sim::cur_core() = nullptr;
    sim::sync_all_hook() = nullptr;
    g_sched = nullptr;
    g_stats = stats_json(s.cores);
    sim::gm().clear();
    if (s.rc) {
        std::snprintf(err, size_t(errLen), "block %d: %s", s.errBlock, s.err.c_str());
        return s.rc;
    }
    unsigned peak = 0;
    for (auto& c : s.cores) peak = std::max(peak, c->ubUsed);
    if (ubPeak) *ubPeak = peak;
    return 0;
}
}  // namespace

extern "C" void sim_set_block_order(int order) { g_order = order; }

// The work counters of the last launch (JSON list, one object per block). Returns the length
// needed; the text is copied when it fits.
extern "C" int sim_last_stats(char* buf, int len) {
    const int n = int(g_stats.size()) + 1;
    if (buf && len >= n) std::memcpy(buf, g_stats.c_str(), size_t(n));
    return n;
}

#ifdef SPLITKV_SIM_KERNELS
extern "C" int sim_launch_split(int blockDim, uint8_t* q, uint8_t* k, uint8_t* v, uint8_t* bt, uint8_t* quant,
                                uint8_t* plan, uint8_t* ws, uint8_t* tiling, char* err, int errLen, unsigned* ubPeak) {
    return launch(blockDim, [&] { splitkv_split(q, k, v, bt, quant, plan, ws, tiling); }, err, errLen, ubPeak);
}

extern "C" int sim_launch_combine(int blockDim, uint8_t* ws, uint8_t* plan, uint8_t* out, uint8_t* lse,
                                  uint8_t* tiling, char* err, int errLen, unsigned* ubPeak) {
    return launch(blockDim, [&] { splitkv_combine(ws, plan, out, lse, tiling); }, err, errLen, ubPeak);
}

#endif  // SPLITKV_SIM_KERNELS

// For the twin's own tests: run any one-argument kernel entry.
extern "C" int sim_launch_1(void (*fn)(uint8_t*), uint8_t* arg, int blockDim, char* err, int errLen) {
    return launch(blockDim, [&] { fn(arg); }, err, errLen, nullptr);
}
