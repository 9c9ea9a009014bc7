"""``python -m splitkv_bench npu`` and scripts/npu_bench.sh without an NPU: argument parsing, the shape list,
the timing loop and the table / JSON writers with a fake event timer, and the fast, clear failure
where torch_npu or CANN is absent. Nothing here times anything real."""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHELL = ROOT / "scripts" / "npu_bench.sh"


@pytest.fixture(scope="module")
def nb():
    return importlib.import_module("splitkv_bench.npu")


class FakeClock:
    """Stands in for the NPU stream: each call of a fake backend advances it by that backend's cost."""

    def __init__(self):
        self.now_ms = 0.0
        self.syncs = 0


class FakeEvent:
    def __init__(self, clock):
        self.clock, self.t = clock, None

    def record(self):
        self.t = self.clock.now_ms

    def elapsed_time(self, end):
        assert self.t is not None and end.t is not None, "an event was read before it was recorded"
        return end.t - self.t


class FakeTimer:
    def __init__(self, clock):
        self.clock = clock

    def event(self):
        return FakeEvent(self.clock)

    def synchronize(self):
        self.clock.syncs += 1


def _fake_runners(clock, cost_us: dict, calls: dict):
    def factory(name):
        def make(shape, t, profile):
            def call():
                calls[name] = calls.get(name, 0) + 1
                clock.now_ms += cost_us[name] * shape.batch / 1e3  # cost grows with the batch
            return call
        return make
    return {b: factory(b) for b in cost_us}


