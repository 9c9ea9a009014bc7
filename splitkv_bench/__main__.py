"""``python -m splitkv_bench <subcommand> [options]``: run one subcommand of the suite (see
:data:`splitkv_bench.COMMANDS`); with no subcommand or ``--help``, list them."""

from __future__ import annotations

import importlib
import sys

from splitkv_bench import COMMANDS


def usage() -> str:
    width = max(map(len, COMMANDS))
    rows = [f"  {name:<{width}}  {what} [{where}]" for name, (_, what, where) in COMMANDS.items()]
    return "usage: python -m splitkv_bench <subcommand> [options]\n\nsubcommands:\n" + "\n".join(rows) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Exit status: the subcommand's; 0 for the list; 2 for an unknown subcommand."""
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(usage(), end="")
        return 0
    if argv[0] not in COMMANDS:
        print(f"splitkv_bench: unknown subcommand {argv[0]!r}\n\n{usage()}", file=sys.stderr, end="")
        return 2
    module = importlib.import_module(f"splitkv_bench.{COMMANDS[argv[0]][0]}")
    sys.argv = [f"python -m splitkv_bench {argv[0]}", *argv[1:]]  # what a subcommand records as its command
    return module.main(argv[1:]) or 0


if __name__ == "__main__":
    sys.exit(main())
