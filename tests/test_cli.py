"""The ``splitkv`` command end to end, in a subprocess, as a user runs it."""

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

# the console script installed next to this interpreter (not whatever is first on PATH), else the module
_SCRIPT = Path(sys.executable).with_name("splitkv")
SPLITKV = [str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-m", "splitkv_common.cli"]


def run(*args, cwd=None, env_extra=None):
    env = None if env_extra is None else {**os.environ, **env_extra}
    return subprocess.run(SPLITKV + list(args), capture_output=True, text=True, timeout=120, cwd=cwd, env=env)


# --- explain ----------------------------------------------------------------------------------


def test_explain_prints_the_seed_numbers():
    r = run("explain")
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "full softmax output: 4.9000" in out
    assert "naive average of local outputs: 3.976" in out
    # block A: m = ln2, l = 1.5, u = 2.5; block B: m = ln4, l = 1.75, u = 11
    assert re.search(r"\[0, 1\]\s+ln2\s+1\.5000\s+2\.5000\s+1\.6667", out)
    assert re.search(r"\[2, 3\]\s+ln4\s+1\.7500\s+11\.0000\s+6\.2857", out)
    assert "l = 2.5000, u = 12.2500, out = u / l = 4.9000" in out
    assert "common max m = ln4" in out


def test_explain_three_splits():
    r = run("explain", "--splits", "3")
    assert r.returncode == 0, r.stderr
    tail = r.stdout.split("--- 3 splits ---")[1]
    assert re.search(r"\[2\]\s+ln3\s+1\.0000\s+4\.0000", tail)
    assert "out = u / l = 4.9000" in tail
    assert "naive average of local outputs: 4.5556" in tail   # (5/3 + 4 + 8) / 3


@pytest.mark.parametrize("bad", ["0", "5", "x"])
def test_explain_invalid_splits_exit_2(bad):
    r = run("explain", "--splits", bad)
    assert r.returncode == 2
    assert "--splits" in r.stderr and "Traceback" not in r.stderr


# --- plan -------------------------------------------------------------------------------------


def _splits(out):
    return [int(x) for x in re.search(r"splits per request: \[([0-9, ]*)\]", out).group(1).split(",")]


def test_plan_long_single_request_on_h200_splits_and_says_why():
    r = run("plan", "--seq-lens", "16384", "--batch", "1", "--device", "h200")
    assert r.returncode == 0, r.stderr
    assert _splits(r.stdout)[0] > 1
    assert re.search(r"^reason: auto on h200: .+", r.stdout, re.M)
    assert "<- chosen" in r.stdout and "workspace:" in r.stdout


def test_plan_large_batch_does_not_split():
    r = run("plan", "--seq-lens", "16384", "--batch", "64", "--device", "h200")
    assert r.returncode == 0, r.stderr
    assert set(_splits(r.stdout)) == {1}
    assert "already occupy" in r.stdout


def test_plan_on_910b_and_json():
    r = run("plan", "--seq-lens", "16384,100", "--device", "910b2", "--heads", "32/8", "--json")
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)
    assert info["device"] == "910b2" and info["policy"] == "auto"
    assert info["num_splits"][0] > 1 and "auto on 910b2" in info["reason"]
    assert info["work_items"] == sum(info["num_splits"]) * 8
    assert info["workspace_bytes"] == info["partial_slots"] * 32 * (128 + 1) * 4


def test_plan_graph_stable_items():
    r = run("plan", "--seq-lens", "40,7", "--heads", "4/2", "--page-size", "8", "--policy", "size:16",
            "--graph-stable", "--max-splits", "4", "--items", "--q-lens", "2,1")
    assert r.returncode == 0, r.stderr
    assert "splits per request: [3, 1]" in r.stdout
    assert "(16 with padding)" in r.stdout          # 2 requests x 2 KV heads x 4 splits
    assert re.search(r"^\s+-1\s+0\s+0 \[0, 0\)$", r.stdout, re.M)
    assert re.search(r"^\s+0\s+1\s+2 \[32, 40\)$", r.stdout, re.M)


