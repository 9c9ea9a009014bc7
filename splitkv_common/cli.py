"""The ``splitkv`` command: ``explain``, ``plan``, ``parity`` and ``backends``.

Every subcommand that prints results takes ``--json`` (one JSON document on stdout); output piped
into ``head`` ends quietly; progress bars show only on a terminal (``--no-progress`` turns them off
there too).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys

import numpy as np

from . import __version__
from .devices import PROFILES


def _print_json(obj) -> None:
    print(json.dumps(obj, indent=1, default=float))


def _cmd_explain(args) -> int:
    from .explain import SCORES, explain, render

    if not 1 <= args.splits <= len(SCORES):
        print(f"error: --splits must be between 1 and {len(SCORES)} (the example has {len(SCORES)} positions), "
              f"got {args.splits}", file=sys.stderr)
        return 2
    if args.json:
        _print_json({str(n): dataclasses.asdict(explain(n)) for n in sorted({2, args.splits})})
        return 0
    print(render(explain(2)))
    if args.splits != 2:
        print(f"\n--- {args.splits} splits ---")
        print(render(explain(args.splits)))
    return 0


def _int_list(text: str) -> list[int]:
    try:
        return [int(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def _heads(text: str) -> tuple[int, int]:
    a, _, b = text.partition("/")
    try:
        hq, hkv = int(a), int(b or a)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected HQ/HKV such as 32/8, got {text!r}") from None
    return hq, hkv


#: bytes per KV element ``--kv-bytes`` takes
KV_BYTES = (1, 2, 4)


def _cmd_plan(args) -> int:
    from .plan_checks import check_plan_limits
    from .planner import make_plan
    from .validation import MAX_BATCH

    seq = args.seq_lens
    batch = args.batch if args.batch is not None else len(seq)
    if not 0 <= batch <= MAX_BATCH:  # before any list of that size is built
        print(f"error: --batch: {batch} requests, must lie in [0, MAX_BATCH = {MAX_BATCH}]", file=sys.stderr)
        return 2
    if len(seq) == 1:
        seq = seq * batch
    if len(seq) != batch:
        print(f"error: --seq-lens has {len(seq)} values for --batch {batch} (give one, or one per request)",
              file=sys.stderr)
        return 2
    q_lens = args.q_lens * batch if args.q_lens and len(args.q_lens) == 1 else args.q_lens
    hq, hkv = args.heads
    if args.kv_bytes not in KV_BYTES:
        print(f"error: --kv-bytes: {args.kv_bytes} bytes per KV element; must be one of {KV_BYTES} (int8 / fp8, "
              f"fp16 / bf16, fp32)", file=sys.stderr)
        return 2
    try:
        check_plan_limits(seq, num_kv_heads=hkv, page_size=args.page_size, q_lens=q_lens, policy=args.policy,
                          window_left=args.window_left, max_splits=args.max_splits, graph_stable=args.graph_stable,
                          default_max_splits=PROFILES[args.device].max_splits if args.device in PROFILES else 64)
        plan = make_plan(np.array(seq), num_kv_heads=hkv, num_q_heads=hq, head_dim=args.head_dim,
                         page_size=args.page_size, q_lens=q_lens, policy=args.policy, device=args.device,
                         kv_elem_bytes=args.kv_bytes, window_left=args.window_left,
                         graph_stable=args.graph_stable, max_splits=args.max_splits)
    except (ValueError, TypeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    info = {
        "device": args.device, "policy": str(plan.policy), "split_tokens": plan.split_tokens,
        "num_splits": plan.num_splits.tolist(), "work_items": plan.num_valid_items,
        "work_items_with_padding": plan.num_items, "partial_slots": plan.num_slots,
        "workspace_bytes": plan.workspace_bytes(hq, args.head_dim), "reason": plan.reason,
        "estimates_us": {str(k): v for k, v in plan.estimates_us.items()},
    }
    if args.json:
        if args.items:
            n = plan.num_items
            info["items"] = np.stack([plan.item_request[:n], plan.item_kv_head[:n], plan.item_split[:n],
                                      plan.item_kv_start[:n], plan.item_kv_end[:n]], axis=1).tolist()
        _print_json(info)
        return 0
    print(plan.describe())
    print(f"workspace: {info['workspace_bytes']} bytes (float32 partial o and lse)")
    if plan.estimates_us:
        print("cost model (split length -> attention µs + merge µs, work items):")
        for k, v in plan.estimates_us.items():
            mark = "  <- chosen" if k == plan.split_tokens else ""
            print(f"  {k or 'none':>8}: {v['attention_us']:8.2f} + {v['merge_us']:6.2f}, {v['work_items']} items{mark}")
    if args.items:
        print("work items (request, kv head, split, [start, end)):")
        for w in range(plan.num_items):
            print(f"  {plan.item_request[w]:4d} {plan.item_kv_head[w]:3d} {plan.item_split[w]:3d} "
                  f"[{plan.item_kv_start[w]}, {plan.item_kv_end[w]})")
    return 0


def _cmd_backends(args) -> int:
    from .parity.registry import discover, unavailable_reason

    rows = [{"name": name, "available": why is None, "reason": why, "device": b.device,
             "description": b.description}
            for name, b in sorted(discover().items()) for why in [unavailable_reason(b)]]
    if args.json:
        _print_json(rows)
        return 0
    for r in rows:
        print(f"{r['name']:<12} {'available' if r['available'] else 'unavailable: ' + r['reason']}"
              + (f"  ({r['description']})" if r["description"] else ""))
    return 0


def _cmd_native(args) -> int:
    """Build (or load from the cache) the native helpers now, and say which are in use: the C
    planner, and each backend's own (a backend lists them as ``extra["native"]``: the ``triton``
    backend's C++ call guard); each is otherwise built on first use (about 1 s and 10 s once, per
    Python / NumPy / torch version)."""
    from . import native
    from .parity.registry import discover, unavailable_reason

    rows = [{"name": "planner", "backend": None, "source": "splitkv_common/native/plan_fast.c",
             "status": native.status()}]
    for name, b in sorted(discover().items()):
        helpers = b.extra.get("native")
        if helpers is not None and unavailable_reason(b) is None:
            rows += [dict(r, backend=name) for r in helpers()]
    if args.json:
        _print_json(rows)
    else:
        for r in rows:
            who = r["name"] + (f" ({r['backend']})" if r["backend"] else "")
            print(f"{who:<20} {r['status']}  ({r['source']})")
    return 1 if args.strict and not all(r["status"].startswith("loaded") for r in rows) else 0


#: what ``splitkv parity --catalog`` selects from: the decode cases, the shared-prefix ones, or both
CATALOGS = ("decode", "shared-prefix", "all")


def _cmd_parity(args) -> int:
    from .parity.cases import SHARED_PREFIX_CATALOG, catalog, select_cases
    from .parity.harness import ParityReport, check_report_path, run_parity
    from .parity.registry import discover
    from .parity.shared_prefix import run_shared_prefix_parity

    paths = args.report or ()
    if len(set(map(os.path.realpath, paths))) != len(paths):   # two spellings of one file, links resolved
        print("error: --report: the same file is given twice", file=sys.stderr)
        return 2
    for path in paths:  # before the run: a bad path fails in milliseconds, not after the catalog
        try:
            check_report_path(path, force=args.force)
        except OSError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        except ValueError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
    known = discover()
    names = args.backend or sorted(known)
    unknown = [n for n in names if n not in known]
    if unknown:
        print(f"error: unknown backend(s) {unknown}; known: {sorted(known)}", file=sys.stderr)
        return 2
    sizes = {"small": ("small",), "full": ("full",), "all": ("small", "full")}[args.size]
    cases = catalog(sizes, args.cases) if args.catalog in ("decode", "all") else []
    # the shared-prefix cases run through each backend's shared-prefix route (backend.extra)
    sp_cases = select_cases(SHARED_PREFIX_CATALOG, sizes, args.cases) if args.catalog != "decode" else []
    if not cases and not sp_cases:
        print(f"error: no case matches --cases {args.cases!r} (size {args.size}, catalog {args.catalog}; "
              f"--catalog shared-prefix or all selects the shared-prefix cases)", file=sys.stderr)
        return 2
    if args.list:
        if args.json:
            _print_json([{"name": c.name, "size": c.size, "policy": c.policy, "doc": c.doc} for c in cases + sp_cases])
            return 0
        for c in cases + sp_cases:
            print(f"{c.name:<40} {c.size:<6} {c.policy:<10} {c.doc}")
        return 0
    backends = [known[n] for n in names]
    report = run_parity(backends, cases, progress=_progress_wanted(args)) if cases else None
    if sp_cases:
        sp = run_shared_prefix_parity(backends, sp_cases)
        report = sp if report is None else ParityReport(report.results + sp.results,
                                                        {**report.unavailable, **sp.unavailable}, report.provenance)
    print(report.to_json() if args.json else report.to_markdown())
    for path in paths:
        try:
            report.write(path, force=args.force)
        except OSError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        print(f"report written to {path}", file=sys.stderr if args.json else sys.stdout)
    if not report.results:
        print("error: no backend could run (see 'unavailable' above)", file=sys.stderr)
        return 1
    return 0 if report.ok else 1


def _progress_wanted(args) -> bool:
    """Progress bars only on a terminal, and not with --no-progress."""
    return not args.no_progress and sys.stderr.isatty()


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="splitkv", description="Split-KV decode attention: reference, planner and parity harness.")
    p.add_argument("--version", action="version", version=f"splitkv {__version__}")
    sub = p.add_subparsers(dest="command", required=True)

    e = sub.add_parser("explain", help="the seed's worked example (4.9 vs 3.976) with the real merge code",
                       description="Reproduce the worked example: scores [0, ln2, ln3, ln4], V = [1, 2, 4, 8]. "
                                   "Prints each block's (m, l, u), the exact merge and the naive average.")
    e.add_argument("--splits", type=int, default=2, help="also show the merge for N blocks (1-4; default 2)")
    e.add_argument("--json", action="store_true", help="print JSON (keyed by the number of blocks)")
    e.set_defaults(func=_cmd_explain)

    pl = sub.add_parser("plan", help="plan a decode batch and say why",
                        description="Print the split plan for a batch: splits per request, work items, "
                                    "workspace and the reason for the choice (the cost model's estimates).")
    pl.add_argument("--batch", type=int, help="number of requests (default: the number of --seq-lens)")
    pl.add_argument("--seq-lens", type=_int_list, required=True, help="KV tokens per request, comma-separated (one value repeats)")
    pl.add_argument("--q-lens", type=_int_list, help="query rows per request (default 1)")
    pl.add_argument("--heads", type=_heads, default=(32, 8), help="HQ/HKV query and KV heads (default 32/8)")
    pl.add_argument("--head-dim", type=int, default=128)
    pl.add_argument("--page-size", type=int, default=16)
    pl.add_argument("--kv-bytes", type=int, default=2, help="bytes per KV element (2 for fp16/bf16, 1 for int8)")
    pl.add_argument("--device", default="h200", help=f"device profile: {', '.join(sorted(PROFILES))}")
    pl.add_argument("--policy", default="auto", help="auto, none, size:N (tokens) or count:N")
    pl.add_argument("--window-left", type=int, default=None, help="sliding window")
    pl.add_argument("--max-splits", type=int, default=None)
    pl.add_argument("--graph-stable", action="store_true", help="fixed shapes for graph replay")
    pl.add_argument("--items", action="store_true", help="list every work item")
    pl.add_argument("--json", action="store_true", help="print JSON")
    pl.set_defaults(func=_cmd_plan)

    pa = sub.add_parser("parity", help="run the case catalog on backends against the float64 reference",
                        description="Run the named, seeded case catalog on each backend, compare with the float64 "
                                    "reference by the accuracy rule (out and lse; NaN never passes), print a table, "
                                    "write a report, exit 1 on any failure. Unavailable backends are listed with why.")
    pa.add_argument("--backend", action="append", help="backend name (repeatable; default: every backend)")
    pa.add_argument("--cases", default=None, help="filter: glob or substring of case names, comma-separated")
    pa.add_argument("--size", choices=("small", "full", "all"), default="small",
                    help="small (CI), full (long contexts, production heads) or all")
    pa.add_argument("--catalog", choices=CATALOGS, default="decode",
                    help="decode (the decode cases, default), shared-prefix (the shared-prefix cases, on every "
                         "backend's shared-prefix route; a backend without one reports them unsupported) or all")
    pa.add_argument("--report", action="append",
                    help="write the report to FILE.md or FILE.json (repeatable); written atomically, never over "
                         "an existing file without --force; the path is checked before the run")
    pa.add_argument("--force", action="store_true", help="replace report files that exist (default: refuse)")
    pa.add_argument("--list", action="store_true", help="list the selected cases and exit")
    pa.add_argument("--no-progress", "--quiet", dest="no_progress", action="store_true",
                    help="no progress bar (the default when stderr is not a terminal)")
    pa.add_argument("--json", action="store_true", help="print the report as JSON instead of Markdown")
    pa.set_defaults(func=_cmd_parity)

    b = sub.add_parser("backends", help="list backends and whether they can run here")
    b.add_argument("--json", action="store_true", help="print JSON")
    b.set_defaults(func=_cmd_backends)

    n = sub.add_parser("native", help="build the native helpers now (C planner, C++ call guard) and say which "
                                      "are in use")
    n.add_argument("--json", action="store_true", help="print JSON")
    n.add_argument("--strict", action="store_true", help="exit 1 unless every helper loaded")
    n.set_defaults(func=_cmd_native)
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        code = args.func(args)
        sys.stdout.flush()
    except BrokenPipeError:
        # the reader (e.g. `head`) stopped reading: end quietly, and keep Python's exit-time flush
        # of stdout from raising again
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    return code


if __name__ == "__main__":
    sys.exit(main())
