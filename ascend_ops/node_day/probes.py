"""Stage 6: the latency and bandwidth probes, small Ascend C kernels of our own.

The kernels are ``ascend_ops/kernel/probes/probes_vector.cpp`` and ``probes_mix.cpp``; each takes one
GM buffer laid out as ``probe_layout.h`` says (parameters, one 64-byte record per context, data),
loops ``P_ITERS`` times and stamps its loop with ``GetSystemCycle()`` (50 ticks per microsecond on
Atlas A2). On a node they are launched from the probe library (``python -m ascend_ops.build
--probes``) through its ``aclrtlaunch_<entry>`` functions on torch_npu's current stream; on the CPU
twin (``--twin``) through the twin's launchers, where they must pass every check and where their
times are the host's clock: MEANINGLESS as device times, reported only to exercise the plumbing.

Each probe's result is ``{"value", "unit", "detail", "launches"}``: ``value`` is the quantity the
constants file (``ascend_ops/npu_constants.json``) names by the probe, in ``unit``.
"""

from __future__ import annotations

import ctypes
import hashlib
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from ..build import PROBE_DIR, PROBE_LIB_FILE  # noqa: E402,F401  (the probe library's sources and name)

SOURCES = ("probes_vector.cpp", "probes_mix.cpp")

# probe_layout.h
PARAMS_OFFSET, RECORDS_OFFSET, RECORD_BYTES, MAX_CONTEXTS, DATA_OFFSET, SLOT_BYTES = 0, 1024, 64, 192, 16384, 4096
P_ITERS, P_BYTES, P_SLOTS, P_ROWS, P_ROW_BYTES, P_ROW_STRIDE, P_PAGES = range(7)
R_START, R_END, R_ITERS, R_BYTES, R_RAN = range(5)
TICKS_PER_US = 50.0  # GetSystemCycle: 50 MHz on Atlas A2 (Ascend C API reference)

MEANINGLESS = "CPU twin: the host's clock, MEANINGLESS as a device time (plumbing only)"


@dataclass(frozen=True)
class Settings:
    """How big the probes run: ``node()`` on an NPU, ``twin()`` on the CPU twin (tiny, fast)."""

    iters: int               # loop count of the on-chip timed probes
    launches: int            # back-to-back launches of the host-timed empty probes
    slots: int               # 4 KiB copy slots of the latency probes (256 KiB of data on a node)
    page_rows: int           # rows per page of the bandwidth probe
    row_bytes: int           # bytes per row (D 128 in bf16: 256)
    row_stride: int          # bytes between a head's rows (Hkv 8 x 256)
    pages: int               # pages of the bandwidth probe's data region
    bw_iters: int            # pages each core streams
    copy_bytes: int          # the device copy (hbm_copy)

    @staticmethod
    def node(iters: int = 2000) -> "Settings":
        return Settings(iters=iters, launches=200, slots=64, page_rows=128, row_bytes=256, row_stride=2048,
                        pages=4096, bw_iters=256, copy_bytes=1 << 30)

    @staticmethod
    def twin(iters: int = 4) -> "Settings":
        return Settings(iters=iters, launches=3, slots=4, page_rows=16, row_bytes=256, row_stride=512, pages=8,
                        bw_iters=3, copy_bytes=1 << 24)


def params_words(**kw) -> np.ndarray:
    w = np.zeros(16, np.int32)
    for k, v in kw.items():
        w[{"iters": P_ITERS, "bytes": P_BYTES, "slots": P_SLOTS, "rows": P_ROWS, "row_bytes": P_ROW_BYTES,
           "row_stride": P_ROW_STRIDE, "pages": P_PAGES}[k]] = int(v)
    return w


