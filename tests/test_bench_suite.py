"""``python -m splitkv_bench``: every listed subcommand is a module of the suite with a ``main``; the
list and the refusal of an unknown subcommand (CPU, nothing timed)."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

from splitkv_bench import COMMANDS
from splitkv_bench.__main__ import main

SUITE = Path(__file__).resolve().parents[1] / "splitkv_bench"


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_each_subcommand_is_a_module_with_main(name):
    tree = ast.parse((SUITE / f"{COMMANDS[name][0]}.py").read_text())
    assert "main" in {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}


def test_no_arguments_lists_every_subcommand(capsys):
    assert main([]) == 0
    out = capsys.readouterr().out
    assert all(f"  {name} " in out for name in COMMANDS)


def test_an_unknown_subcommand_is_refused(capsys):
    assert main(["bench-decode"]) == 2
    err = capsys.readouterr().err
    assert "unknown subcommand 'bench-decode'" in err and "  decode " in err


def test_arguments_reach_the_subcommand(tmp_path, monkeypatch):
    """``plan`` (CPU) with a tiny budget writes its JSON where ``--out`` says."""
    monkeypatch.setattr(sys, "argv", ["pytest"])  # the dispatcher sets the command line a subcommand records
    out = tmp_path / "plan.json"
    assert main(["plan", "--batch", "1", "--policy", "auto", "--seconds", "0.01", "--repeat", "1", "--no-old",
                 "--graph-stable", "off", "--out", str(out)]) == 0
    assert out.is_file()
