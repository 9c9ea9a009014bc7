"""The upstream route (``splitkv_vllm.upstream``): a split-KV backend module, one selector branch, an
``additional_config`` switch, the unit tests to ship with them.

* The edits are applied to stand-ins of ``platform.py`` / ``ascend_config.py`` written here from
  :data:`splitkv_vllm.upstream.RECORDED`, and the edited selector is run: the switch selects the
  backend; MLA, an A5 NPU or a missing ``ascend_ops`` are refused as FA3's selection refuses them.
* ``SPLITKV_VLLM_ASCEND_SRC`` (checkout roots, ``os.pathsep``-separated) applies them to real vLLM
  Ascend files as well (they must apply and parse); skipped when unset.
* The backend module runs on the stand-in vLLM Ascend of ``test_vllm_plugin.py`` (registered as
  ``vllm_ascend.attention.splitkv_v1``): its unit tests (``test_attention_splitkv.py``, vLLM Ascend's
  style), and a decode step through the operator's CPU kernel against the float64 reference with no
  device-to-host read. Not run here: a real vLLM Ascend, an NPU.
"""

import ast
import enum
import importlib
import os
import sys
import types
import unittest

import numpy as np
import pytest
torch = pytest.importorskip("torch")

from splitkv_common.reference import dense_attention  # noqa: E402
from splitkv_vllm import upstream  # noqa: E402
from test_vllm_eager import _device_tensors, count_device_reads  # noqa: E402
from test_vllm_plugin import _fake_vllm_ascend, fresh_plugin_state, vllm_config  # noqa: E402, F401
from test_vllm_shapes import make_step  # noqa: E402

GQA = "vllm_ascend.attention.attention_v1.AscendAttentionBackend"
FA3 = "vllm_ascend.attention.fa3_v1.AscendFABackend"


class AscendDeviceType(enum.Enum):
    A2 = 0
    A3 = 1
    _310P = 2
    A5 = 3


def platform_standin() -> str:
    return "\n".join([
        "class NPUPlatform:",
        "    @classmethod",
        "    def get_attn_backend_cls(cls, selected_backend, attn_selector_config, num_heads=None):",
        "        key = (attn_selector_config.use_mla, attn_selector_config.use_sparse)",
        "        if _validate_fa3_backend(key, attn_selector_config):",
        f"            return \"{FA3}\"",
        f"        {upstream.RECORDED['backend_map_line']}",
        f"            (False, False): \"{GQA}\",",
        "            (True, False): 'mla',",
        "        }",
        "        return backend_map[key]",
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


def selector(monkeypatch, switch, device=AscendDeviceType.A2, has_ascend_ops=True):
    cfg_ns = {"VllmConfig": object}
    exec(compile(upstream.apply("ascend_config", ascend_config_standin()), "ascend_config", "exec"), cfg_ns)
    ascend_config = cfg_ns["AscendConfig"](types.SimpleNamespace(additional_config={upstream.SWITCH: switch}))
    mod = types.ModuleType("vllm_ascend.ascend_config")
    mod.get_ascend_config = lambda: ascend_config
    monkeypatch.setitem(sys.modules, "vllm_ascend", types.ModuleType("vllm_ascend"))
    monkeypatch.setitem(sys.modules, "vllm_ascend.ascend_config", mod)
    util = types.SimpleNamespace(find_spec=lambda name: object() if has_ascend_ops and name == "ascend_ops" else None)
    ns = {"_validate_fa3_backend": lambda key, cfg: False, "util": util, "AscendDeviceType": AscendDeviceType,
          "get_ascend_device_type": lambda: device, "logger": types.SimpleNamespace(info=lambda *a: None)}
    exec(compile(upstream.apply("platform", platform_standin()), "platform", "exec"), ns)
    return ns["NPUPlatform"]


def _sel(use_mla=False):
    return types.SimpleNamespace(use_mla=use_mla, use_sparse=False)


def test_the_switch_selects_the_backend(monkeypatch):
    assert selector(monkeypatch, True).get_attn_backend_cls(None, _sel()) == upstream.BACKEND
    assert selector(monkeypatch, False).get_attn_backend_cls(None, _sel()) == GQA
    assert selector(monkeypatch, False).get_attn_backend_cls(None, _sel(use_mla=True)) == "mla"


@pytest.mark.parametrize("kw, sel, words", [
    ({}, _sel(use_mla=True), "MLA"),
    (dict(device=AscendDeviceType.A5), _sel(), "A2 or A3"),
    (dict(has_ascend_ops=False), _sel(), "ascend_ops is not installed"),
])
def test_what_it_cannot_serve_is_refused_at_selection(monkeypatch, kw, sel, words):
    with pytest.raises(ValueError, match=words):
        selector(monkeypatch, True, **kw).get_attn_backend_cls(None, sel)


def test_a_moved_anchor_is_named():
    with pytest.raises(upstream.AnchorMissing, match="backend_map"):
        upstream.apply("platform", "class NPUPlatform:\n    pass\n")


ROOTS = [r for r in os.environ.get("SPLITKV_VLLM_ASCEND_SRC", "").split(os.pathsep) if r]


@pytest.mark.skipif(not ROOTS, reason="SPLITKV_VLLM_ASCEND_SRC names no vLLM Ascend checkout")
@pytest.mark.parametrize("root", ROOTS)
def test_edits_apply_to_a_real_checkout(root):
    for key in ("platform", "ascend_config"):
        with open(os.path.join(root, upstream.RECORDED[key])) as f:
            text = f.read()
        tree = ast.parse(upstream.apply(key, text))
        if key == "platform":
            bound = {a.asname or a.name for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))
                     for a in n.names} | {"logger"}
            assert set(upstream.RECORDED["platform_names"]) <= bound
    text = open(os.path.join(root, "vllm_ascend/attention/attention_v1.py")).read()
    for name in ("class AscendAttentionBackend(", "class AscendAttentionBackendImpl(",
                 "class AscendAttentionMetadataBuilder(", "def forward_impl(", "record_attention_compute_start"):
        assert name in text, name


