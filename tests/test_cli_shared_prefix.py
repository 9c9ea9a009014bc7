"""``splitkv parity --catalog shared-prefix|all``: the shared-prefix cases through each backend's
shared-prefix route, from the command line."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from splitkv_common import cli
from splitkv_common.parity.cases import SHARED_PREFIX_CATALOG
from splitkv_common.parity.registry import _REGISTERED, Backend, register
from splitkv_common.reference import split_attention

ROOT = Path(__file__).resolve().parents[1]


def run(*args):
    # the module of this source tree (its root first on the path), as a user of the tree runs it
    return subprocess.run([sys.executable, "-m", "splitkv_common.cli", *args], capture_output=True, text=True,
                          timeout=300, cwd=ROOT)


def test_parity_runs_the_shared_prefix_cases_on_numpy_and_torch():
    pytest.importorskip("torch")
    r = run("parity", "--catalog", "shared-prefix", "--backend", "numpy", "--backend", "torch", "--json")
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    names = {c.name for c in SHARED_PREFIX_CATALOG}
    got = [(x["backend"], x["case"], x["status"]) for x in rep["results"]]
    assert len(got) == 2 * len(names) and {c for _, c, _ in got} == names
    assert all(s == "pass" for _, _, s in got) and rep["ok"]
    assert rep["counts"] == {b: {"pass": len(names), "fail": 0, "error": 0, "unsupported": 0} for b in ("numpy", "torch")}


def test_all_runs_both_catalogs_and_the_filter_applies_to_both():
    r = run("parity", "--catalog", "all", "--backend", "numpy", "--cases", "seed/*,shared-prefix/one-group", "--json")
    assert r.returncode == 0, r.stderr
    cases = [x["case"] for x in json.loads(r.stdout)["results"]]
    assert "shared-prefix/one-group" in cases and any(c.startswith("seed/") for c in cases)
    assert not any(c.startswith("shared-prefix/") and c != "shared-prefix/one-group" for c in cases)


def test_the_default_catalog_is_the_decode_one_and_the_error_names_the_flag(capsys):
    assert cli.main(["parity", "--backend", "numpy", "--cases", "shared-prefix/*"]) == 2
    assert "--catalog shared-prefix or all selects the shared-prefix cases" in capsys.readouterr().err
    assert cli.main(["parity", "--catalog", "shared-prefix", "--list", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [c["name"] for c in listed] == [c.name for c in SHARED_PREFIX_CATALOG]


def test_a_backend_without_the_route_reports_the_cases_unsupported(capsys):
    register(Backend("plain-only", split_attention, description="no shared-prefix route"))
    try:
        code = cli.main(["parity", "--catalog", "shared-prefix", "--backend", "plain-only", "--cases", "one-group",
                         "--json"])
    finally:
        _REGISTERED.pop("plain-only")
    rep = json.loads(capsys.readouterr().out)
    assert code == 0 and [(x["status"], x["message"]) for x in rep["results"]] == [("unsupported", "no shared-prefix route")]


def test_a_bad_catalog_is_refused():
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["parity", "--catalog", "prefix"])
