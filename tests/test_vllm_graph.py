"""Full-graph mode of the vLLM plugin on the CPU: warm-up, capture, and replays with new lengths.

vLLM Ascend is replaced by the stand-ins of ``test_vllm_plugin.py``; the operator runs its CPU
kernel (its executable specification, reading the same plan/tiling buffers the NPU kernels read).
The graph is emulated: "capture" records the operator launches the backend makes while
``_EXTRA_CTX.capturing`` is set, "replay" launches exactly those calls again (same tensors, same
buffers), after the metadata builder has refreshed the buffers for the step, as vLLM Ascend's
runner does (``build()`` before the model runs, then ``ACLGraphWrapper`` replays). What does not
run here: a real ``torch.npu.NPUGraph`` capture, the NPU kernels, a real vLLM Ascend.
"""

from __future__ import annotations

import contextlib
import logging
import importlib
import sys
import types

import numpy as np
import pytest
torch = pytest.importorskip("torch")

from ascend_ops import ops  # noqa: E402
from ascend_ops.wrapper import AscendDecodeWrapper  # noqa: E402
from splitkv_common.inputs import DecodeInputs  # noqa: E402
from splitkv_common.reference import dense_attention  # noqa: E402
from splitkv_vllm import graph, stats  # noqa: E402
from splitkv_vllm.graph import GraphDecoder  # noqa: E402
from device_side import while_running  # noqa: E402
from test_vllm_plugin import CUDAGraphMode, _fake_vllm_ascend, _impl, fresh_plugin_state, vllm_config  # noqa: E402, F401
from test_vllm_shapes import AscendAttentionState, AscendMetadata  # noqa: E402

N = 8                    # the captured graph's token count (uniform decode, one query per request)
HQ, HKV, D, BLOCK = 8, 2, 64, 128
NUM_BLOCKS = 48
WINDOW = 100             # the second layer's vLLM sliding_window
DT = torch.float16


SIZES = [4, N, 16]


def padded_descriptor(mode: str, num_tokens: int, uniform_decode: bool):
    """vLLM's BatchDescriptor as vLLM Ascend's patch of ``CudagraphDispatcher._create_padded_batch_descriptor``
    makes it: the uniform flag survives only in modes with FULL graphs other than plain FULL."""
    m = CUDAGraphMode[mode]
    uniform = bool(uniform_decode and m.has_full_cudagraphs() and m is not CUDAGraphMode.FULL)
    return types.SimpleNamespace(num_tokens=num_tokens, uniform=uniform)


def make_env(monkeypatch, mode="FULL_DECODE_ONLY"):
    monkeypatch.setenv("SPLITKV_VLLM_GRAPH_MAX_SPLITS", "8")
    monkeypatch.setenv("SPLITKV_VLLM_POLICY", "size:256")  # long requests split (auto: too few for it here)
    monkeypatch.setenv("SPLITKV_VLLM_WINDOW", "1")  # the second layer has a window
    monkeypatch.setenv("SPLITKV_VLLM_RESERVE_GRAPH_MEMORY", "0")
    monkeypatch.setattr(graph, "GRAPH_DECODERS", {})
    monkeypatch.setattr(graph, "GRAPH_WORKSPACES", {})
    monkeypatch.setattr(graph, "WARM_UP_FALLBACKS", {})
    cfg = vllm_config(mode=mode, sizes=SIZES)
    _, v1 = _fake_vllm_ascend(monkeypatch, cfg)
    desc = types.SimpleNamespace(batch_descriptor=padded_descriptor(mode, N, uniform_decode=True))
    fwd = types.ModuleType("vllm.forward_context")
    fwd.get_forward_context = lambda: desc
    vllm = types.ModuleType("vllm")
    vllm.__path__ = []
    monkeypatch.setitem(sys.modules, "vllm", vllm)
    monkeypatch.setitem(sys.modules, "vllm.forward_context", fwd)
    backend = importlib.import_module("splitkv_vllm.backend")
    g = np.random.default_rng(0)
    caches = [torch.from_numpy(g.standard_normal((NUM_BLOCKS, BLOCK, HKV, D)).astype(np.float32)).to(DT)
              for _ in range(2)]
    builder = backend.SplitKVAscendAttentionBackend.get_builder_cls()(None, ["l0", "l1"], cfg, "cpu")
    layers = [_impl(backend), _impl(backend, sliding_window=WINDOW)]
    for impl in layers:
        impl.key_cache, impl.value_cache = caches
    ctx = sys.modules["vllm_ascend.ascend_forward_context"]._EXTRA_CTX
    return types.SimpleNamespace(backend=backend, builder=builder, layers=layers, caches=caches, ctx=ctx, desc=desc,
                                 query=torch.zeros(N, HQ, D, dtype=DT),                 # the runner's persistent buffers
                                 outputs=[torch.zeros(N, HQ * D, dtype=DT) for _ in layers], g=g, v1=v1)


