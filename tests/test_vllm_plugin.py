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
torch = pytest.importorskip("torch")

from splitkv_common.reference import dense_attention  # noqa: E402
from splitkv_vllm import log, plugin, settings, stats  # noqa: E402
from splitkv_vllm.log import LOGGER_NAME  # noqa: E402
from test_vllm_shapes import AscendAttentionState, make_step  # noqa: E402

GQA = plugin.ASCEND_GQA_BACKEND
MLA = "vllm_ascend.attention.mla_v1.AscendMLABackend"


@pytest.fixture(autouse=True)
def fresh_plugin_state(monkeypatch):
    """Each test starts with no settings read, nothing counted and register() not called."""
    for var in settings.ENV.values():
        monkeypatch.delenv(var, raising=False)
    settings.reset()
    stats.reset()
    plugin._reset_for_tests()
    log._ONCE.clear()
    yield
    settings.reset()
    stats.reset()
    plugin._reset_for_tests()


def vllm_config(additional_config=None, mode="NONE", sizes=(), dtype=torch.float16, block_size=128, max_model_len=4096,
                max_num_seqs=None, num_speculative_tokens=None):
    """The parts of vLLM's VllmConfig the plugin reads."""
    spec = None if num_speculative_tokens is None else types.SimpleNamespace(num_speculative_tokens=num_speculative_tokens)
    return types.SimpleNamespace(
        scheduler_config=types.SimpleNamespace(max_num_seqs=max_num_seqs), speculative_config=spec,
        additional_config=additional_config or {},
        compilation_config=types.SimpleNamespace(cudagraph_mode=CUDAGraphMode[mode], cudagraph_capture_sizes=list(sizes)),
        model_config=types.SimpleNamespace(dtype=dtype, max_model_len=max_model_len),
        cache_config=types.SimpleNamespace(block_size=block_size))


class CUDAGraphMode(__import__("enum").Enum):
    """vLLM's ``vllm.config.CUDAGraphMode`` members (names as vLLM spells them)."""
    NONE = 0
    PIECEWISE = 1
    FULL = 2
    FULL_DECODE_ONLY = (FULL, NONE)
    FULL_AND_PIECEWISE = (FULL, PIECEWISE)

    def has_full_cudagraphs(self):
        return self.name.startswith("FULL")


class AscendDeviceType(__import__("enum").Enum):
    """vLLM Ascend's ``vllm_ascend.device.hardware.AscendDeviceType``."""
    A2 = 0
    A3 = 1
    _310P = 2
    A5 = 3


def _fake_vllm_ascend(monkeypatch, config=None, version="0.23.0.post1", device_type="A2"):
    """Install fake ``vllm_ascend`` modules; returns (platform class, attention_v1 module).

    ``vllm_ascend.ascend_forward_context._EXTRA_CTX`` has the two flags the backend reads
    (``capturing``, ``is_draft_model``); ``attention_v1.record_attention_compute_start`` counts its
    calls in ``v1.fence_calls``; a fake ``vllm.config.get_current_vllm_config`` returns ``config``
    (default: :func:`vllm_config`), which the impl keeps as ``self.vllm_config`` as vLLM Ascend's does;
    ``vllm_ascend._version.__version__`` is ``version``, ``vllm_ascend.utils.get_ascend_device_type()``
    (the 0.23 release's place) answers ``AscendDeviceType[device_type]``."""
    config = config or vllm_config()
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
    v1.fence_calls = 0

    def record_attention_compute_start():
        v1.fence_calls += 1

    v1.record_attention_compute_start = record_attention_compute_start

    class AscendAttentionBackendImpl:
        def __init__(self, num_heads, head_size, scale, num_kv_heads, alibi_slopes, sliding_window, kv_cache_dtype,
                     logits_soft_cap, attn_type, kv_sharing_target_layer_name, sinks=None, **kwargs):
            self.num_heads, self.head_size, self.scale = num_heads, head_size, float(scale)
            self.num_kv_heads, self.alibi_slopes, self.sliding_window = num_kv_heads, alibi_slopes, sliding_window
            self.kv_cache_dtype, self.attn_type, self.sinks = kv_cache_dtype, attn_type, sinks
            self.vllm_config = sys.modules["vllm.config"].get_current_vllm_config()
            self.key_cache = self.value_cache = None
            self.parent_calls = 0

        def forward_impl(self, query, key, value, kv_cache, attn_metadata, output):
            v1.record_attention_compute_start()
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
    vllm = sys.modules.get("vllm") if isinstance(sys.modules.get("vllm"), types.ModuleType) else None
    if vllm is None or not getattr(vllm, "_splitkv_fake", False):
        vllm = types.ModuleType("vllm")
        vllm.__path__ = []
        vllm._splitkv_fake = True
        monkeypatch.setitem(sys.modules, "vllm", vllm)
    vcfg = types.ModuleType("vllm.config")
    vcfg.get_current_vllm_config = lambda: config
    vcfg.CUDAGraphMode = CUDAGraphMode
    monkeypatch.setitem(sys.modules, "vllm.config", vcfg)
    ver = types.ModuleType("vllm_ascend._version")
    ver.__version__ = version
    utils = types.ModuleType("vllm_ascend.utils")
    utils.get_ascend_device_type = lambda: AscendDeviceType[device_type]
    for name, mod in (("vllm_ascend", pkg), ("vllm_ascend.platform", plat), ("vllm_ascend.attention", attn),
                      ("vllm_ascend.attention.attention_v1", v1), ("vllm_ascend.ascend_forward_context", fctx),
                      ("vllm_ascend._version", ver), ("vllm_ascend.utils", utils)):
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
    platform_cls, _ = _fake_vllm_ascend(monkeypatch)
    plugin.register()
    assert platform_cls.get_attn_backend_cls(None, _cfg()) == GQA  # wrapped, but passes everything through
    st = plugin.status()
    assert st["active"] is False and "not switched on" in st["reason"] and st["operator"] == "not checked"


