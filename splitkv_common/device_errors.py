"""What device kernels count instead of refusing (docs/conventions.md): the values a kernel meets
that the host could not check without a sync (a block table or lengths that live on the device),
in one layout every backend shares.

A kernel's error record is ``ERROR_SLOTS`` int32 values (the Triton kernels keep one record, the
Ascend kernels one per launched block, summed here by :func:`merge_records`):

* ``[0]`` block-table reads outside ``[0, num_pages)`` (masked: their tokens count as absent);
  ``[1:4]`` the first one's request, logical page and page id;
* ``[4]`` the OR of :data:`REQUEST_ERRORS` bits, ``[5]`` the requests counted, ``[6:8]`` the first
  one's request and bits.

:func:`describe_errors` turns a record into the message ``check_errors()`` raises. NumPy only.
"""

from __future__ import annotations

import numpy as np

ERROR_SLOTS = 8

#: The bits of a request whose device values the kernels could not honour, and their rules.
REQUEST_ERRORS = {
    1: "seq_lens: a length past its block-table row (block_table columns x page_size); the tail beyond it "
       "was not read",
    2: "seq_lens: a negative length (read as 0)",
    4: "query_start_loc: not non-decreasing within [0, T] (q's rows); the request's rows were not computed",
    8: "query_start_loc: a request with more query rows than the launch packs (max_q_len); rows past it were "
       "not computed",
    16: "seq_lens: a length past what the graph's plan covers (max_splits x device_split_tokens); the tail "
        "beyond it was not read",
}

REQUEST_ERROR_NAMES = {1: "seq_lens past the block-table row", 2: "seq_lens negative",
                       4: "query_start_loc out of order or range", 8: "query rows over max_q_len",
                       16: "seq_lens past the plan's capacity"}


def merge_records(records) -> list[int]:
    """One record from several (``[n, >= ERROR_SLOTS]`` int32, e.g. one per launched block, in block
    order): counts summed, bits OR-ed, the first page and request taken from the first record (in
    order) that counted one."""
    r = np.asarray(records, np.int64).reshape(-1, np.asarray(records).shape[-1])[:, :ERROR_SLOTS]
    out = [0] * ERROR_SLOTS
    out[0], out[5] = int(r[:, 0].sum()), int(r[:, 5].sum())
    out[4] = int(np.bitwise_or.reduce(r[:, 4])) if len(r) else 0
    for count, fields in ((0, (1, 2, 3)), (5, (6, 7))):
        hit = np.flatnonzero(r[:, count])
        if hit.size:
            for f in fields:
                out[f] = int(r[hit[0], f])
    return out


def describe_errors(values, num_pages: int, counted: str = "kernel program(s)") -> "str | None":
    """The message for an error record (``ERROR_SLOTS`` values read on the host), or None when it
    holds none: each rule broken, with the first request (and page) seen. ``counted``: what the
    backend's page count counts (Triton: the programs that met one; Ascend: the tile copies)."""
    v = [int(x) for x in values] + [0] * (ERROR_SLOTS - len(values))
    parts = []
    if v[0]:
        parts.append(f"block_table: page ids outside [0, {num_pages}) (num_pages of k_cache) in {v[0]} {counted}; "
                     f"their tokens were read as absent. First seen: request {v[1]}, logical page {v[2]}, "
                     f"page id {v[3]}")
    if v[5]:
        rules = [why for bit, why in REQUEST_ERRORS.items() if v[4] & bit]
        first = ", ".join(REQUEST_ERROR_NAMES[bit] for bit in REQUEST_ERRORS if v[7] & bit)
        parts.append(f"{v[5]} request(s) with values the kernels cannot honour: " + "; ".join(rules)
                     + f". First seen: request {v[6]} ({first})")
    return " | ".join(parts) or None
