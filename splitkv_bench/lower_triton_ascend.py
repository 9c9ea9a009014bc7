"""Lower every Triton kernel variant of ``cuda_ref`` for Ascend 910B, offline, and check it fits.

Runs inside the triton-ascend venv (``scripts/setup_triton_ascend_venv.sh``); no NPU and no CANN
are needed. For each variant it calls ``triton.compile`` with the target ``npu / Ascend910B3``,
which runs Triton's front end (TTIR), triton-ascend's adapter (TTIR -> linalg) and
``bishengir-compile`` (linalg -> HIVM, including Unified Buffer planning). That last tool then
hands the result to ``hivmc``, which only a CANN toolkit has, so *every* run ends in an error
here. The verdict is therefore read from the compiler's messages, not its exit code:

* ``ok``: the pipeline reached the CANN-only ``hivmc`` step (memory planning passed);
* ``ub-overflow``: ``ub overflow, requires N bits while M bits available`` (the tile does not fit
  the 192 KiB Unified Buffer of a vector core);
* ``error``: any other compiler error (unsupported construct, verifier failure, ...).

The script exits 1 if any variant is not ``ok``, and writes a JSON report (``--report``).
``--self-test`` first lowers a stand-in kernel twice: once with a tile that must overflow the
Unified Buffer and once with one that must fit, so the checker is shown to tell the two apart.

Usage::

    .venv-triton-ascend/bin/python -m splitkv_bench lower-triton-ascend --self-test
    .venv-triton-ascend/bin/python -m splitkv_bench lower-triton-ascend [--quick] [--jobs 2] [--report FILE]
"""

from __future__ import annotations

import argparse
import importlib.util
import inspect
import itertools
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field

REPO = pathlib.Path(__file__).resolve().parents[1]
TARGET_ARCH = os.environ.get("SPLITKV_ASCEND_ARCH", "Ascend910B3")

UB_RE = re.compile(r"ub overflow, requires (\d+) bits while (\d+) bits available")
UB_SIZE_RE = re.compile(r"UB\s+size\s*=\s*(\d+)\s*bits")
HIVMC_RE = re.compile(r"hivmc", re.IGNORECASE)


# ---------------------------------------------------------------------------------------------
# Variants: what the planner / wrapper of cuda_ref can select
# ---------------------------------------------------------------------------------------------

# The sweep (``--sweep``): the tile grid explored to build the NPU tile table. The default run
# lowers what the ``triton-npu`` backend can select: its tile table (``cuda_ref.npu``)
# at every checked head dim, dtype, GQA group and optional feature.
SWEEP_HEAD_DIMS = (64, 128, 256)
Q_DTYPES = ("fp16", "bf16", "fp32")
GROUPS = (1, 4, 8)
PAGE_SIZES = (128,)        # vLLM Ascend's only kernel block size; the kernel gathers per token
BLOCK_MS = (16, 32, 64)    # packed (query row x GQA head) rows per program
BLOCK_NS = (32, 64, 128)   # KV tokens per inner tile
FEATURES = ((False, False), (True, False), (False, True), (True, True))  # (soft cap, window)
_DTYPE_NAME = {"fp16": "float16", "bf16": "bfloat16", "fp32": "float32"}


def _npu_tables():
    """``cuda_ref/npu.py`` loaded by path: importing ``cuda_ref`` would switch Triton to its
    interpreter (``TRITON_INTERPRET=1`` without a CUDA device) for this process."""
    sys.path.insert(0, str(REPO))
    name = "splitkv_lowering_npu_tables"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, REPO / "cuda_ref" / "npu.py")
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
    return sys.modules[name]


@dataclass
class Variant:
    kernel: str
    constexprs: dict
    q_dtype: str
    kv_dtype: str

    @property
    def name(self) -> str:
        c = self.constexprs
        if self.kernel == "split_kv_kernel":
            return (f"split_kv D{c['HEAD_DIM']} {self.q_dtype}/{self.kv_dtype} G{c['GROUP']} "
                    f"M{c['BLOCK_M']} N{c['BLOCK_N']}" + (" cap" if c["SOFT_CAP"] else "")
                    + (" win" if c["HAS_WINDOW"] else "")
                    + ((" per-channel" if c.get("SCALE_PER_CHANNEL") else " per-head") if c["KV_INT8"] else ""))
        if self.kernel == "merge_kernel":
            return f"merge D{c['HEAD_DIM']} {self.q_dtype} chunk{c['CHUNK']} parts{c.get('D_PARTS', 1)}"
        return f"{self.kernel} {c}"


