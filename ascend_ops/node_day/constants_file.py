"""Stage 6's constants file: ``ascend_ops/npu_constants.json`` with the probes' values put in.

The file keeps the schema of ``npu_constants.json`` (``schema``, ``device``, ``note``,
``constants: {name: {value, unit, probe, source}}``). A constant whose ``probe`` names a probe that
ran gets that probe's value (converted to the constant's unit) and the source "measured on <chip>
<date> by probe <name>"; every other constant is copied as it is. A twin run writes the same file
for its plumbing, with every replaced value labelled NOT MEASURED (its times are the host's).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

BASE = Path(__file__).resolve().parents[1] / "npu_constants.json"

#: unit -> (family, factor to the family's base unit)
_UNITS = {"us": ("time", 1e-6), "ms": ("time", 1e-3), "s": ("time", 1.0), "ns": ("time", 1e-9),
          "GB/s": ("bandwidth", 1e9), "TB/s": ("bandwidth", 1e12), "MB/s": ("bandwidth", 1e6),
          "GHz": ("frequency", 1e9), "MHz": ("frequency", 1e6)}


def convert(value: float, unit: str, to: str) -> float | None:
    """``value`` in ``unit`` expressed in ``to``; None when the two are not of one family."""
    a, b = _UNITS.get(unit), _UNITS.get(to)
    if a is None or b is None or a[0] != b[0]:
        return None
    return value * a[1] / b[1]


def write_constants(results: dict, *, chip: str, date: str, measured: bool, out: Path,
                    base: Path = BASE) -> dict:
    """Write the constants file; return ``{"replaced": [...], "kept": [...], "unconverted": [...]}``.

    ``results``: probe name -> ``{"value", "unit"}`` (the probes that ran and passed)."""
    data = json.loads(Path(base).read_text())
    new = copy.deepcopy(data)
    replaced, kept, unconverted = [], [], []
    for name, c in new.get("constants", {}).items():
        probe = c.get("probe")
        r = results.get(probe) if probe else None
        if r is None:
            kept.append(name)
            continue
        v = convert(float(r["value"]), r["unit"], c.get("unit", ""))
        if v is None:
            unconverted.append(f"{name}: probe {probe} gives {r['unit']}, the constant is in {c.get('unit')}")
            continue
        c["value"] = v
        if measured:
            c["source"] = f"measured on {chip} {date} by probe {probe}"
        else:
            c["source"] = (f"NOT MEASURED: CPU twin plumbing run {date}, probe {probe}; the host's clock, "
                           "meaningless as a device time")
        replaced.append(name)
    new["device"] = chip if measured else f"twin ({chip})"
    new["note"] = ((f"Constants of the NPU cost model; {len(replaced)} measured on {chip} on {date} by the node "
                    "day's probes (scripts/npu_node_day.sh), the others copied from ascend_ops/npu_constants.json "
                    "with their sources.") if measured else
                   ("NOT MEASURED: written by a node day on the CPU twin to exercise the plumbing; the probe values "
                    "are the host's clock and mean nothing for an NPU. Use only the npu_constants.json values."))
    Path(out).write_text(json.dumps(new, indent=2) + "\n")
    return {"replaced": replaced, "kept": kept, "unconverted": unconverted}
