"""The vLLM Ascend adapter on CPU: metadata shaped as vLLM Ascend passes it -> our plan and call,
checked against the float64 NumPy reference through the torch eager path."""

import numpy as np
import pytest
torch = pytest.importorskip("torch")

from splitkv_common.reference import dense_attention  # noqa: E402
from splitkv_vllm import adapter  # noqa: E402
from splitkv_vllm.adapter import LayerSpec, batch_unsupported, forward_decode, make_batch, window_left_from_vllm  # noqa: E402
from test_vllm_shapes import AscendAttentionState, Impl, make_step  # noqa: E402

TOL = {torch.float16: 2e-3, torch.bfloat16: 1.6e-2, torch.float32: 1e-4}


def _check(step, impl, tol):
    step.inputs.scale = impl.scale  # the layer's scale is what the reference must use
    layer = LayerSpec.from_impl(impl)
    assert layer.layer_unsupported is None
    assert batch_unsupported(step.meta) is None
    output = torch.full_like(step.query, -5.0)
    forward_decode(layer, step.query, step.key_cache, step.value_cache, step.meta, output, impl="torch")
    ref_out, _ = dense_attention(step.inputs)
    T = step.inputs.q.shape[0]
    got = output[:T].float().numpy()
    assert np.isfinite(got).all()
    err = np.abs(got - ref_out).max()
    assert err < tol, err
    return output


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_plain_decode_matches_reference(dtype):
    step = make_step([1] * 5, [1, 127, 128, 129, 700], dtype=dtype, seed=1)
    assert step.meta.attn_state is AscendAttentionState.DecodeOnly
    _check(step, Impl(8, 64, 64 ** -0.5, 2), TOL[dtype])


def test_speculative_rows_causal_tail():
    # SpecDecoding: 3 queries per request (1 + 2 draft tokens); each sees its own causal prefix
    step = make_step([3, 3, 2], [5, 300, 131], decode_threshold=3, seed=2, num_heads=4, num_kv_heads=4)
    assert step.meta.attn_state is AscendAttentionState.SpecDecoding
    _check(step, Impl(4, 64, 0.1, 4), TOL[torch.float16])


def test_graph_padding_rows_untouched():
    # the runner's dummy request (seq_len 1, block row 0) pads the step to a captured size
    step = make_step([1, 1, 1], [40, 257, 9], pad_tokens=5, seed=3)
    assert step.query.shape[0] == 8 and len(step.meta.actual_seq_lengths_q) == 4
    out = _check(step, Impl(8, 64, 0.125, 2), TOL[torch.float16])
    # the padding request attends over its one token of block 0: finite, and real rows unaffected
    assert torch.isfinite(out[3:].float()).all()


def test_empty_request_gives_zero_rows():
    step = make_step([1, 1, 1], [0, 50, 0], seed=4)
    out = _check(step, Impl(8, 64, 0.125, 2), TOL[torch.float16])
    assert (out[0] == 0).all() and (out[2] == 0).all()


def vllm_ascend_window_fia(step, impl):
    """The FIA call vLLM Ascend makes for a causal window layer (``forward_fused_infer_attention``, the
    ``sliding_window is not None`` branch, for prefill and decode alike), run through the emulation of
    FIA's documented semantics: TND, ``sparse_mode=4``, ``pre_tokens=W``, ``next_tokens=0``, the 2048
    mask, the cache viewed ``[num_blocks, block_size, Hkv * D]`` (``_get_fia_params``)."""
    from ascend.fia_emulation import check_call, fake_fia
    from ascend_ops.cann_fia import MASK_SIZE

    meta = step.meta
    nb, bs = step.key_cache.shape[:2]
    kwargs = dict(atten_mask=torch.triu(torch.ones(MASK_SIZE, MASK_SIZE, dtype=torch.bool), 1),
                  block_table=meta.block_tables, input_layout="TND", block_size=int(bs),
                  actual_seq_lengths=list(meta.actual_seq_lengths_q), actual_seq_lengths_kv=list(meta.seq_lens_list),
                  num_key_value_heads=impl.num_kv_heads, num_heads=impl.num_heads, scale=impl.scale,
                  pre_tokens=int(impl.sliding_window), next_tokens=0, sparse_mode=4)
    T = int(meta.actual_seq_lengths_q[-1])
    args = (step.query[:T], step.key_cache.view(nb, bs, -1), step.value_cache.view(nb, bs, -1))
    assert check_call(args, kwargs) == [], "the call binds to FIA's recorded schema"
    out, _ = fake_fia(*args, **kwargs)
    return out.float()