@dataclass
class Result:
    name: str
    kernel: str
    verdict: str                 # ok | ub-overflow | error
    constexprs: dict = field(default_factory=dict)
    ub_required_bits: int | None = None
    ub_available_bits: int | None = None
    ub_used_bits: int | None = None
    message: str = ""
    seconds: float = 0.0
    retries: int = 0             # attempts repeated after an empty MLIRCompilationError


# bishengir-compile sometimes fails with an MLIRCompilationError that carries no message, on a
# different variant each time, and the same variant lowers when compiled again (seen under load;
# cause unknown). Such a failure is retried; any failure with a message, or a repeated empty one,
# stays a failure.
EMPTY_ERROR_RETRIES = 2


def _next_pow2(x: int) -> int:
    return 1 << (int(x) - 1).bit_length()


def _split_constexprs(d, qd, kvq, g, bm, bn, cap=False, win=False, page=PAGE_SIZES[0], per_channel=True):
    return dict(GROUP=g, PAGE=page, HEAD_DIM=d, BLOCK_D=_next_pow2(d), BLOCK_M=bm, BLOCK_N=bn,
                KV_INT8=kvq, HAS_OFFSET=kvq, SOFT_CAP=cap, HAS_WINDOW=win,
                DOT_IEEE=(qd == "fp32" or kvq), UPCAST=False, FUSE_MERGE=False,
                SCALE_PER_CHANNEL=bool(kvq and per_channel), MERGE_CHUNK=16,
                LAUNCH_DEPENDENTS=False, MULTI_ROW_BLOCKS=True, BOUNDS=True, COUNT_ERRORS=False,
                MIXED_TILES=True)  # both KV loops (a one-row decode compiles the first alone)


def split_kv_variants(quick: bool = False) -> list[Variant]:
    """Every split-kernel variant the ``triton-npu`` backend can launch."""
    tn = _npu_tables()
    out = []
    dims = (128,) if quick else tn.CHECKED_HEAD_DIMS
    for d, qd, g, (cap, win) in itertools.product(dims, Q_DTYPES, GROUPS, FEATURES):
        if quick and (g != 4 or qd == "fp32"):
            continue
        max_m, bn = tn.npu_tile(d, _DTYPE_NAME[qd])
        # BLOCK_M is a power of two from 16 up to the table's cap; the largest is the one to check
        c = _split_constexprs(d, qd, False, g, max_m, bn, cap, win)
        out.append(Variant("split_kv_kernel", c, qd, qd))
    # int8 KV (16-bit q; dequantized to float32 before the dot): scale per channel with offset, and
    # per head without, with and without both features
    for d, qd, g, (cap, win), per_channel in itertools.product(dims, ("fp16", "bf16"), GROUPS,
                                                                (FEATURES[0], FEATURES[3]), (True, False)):
        if quick and g != 4:
            continue
        max_m, bn = tn.npu_tile(d, _DTYPE_NAME[qd], "int8")
        c = _split_constexprs(d, qd, True, g, max_m, bn, cap, win, per_channel=per_channel)
        c["HAS_OFFSET"] = per_channel
        out.append(Variant("split_kv_kernel", c, qd, "int8"))
    return out


def sweep_variants() -> list[Variant]:
    """The exploration grid (tile sizes x int8 KV), not all of which fit."""
    out = []
    for d, qd, kvq, g, bm, bn in itertools.product(SWEEP_HEAD_DIMS, Q_DTYPES, (False, True), GROUPS, BLOCK_MS,
                                                   BLOCK_NS):
        if kvq and qd == "fp32":
            continue  # int8 KV is served with 16-bit queries only
        out.append(Variant("split_kv_kernel", _split_constexprs(d, qd, kvq, g, bm, bn), qd, "int8" if kvq else qd))
    for d in SWEEP_HEAD_DIMS:
        for cap, win in FEATURES[1:]:
            c = _split_constexprs(d, "bf16", False, 8, max(BLOCK_MS), max(BLOCK_NS), cap, win)
            out.append(Variant("split_kv_kernel", c, "bf16", "bf16"))
    return out


