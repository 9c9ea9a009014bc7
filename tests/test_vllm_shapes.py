"""Stand-ins shaped exactly as vLLM Ascend passes attention inputs (no vLLM needed).

Follows ``vllm_ascend/attention/attention_v1.py`` (``AscendMetadata``, the builder's ``build()``,
``AscendAttentionBackendImpl.__init__``/``forward``) and ``attention/utils.py`` at the commit in
:data:`splitkv_vllm.VLLM_ASCEND_REFERENCE`:

* requests are ordered decode first (the builder's ``reorder_batch_threshold``);
* ``actual_seq_lengths_q = query_start_loc_cpu[1:].tolist()``; with graph padding the runner
  appends one dummy request so the query lengths sum to the padded token count, and the builder
  pads ``seq_lens``/``seq_lens_list`` with 1 and ``block_tables`` with zero rows to match;
* KV caches ``[num_blocks, block_size, Hkv, D]`` (``get_kv_cache_shape`` = ``(2, ...)``), block
  size 128 (``get_supported_kernel_block_sizes``).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from splitkv_common.inputs import DecodeInputs  # noqa: E402
from splitkv_common.torch_io import torch_dtype_name  # noqa: E402


class AscendAttentionState(enum.Enum):
    PrefillNoCache = 0
    PrefillCacheHit = 1
    DecodeOnly = 2
    ChunkedPrefill = 3
    SpecDecoding = 4


@dataclass
class AscendMetadata:
    attn_mask: torch.Tensor | None = None
    attn_state: AscendAttentionState = AscendAttentionState.ChunkedPrefill
    num_actual_tokens: int = 0
    num_decode_tokens: int = 0
    num_prefills: int = 0
    num_decodes: int = 0
    seq_lens: torch.Tensor = None
    seq_lens_cpu: torch.Tensor = None
    seq_lens_list: list = None
    actual_seq_lengths_q: list = None
    query_start_loc: torch.Tensor = None
    max_query_len: int | None = None
    block_tables: torch.Tensor = None
    slot_mapping: torch.Tensor = None
    causal: bool = True
    model_runner_type: str = ""


@dataclass
class Impl:
    """The attributes of ``AscendAttentionBackendImpl`` the adapter reads."""

    num_heads: int
    head_size: int
    scale: float
    num_kv_heads: int
    sliding_window: int | None = None
    alibi_slopes: object = None
    sinks: object = None
    attn_type: str = "decoder"
    kv_cache_dtype: str = "auto"
    enable_c8_quant: bool = False


@dataclass
class Step:
    meta: AscendMetadata
    query: torch.Tensor          # [num_tokens(+pad), Hq, D]
    key_cache: torch.Tensor      # [num_blocks, block_size, Hkv, D]
    value_cache: torch.Tensor
    inputs: DecodeInputs         # the same step in our terms (real requests only)


def make_step(q_lens, seq_lens, *, num_heads=8, num_kv_heads=2, head_size=64, block_size=128, dtype=torch.float16,
              pad_tokens=0, decode_threshold=1, seed=0, window_left=None, scale=None) -> Step:
    """A step of requests ``(q_len, seq_len)``; ``pad_tokens`` > 0 adds the runner's dummy padding request."""
    g = np.random.default_rng(seed)
    q_lens = [int(x) for x in q_lens]
    seq_lens = [int(x) for x in seq_lens]
    B = len(q_lens)
    pages = [max(1, -(-s // block_size)) for s in seq_lens]
    max_blocks = max(pages) + 1
    num_blocks = sum(pages) + 3
    perm = g.permutation(np.arange(1, num_blocks))  # block 0 stays free: padding rows point at it
    bt = np.zeros((B, max_blocks), np.int32)
    k = 0
    for b, p in enumerate(pages):
        bt[b, :p] = perm[k:k + p]
        k += p
    kc = g.standard_normal((num_blocks, block_size, num_kv_heads, head_size)).astype(np.float32)
    vc = g.standard_normal((num_blocks, block_size, num_kv_heads, head_size)).astype(np.float32)
    T = sum(q_lens)
    q = g.standard_normal((T, num_heads, head_size)).astype(np.float32)
    tdt = dtype
    # values representable in the torch dtype, kept as float32 for the reference
    kc, vc, q = (torch.from_numpy(x).to(tdt).float().numpy() for x in (kc, vc, q))
    qsl = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
    dtype_name = torch_dtype_name(tdt)
    inputs = DecodeInputs(q, kc, vc, bt, np.asarray(seq_lens, np.int32), qsl, dtype=dtype_name,
                          scale=scale, window_left=window_left)

    num_decodes = sum(1 for x in q_lens if x <= decode_threshold)
    # decode first, as the runner orders them
    assert all(x <= decode_threshold for x in q_lens[:num_decodes]), "put decode requests first"
    num_prefills = B - num_decodes
    qsl_cpu = torch.from_numpy(qsl.astype(np.int32))
    sl = torch.tensor(seq_lens, dtype=torch.int32)
    bt_t = torch.from_numpy(bt)
    query = torch.from_numpy(q).to(tdt)
    if pad_tokens:
        qsl_cpu = torch.cat([qsl_cpu, qsl_cpu[-1:] + pad_tokens])
        sl = torch.cat([sl, sl.new_ones(1)])
        bt_t = torch.cat([bt_t, bt_t.new_zeros((1, max_blocks))])
        query = torch.cat([query, torch.full((pad_tokens, num_heads, head_size), 7.0, dtype=tdt)])
    if num_prefills == 0:
        state = AscendAttentionState.DecodeOnly if max(q_lens) == 1 else AscendAttentionState.SpecDecoding
    else:
        state = AscendAttentionState.ChunkedPrefill
    meta = AscendMetadata(
        attn_state=state, num_actual_tokens=T, num_decode_tokens=sum(q_lens[:num_decodes]), num_prefills=num_prefills,
        num_decodes=num_decodes, seq_lens=sl, seq_lens_cpu=sl, seq_lens_list=sl.tolist(),
        actual_seq_lengths_q=qsl_cpu[1:].tolist(), query_start_loc=qsl_cpu.clone(), max_query_len=max(q_lens),
        block_tables=bt_t, slot_mapping=torch.zeros(T, dtype=torch.int32), causal=True)
    return Step(meta, query, torch.from_numpy(kc).to(tdt), torch.from_numpy(vc).to(tdt), inputs)
