"""Device profiles the ``auto`` planner decides from.

Figures are parameters of a simple cost model (``docs/planner.md``), not promises. Bandwidths
marked *measured* come from ``docs/benchmarks.md``; the Ascend HBM figure is not published
authoritatively and is a placeholder to be measured on a node.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace


@dataclass(frozen=True)
class DeviceProfile:
    """What the planner knows of a device.

    Attributes:
        name: key used on the command line (``--device``).
        units: parallel workers a work item occupies (SMs, AI vector cores, CPU cores).
        items_per_unit: work items one unit keeps in flight at once (occupancy).
        bandwidth_gbps: sustainable HBM/DRAM read bandwidth, GB/s (1e9 bytes/s).
        unit_bandwidth_gbps: the most one work item can pull alone, GB/s.
        item_overhead_us: fixed cost per work item (launch of a block, setup, partial write), µs.
        launch_us: cost of one kernel launch (the merge adds one), µs.
        min_split_tokens: the shortest split ``auto`` will make.
        max_splits: the most splits ``auto`` gives one request.
        ub_bytes: on-chip buffer per unit for tiling checks (Ascend Unified Buffer), or 0.
        note: where the figures come from.
        lone_unit_bandwidth_gbps / lone_min_tokens / lone_head_dim / lone_kv_bytes: one item a
            unit. A plan of at most ``units`` work items, the longest at least ``lone_min_tokens``
            tokens, at head dim ``lone_head_dim`` and ``lone_kv_bytes`` bytes a KV element, that is
            not graph-stable, is streamed by the backend with a configuration of deeper tiles
            (``cuda_ref.launch.lone_item``, which reads these fields), whose one item pulls
            ``lone_unit_bandwidth_gbps`` alone; 0: no such configuration.
    """

    name: str
    units: int
    items_per_unit: int
    bandwidth_gbps: float
    unit_bandwidth_gbps: float
    item_overhead_us: float
    launch_us: float
    min_split_tokens: int
    max_splits: int
    ub_bytes: int = 0
    note: str = ""
    #: cube cores (AIC) of an Ascend SoC, 0 elsewhere: with ``units`` (its vector cores) the one
    #: source of the core counts of each 910B profile (the mixed kernel launches one AI core =
    #: 1 AIC + 2 AIV per cube core).
    cube_units: int = 0
    lone_unit_bandwidth_gbps: float = 0.0
    lone_min_tokens: int = 0
    lone_head_dim: int = 0
    lone_kv_bytes: int = 0
    #: sustained 16-bit matrix-product rate of an attention kernel's ``q.k`` / ``p.v`` tiles,
    #: TFLOP/s (the shared-prefix stage's compute term, ``splitkv_common.shared_prefix``); 0: not
    #: modelled. Assumed, not measured: about a third of the dense peak.
    dot_tflops: float = 0.0
    #: GB/s at which a launch re-reads bytes that its other work items read at about the same time
    #: (a shared prefix's pages, read by every request of its group in the plain step, or by every
    #: row block of the prefix stage): such re-reads are L2 hits, not HBM reads. 0: charged at
    #: ``bandwidth_gbps`` (not known for the device).
    l2_reread_gbps: float = 0.0


PROFILES: dict[str, DeviceProfile] = {
    "h200": DeviceProfile(
        name="h200", units=132, items_per_unit=2, bandwidth_gbps=4270.0, unit_bandwidth_gbps=20.0,
        item_overhead_us=6.0, launch_us=3.0, min_split_tokens=64, max_splits=64,
        lone_unit_bandwidth_gbps=32.0, lone_min_tokens=1024, lone_head_dim=128, lone_kv_bytes=2,
        dot_tflops=300.0, l2_reread_gbps=7000.0,
        note="NVIDIA H200 SXM: 132 SMs; copy ceiling 4.27 TB/s measured; per-item bandwidth and per-wave "
             "cost fitted to the Triton kernels' split sweeps; splits down to 64 tokens at short contexts "
             "(run 16: B1 x 1k 12.0 against 14.5 us with 256; docs/perf-notes.md); one item an SM of 16-bit "
             "D 128 with 128-token tiles and 8 warps: 32-35 GB/s an item (run 55: B16 x 1k-8k unsplit); "
             "a shared prefix's re-reads at 6.4-7.5 TB/s, L2 hits (H100 run 136: the plain step over a 4k "
             "prefix at B64 read 1,141 MB in 177 us, 84 MB of them unique; 17.4 GB in 2.3 ms at B256 x 16k)"),
    "910b2": DeviceProfile(
        name="910b2", units=48, items_per_unit=1, bandwidth_gbps=1500.0, unit_bandwidth_gbps=60.0,
        item_overhead_us=2.0, launch_us=5.0, min_split_tokens=512, max_splits=32, ub_bytes=192 * 1024,
        cube_units=24, dot_tflops=100.0, note="Ascend 910B1/B2: 24 cube / 48 vector cores, UB 192 KiB; HBM ~1.5 TB/s unmeasured placeholder"),
    "910b3": DeviceProfile(
        name="910b3", units=40, items_per_unit=1, bandwidth_gbps=1500.0, unit_bandwidth_gbps=60.0,
        item_overhead_us=2.0, launch_us=5.0, min_split_tokens=512, max_splits=32, ub_bytes=192 * 1024,
        cube_units=20, dot_tflops=80.0, note="Ascend 910B3/B4: 20 cube / 40 vector cores, UB 192 KiB; HBM ~1.5 TB/s unmeasured placeholder"),
    "cpu": DeviceProfile(
        name="cpu", units=max(1, os.cpu_count() or 1), items_per_unit=1, bandwidth_gbps=20.0,
        unit_bandwidth_gbps=10.0, item_overhead_us=20.0, launch_us=50.0, min_split_tokens=1024,
        max_splits=16, dot_tflops=0.1, note="generic CPU: one work item per core"),
}
# The other dav-c220 chips, by the core counts of CANN 8.1's platform files
# (data/platform_config/<SoC>.ini, lines 16-18: ai_core_cnt, cube_core_cnt, vector_core_cnt;
# UB 196608 bytes at line 48, 47 for B4-1 / 9362): 24 cube / 48 vector cores for Ascend910B1, B2,
# B2C and the A3 (910_93) chips 9381, 9382, 9391, 9392; 20 / 40 for Ascend910B3, B4, B4-1, 9362, 9372.
# Their planner constants are the 910B's placeholders (nothing measured on any of them).
for _name in ("910b1", "910b2c", "910_9381", "910_9382", "910_9391", "910_9392"):
    PROFILES[_name] = replace(PROFILES["910b2"], name=_name)
for _name in ("910b4", "910b4-1", "910_9362", "910_9372"):
    PROFILES[_name] = replace(PROFILES["910b3"], name=_name)
del _name


def get_profile(device: str | DeviceProfile) -> DeviceProfile:
    """Look a profile up by name (case-insensitive; ``ascend910b2`` and ``Ascend910B3`` work too)."""
    if isinstance(device, DeviceProfile):
        return device
    key = str(device).lower().replace("ascend", "").replace("nvidia-", "").replace("nvidia", "").strip("-_ ")
    if key not in PROFILES:
        raise ValueError(f"device: unknown profile {device!r}; known: {', '.join(sorted(PROFILES))}")
    return PROFILES[key]
