"""The end-to-end script's checks without an NPU or vLLM: the runs are replaced by what they report.

What is tested: a run "on" whose workers routed nothing fails the script (exit 1) even with identical
tokens; so does a full-graph mode without captures, without replays counted at replay, or with fewer
replays than uniform-decode steps; a stock run that routed, no worker reporting, or tokens that
differ from FIA's beyond the logprob bound; a run with routed steps and equal tokens passes; the
graph mode, tensor parallelism, speculative decoding and the paged-attention baseline are handed to
vLLM explicitly. What is not: the script inside a real vLLM Ascend (no NPU here).
"""

import pytest
from script_module import load_script


@pytest.fixture
def e2e():
    return load_script("vllm_ascend_e2e")


def run_result(routed=0, captures=0, replays=0, uniform=None, workers=1, tokens=(1, 2, 3), logprobs=(-0.1, -0.2, -0.3)):
    uniform = replays if uniform is None else uniform
    per = [{"pid": 100 + i, "routed_steps": routed, "routed_layer_calls": routed * 24, "graph_captures": captures,
            "graph_refreshes": uniform, "uniform_graph_steps": uniform, "graph_replays": replays}
           for i in range(workers)]
    from splitkv_vllm import stats

    return {"samples": [{"tokens": list(tokens), "logprobs": list(logprobs)}], "decode_tokens_per_s": {"1": 100.0},
            "stats": {"source": "collective_rpc", "per_worker": per, "total": stats.total(per)}}


def run_main(e2e, monkeypatch, tmp_path, off, on, mode="eager", extra=()):
    runs = []
    monkeypatch.setattr(e2e, "run_mode", lambda args, run: runs.append(run) or (on if run == "on" else off))
    rc = e2e.main(["--graph-mode", mode, "--out", str(tmp_path / "r.json"), *extra])
    assert runs[-1] == "on" and runs[0] == "fia"
    return rc


def test_zero_routed_steps_fails(e2e, monkeypatch, tmp_path, capsys):
    assert run_main(e2e, monkeypatch, tmp_path, run_result(), run_result(routed=0)) == 1
    assert "0 routed steps" in capsys.readouterr().err


@pytest.mark.parametrize("mode", ["FULL_DECODE_ONLY", "FULL_AND_PIECEWISE"])
def test_graph_modes_need_captures_and_replays_counted_at_replay(e2e, monkeypatch, tmp_path, capsys, mode):
    off = run_result()
    assert run_main(e2e, monkeypatch, tmp_path, off, run_result(routed=5), mode) == 1
    assert run_main(e2e, monkeypatch, tmp_path, off, run_result(routed=5, captures=48), mode) == 1
    # the builder refreshed 700 uniform steps but only 650 replays of our graphs ran
    assert run_main(e2e, monkeypatch, tmp_path, off, run_result(routed=5, captures=48, replays=650, uniform=700),
                    mode) == 1
    assert "650 replays of our graphs for 700 uniform-decode steps" in capsys.readouterr().err
    unread = run_result(routed=5, captures=48, replays=700)
    unread["stats"]["total"]["graph_replays"] = None    # read from the device only by collective_rpc
    assert run_main(e2e, monkeypatch, tmp_path, off, unread, mode) == 1
    assert run_main(e2e, monkeypatch, tmp_path, off, run_result(routed=5, captures=48, replays=700), mode) == 0


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
    kw = e2e.llm_kwargs(args, "on", "/stats")
    assert kw["compilation_config"] == {"cudagraph_mode": "PIECEWISE"} and kw["enforce_eager"] is False
    assert kw["additional_config"]["splitkv"] == {"enable": True, "strict": True, "stats_dir": "/stats"}
    assert kw["tensor_parallel_size"] == 1 and "speculative_config" not in kw
    assert e2e.llm_kwargs(e2e.parse(["--graph-mode", "eager"]), "fia", "/s")["enforce_eager"] is True


def test_tp_speculative_decoding_and_the_paged_attention_baseline_reach_vllm(e2e, monkeypatch, tmp_path):
    spec = '{"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 4}'
    args = e2e.parse(["--graph-mode", "FULL_DECODE_ONLY", "--tp", "2", "--speculative-config", spec,
                      "--baselines", "fia,pa", "--max-num-seqs", "8"])
    kw = e2e.llm_kwargs(args, "pa", "/s")
    assert kw["tensor_parallel_size"] == 2 and kw["speculative_config"]["num_speculative_tokens"] == 2
    assert kw["additional_config"]["pa_shape_list"] == list(range(1, 8 * 3 + 1))
    assert kw["additional_config"]["splitkv"]["enable"] is False
    assert "pa_shape_list" not in e2e.llm_kwargs(args, "on", "/s")["additional_config"]
    with pytest.raises(SystemExit):   # paged attention serves FULL_DECODE_ONLY graphs only
        e2e.parse(["--graph-mode", "PIECEWISE", "--baselines", "fia,pa"])
    full = run_result(routed=5, captures=48, replays=70)
    assert run_main(e2e, monkeypatch, tmp_path, run_result(), full, "FULL_DECODE_ONLY",
                    ("--baselines", "fia,pa", "--batch-sizes", "1,16")) == 0