def new_buffer(data_bytes: int, params: np.ndarray, seed: int = 0) -> np.ndarray:
    """The host image of a probe buffer: parameters, zeroed records, random data (64-byte aligned)."""
    n = DATA_OFFSET + int(data_bytes)
    raw = np.zeros(n + 64, np.uint8)
    off = (-raw.ctypes.data) % 64
    buf = raw[off:off + n]
    buf[PARAMS_OFFSET:PARAMS_OFFSET + 64] = params.view(np.uint8)
    rng = np.random.default_rng(seed)
    # small finite half values: the Fixpipe probe's Mmad reads them
    buf[DATA_OFFSET:] = rng.integers(0, 60, n - DATA_OFFSET, dtype=np.uint8)
    return buf


def records(buf: np.ndarray, contexts: int) -> list[dict]:
    """The records of the contexts that ran: ``{"ctx", "ticks", "iters", "bytes"}``."""
    words = buf[RECORDS_OFFSET:RECORDS_OFFSET + RECORD_BYTES * MAX_CONTEXTS].view(np.int64).reshape(MAX_CONTEXTS, 8)
    out = []
    for c in range(min(contexts, MAX_CONTEXTS)):
        w = words[c]
        if w[R_RAN] == 1:
            out.append({"ctx": c, "ticks": int(w[R_END] - w[R_START]), "iters": int(w[R_ITERS]),
                        "bytes": int(w[R_BYTES])})
    return out


# ---------------------------------------------------------------------------------------------
# Launchers: the twin's and the NPU's, with one interface

class TwinLauncher:
    """The probe kernels compiled against the twin (``ascend_ops/sim``), launched by its runtime."""

    measured = False

    def __init__(self, profile: str = "910b2"):
        from .. import sim_backend as sim
        from splitkv_common.devices import get_profile

        self.sim = sim
        headers = sorted(PROBE_DIR.glob("*.h"))
        digest = hashlib.sha256(b"".join(h.read_bytes() for h in headers)).hexdigest()[:12]
        # the probe headers are not among the twin's hashed headers: their hash rides in a define
        path = sim.build_library([PROBE_DIR / s for s in SOURCES], defines=(f"SPLITKV_PROBE_HEADERS={digest}",),
                                 name="splitkv-probes", extra_flags=("-I", str(PROBE_DIR)))
        self.lib = ctypes.CDLL(str(path))
        for f in (self.lib.sim_launch_1, self.lib.sim_launch_mix_1):
            f.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_int]
        self.lib.sim_set_cores.argtypes = [ctypes.c_int, ctypes.c_int]
        prof = get_profile(profile)
        self.aic, self.aiv = prof.cube_units, prof.units
        self.lib.sim_set_cores(self.aic, self.aiv)
        self.order = 0

    def launch(self, entry: str, buf: np.ndarray, blocks: int, mixed: bool) -> None:
        err = ctypes.create_string_buffer(4096)
        self.sim.set_block_order(self.lib, self.order)
        fn = ctypes.cast(getattr(self.lib, entry), ctypes.c_void_p)
        run = self.lib.sim_launch_mix_1 if mixed else self.lib.sim_launch_1
        rc = run(fn, ctypes.c_void_p(buf.ctypes.data), int(blocks), err, len(err))
        if rc:
            raise self.sim.SimViolation(f"{entry} on {blocks} blocks: {err.value.decode(errors='replace')}")

    def run(self, entry, buf, blocks, mixed) -> np.ndarray:
        self.launch(entry, buf, blocks, mixed)
        return buf

    def time_launches(self, entry: str, blocks: int, mixed: bool, n: int) -> float:
        buf = new_buffer(0, params_words(iters=0))
        t0 = time.perf_counter()
        for _ in range(n):
            self.launch(entry, buf, blocks, mixed)
        return (time.perf_counter() - t0) / n * 1e6

    def device_copy_gbps(self, nbytes: int) -> float:
        src = np.ones(nbytes, np.uint8)
        dst = np.empty_like(src)
        t0 = time.perf_counter()
        np.copyto(dst, src)
        return 2 * nbytes / (time.perf_counter() - t0) / 1e9


