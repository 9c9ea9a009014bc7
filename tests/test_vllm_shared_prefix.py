"""The plugin's shared-prefix routing: ``common_prefix_len`` from vLLM's metadata (or the builder's
``build`` argument), the ``shared_prefix`` setting (``SPLITKV_VLLM_SHARED_PREFIX``, off by default),
the eager Ascend step through the operator's shared-prefix route (its CPU kernel here) with no host
read of a device tensor, and the plain decode wherever the route does not apply."""

from __future__ import annotations

import logging

import pytest

torch = pytest.importorskip("torch")

from splitkv_vllm import adapter, settings, stats  # noqa: E402
from splitkv_vllm import shared_prefix as vsp  # noqa: E402
from test_vllm_eager import _ascend_backend, _check as check, _device_tensors, _run_step as run_step, count_device_reads  # noqa: E402
from test_vllm_plugin import _impl, fresh_plugin_state, vllm_config  # noqa: E402, F401
from test_vllm_shapes import make_step  # noqa: E402

BLOCK = 128


def shared_step(seq_lens, prefix_pages, seed, **kw):
    """A step whose requests' block-table rows start with request 0's first ``prefix_pages`` pages."""
    step = make_step([1] * len(seq_lens), seq_lens, seed=seed, **kw)
    B = len(seq_lens)
    bt = step.inputs.block_table
    bt[1:B, :prefix_pages] = bt[0, :prefix_pages]
    step.meta.block_tables[:B] = torch.from_numpy(bt[:B])
    return step


def layers(monkeypatch, **env):
    backend = _ascend_backend(monkeypatch, **env)
    return backend, [_impl(backend), _impl(backend)]


def the_wrapper():
    (w,) = adapter._EAGER_WRAPPERS.values()
    return w


# --- the setting ---------------------------------------------------------------------------------

def test_the_setting_is_off_by_default_and_parsed_once(monkeypatch, caplog):
    assert settings.current().shared_prefix == "off"
    for text, want in (("auto", "auto"), ("ON", "on"), ("off", "off")):
        monkeypatch.setenv("SPLITKV_VLLM_SHARED_PREFIX", text)
        assert settings.current().shared_prefix == want
    caplog.set_level(logging.WARNING, logger="vllm")
    monkeypatch.setenv("SPLITKV_VLLM_SHARED_PREFIX", "sometimes")
    assert settings.current().shared_prefix == "off"
    assert settings.current().shared_prefix == "off"
    lines = [r.getMessage() for r in caplog.records if "SPLITKV_VLLM_SHARED_PREFIX" in r.getMessage()]
    assert len(lines) == 1 and "expected one of ('auto', 'on', 'off')" in lines[0]
    monkeypatch.delenv("SPLITKV_VLLM_SHARED_PREFIX")
    settings.configure(vllm_config({"splitkv": {"shared_prefix": True}}))
    assert settings.current().shared_prefix == "on"


# --- what is shared --------------------------------------------------------------------------------

def test_the_prefix_is_rounded_down_to_pages_and_to_every_real_requests_history():
    step = make_step([1, 1, 1], [300, 260, 400], seed=1, pad_tokens=1)
    qsl, sl = adapter.host_lengths(step.meta)
    assert sl.tolist() == [300, 260, 400, 1]      # the runner's padding request last
    assert vsp.shared_prefix_of(step.meta, qsl, sl, BLOCK) is None   # no common_prefix_len
    step.meta._splitkv_common_prefix_len = 300
    sp = vsp.shared_prefix_of(step.meta, qsl, sl, BLOCK)
    (g,) = sp.groups
    assert (g.first, g.end, g.prefix_len) == (0, 3, 256)   # padding request out; 300 -> 2 pages
    step.meta._splitkv_common_prefix_len = 4096             # more than a request's history (259): 2 pages
    assert vsp.shared_prefix_of(step.meta, qsl, sl, BLOCK).groups[0].prefix_len == 256
    sl2 = sl.copy()
    sl2[1] = 200                                            # a history of 199 tokens: 1 page
    assert vsp.shared_prefix_of(step.meta, qsl, sl2, BLOCK).groups[0].prefix_len == 128
    step.meta._splitkv_common_prefix_len = 100              # under one page
    assert vsp.shared_prefix_of(step.meta, qsl, sl, BLOCK) is None


def test_the_builder_records_build_s_common_prefix_len(monkeypatch):
    backend, _ = layers(monkeypatch)
    builder = backend.SplitKVAscendMetadataBuilder(None, [], vllm_config(), "cpu")
    step = make_step([1, 1], [300, 260], seed=2)
    meta = builder.build(256, step.meta)
    assert vsp.common_prefix_len(meta) == 256
    meta = builder.build(0, make_step([1, 1], [300, 260], seed=3).meta)
    assert vsp.common_prefix_len(meta) == 0


# --- routed steps ----------------------------------------------------------------------------------

def test_an_eager_step_takes_the_shared_route_without_a_host_read(monkeypatch):
    _, impls = layers(monkeypatch, SPLITKV_VLLM_SHARED_PREFIX="on")
    step = shared_step([300, 260, 400, 290], 2, seed=4, pad_tokens=1)
    step.meta._splitkv_common_prefix_len = 256
    with count_device_reads(_device_tensors(step)) as seen:
        outs = run_step(impls, step)
    check(impls, step, outs)
    w = the_wrapper()
    assert w._route is not None and w.shared_prefix_plan.use_shared
    assert seen["reads"] == [] and seen["checks"] == 0
    assert [impl.parent_calls for impl in impls] == [0, 0] and stats.snapshot()["routed_steps"] == 1
    # the next step without a shared prefix: the plain plan again
    plain = make_step([1, 1], [70, 500], seed=5)
    outs = run_step(impls, plain)
    check(impls, plain, outs)
    assert w._route is None and w.shared_prefix_plan is None


def test_auto_lets_the_planner_decide_and_off_is_the_plain_decode(monkeypatch):
    step = shared_step([300, 260, 400], 2, seed=6)
    step.meta._splitkv_common_prefix_len = 256
    _, impls = layers(monkeypatch, SPLITKV_VLLM_SHARED_PREFIX="auto")
    check(impls, step, run_step(impls, step))
    w = the_wrapper()
    assert w.shared_prefix_plan is not None and w.shared_prefix_plan.mode == "auto"
    assert (w._route is not None) == w.shared_prefix_plan.use_shared
    _, impls = layers(monkeypatch, SPLITKV_VLLM_SHARED_PREFIX="off")
    check(impls, step, run_step(impls, step))
    assert the_wrapper().shared_prefix_plan is None and the_wrapper()._route is None


def test_window_layers_and_other_impls_keep_the_plain_decode(monkeypatch, caplog):
    caplog.set_level(logging.INFO, logger="vllm")
    layer = adapter.LayerSpec(8, 2, 64, 0.125, None, None, None)
    monkeypatch.setenv("SPLITKV_VLLM_SHARED_PREFIX", "on")
    assert vsp.shared_mode(layer, "ascend") == "on"
    assert vsp.shared_mode(layer, "torch") is None
    windowed = adapter.LayerSpec(8, 2, 64, 0.125, 64, None, None)
    assert vsp.shared_mode(windowed, "ascend") is None
    text = " ".join(r.getMessage() for r in caplog.records)
    assert "impl torch keeps the plain decode" in text and "sliding-window layers keep the plain decode" in text
