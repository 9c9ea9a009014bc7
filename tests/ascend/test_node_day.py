"""The node-day command (``scripts/npu_node_day.sh``) without an NPU: its ``--twin`` mode end to end,
the report's schema, failures recorded (a planted wrong output, a planted hang ended by the watchdog),
the refusal of an unsupported chip, the probe kernels under the twin's checks, the constants file.

Nothing here ran on an NPU: the twin is a test double and its times are meaningless; what is checked
is that every stage runs, records what it found and writes a valid report.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

sim = pytest.importorskip("ascend_ops.sim_backend")
from ascend_ops.node_day import constants_file, probes, smoke, watchdog  # noqa: E402
from ascend_ops.node_day.report import HONESTY, SCHEMA, validate_report  # noqa: E402

pytestmark = pytest.mark.skipif(sim.compiler_missing() is not None, reason=str(sim.compiler_missing()))

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "npu_node_day.sh"


def node_day(out: Path, *args: str, timeout: float = 900) -> tuple[subprocess.CompletedProcess, dict]:
    """Run the shell entry with this interpreter; return the process and the parsed report.json."""
    env = dict(os.environ, PYTHON=sys.executable)
    r = subprocess.run(["bash", str(SCRIPT), "--out", str(out), *args], capture_output=True, text=True, env=env,
                       timeout=timeout, cwd=ROOT)
    report = json.loads((out / "report.json").read_text()) if (out / "report.json").is_file() else None
    return r, report


def stages(report: dict) -> dict[str, dict]:
    return {s["name"]: s for s in report["stages"]}


def test_twin_mode_end_to_end_writes_a_valid_report(tmp_path):
    out = tmp_path / "day"
    r, rep = node_day(out, "--twin", "--repeats", "2")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert validate_report(rep, out) == [], validate_report(rep, out)
    assert rep["schema"] == SCHEMA and rep["mode"] == "twin" and rep["measured"] is False
    assert rep["verdict"] == "pass" and rep["exit_code"] == 0
    st = stages(rep)
    assert {n: s["status"] for n, s in st.items()} == {
        "identify": "pass", "build": "skipped", "smoke": "pass", "determinism": "pass", "parity": "pass",
        "probes": "pass", "timing": "skipped"}
    smoke_items = st["smoke"]["items"]
    assert [it["name"] for it in smoke_items] == list(smoke.CASE_NAMES)
    for it in smoke_items:
        assert it["status"] == "pass" and it["kernel"] == "mix", it
        for k in ("vs_reference", "vs_vector"):
            assert all(np.isfinite(it[k][e]) for e in ("out_abs", "out_rel", "lse_abs", "lse_rel")), it
    det = st["determinism"]["items"]
    assert all(it["status"] == "pass" and it["block_counts"] == [1, 2, 8, 24] and it["block_orders"] == [0, 1, 2026]
               for it in det)
    probe_items = {it["name"]: it for it in st["probes"]["items"]}
    for name in probes.PROBE_NAMES:
        assert probe_items[name]["status"] == "pass" and probe_items[name]["meaningful"] is False
    assert probe_items["estimate"]["status"] in ("pass", "skipped")
    # the constants file: npu_constants.json's schema, replaced values labelled NOT MEASURED
    base = json.loads(constants_file.BASE.read_text())
    const = json.loads((out / rep["artifacts"]["constants"]).read_text())
    assert set(const) == set(base) and set(const["constants"]) == set(base["constants"])
    for name, c in const["constants"].items():
        assert set(c) == set(base["constants"][name]) and c["unit"] == base["constants"][name]["unit"]
        if c["probe"] in probes.PROBE_NAMES:
            assert c["source"].startswith("NOT MEASURED: CPU twin"), c
        else:
            assert c == base["constants"][name]
    md = (out / "report.md").read_text()
    assert HONESTY["twin"] in md and "meaningless" in md and "| 3. smoke | pass |" in md
    assert (tmp_path / "day.tar.gz").is_file()


def test_a_failing_smoke_case_stops_stage_3_and_is_reported(tmp_path):
    out = tmp_path / "day"
    r, rep = node_day(out, "--twin", "--stages", "1,3,4", "--cases", "one-tile,short,masked", "--repeats", "1",
                      "--inject", "wrong-output", "--no-tarball")
    assert r.returncode == 1, r.stdout[-3000:] + r.stderr[-3000:]
    assert validate_report(rep, out) == []
    assert rep["verdict"] == "fail"
    st = stages(rep)
    items = {it["name"]: it for it in st["smoke"]["items"]}
    assert st["smoke"]["status"] == "fail" and "planted-wrong-output" in st["smoke"]["summary"]
    assert items["planted-wrong-output"]["status"] == "fail" and items["planted-wrong-output"]["message"]
    assert items["masked-page"]["status"] == "not-run"
    assert items["one-tile-g4"]["status"] == items["short-tile"]["status"] == "pass"
    # stage 4 runs the cases that passed stage 3; stage 5 was not selected
    assert [it["name"] for it in st["determinism"]["items"]] == ["one-tile-g4", "short-tile"]
    assert st["determinism"]["status"] == "pass"
    assert st["parity"]["status"] == "skipped" and st["parity"]["summary"]


def test_a_hang_becomes_a_recorded_timeout(tmp_path):
    out = tmp_path / "day"
    r, rep = node_day(out, "--twin", "--stages", "3", "--cases", "one-tile", "--inject", "hang", "--timeout", "20",
                      "--no-tarball")
    assert r.returncode == 1, r.stdout[-3000:] + r.stderr[-3000:]
    assert validate_report(rep, out) == []
    items = {it["name"]: it for it in stages(rep)["smoke"]["items"]}
    hang = items["planted-hang"]
    assert hang["status"] == "timeout" and "watchdog" in hang["message"], hang
    assert (out / hang["log"]).is_file()


def test_watchdog_ends_a_sleeping_child(tmp_path):
    res = watchdog.run_child({"kind": "sleep", "seconds": 120}, name="sleeper", out_dir=tmp_path, timeout=2)
    assert res["status"] == "timeout" and res["seconds"] < 60 and "killed" in res["message"]
    res = watchdog.run_child({"kind": "raise", "message": "planted"}, name="raiser", out_dir=tmp_path, timeout=60)
    assert res["status"] == "error" and "planted" in res["message"]
    res = watchdog.run_child({"kind": "sleep", "seconds": 0}, name="quick", out_dir=tmp_path, timeout=60)
    assert res["status"] == "ok" and res["result"]["item"] == {"slept": 0.0}


def test_an_unsupported_chip_is_refused(tmp_path):
    out = tmp_path / "day"
    r, rep = node_day(out, "--twin", "--chip", "Ascend310P3", "--no-tarball")
    assert r.returncode == 2
    assert validate_report(rep, out) == []
    st = stages(rep)
    assert rep["verdict"] == "refused" and st["identify"]["status"] == "refused"
    assert "Ascend310P3" in st["identify"]["summary"] and "not one the kernels are built for" in st["identify"]["summary"]
    assert all(s["status"] == "skipped" for n, s in st.items() if n != "identify")


@pytest.mark.parametrize("args,words", [(["--twin", "--repeats", "0"], "--repeats"),
                                        (["--chip", "910b3"], "--chip: only with --twin"),
                                        (["--twin", "--stages", "0-9"], "--stages"),
                                        (["--twin", "--cases", "no-such-case"], "--cases")])
def test_bad_arguments_are_named(tmp_path, args, words):
    r, rep = node_day(tmp_path / "day", *args)
    assert r.returncode == 2 and words in r.stderr and rep is None, r.stderr


def test_a_node_run_without_cann_stops_before_any_work(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "ASCEND_HOME_PATH"}
    r = subprocess.run(["bash", str(SCRIPT), "--out", str(tmp_path / "day")], capture_output=True, text=True,
                       env=dict(env, PYTHON=sys.executable), cwd=ROOT, timeout=120)
    assert r.returncode == 2 and "ASCEND_HOME_PATH" in r.stderr and "--twin" in r.stderr
    assert not (tmp_path / "day").exists()


@pytest.mark.parametrize("order", [0, 1, 2026])
def test_every_probe_kernel_passes_the_twins_checks(order):
    L = probes.TwinLauncher("910b2")
    L.order = order
    results = {}
    for p in probes.PROBES:
        results[p.name] = r = p.run(L, probes.Settings.twin(3), results)
        assert np.isfinite(r["value"]) and r["unit"] in ("us", "GB/s", "TB/s"), (p.name, r)
    assert results["fixpipe_gm_mte2_roundtrip"]["detail"]["flag_round_trip_us"] is not None
    assert set(results["mte2_paged_bw"]["detail"]["by_cores"]) == {"1", "8", "48"}


def test_a_probe_records_every_context():
    """The SyncAll<false> probe: every AIC and AIV of 3 AI cores writes its 64-byte record."""
    L = probes.TwinLauncher("910b2")
    buf = L.run("probe_syncall_mix", probes.new_buffer(0, probes.params_words(iters=2)), 3, True)
    recs = probes.records(buf, 9)
    assert [r["ctx"] for r in recs] == list(range(9)) and all(r["iters"] == 2 and r["ticks"] >= 0 for r in recs)


def test_constants_file_takes_the_probe_values_in_the_constants_units(tmp_path):
    out = tmp_path / "c.json"
    res = {"cross_core_flag_roundtrip": {"value": 0.2, "unit": "us"}, "hbm_copy": {"value": 1500.0, "unit": "GB/s"},
           "syncall": {"value": 3.0, "unit": "GB/s"}}
    summary = constants_file.write_constants(res, chip="Ascend910B2", date="2026-01-02", measured=True, out=out)
    c = json.loads(out.read_text())["constants"]
    assert c["cross_flag_us"]["value"] == pytest.approx(0.2)
    assert c["cross_flag_us"]["source"] == "measured on Ascend910B2 2026-01-02 by probe cross_core_flag_roundtrip"
    assert c["hbm_tbps"]["value"] == pytest.approx(1.5) and c["hbm_tbps"]["unit"] == "TB/s"
    assert "syncall_us" not in summary["replaced"] and any("syncall_us" in u for u in summary["unconverted"])
    assert json.loads(out.read_text())["device"] == "Ascend910B2"


def test_validator_finds_what_is_wrong(tmp_path):
    good = json.loads(Path(_twin_report(tmp_path)).read_text())
    assert validate_report(good) == []
    bad = json.loads(json.dumps(good))
    bad["stages"] = bad["stages"][:6]
    assert any("ids" in e for e in validate_report(bad))
    bad = json.loads(json.dumps(good))
    bad["measured"] = True
    assert any("measured" in e for e in validate_report(bad))
    bad = json.loads(json.dumps(good))
    bad["stages"][2]["items"] = [{"name": "x", "status": "fail"}]
    assert any("says what happened" in e for e in validate_report(bad))
    bad = json.loads(json.dumps(good))
    bad["stages"][5]["items"] = [{"name": "syncall", "kind": "probe", "status": "pass", "value": 1.0, "unit": "us",
                                   "meaningful": True}]
    assert any("meaningful: false" in e for e in validate_report(bad))


def _twin_report(tmp_path) -> Path:
    """A small valid report: stage 1 only."""
    out = tmp_path / "small"
    r, _ = node_day(out, "--twin", "--stages", "1", "--no-tarball")
    assert r.returncode == 0, r.stderr
    return out / "report.json"


def test_the_npu_code_path_runs_on_the_ops_cpu_kernel():
    """The runner stage 3 and 4 use on a node (the operator's raw entry with a tiling built here), on
    the op's CPU kernel: the buffers, dtypes and launch arguments, not the Ascend kernels."""
    pytest.importorskip("torch")
    runner = smoke.OpRunner("cpu", "910b2")
    for name in ("one-tile-g4", "int8-kv", "graph-replay"):
        it = smoke.run_smoke(name, runner)
        assert it["status"] == "pass" and it["kernel"] == "mix", it
    assert smoke.run_determinism("splits-combine", runner, 2)["status"] == "pass"


FAKE_ASCENDC_CMAKE = r"""
# Stand-in for CANN's ascendc.cmake: ascendc_library() records what it was given and links a stub
# with the launch functions the real one would generate (no kernel is compiled: no bisheng here).
function(ascendc_library name kind)
    foreach(src ${ARGN})
        if(NOT EXISTS "${src}")
            message(FATAL_ERROR "ascendc_library: no such kernel source ${src}")
        endif()
    endforeach()
    file(WRITE "@RECORD@" "${kind};${ARGN}")
    add_library(${name} ${kind} "@STUB@")
endfunction()
"""


def test_probe_library_build_plumbing_with_a_stand_in_cann(tmp_path, monkeypatch):
    """``python -m ascend_ops.build --probes``: the CMakeLists hands both probe sources to
    ascendc_library() as a SHARED library and the result lands in the package with every probe's
    launch function. Says nothing about a real toolkit."""
    import shutil

    from ascend_ops import build
    from ascend_ops.node_day.cli import exported_symbols

    if shutil.which("cmake") is None:
        pytest.skip("needs cmake")
    cann = tmp_path / "cann"
    cm = cann / "tools" / "tikcpp" / "ascendc_kernel_cmake"
    cm.mkdir(parents=True)
    stub, record = tmp_path / "stub.c", tmp_path / "record.txt"
    stub.write_text("".join(f"unsigned aclrtlaunch_{k}(unsigned b, void *s, void *buf) {{ return 0; }}\n"
                            for k in probes.PROBE_KERNELS))
    (cm / "ascendc.cmake").write_text(FAKE_ASCENDC_CMAKE.replace("@RECORD@", str(record)).replace("@STUB@", str(stub)))
    monkeypatch.setenv("ASCEND_HOME_PATH", str(cann))
    monkeypatch.setattr(build, "LIB_DIR", tmp_path / "_lib")
    logs = []
    lib = build.probe_build("Ascend910B3", tmp_path / "b", 2, log=logs.append)
    assert lib == tmp_path / "_lib" / probes.PROBE_LIB_FILE and lib.is_file()
    kind, *srcs = record.read_text().split(";")
    assert kind == "SHARED" and sorted(Path(s).name for s in srcs) == sorted(probes.SOURCES)
    assert any("-DSOC_VERSION=Ascend910B3" in x for x in logs)
    assert {f"aclrtlaunch_{k}" for k in probes.PROBE_KERNELS} <= exported_symbols(lib)
    with pytest.raises(build.BuildError, match="dav-2201"):
        build.probe_build("Ascend310P3", tmp_path / "c", 1, log=logs.append)


def test_the_timing_stage_grid_is_one_every_backend_takes():
    """Stage 7's default shapes (splitkv_bench/npu.py --set main,hkv4): Hkv 8 and 4, B1 to B64, 2k to 64k."""
    from ascend_ops.node_day.cli import parse_args

    nb = importlib.import_module("splitkv_bench.npu")
    shapes = nb.select_shapes(parse_args(["--twin"]).bench_args.split("--set")[1].split()[0])
    assert {s.hkv for s in shapes} == {8, 4} and {s.batch for s in shapes} == {1, 16, 64}
    assert {s.context for s in shapes} == {2048, 8192, 16384, 65536}
    for sh in shapes:
        for b in nb.BACKENDS:
            assert nb.unsupported(b, sh) is None, (sh.name, b)


def test_build_stage_logic_with_stand_in_builds(tmp_path, monkeypatch):
    """Stage 2's bookkeeping with the builds replaced by stub libraries: the default route's launch
    symbols are checked, a bisheng route refused by CANN 8.1 is recorded as skipped, the default
    library is the one left installed, the probe library's launch functions are checked; then a
    default route lacking a symbol fails the stage and blocks stages 3, 4, 5 and 7."""
    import shutil

    from ascend_ops import build
    from ascend_ops.node_day import cli
    from ascend_ops.node_day.report import Report

    cxx = shutil.which("g++") or shutil.which("clang++")
    if cxx is None or shutil.which("nm") is None:
        pytest.skip("needs a C++ compiler and nm")
    lib_dir = tmp_path / "_lib"
    lib_dir.mkdir()
    monkeypatch.setattr(build, "LIB_DIR", lib_dir)

    def stub(path: Path, names, tag: str):
        src = tmp_path / f"{path.name}.c"
        src.write_text(f"const char *stub_tag = \"{tag}\";\n"
                       + "".join(f"unsigned {n}(void) {{ return 0; }}\n" for n in names))
        subprocess.run([cxx, "-shared", "-fPIC", "-x", "c", str(src), "-o", str(path)], check=True)

    def fake_run(symbols):
        def run_cmd(cmd, log, timeout, env=None):
            log.parent.mkdir(parents=True, exist_ok=True)
            log.write_text("+ " + " ".join(cmd) + "\n")
            if "--probes" in cmd:
                stub(lib_dir / probes.PROBE_LIB_FILE, [f"aclrtlaunch_{k}" for k in probes.PROBE_KERNELS], "probes")
                return 0, "built"
            route = cmd[cmd.index("--route") + 1]
            if route == "bisheng":
                return 2, "error: route bisheng: CANN 8.1 has no one-call build of the mixed AIC + AIV kernel"
            stub(lib_dir / build.LIB_FILE, symbols, route)
            return 0, "built"
        return run_cmd

    monkeypatch.setattr(cli, "_run_cmd", fake_run(cli.LAUNCH_SYMBOLS))
    run = cli.Run(cli.parse_args([]), Report(tmp_path / "r1", "npu", "test"))
    st = run.report.stage(2)
    cli.stage_build(run, st)
    items = {it["name"]: it for it in st.items}
    assert st.status == "pass", st
    assert items["route cmake"]["status"] == "pass" and items["route bisheng"]["status"] == "skipped"
    assert items["probe library"]["status"] == "pass" and run.probe_lib == lib_dir / probes.PROBE_LIB_FILE
    assert b"cmake" in (lib_dir / build.LIB_FILE).read_bytes() and not run.blocked

    monkeypatch.setattr(cli, "_run_cmd", fake_run(cli.LAUNCH_SYMBOLS[:2]))
    run = cli.Run(cli.parse_args([]), Report(tmp_path / "r2", "npu", "test"))
    st = run.report.stage(2)
    cli.stage_build(run, st)
    assert st.status == "fail" and "aclrtlaunch_splitkv_attention_mix" in st.summary
    assert set(run.blocked) == {3, 4, 5, 7}


def test_parity_stage_judges_our_backend_and_lists_the_peers(tmp_path, monkeypatch):
    """Stage 5 on a node, the catalog run replaced by its JSON: a peer's failed case is listed, not
    ours; our failed case, or our backend unavailable, fails the stage (and the full size is not run)."""
    from ascend_ops.node_day import cli
    from ascend_ops.node_day.report import Report

    def fake(results, unavailable=None, rc=0):
        def run_cmd(cmd, log, timeout, env=None):
            log.parent.mkdir(parents=True, exist_ok=True)
            log.write_text("+ parity\n")
            counts = {}
            for r in results:
                counts.setdefault(r["backend"], {"pass": 0, "fail": 0, "error": 0, "unsupported": 0})[r["status"]] += 1
            js = Path(cmd[[i for i, a in enumerate(cmd) if a == "--report"][1] + 1])
            js.write_text(json.dumps({"counts": counts, "unavailable": unavailable or {}, "results": results}))
            Path(cmd[cmd.index("--report") + 1]).write_text("# parity\n")
            return rc, ""
        return run_cmd

    def stage(results, unavailable=None, rc=0, name="r"):
        monkeypatch.setattr(cli, "_run_cmd", fake(results, unavailable, rc))
        run = cli.Run(cli.parse_args([]), Report(tmp_path / name, "npu", "test"))
        st = run.report.stage(5)
        cli.stage_parity(run, st)
        return st

    ok = [{"backend": "ascend", "case": "a", "status": "pass"}, {"backend": "numpy", "case": "a", "status": "pass"}]
    peer_bad = ok + [{"backend": "cann-fia", "case": "a", "status": "fail", "message": "lse"}]
    st = stage(peer_bad, rc=1, name="peer")
    assert st.status == "pass" and [it["name"] for it in st.items] == ["catalog small", "catalog full"]
    assert "cann-fia a" in st.items[0]["message"]
    st = stage(ok + [{"backend": "ascend", "case": "b", "status": "error", "message": "boom"}], rc=1, name="ours")
    assert st.status == "fail" and len(st.items) == 1 and "b: error: boom" in st.items[0]["message"]
    st = stage(ok[1:], unavailable={"ascend": "the library is not built"}, name="absent")
    assert st.status == "fail" and "could not run" in st.summary


def test_probe_stage_on_a_node_without_the_probe_library_records_the_error(tmp_path, monkeypatch):
    """Stage 6 in node mode where the probe library is missing: the first probe's child reports the
    missing library, the stage stops there, and the constants file is still written (paper values)."""
    from ascend_ops.node_day import cli
    from ascend_ops.node_day.report import Report

    monkeypatch.setattr(cli, "_estimate", lambda run, f: {"name": "estimate", "status": "skipped", "message": "test"})
    args = cli.parse_args(["--timeout", "120"])
    run = cli.Run(args, Report(tmp_path / "r", "npu", "test"))
    run.probe_lib = tmp_path / "missing" / probes.PROBE_LIB_FILE
    st = run.report.stage(6)
    cli.stage_probes(run, st)
    first = st.items[0]
    assert st.status == "fail" and first["status"] == "error" and "probe library" in first["message"], first
    assert [it["status"] for it in st.items[1:len(probes.PROBES)]] == ["not-run"] * (len(probes.PROBES) - 1)
    const = json.loads((tmp_path / "r" / "constants.json").read_text())
    base = json.loads(constants_file.BASE.read_text())
    assert const["constants"] == base["constants"]
    assert validate_report(run.report.as_dict()) == []
