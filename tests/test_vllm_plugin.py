"""The vLLM plugin without vLLM: entry point, switch, platform wrapping, backend routing.

vLLM Ascend is replaced by small fake modules that have the names and call shapes the plugin
uses (``vllm_ascend.platform.NPUPlatform.get_attn_backend_cls``; ``attention_v1``'s backend,
impl, metadata builder and state enum; ``ascend_forward_context._EXTRA_CTX``), taken from the source noted in ``splitkv_vllm.VLLM_ASCEND_REFERENCE``.
"""

import importlib
import importlib.metadata as md
import logging
import sys
import types

import numpy as np
import pytest
import torch

from splitkv_common.reference import dense_attention
from splitkv_vllm import plugin
from test_vllm_shapes import AscendAttentionState, make_step

GQA = plugin.ASCEND_GQA_BACKEND
MLA = "vllm_ascend.attention.mla_v1.AscendMLABackend"


def _fake_vllm_ascend(monkeypatch):
    """Install fake ``vllm_ascend`` modules; returns (platform class, attention_v1 module).

    ``vllm_ascend.ascend_forward_context._EXTRA_CTX`` has the two flags the backend reads
    (``capturing``, ``is_draft_model``)."""
    pkg = types.ModuleType("vllm_ascend")
    pkg.__path__ = []
    pkg.__spec__ = importlib.machinery.ModuleSpec("vllm_ascend", None, is_package=True)

    class NPUPlatform:
        @classmethod
        def get_attn_backend_cls(cls, selected_backend, attn_selector_config, num_heads=None):
            return MLA if attn_selector_config.use_mla else GQA

    plat = types.ModuleType("vllm_ascend.platform")
    plat.NPUPlatform = NPUPlatform

    v1 = types.ModuleType("vllm_ascend.attention.attention_v1")
    v1.AscendAttentionState = AscendAttentionState

    class AscendAttentionBackendImpl:
        def __init__(self, num_heads, head_size, scale, num_kv_heads, alibi_slopes, sliding_window, kv_cache_dtype,
                     logits_soft_cap, attn_type, kv_sharing_target_layer_name, sinks=None, **kwargs):
            self.num_heads, self.head_size, self.scale = num_heads, head_size, float(scale)
            self.num_kv_heads, self.alibi_slopes, self.sliding_window = num_kv_heads, alibi_slopes, sliding_window
            self.kv_cache_dtype, self.attn_type, self.sinks = kv_cache_dtype, attn_type, sinks
            self.key_cache = self.value_cache = None
            self.parent_calls = 0

        def forward_impl(self, query, key, value, kv_cache, attn_metadata, output):
            self.parent_calls += 1
            return output.fill_(123.0)

    class AscendAttentionDCPImpl(AscendAttentionBackendImpl):
        pass

    class AscendAttentionMetadataBuilder:
        # the parent's build() makes AscendMetadata from vLLM's common metadata; here the stand-in
        # "common metadata" already is the AscendMetadata (tests/test_vllm_shapes.py)
        def __init__(self, kv_cache_spec, layer_names, vllm_config, device):
            self.kv_cache_spec, self.layer_names, self.device = kv_cache_spec, layer_names, device
            self.vllm_config, self.compilation_config = vllm_config, vllm_config.compilation_config

        def build(self, common_prefix_len, common_attn_metadata, fast_build=False):
            return common_attn_metadata

    class AscendAttentionBackend:
        impl = AscendAttentionBackendImpl
        builder = AscendAttentionMetadataBuilder

        @staticmethod
        def get_impl_cls():
            return AscendAttentionBackend.impl

        @staticmethod
        def get_builder_cls():
            return AscendAttentionBackend.builder

    v1.AscendAttentionBackendImpl = AscendAttentionBackendImpl
    v1.AscendAttentionMetadataBuilder = AscendAttentionMetadataBuilder
    v1.AscendAttentionDCPImpl = AscendAttentionDCPImpl
    v1.AscendAttentionBackend = AscendAttentionBackend
    attn = types.ModuleType("vllm_ascend.attention")
    attn.__path__ = []
    attn.attention_v1 = v1
    fctx = types.ModuleType("vllm_ascend.ascend_forward_context")
    fctx._EXTRA_CTX = types.SimpleNamespace(capturing=False, is_draft_model=False)
    for name, mod in (("vllm_ascend", pkg), ("vllm_ascend.platform", plat), ("vllm_ascend.attention", attn),
                      ("vllm_ascend.attention.attention_v1", v1), ("vllm_ascend.ascend_forward_context", fctx)):
        monkeypatch.setitem(sys.modules, name, mod)
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda n, *a, _f=importlib.util.find_spec: pkg.__spec__ if n == "vllm_ascend" else _f(n, *a))
    monkeypatch.delitem(sys.modules, "splitkv_vllm.backend", raising=False)
    return NPUPlatform, v1


