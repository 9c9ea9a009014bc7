"""The plugin's inventory of vLLM Ascend names, checked on real vLLM Ascend sources (by their syntax
tree: nothing is imported, no NPU needed).

``SPLITKV_VLLM_ASCEND_SRC`` names checkout roots (``os.pathsep``-separated: a git checkout, an unpacked
release sdist); skipped when unset. Each test is one fact the plugin relies on (``docs/vllm-ascend.md``,
"Tested versions"): run against a new vLLM Ascend before widening ``splitkv_vllm.plugin.TESTED_VERSIONS``.
"""

from __future__ import annotations

import ast
import os

import pytest

from splitkv_vllm import plugin

ROOTS = [r for r in os.environ.get("SPLITKV_VLLM_ASCEND_SRC", "").split(os.pathsep) if r]
pytestmark = pytest.mark.skipif(not ROOTS, reason="SPLITKV_VLLM_ASCEND_SRC names no vLLM Ascend checkout")

# the AscendMetadata fields the adapter, the graph path and the upstream backend read
METADATA_FIELDS = ("attn_state", "num_actual_tokens", "num_prefills", "num_decodes", "seq_lens", "seq_lens_list",
                   "actual_seq_lengths_q", "query_start_loc", "block_tables", "causal")


def tree(root: str, path: str) -> ast.Module:
    with open(os.path.join(root, path)) as f:
        return ast.parse(f.read())


def cls(mod: ast.Module, name: str) -> ast.ClassDef:
    hit = [n for n in ast.walk(mod) if isinstance(n, ast.ClassDef) and n.name == name]
    assert hit, f"class {name} not found"
    return hit[0]


def method_args(c: ast.ClassDef, name: str) -> list[str]:
    fn = [n for n in c.body if isinstance(n, ast.FunctionDef) and n.name == name]
    assert fn, f"{c.name}.{name} not found"
    return [a.arg for a in fn[0].args.args]


@pytest.fixture(params=ROOTS)
def root(request):
    return request.param


def test_attention_v1_classes_and_signatures(root):
    mod = tree(root, "vllm_ascend/attention/attention_v1.py")
    impl = method_args(cls(mod, "AscendAttentionBackendImpl"), "__init__")
    assert impl[1:][7] == "logits_soft_cap", impl        # backend._SOFT_CAP_POS
    assert method_args(cls(mod, "AscendAttentionBackendImpl"), "forward_impl") == [
        "self", "query", "key", "value", "kv_cache", "attn_metadata", "output"]
    assert method_args(cls(mod, "AscendAttentionMetadataBuilder"), "build")[:4] == [
        "self", "common_prefix_len", "common_attn_metadata", "fast_build"]
    assert method_args(cls(mod, "AscendAttentionMetadataBuilder"), "__init__")[:5] == [
        "self", "kv_cache_spec", "layer_names", "vllm_config", "device"]
    fields = {n.target.id for n in cls(mod, "AscendMetadata").body if isinstance(n, ast.AnnAssign)}
    assert set(METADATA_FIELDS) <= fields, set(METADATA_FIELDS) - fields
    states = {n.targets[0].id for n in cls(mod, "AscendAttentionState").body if isinstance(n, ast.Assign)}
    assert {"DecodeOnly", "SpecDecoding", "ChunkedPrefill", "PrefillNoCache", "PrefillCacheHit"} <= states
    blocks = [n for n in cls(mod, "AscendAttentionBackend").body
              if isinstance(n, ast.FunctionDef) and n.name == "get_supported_kernel_block_sizes"]
    assert blocks and "[128]" in ast.unparse(blocks[0]), "the 128-token kernel block the reserve assumes"
    names = {a.asname or a.name for n in ast.walk(mod) if isinstance(n, ast.ImportFrom) for a in n.names}
    assert "record_attention_compute_start" in names, "the KV-pool fence the routed steps record"
    cls(mod, "AscendC8AttentionBackendImpl")


def test_platform_selector(root):
    mod = tree(root, "vllm_ascend/platform.py")
    c = cls(mod, "NPUPlatform")
    assert method_args(c, "get_attn_backend_cls") == ["cls", "selected_backend", "attn_selector_config", "num_heads"]
    assert plugin.ASCEND_GQA_BACKEND in ast.unparse(c)


def test_forward_context_flags(root):
    mod = tree(root, "vllm_ascend/ascend_forward_context.py")
    proxy = cls(mod, "_ExtraForwardContextProxy")
    attrs = [n for n in proxy.body if isinstance(n, ast.Assign) and n.targets[0].id == "extra_attrs"]
    values = {e.value for e in attrs[0].value.elts}
    assert {"capturing", "is_draft_model"} <= values
    assert any(isinstance(n, ast.Assign) and getattr(n.targets[0], "id", None) == "_EXTRA_CTX" for n in mod.body)


def test_graph_sizes_and_descriptor_patch(root):
    patch = tree(root, "vllm_ascend/patch/worker/patch_cudagraph.py")
    assert any(isinstance(n, ast.FunctionDef) and n.name == "_create_padded_batch_descriptor" for n in ast.walk(patch))
    comp = ast.unparse(tree(root, "vllm_ascend/compilation/compiler_interface.py"))
    # splitkv_vllm.graph.decode_sizes follows this rule
    assert "max_num_tokens >= x >= uniform_decode_query_len" in comp


def test_device_type_is_asked_where_the_gate_looks(root):
    found = []
    for path in ("vllm_ascend/device/device_config.py", "vllm_ascend/utils.py"):
        if os.path.exists(os.path.join(root, path)):
            mod = tree(root, path)
            if any(isinstance(n, ast.FunctionDef) and n.name == "get_ascend_device_type" for n in mod.body):
                found.append(path)
    assert found, "get_ascend_device_type in neither place plugin.device_type_unsupported asks"
