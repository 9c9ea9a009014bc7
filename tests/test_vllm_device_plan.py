"""Device-planned full graphs in the vLLM plugin (``SPLITKV_VLLM_DEVICE_PLAN=1``), on the CPU.

A simulated vLLM decode loop over the stand-ins of ``test_vllm_plugin.py`` / ``test_vllm_graph.py``:
an eager warm-up at the graph size, a "capture" (the decoder's launches recorded while vLLM Ascend's
``capturing`` flag is set), then several steps whose lengths and request counts change, each one
``build()`` (the metadata builder's host step) and a "replay" of exactly the recorded launches on the
same buffers. Both routes: the Ascend operator (``deviceSplitTokens``; its CPU kernel stands in for
the NPU) and the Triton kernels (``DecodeWrapper(device_plan=True)``; the interpreter stands in for a
GPU). Each replay is compared with the host-planned graph path of the same split size (the plugin
without the setting) bit for bit, and with the float64 reference; a spy on the planner asserts that
no step after the capture makes a plan. What does not run here: an NPU, a GPU, a real graph.
"""

from __future__ import annotations

import logging
import types

import numpy as np
import pytest
torch = pytest.importorskip("torch")

import splitkv_common.plan_spec as plan_mod  # noqa: E402  (PlanSpec.make plans with its make_plan)
from ascend_ops import ops  # noqa: E402
from splitkv_common.inputs import DecodeInputs  # noqa: E402
from splitkv_common.reference import dense_attention  # noqa: E402
from splitkv_vllm import adapter, graph, settings  # noqa: E402
from splitkv_vllm.graph import GraphDecoder  # noqa: E402
from test_vllm_graph import BLOCK, DT, HKV, HQ, NUM_BLOCKS, D, N, make_env  # noqa: E402
from device_side import while_running  # noqa: E402
from test_vllm_graph import capture as graph_capture, forward_all, run_an_eager_step_of_three_tokens  # noqa: E402, F401
from test_vllm_plugin import _impl, fresh_plugin_state  # noqa: E402, F401
from test_vllm_shapes import AscendAttentionState, AscendMetadata  # noqa: E402

S = 256     # the split size fixed at capture
MAX_BLOCKS = 16


def device_env(monkeypatch, route, *, window_layer=False):
    """The stand-in vLLM of test_vllm_graph with device planning on, two layers (the second with a sliding
    window if ``window_layer``, else with another scale), the ``impl`` of ``route``."""
    e = make_env(monkeypatch)
    monkeypatch.setenv("SPLITKV_VLLM_DEVICE_PLAN", "1")
    monkeypatch.setenv("SPLITKV_VLLM_SPLIT_TOKENS", str(S))
    monkeypatch.setenv("SPLITKV_VLLM_POLICY", f"size:{S}")   # eager steps and the host-planned comparison
    # auto on CPU tensors: eager steps on the torch path, graphs on the Ascend operator's CPU kernel
    monkeypatch.setenv("SPLITKV_VLLM_IMPL", "auto" if route == "ascend" else route)
    if not window_layer:
        e.layers = [e.layers[0], _impl(e.backend, scale=0.09)]
        e.layers[1].key_cache, e.layers[1].value_cache = e.caches
    return e


