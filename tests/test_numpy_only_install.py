"""A laptop with NumPy alone: the package installed without extras into a fresh venv works.

The venv has pip, NumPy and this package (a regular, non-editable install, so nothing of the
source tree or of this test's environment is visible to it). `splitkv backends`, `explain`, `plan`
and `parity --backend numpy` must succeed, and every backend that needs torch must say why it
cannot run instead of crashing.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def numpy_only_venv(tmp_path_factory):
    venv = tmp_path_factory.mktemp("numpy-only") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    py = venv / "bin" / "python"
    src = tmp_path_factory.mktemp("src") / "splitkv"  # a copy: the build never writes into the checkout
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(".git", ".venv*", "reports", "build", "*.egg-info",
                                                          "__pycache__", ".pytest_cache", ".hypothesis", "_lib"))
    pip = [str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    for args in (["numpy"], [str(src)]):
        r = subprocess.run(pip + args, capture_output=True, text=True, timeout=900)
        if r.returncode != 0:
            pytest.fail(f"pip install {args} failed:\n{r.stderr[-3000:]}")
    r = subprocess.run([str(py), "-c", "import torch"], capture_output=True, text=True)
    assert r.returncode != 0, "the NumPy-only venv has torch: the test would prove nothing"
    return venv


def _run(venv, *args):
    env = {"PATH": f"{venv / 'bin'}:/usr/bin:/bin", "HOME": os.environ.get("HOME", "/tmp")}
    return subprocess.run([str(venv / "bin" / "splitkv"), *args], capture_output=True, text=True, env=env,
                          timeout=600, cwd=venv)


def test_backends_lists_every_backend_and_why(numpy_only_venv):
    r = _run(numpy_only_venv, "backends", "--json")
    assert r.returncode == 0, r.stderr
    rows = {b["name"]: b for b in json.loads(r.stdout)}
    assert rows["numpy"]["available"]
    assert {"torch", "triton", "ascend", "ascend-sim", "cann-fia"} <= set(rows)
    for name in ("torch", "triton", "ascend", "cann-fia"):
        assert not rows[name]["available"] and "torch" in rows[name]["reason"], rows[name]
    r = _run(numpy_only_venv, "backends")
    assert r.returncode == 0 and "numpy" in r.stdout and "unavailable: torch is not installed" in r.stdout


def test_explain_and_plan(numpy_only_venv):
    r = _run(numpy_only_venv, "explain")
    assert r.returncode == 0 and "4.9000" in r.stdout, r.stderr
    r = _run(numpy_only_venv, "plan", "--batch", "1", "--seq-lens", "16384", "--heads", "32/8", "--device", "h200")
    assert r.returncode == 0 and "reason" in r.stdout.lower(), r.stderr
    assert _run(numpy_only_venv, "--version").returncode == 0


def test_parity_numpy_and_all_backends(numpy_only_venv):
    r = _run(numpy_only_venv, "parity", "--backend", "numpy")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr
    assert "| numpy |" in r.stdout and "| 0 | 0 |" in r.stdout
    # every backend: those that cannot run are listed with their reason, the run still passes
    r = _run(numpy_only_venv, "parity", "--cases", "seed/*")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr
    assert "| torch | unavailable: torch is not installed" in r.stdout
    # the report's provenance: no torch, and an installed copy is not a git checkout
    r = _run(numpy_only_venv, "parity", "--backend", "numpy", "--cases", "seed/*", "--json")
    prov = json.loads(r.stdout)["provenance"]
    assert prov["torch"] is None and prov["triton"] is None and prov["numpy"]
    assert prov["git"] == {"commit": None, "dirty": None}


def test_the_suite_lists_its_subcommands_with_numpy_alone(numpy_only_venv, tmp_path):
    """The installed suite: ``python -m splitkv_bench`` imports no torch to list its subcommands."""
    r = subprocess.run([str(numpy_only_venv / "bin" / "python"), "-m", "splitkv_bench"], capture_output=True,
                       text=True, timeout=300, cwd=tmp_path)
    assert r.returncode == 0 and "  decode " in r.stdout and "  npu-estimate " in r.stdout, r.stdout + r.stderr


@pytest.mark.parametrize("command", ["decode", "ragged", "eager-ab", "kernels-ab", "config-grid", "read-floor",
                                     "gpu-check", "perf-check", "compile-check", "npu-graph-check"])
def test_suite_commands_that_need_torch_say_so_in_one_line(numpy_only_venv, command):
    r = subprocess.run([str(numpy_only_venv / "bin" / "python"), "-m", "splitkv_bench", command, "--help"],
                       capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert r.returncode == 2, r.stdout + r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "not installed" in lines[0], r.stderr


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler on this machine")
def test_installed_package_builds_the_c_planner(numpy_only_venv, tmp_path):
    """The C source ships with the package and builds on first use (into SPLITKV_CACHE_DIR)."""
    env = {"PATH": f"{numpy_only_venv / 'bin'}:/usr/bin:/bin", "HOME": os.environ.get("HOME", "/tmp"),
           "SPLITKV_CACHE_DIR": str(tmp_path)}
    code = ("from splitkv_common import native; from splitkv_common.plan import NativePlanner, PlanSpec; "
            "import numpy as np; print(native.status()); "
            "print(NativePlanner.for_spec(PlanSpec(32, 8, 128, 16)).make(np.array([100, 5000])).num_valid_items)")
    r = subprocess.run([str(numpy_only_venv / "bin" / "python"), "-c", code], capture_output=True, text=True, env=env,
                       timeout=300, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    status, items = r.stdout.strip().splitlines()
    assert status.startswith("loaded from " + str(tmp_path)), status
    assert int(items) > 0
