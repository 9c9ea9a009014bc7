"""Stages 3 and 4: smoke cases, one feature each, and their determinism.

Each :class:`SmokeCase` builds small seeded :class:`~splitkv_common.inputs.DecodeInputs` with
:func:`splitkv_common.parity.cases.random_inputs` exercising one feature of the kernels. A smoke run
compares our kernel's ``out [T, Hq, D]`` and ``lse [T, Hq]`` (float32, natural log) with the float64
reference (:func:`splitkv_common.reference.dense_attention`; the verdict is the parity harness's
accuracy rule, :func:`splitkv_common.parity.accuracy.check`) and with the vector-only kernel on the
same inputs (``kernel="vector"``, reported, not judged). A determinism run repeats the launch and
varies the block count (1, 2, 8, all cores; on the twin also the block order) and requires the same
bits every time: the plan fixes the merge order.

Runners: :class:`TwinRunner` (the CPU twin, ``ascend_ops.sim_backend``) and :class:`OpRunner` (our
operator's raw entry ``torch.ops.splitkv_ascend.decode_attention`` with a tiling built here, on an
NPU, or on the CPU through the op's CPU kernel).
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from splitkv_common.inputs import DecodeInputs
from splitkv_common.parity.accuracy import check
from splitkv_common.parity.cases import random_inputs
from splitkv_common.reference import dense_attention, plain_attention

from .. import tiling as tl


@dataclass(frozen=True)
class SmokeCase:
    """One feature: ``build()`` the inputs, plan them with ``policy``; ``graph`` (graph mode): the
    lengths of the replays after the capture, which used ``build()``'s lengths; ``split`` the split
    size fixed at capture."""

    name: str
    feature: str
    build: Callable[[], DecodeInputs]
    policy: str = "auto"
    graph: tuple = ()
    split: int = 0
    plan_kwargs: dict = field(default_factory=dict)


def _ri(seed, lens, **kw):
    kw.setdefault("num_q_heads", 8)
    kw.setdefault("num_kv_heads", 2)
    kw.setdefault("head_dim", 128)
    kw.setdefault("page_size", 64)
    kw.setdefault("dtype", "bfloat16")
    return lambda: random_inputs(seed, lens, **kw)


def _graph_full() -> DecodeInputs:
    """The graph case's cache: 1024 tokens per request; capture and replays use shorter lengths."""
    return random_inputs(90, [1024, 1024, 1024], num_q_heads=8, num_kv_heads=2, head_dim=128, page_size=64,
                         dtype="bfloat16")


def _graph_capture() -> DecodeInputs:
    return dataclasses.replace(_graph_full(), seq_lens=np.array([700, 33, 1000], np.int32))


SMOKE_CASES: tuple[SmokeCase, ...] = (
    SmokeCase("one-tile-g4", "one tile, GQA group 4 (Hq 8 / Hkv 2), bf16, D 128", _ri(80, [128]), "none"),
    SmokeCase("short-tile", "one short tile (37 tokens, not a page multiple)", _ri(81, [37]), "none"),
    SmokeCase("masked-page", "a page mostly masked (70 tokens over two 64-token pages, the rest poisoned)",
              _ri(82, [70]), "none"),
    SmokeCase("multi-tile-item", "one work item over several tiles (1000 tokens, no split)", _ri(83, [1000]), "none"),
    SmokeCase("items-per-core", "several items per core (30 requests x 2 KV heads on 24 AI cores)",
              _ri(84, [100] * 30), "none"),
    SmokeCase("splits-combine", "one request in 4 splits, merged by the combine", _ri(85, [2000]), "size:512"),
    SmokeCase("mha-g1-fp16", "G 1 (MHA, Hq 4 / Hkv 4) in float16", _ri(86, [300, 77], num_q_heads=4, num_kv_heads=4,
                                                                       dtype="float16"), "size:128"),
    SmokeCase("query-rows", "several query rows per request (3 and 2, causal tail)", _ri(87, [200, 90], q_lens=[3, 2]),
              "size:64"),
    SmokeCase("window", "a sliding window (window_left 100)", _ri(88, [600, 150], window_left=100), "size:128"),
    SmokeCase("soft-cap", "a soft cap (30, scores pushed to about 20x)", _ri(89, [300], soft_cap=30.0, q_scale=20.0),
              "size:128"),
    SmokeCase("int8-kv", "int8 KV with per-channel scales and offsets, bf16 q",
              _ri(91, [300, 65], kv_quant="channel", kv_offset=True), "size:128"),
    SmokeCase("graph-replay", "graph mode: one capture, replays with new lengths (split 256 fixed)",
              _graph_capture, "size:256", graph=((1000, 2, 64), (1, 1024, 300)), split=256,
              plan_kwargs={"graph_stable": True, "max_splits": 4}),
)