@pytest.fixture
def backend_module(monkeypatch):
    """The backend module on the stand-in vLLM Ascend, importable by its upstream name."""
    cfg = vllm_config(mode="PIECEWISE")
    cfg.model_config.enforce_eager = False
    _, v1 = _fake_vllm_ascend(monkeypatch, cfg)
    monkeypatch.delitem(sys.modules, "splitkv_vllm.upstream.splitkv_v1", raising=False)
    mod = importlib.import_module("splitkv_vllm.upstream.splitkv_v1")
    monkeypatch.setitem(sys.modules, "vllm_ascend.attention.splitkv_v1", mod)
    return mod


def test_unit_tests_in_vllm_ascends_style_pass(backend_module):
    from splitkv_vllm.upstream import test_attention_splitkv as ut

    suite = unittest.defaultTestLoader.loadTestsFromModule(ut)
    result = unittest.TextTestRunner(stream=open(os.devnull, "w")).run(suite)
    assert result.testsRun == 6 and result.wasSuccessful(), result.failures + result.errors


def test_a_decode_step_runs_on_the_kernels_without_host_reads(backend_module):
    mod = backend_module
    builder = mod.AscendSplitKVBackend.get_builder_cls()(None, ["l0", "l1"], vllm_config(mode="PIECEWISE"), "cpu")
    args = dict(num_heads=8, head_size=64, scale=0.125, num_kv_heads=2, alibi_slopes=None, sliding_window=None,
                kv_cache_dtype="auto", logits_soft_cap=None, attn_type="decoder", kv_sharing_target_layer_name=None)
    layers = [mod.AscendSplitKVBackend.get_impl_cls()(**args) for _ in range(2)]
    assert [impl.splitkv_unsupported for impl in layers] == [None, None]
    step = make_step([1, 1, 1], [5, 300, 129], seed=31, pad_tokens=1)
    meta = builder.build(0, step.meta)
    outs = []
    with count_device_reads(_device_tensors(step)) as seen:
        for impl in layers:
            impl.key_cache, impl.value_cache = step.key_cache, step.value_cache
            out = torch.zeros(step.query.shape[0], 8 * 64, dtype=step.query.dtype)
            impl.forward_impl(step.query, None, None, None, meta, out)
            outs.append(out)
    assert seen["reads"] == [] and seen["wrappers"] == 1 and seen["set_plan"] == 1
    step.inputs.scale = 0.125
    ref, _ = dense_attention(step.inputs)
    for impl, out in zip(layers, outs):
        assert impl.parent_calls == 0
        assert np.abs(out.view(-1, 8, 64)[:3].float().numpy() - ref).max() < 2e-3
    mixed = make_step([1, 20], [10, 20], seed=32)
    assert builder.build(0, mixed.meta).splitkv_step is None
