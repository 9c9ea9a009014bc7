#!/usr/bin/env python3
"""Paper estimate of the Ascend kernels' time on a 910B2, from the CPU twin's work counters.

ESTIMATES, NOT MEASUREMENTS: nothing here ran on an NPU. The twin counts, per core and per pipe,
the work the kernel issues (DMA bytes and bursts, vector instructions and 256-byte repeats, scalar
memory operations, vector -> scalar round trips, barriers); this script turns the counts into time
with the constants below, each citing where it comes from or marked ASSUMPTION:

    t_pipe(core)  = work on that pipe / its rate           (MTE2, MTE3, V, S, each on its own)
    t_core        = max over pipes (pipes overlap)  +  V->S round trips x L_vs + V barriers x L_bar
                    (a round trip or a barrier drains the vector pipe: it serialises)
    t_stage       = launch latency + max over cores
    cube core     = max over MTE2 (GM -> L1), MTE1 (L1 -> L0), M (16x16x16 blocks at one per cycle + a
                    cost per Mmad), FIX (L0C -> GM), S  +  cross-core waits that blocked x L_cross
                    (a mixed launch's stage time takes the slowest AIC or AIV context)

Shapes (``--shapes``) are counted on the twin at two short contexts with the same number of splits
as the full-size plan and extrapolated linearly in the tokens per split: every counter is a + b *
tokens (per-item work is fixed, per-token work linear), which the two points determine exactly.

    python -m splitkv_bench npu-estimate [--out-json est.json] [--out-md est.md]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from dataclasses import asdict, dataclass, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


from ascend_ops import cost_model as cm  # noqa: E402
from splitkv_common.devices import get_profile  # noqa: E402  (the one source of the core counts)

from splitkv_bench.npu import Shape as DecodeShape  # noqa: E402  (the shapes the node bench times)

_P910B2 = get_profile("910b2")


@dataclass(frozen=True)
class Constants:
    """Each figure with its source; ASSUMPTION where no public figure was found."""

    clock_hz: float = 1.8e9  # 910B2 AI core clock, ~1.8 GHz: design note "npu-budget" (paper figure)
    hbm_bytes_per_s: float = 1.6e12  # ~1.6 TB/s: npu-budget / ascend-anchors ("not authoritatively published")
    vector_cores: int = _P910B2.units  # 910B2: 48 AIV (splitkv_common.devices; CANN platform config, catlass)
    core_dma_bytes_per_s: float = 100e9  # ASSUMPTION: one core's MTE2 ceiling when few cores stream
    # ASSUMPTION: a DMA instruction costs a descriptor + first-byte latency once; the blocks of one
    # strided instruction (blockCount / nValue rows) stream back to back behind it, each costing only
    # its bytes. (The first version charged 30 cycles per row; `dma_block_cycles` keeps that knob:
    # set it to 30 to see the per-row model, docs/ascend-kernel.md gives both.)
    dma_burst_cycles: float = 30.0  # per DMA instruction
    dma_block_cycles: float = 0.0  # per block (row) of a strided DMA instruction
    vec_repeat_cycles: float = 1.0  # one 256-byte repeat per cycle (ONE_REP_BYTE_SIZE = 256; "64 fp32 lanes")
    vec_issue_cycles: float = 8.0  # ASSUMPTION: fixed cost of one vector instruction (issue, mask setup)
    scalar_issue_cycles: float = 2.0  # ASSUMPTION: S issues one instruction (any pipe) per ~2 cycles
    scalar_ub_cycles: float = 4.0  # ASSUMPTION: scalar load/store of the UB
    scalar_gm_cycles: float = 60.0  # ASSUMPTION: scalar GM read through the data cache, mostly misses
    v_to_s_cycles: float = 100.0  # npu-budget: a V->S round trip costs "tens to hundreds of cycles"
    v_barrier_cycles: float = 15.0  # ASSUMPTION: PipeBarrier<PIPE_V> drains the vector pipeline
    launch_us: float = 5.0  # launch ~5 us: docs/ascend-kernel.md roofline placeholder (ASSUMPTION)
    # ---- cube core (AIC) of a mixed launch
    cube_cores: int = _P910B2.cube_units  # 910B2: 24 AIC (splitkv_common.devices; CANN platform config, catlass)
    # 4096 fp16 MACs per cycle = one 16x16x16 fractal block per cycle: the DaVinci "Max" cube of the
    # Ascend 910 (Hot Chips 31, 2019, Huawei DaVinci talk: "Cube is 4096 FP16 MACs"). ASSUMPTION that
    # the 910B AIC keeps that rate for fp16 and bf16 with fp32 accumulation. The twin counts an int8
    # Mmad in 16x16x32 blocks (one 512-byte fractal of each operand, as for 16-bit data): one per
    # cycle is the same talk's "8192 INT8 MACs", the doubled int8 rate (ASSUMPTION for the 910B).
    cube_fractal_macs_per_cycle: float = 1.0
    mmad_issue_cycles: float = 10.0  # ASSUMPTION: fixed cost of one Mmad (issue, pipeline fill)
    mte1_bytes_per_cycle: float = 256.0  # ASSUMPTION: L1 -> L0A/L0B, half a 512-byte fractal per cycle
    fix_row_cycles: float = 4.0  # ASSUMPTION: per output row (burst) of Fixpipe, on top of its GM bytes
    cross_wait_cycles: float = 100.0  # ASSUMPTION: a cross-core flag round trip that had to wait (FFTS)
    # ASSUMPTION: the mixed kernel's S / P / O scratch (about 60 KiB per AI core with 256-token steps, 390 KiB
    # with 2048-token steps: 9.4 MiB over 24 cores; rewritten every
    # tile and read back within microseconds) stays in the 910B's 192 MiB L2 (CANN platform config,
    # catlass: ascend-offline-checks section 4) and never reaches HBM; it still costs the core's own
    # DMA time (core_dma_bytes_per_s). False charges it to HBM like any other byte.
    scratch_in_l2: bool = True


C = Constants()


def gm_bytes(s: dict) -> float:
    """GM bytes one context moves (DMA both ways, and the cube's Fixpipe writes)."""
    return float(s["dma_bytes"]["MTE2"] + s["dma_bytes"]["MTE3"] + s.get("fix_bytes", 0))


def hbm_bytes(s: dict, c: Constants = C) -> float:
    """The GM bytes that reach HBM: all of them, less the L2-resident scratch when modelled."""
    return gm_bytes(s) - (s.get("l2_bytes", 0) if c.scratch_in_l2 else 0)


def hbm_seconds(s: dict, all_bytes: list[float], c: Constants = C) -> float:
    """When this context's GM traffic completes, all contexts streaming at once: HBM shared equally
    among the contexts still streaming (processor sharing: a context moving b HBM bytes finishes
    after sum_j min(b_j, b) / BW), and no faster than one core's own DMA ceiling for all its bytes
    (HBM and L2)."""
    b, total = hbm_bytes(s, c), gm_bytes(s)
    if total <= 0:
        return 0.0
    ps = sum(min(x, b) for x in all_bytes) / c.hbm_bytes_per_s
    return max(ps, total / c.core_dma_bytes_per_s)


def _dma_us(s: dict, pipe: str, bytes_: float, hbm_s: float, c: Constants) -> float:
    cyc = 1e6 / c.clock_hz
    total = gm_bytes(s)
    data = hbm_s * 1e6 * (bytes_ / total) if total > 0 else 0.0
    return data + (s["ins"].get(pipe, 0) * c.dma_burst_cycles + s["dma_bursts"].get(pipe, 0) * c.dma_block_cycles) * cyc


def core_time_us(s: dict, active_cores: int | list, c: Constants = C) -> dict:
    """Estimated µs per pipe and for the core, from one block's counters (``active_cores``: the GM
    bytes of every context of the stage, or a count of contexts moving as many bytes as this one)."""
    cyc = 1e6 / c.clock_hz  # µs per cycle
    all_bytes = active_cores if isinstance(active_cores, list) else [hbm_bytes(s, c)] * max(1, active_cores)
    hbm_s = hbm_seconds(s, all_bytes, c)
    mte2 = _dma_us(s, "MTE2", s["dma_bytes"]["MTE2"], hbm_s, c)
    mte3 = _dma_us(s, "MTE3", s["dma_bytes"]["MTE3"], hbm_s, c)
    vec = (s["vec_repeats"] * c.vec_repeat_cycles + s["ins"]["V"] * c.vec_issue_cycles) * cyc
    issued = sum(s["ins"].values())
    scalar = (issued * c.scalar_issue_cycles + (s["s_ub_reads"] + s["s_ub_writes"]) * c.scalar_ub_cycles
              + (s["s_gm_reads"] + s["s_gm_writes"]) * c.scalar_gm_cycles) * cyc
    serial = (s["v_to_s"] * c.v_to_s_cycles + s["barrier_v"] * c.v_barrier_cycles) * cyc
    # the DMA pipes share one path to GM: their data time adds up (GM), each pipe also shows its part
    pipes = {"MTE2": mte2, "MTE3": mte3, "GM": mte2 + mte3, "V": vec, "S": scalar}
    return {"pipes_us": pipes, "serial_us": serial, "core_us": max(pipes.values()) + serial}


def cube_core_time_us(s: dict, active_cores: int | list, c: Constants = C) -> dict:
    """Estimated µs per pipe for a cube core (AIC) of a mixed launch, from its counters.

    MTE2 (GM -> L1) and FIX (L0C -> GM) share the core's HBM bandwidth like the vector core's DMA;
    MTE1 moves L1 -> L0A/L0B bytes; M does one 16x16x16 fractal block per cycle plus a fixed cost
    per Mmad; a cross-core wait that found its counter at 0 serialises (the cube idles).
    """
    cyc = 1e6 / c.clock_hz
    all_bytes = active_cores if isinstance(active_cores, list) else [hbm_bytes(s, c)] * max(1, active_cores)
    hbm_s = hbm_seconds(s, all_bytes, c)
    mte2 = _dma_us(s, "MTE2", s["dma_bytes"]["MTE2"], hbm_s, c)
    mte1 = (s["l0_bytes"] / c.mte1_bytes_per_cycle + s["ins"]["MTE1"] * c.vec_issue_cycles) * cyc
    m = (s["cube_fractal_macs"] / c.cube_fractal_macs_per_cycle + s["mmad_calls"] * c.mmad_issue_cycles) * cyc
    total = gm_bytes(s)
    fix = (hbm_s * 1e6 * s["fix_bytes"] / total if total > 0 else 0.0) + s["fix_rows"] * c.fix_row_cycles * cyc
    issued = sum(s["ins"].values())
    scalar = (issued * c.scalar_issue_cycles + (s["s_gm_reads"] + s["s_gm_writes"]) * c.scalar_gm_cycles) * cyc
    serial = s.get("cross_blocked", 0) * c.cross_wait_cycles * cyc
    pipes = {"MTE2": mte2, "MTE1": mte1, "M": m, "FIX": fix, "GM": mte2 + fix, "S": scalar}
    return {"pipes_us": pipes, "serial_us": serial, "core_us": max(pipes.values()) + serial}


def context_time_us(s: dict, active_cores: int | list, c: Constants = C) -> dict:
    """A vector core's or a cube core's estimate, by the counters' core type."""
    if s.get("core_type") == "AIC":
        return cube_core_time_us(s, active_cores, c)
    t = core_time_us(s, active_cores, c)
    if s.get("cross_blocked"):
        extra = s["cross_blocked"] * c.cross_wait_cycles * 1e6 / c.clock_hz
        t = {**t, "serial_us": t["serial_us"] + extra, "core_us": t["core_us"] + extra}
    return t


def stage_time_us(stats: list[dict], c: Constants = C) -> dict:
    """Launch latency + the slowest context (vector cores, or cube and vector cores of a mixed launch)."""
    active = sum(1 for s in stats if sum(s["ins"].values()) > 0)
    all_bytes = [hbm_bytes(s, c) for s in stats]
    per = [context_time_us(s, all_bytes, c) for s in stats]
    worst = max(range(len(per)), key=lambda i: per[i]["core_us"]) if per else 0
    return {"us": c.launch_us + (per[worst]["core_us"] if per else 0.0), "active_cores": active,
            "worst_core": per[worst] if per else {}, "cores": len(stats)}


# ---------------------------------------------------------------------------------------------
# Counting the real kernels on the twin

@dataclass(frozen=True)
class Shape(DecodeShape):
    """A decode batch as ``python -m splitkv_bench npu`` times it on a node, with what the estimate adds."""

    ifa_us: str = "n/a"  # CANN IFA estimate from the npu-budget design note, where it gives one
    kv_quant: str | None = None  # "channel": int8 KV with per-channel scales and offsets (--int8)


SHAPES = [
    Shape("B1 16k, Hq32/Hkv8", 1, 16384, 32, ifa_us="60-100"),
    Shape("B1 64k, Hq32/Hkv8", 1, 65536, 32),
    Shape("B16 8k, Hq32/Hkv8", 16, 8192, 32),
    Shape("B64 2k, Hq32/Hkv8", 64, 2048, 32, ifa_us="400-550"),
    Shape("B1 16k, Hq64/Hkv8", 1, 16384, 64),
    Shape("B1 64k, Hq64/Hkv8", 1, 65536, 64),
    Shape("B16 8k, Hq64/Hkv8", 16, 8192, 64),
    Shape("B64 2k, Hq64/Hkv8", 64, 2048, 64),
]


def _inputs(shape: Shape, context: int):
    import numpy as np

    from splitkv_common.inputs import DecodeInputs  # noqa: F401  (type only)
    from splitkv_common.parity import cases

    inp = cases.random_inputs(0, [context] * shape.batch, num_q_heads=shape.hq, num_kv_heads=shape.hkv,
                              head_dim=shape.head_dim, page_size=shape.page, dtype=shape.dtype, spare_pages=0,
                              kv_quant=shape.kv_quant, kv_offset=shape.kv_quant is not None)
    assert np.all(inp.seq_lens == context)
    return inp


def count_shape(shape: Shape, points=(1, 2), kernel: str = "vector") -> dict:
    """Twin counters at full size, extrapolated from short contexts with the full plan's split count.

    ``kernel``: ``vector`` (the vector-only split stage, the plan's ``auto`` split count) or ``mix``
    (the mixed AIC + AIV split stage, split count from ``tiling.npu_split_count``)."""
    from ascend_ops import sim_backend as sim
    from ascend_ops import tiling as tl
    from splitkv_common.plan import make_plan

    if kernel == "mix":
        splits = tl.npu_split_count([shape.context] * shape.batch, shape.hkv, shape.page, "910b2",
                                    num_q_heads=shape.hq, head_dim=shape.head_dim)
    else:
        # the old kernel with the planner it had: the cost model over the 48 vector cores (the
        # 910b2 profile without its cube cores; auto on Ascend profiles now takes the NPU rule)
        old_profile = dataclasses.replace(get_profile("910b2"), cube_units=0)
        full = make_plan([shape.context] * shape.batch, num_kv_heads=shape.hkv, page_size=shape.page,
                         policy="auto", device=old_profile, num_q_heads=shape.hq, head_dim=shape.head_dim,
                         kv_elem_bytes=2)
        splits = int(full.num_splits.max())
    per_split_full = shape.context / splits
    lib = sim.twin_library()
    sim.set_block_order(lib, 0)
    samples = []
    for k in points:
        # tokens per split at this point: whole 256-token cube tiles for the mixed kernel (its cost is
        # per tile), whole pages for the vector kernel (per token)
        tokens = k * (2 if kernel == "mix" else 1) * shape.page
        inp = _inputs(shape, tokens * splits)
        plan = inp.plan(f"size:{tokens}", device="910b2") if splits > 1 else inp.plan("none", device="910b2")
        assert int(plan.num_splits.max()) == splits
        til = tl.build_tiling(inp, plan, sim.PROFILE, kernel=kernel)
        assert til.mixed == (kernel == "mix")
        if kernel == "mix":  # one fused launch: split, SyncAll, combine
            sim.run_twin(inp, plan, kernel=kernel, fused=True)
            split_stats, combine_stats = sim.last_stats(lib), []
        else:
            sim.run_split(inp, plan, til)
            split_stats = sim.last_stats(lib)
            sim.run_twin(inp, plan, kernel=kernel)  # split then combine: the last launch is the combine
            combine_stats = sim.last_stats(lib)
        samples.append((tokens, split_stats, combine_stats))
    (t1, s1, c1), (t2, s2, c2) = samples

    def extrap(a, b):
        if isinstance(a, dict):
            return {key: extrap(a[key], b[key]) for key in a}
        if isinstance(a, (int, float)):
            slope = (b - a) / (t2 - t1)
            return max(0.0, a + slope * (per_split_full - t1))
        return a

    split_full = [extrap(a, b) for a, b in zip(s1, s2)]
    comb_full = [extrap(a, b) for a, b in zip(c1, c2)]
    return {"splits": splits, "split_stats": split_full, "combine_stats": comb_full,
            "counted_tokens_per_split": [t1, t2], "full_tokens_per_split": per_split_full}


def hbm_floor_us(shape: Shape, c: Constants = C) -> float:
    elem = 1 if shape.kv_quant else 2  # int8 or bf16 (the int8 scales are [4, Hkv, D], negligible)
    kv = shape.batch * shape.context * shape.hkv * 2 * shape.head_dim * elem  # K + V
    return kv / c.hbm_bytes_per_s * 1e6


def estimate(shapes=SHAPES, c: Constants = C, kernels=("vector", "mix")) -> dict:
    rows = []
    for sh, kernel in [(sh, k) for sh in shapes for k in kernels]:
        cnt = count_shape(sh, kernel=kernel)
        sp = stage_time_us(cnt["split_stats"], c)
        cb = stage_time_us(cnt["combine_stats"], c) if cnt["combine_stats"] else {"us": 0.0}
        w = sp["worst_core"]
        rows.append({
            "shape": sh.name, "kernel": kernel, "batch": sh.batch, "context": sh.context, "hq": sh.hq, "hkv": sh.hkv,
            "splits": cnt["splits"], "split_us": sp["us"], "combine_us": cb["us"], "total_us": sp["us"] + cb["us"],
            "split_active_cores": sp["active_cores"], "split_worst_core_pipes_us": w["pipes_us"],
            "split_worst_core_serial_us": w["serial_us"], "hbm_floor_us": hbm_floor_us(sh, c), "ifa_est_us": sh.ifa_us,
            "counted_tokens_per_split": cnt["counted_tokens_per_split"],
            "x_floor": (sp["us"] + cb["us"]) / hbm_floor_us(sh, c),
        })
    return {"kind": "ESTIMATE (CPU-twin counts x paper constants; nothing ran on an NPU)",
            "constants": asdict(c), "rows": rows}


# ---------------------------------------------------------------------------------------------
# The critical-path model (ascend_ops/cost_model.py): the same twin counts, timed as a dependency chain

def vec_work_from_twin(shape: Shape, step_points=(1, 2)) -> "cm.VecWork":
    """Per-step and per-item vector-core work of the mixed kernel from the twin: one request of ``k``
    exchange steps per KV head (no split), at two ``k``; the busier vector core of the first AI
    core. Per step: the difference over the extra steps (its 256-byte repeats per token); per item:
    the rest. The vector code of an exchange is the same whatever the step's length, so these
    counts also stand for the first kernel's 256-token exchanges."""
    from ascend_ops import sim_backend as sim
    from ascend_ops import tiling as tl
    tt, _, steps = tl.choose_mix_tiles(shape.head_dim, shape.dtype, shape.hq // shape.hkv, False,
                                       kv_dtype="int8" if shape.kv_quant else None)
    st = tt * steps
    lib = sim.twin_library()
    sim.set_block_order(lib, 0)
    pts = []
    for k in step_points:
        inp = _inputs(replace(shape, batch=1), k * st)
        sim.run_twin(inp, inp.plan("none", device="910b2"), kernel="mix", fused=True)
        aiv = [s for s in sim.last_stats(lib) if s.get("core_type") == "AIV" and s["ins"]["V"] > 0]
        pts.append((k, max(aiv, key=lambda s: s["vec_repeats"])))
    (k1, a), (k2, b) = pts
    fields = {"ins": lambda s: s["ins"]["V"], "drains": lambda s: s["barrier_v"] + s.get("vec_reduces", 0),
              "v_to_s": lambda s: s["v_to_s"], "repeats": lambda s: s["vec_repeats"]}
    step = {k: (f(b) - f(a)) / (k2 - k1) for k, f in fields.items()}
    item = {k: max(0.0, f(a) - k1 * step[k]) for k, f in fields.items()}
    return cm.VecWork(ins=step["ins"], drains=step["drains"], v_to_s=step["v_to_s"],
                      repeats_per_token=step["repeats"] / st, item_ins=item["ins"], item_drains=item["drains"],
                      item_v_to_s=item["v_to_s"], item_repeats=item["repeats"])


def ifa_program(sh: Shape, prof) -> tuple["cm.Pipeline", int, int]:
    """CANN IFA's structure for a decode shape, read from its public source (hicann/ops-transformer,
    attention/incre_flash_attention, at c29bc10): ``(pipeline, splits, model cores)``.

    * Template: the preload one (``CUBE_VIEW_MM``, ``incre_flash_attention_preload.h``) when G <= 16,
      D = 128, paged bf16 KV in BNSD layout and B * Hkv * ceil(max_seq / 2048) > 128
      (``incre_flash_attention_tiling_check.cpp`` EnableCubeViewMM, l. 1052-1111); else the serial
      ``split_Bbn2s2_Us2`` template (mm1 -> vec1 -> mm2 -> vec2 per step, each vector core driving
      its own matmuls on the shared cube: modelled as 48 independent serial chains).
    * Step (sInnerSize): 8192 / 4096 / 2048 tokens for G // 5 = 0 / 1 / >= 2, in whole pages, at
      most the length (tiling.cpp CalcInnerSize, l. 2270-2344); K and V stream through L1 in
      256-token chunks, two L1 buffers (preload.h l. 362, 771-784).
    * Preload: the cube runs QK up to 4 steps ahead (PRE_LOAD_NUM = 4, preload.h l. 30), over the
      core's flattened steps across items, the O update lagging (l. 3997-4061).
    * Splits (flash decoding): when paged, max_seq > 1024 (>= 2048 for G > 1) and B * Hkv <= 0.5 x
      cores (preload) or < 0.4 x cores (serial), ``cores / (B * Hkv)`` splits, fewer while a split
      would be under 512 tokens (tiling_check.cpp l. 990-1050, tiling.cpp SplitBNS l. 2246-2268);
      cores: 24 cube cores (preload) or 48 vector cores (serial).
    """
    g = sh.hq // sh.hkv
    preload = g <= 16 and sh.head_dim == 128 and not sh.kv_quant and \
        sh.batch * sh.hkv * -(-sh.context // 2048) > 128
    cores = prof.cube_units if preload else prof.units
    bn = sh.batch * sh.hkv
    fd = sh.context > 1024 and (g == 1 or sh.context >= 2048) and \
        (bn <= 0.5 * cores if preload else bn < 0.4 * cores)
    splits = 1
    if fd:
        splits = max(1, cores // bn)
        while splits > 1 and sh.context / splits < 512:
            splits -= 1
    step = (8192, 4096, 2048)[min(g // 5, 2)]
    step = max(sh.page, step // sh.page * sh.page)
    if preload:
        return cm.Pipeline("CANN IFA (preload template)", step, 256, 4, True, True, True, 2), splits, cores
    return cm.Pipeline("CANN IFA (serial template)", step, 256, 1, False, True, False, 2), splits, cores


# our mixed kernel before the pipeline, and as built now (ascend_ops/kernel/splitkv_split_mix.cpp:
# steps of mixTileTokens x mixStepTiles tokens, K / V in rings of two 256-token L1 buffers each, the
# next tile's copy issued before the current one is used, QK one step ahead of PV across items,
# the vector cores' update one step behind their softmax across items); the step is the tiling's
# (tiling.choose_mix_tiles) for the shape's rows
def ours(sh: Shape) -> dict:
    from ascend_ops import tiling as tl
    tt, _, steps = tl.choose_mix_tiles(sh.head_dim, sh.dtype, sh.hq // sh.hkv, False,
                                       kv_dtype="int8" if sh.kv_quant else None)
    return {"ours: first mixed kernel (serial, 256-token tiles)": cm.SERIAL_256,
            # int8 KV: QK and the vector cores' lag run within an item only (the next item's q is
            # expanded by the vector cores after the current item's output)
            "ours: pipelined mixed kernel": cm.Pipeline("pipelined mixed kernel", tt * steps, tt, 2, True, True,
                                                        not sh.kv_quant, 4)}


def critical_path(shapes=SHAPES, c=None, programs=None, with_ifa: bool = True) -> dict:
    """Each shape by the critical-path model: our programs (``programs(shape)``: label -> Pipeline,
    default :func:`ours`) and CANN IFA's structure (:func:`ifa_program`), all with our kernel's
    twin-counted vector work per exchange step (like for like)."""
    c = c or cm.load_constants()
    programs_of = programs or ours
    from ascend_ops import tiling as tl
    prof = get_profile("910b2")
    rows = []
    for sh in shapes:
        vec = vec_work_from_twin(sh)
        splits = tl.npu_split_count([sh.context] * sh.batch, sh.hkv, sh.page, "910b2", num_q_heads=sh.hq,
                                    head_dim=sh.head_dim)
        eb = 1 if sh.kv_quant else 2
        floor = cm.hbm_floor_us(sh.batch, sh.context, sh.hkv, sh.head_dim, eb, c)
        runs = [(label, p, splits, prof.cube_units) for label, p in programs_of(sh).items()]
        if with_ifa:
            p, sp, cores = ifa_program(sh, prof)
            runs.append((p.name, p, sp, cores))
        bound = cm.lower_bound_us(sh.batch, sh.context, sh.hkv, sh.head_dim, eb, c, prof.cube_units)
        rows.append({"shape": sh.name, "program": "least any kernel (bound)", "step_tokens": None, "preload": None,
                     "splits": None, "us": bound["us"], "x_floor": bound["us"] / floor, "hbm_floor_us": floor,
                     "split_us": None, "combine_us": None, "launch_us": c.mix_launch_us, "worst_core_items": None,
                     "worst_core_tokens": None, "cube_busy_us": None, "vec_busy_us": None})
        for label, p, sp, cores in runs:
            r = cm.launch_us(sh.batch, sh.context, sh.hq, sh.hkv, sh.head_dim, eb, sp, p, vec, c,
                             cube_cores=cores, vector_cores=prof.units)
            w = r["worst_core"]
            rows.append({"shape": sh.name, "program": label, "step_tokens": p.step_tokens, "preload": p.preload,
                         "splits": sp, "us": r["us"], "x_floor": r["us"] / floor, "hbm_floor_us": floor,
                         "split_us": r["split_us"], "combine_us": r["combine_us"], "launch_us": r["launch_us"],
                         "worst_core_items": w.get("items"), "worst_core_tokens": w.get("tokens"),
                         "cube_busy_us": w.get("cube_busy_us"), "vec_busy_us": w.get("vec_busy_us")})
    return {"kind": "ESTIMATE (critical-path model over CPU-twin counts and paper constants; nothing ran on an NPU)",
            "constants": dict(c.values), "constants_origin": c.origin, "constant_sources": dict(c.sources),
            "rows": rows}


def critical_path_markdown(est: dict) -> str:
    out = ["| shape (D 128, bf16, page 128) | program | step tokens | preload | splits | est. µs | x HBM floor "
           "| HBM floor µs | worst AI core: items / tokens |", "|---|---|---|---|---|---|---|---|---|"]
    for r in est["rows"]:
        worst = "-" if r["worst_core_items"] is None else f"{r['worst_core_items']} / {r['worst_core_tokens']:,}"
        dash = lambda v: "-" if v is None else v  # noqa: E731
        out.append(f"| {r['shape']} | {r['program']} | {dash(r['step_tokens'])} | {dash(r['preload'])} | "
                   f"{dash(r['splits'])} | {r['us']:,.1f} | {r['x_floor']:.3f} | {r['hbm_floor_us']:,.0f} | {worst} |")
    return "\n".join(out) + "\n"


def to_markdown(est: dict) -> str:
    out = ["| shape (D 128, bf16, page 128) | kernel | splits | split stage (est. µs) | combine (est. µs) "
           "| total (est. µs) | x HBM floor | split: worst context, slowest pipe / serial (µs) | HBM floor (µs) "
           "| CANN IFA (est. µs) |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for r in est["rows"]:
        p = r["split_worst_core_pipes_us"]
        slow = max(p, key=p.get) if p else "-"
        out.append(f"| {r['shape']} | {r['kernel']} | {r['splits']} | {r['split_us']:,.0f} | {r['combine_us']:,.0f} | "
                   f"{r['total_us']:,.0f} | {r['x_floor']:.2f} | {slow} {p.get(slow, 0):,.0f} / "
                   f"{r['split_worst_core_serial_us']:,.0f} | {r['hbm_floor_us']:,.0f} | {r['ifa_est_us']} |")
    return "\n".join(out) + "\n"


# the grid the critical-path table is judged on: Hq 32 with Hkv 8 and 4
CP_SHAPES = [Shape(f"B{b} {c // 1024}k, Hq32/Hkv{h}", b, c, 32, hkv=h)
             for h in (8, 4) for b, c in ((1, 16384), (1, 65536), (16, 8192), (64, 2048))]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out-json", type=Path)
    ap.add_argument("--out-md", type=Path)
    ap.add_argument("--shapes", default="all", help="comma-separated indices into SHAPES, or 'all'")
    ap.add_argument("--kernels", default="vector,mix", help="split stages to count: vector, mix or both")
    ap.add_argument("--scratch-in-hbm", action="store_true",
                    help="sensitivity: charge the mixed kernel's scratch to HBM (no L2 residency)")
    ap.add_argument("--int8", action="store_true",
                    help="the same shapes with int8 KV (per-channel scales and offsets); floor at 1 byte per element")
    ap.add_argument("--model", choices=("critical-path", "throughput", "both"), default="both",
                    help="critical-path: ascend_ops/cost_model.py on the Hq32 / Hkv 8 and 4 grid (ours as built, "
                         "the pipelined design, CANN IFA); throughput: the first model, per kernel and shape")
    ap.add_argument("--constants", type=Path, default=None,
                    help="a constants file (npu_constants.json schema, e.g. written by the node-day command) "
                         "over the paper constants of the critical-path model")
    ap.add_argument("--dma-block-cycles", type=float, default=None,
                    help="sensitivity: cycles per block (row) of a strided DMA (the first model used 30)")
    a = ap.parse_args(argv)
    from dataclasses import replace
    shapes = SHAPES if a.shapes == "all" else [SHAPES[int(i)] for i in a.shapes.split(",")]
    if a.int8:
        shapes = [replace(s, name=s.name + ", int8 KV", kv_quant="channel", ifa_us="n/a") for s in shapes]
    c = C
    if a.scratch_in_hbm:
        c = replace(c, scratch_in_l2=False)
    if a.dma_block_cycles is not None:
        c = replace(c, dma_block_cycles=a.dma_block_cycles)
    result, md = {}, ""
    if a.model in ("throughput", "both"):
        est = estimate(shapes, c, kernels=tuple(a.kernels.split(",")))
        result["throughput"] = est
        md += f"## Throughput model\n\n{est['kind']}\n\n{to_markdown(est)}\n"
    if a.model in ("critical-path", "both"):
        cp_shapes = CP_SHAPES if a.shapes == "all" else [CP_SHAPES[int(i)] for i in a.shapes.split(",")]
        if a.int8:
            cp_shapes = [replace(s, name=s.name + ", int8 KV", kv_quant="channel") for s in cp_shapes]
        cp = critical_path(cp_shapes, cm.load_constants(a.constants))
        result["critical_path"] = cp
        md += f"## Critical-path model\n\n{cp['kind']}; constants: {cp['constants_origin']}\n\n" \
              f"{critical_path_markdown(cp)}\n"
    print(md)
    if a.out_json:
        a.out_json.write_text(json.dumps(result, indent=1))
    if a.out_md:
        a.out_md.write_text(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
