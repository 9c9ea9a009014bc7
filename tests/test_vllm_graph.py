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
from splitkv_vllm import graph  # noqa: E402
from splitkv_vllm.graph import GraphDecoder  # noqa: E402
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
    """Run the layers with ``capturing`` set and record the operator launches (the "graph")."""
    calls = []
    real_run = AscendDecodeWrapper.run

    def recording_run(self, *a, **k):
        calls.append((self, a, k))
        return real_run(self, *a, **k)

    monkeypatch.setattr(AscendDecodeWrapper, "run", recording_run)
    e.ctx.capturing = True
    try:
        forward_all(e, meta)
    finally:
        e.ctx.capturing = False
        monkeypatch.setattr(AscendDecodeWrapper, "run", real_run)
    return lambda: [real_run(w, *a, **k) for w, a, k in calls]


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
    real_op = ops.decode_attention_op

    def kernel(*a, **k):
        active[0] = False
        try:
            return real_op(*a, **k)
        finally:
            active[0] = True

    monkeypatch.setattr(ops, "decode_attention_op", kernel)
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


def test_eager_steps_of_other_sizes_are_unchanged(env):
    e = env
    meta, ref_inputs = graph_step(e, [40, 500, 3])
    meta.actual_seq_lengths_q = [1, 2, 3]                  # an eager step of 3 tokens: not a graph size
    meta.seq_lens_list = meta.seq_lens_list[:3]
    e.builder.build(0, meta)
    for impl, out in zip(e.layers, e.outputs):
        impl.forward_impl(e.query[:3], None, None, tuple(e.caches), meta, out)
    assert graph.GRAPH_DECODERS == {} and [i.splitkv_routed_steps for i in e.layers] == [1, 1]
    for out, inputs in zip(e.outputs, ref_inputs):
        assert np.abs(out[:3].view(3, HQ, D).float().numpy() - dense_attention(inputs)[0]).max() < 2e-3


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


def test_graph_buffer_memory_is_reserved_before_profiling(monkeypatch):
    """The impls are built while vLLM loads the model, before its profile run: in a routed full-graph mode
    each set of layer constants holds the bytes its graph buffers will take; the warm-up hands them back."""
    e = make_env(monkeypatch, "FULL_DECODE_ONLY")
    monkeypatch.setenv("SPLITKV_VLLM_RESERVE_GRAPH_MEMORY", "1")
    monkeypatch.setattr(graph, "_RESERVE", {})
    monkeypatch.setattr(e.backend, "_ESTIMATES", {})
    layers = [_impl(e.backend), _impl(e.backend, sliding_window=WINDOW), _impl(e.backend)]
    held = graph.reserved_bytes()
    assert held > 0 and len(e.backend._ESTIMATES) == 2, "one estimate per set of layer constants"
    for impl in layers[:2]:
        impl.key_cache, impl.value_cache = e.caches
    e.layers = layers[:2]
    meta, _ = graph_step(e, [300, 5, 1000, 129])
    forward_all(e, e.builder.build(0, meta))               # warm-up of one size: the reserve is released
    assert graph.reserved_bytes() == 0
    dec = graph.GRAPH_DECODERS[(e.builder, N)]
    made = dec.block_table.numel() * 4 + sum(b.numel() * b.element_size() for w in dec.wrappers.values()
                                             for b in w._buffers.values())
    assert 0 < made < held, "the reserve covers every capture size, the warm-up made one"


def test_work_item_capacity_is_a_clear_error(env, monkeypatch):
    e = env
    monkeypatch.setenv("SPLITKV_VLLM_GRAPH_MAX_WORK_ITEMS", "20")  # 9 requests x 2 KV heads = 18 items unsplit
    meta, _ = graph_step(e, [100, 200])
    forward_all(e, e.builder.build(0, meta))
    dec = graph.GRAPH_DECODERS[(e.builder, N)]
    meta, _ = graph_step(e, [1700] * N)                    # needs splits: over 20 work items
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