@pytest.mark.parametrize("args, message", [
    (["--seq-lens", "abc"], "comma-separated integers"),
    (["--seq-lens", "100", "--heads", "32x8"], "HQ/HKV"),
    (["--seq-lens", "100", "--heads", "6/4"], "num_q_heads"),
    (["--seq-lens", "100", "--policy", "size:10"], "split_size"),
    (["--seq-lens", "100", "--policy", "chunks"], "policy"),
    (["--seq-lens", "100", "--device", "tpu"], "device"),
    (["--seq-lens", "1,2,3", "--batch", "2"], "--seq-lens has 3 values"),
    (["--seq-lens", "-5"], "seq_lens"),
    (["--seq-lens", "100", "--q-lens", "1,2"], "q_lens"),
    (["--seq-lens", "100", "--max-splits", "0"], "max_splits"),
    ([], "--seq-lens"),
])
def test_plan_invalid_args_exit_2_with_a_message(args, message):
    r = run("plan", *args)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert message in r.stderr and "Traceback" not in r.stderr


# --- parity -----------------------------------------------------------------------------------


def test_parity_numpy_seed_writes_markdown_and_json(tmp_path):
    md, js = tmp_path / "X.md", tmp_path / "X.json"
    r = run("parity", "--backend", "numpy", "--cases", "seed", "--report", str(md), "--quiet")
    assert r.returncode == 0, r.stderr
    assert "| numpy | 3 | 0 | 0 | 0 |" in r.stdout and f"report written to {md}" in r.stdout
    assert md.read_text().startswith("# splitkv parity report")
    r = run("parity", "--backend", "numpy", "--cases", "seed", "--report", str(js), "--quiet")
    assert r.returncode == 0, r.stderr
    data = json.loads(js.read_text())
    assert data["ok"] is True and data["counts"]["numpy"]["pass"] == 3
    assert {x["case"] for x in data["results"]} == {"seed/worked-example", "seed/worked-example-bf16",
                                                    "seed/wrong-average-counterexample"}


def test_parity_unknown_backend_exits_2():
    r = run("parity", "--backend", "nonexistent", "--cases", "seed")
    assert r.returncode == 2
    assert "unknown backend" in r.stderr and "nonexistent" in r.stderr and "numpy" in r.stderr


def test_parity_no_matching_case_exits_2():
    r = run("parity", "--backend", "numpy", "--cases", "no-such-case")
    assert r.returncode == 2 and "no case matches" in r.stderr


def test_parity_list():
    r = run("parity", "--list", "--cases", "gqa/*")
    assert r.returncode == 0, r.stderr
    names = [line.split()[0] for line in r.stdout.splitlines() if line.strip()]
    assert names and all(n.startswith("gqa/") for n in names)


def test_backends_lists_numpy_and_torch():
    r = run("backends")
    assert r.returncode == 0, r.stderr
    assert re.search(r"^numpy\s+available", r.stdout, re.M)
    if importlib.util.find_spec("torch") is None:   # a .[test] install without torch
        assert re.search(r"^torch\s+unavailable: torch is not installed", r.stdout, re.M)
    else:
        assert re.search(r"^torch\s+available", r.stdout, re.M)


def test_native_builds_the_helpers_and_says_which_are_in_use():
    r = run("native", "--json")
    assert r.returncode == 0, r.stderr
    rows = {x["name"]: x for x in json.loads(r.stdout)}
    has_triton = importlib.util.find_spec("torch") is not None and importlib.util.find_spec("triton") is not None
    assert set(rows) == ({"planner", "call guard"} if has_triton else {"planner"})
    if has_triton:
        assert rows["call guard"]["backend"] == "triton"
    off = run("native", "--strict", env_extra={"SPLITKV_NATIVE": "0"})
    assert off.returncode == 1 and re.search(r"^planner\s+off \(SPLITKV_NATIVE=0\)", off.stdout, re.M), off.stdout


# --- help -------------------------------------------------------------------------------------


