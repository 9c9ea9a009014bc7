"""Critical-path estimate of the mixed split-KV decode launch on a 910B. ESTIMATES: nothing here ran
on an NPU.

A throughput model (work per pipe / rate, the slowest pipe wins) suits a loop whose stages overlap;
a decode step that exchanges tiles between the cube core and the vector cores through GM is bound
by its dependency chain instead. This model replays one AI core's program (its cube core and the
busier of its two vector cores) as the kernel issues it, op by op, and times every op on its pipe:

* each pipe (cube: MTE2, MTE1, M, FIX; vector: MTE2, V, MTE3) runs its ops in order, and pipes
  overlap unless the program synchronises them (``Core.sync``: ``SetFlag``/``WaitFlag`` between two
  pipes; ``Core.block``: the scalar unit waits, as for ``CrossCoreWaitFlag`` or a V -> S read);
* a cross-core flag is visible on the other core ``cross_flag_us`` after the setting pipe's last op;
  data written to GM by one core is readable by the other ``gm_roundtrip_us`` after the write;
  a DMA costs ``dma_latency_us`` before its bytes stream;
* K and V stream at the core's share of HBM (``hbm_tbps`` over the AI cores streaming at once, no
  more than ``core_mte2_gbps``); the S / P / O scratch is L2-resident (``core_mte2_gbps``);
* vector work per step comes from the CPU twin's counters of the kernel (instructions, 256-byte
  repeats, count-mode reductions and barriers, which drain the pipe, V -> S round trips);
* the launch costs ``mix_launch_us``; the fused combine costs ``syncall_us`` plus its own chain.

The constants live in ``npu_constants.json`` (each with its source or ASSUMPTION, and the node-day
probe that measures it). Programs (:class:`Pipeline`): the kernel as it stood before the pipeline
(``SERIAL_256``), the pipelined kernel, and CANN IFA's structure read from its public source, all
timed by the same code so that "ours vs IFA" compares like with like.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Iterator

DEFAULT_CONSTANTS = Path(__file__).with_name("npu_constants.json")


@dataclass(frozen=True)
class Constants:
    """The model's constants by name (``npu_constants.json`` schema); units in the names' entries."""

    values: dict
    sources: dict = field(default_factory=dict)
    origin: str = "paper"

    def __getattr__(self, name: str) -> float:
        try:
            return self.values[name]
        except KeyError:
            raise AttributeError(name) from None

    def with_values(self, **kw) -> "Constants":
        return replace(self, values={**self.values, **kw}, origin=f"{self.origin} + overrides")


def load_constants(path: str | Path | None = None) -> Constants:
    """The constants of ``path`` (default: the paper file beside this module) over the paper ones:
    a node-day file may carry only the measured entries."""
    base = json.loads(DEFAULT_CONSTANTS.read_text())
    if base.get("schema") != "splitkv-npu-constants/1":
        raise ValueError(f"{DEFAULT_CONSTANTS}: unknown schema {base.get('schema')!r}")
    entries = dict(base["constants"])
    origin = "paper"
    if path is not None:
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, ValueError) as e:
            raise ValueError(f"constants file {path}: cannot be read as JSON ({e})") from None
        if not isinstance(data, dict) or data.get("schema") != "splitkv-npu-constants/1":
            got = data.get("schema") if isinstance(data, dict) else type(data).__name__
            raise ValueError(f"constants file {path}: schema must be 'splitkv-npu-constants/1', got {got!r}")
        if not isinstance(data.get("constants"), dict):
            raise ValueError(f"constants file {path}: 'constants' must be an object of name -> entry")
        unknown = set(data["constants"]) - set(entries)
        if unknown:
            raise ValueError(f"constants file {path}: unknown constants {sorted(unknown)}")
        for name, e in data["constants"].items():
            v = e.get("value") if isinstance(e, dict) else None
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
                raise ValueError(f"constants file {path}: {name}: value must be a finite number > 0, "
                                 f"got {v if isinstance(e, dict) else e!r}")
        entries.update(data["constants"])
        origin = str(path)
    return Constants({k: float(v["value"]) for k, v in entries.items()},
                     {k: v.get("source", "") for k, v in entries.items()}, origin)


# ------------------------------------------------------------------------------------------------
# The timing engine

class Core:
    """One core's pipes (µs). Each pipe runs its ops in issue order; the scalar unit issues in
    program order and stalls only where the program blocks it."""

    def __init__(self, name: str, pipes: tuple[str, ...]):
        self.name = name
        self.free = {p: 0.0 for p in pipes}   # when each pipe finishes its last op
        self.gate = {p: 0.0 for p in pipes}   # a pipe's next op waits for this (WaitFlag)
        self.busy = {p: 0.0 for p in pipes}   # total op time per pipe
        self.s = 0.0                          # the scalar unit's issue point

    def op(self, pipe: str, dur: float, after: float = 0.0, latency: float = 0.0) -> float:
        """An op of ``dur`` µs on ``pipe`` whose inputs are ready at ``after``; returns its end.

        ``latency`` (a DMA's first-byte latency) runs from the op's issue and overlaps the pipe's
        earlier transfers: a copy issued while the pipe is busy streams right after them, one
        issued to an idle pipe waits the whole latency (a dependent round trip)."""
        issue = max(self.s, self.gate[pipe], after)
        start = max(issue + latency, self.free[pipe])
        self.free[pipe] = start + dur
        self.busy[pipe] += dur
        return start + dur

    def sync(self, src: str, dst: str) -> None:
        """``SetFlag<src_dst>`` / ``WaitFlag``: ``dst``'s later ops wait for ``src``'s issued ones."""
        self.gate[dst] = max(self.gate[dst], self.free[src])

    def block(self, t: float) -> None:
        """The scalar unit waits until ``t`` (a cross-core wait, a V -> S read, a pipe drain)."""
        self.s = max(self.s, t)

    def end(self) -> float:
        return max(self.s, *self.free.values())


Msg = tuple  # ("set", flag, time_visible) | ("wait", flag)


def run_programs(programs: dict[str, Iterator[Msg]]) -> None:
    """Run coroutine programs that exchange cross-core flags: a program yields ``("set", flag, t)``
    (the flag visible at ``t``) or ``("wait", flag)`` and is sent the time the next set of that flag
    it has not consumed became visible. Raises on a deadlock (a wait no set can satisfy)."""
    sets: dict[str, list[float]] = defaultdict(list)
    used: dict[tuple[str, str], int] = defaultdict(int)
    state = {name: [gen, None, False] for name, gen in programs.items()}  # gen, pending msg, started
    live = set(state)
    while live:
        progressed = False
        for name in sorted(live):
            st = state[name]
            gen = st[0]
            try:
                msg = st[1] if st[2] else next(gen)
                st[2] = True
                while True:
                    if msg[0] == "set":
                        sets[msg[1]].append(msg[2])
                        msg = gen.send(None)
                        progressed = True
                    else:
                        k = used[(name, msg[1])]
                        if len(sets[msg[1]]) <= k:
                            st[1] = msg
                            break
                        used[(name, msg[1])] = k + 1
                        msg = gen.send(sets[msg[1]][k])
                        progressed = True
            except StopIteration:
                live.discard(name)
                progressed = True
        if not progressed:
            raise RuntimeError(f"deadlock: {', '.join(f'{n} waits for {state[n][1][1]}' for n in sorted(live))}")


# ------------------------------------------------------------------------------------------------
# What one AI core runs

@dataclass(frozen=True)
class VecWork:
    """Vector-core work, from the twin's counters of the kernel (per vector core, its rows).

    Per exchange step: ``ins`` instructions, ``drains`` pipe drains (barriers and count-mode
    ``ReduceSum`` / ``ReduceMax``, each of which waits for its own result; the repeat-form
    ``BlockReduce`` / ``WholeReduce`` that reduce all of a tile's rows at once are plain instructions,
    their levels' barriers counted as barriers), ``v_to_s`` V -> S round trips, plus
    ``repeats_per_token`` 256-byte repeats per KV token of the step; per item the same fields
    prefixed ``item_`` (start and finish)."""

    ins: float
    drains: float
    v_to_s: float
    repeats_per_token: float
    item_ins: float = 0.0
    item_drains: float = 0.0
    item_v_to_s: float = 0.0
    item_repeats: float = 0.0

    def step_us(self, tokens: int, c: Constants) -> float:
        cyc = (self.ins * c.vec_issue_cycles + self.drains * c.v_drain_cycles + self.v_to_s * c.v_to_s_cycles
               + self.repeats_per_token * tokens * c.vec_repeat_cycles)
        return cyc / (c.clock_ghz * 1e3)

    def item_us(self, c: Constants) -> float:
        cyc = (self.item_ins * c.vec_issue_cycles + self.item_drains * c.v_drain_cycles
               + self.item_v_to_s * c.v_to_s_cycles + self.item_repeats * c.vec_repeat_cycles)
        return cyc / (c.clock_ghz * 1e3)


@dataclass(frozen=True)
class Pipeline:
    """How a kernel moves one item's KV through the cube and vector cores.

    ``step_tokens``: KV tokens per cube <-> vector exchange (one S, P and O slot each);
    ``chunk_tokens``: K / V tokens per L1 buffer inside a step; ``preload``: steps of QK the cube
    issued before PV(j) waits (1: QK(j + 1) only after PV(j), with K and V of step j + 1 loaded
    before PV(j), as the first kernel; d >= 2: QK(j .. j + d - 1) issued before PV(j)); ``vec_lag``: the vector core runs
    softmax(j + 1) before update(j); ``cube_overlap``: the cube's MTE2 loads of the next chunk run
    under the current chunk's LoadData / Mmad / Fixpipe (double-buffered L1 and L0 with event ids;
    False: every copy waits for the previous stage to drain, as the first kernel's WaitFor pairs);
    ``cross_item``: the pipeline runs on across the core's items (False: it drains per item);
    ``vec_cross_item``: the vector cores' lag crosses items too (False: they finish an item, update
    and output, before the next item's first softmax, while the cube may already run its QK);
    ``l1_buffers``: with ``cube_overlap``, the K / V chunks stream GM -> L1 in the order the Mmads
    use them, each as soon as its buffer's previous chunk was moved to L0 (issued before the cube
    waits for a flag), so loads run ahead of the flags by up to that many chunks."""

    name: str
    step_tokens: int
    chunk_tokens: int
    preload: int
    vec_lag: bool
    cube_overlap: bool
    cross_item: bool
    l1_buffers: int = 2  # K / V chunk buffers in L1 (cube_overlap: loads run this far ahead of use)
    vec_cross_item: bool | None = None  # the vector cores' lag runs across items (None: as cross_item)


# the mixed kernel before the pipeline (ascend_ops/kernel/splitkv_split_mix.cpp up to the commit
# that introduced preloading): 256-token tiles, QK(j + 1) after PV(j), a WaitFor between stages
SERIAL_256 = Pipeline("serial (first mixed kernel)", 256, 256, 1, False, False, False)


@dataclass(frozen=True)
class CoreWork:
    """One AI core's share of a launch: its items' token counts and their shape."""

    items: tuple[int, ...]  # KV tokens of each item this core runs
    rows: int               # query rows per item (q_len x GQA group): the cube's M
    head_dim: int
    kv_bytes: int           # bytes per K / V element (2: fp16 / bf16)
    streaming_cores: int    # AI cores streaming K / V at once (they share HBM)


def _kv_rate_gbps(w: CoreWork, c: Constants) -> float:
    """GB/s one AI core's K / V loads get: its share of HBM, at most one core's DMA ceiling."""
    return min(c.core_mte2_gbps, c.hbm_tbps * 1e3 / max(1, w.streaming_cores))


def _cycles_us(cycles: float, c: Constants) -> float:
    return cycles / (c.clock_ghz * 1e3)


def core_time_us(w: CoreWork, p: Pipeline, vec: VecWork, c: Constants, detail: dict | None = None) -> float:
    """Time (µs, after the launch) until this AI core's cube and busier vector core are done."""
    D, eb, M = w.head_dim, w.kv_bytes, w.rows
    mp = max(16, -(-M // 16) * 16)  # the cube's m (rows padded to whole fractals; m = 1 computed as 16)
    nr = -(-M // 2)                 # rows of the busier vector core
    kv_gbps = _kv_rate_gbps(w, c)
    l2_gbps = c.core_mte2_gbps
    lat = c.dma_latency_us
    steps: list[tuple[int, int, bool, bool]] = []  # (item, tokens, first of item, last of item)
    for i, n in enumerate(w.items):
        k = max(1, -(-n // p.step_tokens)) if n > 0 else 0
        for j in range(k):
            steps.append((i, min(p.step_tokens, n - j * p.step_tokens), j == 0, j == k - 1))
    cube = Core("aic", ("MTE2", "MTE1", "M", "FIX"))
    aiv = Core("aiv", ("MTE2", "V", "MTE3"))

    def mmad_us(m: int, n: int, k: int) -> float:
        blocks = (m // 16) * (-(-n // 16)) * (-(-k // 16))
        return _cycles_us(blocks / c.cube_blocks_per_cycle + c.mmad_issue_cycles, c)

    def serial(*pairs: str) -> None:
        """The first kernel's WaitFor pairs ("SRC>DST"): without cube_overlap each stage of the cube
        waits for the one before to drain."""
        if not p.cube_overlap:
            for pair in pairs:
                cube.sync(*pair.split(">"))

    kv_ready: dict[tuple[int, str], list[float]] = {}
    # cube_overlap: the chunks in the order the Mmads consume them (K of QK(s), V of PV(s)), each
    # chunk's load end and the end of its LoadData (which frees its L1 buffer)
    order: list[tuple[int, str, int]] = []
    if p.cube_overlap:
        nxt_qk = 0
        for s_ in range(len(steps)):
            while nxt_qk < min(len(steps), s_ + max(1, p.preload)) and \
                    (p.cross_item or steps[nxt_qk][0] == steps[s_][0]):
                order += [(nxt_qk, "K", ci) for ci in range(-(-steps[nxt_qk][1] // p.chunk_tokens))]
                nxt_qk += 1
            order += [(s_, "V", ci) for ci in range(-(-steps[s_][1] // p.chunk_tokens))]
    position = {key: i for i, key in enumerate(order)}
    loaded: dict[tuple[int, str, int], float] = {}
    freed: dict[int, float] = {}
    nxt = [0]

    def prefetch(need: tuple[int, str, int] | None = None) -> None:
        """Issue chunk loads in use order while their L1 buffers are known to be free; ``need``,
        the chunk about to be used, must have been issued by then (its buffer's previous chunk was
        used before it, in order)."""
        while nxt[0] < len(order):
            i = nxt[0]
            prev = i - p.l1_buffers
            if prev >= 0 and prev not in freed:
                break
            s_, what, ci = order[i]
            t = min(p.chunk_tokens, steps[s_][1] - ci * p.chunk_tokens)
            loaded[order[i]] = cube.op("MTE2", t * D * eb / (kv_gbps * 1e3), latency=lat,
                                       after=freed.get(prev, 0.0))
            nxt[0] += 1
        if need is not None and need not in loaded:
            raise RuntimeError(f"chunk {need} used before its load could be issued")

    def chunk_ready(s_: int, what: str, ci: int) -> float:
        if not p.cube_overlap:
            return kv_ready[(s_, what)][ci]
        prefetch((s_, what, ci))
        return loaded[(s_, what, ci)]

    def chunk_used(s_: int, what: str, ci: int, t_end: float) -> None:
        if p.cube_overlap:
            freed[position[(s_, what, ci)]] = t_end
            prefetch()

    def load(s: int, what: str) -> None:
        """The first kernel: K or V of step s, GM -> L1, after the buffer's last LoadData."""
        n = steps[s][1]
        ends = []
        for a in range(0, n, p.chunk_tokens):
            t = min(p.chunk_tokens, n - a)
            cube.sync("MTE1", "MTE2")
            ends.append(cube.op("MTE2", t * D * eb / (kv_gbps * 1e3), latency=lat))
        kv_ready[(s, what)] = ends

    def qk(s: int) -> Iterator[Msg]:
        """QK of step s: (q rows at an item's start), K chunks -> L0B, Mmad, Fixpipe S, flag S."""
        item, n, first, _ = steps[s]
        if first:
            serial("MTE1>MTE2")
            cube.op("MTE2", M * D * eb / (l2_gbps * 1e3), latency=lat)  # q rows
        if not p.cube_overlap and (s, "K") not in kv_ready:
            load(s, "K")
        fix_end = 0.0
        for ci, a in enumerate(range(0, n, p.chunk_tokens)):
            t = min(p.chunk_tokens, n - a)
            serial("MTE2>MTE1", "M>MTE1")
            l0 = cube.op("MTE1", _cycles_us(t * D * eb / c.mte1_bytes_per_cycle, c), after=chunk_ready(s, "K", ci))
            chunk_used(s, "K", ci, l0)
            serial("MTE1>M", "FIX>M")
            mm = cube.op("M", mmad_us(mp, t, D), after=l0)
            serial("M>FIX")
            fix_end = cube.op("FIX", _cycles_us(M * t * 4 / c.fixpipe_bytes_per_cycle, c), after=mm)
        yield ("set", "S", fix_end + c.gm_roundtrip_us + c.cross_flag_us)

    def pv(s: int) -> Iterator[Msg]:
        """PV of step s: wait flag P, P -> L1 -> L0A, V chunks -> L0B, Mmad accumulating over the
        chunks in L0C, Fixpipe O, flag O."""
        n = steps[s][1]
        if p.cube_overlap:
            prefetch()  # the loads that can go before the wait
        t_p = yield ("wait", "P")
        cube.block(t_p)
        serial("MTE1>MTE2")
        p_end = cube.op("MTE2", M * n * eb / (l2_gbps * 1e3), latency=lat)
        if not p.cube_overlap and (s, "V") not in kv_ready:
            load(s, "V")
        mm = 0.0
        for ci, a in enumerate(range(0, n, p.chunk_tokens)):
            t = min(p.chunk_tokens, n - a)
            serial("MTE2>MTE1", "M>MTE1")
            if p.cube_overlap:  # V's tile to L0B first (freeing its L1 buffer), then P's columns to L0A
                l0v = cube.op("MTE1", _cycles_us(t * D * eb / c.mte1_bytes_per_cycle, c), after=chunk_ready(s, "V", ci))
                chunk_used(s, "V", ci, l0v)
                l0 = max(l0v, cube.op("MTE1", _cycles_us(M * t * eb / c.mte1_bytes_per_cycle, c), after=p_end))
            else:
                l0 = cube.op("MTE1", _cycles_us((t * D + M * t) * eb / c.mte1_bytes_per_cycle, c),
                             after=max(chunk_ready(s, "V", ci), p_end))
                chunk_used(s, "V", ci, l0)
            serial("MTE1>M", "FIX>M")
            mm = cube.op("M", mmad_us(mp, D, t), after=l0)
        serial("M>FIX")
        fix_end = cube.op("FIX", _cycles_us(M * D * 4 / c.fixpipe_bytes_per_cycle, c), after=mm)
        yield ("set", "O", fix_end + c.gm_roundtrip_us + c.cross_flag_us)

    def cube_program() -> Iterator[Msg]:
        if p.preload <= 1:
            # the first kernel: QK(0); per step: K and V of step j + 1 loaded, PV(j), QK(j + 1)
            for s in range(len(steps)):
                if steps[s][2]:
                    load(s, "K")
                    load(s, "V")
                    yield from qk(s)
                if s + 1 < len(steps) and not steps[s + 1][2]:
                    load(s + 1, "K")
                    load(s + 1, "V")
                yield from pv(s)
                if s + 1 < len(steps) and not steps[s + 1][2]:
                    yield from qk(s + 1)
            return
        ahead = 0
        for s in range(len(steps)):
            # QK(s .. s + preload - 1) issued before PV(s) (within the item unless cross_item)
            while ahead < min(len(steps), s + p.preload) and (p.cross_item or steps[ahead][0] == steps[s][0]):
                yield from qk(ahead)
                ahead += 1
            yield from pv(s)

    def softmax(s: int) -> Iterator[Msg]:
        n = steps[s][1]
        t_s = yield ("wait", "S")
        aiv.block(t_s)
        aiv.sync("V", "MTE2")
        s_end = aiv.op("MTE2", nr * n * 4 / (l2_gbps * 1e3), latency=lat)
        aiv.sync("MTE2", "V")
        v_end = aiv.op("V", vec.step_us(n, c), after=s_end)
        aiv.sync("V", "MTE3")
        p_end = aiv.op("MTE3", nr * n * eb / (l2_gbps * 1e3), after=v_end)
        yield ("set", "P", p_end + c.gm_roundtrip_us + c.cross_flag_us)

    def update(s: int) -> Iterator[Msg]:
        last = steps[s][3]
        t_o = yield ("wait", "O")
        aiv.block(t_o)
        aiv.sync("V", "MTE2")
        o_end = aiv.op("MTE2", nr * D * 4 / (l2_gbps * 1e3), latency=lat)
        aiv.sync("MTE2", "V")
        aiv.op("V", _cycles_us(3 * c.vec_issue_cycles + 2 * c.v_drain_cycles
                               + 2 * nr * D * 4 / 256 * c.vec_repeat_cycles, c), after=o_end)
        if last:  # finish: the item's rows out (the running state read by the scalar unit, a copy per row)
            v_end = aiv.op("V", vec.item_us(c))
            aiv.block(v_end)
            aiv.sync("V", "MTE3")
            aiv.op("MTE3", nr * D * 4 / (l2_gbps * 1e3), latency=lat, after=v_end)

    def vec_program() -> Iterator[Msg]:
        pending = None  # the step whose update waits for the next softmax (vec_lag)
        for s in range(len(steps)):
            yield from softmax(s)
            if pending is not None:
                yield from update(pending)
                pending = None
            vec_cross = p.cross_item if p.vec_cross_item is None else p.vec_cross_item
            if not p.vec_lag or (steps[s][3] and not vec_cross):
                yield from update(s)
            else:
                pending = s
        if pending is not None:
            yield from update(pending)

    if not steps:
        return 0.0
    run_programs({"cube": cube_program(), "vec": vec_program()})
    if detail is not None:
        detail.update(cube_busy_us=dict(cube.busy), vec_busy_us=dict(aiv.busy), steps=len(steps),
                      cube_end_us=cube.end(), vec_end_us=aiv.end())
    return max(cube.end(), aiv.end())


def combine_us(batch: int, num_q_heads: int, head_dim: int, splits: int, vector_cores: int, c: Constants,
               num_kv_heads: int | None = None, q_len: int = 1) -> float:
    """The fused launch's combine after ``SyncAll`` (``splitkv_combine_stage.h``): units of (query
    row, KV head), dealt round-robin to the vector cores; a unit reads its G heads' partial lse and o
    (float32) of every split and writes o and lse. Per unit a dependent chain of three DMA latencies
    (its splits read from the plan, the partials' loads, the lse copy-out the next unit waits for),
    except that the first unit's splits are read before ``SyncAll``; the bytes at the cores' DMA
    rate. ``num_kv_heads`` None: one unit per query head."""
    if splits <= 1:
        return 0.0
    hkv = num_q_heads if num_kv_heads is None else num_kv_heads
    units = batch * q_len * hkv
    per_core = -(-units // vector_cores)
    bytes_ = per_core * splits * (num_q_heads // hkv) * (head_dim + 8) * 4
    return c.syncall_us + (3 * per_core - 1) * c.dma_latency_us + bytes_ / (c.core_mte2_gbps * 1e3) \
        + _cycles_us(per_core * (8 * c.vec_issue_cycles + 4 * c.v_drain_cycles), c)


def items_per_core(batch: int, context: int, num_kv_heads: int, splits: int, cores: int) -> list[tuple[int, ...]]:
    """Uniform lengths: ``batch * num_kv_heads * splits`` items of about ``context / splits`` tokens,
    dealt to ``cores`` AI cores in contiguous ranges of about equal length (tiling.balance_items)."""
    per = [context // splits + (1 if s < context % splits else 0) for s in range(splits)]
    items = [n for _ in range(batch * num_kv_heads) for n in per]
    total = sum(items)
    out: list[list[int]] = [[] for _ in range(cores)]
    acc = 0
    for n in items:
        mid = acc + n / 2
        out[min(cores - 1, int(mid * cores / total))].append(n)
        acc += n
    return [tuple(x) for x in out]


def launch_us(batch: int, context: int, num_q_heads: int, num_kv_heads: int, head_dim: int, kv_bytes: int,
              splits: int, p: Pipeline, vec: VecWork, c: Constants, cube_cores: int = 24,
              vector_cores: int = 48, q_len: int = 1) -> dict:
    """One fused launch (split stage, SyncAll, combine): µs and its parts."""
    per_core = items_per_core(batch, context, num_kv_heads, splits, cube_cores)
    busy = [x for x in per_core if x]
    rows = q_len * (num_q_heads // num_kv_heads)
    times, worst_detail = [], {}
    # cores with the same work take the same time: time each distinct share once
    cache: dict[tuple, float] = {}
    for items in per_core:
        if items not in cache:
            d: dict = {}
            cache[items] = core_time_us(CoreWork(items, rows, head_dim, kv_bytes, len(busy)), p, vec, c, d)
            if not worst_detail or cache[items] > worst_detail.get("t", -1):
                worst_detail = {"t": cache[items], **d, "items": len(items), "tokens": sum(items)}
        times.append(cache[items])
    split = max(times) if times else 0.0
    comb = combine_us(batch, num_q_heads, head_dim, splits, vector_cores, c, num_kv_heads, q_len)
    return {"us": c.mix_launch_us + split + comb, "launch_us": c.mix_launch_us, "split_us": split,
            "combine_us": comb, "worst_core": worst_detail}


def lower_bound_us(batch: int, context: int, num_kv_heads: int, head_dim: int, kv_bytes: int, c: Constants,
                   cube_cores: int = 24) -> dict:
    """The least any one-launch kernel can take under these constants (µs), whatever its pipeline:

    * split the context: ``mix_launch_us`` + the HBM floor (every byte read once at ``hbm_tbps``,
      no latency, no bubble) + the shortest combine any design needs: the partial states made
      visible to another core (``gm_roundtrip_us``), read (``dma_latency_us``) and the output written
      (``dma_latency_us``), with no barrier (a last-arriving core could merge without ``SyncAll``);
    * do not split: ``mix_launch_us`` + the first DMA latency + one (request, KV head)'s K and V at
      the rate one core gets (``batch * num_kv_heads`` cores streaming, at most ``cube_cores``).

    Returns ``{"us", "split_us", "unsplit_us"}``; ``us`` is the smaller."""
    floor = hbm_floor_us(batch, context, num_kv_heads, head_dim, kv_bytes, c)
    split = c.mix_launch_us + floor + c.gm_roundtrip_us + 2 * c.dma_latency_us
    items = batch * num_kv_heads
    per_core = -(-items // cube_cores)
    rate = min(c.core_mte2_gbps, c.hbm_tbps * 1e3 / min(items, cube_cores))
    unsplit = c.mix_launch_us + c.dma_latency_us + per_core * context * head_dim * 2 * kv_bytes / (rate * 1e3)
    return {"us": min(split, unsplit), "split_us": split, "unsplit_us": unsplit}


def hbm_floor_us(batch: int, context: int, num_kv_heads: int, head_dim: int, kv_bytes: int, c: Constants) -> float:
    """K and V read once at ``hbm_tbps``."""
    return batch * context * num_kv_heads * head_dim * 2 * kv_bytes / (c.hbm_tbps * 1e6)
