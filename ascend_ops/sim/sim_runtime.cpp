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
//
// Mixed launches (sim_launch_mix_1): per AI core one cube context (AIC) and two vector contexts
// (AIV), each on its own thread, one at a time; a context gives up its turn at SyncAll and when
// CrossCoreWaitFlag finds its counter at 0, so contexts interleave at those points. Cross-core
// edges (CrossCoreSetFlag -> CrossCoreWaitFlag, SyncAll) carry vector clocks between contexts, and
// GM accesses of two contexts are a [gm-race] unless such an edge orders them. A wait that can
// never be satisfied is a [cross-flag] error (a hang), as is a set nobody waits for.
// sim_last_stats() returns the per-block work counters of the last launch as JSON.
#include <algorithm>
#include <array>
#include <map>
#include <tuple>
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
extern "C" void splitkv_split_mix(GM_ADDR q, GM_ADDR kCache, GM_ADDR vCache, GM_ADDR blockTable, GM_ADDR kvQuant,
                                  GM_ADDR plan, GM_ADDR workspace, GM_ADDR tiling);
extern "C" void splitkv_attention_mix(GM_ADDR q, GM_ADDR kCache, GM_ADDR vCache, GM_ADDR blockTable,
                                      GM_ADDR kvQuant, GM_ADDR plan, GM_ADDR workspace, GM_ADDR tiling, GM_ADDR out,
                                      GM_ADDR lse);
#endif

namespace {
int g_order = 0;  // 0 forward, 1 reverse, >= 2: shuffle seeded with the value
int g_aic = 0, g_aiv = 0;  // the device's AI (cube) and vector cores: a SyncAll launch may not exceed them (0: unchecked)
std::string g_stats = "[]";

using Token = std::pair<sim::VC, int>;  // a cross-core counter unit: the setter's clock, its call site

struct Sched {
    std::mutex m;
    std::condition_variable cv;
    std::vector<int> order;
    std::vector<int> state;  // 0 ready, 1 waiting in SyncAll, 2 finished, 3 blocked in CrossCoreWaitFlag
    std::vector<std::unique_ptr<sim::Core>> cores;
    int cur = -1;
    bool abort = false;
    std::string err;
    int errBlock = -1;
    int rc = 0;
    // mixed launches
    bool mixed = false;
    std::vector<int> syncKind;                     // kind of the SyncAll a context waits in
    std::vector<int> waitFlag;                     // flag id a blocked context waits for
    std::vector<sim::VC> syncResult;               // the clock union handed back by SyncAll
    sim::VC syncUnion[2];
    std::vector<std::array<std::deque<Token>, 16>> cnt;                      // counters per context, flag id
    std::map<std::tuple<int, int, int>, std::map<int, std::deque<Token>>> pend;  // (mode, group, id) -> member sets
    // run-ahead (happens-before): per (context, flag id) the cross-wait clock entry (sim::P_XW) of
    // each of its waits, in order; per (setter, target, flag id) the setter's sets so far
    std::vector<std::array<std::vector<uint32_t>, 16>> waitIdx;
    std::map<std::tuple<int, int, int>, uint32_t> setCount;