@pytest.fixture
def env(monkeypatch):
    return make_env(monkeypatch)


def graph_step(e, seq_lens, *, pad="uniform", stale_pad_len=77):
    """Write a step into the persistent query buffer and return its metadata, padded to ``N`` tokens
    as vLLM Ascend pads a full-graph step: ``uniform`` (the batch descriptor's request count, one
    query each; the runner's stale lengths in the padding rows) or ``fia`` (one dummy request holding
    the remaining tokens, seq_len 1, block row 0)."""
    B = len(seq_lens)
    q = e.g.standard_normal((N, HQ, D)).astype(np.float32)
    e.query.copy_(torch.from_numpy(q))
    max_blocks = 16
    bt = np.zeros((N, max_blocks), np.int32)
    for b, s in enumerate(seq_lens):  # random pages (shared between requests: the cache is small)
        p = -(-s // BLOCK)
        bt[b, :p] = e.g.integers(1, NUM_BLOCKS, p)
    if pad == "uniform":
        qsl = np.arange(N + 1)
        sl = list(seq_lens) + [stale_pad_len] * (N - B)
        bt[B:] = 3  # stale rows: must not be read
    else:
        qsl = np.concatenate([np.arange(B + 1), [N]]) if B < N else np.arange(N + 1)
        sl = list(seq_lens) + [1] * (len(qsl) - 1 - B)
        bt = bt[:len(qsl) - 1]
    sl_t = torch.tensor(sl, dtype=torch.int32)
    meta = AscendMetadata(attn_state=AscendAttentionState.DecodeOnly, num_actual_tokens=B, num_decode_tokens=B,
                          num_prefills=0, num_decodes=len(sl), seq_lens=sl_t, seq_lens_cpu=sl_t, seq_lens_list=sl,
                          actual_seq_lengths_q=[int(x) for x in qsl[1:]],
                          query_start_loc=torch.tensor(qsl, dtype=torch.int32), max_query_len=1,
                          block_tables=torch.from_numpy(bt.copy()), causal=True)
    ref_inputs = [DecodeInputs(e.query[:B].float().numpy(), *(c.float().numpy() for c in e.caches), bt[:B].copy(),
                               np.asarray(seq_lens, np.int32), np.arange(B + 1, dtype=np.int32), dtype="float16",
                               scale=impl.scale, window_left=None if impl.sliding_window is None else WINDOW)
                  for impl in e.layers]
    return meta, ref_inputs


def forward_all(e, meta):
    for impl, out in zip(e.layers, e.outputs):
        impl.forward_impl(e.query, None, None, tuple(e.caches), meta, out)


def capture(e, monkeypatch, meta):
    """Run the layers with ``capturing`` set and record the graph decoder's launches (the "graph": the
    operator's kernels and the replay counter's increment); the counter is then reset, as a capture on an
    NPU records the increment without running it."""
    calls = []
    real_run = GraphDecoder.run

    def recording_run(self, *a, **k):
        calls.append((self, a, k))
        return real_run(self, *a, **k)

    monkeypatch.setattr(GraphDecoder, "run", recording_run)
    e.ctx.capturing = True
    try:
        forward_all(e, meta)
    finally:
        e.ctx.capturing = False
        monkeypatch.setattr(GraphDecoder, "run", real_run)
    for dec, _, _ in calls:
        dec.replays.zero_()
    return lambda: [real_run(dec, *a, **k) for dec, a, k in calls]


@contextlib.contextmanager
def no_host_reads():
    """Tensor -> host reads raise, except inside the operator's kernel (the device side)."""
    monkeypatch = pytest.MonkeyPatch()
    active = [True]
    reads = []
    for name in ("cpu", "item", "tolist", "numpy", "__array__", "__int__", "__float__", "__bool__", "__index__"):
        orig = getattr(torch.Tensor, name)

        def guarded(self, *a, _orig=orig, _name=name, **k):
            if active[0]:
                reads.append(_name)
                raise AssertionError(f"run() read a device tensor on the host ({_name})")
            return _orig(self, *a, **k)

        monkeypatch.setattr(torch.Tensor, name, guarded)
    monkeypatch.setattr(ops, "decode_attention_op", while_running(ops.decode_attention_op, active, False))
    try:
        yield reads
    finally:
        active[0] = False
        monkeypatch.undo()


def buffer_ptrs(dec):
    ptrs = {("block_table",): dec.block_table.data_ptr()}
    for key, w in dec.wrappers.items():
        ptrs.update({(key, name): b.data_ptr() for name, b in w._buffers.items()})
    return ptrs


def check_step(e, dec, ref_inputs, B):
    for impl, out, inputs in zip(e.layers, e.outputs, ref_inputs):
        key = graph._graph_key(impl._splitkv_layer, e.query, e.caches[0])
        lse = dec.wrappers[key]._buffers["lse"]
        ref_out, ref_lse = dense_attention(inputs)
        got = out.view(N, HQ, D)
        err = np.abs(got[:B].float().numpy() - ref_out).max()
        assert err < 2e-3, (impl.sliding_window, err)
        np.testing.assert_allclose(lse[:B].numpy(), ref_lse, atol=2e-3)
        assert (got[B:] == 0).all(), "padding rows: out = 0"
        assert torch.isneginf(lse[B:]).all(), "padding rows: lse = -inf"


def warm_up_and_capture(e, monkeypatch):
    meta, _ = graph_step(e, [300, 5, 1000, 129])
    forward_all(e, e.builder.build(0, meta))               # vLLM's eager warm-up at the graph size
    dec = graph.GRAPH_DECODERS[(e.builder, N)]
    assert len(dec.wrappers) == 2, "one wrapper per set of layer constants (plain, sliding window)"
    meta, _ = graph_step(e, [17, 2, 640])
    replay = capture(e, monkeypatch, e.builder.build(0, meta))
    assert [impl.splitkv_graph_captures for impl in e.layers] == [1, 1]
    assert [impl.parent_calls for impl in e.layers] == [0, 0]
    return dec, replay


def test_replays_follow_changing_lengths_and_request_counts(env, monkeypatch):
    e = env
    dec, replay = warm_up_and_capture(e, monkeypatch)
    ptrs = buffer_ptrs(dec)
    steps = [([1000, 1, 257, 64, 1500], "uniform"), ([2, 3], "fia"), ([1700] * N, "uniform"),
             ([0, 900, 128], "uniform"), ([50, 1200, 7, 300, 129, 1, 2], "fia"), ([1], "uniform")]
    most_splits = 0
    for lens, pad in steps:
        meta, ref_inputs = graph_step(e, lens, pad=pad)
        for out in e.outputs:
            out.fill_(-3.0)
        e.builder.build(0, meta)                            # the host step before the replay
        assert buffer_ptrs(dec) == ptrs, "refresh must keep every buffer's address"
        with no_host_reads() as reads:
            replay()
        assert reads == []
        check_step(e, dec, ref_inputs, len(lens))
        most_splits = max([most_splits] + [int(p.num_splits.max()) for p in dec.plans.values()])
    assert [impl.parent_calls for impl in e.layers] == [0, 0]
    assert most_splits > 1, "long requests were split (the merge ran inside the graph)"


def test_draft_builds_never_touch_the_targets_graph_buffers(env, monkeypatch):
    """A drafter's ``build_for_drafting`` (``fast_build=True``) in the target's attention group: the
    target's graph buffers, plans and counters stay as the target's last step left them."""
    e = env
    dec, replay = warm_up_and_capture(e, monkeypatch)
    meta, refs = graph_step(e, [33, 900, 4])
    e.builder.build(0, meta)
    plans = dict(dec.plans)
    bt = dec.block_table.clone()
    refreshes = stats.snapshot()["graph_refreshes"]
    q_target = e.query.clone()
    draft, _ = graph_step(e, [34, 901, 5, 6, 7])        # writes the query buffer: put back before the replay
    built = e.builder.build(0, draft, fast_build=True)
    assert getattr(built, "_splitkv_graph_group", None) is None
    assert dec.plans == plans and torch.equal(dec.block_table, bt)
    assert stats.snapshot()["graph_refreshes"] == refreshes
    e.query.copy_(q_target)
    replay()
    check_step(e, dec, refs, 3)


def test_replays_are_counted_by_the_replays_not_the_builds(env, monkeypatch):
    """``graph_replays`` grows only when the captured graph runs (a device counter in the graph); the
    builder's count of uniform-decode steps is what vLLM should have replayed: the e2e compares them."""
    e = env
    dec, replay = warm_up_and_capture(e, monkeypatch)
    for lens in ([33, 900, 4], [1] * N, [70, 2]):
        e.builder.build(0, graph_step(e, lens)[0])
    replay()
    replay()
    counts = graph.replay_counts(read_device=True)
    assert counts == {"uniform_graph_steps": 3, "graph_replays": 2}
    e.builder.build(0, graph_step(e, [7, 8], pad="fia")[0])   # FIA padding: still uniform (one query each)
    replay()
    assert graph.replay_counts(read_device=True) == {"uniform_graph_steps": 4, "graph_replays": 3}
    assert stats.worker_stats()["graph_replays"] == 3
    assert graph.replay_counts()["graph_replays"] is None, "no device read unless asked"


def test_a_piecewise_capture_before_the_full_one_neither_marks_nor_counts(env, monkeypatch):
    """FULL_AND_PIECEWISE: vLLM captures the PIECEWISE graphs first; their attention runs eagerly between
    the pieces with vLLM Ascend's ``capturing`` still set. That run is not a capture of ours: the FULL
    capture that follows records the replay count, and only its replays are counted."""
    e = make_env(monkeypatch, "FULL_AND_PIECEWISE")
    meta, _ = graph_step(e, [300, 5, 1000, 129])
    forward_all(e, e.builder.build(0, meta))                # warm-up
    dec = graph.GRAPH_DECODERS[(e.builder, N)]
    e.desc.cudagraph_runtime_mode = CUDAGraphMode.PIECEWISE
    capture(e, monkeypatch, e.builder.build(0, graph_step(e, [17, 2, 640])[0]))
    assert not dec.captured and dec.layers_captured == 0 and stats.snapshot()["graph_captures"] == 0
    e.desc.cudagraph_runtime_mode = CUDAGraphMode.FULL
    replay = capture(e, monkeypatch, e.builder.build(0, graph_step(e, [17, 2, 640])[0]))
    assert dec.captured and dec.layers_captured == 2
    meta, refs = graph_step(e, [33, 900, 4])
    e.builder.build(0, meta)
    replay()
    check_step(e, dec, refs, 3)
    assert graph.replay_counts(read_device=True) == {"uniform_graph_steps": 1, "graph_replays": 1}


def run_an_eager_step_of_three_tokens(e, meta, refs):
    """The step's first 3 tokens (not a graph size) as an eager step: routed, no graph decoder made,
    each layer's output the float64 reference's (``refs``: the layers' inputs)."""
    meta.actual_seq_lengths_q = [1, 2, 3]
    meta.seq_lens_list = meta.seq_lens_list[:3]
    e.builder.build(0, meta)
    for impl, out in zip(e.layers, e.outputs):
        impl.forward_impl(e.query[:3], None, None, tuple(e.caches), meta, out)
    assert graph.GRAPH_DECODERS == {} and [i.splitkv_routed_steps for i in e.layers] == [1, 1]
    for out, inputs in zip(e.outputs, refs):
        assert np.abs(out[:3].view(3, HQ, D).float().numpy() - dense_attention(inputs)[0]).max() < 2e-3


def test_eager_steps_of_other_sizes_are_unchanged(env):
    run_an_eager_step_of_three_tokens(env, *graph_step(env, [40, 500, 3]))


def test_a_graph_is_routed_all_or_nothing(monkeypatch, caplog):
    """The window layer is not opted in: it stays on vLLM Ascend's path in the warm-up, so the capture
    of that size keeps every layer there (no graph mixing our op with FIA, whose captured parameters
    vLLM Ascend pairs with layers by position); eager steps still route the plain layer."""
    caplog.set_level(logging.INFO, logger="vllm")
    e = make_env(monkeypatch)
    monkeypatch.delenv("SPLITKV_VLLM_WINDOW")
    e.layers = [_impl(e.backend), _impl(e.backend, sliding_window=WINDOW)]
    for impl in e.layers:
        impl.key_cache, impl.value_cache = e.caches
    meta, _ = graph_step(e, [300, 5, 1000, 129])
    forward_all(e, e.builder.build(0, meta))               # warm-up: layer 0 routed, layer 1 not
    assert [impl.splitkv_routed_steps for impl in e.layers] == [1, 0]
    capture(e, monkeypatch, e.builder.build(0, graph_step(e, [17, 2, 640])[0]))
    assert [impl.splitkv_graph_captures for impl in e.layers] == [0, 0]
    assert [impl.parent_calls for impl in e.layers] == [0 + 1, 1 + 1]
    assert any("routed all or nothing" in r.getMessage() for r in caplog.records)
    assert not graph.GRAPH_DECODERS[(e.builder, N)].captured


def test_a_mixed_batch_of_a_graph_size_does_not_block_its_capture(env, monkeypatch):
    """A batch of a graph size that is not decode-only (e.g. a PIECEWISE warm-up with prefill rows) stays
    on vLLM Ascend's path for reasons of the batch, not of a layer: the FULL capture is still ours."""
    e = env
    meta, _ = graph_step(e, [300, 5, 1000, 129])
    meta.num_prefills, meta.attn_state = 1, AscendAttentionState.ChunkedPrefill
    forward_all(e, e.builder.build(0, meta))
    assert [impl.parent_calls for impl in e.layers] == [1, 1] and graph.WARM_UP_FALLBACKS == {}
    for impl in e.layers:
        impl.parent_calls = 0
    warm_up_and_capture(e, monkeypatch)           # captured on our op: one capture per layer, no parent call


def test_capture_without_warm_up_stays_on_vllm_ascend(env, monkeypatch):
    e = env
    meta, _ = graph_step(e, [10, 20])
    capture(e, monkeypatch, e.builder.build(0, meta))      # no eager step of this size before
    assert [impl.parent_calls for impl in e.layers] == [1, 1]
    assert [impl.splitkv_graph_captures for impl in e.layers] == [0, 0]


@pytest.mark.parametrize("mode", ["FULL_DECODE_ONLY", "FULL_AND_PIECEWISE"])
def test_routed_full_graph_modes(monkeypatch, mode):
    """Full graphs run our op where vLLM replays them only for uniform-decode batches; routing is decided
    by the metadata (decode-only), whatever the descriptor's uniform flag says."""
    from splitkv_vllm import stats

    e = make_env(monkeypatch, mode)
    e.desc.batch_descriptor.uniform = False                # not consulted
    dec, replay = warm_up_and_capture(e, monkeypatch)
    meta, ref_inputs = graph_step(e, [700, 3, 1500])
    e.builder.build(0, meta)
    replay()
    check_step(e, dec, ref_inputs, 3)
    snap = stats.snapshot()
    assert snap["graph_captures"] == 2 and snap["graph_refreshes"] == 1 and snap["routed_steps"] == 1
    assert e.v1.fence_calls == 2 + 2, "the fence at the warm-up and at the capture of each layer"


def test_full_mode_never_captures_our_op_nor_makes_buffers(monkeypatch, caplog):
    """Plain FULL: vLLM Ascend keys every graph non-uniform, so a graph of size N replays mixed batches too.
    No buffers, no refresh, captures on vLLM Ascend's path; eager decode-only steps are still routed."""
    import logging

    from splitkv_vllm import stats

    e = make_env(monkeypatch, "FULL")
    assert e.desc.batch_descriptor.uniform is False
    caplog.set_level(logging.INFO, logger="vllm")
    meta, _ = graph_step(e, [300, 5, 1000, 129])
    forward_all(e, e.builder.build(0, meta))               # the eager warm-up at a graph size
    assert graph.GRAPH_DECODERS == {} and getattr(meta, "_splitkv_graph_group", None) is None
    assert [impl.splitkv_routed_steps for impl in e.layers] == [1, 1]
    capture(e, monkeypatch, e.builder.build(0, graph_step(e, [17, 2, 640])[0]))
    assert [impl.parent_calls for impl in e.layers] == [1, 1]
    assert stats.snapshot()["graph_captures"] == 0
    assert any("FULL: vLLM Ascend keys every FULL graph" in r.getMessage() for r in caplog.records)


def test_piecewise_mode_routes_eagerly_and_makes_no_buffers(monkeypatch):
    """PIECEWISE: attention runs eagerly between the pieces (vLLM Ascend's capture flag is still set while
    the pieces are captured): no buffers; the capture-time attention goes to the parent, every replayed
    step's attention is an eager routed step."""
    e = make_env(monkeypatch, "PIECEWISE")
    capture(e, monkeypatch, e.builder.build(0, graph_step(e, [10, 20])[0]))
    assert graph.GRAPH_DECODERS == {} and [impl.parent_calls for impl in e.layers] == [1, 1]
    meta, ref_inputs = graph_step(e, [40, 500, 3])
    forward_all(e, e.builder.build(0, meta))
    assert [impl.splitkv_routed_steps for impl in e.layers] == [1, 1]
    for out, inputs in zip(e.outputs, ref_inputs):
        assert np.abs(out[:3].view(3, HQ, D).float().numpy() - dense_attention(inputs)[0]).max() < 2e-3


def default_capture_sizes(max_num_seqs: int, q: int = 1) -> list[int]:
    """vLLM's default ``cudagraph_capture_sizes``: 1, 2, 4, then steps of 8 to 256, then of 16, up to
    ``min(2 * max_num_seqs * q, 512)`` (``max_cudagraph_capture_size``)."""
    top = min(2 * max_num_seqs * q, 512)
    return [x for x in [1, 2, 4] + list(range(8, 256, 8)) + list(range(256, 513, 16)) if x <= top]


# vLLM-shaped configurations: (name, Hq, Hkv, D, max_model_len, max_num_seqs, speculative tokens)
MEMORY_TABLE = [
    ("llama3-8b", 32, 8, 128, 8192, 256, 0),
    ("llama3-8b-mtp1", 32, 8, 128, 8192, 256, 1),
    ("qwen-small-16seqs", 16, 2, 64, 4096, 16, 0),
]


def warm_up_every_decode_size(e, backend, layer_impl, cfg, key_cache):
    """The buffers vLLM's capture would make: an eager warm-up step at each capture size the builder
    refreshes (its decode sizes), padded with vLLM Ascend's dummy request."""
    builder = backend.SplitKVAscendAttentionBackend.get_builder_cls()(None, ["l0"], cfg, "cpu")
    q = graph.speculative_rows(builder) or 1
    for n in sorted(cfg.compilation_config.cudagraph_capture_sizes):
        reqs = max(1, n // q)
        qsl = [q * i for i in range(reqs + 1)] + ([n] if q * reqs < n else [])
        sl = [1] * (len(qsl) - 1)
        meta = AscendMetadata(attn_state=AscendAttentionState.DecodeOnly, num_actual_tokens=q * reqs, num_prefills=0,
                              num_decodes=len(sl), seq_lens=torch.tensor(sl, dtype=torch.int32), seq_lens_list=sl,
                              actual_seq_lengths_q=qsl[1:], block_tables=torch.zeros(len(sl), cfg.model_config.max_model_len
                                                                                      // BLOCK, dtype=torch.int32),
                              causal=True)
        meta = builder.build(0, meta)
        query = torch.zeros(n, layer_impl.num_heads, layer_impl.head_size, dtype=key_cache.dtype)
        graph.prepare_graph(layer_impl._splitkv_layer, query, key_cache, meta)
    return builder


@pytest.mark.parametrize("name, hq, hkv, d, max_len, seqs, k", MEMORY_TABLE)
def test_reserved_graph_memory_equals_what_the_warm_ups_make(monkeypatch, name, hq, hkv, d, max_len, seqs, k):
    """The reserve (held while vLLM profiles memory) equals the bytes the graph buffers take once every
    decode graph is warmed up: buffers only for the decode capture sizes (``<= max_num_seqs * (1 + k)``),
    one workspace shared by all of them. Printed: the table for the closing note."""
    e = make_env(monkeypatch, "FULL_AND_PIECEWISE")
    monkeypatch.setenv("SPLITKV_VLLM_RESERVE_GRAPH_MEMORY", "1")
    monkeypatch.setenv("SPLITKV_VLLM_POLICY", "auto")
    monkeypatch.setattr(graph, "_RESERVE", {})
    monkeypatch.setattr(e.backend, "_ESTIMATES", {})
    cfg = vllm_config(mode="FULL_AND_PIECEWISE", sizes=default_capture_sizes(seqs, 1 + k), dtype=torch.bfloat16,
                      block_size=1024, max_model_len=max_len, max_num_seqs=seqs, num_speculative_tokens=k or None)
    monkeypatch.setattr(sys.modules["vllm.config"], "get_current_vllm_config", lambda: cfg)
    impl = _impl(e.backend, num_heads=hq, num_kv_heads=hkv, head_size=d, scale=d ** -0.5)
    reserved = graph.reserved_bytes()
    assert reserved > 0 and len(e.backend._ESTIMATES) == 1
    key_cache = torch.zeros(4, BLOCK, hkv, d, dtype=torch.bfloat16)   # the physical 128-token block, not 1024
    builder = warm_up_every_decode_size(e, e.backend, impl, cfg, key_cache)
    decode = graph.decode_sizes(cfg)
    assert sorted(n for (_, n) in graph.GRAPH_DECODERS) == list(decode), "buffers only for the decode sizes"
    sizes = cfg.compilation_config.cudagraph_capture_sizes
    assert decode == tuple(x for x in sorted(sizes) if 1 + k <= x <= seqs * (1 + k))
    stores = {w._stores["workspace"].data_ptr() for dec in graph.GRAPH_DECODERS.values() for w in dec.wrappers.values()}
    assert len(stores) == 1, "one workspace shared by every graph size"
    made = graph.made_graph_bytes(builder)
    assert graph.reserved_bytes() == 0, "the warm-up handed the reserve back"
    assert made == reserved, (name, made, reserved)
    print(f"\n{name}: decode sizes {len(decode)} (sum {sum(decode)} tokens) of {len(cfg.compilation_config.cudagraph_capture_sizes)}"
          f" capture sizes; reserved {reserved / 2**20:.1f} MiB, made {made / 2**20:.1f} MiB per set of layer constants")


def test_a_shared_workspace_must_be_a_float32_vector_on_the_device():
    for bad in (torch.zeros(64, dtype=torch.float16), torch.zeros(8, 8), "workspace"):
        with pytest.raises(ValueError, match="workspace"):
            AscendDecodeWrapper(HQ, HKV, D, BLOCK, dtype=DT, device="cpu", workspace=bad)
    shared = torch.zeros(1 << 22)   # 16 MiB: more than this batch needs
    w = AscendDecodeWrapper(HQ, HKV, D, BLOCK, dtype=DT, device="cpu", workspace=shared)
    w.plan(np.array([300, 5], np.int32), max_pages=4, num_pages=NUM_BLOCKS)
    assert 0 < w.workspace_bytes() <= shared.numel() * 4
    assert w._buffers["workspace"].data_ptr() == shared.data_ptr(), "taken from the shared store"


def test_no_graph_buffers_are_made_while_serving(env, monkeypatch):
    """After vLLM's capture (``cudagraph_capturing_enabled`` cleared) an eager step of a graph size makes
    nothing: it runs eagerly."""
    e = env
    monitor = types.ModuleType("vllm.compilation.monitor")
    monitor.cudagraph_capturing_enabled = False
    monkeypatch.setitem(sys.modules, "vllm.compilation.monitor", monitor)
    meta, refs = graph_step(e, [300, 5, 1000, 129])
    forward_all(e, e.builder.build(0, meta))
    assert graph.GRAPH_DECODERS == {} and [impl.splitkv_routed_steps for impl in e.layers] == [1, 1]
    monitor.cudagraph_capturing_enabled = True      # the capture window: the warm-up makes them
    forward_all(e, e.builder.build(0, graph_step(e, [300, 5])[0]))
    assert list(graph.GRAPH_DECODERS) == [(e.builder, N)]


def test_work_item_capacity_raises_only_for_a_step_that_replays(env, monkeypatch, caplog):
    """A batch over the graph buffers' capacity: before the capture (and for any step vLLM does not
    replay) it loses its graph mark and runs eagerly, logged once; once a graph of that size is
    captured, a uniform-decode step (which vLLM replays) raises in build()."""
    e = env
    monkeypatch.setenv("SPLITKV_VLLM_GRAPH_MAX_WORK_ITEMS", "20")  # 9 requests x 2 KV heads = 18 items unsplit
    meta, _ = graph_step(e, [100, 200])
    forward_all(e, e.builder.build(0, meta))
    dec = graph.GRAPH_DECODERS[(e.builder, N)]
    meta, refs = graph_step(e, [1700] * N)                 # needs splits: over 20 work items
    built = e.builder.build(0, meta)
    assert built._splitkv_graph_group is None and built._splitkv_graph_decoder is None
    assert any("does not fit the graph buffers" in r.getMessage() for r in caplog.records)
    forward_all(e, built)
    for out, ref in zip(e.outputs, refs):
        assert np.abs(out.view(N, HQ, D).float().numpy() - dense_attention(ref)[0]).max() < 2e-3
    assert [impl.parent_calls for impl in e.layers] == [0, 0]
    capture(e, monkeypatch, e.builder.build(0, graph_step(e, [17, 2])[0]))
    meta, _ = graph_step(e, [1700] * N)
    with pytest.raises(ValueError, match="max_work_items"):
        e.builder.build(0, meta)
    assert dec.max_work_items == 20
    with pytest.raises(ValueError, match="max_reqs"):
        dec.refresh(np.ones(N + 2, np.int32), np.arange(N + 3), torch.zeros(N + 2, 16, dtype=torch.int32))
    monkeypatch.setenv("SPLITKV_VLLM_GRAPH_MAX_SPLITS", "0")  # malformed: logged, the default is used
    assert graph.graph_options()["max_splits"] == graph.GRAPH_MAX_SPLITS_DEFAULT


def test_graph_decoder_needs_graph_stable_shapes():
    dec = GraphDecoder(num_tokens=4, max_reqs=5, max_splits=2)
    with pytest.raises(ValueError, match="query_start_loc"):
        dec.pad([3, 4], [0, 1, 2])
    sl, qsl = dec.pad([3, 4], [0, 1, 4])
    assert sl.tolist() == [3, 4, 0, 0, 0] and qsl.tolist() == [0, 1, 4, 4, 4, 4]