#: Cases that exist to prove the report records failures (``--inject``): never part of a real run.
PLANTED: dict[str, SmokeCase] = {
    "wrong-output": SmokeCase("planted-wrong-output", "PLANTED: the output is perturbed after the run",
                              _ri(80, [128]), "none"),
    "hang": SmokeCase("planted-hang", "PLANTED: the child sleeps forever (the watchdog must end it)",
                      _ri(80, [128]), "none"),
}
CASE_NAMES = tuple(c.name for c in SMOKE_CASES)


def get_case(name: str) -> SmokeCase:
    for c in (*SMOKE_CASES, *PLANTED.values()):
        if c.name == name:
            return c
    raise ValueError(f"smoke case: unknown {name!r}; known: {', '.join(CASE_NAMES)}")


def select(pattern: str | None) -> list[str]:
    """Case names matching a comma-separated list of substrings (all when None); ValueError when none."""
    if not pattern:
        return list(CASE_NAMES)
    keys = [k.strip() for k in pattern.split(",") if k.strip()]
    out = [n for n in CASE_NAMES if any(k in n for k in keys)]
    if not out:
        raise ValueError(f"--cases: {pattern!r} matches no smoke case; known: {', '.join(CASE_NAMES)}")
    return out


# ---------------------------------------------------------------------------------------------
# Errors

def errors(out, lse, ref_out, ref_lse) -> dict:
    """Max errors of ``(out, lse)`` against ``(ref_out, ref_lse)``: ``out_abs`` (max |diff|),
    ``out_rel`` (over max |ref out|), ``lse_abs``, ``lse_rel`` (over max |ref lse|) on the rows where
    both lse are finite; ``lse_pattern_ok``: -inf in the same places (inf errors where not or NaN)."""
    out = np.asarray(out, np.float64)
    ref_out = np.asarray(ref_out, np.float64)
    lse = np.asarray(lse, np.float64)
    ref_lse = np.asarray(ref_lse, np.float64)
    d = np.abs(out - ref_out)
    out_abs = float(np.max(d, initial=0.0)) if not np.isnan(d).any() else float("inf")
    scale = max(float(np.max(np.abs(ref_out), initial=0.0)), 1e-30)
    fin = np.isfinite(ref_lse) & np.isfinite(lse)
    pattern = bool((np.isneginf(lse) == np.isneginf(ref_lse)).all() and not np.isnan(lse).any())
    ld = np.abs(lse[fin] - ref_lse[fin])
    lse_abs = float(np.max(ld, initial=0.0)) if pattern else float("inf")
    lscale = max(float(np.max(np.abs(ref_lse[fin]), initial=0.0)), 1e-30)
    return {"out_abs": out_abs, "out_rel": out_abs / scale, "lse_abs": lse_abs, "lse_rel": lse_abs / lscale,
            "lse_pattern_ok": pattern}


# ---------------------------------------------------------------------------------------------
# Runners

class _Runner:
    """What every runner shares: its device profile's core counts and the tiling built for it."""

    profile = None

    def cores(self, til: tl.Tiling) -> int:
        return self.profile.cube_units if til.mixed else self.profile.units

    def tiling(self, inputs, plan, kernel="auto", block_dim=None, split=0) -> tl.Tiling:
        return tl.build_tiling(inputs, plan, self.profile, block_dim=block_dim, kernel=kernel,
                               device_split_tokens=split)


