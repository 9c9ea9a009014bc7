"""The ``ascend-sim`` parity backend: the Ascend C kernels run on the CPU twin.

The twin is a TEST DOUBLE, not the NPU: the very kernel sources of ``ascend_ops/kernel/`` are
compiled with g++ against our own emulation of the Ascend C API subset they use
(``ascend_ops/sim/kernel_operator.h``), which follows the documented semantics and turns the
documented constraints into errors (192 KiB UB, 32-byte alignment of buffers and copy lengths,
queue depth and alloc/free discipline, no read of local memory before it is written, the
documented DMA/vector/cast limits), and checks the synchronisation between pipes and between
blocks (``[pipe-race]``, ``[gm-race]``, ``[flag]``; ``sim/sim_pipes.h``). Blocks run one at a time,
in the order ``set_block_order`` chose (the parity backend runs each case in every order of
``CATALOG_ORDERS`` and requires the same bits). It does not model timing (``last_stats`` gives work
counts for ``splitkv_bench/npu_estimate.py``, a paper estimate) or the NPU's own Exp/Ln.

The shared library is built on demand (a few seconds) into ``$SPLITKV_SIM_CACHE`` or
``~/.cache/splitkv-sim``, keyed by a hash of the sources and flags.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np

from splitkv_common.device_errors import merge_records
from splitkv_common.dtypes import round_to
from splitkv_common.devices import get_profile
from splitkv_common.inputs import DecodeInputs
from splitkv_common.merge import merge_states
from splitkv_common.plan_layout import Plan
from splitkv_common.parity.registry import Backend
from splitkv_common.shared_prefix import plan_for_inputs, tail_inputs

from . import tiling as tl
from .shared_prefix import prefix_batch
from .support import DEFAULT_PROFILE, unsupported_reason

HERE = Path(__file__).parent
KERNEL_DIR = HERE / "kernel"
SIM_DIR = HERE / "sim"
CXX = os.environ.get("CXX", "g++")
# SPLITKV_SIM_CXXFLAGS adds flags (e.g. "-fsanitize=address,undefined"; the sanitizer runtime must
# then be preloaded into Python: scripts/twin_sanitizers.sh).
CXXFLAGS = ["-std=c++17", "-O2", "-fPIC", "-shared", "-pthread", "-Wall", "-Wextra", "-Werror",
            *os.environ.get("SPLITKV_SIM_CXXFLAGS", "").split()]
# Link flags. Where the toolchain links the C++ runtime statically into a shared library (as g++ 13
# on Ubuntu 24.04 may), its symbols must stay private: exported, they are interposed by the process's
# own libstdc++.so (numpy loads one), the two copies' locale and iostream state mix, and the first
# std::ostringstream faults. SPLITKV_SIM_LDFLAGS adds flags (e.g. "-static-libstdc++").
LDFLAGS = ["-Wl,--exclude-libs,ALL", *os.environ.get("SPLITKV_SIM_LDFLAGS", "").split()]
PROFILE = DEFAULT_PROFILE


class SimViolation(RuntimeError):
    """A kernel broke an Ascend C rule the twin enforces (message starts with the rule, e.g. ``[ub-capacity]``)."""


def cache_dir() -> Path:
    d = Path(os.environ.get("SPLITKV_SIM_CACHE") or Path.home() / ".cache" / "splitkv-sim")
    d.mkdir(parents=True, exist_ok=True)
    return d


def compiler_missing() -> str | None:
    """None when the C++ compiler the twin needs is on PATH, else the reason."""
    if shutil.which(CXX) is None:
        return f"the CPU twin needs a C++17 compiler ({CXX}) on PATH; none found"
    return None


def _digest(paths, *extra: str) -> str:
    h = hashlib.sha256()
    for p in paths:
        h.update(p.name.encode())
        h.update(p.read_bytes())
    for e in extra:
        h.update(e.encode())
    return h.hexdigest()[:16]


def build_library(sources: list[Path], defines: tuple[str, ...] = (), name: str = "twin",
                  extra_flags: tuple[str, ...] = ()) -> Path:
    """Compile ``sources`` + the twin runtime against the emulation headers into a shared library.

    Each source becomes an object file cached by the hash of its text, every header, the compiler,
    flags and defines (the runtime's object is shared by every library built alike); the sources
    compile in parallel, one process each. The library is cached by the hash of its objects."""
    srcs = [Path(s) for s in sources] + [SIM_DIR / "sim_runtime.cpp"]
    headers = sorted(set(SIM_DIR.glob("*.h")) | set(KERNEL_DIR.glob("*.h")))
    flags = [f for f in (*CXXFLAGS, *extra_flags) if f != "-shared"]
    config = " ".join([CXX, *flags, *defines])
    objs = [cache_dir() / f"{src.stem}-{_digest([src, *headers], config)}.o" for src in srcs]
    out = cache_dir() / f"lib{name}-{_digest([], config, *LDFLAGS, *(o.name for o in objs))}.so"
    if out.exists():
        return out
    jobs = []
    for src, obj in zip(srcs, objs):
        if obj.exists():
            continue
        fd, tmp = tempfile.mkstemp(suffix=".o", dir=obj.parent)
        os.close(fd)
        cmd = [CXX, *flags, *[f"-D{d}" for d in defines], "-I", str(SIM_DIR), "-I", str(KERNEL_DIR), "-c", str(src),
               "-o", tmp]
        jobs.append((cmd, tmp, obj, subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)))
    failed = []
    for cmd, tmp, obj, proc in jobs:
        err = proc.communicate()[1]
        if proc.returncode:
            failed.append(f"{' '.join(cmd)}\n{err[-4000:]}")
            os.unlink(tmp)
        else:
            os.replace(tmp, obj)
    if failed:
        raise RuntimeError("building the CPU twin failed:\n" + "\n".join(failed))
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=out.parent)
    os.close(fd)
    cmd = [CXX, *CXXFLAGS, *extra_flags, *LDFLAGS, *map(str, objs), "-o", tmp]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode:
        os.unlink(tmp)
        raise RuntimeError(f"linking the CPU twin failed:\n{' '.join(cmd)}\n{res.stderr[-4000:]}")
    os.replace(tmp, out)
    return out


def load_kernels(source_text: str, directory: Path, name: str) -> ctypes.CDLL:
    """One translation unit of kernel entries compiled with the twin runtime and loaded, its
    launchers' argument types set (the twin's own tests: planted kernels, which may leave variables
    and parameters unused on purpose, so those warnings are not errors here)."""
    src = Path(directory) / f"{name}.cpp"
    src.write_text(source_text)
    path = build_library([src], name=name,
                         extra_flags=("-Wno-error", "-Wno-unused-variable", "-Wno-unused-parameter"))
    dll = ctypes.CDLL(str(path))
    for f in (dll.sim_launch_1, dll.sim_launch_mix_1):
        f.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_int]
    return dll


_LIB = None


def twin_library() -> ctypes.CDLL:
    """The kernels compiled against the emulation (built on first use)."""
    global _LIB
    if _LIB is None:
        path = build_library(sorted(KERNEL_DIR.glob("*.cpp")), defines=("SPLITKV_SIM_KERNELS",), name="splitkv-twin")
        lib = ctypes.CDLL(str(path))
        P = ctypes.c_void_p
        lib.sim_launch_split.argtypes = [ctypes.c_int] + [P] * 8 + [ctypes.c_char_p, ctypes.c_int,
                                                                    ctypes.POINTER(ctypes.c_uint)]
        lib.sim_launch_split_mix.argtypes = lib.sim_launch_split.argtypes
        lib.sim_set_l2_range.argtypes = [P, P]
        lib.sim_launch_attention_mix.argtypes = [ctypes.c_int] + [P] * 10 + [ctypes.c_char_p, ctypes.c_int,
                                                                             ctypes.POINTER(ctypes.c_uint)]
        lib.sim_launch_combine.argtypes = [ctypes.c_int] + [P] * 5 + [ctypes.c_char_p, ctypes.c_int,
                                                                      ctypes.POINTER(ctypes.c_uint)]
        lib.sim_set_cores.argtypes = [ctypes.c_int, ctypes.c_int]
        set_cores(lib, PROFILE)
        _LIB = lib
    return _LIB


def set_cores(lib: ctypes.CDLL, profile) -> None:
    """The device the next launches run on: a launch that calls SyncAll with more blocks than its
    cores (cube cores for a mixed launch, vector cores otherwise) is a ``[syncall]`` hang."""
    prof = get_profile(profile)
    lib.sim_set_cores(ctypes.c_int(prof.cube_units), ctypes.c_int(prof.units))


def set_block_order(lib: ctypes.CDLL, order: int) -> None:
    """Block order of the next launches: 0 forward, 1 reverse, >= 2 a shuffle seeded with ``order``."""
    lib.sim_set_block_order(ctypes.c_int(order))


def last_stats(lib: ctypes.CDLL) -> list[dict]:
    """Per-block work counters of the last launch on ``lib`` (the cost model's input; counts, not times)."""
    import json

    n = lib.sim_last_stats(None, 0)
    buf = ctypes.create_string_buffer(n)
    lib.sim_last_stats(buf, n)
    return json.loads(buf.value.decode())


def _ptr(a: np.ndarray):
    return ctypes.c_void_p(a.ctypes.data)


def _check(rc: int, err, stage: str):
    if rc:
        raise SimViolation(f"{stage}: {err.value.decode(errors='replace')}")


def to_native(x: np.ndarray, dtype: str) -> np.ndarray:
    """float32 values of ``dtype`` -> the kernel's storage (float32, float16, or bfloat16 bits as uint16)."""
    if dtype == "float32":
        return np.ascontiguousarray(x, np.float32)
    if dtype == "float16":
        return np.ascontiguousarray(x, np.float16)
    if dtype == "bfloat16":
        return np.ascontiguousarray((np.ascontiguousarray(x, np.float32).view(np.uint32) >> 16).astype(np.uint16))
    if dtype == "int8":
        return np.ascontiguousarray(x, np.int8)
    raise ValueError(f"dtype: {dtype!r}")


def from_native(x: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "bfloat16":
        return (x.astype(np.uint32) << 16).view(np.float32)
    return x.astype(np.float32)


WS_POISON = 0xFF  # NaN pattern: a read of a workspace byte the split stage did not write shows up


def _kernel_inputs(inputs: DecodeInputs, til: tl.Tiling) -> tuple:
    """What the split kernels read besides the plan words and workspace, as the twin takes them:
    ``(q, k_cache, v_cache, block_table, kv_quant, tiling bytes)`` (q and the caches in their native
    encodings, bf16 as uint16; the quantization floats zero for a float cache)."""
    quant = til.kv_quant if til.kv_quant is not None else np.zeros(8, np.float32)
    return (to_native(inputs.q, inputs.dtype), to_native(inputs.k_cache, inputs.kv_dtype),
            to_native(inputs.v_cache, inputs.kv_dtype), np.ascontiguousarray(inputs.block_table, np.int32), quant,
            np.frombuffer(til.tiling_bytes, np.uint8).copy())


def new_workspace(til: tl.Tiling, guard_bytes: int = 0) -> np.ndarray:
    """A workspace for ``til`` as the wrapper makes one: its error section zeroed, the rest (and
    ``guard_bytes`` + 32 more) poisoned with ``WS_POISON`` so that a read of a byte nothing wrote
    shows up. Pass it to several launches to keep their error counts (as a device workspace does)."""
    ws = np.full(til.workspace_bytes + guard_bytes + 32, WS_POISON, np.uint8)
    ws[:tl.ERROR_BYTES] = 0
    return ws


def read_errors(ws: np.ndarray) -> list[int]:
    """The error record (``splitkv_common.device_errors``) the launches on ``ws`` counted, its
    per-block slots summed."""
    slots = ws[:tl.ERROR_BYTES].view(np.int32).reshape(tl.ERROR_SLOTS, tl.ERROR_SLOT_BYTES // 4)
    return merge_records(slots)


def run_split(inputs: DecodeInputs, plan: Plan, til: tl.Tiling | None = None, guard_bytes: int = 0,
              ws: np.ndarray | None = None):
    """The split stage alone: returns ``(workspace bytes incl. guard, ub_peak, tiling)``; ``ws``: a
    workspace of :func:`new_workspace` to launch on (default: a new one)."""
    til = til or tl.build_tiling(inputs, plan, PROFILE)
    lib = twin_library()
    q, k, v, bt, quant, tb = _kernel_inputs(inputs, til)
    ws = new_workspace(til, guard_bytes) if ws is None else ws
    err = ctypes.create_string_buffer(2048)
    peak = ctypes.c_uint(0)
    launch = lib.sim_launch_split_mix if til.mixed else lib.sim_launch_split
    # cost-model counting only: the mixed kernel's per-core scratch is L2-resident (splitkv_bench/npu_estimate.py)
    lo = ws.ctypes.data + (int(til.fields["scratchOffsetBytes"]) if til.mixed else til.workspace_bytes)
    lib.sim_set_l2_range(ctypes.c_void_p(lo), ctypes.c_void_p(ws.ctypes.data + til.workspace_bytes))
    rc = launch(til.block_dim, _ptr(q), _ptr(k), _ptr(v), _ptr(bt), _ptr(quant), _ptr(til.plan_words),
                              _ptr(ws), _ptr(tb), err, len(err), ctypes.byref(peak))
    _check(rc, err, "split stage")
    return ws, int(peak.value), til


def _outputs(inputs: DecodeInputs):
    T, Hq, D = inputs.q.shape
    native = to_native(np.zeros(1, np.float32), inputs.dtype).dtype
    out = np.empty((T, Hq, D), native)  # poisoned: NaN everywhere until the combine writes it
    if native == np.uint16:
        out[...] = 0x7FC0
    else:
        out[...] = np.nan
    return out, np.full((T, Hq), np.nan, np.float32)


def run_fused(inputs: DecodeInputs, plan: Plan, til: tl.Tiling,
              ws: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The fused mixed launch (``splitkv_attention_mix``: split, SyncAll, combine) on the twin
    (``ws``: a workspace of :func:`new_workspace`, default a new one)."""
    lib = twin_library()
    q, k, v, bt, quant, tb = _kernel_inputs(inputs, til)
    ws = new_workspace(til) if ws is None else ws
    out, lse = _outputs(inputs)
    err = ctypes.create_string_buffer(2048)
    peak = ctypes.c_uint(0)
    lib.sim_set_l2_range(ctypes.c_void_p(ws.ctypes.data + int(til.fields["scratchOffsetBytes"])),
                         ctypes.c_void_p(ws.ctypes.data + til.workspace_bytes))
    rc = lib.sim_launch_attention_mix(til.block_dim, _ptr(q), _ptr(k), _ptr(v), _ptr(bt), _ptr(quant),
                                      _ptr(til.plan_words), _ptr(ws), _ptr(tb), _ptr(out), _ptr(lse), err, len(err),
                                      ctypes.byref(peak))
    lib.sim_set_l2_range(None, None)
    _check(rc, err, "fused mixed launch")
    return from_native(out, inputs.dtype), lse


# The block orders the parity backend runs every case in (forward, reverse, a seeded shuffle): a
# verdict or a result that depends on the order the twin happens to pick is a defect it reports.
CATALOG_ORDERS = (0, 1, 2026)


def run_in_orders(run, orders=CATALOG_ORDERS):
    """``run()`` once per block order; each must pass the twin's checks and give the same bits.

    Returns the first order's result. A violation names the order it appeared in."""
    lib = twin_library()
    first = None
    try:
        for order in orders:
            set_block_order(lib, order)
            try:
                res = run()
            except SimViolation as e:
                raise SimViolation(f"block order {order}: {e}") from None
            if first is None:
                first = res
            elif any(a.tobytes() != b.tobytes() for a, b in zip(first, res)):
                raise SimViolation(f"[order] block order {order} gives other bits than block order {orders[0]}")
    finally:
        set_block_order(lib, 0)
    return first


def run_twin(inputs: DecodeInputs, plan: Plan, profile: str = PROFILE, kernel: str = "auto",
             fused: bool | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Split then combine on the twin: ``(out [T, Hq, D] float32 values of q's dtype, lse [T, Hq] float32)``.

    ``kernel``: ``auto`` (the mixed split stage where it applies), ``mix`` or ``vector``. ``fused``
    (default: whenever the split stage is the mixed one, the launches the torch_npu binding makes:
    ``Tiling.launches``): one launch, the combine after SyncAll.
    The inputs (host arrays) and the plan are checked first: the twin's kernels trust both."""
    inputs.validate()
    plan.validate(inputs.seq_lens, inputs.query_start_loc, window_left=inputs.window_left,
                  num_kv_heads=inputs.k_cache.shape[2])
    til = tl.build_tiling(inputs, plan, profile, kernel=kernel)
    lib = twin_library()
    set_cores(lib, profile)
    try:
        return run_tiling(inputs, plan, til, fused)
    finally:
        set_cores(lib, PROFILE)


def with_seq_lens(til: tl.Tiling, seq_lens) -> tl.Tiling:
    """The same tiling with new lengths in the plan's ``seqLens`` section, as the wrapper's device copy
    writes them before a graph replay (graph mode: ``deviceSplitTokens > 0``)."""
    words = til.plan_words.copy()
    off = int(til.fields["seqLensOffset"])
    lens = np.asarray(seq_lens, np.int32).reshape(-1)
    words[off:off + lens.size] = lens
    return tl.Tiling(til.fields, til.tiling_bytes, words, til.kv_quant)


def run_tiling(inputs: DecodeInputs, plan: Plan, til: tl.Tiling, fused: bool | None = None,
               ws: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The launches of ``til`` on the twin (no checks: the kernels trust the tiling and plan words):
    the fused mixed launch, or the split stage then the combine (``fused=False`` splits the mixed one);
    ``ws``: a workspace of :func:`new_workspace` (default a new one; pass one to read its errors)."""
    if fused is None:
        fused = [k for k, _ in til.launches] == ["splitkv_attention_mix"]
    if fused:
        if not til.mixed:
            raise ValueError("fused: only the mixed split stage has a fused launch")
        return run_fused(inputs, plan, til, ws)
    ws, _, _ = run_split(inputs, plan, til, ws=ws)
    lib = twin_library()
    out, lse = _outputs(inputs)
    tb = np.frombuffer(til.tiling_bytes, np.uint8).copy()
    err = ctypes.create_string_buffer(2048)
    peak = ctypes.c_uint(0)
    lib.sim_set_l2_range(None, None)
    rc = lib.sim_launch_combine(til.combine_block_dim, _ptr(ws), _ptr(til.plan_words), _ptr(out), _ptr(lse), _ptr(tb),
                                err, len(err), ctypes.byref(peak))
    _check(rc, err, "combine stage")
    return from_native(out, inputs.dtype), lse


def _unavailable() -> str | None:
    return compiler_missing()


def _unsupported(inputs: DecodeInputs) -> str | None:
    return unsupported_reason(int(inputs.q.shape[2]), inputs.dtype, inputs.kv_dtype)


def run_catalog(inputs: DecodeInputs, plan: Plan, kernel: str = "auto") -> tuple[np.ndarray, np.ndarray]:
    """The parity backend's run: ``run_twin`` in every block order of ``CATALOG_ORDERS``."""
    return run_in_orders(lambda: run_twin(inputs, plan, kernel=kernel))


def run_twin_shared_prefix(inputs: DecodeInputs, shared_prefix, *, mode: str = "auto", policy: str = "auto",
                           profile: str | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Shared-prefix decode on the twin (``ascend_ops.shared_prefix``): ``(out [T, Hq, D] float32
    values of q's dtype, lse [T, Hq])``. The planner decides for the Ascend profile (``mode``:
    ``auto``, ``on``, ``off``); on the shared route the prefix stage (:func:`prefix_batch`, its plan's
    ``seqLens`` words replaced by the causal lengths) and the tails run as the kernels' launches,
    each in every block order, then the exact merge of each covered row's two states. A window
    takes the plain route."""
    profile = profile or PROFILE
    splan = plan_for_inputs(inputs, shared_prefix, device=profile, policy=policy,
                            mode="off" if inputs.window_left is not None else mode)
    if not splan.use_shared:
        return run_catalog(inputs, splan.plain)
    tin = tail_inputs(inputs, splan.groups)
    to, tlse = run_catalog(tin, tin.plan(policy, device=profile))
    vin, causal, rows = prefix_batch(inputs, splan.groups)
    vplan = vin.plan(policy, device=profile)
    til = with_seq_lens(tl.build_tiling(vin, vplan, profile), causal)
    po, pl = run_in_orders(lambda: run_tiling(vin, vplan, til))
    out, lse = to.astype(np.float32).copy(), tlse.astype(np.float32).copy()
    if rows.size:
        mo, ml = merge_states(np.stack([to[rows], po], 1), np.stack([tlse[rows], pl], 1), axis=1)
        out[rows], lse[rows] = mo, ml
    return round_to(out, inputs.dtype), lse


sim_backend = Backend(
    name="ascend-sim", run=run_catalog, unavailable=_unavailable, unsupported=_unsupported, device=PROFILE,
    description="Ascend C kernels on the CPU twin (g++ against our API emulation; a test double, not the NPU)",
    extra={"shared_prefix": run_twin_shared_prefix})