def test_env_zero_does_not_even_wrap(monkeypatch):
    monkeypatch.setenv("SPLITKV_VLLM_ENABLE", "0")
    platform_cls, _ = _fake_vllm_ascend(monkeypatch, vllm_config({"splitkv": {"enable": True}}))
    before = platform_cls.__dict__["get_attn_backend_cls"]
    plugin.register()
    assert platform_cls.__dict__["get_attn_backend_cls"] is before, "the environment overrides additional_config"


def test_enabled_without_vllm_ascend_logs_and_stays_off(monkeypatch, caplog):
    monkeypatch.setenv("SPLITKV_VLLM_ENABLE", "1")
    monkeypatch.setitem(sys.modules, "vllm_ascend", None)  # import fails as if not installed
    with caplog.at_level(logging.WARNING, logger=LOGGER_NAME):
        plugin.register()  # must not raise: vLLM keeps running on its own path
    assert plugin.status()["active"] is False
    assert "vLLM Ascend" in plugin.status()["reason"]
    assert any("stays off" in r.message and r.name == LOGGER_NAME for r in caplog.records)


def test_strict_mode_raises(monkeypatch):
    monkeypatch.setenv("SPLITKV_VLLM_ENABLE", "1")
    monkeypatch.setenv("SPLITKV_VLLM_STRICT", "1")
    monkeypatch.setitem(sys.modules, "vllm_ascend", None)
    with pytest.raises(RuntimeError, match="stays off"):
        plugin.register()


def test_register_neither_queries_the_npu_nor_loads_the_extension(monkeypatch):
    """register() runs in every vLLM process (API server included): the operator check waits for the
    first backend selection, which vLLM makes in a worker."""
    from ascend_ops import runtime

    calls = []
    monkeypatch.setattr(runtime, "runtime_unavailable", lambda *a, **k: calls.append(1) or "no NPU here")
    monkeypatch.setenv("SPLITKV_VLLM_ENABLE", "1")
    platform_cls, _ = _fake_vllm_ascend(monkeypatch)
    plugin.register()
    assert calls == [] and plugin.status()["operator"] == "not checked"
    assert platform_cls.get_attn_backend_cls(None, _cfg()) == GQA  # first use in a worker: checked, stays off
    assert platform_cls.get_attn_backend_cls(None, _cfg()) == GQA
    assert len(calls) == 1, "checked once per process"
    assert plugin.status()["active"] is False and "operator" in plugin.status()["reason"]


def test_enabled_wraps_platform_selection_once(monkeypatch, caplog):
    monkeypatch.setenv("SPLITKV_VLLM_ENABLE", "1")
    monkeypatch.setenv("SPLITKV_VLLM_IMPL", "torch")
    platform_cls, _ = _fake_vllm_ascend(monkeypatch)
    plugin.register()
    plugin.register()  # every vLLM process calls it; wrapping twice must not stack
    with caplog.at_level(logging.INFO, logger="vllm"):
        assert platform_cls.get_attn_backend_cls(None, _cfg()) == plugin.SPLITKV_BACKEND
    assert plugin.status()["active"] is True
    assert platform_cls.get_attn_backend_cls(None, _cfg(use_mla=True)) == MLA
    fn = platform_cls.__dict__["get_attn_backend_cls"].__func__
    assert fn._splitkv_original.__name__ == "get_attn_backend_cls"
    # the activation line goes through the vllm logger tree, where vLLM's handlers are
    line = [r for r in caplog.records if "routed through splitkv" in r.getMessage()]
    assert len(line) == 1 and line[0].name == LOGGER_NAME and LOGGER_NAME.startswith("vllm.")


