"""The plugin's eager decode path: no host sync per step, and a fallback instead of a failure.

vLLM Ascend is replaced by the stand-ins of ``test_vllm_plugin.py``; the Ascend operator runs its CPU
kernel. "Device" tensors are the ones vLLM Ascend hands the attention layer (query, KV caches, block
table, device query offsets, output): a read of one of them on the host (``.cpu()``, ``.numpy()``,
``.tolist()``, ``.item()``, ``int()``...) outside the operator's kernel is what a device-to-host copy is
on an NPU, and is counted here.
"""

from __future__ import annotations

import contextlib
import importlib
import logging

import numpy as np
import pytest
import torch

import ascend_ops.wrapper as wrapper_mod
from ascend_ops import ops
from ascend_ops.wrapper import AscendDecodeWrapper
from splitkv_common.reference import dense_attention
from splitkv_vllm import adapter, stats
from device_side import while_running
from test_vllm_plugin import _fake_vllm_ascend, _impl, fresh_plugin_state  # noqa: F401
from test_vllm_shapes import make_step

HOST_READS = ("cpu", "item", "tolist", "numpy", "__array__", "__int__", "__float__", "__bool__", "__index__")


@contextlib.contextmanager
def count_device_reads(device_tensors):
    """Count host reads of ``device_tensors`` (and their views) outside the operator's kernel, calls
    of the shared argument checks (``check_decode_args``), wrappers made and plans set."""
    marked = {t.untyped_storage().data_ptr() for t in device_tensors}
    mp = pytest.MonkeyPatch()
    seen = dict(reads=[], checks=0, wrappers=0, set_plan=0)
    in_kernel = [False]

    def on_device(t):
        return not in_kernel[0] and isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() in marked

    for name in HOST_READS:
        orig = getattr(torch.Tensor, name)

        def guarded(self, *a, _orig=orig, _name=name, **k):
            if on_device(self):
                seen["reads"].append(_name)
            return _orig(self, *a, **k)

        mp.setattr(torch.Tensor, name, guarded)
    real_to = torch.Tensor.to

    def to(self, *a, **k):
        dev = k.get("device", a[0] if a else None)
        if on_device(self) and isinstance(dev, (str, torch.device)) and torch.device(dev).type == "cpu":
            seen["reads"].append("to(cpu)")
        return real_to(self, *a, **k)

    mp.setattr(torch.Tensor, "to", to)
    real_check = wrapper_mod.check_decode_args
    kernel = while_running(ops.decode_attention_op, in_kernel, True)

    def check(*a, **k):
        seen["checks"] += 1
        return real_check(*a, **k)

    real_init, real_set_plan = AscendDecodeWrapper.__init__, AscendDecodeWrapper.set_plan

    def init(self, *a, **k):
        seen["wrappers"] += 1
        real_init(self, *a, **k)

    def set_plan(self, *a, **k):
        seen["set_plan"] += 1
        return real_set_plan(self, *a, **k)

    mp.setattr(ops, "decode_attention_op", kernel)
    mp.setattr(wrapper_mod, "check_decode_args", check)
    mp.setattr(AscendDecodeWrapper, "__init__", init)
    mp.setattr(AscendDecodeWrapper, "set_plan", set_plan)
    try:
        yield seen
    finally:
        mp.undo()


def _ascend_backend(monkeypatch, **env):
    """``splitkv_vllm.backend`` on the Ascend route of a faked vLLM Ascend, with ``env`` set and no
    eager wrapper kept from an earlier test."""
    monkeypatch.setenv("SPLITKV_VLLM_IMPL", "ascend")
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setattr(adapter, "_EAGER_WRAPPERS", {})
    _fake_vllm_ascend(monkeypatch)
    return importlib.import_module("splitkv_vllm.backend")


def _layers(monkeypatch, **env):
    backend = _ascend_backend(monkeypatch, **env)
    # two layers of the same constants (one wrapper), one of another scale (a second one)
    return [_impl(backend), _impl(backend), _impl(backend, scale=0.1)]


def _run_step(layers, step):
    outs = []
    for impl in layers:
        impl.key_cache, impl.value_cache = step.key_cache, step.value_cache
        out = torch.zeros_like(step.query)
        impl.forward_impl(step.query, None, None, None, step.meta, out)
        outs.append(out)
    return outs


def _device_tensors(step):
    return [step.query, step.key_cache, step.value_cache, step.meta.block_tables, step.meta.query_start_loc]