    bool aiv(int b) const { return !mixed || b % 3 != 0; }
    bool runnable(int b) const {
        return state[b] == 0 || (state[b] == 3 && !cnt[size_t(b)][size_t(waitFlag[b])].empty());
    }
    int rotateFrom = -1;  // mixed: after a cross-core set, try the contexts after the setter first
    int pick() const {
        if (rotateFrom >= 0) {
            const size_t n = order.size();
            size_t pos = 0;
            while (pos < n && order[pos] != rotateFrom) pos++;
            for (size_t i = 1; i <= n; i++)
                if (runnable(order[(pos + i) % n])) return order[(pos + i) % n];
            return -1;
        }
        for (int b : order)
            if (runnable(b)) return b;
        return -1;
    }
    // Mixed launches: are all participants of a SyncAll of this kind waiting in it?
    bool sync_complete(int kind) const {
        for (size_t b = 0; b < state.size(); b++) {
            const bool part = kind == 1 || aiv(int(b));
            if (part && !(state[b] == 1 && syncKind[b] == kind)) return false;
        }
        return true;
    }
    // Called with the lock held by the block giving up its turn.
    void next() {
        if (mixed) {
            for (int kind = 0; kind < 2; kind++)
                if (sync_complete(kind)) {
                    for (size_t b = 0; b < state.size(); b++)
                        if (state[b] == 1 && syncKind[b] == kind) {
                            state[b] = 0;
                            syncResult[b] = syncUnion[kind];
                        }
                    syncUnion[kind] = sim::VC();
                }
            cur = pick();
            rotateFrom = -1;
            if (cur < 0 && !abort) {
                for (size_t b = 0; b < state.size(); b++)
                    if (state[b] == 3) {
                        fail_locked(int(b), 1, "[cross-flag] " + sim::ctx_name(true, int(b)) +
                                                   " waits forever in CrossCoreWaitFlag(" + std::to_string(waitFlag[b]) +
                                                   "): no CrossCoreSetFlag will raise that counter (a hang on the device)");
                        return;
                    }
                for (size_t b = 0; b < state.size(); b++)
                    if (state[b] == 1) {
                        fail_locked(int(b), 1, "[syncall] " + sim::ctx_name(true, int(b)) +
                                                   " waits in SyncAll that not every participating core reaches "
                                                   "(a hang on the device)");
                        return;
                    }
            }
            if (cur >= 0) sim::cur_core() = cores[size_t(cur)].get();
            cv.notify_all();
            return;
        }
        cur = pick();
        if (cur < 0) {
            bool waiting = false;
            for (int st : state) waiting |= st == 1;
            bool finished = false;
            for (int st : state) finished |= st == 2;
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
                for (int& st : state) st = 0;
                cur = pick();
            }
        }
        if (cur >= 0) sim::cur_core() = cores[size_t(cur)].get();
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
    // Give up the turn until this context is picked again.
    void yield_locked(std::unique_lock<std::mutex>& lk, int me) {
        next();
        cv.wait(lk, [&] { return abort || cur == me; });
        if (abort) throw sim::Abort();
        sim::cur_core() = cores[size_t(me)].get();
    }
};
Sched* g_sched = nullptr;

sim::VC sync_all_turn(int kind, const sim::VC& token) {
    Sched& s = *g_sched;
    std::unique_lock<std::mutex> lk(s.m);
    const int me = s.cur;
    // SyncAll needs every block resident at once: blocks beyond the cores wait for a core that the
    // blocks in SyncAll never give back (a hang on the device)
    const int blocks = s.mixed ? int(s.state.size()) / 3 : int(s.state.size()), cores = s.mixed ? g_aic : g_aiv;
    if (cores > 0 && blocks > cores)
        throw sim::Violation("[syncall] SyncAll in a launch of " + std::to_string(blocks) + (s.mixed ? " AI cores" : " blocks") +
                             " on a device with " + std::to_string(cores) + (s.mixed ? " AI (cube) cores" : " vector cores") +
                             ": the blocks past the cores start only when others end, and those wait in SyncAll "
                             "(a hang on the device)");
    s.state[size_t(me)] = 1;
    if (s.mixed) {
        s.syncKind[size_t(me)] = kind;
        s.syncUnion[kind].join(token);
    }
    s.yield_locked(lk, me);
    return s.mixed ? s.syncResult[size_t(me)] : sim::VC();
}

// Cross-core counters (mixed launches). `packed` = flagId * 65536 + call site.
void push_counter(Sched& s, int target, int id, const Token& t, const char* who) {
    auto& q = s.cnt[size_t(target)][size_t(id)];
    q.push_back(t);
    if (q.size() > sim::limits::kCrossFlagMaxPending)
        throw sim::Violation("[cross-flag] counter " + std::to_string(id) + " of " + sim::ctx_name(true, target) +
                             " set more than 15 times without a wait (" + who + ", " + sim::site_str(uint16_t(t.second)) +
                             "; CrossCoreSetFlag page: at most 15 pending sets)");
}
// A counter holds at most kCrossFlagMaxPending (15) sets. Whether some schedule overflows it does
// not depend on the one the twin runs: the k-th set of a setter onto a counter must be ordered
// (happens-before, through cross-core edges) after that counter's (k - 15)-th wait, or in some
// schedule the setter runs that far ahead. Checked at every set, whatever the block order.
void check_run_ahead(Sched& s, int me, int target, int id, const Token& t) {
    const uint32_t k = ++s.setCount[std::make_tuple(me, target, id)];
    const uint32_t lim = sim::limits::kCrossFlagMaxPending;
    if (k <= lim) return;
    const uint32_t j = k - lim;
    const auto& waits = s.waitIdx[size_t(target)][size_t(id)];
    const size_t at = size_t(target) * sim::P_NUM + sim::P_XW;
    if (j <= waits.size() && at < t.first.x.size() && t.first.x[at] >= waits[j - 1]) return;
    throw sim::Violation("[cross-flag] CrossCoreSetFlag(" + std::to_string(id) + ") number " + std::to_string(k) + " by " +
                         sim::ctx_name(true, me) + " (" + sim::site_str(uint16_t(t.second)) + ") onto the counter of " +
                         sim::ctx_name(true, target) + " runs ahead of its waits: a counter holds at most " +
                         std::to_string(lim) + " pending sets, so this set must be ordered after that counter's wait "
                         "number " + std::to_string(j) + ", and no cross-core edge orders it so (in some schedule "
                         "the counter overflows; CrossCoreSetFlag page: counts 0-15)");
}
void cross_set(int mode, int packed, const sim::VC& token) {
    Sched& s = *g_sched;
    std::unique_lock<std::mutex> lk(s.m);
    const int me = s.cur, id = packed / 65536, b = me / 3;
    const Token t{token, packed % 65536};
    const bool aic = me % 3 == 0;
    // the group whose every member must set before the counters go up, and who gets them
    std::vector<int> members, targets;
    int group = -1;
    if (mode == 2 && aic) {  // AIC -> both AIVs of its AI core, at once
        check_run_ahead(s, me, me + 1, id, t);
        check_run_ahead(s, me, me + 2, id, t);
        push_counter(s, me + 1, id, t, "CrossCoreSetFlag mode 2");
        push_counter(s, me + 2, id, t, "CrossCoreSetFlag mode 2");
        s.rotateFrom = me;  // a set hands the turn on: the contexts interleave at every cross-core edge
        s.yield_locked(lk, me);
        return;
    }
    if (mode == 2) {  // AIV: the AIC's counter rises once both AIVs have set
        members = {3 * b + 1, 3 * b + 2};
        targets = {3 * b};
        group = b;
    } else if (mode == 1) {
        if (aic) throw sim::Violation("[cross-flag] CrossCoreSetFlag mode 1 (between the two AIVs of an AI core) on " +
                                      sim::ctx_name(true, me) + " (" + sim::site_str(uint16_t(t.second)) + ")");
        members = targets = {3 * b + 1, 3 * b + 2};
        group = b;
    } else {  // mode 0: all cores of this type
        for (size_t c = 0; c < s.state.size(); c++)
            if ((int(c) % 3 == 0) == aic) members.push_back(int(c));
        targets = members;
        group = aic ? -1 : -2;
    }
    for (int tg : targets) check_run_ahead(s, me, tg, id, t);
    auto& per = s.pend[std::make_tuple(mode, group, id)];
    per[me].push_back(t);
    bool all = true;
    for (int m : members) all = all && !per[m].empty();
    if (!all) {
        s.rotateFrom = me;
        s.yield_locked(lk, me);
        return;
    }
    Token joined{sim::VC(), t.second};
    for (int m : members) {
        joined.first.join(per[m].front().first);
        per[m].pop_front();
    }
    for (int tg : targets) push_counter(s, tg, id, joined, "CrossCoreSetFlag");
    s.rotateFrom = me;
    s.yield_locked(lk, me);
}
sim::VC cross_wait(int /*mode*/, int packed) {
    Sched& s = *g_sched;
    std::unique_lock<std::mutex> lk(s.m);
    const int me = s.cur, id = packed / 65536;
    auto& q = s.cnt[size_t(me)][size_t(id)];
    if (q.empty()) {
        sim::core().st.crossBlocked++;
        s.state[size_t(me)] = 3;
        s.waitFlag[size_t(me)] = id;
        s.yield_locked(lk, me);
        s.state[size_t(me)] = 0;
    }
    Token t = q.front();
    q.pop_front();
    sim::Core& c = sim::core();  // this wait's place on the context's cross-wait clock
    c.issued[sim::P_XW]++;
    c.know[sim::P_S].c[sim::P_XW] = c.issued[sim::P_XW];
    s.waitIdx[size_t(me)][size_t(id)].push_back(c.issued[sim::P_XW]);
    return t.first;
}

void end_of_block_checks() {
    sim::Core& c = sim::core();
    for (int e = 0; e < int(AscendC::HardEvent::MAX); e++)
        for (int id = 0; id < 8; id++)
            if (!c.flags[e][id].empty())
                sim::fail("flag", std::string("SetFlag<HardEvent::") + AscendC::detail::ev_name(AscendC::HardEvent(e)) +
                                      ">(" + std::to_string(id) + ") (" + sim::site_str(c.flags[e][id].front().site) +
                                      ") never waited by the end of the kernel");
}

// After a mixed launch ended without error: every cross-core set was consumed by a wait.
std::string unconsumed_cross_sets(const Sched& s) {
    for (size_t c = 0; c < s.cnt.size(); c++)
        for (int id = 0; id < 16; id++)
            if (!s.cnt[c][size_t(id)].empty())
                return "[cross-flag] CrossCoreSetFlag(" + std::to_string(id) + ") (" +
                       sim::site_str(uint16_t(s.cnt[c][size_t(id)].front().second)) + ") raised the counter of " +
                       sim::ctx_name(true, int(c)) + ", which never waits for it by the end of the kernel";
    for (const auto& kv : s.pend)
        for (const auto& mq : kv.second)
            if (!mq.second.empty())
                return "[cross-flag] CrossCoreSetFlag(" + std::to_string(std::get<2>(kv.first)) + ") mode " +
                       std::to_string(std::get<0>(kv.first)) + " by " + sim::ctx_name(true, mq.first) + " (" +
                       sim::site_str(uint16_t(mq.second.front().second)) +
                       ") never completed: the other cores of its group did not set it too";
    return "";
}

std::string stats_json(const std::vector<std::unique_ptr<sim::Core>>& cores) {
    std::ostringstream o;
    o << "[";
    for (size_t b = 0; b < cores.size(); b++) {
        const sim::Stats& s = cores[b]->st;
        const sim::Core& c = *cores[b];
        if (b) o << ",";
        o << "{\"block\":" << b << ",\"core_type\":\"" << (c.coreType == sim::CT_AIC ? "AIC" : "AIV")
          << "\",\"block_idx\":" << (c.mixed && c.coreType == sim::CT_AIV ? c.blockIdx * 2 + c.subIdx : c.blockIdx)
          << ",\"ins\":{";
        for (int p = 0; p < sim::kHwPipes; p++) o << (p ? "," : "") << "\"" << sim::pipe_name(p) << "\":" << s.ins[p];
        o << "},\"dma_bytes\":{\"MTE2\":" << s.dmaBytes[sim::P_MTE2] << ",\"MTE3\":" << s.dmaBytes[sim::P_MTE3]
          << "},\"dma_bursts\":{\"MTE2\":" << s.dmaBursts[sim::P_MTE2] << ",\"MTE3\":" << s.dmaBursts[sim::P_MTE3]
          << "},\"vec_repeats\":" << s.vecRepeats << ",\"vec_elems\":" << s.vecElems << ",\"s_ub_reads\":" << s.sUbReads
          << ",\"s_ub_writes\":" << s.sUbWrites << ",\"s_gm_reads\":" << s.sGmReads << ",\"s_gm_writes\":" << s.sGmWrites
          << ",\"set_flags\":" << s.setFlags << ",\"wait_flags\":" << s.waitFlags << ",\"waits_to_s\":" << s.waitsToS
          << ",\"v_to_s\":" << s.vToS << ",\"barrier_v\":" << s.barrierV << ",\"vec_reduces\":" << s.vecReduces << ",\"barrier_all\":" << s.barrierAll
          << ",\"queue_waits\":" << s.queueWaits << ",\"sync_all\":" << s.syncAll << ",\"dcci\":" << s.dcci
          << ",\"ub_used\":" << c.ubPeak << ",\"mmad_calls\":" << s.mmadCalls
          << ",\"cube_fractal_macs\":" << s.cubeFractalMacs << ",\"cube_macs\":" << s.cubeMacs
          << ",\"l1_in_bytes\":" << s.l1InBytes << ",\"l0_bytes\":" << s.l0Bytes << ",\"fix_bytes\":" << s.fixBytes
          << ",\"fix_rows\":" << s.fixRows << ",\"cross_sets\":" << s.crossSets << ",\"cross_waits\":" << s.crossWaits
          << ",\"cross_blocked\":" << s.crossBlocked << ",\"l2_bytes\":" << s.l2Bytes << "}";
    }
    o << "]";
    return o.str();
}

// Run fn for every block index (mixed: for every AIC and AIV context, AIC b then its AIVs).
// Returns 0, or 1 with the violation in err (2: unexpected error).
int launch(int blockDim, const std::function<void()>& fn, char* err, int errLen, unsigned* ubPeak, bool mixed = false) {
    Sched s;
    s.mixed = mixed;
    const int n = mixed ? 3 * blockDim : blockDim;
    s.order.resize(size_t(n));
    for (int b = 0; b < n; b++) s.order[size_t(b)] = b;
    if (g_order == 1) std::reverse(s.order.begin(), s.order.end());
    if (g_order >= 2) std::shuffle(s.order.begin(), s.order.end(), std::mt19937(unsigned(g_order)));
    s.state.assign(size_t(n), 0);
    s.syncKind.assign(size_t(n), 0);
    s.waitFlag.assign(size_t(n), 0);
    s.syncResult.assign(size_t(n), sim::VC());
    s.cnt.resize(size_t(n));
    s.waitIdx.resize(size_t(n));
    for (int b = 0; b < n; b++) {
        s.cores.emplace_back(new sim::Core());
        sim::Core& c = *s.cores.back();
        c.blockIdx = mixed ? b / 3 : b;
        c.blockNum = blockDim;
        if (mixed) {
            c.mixed = true;
            c.ctx = b;
            c.nctx = n;
            c.coreType = b % 3 == 0 ? sim::CT_AIC : sim::CT_AIV;
            c.subIdx = b % 3 == 0 ? 0 : b % 3 - 1;
        }
    }
    sim::gm().clear();
    g_sched = &s;
    sim::sync_all_hook() = &sync_all_turn;
    sim::cross_set_hook() = &cross_set;
    sim::cross_wait_hook() = &cross_wait;

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
    for (int b = 0; b < n; b++) threads.emplace_back(body, b);
    {
        std::unique_lock<std::mutex> lk(s.m);
        s.cur = s.pick();
        if (s.cur >= 0) sim::cur_core() = s.cores[size_t(s.cur)].get();
        s.cv.notify_all();
    }
    for (auto& t : threads) t.join();
    sim::cur_core() = nullptr;
    sim::sync_all_hook() = nullptr;
    sim::cross_set_hook() = nullptr;
    sim::cross_wait_hook() = nullptr;
    g_sched = nullptr;
    g_stats = stats_json(s.cores);
    sim::gm().clear();
    if (!s.rc && mixed) {
        const std::string left = unconsumed_cross_sets(s);
        if (!left.empty()) {
            std::snprintf(err, size_t(errLen), "%s", left.c_str());
            return 1;
        }
    }
    if (s.rc) {
        std::snprintf(err, size_t(errLen), "%s %d: %s", mixed ? "context" : "block", s.errBlock, s.err.c_str());
        return s.rc;
    }
    unsigned peak = 0;
    for (auto& c : s.cores) peak = std::max(peak, c->ubPeak);
    if (ubPeak) *ubPeak = peak;
    return 0;
}
}  // namespace