def test_switched_on_by_additional_config(monkeypatch):
    cfg = vllm_config({"splitkv": {"enable": True, "impl": "torch", "graph_max_splits": 4}})
    platform_cls, _ = _fake_vllm_ascend(monkeypatch, cfg)
    plugin.register()
    assert platform_cls.get_attn_backend_cls(None, _cfg()) == plugin.SPLITKV_BACKEND
    s = settings.current()
    assert (s.enable, s.impl, s.graph_max_splits) == (True, "torch", 4)
    monkeypatch.setenv("SPLITKV_VLLM_GRAPH_MAX_SPLITS", "2")  # environment variables stay as overrides
    assert settings.current().graph_max_splits == 2


def test_bad_settings_never_raise(monkeypatch, caplog):
    monkeypatch.setenv("SPLITKV_VLLM_IMPL", "bogus")
    monkeypatch.setenv("SPLITKV_VLLM_GRAPH_MAX_SPLITS", "-3")
    settings.configure(vllm_config({"splitkv": {"enable": "maybe", "nonsense": 1}}))
    from splitkv_vllm import dispatch, graph

    with caplog.at_level(logging.WARNING, logger=LOGGER_NAME):
        assert dispatch.requested_impl() == "auto"
        assert dispatch.choose_impl(torch.device("cpu")) == "torch"
        assert graph.graph_options()["max_splits"] == settings.DEFAULTS.graph_max_splits
        assert settings.current().enable is False
    text = " ".join(r.getMessage() for r in caplog.records)
    assert "SPLITKV_VLLM_IMPL" in text and "bogus" in text and "nonsense" in text


def test_logger_goes_through_vllm_init_logger(monkeypatch):
    seen = []
    fake_logger_mod = types.ModuleType("vllm.logger")
    fake_logger_mod.init_logger = lambda name: seen.append(name) or logging.getLogger(name)
    _fake_vllm_ascend(monkeypatch)
    monkeypatch.setitem(sys.modules, "vllm.logger", fake_logger_mod)
    plugin.register()
    assert seen == [LOGGER_NAME]


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


def test_routed_steps_record_the_kv_pool_fence_and_are_counted(monkeypatch):
    monkeypatch.setenv("SPLITKV_VLLM_IMPL", "torch")
    _, v1 = _fake_vllm_ascend(monkeypatch)
    backend = importlib.import_module("splitkv_vllm.backend")
    layers = [_impl(backend), _impl(backend)]
    step = make_step([1, 1, 1], [3, 130, 600], seed=13)
    for impl in layers:
        impl.key_cache, impl.value_cache = step.key_cache, step.value_cache
        impl.forward_impl(step.query, None, None, None, step.meta, torch.zeros_like(step.query))
    assert [impl.parent_calls for impl in layers] == [0, 0]
    assert v1.fence_calls == 2, "record_attention_compute_start() before each routed layer, as the parent does"
    snap = stats.snapshot()
    assert snap["routed_steps"] == 1 and snap["routed_layer_calls"] == 2  # one step, two layers


def test_layer_whose_v_head_size_differs_is_refused(monkeypatch, caplog):
    monkeypatch.setenv("SPLITKV_VLLM_IMPL", "torch")
    _, v1 = _fake_vllm_ascend(monkeypatch)
    backend = importlib.import_module("splitkv_vllm.backend")
    caplog.set_level(logging.INFO, logger=LOGGER_NAME)
    impl = _impl(backend)
    step = make_step([1, 1], [10, 20], seed=14)
    impl.key_cache, impl.value_cache = step.key_cache, step.value_cache[..., :32].contiguous()
    if True:
        for _ in range(3):
            impl.forward_impl(step.query, None, None, None, step.meta, torch.zeros_like(step.query))
    assert impl.parent_calls == 3 and impl.splitkv_routed_steps == 0
    lines = [r for r in caplog.records if "V head size 32 differs" in r.getMessage()]
    assert len(lines) == 1, "the reason is logged once"
    assert stats.snapshot()["fallbacks"]["V head size 32 differs from K head size 64"] == 3