class NpuLauncher:  # pragma: no cover - needs an NPU (NOT RUN)
    """The probe library on the NPU: ``aclrtlaunch_<entry>(blockDim, stream, buf)`` via ctypes on
    torch_npu's current stream, with a synchronise around every launch."""

    measured = True

    def __init__(self, lib_path: Path, profile=None):
        import torch
        import torch_npu  # noqa: F401

        from ..support import npu_cores

        self.torch = torch
        self.lib = ctypes.CDLL(str(lib_path))
        self.aic, self.aiv = npu_cores(torch.npu.current_device())
        stream = torch.npu.current_stream()
        ptr = getattr(stream, "npu_stream", None)
        if ptr is None:
            raise RuntimeError("torch_npu's stream object has no npu_stream attribute: cannot launch the probes")
        self.stream = ctypes.c_void_p(int(ptr))

    def _fn(self, entry: str):
        fn = getattr(self.lib, f"aclrtlaunch_{entry}")
        fn.argtypes = [ctypes.c_uint32, ctypes.c_void_p, ctypes.c_void_p]
        fn.restype = ctypes.c_uint32
        return fn

    def run(self, entry, buf: np.ndarray, blocks, mixed) -> np.ndarray:
        dev = self.torch.from_numpy(buf).to("npu")
        self.torch.npu.synchronize()
        rc = self._fn(entry)(int(blocks), self.stream, ctypes.c_void_p(dev.data_ptr()))
        self.torch.npu.synchronize()
        if rc:
            raise RuntimeError(f"aclrtlaunch_{entry} returned {rc}")
        return dev.cpu().numpy()

    def time_launches(self, entry: str, blocks: int, mixed: bool, n: int) -> float:
        dev = self.torch.from_numpy(new_buffer(0, params_words(iters=0))).to("npu")
        fn = self._fn(entry)
        ptr = ctypes.c_void_p(dev.data_ptr())
        fn(int(blocks), self.stream, ptr)  # warm-up (first launch loads the binary)
        self.torch.npu.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            fn(int(blocks), self.stream, ptr)
        self.torch.npu.synchronize()
        return (time.perf_counter() - t0) / n * 1e6

    def device_copy_gbps(self, nbytes: int) -> float:
        torch = self.torch
        src = torch.empty(nbytes, dtype=torch.uint8, device="npu").fill_(1)
        dst = torch.empty_like(src)
        dst.copy_(src)  # warm-up
        start, end = torch.npu.Event(enable_timing=True), torch.npu.Event(enable_timing=True)
        reps = 10
        torch.npu.synchronize()
        start.record()
        for _ in range(reps):
            dst.copy_(src)
        end.record()
        torch.npu.synchronize()
        seconds = start.elapsed_time(end) / 1e3 / reps
        return 2 * nbytes / seconds / 1e9


# ---------------------------------------------------------------------------------------------
# The probes

def _us_per_iter(recs: list[dict]) -> float:
    """The slowest context's loop time per iteration, in microseconds."""
    worst = max(recs, key=lambda r: r["ticks"] / max(1, r["iters"]))
    return worst["ticks"] / max(1, worst["iters"]) / TICKS_PER_US


def _need(recs: list[dict], want: int, entry: str) -> list[dict]:
    if len(recs) < want:
        raise RuntimeError(f"{entry}: {len(recs)} context records written, expected {want}")
    return recs


def probe_cross_core_flag(L, s: Settings, results: dict) -> dict:
    buf = L.run("probe_cross_core_flag", new_buffer(0, params_words(iters=s.iters)), 1, True)
    rt = _us_per_iter(_need([r for r in records(buf, 3) if r["ctx"] == 0], 1, "probe_cross_core_flag"))
    return {"value": rt / 2, "unit": "us", "detail": {"round_trip_us": rt, "iters": s.iters, "blocks": 1},
            "what": "one AIC -> AIV flag (half the AIC -> AIV -> AIC round trip)"}


