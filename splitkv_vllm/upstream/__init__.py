"""How our op would land inside vLLM Ascend: the edits, as our own data, and the facts they rely on.

See ``docs/vllm-ascend-upstream.md``. Nothing here is vLLM Ascend code: :data:`RECORDED` lists the
few facts of vLLM Ascend (at :data:`splitkv_vllm.VLLM_ASCEND_REFERENCE`) that the edits depend on:
field names of ``AscendMetadata``, the signature of ``AscendAttentionBackendImpl.forward_impl``, the
first statement of its body, how ``AscendConfig`` reads ``additional_config``. :data:`EDITS` are the
edits, each an anchor (a line that must exist) and the lines we insert after it. :func:`apply`
applies them to a file's text and fails, naming the anchor, when vLLM Ascend has moved on; the test
(``tests/test_vllm_upstream.py``) applies them to a stand-in built from :data:`RECORDED` and runs it.
"""

from __future__ import annotations

from dataclasses import dataclass

RECORDED = {
    "attention_v1": "vllm_ascend/attention/attention_v1.py",
    "ascend_config": "vllm_ascend/ascend_config.py",
    # AscendMetadata fields the decode call reads
    "metadata_fields": ("attn_state", "num_actual_tokens", "num_prefills", "num_decodes", "seq_lens_list",
                        "actual_seq_lengths_q", "query_start_loc", "block_tables", "causal"),
    "attn_states": ("PrefillNoCache", "PrefillCacheHit", "DecodeOnly", "ChunkedPrefill", "SpecDecoding"),
    # AscendAttentionBackendImpl.forward_impl(self, query, key, value, kv_cache, attn_metadata, output)
    "forward_impl_params": ("self", "query", "key", "value", "kv_cache", "attn_metadata", "output"),
    "forward_impl_first_statement": "record_attention_compute_start()",
    "impl_attributes": ("num_heads", "num_kv_heads", "head_size", "scale", "sliding_window", "alibi_slopes", "sinks",
                        "key_cache", "value_cache", "vllm_config"),
    # AscendConfig.__init__: additional_config = vllm_config.additional_config or {}; self.x = additional_config.get(...)
    "ascend_config_init": "def __init__(self, vllm_config: \"VllmConfig\"):",
    "ascend_config_reads": "additional_config.get(",
}

SWITCH = "enable_splitkv_decode"   # additional_config key (a boolean, default False)
OP = "torch.ops.splitkv_ascend.decode_attention"  # registered when ascend_ops loads; planned by ascend_ops.decode_attention


@dataclass(frozen=True)
class Edit:
    file: str       # a key of RECORDED ("attention_v1", "ascend_config")
    anchor: str     # a line (stripped) after which ``lines`` go; the first match
    lines: tuple    # inserted, indented relative to the anchor's body
    why: str


EDITS = (
    Edit("ascend_config", RECORDED["ascend_config_init"],
         (f"self.{SWITCH} = bool((vllm_config.additional_config or {{}}).get(\"{SWITCH}\", False))",),
         "the switch, read like vLLM Ascend's other additional_config switches"),
    Edit("attention_v1", RECORDED["forward_impl_first_statement"],
         ("if self._splitkv_decode_routed(attn_metadata):",
          "    return self._splitkv_decode(query, attn_metadata, output)"),
         "chosen in forward_impl, after the KV-pool fence, before the paged-attention / FIA choice"),
)

# Methods added to AscendAttentionBackendImpl (our code: the eligibility rule and the op call).
IMPL_METHODS = '''
def _splitkv_decode_routed(self, attn_metadata):
    from vllm_ascend.ascend_config import get_ascend_config
    if not getattr(get_ascend_config(), "enable_splitkv_decode", False):
        return False
    if attn_metadata is None or attn_metadata.num_prefills or not attn_metadata.causal:
        return False
    if attn_metadata.attn_state.name not in ("DecodeOnly", "SpecDecoding", "ChunkedPrefill"):
        return False
    if self.alibi_slopes is not None or self.sinks is not None or self.sliding_window is not None:
        return False
    return self.key_cache is not None and self.value_cache.shape[-1] == self.key_cache.shape[-1]

def _splitkv_decode(self, query, attn_metadata, output):
    import torch
    import ascend_ops  # loads the extension: registers torch.ops.splitkv_ascend.decode_attention
    n = int(attn_metadata.actual_seq_lengths_q[-1])
    qsl = torch.tensor([0] + list(attn_metadata.actual_seq_lengths_q), dtype=torch.int32)
    seq_lens = torch.tensor(attn_metadata.seq_lens_list[:qsl.numel() - 1], dtype=torch.int32)
    out, _ = ascend_ops.decode_attention(
        query[:n].view(n, self.num_heads, self.head_size), self.key_cache, self.value_cache,
        attn_metadata.block_tables[:seq_lens.numel()], seq_lens, qsl.to(query.device), scale=self.scale)
    output.view(-1, self.num_heads, self.head_size)[:n].copy_(out)
    return output
'''


class AnchorMissing(ValueError):
    pass


def apply(file_key: str, text: str) -> str:
    """``text`` with the edits of ``file_key`` applied (the inserted lines take the anchor's indentation)."""
    lines = text.splitlines()
    for edit in (e for e in EDITS if e.file == file_key):
        idx = next((i for i, ln in enumerate(lines) if ln.strip() == edit.anchor.strip()), None)
        if idx is None:
            raise AnchorMissing(f"{RECORDED[file_key]}: anchor {edit.anchor!r} not found ({edit.why})")
        indent = lines[idx][:len(lines[idx]) - len(lines[idx].lstrip())]
        if edit.anchor.rstrip().endswith(":"):  # a def line: insert as the body's first statements
            nxt = next(ln for ln in lines[idx + 1:] if ln.strip())
            indent = nxt[:len(nxt) - len(nxt.lstrip())]
        lines[idx + 1:idx + 1] = [indent + ln for ln in edit.lines]
    return "\n".join(lines) + "\n"