def test_shape_sets(nb):
    sets = nb.shape_sets()
    main = sets["main"]
    assert len(main) == 8 and len({s.name for s in main}) == 8
    assert {(s.batch, s.context) for s in main} == {(1, 16384), (1, 65536), (16, 8192), (64, 2048)}
    assert {s.hq // s.hkv for s in main} == {4, 8}
    for s in main + sets["small"]:
        assert (s.dtype, s.head_dim, s.page, s.hkv) == ("bfloat16", 128, 128, 8)
    assert max(s.batch for s in sets["small"]) <= 8
    assert main[0].kv_bytes == 16384 * 8 * 128 * 2 * 2


def test_parse_args(nb):
    a = nb.parse_args([])
    assert a.backend_list == list(nb.BACKENDS) and len(a.shape_list) == 16
    a = nb.parse_args(["--set", "main", "--shapes", "B64,B16", "--backends", "ascend,atb-paged", "--iters", "3"])
    assert [s.batch for s in a.shape_list] == [16, 64, 16, 64] and a.backend_list == ["ascend", "atb-paged"]
    for bad in (["--backends", "flashinfer"], ["--set", "huge"], ["--iters", "0"], ["--shapes", "B999"]):
        with pytest.raises(SystemExit):
            nb.parse_args(bad)


def test_time_calls_uses_the_events_and_syncs_once_after_warmup(nb):
    clock = FakeClock()
    calls = {}
    fn = _fake_runners(clock, {"ascend": 7.0}, calls)["ascend"](nb.Shape("x", 2, 10, 4), {}, None)
    got = nb.time_calls(fn, FakeTimer(clock), warmup=3, iters=5)
    assert calls["ascend"] == 8 and clock.syncs == 2
    assert got["iters"] == 5 and got["median_us"] == pytest.approx(14.0) and got["min_us"] == pytest.approx(14.0)


def test_run_bench_table_and_json_with_a_fake_timer(nb, tmp_path):
    clock = FakeClock()
    calls = {}
    cost = {"ascend": 40.0, "cann-fia": 80.0, "atb-paged": 100.0}
    args = nb.parse_args(["--set", "main", "--shapes", "B1 16k,B64", "--iters", "4", "--warmup", "1",
                          "--out-json", str(tmp_path / "b.json"), "--out-md", str(tmp_path / "b.md")])

    def rule(backend, shape):  # ATB "refuses" GQA 8 here, to see the unsupported path
        return "fake: GQA 8" if backend == "atb-paged" and shape.hq == 64 else None

    rows = nb.run_bench(args.shape_list, args.backend_list, timer=FakeTimer(clock),
                        runners=_fake_runners(clock, cost, calls), make=lambda sh, dev, seed: {}, device="cpu",
                        warmup=args.warmup, iters=args.iters, rule=rule, log=lambda *_: None)
    assert len(rows) == 4 * 3
    ok = [r for r in rows if r["status"] == "ok"]
    assert len(ok) == 10 and all(r["median_us"] == pytest.approx(cost[r["backend"]] * r["batch"]) for r in ok)
    skipped = [r for r in rows if r["status"] == "unsupported"]
    assert len(skipped) == 2 and all(r["reason"] == "fake: GQA 8" for r in skipped)
    md = nb.write_outputs(rows, args, {"commit": "test"})
    assert md == (tmp_path / "b.md").read_text()
    lines = [x for x in md.splitlines() if x.startswith("| B64 2k, Hq32")]
    assert len(lines) == 1
    cells = [c.strip() for c in lines[0].strip("|").split("|")]
    assert cells[1:4] == ["2,560.0", "5,120.0", "6,400.0"] and cells[4:6] == ["0.50", "0.40"]
    floor = 64 * 2048 * 8 * 128 * 4 / 1.6e12 * 1e6
    assert cells[6] == f"{floor:,.1f}" and cells[7] == f"{2560.0 / floor:.2f}"
    assert "B64 2k, Hq64/Hkv8 / atb-paged: unsupported: fake: GQA 8" in md
    data = json.loads((tmp_path / "b.json").read_text())
    assert data["iters"] == 4 and data["provenance"] == {"commit": "test"} and len(data["rows"]) == 12
    assert "MEASURED" in data["kind"]


def test_a_failing_backend_is_an_error_row_not_a_crash(nb):
    clock = FakeClock()

    def boom(shape, t, profile):
        raise RuntimeError("kernel launch failed")

    runners = {"ascend": boom, **_fake_runners(clock, {"cann-fia": 1.0}, {})}
    rows = nb.run_bench([nb.Shape("s", 1, 128, 32)], ["ascend", "cann-fia"], timer=FakeTimer(clock), runners=runners,
                        make=lambda *a: {}, rule=lambda b, s: None, log=lambda *_: None, warmup=0, iters=2)
    assert rows[0]["status"] == "error" and "kernel launch failed" in rows[0]["reason"]
    assert rows[1]["status"] == "ok"
    assert "| s | error | 1.0 | - |" in nb.to_markdown(rows, ["ascend", "cann-fia"])


def test_the_real_backends_rules_take_the_bench_shapes(nb):
    """Every bench shape is one every backend accepts (else the comparison would have holes)."""
    for sh in nb.shape_sets()["main"] + nb.shape_sets()["small"]:
        for b in nb.BACKENDS:
            assert nb.unsupported(b, sh) is None, (sh.name, b)


def test_main_fails_fast_without_an_npu(nb, capsys):
    assert nb.main(["--iters", "1"]) == 2
    err = capsys.readouterr().err
    assert "splitkv_bench npu needs an Ascend NPU" in err and "torch_npu" in err
    assert nb.main(["--list", "--set", "small"]) == 0


def test_shell_script_fails_fast_and_clearly():
    env = {k: v for k, v in os.environ.items() if k != "ASCEND_HOME_PATH"}
    env["PYTHON"] = sys.executable
    r = subprocess.run(["bash", str(SHELL)], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 2 and "ASCEND_HOME_PATH" in r.stderr
    env["ASCEND_HOME_PATH"] = str(ROOT)
    r = subprocess.run(["bash", str(SHELL), "--skip-build"], capture_output=True, text=True, env=env, timeout=120)
    missing = "torch_npu" if importlib.util.find_spec("torch") else "cannot import torch"   # the first one missing
    assert r.returncode == 2 and missing in r.stderr
    r = subprocess.run(["bash", str(SHELL), "--bogus"], capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 2 and "--bogus" in r.stderr
