"""``python -m splitkv_bench serving``: the smoke run on the CPU (host parts only) writes the report it
promises, and the trace keeps to its rules."""

import importlib
import json
import os
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("triton")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
QUANTITIES = ("make_plan_us", "upload_us", "plan_us", "copy_us", "replay_us", "step_us", "step_over_kernel",
              "eager_make_plan_us", "eager_upload_us", "eager_kernel_us", "eager_launch_us", "eager_again_us")


def load():
    return importlib.import_module("splitkv_bench.serving")


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("serving")
    r = subprocess.run([sys.executable, "-m", "splitkv_bench", "serving", "--quick", "--all", "--points", "B2x1k", "--out", str(out)], capture_output=True,
                       text=True, timeout=300, cwd=ROOT, env=dict(os.environ, CUDA_VISIBLE_DEVICES=""))
    assert r.returncode == 0, r.stderr[-3000:]
    return out, r


def test_quick_run_writes_json_markdown_and_plot(quick_run):
    out, r = quick_run
    assert {"bench_serving.json", "bench_serving.md", "bench_serving.png"} <= set(os.listdir(out))
    res = json.loads((out / "bench_serving.json").read_text())
    prov = res["provenance"]
    for k in ("date", "command", "git", "python", "numpy", "torch", "device"):
        assert k in prov
    assert res["on_gpu"] is False and "host parts only" in res["note"]
    tr = res["trace"]
    assert tr["config"]["mode"] == "trace" and tr["config"]["loads"] == [1, 4, 16]
    assert tr["overall"]["steps"] == len(tr["steps"]) > 0
    for q in QUANTITIES:
        assert set(tr["overall"][q]) == {"p50", "p99", "mean", "n"}
    # the host parts are measured on the CPU; the device parts are absent there
    for q in ("make_plan_us", "upload_us", "plan_us", "copy_us", "step_us", "eager_make_plan_us"):
        s = tr["overall"][q]
        assert s["n"] == tr["overall"]["steps"] and 0 < s["p50"] <= s["p99"]
    assert tr["overall"]["replay_us"]["n"] == 0 and tr["overall"]["eager_kernel_us"]["n"] == 0
    for step in tr["steps"]:
        assert step["plan_us"] == pytest.approx(step["make_plan_us"] + step["upload_us"])
        assert step["step_us"] >= step["plan_us"]
        assert 1 <= step["batch"] <= step["padded_batch"] == tr["config"]["max_batch"]
    assert sum(b["steps"] for b in tr["bins"]) == tr["overall"]["steps"]
    for b in tr["bins"]:
        assert b["batch_min"] <= b["batch_max"]
    fx = res["fixed"]
    assert [row["batch"] for row in fx["rows"]] == [1, 4]
    for row in fx["rows"]:
        assert row["plan_us"]["p50"] > 0 and row["step_us"]["p50"] >= row["plan_us"]["p50"]
        assert row["make_plan_us"]["p50"] > 0 and row["upload_us"]["p50"] > 0
        assert row["replay_us"]["p50"] is None and row["dev_replay_us"]["p50"] is None
        # the device-planned step copies lengths and offsets and plans nothing
        assert 0 < row["dev_copy_us"]["p50"] <= row["dev_step_us"]["p50"]
        assert row["eager_python_us"] > 0 and row["eager_run_us"]["n"] == 0
    pt = res["points"]["rows"]
    assert [(r["batch"], r["seq_len"]) for r in pt] == [(2, 1024)]
    assert pt[0]["host"]["step_us"]["p50"] > 0 and pt[0]["device"]["step_us"]["p50"] > 0
    assert pt[0]["host_size"]["policy"] == pt[0]["device"]["policy"] == "size:512"
    md = (out / "bench_serving.md").read_text()
    assert "| B | make_plan µs | upload µs | plan() µs | copy µs | replayed kernel µs | step µs |" in md
    assert "run() Python side µs (launches stubbed)" in md and "| B2x1024 |" in md
    assert "host parts only" in md


def test_trace_rules():
    m = load()
    decode = m.parse_dist("uniform:5:20")
    prompt = m.parse_dist("loguniform:512:8192")
    steps = m.make_trace(loads=[3], steps_per_phase=60, arrival="fixed", prompt=prompt, decode=decode,
                         max_batch=8, spec=2, accept=0.5, seed=1, max_len=10000)
    assert len(steps) == 60
    assert all(seq.shape[0] == 3 for seq, _ in steps[1:])        # fixed concurrency: exactly the load
    assert all((ql == 3).all() for _, ql in steps)                # spec K 2: 3 query rows a request
    assert all((seq >= 512 + 3).all() and (seq <= 8192 + 20 * 3 + 3).all() for seq, _ in steps)
    steps = m.make_trace(loads=[1, 30], steps_per_phase=200, arrival="poisson", prompt=prompt, decode=decode,
                         max_batch=16, spec=0, accept=0.0, seed=2, max_len=10000)
    sizes = np.array([seq.shape[0] for seq, _ in steps])
    assert sizes.max() == 16                                      # capped; the rest wait
    assert sizes[:200].mean() < sizes[200:].mean()
    # the same seed, the same trace
    again = m.make_trace(loads=[1, 30], steps_per_phase=200, arrival="poisson", prompt=prompt, decode=decode,
                         max_batch=16, spec=0, accept=0.0, seed=2, max_len=10000)
    assert all(np.array_equal(a[0], b[0]) for a, b in zip(steps, again))


def test_distributions_and_bins():
    m = load()
    rng = np.random.default_rng(0)
    x = m.parse_dist("loguniform:512:8192")(rng, 5000)
    assert x.min() >= 512 and x.max() <= 8192 and np.median(x) < 4096   # log-uniform: median ~2048
    assert (m.parse_dist("fixed:7")(rng, 3) == 7).all()
    with pytest.raises(SystemExit):
        m.parse_dist("normal:1:2")
    assert [m.bin_of(b) for b in (1, 2, 3, 4, 5, 8, 9, 256)] == ["1", "2", "3-4", "3-4", "5-8", "5-8", "9-16",
                                                                  "129-256"]
    assert m.sizes_for("vllm", 20) == [1, 2, 4, 8, 16, 20]
    assert m.sizes_for("max", 20) == [20]