def _latency(L, entry: str, mixed: bool, s: Settings) -> dict:
    per = {}
    for nbytes in (1024, 2048, 4096):
        p = params_words(iters=s.iters, bytes=nbytes, slots=s.slots)
        buf = L.run(entry, new_buffer(s.slots * SLOT_BYTES, p), 1, mixed)
        per[str(nbytes)] = _us_per_iter(_need(records(buf, 3), 1, entry))
    return per


def probe_gm_to_ub(L, s: Settings, results: dict) -> dict:
    per = _latency(L, "probe_gm_to_ub_latency", False, s)
    return {"value": per["1024"], "unit": "us", "detail": {"us_by_bytes": per, "iters": s.iters},
            "what": "a GM -> UB copy waited for before the next (1 KiB; 2 and 4 KiB in detail)"}


def probe_gm_to_l1(L, s: Settings, results: dict) -> dict:
    per = _latency(L, "probe_gm_to_l1_latency", True, s)
    return {"value": per["1024"], "unit": "us", "detail": {"us_by_bytes": per, "iters": s.iters},
            "what": "a GM -> L1 (ND -> NZ) copy waited for before the next (1 KiB; 2 and 4 KiB in detail)"}


def probe_fixpipe(L, s: Settings, results: dict) -> dict:
    buf = L.run("probe_fixpipe_gm_mte2", new_buffer(2048, params_words(iters=s.iters)), 1, True)
    rt = _us_per_iter(_need([r for r in records(buf, 3) if r["ctx"] == 0], 1, "probe_fixpipe_gm_mte2"))
    flag = results.get("cross_core_flag_roundtrip", {}).get("detail", {}).get("round_trip_us")
    detail = {"loop_us": rt, "iters": s.iters, "flag_round_trip_us": flag}
    if flag is None or rt <= flag:
        # no flag figure, or a loop no longer than the flags' round trip (timer noise): the whole loop,
        # an upper bound, never 0 (the cost model refuses a zero constant)
        why = "the flag probe did not run" if flag is None else "the loop was not longer than the flags' round trip"
        return {"value": rt, "unit": "us", "detail": detail,
                "what": f"Fixpipe -> GM -> MTE2 round trip INCLUDING the two flags ({why})"}
    return {"value": rt - flag, "unit": "us", "detail": detail,
            "what": "Fixpipe write -> another core's MTE2 read, the flag round trip subtracted"}


def probe_syncall_mix(L, s: Settings, results: dict) -> dict:
    blocks = L.aic
    buf = L.run("probe_syncall_mix", new_buffer(0, params_words(iters=s.iters)), blocks, True)
    us = _us_per_iter(_need(records(buf, 3 * blocks), 3 * blocks, "probe_syncall_mix"))
    return {"value": us, "unit": "us", "detail": {"blocks": blocks, "iters": s.iters},
            "what": "SyncAll<false> over every cube and vector core of a mixed launch"}


def probe_syncall_vector(L, s: Settings, results: dict) -> dict:
    blocks = L.aiv
    buf = L.run("probe_syncall_vector", new_buffer(0, params_words(iters=s.iters)), blocks, False)
    us = _us_per_iter(_need(records(buf, blocks), blocks, "probe_syncall_vector"))
    return {"value": us, "unit": "us", "detail": {"blocks": blocks, "iters": s.iters},
            "what": "SyncAll<true> over every vector core of a vector launch"}


def probe_empty(L, s: Settings, results: dict) -> dict:
    us = L.time_launches("probe_empty", L.aiv, False, s.launches)
    return {"value": us, "unit": "us", "detail": {"blocks": L.aiv, "launches": s.launches},
            "what": "an empty vector-only launch, host time per launch of back-to-back launches"}


def probe_empty_mix(L, s: Settings, results: dict) -> dict:
    us = L.time_launches("probe_empty_mix", L.aic, True, s.launches)
    return {"value": us, "unit": "us", "detail": {"blocks": L.aic, "launches": s.launches},
            "what": "an empty mixed launch, host time per launch of back-to-back launches"}