@pytest.mark.parametrize("cmd", [[], ["explain"], ["plan"], ["parity"], ["backends"]])
def test_help(cmd):
    r = run(*cmd, "--help")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("usage: splitkv" + (" " + cmd[0] if cmd else ""))


def test_no_command_exits_2():
    r = run()
    assert r.returncode == 2 and "usage" in r.stderr


# --- manners: version, pipes, progress, JSON everywhere -----------------------------------------


def test_version_is_the_package_version():
    import splitkv_common

    r = run("--version")
    assert r.returncode == 0 and r.stdout.strip() == f"splitkv {splitkv_common.__version__}"


@pytest.mark.parametrize("args", [("plan", "--batch", "64", "--seq-lens", "2048", "--device", "910b2", "--items"),
                                  ("explain", "--splits", "4")])
def test_output_piped_into_head_ends_quietly(args):
    cmd = " ".join(SPLITKV + list(args)) + " | head -3"
    r = subprocess.run(["bash", "-o", "pipefail", "-c", cmd], capture_output=True, text=True, timeout=120)
    assert len(r.stdout.splitlines()) == 3
    assert r.stderr == "" and r.returncode == 0, r.stderr


def test_no_progress_bar_when_stderr_is_not_a_terminal(tmp_path):
    # subprocess pipes are not terminals: no bar, whatever tqdm being installed
    r = run("parity", "--backend", "numpy", "--cases", "seed/*")
    assert r.returncode == 0 and "parity:" not in r.stderr and "run/s" not in r.stderr, r.stderr
    assert run("parity", "--backend", "numpy", "--cases", "seed/*", "--no-progress").returncode == 0


def test_json_on_every_subcommand_that_prints_results():
    ex = json.loads(run("explain", "--splits", "3", "--json").stdout)
    assert set(ex) == {"2", "3"} and abs(ex["2"]["merged_out"] - 4.9) < 1e-6
    assert abs(ex["2"]["naive_average"] - 3.976) < 1e-3 and len(ex["3"]["blocks"]) == 3
    pl = json.loads(run("plan", "--seq-lens", "100,0", "--page-size", "16", "--policy", "size:32",
                        "--items", "--json").stdout)
    assert pl["num_splits"][0] == 4 and len(pl["items"]) == pl["work_items_with_padding"]
    assert all(e - s <= 32 for _, _, _, s, e in pl["items"])
    be = {b["name"]: b for b in json.loads(run("backends", "--json").stdout)}
    assert be["numpy"]["available"] and be["numpy"]["reason"] is None
    assert all(b["available"] or b["reason"] for b in be.values())
    pa = json.loads(run("parity", "--backend", "numpy", "--cases", "seed/*", "--json").stdout)
    assert pa["ok"] and pa["counts"]["numpy"]["pass"] >= 1 and pa["provenance"]["numpy"]
    listed = json.loads(run("parity", "--cases", "seed/*", "--list", "--json").stdout)
    assert listed and all(c["name"].startswith("seed/") for c in listed)


def test_reports_say_where_they_came_from(tmp_path):
    md, js = tmp_path / "r.md", tmp_path / "r.json"
    # this checkout's CLI (an installed console script, not editable, is in no checkout: no commit)
    r = subprocess.run([sys.executable, "-m", "splitkv_common.cli", "parity", "--backend", "numpy", "--cases",
                        "seed/*", "--report", str(md), "--report", str(js)], capture_output=True, text=True,
                       timeout=120, cwd=Path(__file__).resolve().parent.parent)
    assert r.returncode == 0, r.stderr
    prov = json.loads(js.read_text())["provenance"]
    assert prov["command"].endswith(f"parity --backend numpy --cases 'seed/*' --report {md} --report {js}")
    assert prov["python"] == f"{sys.version_info.major}.{sys.version_info.minor}.{sys.version_info.micro}"
    assert re.fullmatch(r"[0-9a-f]{40}", prov["git"]["commit"]) and isinstance(prov["git"]["dirty"], bool)
    assert prov["date"].startswith("20") and prov["device"]
    text = md.read_text()
    assert f"- commit: {prov['git']['commit']}" in text and "- device: " in text and "- command: `" in text