def step(e, seq_lens, *, q_len=1, pad="uniform"):
    """A padded decode step of ``N`` tokens, ``q_len`` query rows per request (speculative decode when
    > 1), padded as vLLM Ascend pads it: ``uniform`` (requests of ``q_len`` rows with stale lengths)
    or ``fia`` (one dummy request with the rest of the rows, seq_len 1). Returns (metadata, reference
    inputs per layer)."""
    B = len(seq_lens)
    e.query.copy_(torch.from_numpy(e.g.standard_normal((N, HQ, D)).astype(np.float32)))
    bt = np.zeros((N, MAX_BLOCKS), np.int32)
    for b, s in enumerate(seq_lens):
        p = -(-s // BLOCK)
        bt[b, :p] = e.g.integers(1, NUM_BLOCKS, p)
    real = B * q_len
    if pad == "uniform":
        qsl = np.arange(0, N + 1, q_len)
        sl = list(seq_lens) + [77] * (len(qsl) - 1 - B)
        bt[B:] = 3
    else:
        qsl = np.concatenate([np.arange(0, real + 1, q_len), [N]]) if real < N else np.arange(0, N + 1, q_len)
        sl = list(seq_lens) + [1] * (len(qsl) - 1 - B)
    bt = bt[:len(qsl) - 1]
    sl_t = torch.tensor(sl, dtype=torch.int32)
    state = AscendAttentionState.DecodeOnly if q_len == 1 else AscendAttentionState.SpecDecoding
    meta = AscendMetadata(attn_state=state, num_actual_tokens=real, num_decode_tokens=real, num_prefills=0,
                          num_decodes=len(sl), seq_lens=sl_t, seq_lens_cpu=sl_t, seq_lens_list=sl,
                          actual_seq_lengths_q=[int(x) for x in qsl[1:]],
                          query_start_loc=torch.tensor(qsl, dtype=torch.int32), max_query_len=q_len,
                          block_tables=torch.from_numpy(bt.copy()), causal=True)
    refs = [DecodeInputs(e.query[:real].float().numpy(), *(c.float().numpy() for c in e.caches), bt[:B].copy(),
                         np.asarray(seq_lens, np.int32), np.arange(0, real + 1, q_len).astype(np.int32),
                         dtype="float16", scale=impl.scale,
                         window_left=None if impl.sliding_window is None else impl._splitkv_layer.window_left)
            for impl in e.layers]
    return meta, refs


def capture(e, monkeypatch, meta):
    """:func:`test_vllm_graph.capture`, and every layer captured once."""
    replay = graph_capture(e, monkeypatch, meta)
    assert [impl.splitkv_graph_captures for impl in e.layers] == [1, 1]
    return replay


def warm_up_and_capture(e, monkeypatch, *, q_len=1):
    forward_all(e, e.builder.build(0, step(e, [300, 5, 1000][:N // q_len], q_len=q_len)[0]))   # eager warm-up
    dec = graph.GRAPH_DECODERS[(e.builder, N)]
    replay = capture(e, monkeypatch, e.builder.build(0, step(e, [17, 2], q_len=q_len)[0]))
    return dec, replay


@pytest.fixture
def planner_spy(monkeypatch):
    """Counts every plan made on the host by the shared planner (wrappers' plan(), the graph decoder, the
    adapter). Not counted: the Ascend operator's CPU kernel, which stands in for the NPU and builds the
    work the NPU kernels derive from ``seqLens`` with the same planner (``ops._graph_mode_plan``)."""
    calls = []
    in_kernel = [False]

    def spy(real):
        def counted(*a, **k):
            if not in_kernel[0]:
                calls.append(1)
            return real(*a, **k)
        return counted

    monkeypatch.setattr(plan_mod, "make_plan", spy(plan_mod.make_plan))
    monkeypatch.setattr(adapter, "make_plan", spy(adapter.make_plan))
    monkeypatch.setattr(ops, "decode_attention_op", while_running(ops.decode_attention_op, in_kernel, True))
    return calls


def host_planned(dec, key_layers, e):
    """The same step through the plugin's host-planned graph path (split size S planned on the host, graph-stable)."""
    host = GraphDecoder(num_tokens=N, max_reqs=N + 1, max_splits=dec.max_splits, profile=dec.profile,
                        policy=f"size:{S}", route=dec.route)
    for key in key_layers:
        host.add(key, k_cache=e.caches[0], max_pages=MAX_BLOCKS)
    return host


def layer_keys(e):
    return [graph._graph_key(impl._splitkv_layer, e.query, e.caches[0]) for impl in e.layers]


STEPS = [([1000, 1, 257, 64, 1500], "uniform"), ([2, 3], "fia"), ([2048] * N, "uniform"),
         ([0, 900, 128], "uniform"), ([50, 1200, 7, 300, 129, 1, 2], "fia"), ([1], "uniform")]


@pytest.mark.parametrize("route", ["ascend", "triton"])
def test_device_planned_replays_equal_the_host_plan_and_never_plan(monkeypatch, planner_spy, route):
    e = device_env(monkeypatch, route)
    dec, replay = warm_up_and_capture(e, monkeypatch)
    assert dec.route == route and dec.split_tokens == S and dec.max_q_len == 1
    assert all(w._splitkv_const["device_plan"] for w in dec.wrappers.values())
    keys = layer_keys(e)
    host = host_planned(dec, keys, e)          # made (and planned) before the spy counts
    ptrs = {k: (dec.seq_lens.data_ptr(), dec.block_table.data_ptr()) for k in keys}
    most_splits = 0
    for lens, pad in STEPS:
        planner_spy.clear()                    # (the host-planned comparison below plans)
        meta, refs = step(e, lens, pad=pad)
        for out in e.outputs:
            out.fill_(-3.0)
        e.builder.build(0, meta)               # the host step: copies lengths and block table, no plan
        replay()
        assert planner_spy == [], f"{lens}: a plan was made in a device-planned step"
        assert {k: (dec.seq_lens.data_ptr(), dec.block_table.data_ptr()) for k in keys} == ptrs
        B = len(lens)
        qsl, sl = graph.graph_lengths(meta)
        host.refresh(sl, qsl, meta.block_tables[:sl.shape[0]])
        for impl, out, key, ref in zip(e.layers, e.outputs, keys, refs):
            got = out.view(N, HQ, D)
            want, _ = host.run(key, e.query, *e.caches)
            assert torch.equal(got[:B], want[:B]), f"{route} {lens}: device plan != host plan of size:{S}"
            ro, _ = dense_attention(ref)
            assert np.abs(got[:B].float().numpy() - ro).max() < 2e-3, lens
        most_splits = max([most_splits] + [int(p.num_splits.max()) for p in host.plans.values()])
    assert most_splits == 8, "the longest requests used 8 splits (the merge ran in the replay)"
    assert [impl.parent_calls for impl in e.layers] == [0, 0]


@pytest.mark.parametrize("route", ["ascend", "triton"])
def test_batch_invariance_with_a_fixed_split(monkeypatch, route):
    """A request's rows do not depend on the other requests of the step (the split size is fixed)."""
    e = device_env(monkeypatch, route)
    dec, replay = warm_up_and_capture(e, monkeypatch)
    meta, _ = step(e, [1500, 40])
    q0, row0 = e.query[:1].clone(), meta.block_tables[0].clone()
    e.builder.build(0, meta)
    replay()
    alone = [out[:1].clone() for out in e.outputs]
    meta, _ = step(e, [1500, 900, 3, 2048, 17, 640])
    e.query[:1].copy_(q0)
    meta.block_tables[0].copy_(row0)
    e.builder.build(0, meta)
    replay()
    assert all(torch.equal(out[:1], a) for out, a in zip(e.outputs, alone))


@pytest.mark.parametrize("route", ["ascend", "triton"])
def test_speculative_rows_fixed_at_capture(monkeypatch, planner_spy, route):
    """Two query rows per request (one speculative token): max_q_len is fixed by the warm-up; replays
    with other request counts keep it; a step with more rows (not uniform: vLLM does not replay it)
    loses its graph mark and runs eagerly."""
    e = device_env(monkeypatch, route)
    e.builder.vllm_config.speculative_config = types.SimpleNamespace(num_speculative_tokens=1)
    assert graph.speculative_rows(e.builder) == 2
    dec, replay = warm_up_and_capture(e, monkeypatch, q_len=2)
    assert dec.max_q_len == 2
    planner_spy.clear()
    for lens, pad in (([900, 3, 1500], "uniform"), ([600], "fia"), ([2048, 1, 200, 513], "uniform")):
        meta, refs = step(e, lens, q_len=2, pad=pad)
        e.builder.build(0, meta)
        replay()
        real = 2 * len(lens)
        for out, ref in zip(e.outputs, refs):
            ro, _ = dense_attention(ref)
            assert np.abs(out.view(N, HQ, D)[:real].float().numpy() - ro).max() < 2e-3, lens
    assert planner_spy == []
    meta, _ = step(e, [100, 200], q_len=4)
    assert e.builder.build(0, meta)._splitkv_graph_decoder is None


def test_window_layers_keep_the_host_plan_logged_once(monkeypatch, caplog):
    caplog.set_level(logging.INFO, logger="vllm")
    e = device_env(monkeypatch, "ascend", window_layer=True)
    dec, replay = warm_up_and_capture(e, monkeypatch)
    plain, windowed = layer_keys(e)
    assert dec.wrappers[plain]._splitkv_const["device_plan"]
    assert not dec.wrappers[windowed]._splitkv_const["device_plan"]
    msgs = [r.getMessage() for r in caplog.records if "keeps the host plan" in r.getMessage()]
    assert len(msgs) == 1 and "sliding window" in msgs[0]
    for lens in ([1000, 1, 257], [1700, 40]):
        meta, refs = step(e, lens)
        e.builder.build(0, meta)
        replay()
        for out, ref in zip(e.outputs, refs):
            ro, _ = dense_attention(ref)
            assert np.abs(out.view(N, HQ, D)[:len(lens)].float().numpy() - ro).max() < 2e-3
    assert list(dec.plans) and all(k[1] is not None for k in dec.plans), "only the window layer is planned"


def test_settings_and_refusals(monkeypatch):
    assert settings.current().device_plan is False and graph.graph_options()["split_tokens"] == 0
    monkeypatch.setenv("SPLITKV_VLLM_DEVICE_PLAN", "1")
    assert graph.graph_options()["split_tokens"] == settings.DEFAULTS.split_tokens
    monkeypatch.setenv("SPLITKV_VLLM_SPLIT_TOKENS", "-5")      # malformed: logged, the default
    assert settings.current().split_tokens == settings.DEFAULTS.split_tokens
    monkeypatch.setenv("SPLITKV_VLLM_SPLIT_TOKENS", "1024")
    assert graph.graph_options()["split_tokens"] == 1024
    dec = GraphDecoder(num_tokens=4, max_reqs=5, max_splits=8, split_tokens=192)
    key = GraphDecoder.key(num_q_heads=8, num_kv_heads=2, head_dim=64, page_size=128, dtype=DT, kv_dtype=DT,
                           scale=0.1, soft_cap=None, window_left=None)
    assert "multiple of the block size" in dec.device_unsupported(key)
    with pytest.raises(ValueError, match="route"):
        GraphDecoder(num_tokens=4, max_reqs=5, max_splits=8, route="torch")
    assert graph.graph_route(torch.device("cpu")) == "ascend"
    monkeypatch.setenv("SPLITKV_VLLM_IMPL", "triton")
    assert graph.graph_route(torch.device("cpu")) == "triton"


def test_layout_regroups_padding_rows():
    dec = GraphDecoder(num_tokens=8, max_reqs=9, max_splits=8, split_tokens=256)
    sl, qsl = dec.layout([500, 7, 0], [0, 2, 4, 8])          # FIA's dummy request: 4 padding rows
    assert dec.max_q_len == 2
    assert qsl.tolist() == [0, 2, 4, 6, 8, 8, 8, 8, 8, 8] and sl.tolist() == [500, 7, 0, 0, 0, 0, 0, 0, 0]
    sl2, qsl2 = dec.layout([500, 7, 3, 0], [0, 2, 4, 6, 8])   # uniform padding: the same offsets
    assert qsl2.tolist() == qsl.tolist()
    with pytest.raises(ValueError, match="max_q_len"):
        dec.layout([500, 7], [0, 3, 8])


def test_memory_estimate_covers_the_device_plan_slots(monkeypatch):
    """The reserve held during vLLM's profiling is sized with the device plan's slots per row (every split
    of the longest request the block table holds), more than the host plan's ``graph_max_splits``."""
    kw = dict(num_q_heads=HQ, num_kv_heads=HKV, head_dim=D, page_size=BLOCK, dtype=DT, kv_dtype=DT,
              max_model_len=8192, capture_sizes=[4, 8])
    host = graph.estimate_graph_bytes(**kw)
    monkeypatch.setenv("SPLITKV_VLLM_DEVICE_PLAN", "1")
    monkeypatch.setenv("SPLITKV_VLLM_SPLIT_TOKENS", "256")
    device = graph.estimate_graph_bytes(**kw)
    assert device > host, (device, host)   # 32 slots per row against 8


def test_eager_steps_on_the_triton_route(monkeypatch):
    """``impl=triton``: eager decode steps run the Triton kernels (interpreter here) on the step's host plan."""
    e = device_env(monkeypatch, "triton")
    run_an_eager_step_of_three_tokens(e, *step(e, [40, 500, 3]))