def merge_variants(quick: bool = False) -> list[Variant]:
    out = []
    # cuda_ref.launch.prepare_merge: one program per (row, head, part of the head dim), D_PARTS =
    # cuda_ref.launch.merge_d_parts (64 columns a program), CHUNK = cuda_ref.launch.merge_chunk of the
    # columns (written out: that module needs torch, which this venv has not)
    for d, qd in itertools.product((128,) if quick else _npu_tables().CHECKED_HEAD_DIMS, Q_DTYPES):
        block_d = _next_pow2(d)
        parts = max(1, block_d // 64)
        c = dict(HEAD_DIM=d, BLOCK_D=block_d, SKIP_SINGLE=True, CHUNK=max(1, min(32, 4096 // (block_d // parts))),
                 WAIT_PRIMARY=False, D_PARTS=parts)
        out.append(Variant("merge_kernel", c, qd, qd))
    return out


def split_kv_signature(v: Variant) -> dict:
    q, kv = v.q_dtype, ("i8" if v.kv_dtype == "int8" else v.kv_dtype)
    p = lambda t: f"*{t}"  # noqa: E731
    sig = {
        "Q": p(q), "K": p(kv), "V": p(kv), "BLOCK_TABLE": p("i32"), "SEQ_LENS": p("i32"), "QUERY_START": p("i32"),
        "ITEM_REQ": p("i32"), "ITEM_HEAD": p("i32"), "ITEM_SPLIT": p("i32"), "ITEM_START": p("i32"),
        "ITEM_END": p("i32"), "NUM_SPLITS": p("i32"), "ROW_SLOT": p("i32"),
        "PART_O": p("fp32"), "PART_LSE": p("fp32"), "OUT": p(q), "OUT_LSE": p("fp32"), "COUNTERS": p("i32"), "ERRORS": p("i32"),
        "K_SCALE": p("fp32"), "V_SCALE": p("fp32"), "K_OFFSET": p("fp32"), "V_OFFSET": p("fp32"),
        "qk_scale": "fp32", "soft_cap": "fp32", "window_left": "i32",
    }
    for s in ("stride_qt", "stride_qh", "stride_kp", "stride_kt", "stride_kh", "stride_vp", "stride_vt",
              "stride_vh", "stride_bt", "stride_ps", "stride_ph", "stride_ls", "stride_lh", "stride_ot",
              "stride_oh", "stride_lot", "stride_loh", "stride_sh", "NUM_KV_HEADS", "NUM_PAGES", "KV_CAP",
              "NUM_ROWS", "NUM_SLOTS", "BATCH", "SPLIT_SIZE", "MAX_SPLITS"):
        sig[s] = "i32"
    for k in v.constexprs:
        sig[k] = "constexpr"
    return sig


def merge_signature(v: Variant) -> dict:
    q = v.q_dtype
    sig = {"PART_O": "*fp32", "PART_LSE": "*fp32", "OUT": f"*{q}", "OUT_LSE": "*fp32", "ROW_SLOT": "*i32",
           "ROW_NS": "*i32", "SEQ_LENS": "*i32", "QUERY_START": "*i32"}
    for s in ("stride_ps", "stride_ph", "stride_ls", "stride_lh", "stride_ot", "stride_oh", "stride_lot",
              "stride_loh", "slot_step", "NUM_SLOTS", "BATCH", "SPLIT_SIZE", "MAX_SPLITS", "SEARCH_STEPS"):
        sig[s] = "i32"
    for k in v.constexprs:
        sig[k] = "constexpr"
    return sig


# ---------------------------------------------------------------------------------------------
# Compiling one variant
# ---------------------------------------------------------------------------------------------

def _load_kernels(path: pathlib.Path):
    """Load the kernel file by path (the package's ``__init__`` may import CUDA-only glue)."""
    spec = importlib.util.spec_from_file_location("splitkv_lowering_kernels", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def _patch_arch(target):
    """triton-ascend asks the NPU runtime (or ``ASCEND_HOME_PATH``) for the chip name; answer it."""
    from triton.compiler.compiler import make_backend

    backend = make_backend(target)

    class _Utils:
        def get_arch(self):
            return TARGET_ARCH

    # the backend module is loaded under a private name (not in sys.modules): its globals are
    # reachable through any of its functions, e.g. the stage table
    backend.add_stages.__func__.__globals__["NPUUtils"] = _Utils


def _classify(text: str) -> tuple[str, dict]:
    info = {}
    m = UB_RE.search(text)
    if m:
        info["ub_required_bits"], info["ub_available_bits"] = int(m.group(1)), int(m.group(2))
        return "ub-overflow", info
    m = UB_SIZE_RE.search(text)
    if m:
        info["ub_used_bits"] = int(m.group(1))
    # bishengir-compile's own pipeline finished; it failed to start the CANN-only hivmc step
    if HIVMC_RE.search(text) and re.search(r"(not found|No such file|cannot find|failed to (find|execute|run))",
                                           text, re.IGNORECASE):
        return "ok", info
    return "error", info


def _short(text: str, limit: int = 600) -> str:
    lines = [ln for ln in text.splitlines() if ln.strip() and "[ERROR][Triton]" not in ln
             and "encounters error" not in ln and "kernel cache is in" not in ln]
    keep = [ln for ln in lines if re.search(r"error|overflow|unknown|unsupported", ln, re.IGNORECASE)] or lines[-6:]
    s = "\n".join(keep[:8])
    return s[:limit]


def compile_variant(args: tuple) -> Result:
    kernel_file, v = args
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import ASTSource

    target = GPUTarget("npu", TARGET_ARCH, 0)
    _patch_arch(target)
    mod = _load_kernels(pathlib.Path(kernel_file))
    fn = getattr(mod, v.kernel)
    sig = {"split_kv_kernel": split_kv_signature, "merge_kernel": merge_signature}.get(v.kernel)
    sig = sig(v) if sig else v.constexprs.pop("__signature__")
    # the compiler reads the signature's types in the kernel's parameter order, and counts every
    # parameter that is not a constant as a runtime argument: constexprs left at their defaults too
    params = inspect.signature(fn.fn).parameters
    unknown = sorted(set(sig) - set(params))
    missing = [a for a, p in params.items() if a not in sig and p.default is inspect.Parameter.empty]
    if missing or unknown:
        raise ValueError(f"{v.name}: signature and {v.kernel}'s parameters differ: missing {missing}, unknown {unknown}")
    constants = {a: p.default for a, p in params.items() if a not in sig}
    constants.update(v.constexprs)
    sig = {a: sig.get(a, "constexpr") for a in params}
    t0 = time.time()
    for attempt in range(EMPTY_ERROR_RETRIES + 1):
        verdict, info, text = _compile_once(triton, ASTSource, fn, sig, constants, target)
        if not (verdict == "error" and text.strip() == "MLIRCompilationError:"):
            break
    c = {k: v2 for k, v2 in v.constexprs.items() if k != "__signature__"}
    return Result(v.name, v.kernel, verdict, c, message=_short(text) if verdict != "ok" else "",
                  seconds=round(time.time() - t0, 2), retries=attempt, **info)


def _compile_once(triton, ASTSource, fn, sig, constants, target) -> tuple[str, dict, str]:
    """One lowering of a variant: ``(verdict, info, compiler text)``."""
    try:
        triton.compile(ASTSource(fn, sig, dict(constants)), target=target)
        return "ok", {}, "compiled to the end (a CANN toolkit is present)"
    except subprocess.CalledProcessError as e:
        text = "\n".join(x.decode(errors="replace") if isinstance(x, bytes) else str(x or "")
                         for x in (e.stdout, e.stderr))
        return (*_classify(text), text)
    except Exception as e:  # front-end or adapter error: the kernel does not lower
        text = f"{type(e).__name__}: {e}"
        # some triton-ascend versions wrap the subprocess failure
        v2, info2 = _classify(text)
        return (v2, info2, text) if v2 != "error" else ("error", {}, text)


# ---------------------------------------------------------------------------------------------
# Self-test on a stand-in kernel
# ---------------------------------------------------------------------------------------------

STANDIN = '''
import triton
import triton.language as tl


@triton.jit
def standin_kernel(X, Y, n, ROWS: tl.constexpr, COLS: tl.constexpr):
    """Row-wise softmax of a [ROWS, COLS] fp32 tile: the tile lives in the Unified Buffer."""
    pid = tl.program_id(0)
    r = tl.arange(0, ROWS)
    c = tl.arange(0, COLS)
    offs = pid * ROWS * COLS + r[:, None] * COLS + c[None, :]
    x = tl.load(X + offs, mask=offs < n, other=0.0)
    e = tl.exp(x - tl.max(x, 1)[:, None])
    tl.store(Y + offs, e / tl.sum(e, 1)[:, None], mask=offs < n)
'''


def self_test(tmp: pathlib.Path) -> bool:
    f = tmp / "standin_kernels.py"
    f.write_text(STANDIN)
    sig = {"X": "*fp32", "Y": "*fp32", "n": "i32", "ROWS": "constexpr", "COLS": "constexpr"}
    ok = True
    for rows, want in ((2048, "ub-overflow"), (64, "ok")):
        v = Variant("standin_kernel", {"ROWS": rows, "COLS": 128, "__signature__": sig}, "fp32", "fp32")
        r = compile_variant((str(f), v))
        good = r.verdict == want
        ok &= good
        print(f"self-test: {rows}x128 fp32 tile -> {r.verdict} (expected {want})"
              + (f", requires {r.ub_required_bits} of {r.ub_available_bits} bits" if r.ub_required_bits else "")
              + ("" if good else f"\n{r.message}"))
    return ok


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kernels", default=str(REPO / "cuda_ref" / "kernels.py"), help="file holding the kernels")
    ap.add_argument("--quick", action="store_true", help="head dim 128, G=4, 16-bit only")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--report", default=str(REPO / "reports" / "triton-ascend-lowering.json"))
    ap.add_argument("--self-test", action="store_true", help="check the checker on a stand-in kernel first")
    ap.add_argument("--only", default="", help="substring filter on variant names")
    ap.add_argument("--sweep", action="store_true",
                    help="lower the exploration grid (tile sizes, int8 KV) instead of the selectable variants")
    a = ap.parse_args(argv)

    if shutil.which("bishengir-compile") is None:
        try:
            import ascendnpuir
            os.environ["PATH"] = str(pathlib.Path(ascendnpuir.__file__).parent / "bin") + os.pathsep + os.environ["PATH"]
        except ImportError:
            print("bishengir-compile not found: run scripts/setup_triton_ascend_venv.sh and use its python")
            return 2
    try:
        import triton
        from triton.backends.compiler import GPUTarget  # noqa: F401
        if not (pathlib.Path(triton.__file__).parent / "backends" / "ascend").exists():
            raise ImportError("this triton has no Ascend backend")
    except ImportError as e:
        print(f"triton-ascend is not importable here ({e}); use the venv of scripts/setup_triton_ascend_venv.sh")
        return 2

    if a.self_test:
        import tempfile
        with tempfile.TemporaryDirectory() as d:
            if not self_test(pathlib.Path(d)):
                print("self-test FAILED: the checker cannot tell a fitting tile from an overflowing one")
                return 1

    variants = sweep_variants() if a.sweep else split_kv_variants(a.quick) + merge_variants(a.quick)
    if a.only:
        variants = [v for v in variants if a.only in v.name]
    print(f"lowering {len(variants)} variants of {a.kernels} for {TARGET_ARCH} with {a.jobs} jobs")
    t0 = time.time()
    with ProcessPoolExecutor(max_workers=max(1, a.jobs)) as ex:
        results = list(ex.map(compile_variant, [(a.kernels, v) for v in variants]))
    bad = [r for r in results if r.verdict != "ok"]
    for r in results:
        extra = ""
        if r.ub_required_bits:
            extra = f" requires {r.ub_required_bits} bits of {r.ub_available_bits}"
        elif r.ub_used_bits:
            extra = f" UB {r.ub_used_bits // 8192} KiB"
        if r.retries:
            extra += f" (after {r.retries} empty MLIRCompilationError(s))"
        print(f"{r.verdict:12s} {r.name}{extra}")
        if r.verdict == "error":
            print("    " + r.message.replace("\n", "\n    "))
    report = pathlib.Path(a.report)
    report.parent.mkdir(parents=True, exist_ok=True)
    sys.path.insert(0, str(REPO))
    from splitkv_common.provenance import provenance

    report.write_text(json.dumps({"provenance": provenance(probe_optional=False), "arch": TARGET_ARCH, "kernels": str(pathlib.Path(a.kernels).name),
                                  "triton": triton.__version__, "seconds": round(time.time() - t0, 1),
                                  "results": [asdict(r) for r in results]}, indent=1))
    print(f"{len(results) - len(bad)}/{len(results)} variants lower for {TARGET_ARCH}; report: {report}")
    return 1 if bad else 0