def _check(layers, step, outs):
    for impl, out in zip(layers, outs):
        step.inputs.scale = impl.scale
        ref, _ = dense_attention(step.inputs)
        assert np.abs(out[:ref.shape[0]].float().numpy() - ref).max() < 2e-3


def test_routed_eager_step_makes_no_device_to_host_copy(monkeypatch):
    layers = _layers(monkeypatch)
    steps = [make_step([1, 1, 1], [3, 130, 600], seed=21, pad_tokens=1),
             make_step([2, 2], [257, 40], seed=22, decode_threshold=2)]
    per_step = []
    for step in steps:
        with count_device_reads(_device_tensors(step)) as seen:
            outs = _run_step(layers, step)
        per_step.append(seen)
        _check(layers, step, outs)
    assert [impl.parent_calls for impl in layers] == [0, 0, 0]
    assert [s["reads"] for s in per_step] == [[], []], "host syncs per routed eager step: 0"
    assert [s["checks"] for s in per_step] == [0, 0], "no check_decode_args (host reads) per layer"
    assert [s["wrappers"] for s in per_step] == [2, 0], "one wrapper per set of layer constants, made once"
    assert [s["set_plan"] for s in per_step] == [2, 2], "the step's plan given once per wrapper, not per layer"
    assert stats.snapshot()["routed_steps"] == 2


def test_debug_checks_read_the_block_table_back(monkeypatch):
    """The counter above sees a device-to-host copy when there is one: the debug mode's page-id checks."""
    layers = _layers(monkeypatch, SPLITKV_VLLM_DEBUG_CHECKS="1")
    step = make_step([1, 1], [3, 300], seed=23)
    with count_device_reads(_device_tensors(step)) as seen:
        outs = _run_step(layers, step)
    _check(layers, step, outs)
    assert seen["checks"] == 3 and seen["reads"], "debug mode: checked on the host, per layer"
    step.meta.block_tables[1, 0] = 10_000  # a page past the cache: the debug checks refuse it
    _run_step(layers[:1], step)
    assert layers[0].parent_calls == 1 and "error: ValueError" in stats.snapshot()["fallbacks"]


def test_non_contiguous_query_is_routed(monkeypatch):
    layers = _layers(monkeypatch)
    step = make_step([1, 1, 1], [3, 130, 600], seed=24)
    wide = torch.zeros(step.query.shape[0], step.query.shape[1], 2 * step.query.shape[2], dtype=step.query.dtype)
    wide[..., :step.query.shape[2]] = step.query
    step.query = wide[..., :step.query.shape[2]]
    assert not step.query.is_contiguous()
    outs = _run_step(layers, step)
    assert [impl.parent_calls for impl in layers] == [0, 0, 0]
    _check(layers, step, outs)


def test_what_the_op_refuses_goes_to_the_stock_path(monkeypatch, caplog):
    caplog.set_level(logging.INFO, logger="vllm")
    layers = _layers(monkeypatch)
    backend = importlib.import_module("splitkv_vllm.backend")
    odd = _impl(backend, head_size=76)          # under 256, not a multiple of 8: decided before routing
    assert "head dim 76" in odd._splitkv_layer.layer_unsupported
    step = make_step([1, 1], [3, 300], seed=25, head_size=76)
    odd.key_cache, odd.value_cache = step.key_cache, step.value_cache
    odd.forward_impl(step.query, None, None, None, step.meta, torch.zeros_like(step.query))
    assert odd.parent_calls == 1

    f64 = make_step([1, 1], [3, 300], seed=26)     # a dtype the kernels do not take: checked once caches are bound
    impl = layers[0]
    impl.key_cache, impl.value_cache = f64.key_cache.double(), f64.value_cache.double()
    impl.forward_impl(f64.query.double(), None, None, None, f64.meta, torch.zeros_like(f64.query.double()))
    assert impl.parent_calls == 1 and "float64" in impl._splitkv_cache_why

    def boom(*a, **k):
        raise RuntimeError("launch failed")

    monkeypatch.setattr(AscendDecodeWrapper, "run", boom)
    plain = layers[1]
    step = make_step([1, 1], [3, 300], seed=27)
    for _ in range(2):
        _run_step([plain], step)
    assert plain.parent_calls == 2 and plain.splitkv_routed_steps == 0
    lines = [r.getMessage() for r in caplog.records if "raised RuntimeError" in r.getMessage()]
    assert len(lines) == 1, "logged once"
    monkeypatch.setenv("SPLITKV_VLLM_STRICT", "1")
    with pytest.raises(RuntimeError, match="launch failed"):
        _run_step([plain], step)
