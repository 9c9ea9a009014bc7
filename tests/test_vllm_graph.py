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
import torch

from ascend_ops import ops
from ascend_ops.wrapper import AscendDecodeWrapper
from splitkv_common.inputs import DecodeInputs
from splitkv_common.reference import dense_attention
from splitkv_vllm import graph
from splitkv_vllm.graph import GraphDecoder
from test_vllm_plugin import _fake_vllm_ascend, _impl
from test_vllm_shapes import AscendAttentionState, AscendMetadata

N = 8                    # the captured graph's token count (uniform decode, one query per request)
HQ, HKV, D, BLOCK = 8, 2, 64, 128
NUM_BLOCKS = 48
WINDOW = 100             # the second layer's vLLM sliding_window
DT = torch.float16


class FullDecodeOnly:
    @staticmethod
    def has_full_cudagraphs():
        return True


@pytest.fixture
def env(monkeypatch):
    monkeypatch.delenv("SPLITKV_VLLM_IMPL", raising=False)
    monkeypatch.delenv("SPLITKV_VLLM_GRAPH_MAX_WORK_ITEMS", raising=False)
    monkeypatch.setenv("SPLITKV_VLLM_GRAPH_MAX_SPLITS", "8")
    monkeypatch.setenv("SPLITKV_VLLM_POLICY", "size:256")  # long requests split (auto: too few for it here)
    monkeypatch.setattr(graph, "GRAPH_DECODERS", {})
    _, v1 = _fake_vllm_ascend(monkeypatch)
    desc = types.SimpleNamespace(batch_descriptor=types.SimpleNamespace(num_tokens=N, uniform=True))
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
    cfg = types.SimpleNamespace(compilation_config=types.SimpleNamespace(cudagraph_mode=FullDecodeOnly(),
                                                                         cudagraph_capture_sizes=[4, N, 16]))
    builder = backend.SplitKVAscendAttentionBackend.get_builder_cls()(None, ["l0", "l1"], cfg, "cpu")
    layers = [_impl(backend), _impl(backend, sliding_window=WINDOW)]
    for impl in layers:
        impl.key_cache, impl.value_cache = caches
    ctx = sys.modules["vllm_ascend.ascend_forward_context"]._EXTRA_CTX
    return types.SimpleNamespace(backend=backend, builder=builder, layers=layers, caches=caches, ctx=ctx, desc=desc,
                                 query=torch.zeros(N, HQ, D, dtype=DT),                 # the runner's persistent buffers
                                 outputs=[torch.zeros(N, HQ * D, dtype=DT) for _ in layers], g=g)


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
                               scale=impl.scale, window_left=None if impl.sliding_window is None else WINDOW - 1)
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


def test_capture_without_warm_up_or_of_mixed_graphs_stays_on_vllm_ascend(env, monkeypatch):
    e = env
    meta, _ = graph_step(e, [10, 20])
    capture(e, monkeypatch, e.builder.build(0, meta))      # no eager step of this size before
    assert [impl.parent_calls for impl in e.layers] == [1, 1]
    forward_all(e, e.builder.build(0, graph_step(e, [10, 20])[0]))  # warm-up
    e.desc.batch_descriptor.uniform = False
    capture(e, monkeypatch, e.builder.build(0, graph_step(e, [10, 20])[0]))
    assert [impl.parent_calls for impl in e.layers] == [2, 2]
    assert [impl.splitkv_graph_captures for impl in e.layers] == [0, 0]


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
    monkeypatch.setenv("SPLITKV_VLLM_GRAPH_MAX_SPLITS", "0")
    with pytest.raises(ValueError, match="SPLITKV_VLLM_GRAPH_MAX_SPLITS"):
        graph.graph_options()


def test_graph_decoder_needs_graph_stable_shapes():
    dec = GraphDecoder(num_tokens=4, max_reqs=5, max_splits=2)
    with pytest.raises(ValueError, match="query_start_loc"):
        dec.pad([3, 4], [0, 1, 2])
    sl, qsl = dec.pad([3, 4], [0, 1, 4])
    assert sl.tolist() == [3, 4, 0, 0, 0] and qsl.tolist() == [0, 1, 4, 4, 4, 4]