def test_window_layers_need_opt_in(monkeypatch):
    monkeypatch.setenv("SPLITKV_VLLM_IMPL", "torch")
    _fake_vllm_ascend(monkeypatch)
    backend = importlib.import_module("splitkv_vllm.backend")
    assert "sliding window" in _impl(backend, sliding_window=128)._splitkv_layer.layer_unsupported
    monkeypatch.setenv("SPLITKV_VLLM_WINDOW", "1")
    layer = _impl(backend, sliding_window=128)._splitkv_layer
    assert layer.layer_unsupported is None and layer.window_left == 128  # vLLM Ascend's FIA band: W + 1 keys


def test_stats_reach_the_driver_through_files_and_rpc(monkeypatch, tmp_path):
    """The counters live in the worker; collective_rpc(worker_stats) or the stats_dir files carry them out."""
    monkeypatch.setenv("SPLITKV_VLLM_STATS_DIR", str(tmp_path))
    monkeypatch.setenv("SPLITKV_VLLM_IMPL", "torch")
    _fake_vllm_ascend(monkeypatch)
    backend = importlib.import_module("splitkv_vllm.backend")
    impl = _impl(backend)
    step = make_step([1, 1], [10, 20], seed=15)
    impl.key_cache, impl.value_cache = step.key_cache, step.value_cache
    impl.forward_impl(step.query, None, None, None, step.meta, torch.zeros_like(step.query))
    files = stats.read_dir(str(tmp_path))  # written at the first routed step, not only at exit
    assert len(files) == 1 and files[0]["routed_steps"] == 1
    rpc = stats.worker_stats(worker=object())
    assert rpc["routed_steps"] == 1 and rpc["pid"] == files[0]["pid"]
    assert rpc["graph_replays"] == 0 and files[0]["graph_replays"] is None, "read from the device by the RPC only"
    assert stats.total([rpc, {"routed_steps": 2, "graph_captures": 1, "graph_replays": 4}]) == {
        "routed_steps": 3, "routed_layer_calls": 1, "graph_captures": 1, "graph_refreshes": 0, "workers": 2,
        "uniform_graph_steps": 0, "graph_replays": 4}
    assert stats.total([rpc, {"routed_steps": 2}])["graph_replays"] is None, "a worker that did not read them"


@pytest.mark.parametrize("version, device_type, env, words", [
    ("0.23.0.post1", "A5", {}, "Ascend A5"),                         # Ascend 950: kernels built for 910B / A3
    ("0.18.0", "A2", {}, "outside the tested versions"),
    ("0.24.0", "A3", {}, "outside the tested versions"),
    ("0.23.0.post1", "A2", {"VLLM_USE_V2_MODEL_RUNNER": "1"}, "v2 model runner"),
])
def test_gates_keep_the_stock_path_with_one_line(monkeypatch, caplog, version, device_type, env, words):
    monkeypatch.setenv("SPLITKV_VLLM_ENABLE", "1")
    monkeypatch.setattr(plugin, "operator_unavailable", lambda: None)   # the operator itself would run
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    platform_cls, _ = _fake_vllm_ascend(monkeypatch, version=version, device_type=device_type)
    plugin.register()
    with caplog.at_level(logging.WARNING, logger="vllm"):
        for _ in range(3):
            assert platform_cls.get_attn_backend_cls(None, _cfg()) == GQA
    lines = [r.getMessage() for r in caplog.records if "stays off" in r.getMessage()]
    assert len(lines) == 1 and words in lines[0], lines
    monkeypatch.setenv("SPLITKV_VLLM_STRICT", "1")
    with pytest.raises(RuntimeError, match=words):
        platform_cls.get_attn_backend_cls(None, _cfg())


@pytest.mark.parametrize("version, device_type", [("0.19.2.dev1637+g182b75ea8", "A2"), ("0.23.0.post1", "A3")])
def test_gates_pass_the_tested_versions_and_chips(monkeypatch, version, device_type):
    monkeypatch.setenv("SPLITKV_VLLM_ENABLE", "1")
    monkeypatch.setattr(plugin, "operator_unavailable", lambda: None)
    platform_cls, _ = _fake_vllm_ascend(monkeypatch, version=version, device_type=device_type)
    plugin.register()
    assert platform_cls.get_attn_backend_cls(None, _cfg()) == plugin.SPLITKV_BACKEND


def test_untested_version_routes_when_asked(monkeypatch):
    monkeypatch.setenv("SPLITKV_VLLM_ENABLE", "1")
    monkeypatch.setenv("SPLITKV_VLLM_UNTESTED_VERSIONS", "1")
    monkeypatch.setattr(plugin, "operator_unavailable", lambda: None)
    platform_cls, _ = _fake_vllm_ascend(monkeypatch, version="0.30.0")
    plugin.register()
    assert platform_cls.get_attn_backend_cls(None, _cfg()) == plugin.SPLITKV_BACKEND