def probe_mte2_bw(L, s: Settings, results: dict) -> dict:
    p = params_words(iters=s.bw_iters, rows=s.page_rows, row_bytes=s.row_bytes, row_stride=s.row_stride,
                     pages=s.pages)
    data = s.pages * s.page_rows * s.row_stride
    by = {}
    for blocks in sorted({1, min(8, L.aiv), L.aiv}):
        buf = L.run("probe_mte2_paged_bw", new_buffer(data, p), blocks, False)
        recs = _need(records(buf, blocks), blocks, "probe_mte2_paged_bw")
        per_core = [r["bytes"] / (r["ticks"] / TICKS_PER_US * 1e-6) / 1e9 if r["ticks"] > 0 else float("inf")
                    for r in recs]
        slowest = max(r["ticks"] for r in recs) / TICKS_PER_US * 1e-6
        total = sum(r["bytes"] for r in recs)
        by[str(blocks)] = {"per_core_gbps_min": min(per_core), "per_core_gbps_mean": float(np.mean(per_core)),
                           "aggregate_gbps": total / slowest / 1e9 if slowest > 0 else float("inf")}
    return {"value": by["1"]["per_core_gbps_min"], "unit": "GB/s",
            "detail": {"by_cores": by, "page": f"{s.page_rows} rows x {s.row_bytes} B, stride {s.row_stride} B",
                       "pages_per_core": s.bw_iters},
            "what": "MTE2 GB/s of one core streaming paged rows alone (8 and all cores in detail)"}


def probe_hbm_copy(L, s: Settings, results: dict) -> dict:
    gbps = L.device_copy_gbps(s.copy_bytes)
    return {"value": gbps / 1000.0, "unit": "TB/s", "detail": {"bytes": s.copy_bytes, "gbps_read_plus_write": gbps},
            "what": "a device copy (read + write bytes over time): the practical HBM floor"}


@dataclass(frozen=True)
class Probe:
    """A probe: its name (as the constants file's ``probe`` fields name it) and how to run it."""

    name: str
    run: Callable
    kernels: tuple = field(default_factory=tuple)


#: In order (the Fixpipe probe subtracts the flag probe's round trip).
PROBES = (
    Probe("cross_core_flag_roundtrip", probe_cross_core_flag, ("probe_cross_core_flag",)),
    Probe("gm_to_ub_latency", probe_gm_to_ub, ("probe_gm_to_ub_latency",)),
    Probe("gm_to_l1_latency", probe_gm_to_l1, ("probe_gm_to_l1_latency",)),
    Probe("fixpipe_gm_mte2_roundtrip", probe_fixpipe, ("probe_fixpipe_gm_mte2",)),
    Probe("syncall", probe_syncall_mix, ("probe_syncall_mix",)),
    Probe("syncall_vector", probe_syncall_vector, ("probe_syncall_vector",)),
    Probe("empty_launch", probe_empty, ("probe_empty",)),
    Probe("empty_mix_launch", probe_empty_mix, ("probe_empty_mix",)),
    Probe("mte2_paged_bw", probe_mte2_bw, ("probe_mte2_paged_bw",)),
    Probe("hbm_copy", probe_hbm_copy, ()),
)
PROBE_NAMES = tuple(p.name for p in PROBES)
#: every kernel entry of the probe library (stage 2 checks the library exports their launch functions)
PROBE_KERNELS = tuple(k for p in PROBES for k in p.kernels)


def get_probe(name: str) -> Probe:
    for p in PROBES:
        if p.name == name:
            return p
    raise ValueError(f"probe: unknown {name!r}; known: {', '.join(PROBE_NAMES)}")


def launcher(mode: str, profile: str, lib_path: Path | None = None):
    """``TwinLauncher`` (``mode`` twin) or ``NpuLauncher`` (``mode`` npu, the built probe library)."""
    if mode == "twin":
        return TwinLauncher(profile)
    if lib_path is None or not Path(lib_path).is_file():
        raise RuntimeError(f"the probe library {lib_path} is missing: build it (python -m ascend_ops.build --probes)")
    return NpuLauncher(Path(lib_path), profile)