def _cfg(use_mla=False):
    return types.SimpleNamespace(use_mla=use_mla, use_sparse=False)


def test_entry_points_are_discoverable():
    eps = {ep.name: ep for ep in md.entry_points(group="vllm.general_plugins")}
    assert "splitkv" in eps, "pip install -e . first (the README's test flow)"
    assert eps["splitkv"].value == "splitkv_vllm.plugin:register"
    assert eps["splitkv"].load() is plugin.register
    backends = {ep.name: ep.value for ep in md.entry_points(group="splitkv.backends")}
    assert backends.get("cann-fia") == "ascend_ops.cann_fia:cann_fia_backend"
    assert backends.get("triton-npu") == "cuda_ref.npu:triton_npu_backend"


def test_import_needs_no_vllm():
    for mod in ("splitkv_vllm", "splitkv_vllm.plugin", "splitkv_vllm.adapter", "splitkv_vllm.dispatch",
                "splitkv_vllm.graph"):
        importlib.import_module(mod)
    assert "vllm" not in sys.modules and "torch_npu" not in sys.modules


def test_off_by_default(monkeypatch):
    monkeypatch.delenv("SPLITKV_VLLM_ENABLE", raising=False)
    platform_cls, _ = _fake_vllm_ascend(monkeypatch)
    before = platform_cls.__dict__["get_attn_backend_cls"]
    plugin.register()
    assert platform_cls.__dict__["get_attn_backend_cls"] is before
    assert plugin.status()["active"] is False and "not set" in plugin.status()["reason"]


def test_enabled_without_vllm_ascend_logs_and_stays_off(monkeypatch, caplog):
    monkeypatch.setenv("SPLITKV_VLLM_ENABLE", "1")
    monkeypatch.delenv("SPLITKV_VLLM_STRICT", raising=False)
    monkeypatch.setitem(sys.modules, "vllm_ascend", None)  # import fails as if not installed
    with caplog.at_level(logging.WARNING, logger="splitkv_vllm"):
        plugin.register()  # must not raise: vLLM keeps running on its own path
    assert plugin.status()["active"] is False
    assert "vLLM Ascend" in plugin.status()["reason"]
    assert any("stays off" in r.message for r in caplog.records)


def test_strict_mode_raises(monkeypatch):
    monkeypatch.setenv("SPLITKV_VLLM_ENABLE", "1")
    monkeypatch.setenv("SPLITKV_VLLM_STRICT", "1")
    monkeypatch.setitem(sys.modules, "vllm_ascend", None)
    with pytest.raises(RuntimeError, match="stays off"):
        plugin.register()


def test_enabled_without_operator_stays_off(monkeypatch):
    monkeypatch.setenv("SPLITKV_VLLM_ENABLE", "1")
    monkeypatch.delenv("SPLITKV_VLLM_IMPL", raising=False)
    platform_cls, _ = _fake_vllm_ascend(monkeypatch)
    plugin.register()  # no torch_npu / NPU / extension here
    assert plugin.status()["active"] is False and "operator" in plugin.status()["reason"]
    assert platform_cls.get_attn_backend_cls(None, _cfg()) == GQA