extern "C" void sim_set_block_order(int order) { g_order = order; }
// The device's cores (the launch's profile): a launch that calls SyncAll with more blocks hangs.
extern "C" void sim_set_cores(int aic, int aiv) {
    g_aic = aic;
    g_aiv = aiv;
}
// Cost-model counting only: GM bytes in [lo, hi) are counted as L2-resident (Stats::l2Bytes).
extern "C" void sim_set_l2_range(uint8_t* lo, uint8_t* hi) {
    sim::l2_range().lo = reinterpret_cast<uintptr_t>(lo);
    sim::l2_range().hi = reinterpret_cast<uintptr_t>(hi);
}

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

// The mixed split stage: blockDim AI cores, each one cube context and two vector contexts.
extern "C" int sim_launch_split_mix(int blockDim, uint8_t* q, uint8_t* k, uint8_t* v, uint8_t* bt, uint8_t* quant,
                                    uint8_t* plan, uint8_t* ws, uint8_t* tiling, char* err, int errLen,
                                    unsigned* ubPeak) {
    return launch(blockDim, [&] { splitkv_split_mix(q, k, v, bt, quant, plan, ws, tiling); }, err, errLen, ubPeak,
                  true);
}

// The fused mixed launch (split, SyncAll, combine).
extern "C" int sim_launch_attention_mix(int blockDim, uint8_t* q, uint8_t* k, uint8_t* v, uint8_t* bt,
                                        uint8_t* quant, uint8_t* plan, uint8_t* ws, uint8_t* tiling, uint8_t* out,
                                        uint8_t* lse, char* err, int errLen, unsigned* ubPeak) {
    return launch(blockDim, [&] { splitkv_attention_mix(q, k, v, bt, quant, plan, ws, tiling, out, lse); }, err,
                  errLen, ubPeak, true);
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

// For the twin's own tests: run any one-argument kernel entry as a mixed (AIC + AIV) launch of
// blockDim AI cores: blockDim cube contexts and 2 * blockDim vector contexts.
extern "C" int sim_launch_mix_1(void (*fn)(uint8_t*), uint8_t* arg, int blockDim, char* err, int errLen) {
    return launch(blockDim, [&] { fn(arg); }, err, errLen, nullptr, true);
}

// A mixed launch of a kernel entry with 1..8 GM_ADDR parameters (the entry's own signature):
// `args` holds them in order.
extern "C" int sim_launch_mix_n(void* fn, int nargs, uint8_t** args, int blockDim, char* err, int errLen) {
    using A = uint8_t*;
    std::function<void()> call;
    switch (nargs) {
        case 1: call = [&] { reinterpret_cast<void (*)(A)>(fn)(args[0]); }; break;
        case 2: call = [&] { reinterpret_cast<void (*)(A, A)>(fn)(args[0], args[1]); }; break;
        case 3: call = [&] { reinterpret_cast<void (*)(A, A, A)>(fn)(args[0], args[1], args[2]); }; break;
        case 4: call = [&] { reinterpret_cast<void (*)(A, A, A, A)>(fn)(args[0], args[1], args[2], args[3]); }; break;
        case 5:
            call = [&] { reinterpret_cast<void (*)(A, A, A, A, A)>(fn)(args[0], args[1], args[2], args[3], args[4]); };
            break;
        case 6:
            call = [&] {
                reinterpret_cast<void (*)(A, A, A, A, A, A)>(fn)(args[0], args[1], args[2], args[3], args[4], args[5]);
            };
            break;
        case 7:
            call = [&] {
                reinterpret_cast<void (*)(A, A, A, A, A, A, A)>(fn)(args[0], args[1], args[2], args[3], args[4], args[5],
                                                                     args[6]);
            };
            break;
        case 8:
            call = [&] {
                reinterpret_cast<void (*)(A, A, A, A, A, A, A, A)>(fn)(args[0], args[1], args[2], args[3], args[4],
                                                                        args[5], args[6], args[7]);
            };
            break;
        default:
            std::snprintf(err, size_t(errLen), "sim_launch_mix_n: %d arguments (1..8 supported)", nargs);
            return 2;
    }
    return launch(blockDim, call, err, errLen, nullptr, true);
}
