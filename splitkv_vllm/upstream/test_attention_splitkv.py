"""Unit tests of the split-KV decode backend, in vLLM Ascend's style (proposed
``tests/ut/attention/test_attention_splitkv.py``): no NPU, the parent implementation's constructor and
``forward_impl`` and the ``ascend_ops`` wrapper are mocked.

Here they run against the stand-in vLLM Ascend of ``tests/test_vllm_upstream.py``, which registers
:mod:`splitkv_vllm.upstream.splitkv_v1` as ``vllm_ascend.attention.splitkv_v1``; upstream, the base
class is ``tests.ut.base.TestBase``.
"""

from __future__ import annotations

import types
import unittest
from unittest import mock

import torch

MODULE = "vllm_ascend.attention.splitkv_v1"


def _config(mode="PIECEWISE", enforce_eager=False, dtype=torch.float16):
    return types.SimpleNamespace(compilation_config=types.SimpleNamespace(cudagraph_mode=types.SimpleNamespace(name=mode)),
                                 model_config=types.SimpleNamespace(enforce_eager=enforce_eager, dtype=dtype))


def _parent_init(self, *args, vllm_config=None, **kw):
    self.vllm_config = vllm_config or _config()
    self.num_heads, self.num_kv_heads, self.head_size, self.scale = kw.get("num_heads", 8), 2, kw.get("head_size", 64), 0.125
    self.sliding_window, self.alibi_slopes, self.sinks = kw.get("sliding_window"), None, None
    self.attn_type, self.kv_cache_dtype, self.enable_c8_quant = "decoder", "auto", False
    self.key_cache = self.value_cache = None


class TestAscendSplitKVBackend(unittest.TestCase):
    def setUp(self):
        import importlib

        self.mod = importlib.import_module(MODULE)
        self.v1 = importlib.import_module("vllm_ascend.attention.attention_v1")
        patcher = mock.patch.object(self.v1.AscendAttentionBackendImpl, "__init__", _parent_init)
        patcher.start()
        self.addCleanup(patcher.stop)

    def _impl(self, **kw):
        return self.mod.AscendSplitKVImpl(**kw)

    def _meta(self, num_prefills=0, state="DecodeOnly"):
        return types.SimpleNamespace(num_prefills=num_prefills, causal=True, attn_state=types.SimpleNamespace(name=state),
                                     actual_seq_lengths_q=[1, 2], seq_lens_list=[5, 300],
                                     block_tables=torch.zeros(2, 4, dtype=torch.int32))

    def test_backend_hands_out_its_impl_and_builder(self):
        self.assertIs(self.mod.AscendSplitKVBackend.get_impl_cls(), self.mod.AscendSplitKVImpl)
        self.assertIs(self.mod.AscendSplitKVBackend.get_builder_cls(), self.mod.AscendSplitKVMetadataBuilder)

    def test_full_graph_modes_are_refused(self):
        for mode in ("FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE"):
            with self.assertRaisesRegex(ValueError, mode):
                self._impl(vllm_config=_config(mode))
        self._impl(vllm_config=_config("FULL_DECODE_ONLY", enforce_eager=True))
        self._impl(vllm_config=_config("PIECEWISE"))

    def test_unsupported_layers_keep_the_default_path(self):
        self.assertIn("sliding window", self._impl(sliding_window=128).splitkv_unsupported)
        self.assertIn("head dim 76", self._impl(head_size=76).splitkv_unsupported)
        self.assertIn("float64", self._impl(vllm_config=_config(dtype=torch.float64)).splitkv_unsupported)
        self.assertIsNone(self._impl().splitkv_unsupported)

    def test_builder_marks_only_decode_only_steps(self):
        with mock.patch.object(self.v1.AscendAttentionMetadataBuilder, "__init__", lambda self, *a, **k: None), \
             mock.patch.object(self.v1.AscendAttentionMetadataBuilder, "build") as parent_build:
            builder = self.mod.AscendSplitKVMetadataBuilder()
            parent_build.return_value = self._meta()
            self.assertIsNotNone(builder.build(0, None).splitkv_step)
            parent_build.return_value = self._meta(num_prefills=1, state="ChunkedPrefill")
            self.assertIsNone(builder.build(0, None).splitkv_step)

    def test_capture_and_unrouted_steps_go_to_the_parent(self):
        impl = self._impl()
        impl.key_cache = impl.value_cache = torch.zeros(4, 128, 2, 64, dtype=torch.float16)
        meta = self._meta()
        meta.splitkv_step = mock.MagicMock()
        ctx = types.SimpleNamespace(capturing=True)
        with mock.patch.object(self.v1.AscendAttentionBackendImpl, "forward_impl") as parent, \
             mock.patch("vllm_ascend.ascend_forward_context._EXTRA_CTX", ctx):
            impl.forward_impl(None, None, None, None, meta, None)
            self.assertEqual(parent.call_count, 1)
            meta.splitkv_step.run.assert_not_called()
            ctx.capturing = False
            impl.forward_impl(None, None, None, None, meta, None)
            meta.splitkv_step.run.assert_called_once()
            impl.forward_impl(None, None, None, None, types.SimpleNamespace(splitkv_step=None), None)
            self.assertEqual(parent.call_count, 2)

    def test_a_step_plans_once_and_the_layers_share_the_wrapper(self):
        impl = self._impl()
        impl.key_cache = impl.value_cache = torch.zeros(4, 128, 2, 64, dtype=torch.float16)
        wrappers = {}
        step = self.mod.SplitKVStep(self._meta(), wrappers)
        query, output = torch.zeros(2, 8, 64, dtype=torch.float16), torch.zeros(2, 8 * 64, dtype=torch.float16)
        with mock.patch("ascend_ops.AscendDecodeWrapper") as wrapper_cls:
            w = wrapper_cls.return_value
            w.host_plan = None
            w.set_plan.side_effect = lambda plan, **k: setattr(w, "host_plan", plan)
            w.run.side_effect = lambda q, *a, out=None, **k: (out, None)
            for _ in range(3):   # three layers of one step
                step.run(impl, query, output)
            self.assertEqual(wrapper_cls.call_count, 1)
            self.assertEqual(w.set_plan.call_count, 1)
            self.assertEqual(w.run.call_count, 3)
            self.assertFalse(w.set_plan.call_args.kwargs["validate"])
            step.meta.seq_lens_list = [6, 301]   # rewritten in place (v2 speculator): a new plan
            step.run(impl, query, output)
            self.assertEqual(w.set_plan.call_count, 2)
            self.assertEqual(w.set_plan.call_args.kwargs["seq_lens"].tolist(), [6, 301])


if __name__ == "__main__":
    unittest.main()