def test_enabled_wraps_platform_selection_once(monkeypatch):
    monkeypatch.setenv("SPLITKV_VLLM_ENABLE", "1")
    monkeypatch.setenv("SPLITKV_VLLM_IMPL", "torch")
    platform_cls, _ = _fake_vllm_ascend(monkeypatch)
    plugin.register()
    plugin.register()  # every vLLM process calls it; wrapping twice must not stack
    assert plugin.status()["active"] is True
    assert platform_cls.get_attn_backend_cls(None, _cfg()) == plugin.SPLITKV_BACKEND
    assert platform_cls.get_attn_backend_cls(None, _cfg(use_mla=True)) == MLA
    fn = platform_cls.__dict__["get_attn_backend_cls"].__func__
    assert fn._splitkv_original.__name__ == "get_attn_backend_cls"


def _impl(backend, **kw):
    args = dict(num_heads=8, head_size=64, scale=0.125, num_kv_heads=2, alibi_slopes=None, sliding_window=None,
                kv_cache_dtype="auto", logits_soft_cap=None, attn_type="decoder", kv_sharing_target_layer_name=None)
    args.update(kw)
    return backend.SplitKVAscendAttentionBackend.get_impl_cls()(**args)


def test_backend_routes_decode_and_delegates_the_rest(monkeypatch):
    monkeypatch.setenv("SPLITKV_VLLM_IMPL", "torch")
    _, v1 = _fake_vllm_ascend(monkeypatch)
    backend = importlib.import_module("splitkv_vllm.backend")
    impl = _impl(backend)
    assert isinstance(impl, v1.AscendAttentionBackendImpl)

    step = make_step([1, 1, 1, 1], [3, 130, 256, 600], seed=11, pad_tokens=2)
    impl.key_cache, impl.value_cache = step.key_cache, step.value_cache
    out = torch.zeros_like(step.query)
    impl.forward_impl(step.query, None, None, (step.key_cache, step.value_cache), step.meta, out)
    assert impl.parent_calls == 0 and impl.splitkv_routed_steps == 1
    ref, _ = dense_attention(step.inputs)
    assert np.abs(out[:4].float().numpy() - ref).max() < 2e-3

    mixed = make_step([1, 20], [10, 20], seed=12)
    impl.forward_impl(mixed.query, None, None, None, mixed.meta, torch.zeros_like(mixed.query))
    assert impl.parent_calls == 1

    sinks = _impl(backend, sinks=torch.zeros(8))
    sinks.key_cache, sinks.value_cache = step.key_cache, step.value_cache
    sinks.forward_impl(step.query, None, None, None, step.meta, torch.zeros_like(step.query))
    assert sinks.parent_calls == 1

    capped = _impl(backend, logits_soft_cap=50.0)
    assert "soft cap" in capped._splitkv_layer.layer_unsupported


def test_backend_keeps_context_parallel_impls(monkeypatch):
    _, v1 = _fake_vllm_ascend(monkeypatch)
    backend = importlib.import_module("splitkv_vllm.backend")
    monkeypatch.setattr(v1.AscendAttentionBackend, "impl", v1.AscendAttentionDCPImpl)
    assert backend.SplitKVAscendAttentionBackend.get_impl_cls() is v1.AscendAttentionDCPImpl
    assert backend.SplitKVAscendAttentionBackend.get_builder_cls() is backend.SplitKVAscendMetadataBuilder
    dcp_builder = type("AscendAttentionDCPMetadataBuilder", (v1.AscendAttentionMetadataBuilder,), {})
    monkeypatch.setattr(v1.AscendAttentionBackend, "builder", dcp_builder)
    assert backend.SplitKVAscendAttentionBackend.get_builder_cls() is dcp_builder