class TwinRunner(_Runner):
    """The kernels on the CPU twin, planned for ``profile``."""

    name = "twin"

    def __init__(self, profile: str = "910b2"):
        from .. import sim_backend as sim
        from splitkv_common.devices import get_profile

        self.sim = sim
        self.profile = get_profile(profile)
        self.lib = sim.twin_library()

    def run(self, inputs, plan, til: tl.Tiling, order: int = 0):
        sim = self.sim
        sim.set_cores(self.lib, self.profile)
        sim.set_block_order(self.lib, order)
        try:
            return sim.run_tiling(inputs, plan, til)
        finally:
            sim.set_block_order(self.lib, 0)
            sim.set_cores(self.lib, sim.PROFILE)

    def replay(self, inputs, plan, til: tl.Tiling, lens, order: int = 0):
        """A graph replay: the capture's tiling with only the plan's lengths rewritten."""
        return self.run(dataclasses.replace(inputs, seq_lens=np.asarray(lens, np.int32)), plan,
                        self.sim.with_seq_lens(til, lens), order)


class OpRunner(_Runner):
    """Our operator's raw entry (``ascend_ops.ops.decode_attention_op``) with a tiling built here:
    on an NPU (``device`` npu, the chip's profile with its own core counts) or on the CPU (the op's
    CPU kernel, which computes the same contract: plumbing only)."""

    def __init__(self, device: str = "npu", profile=None):
        import torch

        from .. import ops  # registers the schema (and loads the library on an NPU)

        self.torch, self.ops = torch, ops
        if device == "npu":  # pragma: no cover - needs an NPU (NOT RUN)
            import torch_npu  # noqa: F401

            from ..runtime import load_extension
            from ..support import npu_profile

            load_extension()
            self.device = torch.device("npu", torch.npu.current_device())
            self.profile = npu_profile(self.device, profile)
        else:
            from splitkv_common.devices import get_profile

            self.device = torch.device(device)
            self.profile = get_profile(profile or "910b2")
        self.name = f"op on {self.device}"

    def run(self, inputs, plan, til: tl.Tiling, order: int = 0):
        from splitkv_common.torch_io import from_torch, to_torch

        torch, dev = self.torch, self.device
        t = to_torch(inputs, dev)
        q = t["q"]
        words = torch.from_numpy(np.ascontiguousarray(til.plan_words, np.int32)).to(dev)
        tiling = torch.frombuffer(bytearray(til.tiling_bytes), dtype=torch.uint8).to(dev)
        kvq = None if til.kv_quant is None else torch.from_numpy(np.ascontiguousarray(til.kv_quant, np.float32)).to(dev)
        ws = torch.empty(-(-til.workspace_bytes // 4), dtype=torch.float32, device=dev)
        out = torch.full_like(q, float("nan"))
        lse = torch.full(tuple(q.shape[:2]), float("nan"), dtype=torch.float32, device=dev)
        self.ops.decode_attention_op(q, t["k_cache"], t["v_cache"], t["block_table"], kvq, words, tiling, ws, out, lse,
                                     til.block_dim, int(til.fields["kernelKind"]))
        if dev.type == "npu":  # pragma: no cover
            torch.npu.synchronize()
        return from_torch(out, lse)

    def replay(self, inputs, plan, til: tl.Tiling, lens, order: int = 0):
        """A replay's launch: the capture's tiling, the plan words' lengths rewritten (as the
        wrapper's device copy does before a graph replay)."""
        from .. import sim_backend as sim  # with_seq_lens only (no twin library is built)

        return self.run(dataclasses.replace(inputs, seq_lens=np.asarray(lens, np.int32)), plan,
                        sim.with_seq_lens(til, lens), order)


def make_runner(mode: str, profile):
    return TwinRunner(profile) if mode == "twin" else OpRunner("npu" if mode == "npu" else "cpu", profile)


# ---------------------------------------------------------------------------------------------
# One case: stage 3 and stage 4

def _plan(case: SmokeCase, inputs: DecodeInputs, profile):
    plan = inputs.plan(case.policy, device=profile, **case.plan_kwargs)
    inputs.validate()
    plan.validate(inputs.seq_lens, inputs.query_start_loc, window_left=inputs.window_left,
                  num_kv_heads=inputs.k_cache.shape[2])
    return plan


def _launches(case: SmokeCase, inputs: DecodeInputs):
    """The (inputs, lengths or None) of each launch the case judges: one, or the replays' lengths."""
    if not case.graph:
        return [(inputs, None)]
    full = _graph_full()
    return [(dataclasses.replace(full, seq_lens=np.asarray(lens, np.int32)), lens) for lens in case.graph]


def _go(runner, case, inputs, plan, til, lens, order=0):
    if lens is None:
        return runner.run(inputs, plan, til, order)
    return runner.replay(inputs, plan, til, lens, order)


def run_smoke(name: str, runner, inject: str | None = None) -> dict:
    """Stage 3's item for one case: our kernel (the tiling's own choice) against the float64
    reference and against the vector kernel, on every launch of the case (the worst errors)."""
    case = get_case(name)
    if case.name == PLANTED["hang"].name:
        while True:
            time.sleep(3600)
    t0 = time.perf_counter()
    inputs = case.build()
    plan = _plan(case, inputs, runner.profile)
    til = runner.tiling(inputs, plan, "auto", split=case.split)
    vtil = runner.tiling(inputs, plan, "vector", split=case.split)
    worst_ref, worst_vec, verdicts = None, None, []
    for inp, lens in _launches(case, inputs):
        out, lse = _go(runner, case, inp, plan, til, lens)
        if case.name == PLANTED["wrong-output"].name:
            out = out + 0.5
        vout, vlse = _go(runner, case, inp, plan, vtil, lens)
        ref_out, ref_lse = dense_attention(inp)
        acc = check(out, lse, ref_out, ref_lse, plain_attention(inp), inp.dtype)
        verdicts.append((acc, lens))
        e_ref, e_vec = errors(out, lse, ref_out, ref_lse), errors(out, lse, vout, vlse)
        worst_ref = e_ref if worst_ref is None else {k: max(worst_ref[k], e_ref[k]) if k != "lse_pattern_ok"
                                                     else worst_ref[k] and e_ref[k] for k in e_ref}
        worst_vec = e_vec if worst_vec is None else {k: max(worst_vec[k], e_vec[k]) if k != "lse_pattern_ok"
                                                     else worst_vec[k] and e_vec[k] for k in e_vec}
    failed = [(a, lens) for a, lens in verdicts if not a.passed]
    msg = "; ".join(f"{'replay ' + str(list(lens)) + ': ' if lens else ''}{a.reason}" for a, lens in failed)
    return {"name": case.name, "feature": case.feature, "status": "fail" if failed else "pass",
            "kernel": "mix" if til.mixed else "vector", "kernel_reason": til.kernel_reason,
            "block_dim": til.block_dim, "launches": len(verdicts), "vs_reference": worst_ref, "vs_vector": worst_vec,
            "seconds": round(time.perf_counter() - t0, 3), "message": msg}


def run_determinism(name: str, runner, repeats: int, block_counts=(1, 2, 8, "all"), orders=(0,)) -> dict:
    """Stage 4's item for one case: ``repeats`` launches as planned, then every block count in every
    block order; each must give the bits of the first launch (of every replay, in graph mode)."""
    case = get_case(name)
    t0 = time.perf_counter()
    inputs = case.build()
    plan = _plan(case, inputs, runner.profile)
    base = runner.tiling(inputs, plan, "auto", split=case.split)
    counts = sorted({min(runner.cores(base), runner.cores(base) if c == "all" else int(c)) for c in block_counts})
    launches = 0
    for inp, lens in _launches(case, inputs):
        first = _go(runner, case, inp, plan, base, lens)
        launches += 1
        want = [np.ascontiguousarray(x).tobytes() for x in first]

        def same(res):
            return [np.ascontiguousarray(x).tobytes() for x in res] == want

        where = f" (replay {list(lens)})" if lens else ""
        for r in range(1, repeats):
            launches += 1
            if not same(_go(runner, case, inp, plan, base, lens)):
                return _det(case, "fail", launches, counts, orders, t0,
                            f"repeat {r + 1} of {repeats} gave other bits than the first{where}")
        for bd in counts:
            til = runner.tiling(inputs, plan, "auto", block_dim=bd, split=case.split)
            for order in orders:
                launches += 1
                if not same(_go(runner, case, inp, plan, til, lens, order)):
                    return _det(case, "fail", launches, counts, orders, t0,
                                f"block count {bd}, block order {order} gave other bits than the planned launch "
                                f"({base.block_dim} blocks){where}")
    return _det(case, "pass", launches, counts, orders, t0, "")


def _det(case, status, launches, counts, orders, t0, msg) -> dict:
    return {"name": case.name, "status": status, "launches": launches, "block_counts": list(counts),
            "block_orders": list(orders), "seconds": round(time.perf_counter() - t0, 3), "message": msg}
