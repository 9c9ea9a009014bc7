"""The end-to-end script's checks without an NPU or vLLM: the runs are replaced by what they report.

What is tested: a run "on" whose workers routed nothing fails the script (exit 1) even with identical
tokens; so does a graph mode without captures, an "off" run that routed, no worker reporting, or
tokens that differ beyond the logprob bound; a run with routed steps and equal tokens passes; and the
graph mode is handed to vLLM explicitly. What is not: the script inside a real vLLM Ascend.
"""

import pytest
from script_module import load_script


@pytest.fixture
def e2e():
    return load_script("vllm_ascend_e2e")


def run_result(routed=0, captures=0, refreshes=0, workers=1, tokens=(1, 2, 3), logprobs=(-0.1, -0.2, -0.3)):
    per = [{"pid": 100 + i, "routed_steps": routed, "routed_layer_calls": routed * 24, "graph_captures": captures,
            "graph_refreshes": refreshes} for i in range(workers)]
    tot = {"routed_steps": routed * workers, "routed_layer_calls": routed * 24 * workers,
           "graph_captures": captures * workers, "graph_refreshes": refreshes * workers, "workers": workers}
    return {"samples": [{"tokens": list(tokens), "logprobs": list(logprobs)}], "decode_tokens_per_s": 100.0,
            "stats": {"source": "collective_rpc", "per_worker": per, "total": tot}}


def run_main(e2e, monkeypatch, tmp_path, off, on, mode="eager"):
    monkeypatch.setattr(e2e, "run_mode", lambda args, switched_on: on if switched_on else off)
    return e2e.main(["--graph-mode", mode, "--out", str(tmp_path / "r.json")])


def test_zero_routed_steps_fails(e2e, monkeypatch, tmp_path, capsys):
    assert run_main(e2e, monkeypatch, tmp_path, run_result(), run_result(routed=0)) == 1
    assert "0 routed steps" in capsys.readouterr().err


@pytest.mark.parametrize("mode", ["FULL_DECODE_ONLY", "FULL_AND_PIECEWISE"])
def test_graph_modes_need_captures_and_replays(e2e, monkeypatch, tmp_path, mode):
    off = run_result()
    assert run_main(e2e, monkeypatch, tmp_path, off, run_result(routed=5), mode) == 1
    assert run_main(e2e, monkeypatch, tmp_path, off, run_result(routed=5, captures=48), mode) == 1
    assert run_main(e2e, monkeypatch, tmp_path, off, run_result(routed=5, captures=48, refreshes=700), mode) == 0


def test_full_mode_must_leave_captures_alone(e2e, monkeypatch, tmp_path):
    assert run_main(e2e, monkeypatch, tmp_path, run_result(), run_result(captures=3), "FULL") == 1
    assert run_main(e2e, monkeypatch, tmp_path, run_result(), run_result(), "FULL") == 0


def test_no_worker_report_or_routing_while_off_fails(e2e, monkeypatch, tmp_path):
    assert run_main(e2e, monkeypatch, tmp_path, run_result(), run_result(routed=9, workers=0)) == 1
    assert run_main(e2e, monkeypatch, tmp_path, run_result(routed=2), run_result(routed=9)) == 1


def test_tokens_must_agree_within_the_bound(e2e, monkeypatch, tmp_path):
    off = run_result()
    assert run_main(e2e, monkeypatch, tmp_path, off, run_result(routed=9)) == 0
    near = run_result(routed=9, tokens=(1, 2, 4), logprobs=(-0.1, -0.2, -0.32))
    assert run_main(e2e, monkeypatch, tmp_path, off, near) == 0
    far = run_result(routed=9, tokens=(1, 7, 3), logprobs=(-0.1, -0.9, -0.3))
    assert run_main(e2e, monkeypatch, tmp_path, off, far) == 1


def test_graph_mode_and_plugin_switch_reach_vllm(e2e):
    args = e2e.parse(["--graph-mode", "PIECEWISE"])
    kw = e2e.llm_kwargs(args, True, "/stats")
    assert kw["compilation_config"] == {"cudagraph_mode": "PIECEWISE"} and kw["enforce_eager"] is False
    assert kw["additional_config"]["splitkv"] == {"enable": True, "strict": True, "stats_dir": "/stats"}
    assert e2e.llm_kwargs(e2e.parse(["--graph-mode", "eager"]), False, "/s")["enforce_eager"] is True