@pytest.mark.parametrize("W", [1, 7, 100, 128])
def test_window_layer_matches_vllm_ascends_own_attention(monkeypatch, W):
    """Decode (and spec-decode rows) of a window layer through splitkv equals what vLLM Ascend's FIA call
    computes for the same layer and step: W + 1 keys (FIA's band counts ``pre_tokens`` keys before the
    query's own). vLLM's W-key definition (``window_left = W - 1``) would differ by that one key."""
    assert window_left_from_vllm(None) is None and window_left_from_vllm(4096) == 4095
    impl = Impl(8, 64, 0.125, 2, sliding_window=W)
    assert "sliding window" in adapter.layer_unsupported(impl), "opt-in only until a node confirms it"
    monkeypatch.setenv("SPLITKV_VLLM_WINDOW", "1")
    step = make_step([1, 1, 2, 1], [90, 400, 333, W + 1], decode_threshold=2, seed=5)
    layer = LayerSpec.from_impl(impl)
    assert layer.layer_unsupported is None and layer.window_left == W
    ref = vllm_ascend_window_fia(step, impl)
    T = ref.shape[0]
    out = torch.zeros_like(step.query)
    forward_decode(layer, step.query, step.key_cache, step.value_cache, step.meta, out, impl="torch")
    assert (out[:T].float() - ref).abs().max() < 2e-3
    vllm_def = torch.zeros_like(step.query)
    forward_decode(LayerSpec(**{**layer.__dict__, "window_left": W - 1}), step.query, step.key_cache,
                   step.value_cache, step.meta, vllm_def, impl="torch")
    assert (vllm_def[:T].float() - ref).abs().max() > 1e-2, "W keys (vLLM's definition) is not what vLLM Ascend computes"


def test_graph_stable_plan_keeps_shapes_as_lengths_change():
    shapes = set()
    for seed, lens in enumerate(([5, 9, 200], [6, 10, 201], [300, 1, 1000])):
        step = make_step([1, 1, 1], lens, pad_tokens=1, seed=seed)
        b = make_batch(step.meta, num_q_heads=8, num_kv_heads=2, head_dim=64, page_size=128, graph_stable=True,
                       max_splits=8)
        p = b.plan
        shapes.add((p.num_items, p.num_slots, p.num_rows))
        assert p.graph_stable and p.num_valid_items <= p.num_items
        assert (p.item_request[p.num_valid_items:] == -1).all()
    assert len(shapes) == 1


def test_plan_is_shared_by_layers_of_a_step():
    step = make_step([1, 1], [10, 20])
    kw = dict(num_q_heads=8, num_kv_heads=2, head_dim=64, page_size=128)
    assert make_batch(step.meta, **kw) is make_batch(step.meta, **kw)
    assert make_batch(step.meta, **kw) is not make_batch(step.meta, window_left=3, **kw)


def test_plan_follows_lengths_rewritten_on_the_same_metadata():
    """vLLM Ascend's v2 speculator rewrites ``seq_lens_list`` / ``actual_seq_lengths_q`` on the same
    metadata object between draft steps: the plan is keyed on the lengths, never reused stale."""
    step = make_step([1, 1], [10, 300])
    kw = dict(num_q_heads=8, num_kv_heads=2, head_dim=64, page_size=128)
    first = make_batch(step.meta, **kw)
    step.meta.seq_lens_list = [11, 301]
    second = make_batch(step.meta, **kw)
    assert second is not first and second.seq_lens.tolist() == [11, 301]
    assert second.plan.covered_seq_lens().tolist() == [11, 301]
    step.meta.seq_lens_list = [10, 300]
    assert make_batch(step.meta, **kw) is first


def test_mixed_and_prefill_batches_are_not_routed():
    mixed = make_step([1, 1, 37], [10, 20, 37], seed=6)
    assert mixed.meta.num_prefills == 1
    assert "mixed batch" in batch_unsupported(mixed.meta)
    mixed.meta.num_prefills = 0
    mixed.meta.attn_state = AscendAttentionState.PrefillNoCache
    assert "PrefillNoCache" in batch_unsupported(mixed.meta)
    assert batch_unsupported(None)


@pytest.mark.parametrize("change, words", [
    (dict(alibi_slopes=[0.5]), "ALiBi"), (dict(sinks=torch.zeros(8)), "sinks"),
    (dict(attn_type="encoder_decoder"), "attention type"), (dict(kv_cache_dtype="int8"), "KV cache dtype"),
    (dict(enable_c8_quant=True), "C8"), (dict(head_size=512), "head dim 512"),
    (dict(head_size=72 + 4), "head dim 76"),   # under 256 but not a multiple of 8: the kernels refuse it
])
def test_unsupported_layers_stay_on_vllm_ascend(change, words):
    kw = dict(num_heads=8, head_size=64, scale=0.1, num_kv_heads=2) | change
    assert words in adapter.layer_unsupported(Impl(**kw))


def test_soft_cap_needs_opt_in(monkeypatch):
    impl = Impl(8, 64, 0.1, 2)
    assert "soft cap" in adapter.layer_unsupported(impl, soft_cap=30.0)
    monkeypatch.setenv("SPLITKV_VLLM_SOFT_CAP", "1")
    assert adapter.layer_unsupported(impl, soft_cap=30.0) is None
    assert LayerSpec.from_impl(impl, soft_cap=30.0).soft_cap == 30.0
