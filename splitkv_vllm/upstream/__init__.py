"""How our op would land inside vLLM Ascend: a backend of its own, as vLLM Ascend added FA3.

See ``docs/vllm-ascend-upstream.md``. The change has three parts, all our own text:

* :mod:`splitkv_vllm.upstream.splitkv_v1`: the new module ``vllm_ascend/attention/splitkv_v1.py``
  (backend, implementation, metadata builder);
* :data:`EDITS` to two existing files: the ``additional_config`` switch in ``AscendConfig.__init__``
  and one branch in ``NPUPlatform.get_attn_backend_cls`` (before its backend map, after the FA3
  branch), which calls :data:`PLATFORM_FUNCTION`, appended to ``platform.py``;
* the unit test ``tests/ut/attention/test_attention_splitkv.py``
  (:mod:`splitkv_vllm.upstream.test_attention_splitkv`, unittest style with torch_npu absent).

:data:`RECORDED` lists the facts of vLLM Ascend the edits rely on (at the versions in
:data:`splitkv_vllm.plugin.TESTED_VERSIONS`); :func:`apply` applies the edits of a file to its text
and fails, naming the anchor, when vLLM Ascend has moved on. ``tests/test_vllm_upstream.py`` applies
them to stand-ins built from :data:`RECORDED` (and to real checkouts named by
``SPLITKV_VLLM_ASCEND_SRC``), and runs the backend module on the stand-in vLLM Ascend.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

RECORDED = {
    "ascend_config": "vllm_ascend/ascend_config.py",
    "platform": "vllm_ascend/platform.py",
    # AscendConfig.__init__(self, vllm_config): additional_config = vllm_config.additional_config or {}
    "ascend_config_init": "def __init__(self, vllm_config: \"VllmConfig\"):",
    # NPUPlatform.get_attn_backend_cls: the GQA/MLA/SFA/DSA string map, after the FA3 branch
    "backend_map_line": "backend_map = {",
    # names platform.py imports at module level that PLATFORM_FUNCTION uses
    "platform_names": ("util", "get_ascend_device_type", "AscendDeviceType", "logger"),
    # AscendMetadata fields the backend reads
    "metadata_fields": ("attn_state", "num_prefills", "causal", "seq_lens_list", "actual_seq_lengths_q",
                        "block_tables"),
    "attn_states": ("PrefillNoCache", "PrefillCacheHit", "DecodeOnly", "ChunkedPrefill", "SpecDecoding"),
    # AscendAttentionBackendImpl attributes the backend reads
    "impl_attributes": ("num_heads", "num_kv_heads", "head_size", "scale", "sliding_window", "alibi_slopes", "sinks",
                        "attn_type", "kv_cache_dtype", "key_cache", "value_cache", "vllm_config"),
}

SWITCH = "enable_splitkv_decode"   # additional_config key (a boolean, default False)
BACKEND = "vllm_ascend.attention.splitkv_v1.AscendSplitKVBackend"
MODULE_PATH = "vllm_ascend/attention/splitkv_v1.py"
UT_PATH = "tests/ut/attention/test_attention_splitkv.py"
OP = "torch.ops.splitkv_ascend.decode_attention"  # registered when ascend_ops loads


@dataclass(frozen=True)
class Edit:
    file: str       # a key of RECORDED ("ascend_config", "platform")
    anchor: str     # a line (stripped) the lines go after (before, when ``before``); the first match
    lines: tuple    # inserted with the anchor's indentation (a ``def ...:`` anchor: its body's)
    why: str
    before: bool = False


# Appended to platform.py (module level, next to _validate_fa3_backend).
PLATFORM_FUNCTION = f'''

def _validate_splitkv_backend(key, _attn_selector_config):
    """Whether the split-KV decode backend serves this selection (additional_config {SWITCH})."""
    from vllm_ascend.ascend_config import get_ascend_config

    if not getattr(get_ascend_config(), "{SWITCH}", False):
        return False
    if key != (False, False):
        raise ValueError("The split-KV decode backend does not support MLA, SFA or DSA.")
    if get_ascend_device_type() not in (AscendDeviceType.A2, AscendDeviceType.A3):
        raise ValueError("The split-KV decode backend needs an Atlas A2 or A3 NPU (its kernels are built for them).")
    if util.find_spec("ascend_ops") is None:
        raise ValueError(
            "ascend_ops is not installed but the split-KV decode backend is requested ({SWITCH}). "
            "Install the splitkv package or unset {SWITCH}."
        )
    logger.info("Split-KV decode attention is enabled for decode-only steps.")
    return True
'''

EDITS = (
    Edit("ascend_config", RECORDED["ascend_config_init"],
         (f"self.{SWITCH} = bool((vllm_config.additional_config or {{}}).get(\"{SWITCH}\", False))",),
         "the switch, read like vLLM Ascend's other additional_config switches"),
    Edit("platform", RECORDED["backend_map_line"],
         ("if _validate_splitkv_backend(key, attn_selector_config):",
          f"    return \"{BACKEND}\""),
         "the selector branch: after FA3 (which wins when both are on), before the GQA/MLA map", before=True),
)


class AnchorMissing(ValueError):
    pass


def apply(file_key: str, text: str) -> str:
    """``text`` with the edits of ``file_key`` applied (the inserted lines take the anchor's indentation;
    ``platform`` also gets :data:`PLATFORM_FUNCTION` at its end)."""
    lines = text.splitlines()
    for edit in (e for e in EDITS if e.file == file_key):
        idx = next((i for i, ln in enumerate(lines) if ln.strip() == edit.anchor.strip()), None)
        if idx is None:
            raise AnchorMissing(f"{RECORDED[file_key]}: anchor {edit.anchor!r} not found ({edit.why})")
        indent = lines[idx][:len(lines[idx]) - len(lines[idx].lstrip())]
        if edit.anchor.rstrip().endswith(":"):  # a def line: insert as the body's first statements
            nxt = next(ln for ln in lines[idx + 1:] if ln.strip())
            indent = nxt[:len(nxt) - len(nxt.lstrip())]
        at = idx if edit.before else idx + 1
        lines[at:at] = [indent + ln for ln in edit.lines]
    out = "\n".join(lines) + "\n"
    return out + PLATFORM_FUNCTION if file_key == "platform" else out


def module_source() -> str:
    """The text of the new backend module (``vllm_ascend/attention/splitkv_v1.py``)."""
    with open(os.path.join(os.path.dirname(__file__), "splitkv_v1.py")) as f:
        return f.read()
