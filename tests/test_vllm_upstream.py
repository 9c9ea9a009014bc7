"""The upstream edits (``splitkv_vllm.upstream``) applied to stand-ins shaped from the recorded facts.

The stand-ins are written here from :data:`splitkv_vllm.upstream.RECORDED` (field names, the
``forward_impl`` signature and first statement, ``AscendConfig.__init__``'s signature); the edited
module is compiled and run: with the switch on, a decode-only step goes through our op (the operator's
CPU kernel here) and matches the float64 reference; with it off, or for a mixed batch, the original
path runs. The operator is replaced by the torch split-then-merge twin (no NPU here). Not tested: the edits against a real vLLM Ascend checkout, on an NPU.
"""

import types

import numpy as np
import pytest
torch = pytest.importorskip("torch")

from splitkv_common.reference import dense_attention  # noqa: E402
from splitkv_vllm import upstream  # noqa: E402
from test_vllm_shapes import AscendAttentionState, make_step  # noqa: E402


def attention_v1_standin() -> str:
    params = ", ".join(upstream.RECORDED["forward_impl_params"])
    return "\n".join([
        "class AscendAttentionBackendImpl:",
        f"    def forward_impl({params}):",
        f"        {upstream.RECORDED['forward_impl_first_statement']}",
        "        output.fill_(123.0)",
        "        return output",
        "",
    ])


def ascend_config_standin() -> str:
    return "\n".join([
        "class AscendConfig:",
        f"    {upstream.RECORDED['ascend_config_init']}",
        "        additional_config = vllm_config.additional_config if vllm_config.additional_config is not None else {}",
        "        self.other = additional_config.get('other', False)",
        "",
    ])


def build(switch: bool):
    cfg_ns = {"VllmConfig": object}
    exec(compile(upstream.apply("ascend_config", ascend_config_standin()), "ascend_config", "exec"), cfg_ns)
    ascend_config = cfg_ns["AscendConfig"](types.SimpleNamespace(additional_config={upstream.SWITCH: switch}))
    assert getattr(ascend_config, upstream.SWITCH) is switch
    fences = []
    ns = {"record_attention_compute_start": lambda: fences.append(1)}
    src = upstream.apply("attention_v1", attention_v1_standin())
    exec(compile(src, "attention_v1", "exec"), ns)
    impl_cls = ns["AscendAttentionBackendImpl"]
    methods = {}
    exec(compile(upstream.IMPL_METHODS, "methods", "exec"), methods)
    for name in ("_splitkv_decode_routed", "_splitkv_decode"):
        setattr(impl_cls, name, methods[name])
    return impl_cls, ascend_config, fences


@pytest.mark.parametrize("switch", [True, False])
def test_edits_route_decode_behind_the_switch(monkeypatch, switch):
    import sys

    import ascend_ops
    from splitkv_common.plan import make_plan
    from splitkv_common.torch_eager import decode_attention as eager

    def cpu_op(q, kc, vc, bt, sl, qsl, *, scale=None):  # the operator stands in by its torch twin on the CPU
        plan = make_plan(sl.numpy(), num_kv_heads=kc.shape[2], page_size=kc.shape[1], query_start_loc=qsl.numpy(),
                         num_q_heads=q.shape[1], head_dim=q.shape[2])
        return eager(q, kc, vc, bt, sl, qsl, plan=plan, scale=scale)

    monkeypatch.setattr(ascend_ops, "decode_attention", cpu_op)
    impl_cls, ascend_config, fences = build(switch)
    mod = types.ModuleType("vllm_ascend.ascend_config")
    mod.get_ascend_config = lambda: ascend_config
    monkeypatch.setitem(sys.modules, "vllm_ascend", types.ModuleType("vllm_ascend"))
    monkeypatch.setitem(sys.modules, "vllm_ascend.ascend_config", mod)
    step = make_step([1, 1, 1], [5, 300, 129], seed=21)
    meta = step.meta
    for field in upstream.RECORDED["metadata_fields"]:
        assert hasattr(meta, field), field
    assert meta.attn_state.name in upstream.RECORDED["attn_states"]
    impl = impl_cls()
    impl.num_heads, impl.num_kv_heads, impl.head_size, impl.scale = 8, 2, 64, 0.125
    impl.sliding_window = impl.alibi_slopes = impl.sinks = None
    impl.key_cache, impl.value_cache = step.key_cache, step.value_cache
    out = torch.zeros(step.query.shape[0], 8 * 64, dtype=step.query.dtype)
    impl.forward_impl(step.query, None, None, None, meta, out)
    assert fences == [1], "the fence still runs first"
    if switch:
        step.inputs.scale = 0.125
        ref, _ = dense_attention(step.inputs)
        assert np.abs(out.view(-1, 8, 64).float().numpy() - ref).max() < 2e-3
    else:
        assert (out == 123.0).all()
    mixed = make_step([1, 20], [10, 20], seed=22)
    out = torch.zeros(mixed.query.shape[0], 8 * 64, dtype=mixed.query.dtype)
    impl.key_cache, impl.value_cache = mixed.key_cache, mixed.value_cache
    impl.forward_impl(mixed.query, None, None, None, mixed.meta, out)
    assert (out == 123.0).all(), "a mixed batch keeps vLLM Ascend's path"


def test_a_moved_anchor_is_named():
    with pytest.raises(upstream.AnchorMissing, match="record_attention_compute_start"):
        upstream.apply("attention_v1", "class AscendAttentionBackendImpl:\n    pass\n")
