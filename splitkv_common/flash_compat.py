"""FlashAttention's ``flash_attn_with_kvcache`` call, mapped onto splitkv's decode (needs torch).

Users coming from CUDA call FlashAttention 2's

    flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, rotary_cos=None, rotary_sin=None,
                            cache_seqlens=None, cache_batch_idx=None, cache_leftpad=None,
                            block_table=None, softmax_scale=None, causal=False, window_size=(-1, -1),
                            softcap=0.0, rotary_interleaved=True, alibi_slopes=None, num_splits=0,
                            return_softmax_lse=False)

:func:`make_flash_attn_with_kvcache` builds that function, with FlashAttention's semantics, over one
backend's decode; each backend offers the result under the same name:

* ``splitkv_common.flash_compat.flash_attn_with_kvcache``: stock torch ops on q's device;
* ``cuda_ref.flash_attn_with_kvcache``: the Triton kernels (CUDA, or the interpreter on a CPU);
* ``ascend_ops.flash_attn_with_kvcache``: the Ascend C operator (NPU).

Semantics (FlashAttention's, converted to ``docs/conventions.md``):

* ``q [B, Sq, Hq, D]``; ``k_cache``/``v_cache`` ``[B_cache, Skv, Hkv, D]`` (contiguous; request ``b``
  reads cache row ``cache_batch_idx[b]``, default ``b``) or, with ``block_table [B, max_blocks]``
  int32, paged ``[num_blocks, page_block_size, Hkv, D]``.
* ``cache_seqlens``: int or ``[B]`` int tensor, the tokens already in the cache (default: the whole
  contiguous cache). With ``k``/``v`` ``[B, Sk, Hkv, D]`` the new tokens are first written **in
  place** at positions ``cache_seqlens[b] + j``, and attention runs over ``cache_seqlens + Sk``.
  All or nothing: every check (of the write and of the attention) runs before the first slot is
  written, and a refused call writes nothing. Refused: a slot written twice by one call (duplicate
  ``cache_batch_idx`` entries or block-table rows, an expanded cache, ``k_cache`` and ``v_cache``
  sharing memory), and an append into a page another request of the batch sees below its length
  (prefix sharing of full pages is legal; appending into a shared page would overwrite the other
  request's history). ``k``/``v`` have ``k_cache``'s dtype.
* Query row ``i`` of request ``b`` sits at position ``p = L_b - Sq + i`` (bottom-right alignment,
  ``L_b`` the tokens attended) and sees keys ``[p - window_size[0], p + window_size[1]]`` within
  ``[0, L_b)``; ``-1`` is an unbounded side; ``causal=True`` sets the right side to 0.
* ``softmax_scale`` defaults to ``1/sqrt(D)``; ``softcap=0.0`` means no cap.
* ``num_splits``: ``0`` lets the planner choose (``auto``), ``1`` does not split, ``N`` asks for
  ``N`` splits per request (``count:N``).
* Returns ``out [B, Sq, Hq, D]`` in q's dtype, and with ``return_softmax_lse`` also
  ``lse [B, Hq, Sq]`` float32, natural log. A row that sees no key gets ``out = 0`` and
  ``lse = -inf`` (FlashAttention 2 writes ``+inf`` there; both mean "empty", docs/state-formats.md).

* ``common_prefix_len`` (vLLM's convention for its cascade attention, keyword only): the first
  ``common_prefix_len`` tokens of every request are the same pages, ``block_table[0, :common_prefix_len
  / page_block_size]``, at the start of every row of ``block_table``. ``0`` (default): nothing is
  shared, the plain decode. Otherwise the shared-prefix route of the backend
  (:mod:`splitkv_common.shared_prefix`: the prefix read once for all the batch's query rows, merged
  exactly with each request's tail) where the planner takes it (``shared_prefix_mode``: ``auto``, the
  default, ``on`` or ``off``; splitkv's own keyword): the same attention either way. Refused
  (``ValueError`` naming ``common_prefix_len`` and the rule) unless: an int ``>= 0``, a multiple of the
  page size (vLLM rounds it down so; splitkv does not guess), with ``block_table`` (a paged cache),
  bottom-right causal rows (``causal=True``, or one query row per request), every request's query rows
  after the prefix (``cache_seqlens + Sk - Sq >= common_prefix_len``), and every row of
  ``block_table`` starting with the prefix's pages.

Rotary embedding, ALiBi and ``cache_leftpad`` are refused with a clear error (apply rotary to q and
k before the call). The call plans on the host (it reads ``cache_seqlens``): for decode loops and
graphs use the backend's ``plan()``/``run()`` wrapper.
"""

from __future__ import annotations

from typing import Callable, Protocol

import numpy as np
import torch

from .planner import make_plan
from .validation import _is_real as _is_number
from .guards import check_append_slots, check_disjoint_views, check_no_self_overlap
from .validation import check_decode_args, check_gqa, check_page_ids, check_scalars


class Decode(Protocol):
    """One backend's decode over the conventions' layout (``docs/conventions.md``)::

        decode(q [T, Hq, D], k_cache, v_cache [P, page, Hkv, D], block_table [B, M] int32,
               seq_lens [B] int32, query_start_loc [B + 1] int32, *, scale, soft_cap,
               window_left, policy) -> (out [T, Hq, D], lse [T, Hq] float32, natural log)
    """

    def __call__(self, q, k_cache, v_cache, block_table, seq_lens, query_start_loc, *, scale: float,
                 soft_cap: float | None, window_left: int | None, policy: str): ...


class SharedDecode(Protocol):
    """One backend's shared-prefix decode: :class:`Decode`'s call with ``shared_prefix`` (a
    :class:`~splitkv_common.shared_prefix.SharedPrefix`, already checked against the host block table)
    and ``mode`` (the planner's ``auto``, ``on``, ``off``)."""

    def __call__(self, q, k_cache, v_cache, block_table, seq_lens, query_start_loc, *, shared_prefix, mode: str,
                 scale: float, soft_cap: float | None, window_left: int | None, policy: str): ...


def torch_shared_decode(q, k_cache, v_cache, block_table, seq_lens, query_start_loc, *, shared_prefix, mode, scale,
                        soft_cap, window_left, policy):
    """:class:`SharedDecode` with stock torch ops on q's device (``splitkv_common.shared_prefix_torch``)."""
    from .shared_prefix import plan_shared_prefix
    from .shared_prefix_torch import decode_attention

    _, Hq, D = q.shape
    P, page, Hkv, _ = k_cache.shape
    splan = plan_shared_prefix(seq_lens.cpu().numpy(), query_start_loc.cpu().numpy(), shared_prefix,
                               num_kv_heads=Hkv, page_size=page, num_q_heads=Hq, head_dim=D,
                               kv_elem_bytes=k_cache.element_size(), device="cpu", policy=policy,
                               window_left=window_left, block_table=block_table.cpu().numpy(), num_pages=P, mode=mode)
    return decode_attention(q, k_cache, v_cache, block_table, seq_lens, query_start_loc, splan=splan, scale=scale,
                            soft_cap=soft_cap, window_left=window_left, validate=False)


def torch_decode(q, k_cache, v_cache, block_table, seq_lens, query_start_loc, *, scale, soft_cap, window_left,
                 policy):
    """:class:`Decode` with stock torch ops on q's device (``splitkv_common.torch_eager``)."""
    from .torch_eager import decode_attention

    _, Hq, D = q.shape
    _, page, Hkv, _ = k_cache.shape
    qsl = query_start_loc.cpu().numpy()
    plan = make_plan(seq_lens.cpu().numpy(), num_kv_heads=Hkv, num_q_heads=Hq, head_dim=D, page_size=page,
                     query_start_loc=qsl, policy=policy, device="cpu", kv_elem_bytes=k_cache.element_size(),
                     window_left=window_left)
    return decode_attention(q, k_cache, v_cache, block_table, seq_lens, query_start_loc, plan=plan, scale=scale,
                            soft_cap=soft_cap, window_left=window_left)


def _refuse(**unsupported) -> None:
    for name, value in unsupported.items():
        if value is not None:
            raise ValueError(f"{name}: not supported by splitkv's decode (pass None; apply rotary embeddings to q "
                             f"and k, and ALiBi or left padding through the cache layout, before the call)")


def _as_lengths(cache_seqlens, B: int, device, default: int) -> torch.Tensor:
    if cache_seqlens is None:
        return torch.full((B,), default, dtype=torch.int64, device=device)
    if isinstance(cache_seqlens, (int, np.integer)):
        return torch.full((B,), int(cache_seqlens), dtype=torch.int64, device=device)
    if not isinstance(cache_seqlens, torch.Tensor) or cache_seqlens.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"cache_seqlens: must be an int or an int32/int64 tensor, got {type(cache_seqlens).__name__}"
                        + (f" of {cache_seqlens.dtype}" if isinstance(cache_seqlens, torch.Tensor) else ""))
    if tuple(cache_seqlens.shape) != (B,):
        raise ValueError(f"cache_seqlens: must have shape [{B}] (one length per request), got {tuple(cache_seqlens.shape)}")
    return cache_seqlens.to(device=device, dtype=torch.int64)


def _check_window(window_size) -> tuple[int, int]:
    try:
        left, right = window_size
    except (TypeError, ValueError):
        raise ValueError(f"window_size: must be a pair (left, right) of ints, got {window_size!r}") from None
    if not all(isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_)) for x in (left, right)):
        raise ValueError(f"window_size: must be a pair (left, right) of ints, got {window_size!r}")
    left, right = int(left), int(right)
    if left < -1 or right < -1:
        raise ValueError(f"window_size: each side must be >= 0, or -1 for unbounded, got {window_size!r}")
    return left, right


def _policy(num_splits) -> str:
    if not isinstance(num_splits, (int, np.integer)) or num_splits < 0:
        raise ValueError(f"num_splits: must be an int >= 0 (0: the planner chooses), got {num_splits!r}")
    return {0: "auto", 1: "none"}.get(int(num_splits), f"count:{int(num_splits)}")


def _paged_view(q, k_cache, v_cache, block_table, cache_batch_idx):
    """``(k_cache, v_cache, block_table int32 [B, M], page_size, capacity per request)`` in the
    conventions' paged layout; a contiguous cache becomes one page per request (no copy)."""
    B = q.shape[0]
    if block_table is not None:
        if cache_batch_idx is not None:
            raise ValueError("cache_batch_idx: cannot be combined with block_table (a paged cache is indexed by it)")
        if not isinstance(block_table, torch.Tensor) or block_table.dim() != 2 or block_table.shape[0] != B:
            raise ValueError(f"block_table: must be a [B={B}, max_blocks] int32 tensor, got "
                             f"{tuple(block_table.shape) if isinstance(block_table, torch.Tensor) else type(block_table).__name__}")
        if block_table.dtype not in (torch.int32, torch.int64):
            raise TypeError(f"block_table: dtype must be int32 or int64, got {block_table.dtype}")
        page = k_cache.shape[1]
        return k_cache, v_cache, block_table.to(torch.int32), page, block_table.shape[1] * page
    rows = torch.arange(B, device=q.device) if cache_batch_idx is None else cache_batch_idx.to(q.device).long()
    if rows.shape != (B,):
        raise ValueError(f"cache_batch_idx: must have shape [{B}], got {tuple(cache_batch_idx.shape)}")
    if B and (int(rows.min()) < 0 or int(rows.max()) >= k_cache.shape[0]):
        raise ValueError(f"cache_batch_idx: entries must lie in [0, {k_cache.shape[0]}) (rows of k_cache)")
    return k_cache, v_cache, rows.to(torch.int32)[:, None].contiguous(), k_cache.shape[1], k_cache.shape[1]


def _new_tokens(k, v, B: int, k_cache) -> int:
    """How many new tokens ``k``/``v`` ``[B, Sk, Hkv, D]`` bring (0 without them)."""
    if k is None and v is None:
        return 0
    if k is None or v is None:
        raise ValueError("k, v: give both new keys and new values, or neither")
    if not isinstance(k, torch.Tensor) or not isinstance(v, torch.Tensor):
        raise TypeError(f"k, v: must be tensors, got {type(k).__name__} and {type(v).__name__}")
    if k.dim() != 4 or tuple(k.shape) != tuple(v.shape) or k.shape[0] != B or k.shape[2:] != k_cache.shape[2:]:
        raise ValueError(f"k, v: must both be [B={B}, Sk, Hkv={k_cache.shape[2]}, D={k_cache.shape[3]}], got "
                         f"{tuple(k.shape)} and {tuple(v.shape)}")
    return k.shape[1]


def _check_new_tokens(k, v, k_cache, v_cache, bt, lengths, page, name: str) -> None:
    """Everything a write of ``k``/``v`` needs, checked before the first byte is written: the new
    tokens' dtype (the cache's), the caches' memory (one location per slot, ``k_cache`` and
    ``v_cache`` apart), and the slots they go to (:func:`~splitkv_common.guards.check_append_slots`:
    no slot written twice, no page another request sees below its length). ``name``: the argument
    that maps requests to pages (``block_table``, or ``cache_batch_idx`` for a contiguous cache).
    Cost: O(rank) for the memory, O(B x Sk + the history's pages) on the host for the slots."""
    for nm, x in (("k", k), ("v", v)):
        if x.dtype != k_cache.dtype:
            raise TypeError(f"{nm}: dtype must be k_cache's ({k_cache.dtype}), got {x.dtype}")
    check_no_self_overlap(k_cache, "k_cache")
    check_no_self_overlap(v_cache, "v_cache")
    check_disjoint_views(k_cache, v_cache, "k_cache, v_cache")
    check_append_slots(bt.cpu().numpy(), lengths.cpu().numpy(), k.shape[1], page, name=name)


def _append(k_cache, v_cache, k, v, block_table, page, lengths):
    """Write ``k``/``v`` ``[B, Sk, Hkv, D]`` into the cache at positions ``lengths[b] + j`` (in place).
    Returns what :func:`_restore` needs to put the overwritten slots back (None without ``k``)."""
    if k is None:
        return None
    B = lengths.shape[0]
    pos = lengths[:, None] + torch.arange(k.shape[1], device=lengths.device)[None, :]       # [B, Sk]
    pages = block_table.long()[torch.arange(B, device=pos.device)[:, None], pos // page]
    slots = pos % page
    saved = (pages, slots, k_cache[pages, slots].clone(), v_cache[pages, slots].clone())
    k_cache[pages, slots] = k
    v_cache[pages, slots] = v
    return saved


def _restore(k_cache, v_cache, saved) -> None:
    """Undo :func:`_append` (the slots are distinct: checked before the write)."""
    if saved is not None:
        pages, slots, old_k, old_v = saved
        k_cache[pages, slots] = old_k
        v_cache[pages, slots] = old_v


def _attend(decode, q, k_cache, v_cache, bt, total, left, right, *, scale, soft_cap, policy):
    """The attention of a checked call (the cache already holds the new tokens): ``(out [B * Sq, Hq, D],
    lse [B * Sq, Hq])``."""
    B, Sq, Hq, D = q.shape
    q_rows = q.reshape(B * Sq, Hq, D)
    out = torch.empty_like(q_rows)
    lse = torch.empty(B * Sq, Hq, dtype=torch.float32, device=q.device)
    run = dict(scale=scale, soft_cap=soft_cap, policy=policy)
    seq32 = total.to(torch.int32)
    if right == 0:
        # bottom-right causal: exactly the conventions' multi-query causal tail
        qsl = torch.arange(0, (B + 1) * Sq, Sq, dtype=torch.int32, device=q.device)
        o, l = decode(q_rows, k_cache, v_cache, bt, seq32, qsl, window_left=None if left < 0 else left, **run)
        out.copy_(o)
        lse.copy_(l)
    else:
        # keys after the row's position: each row becomes a one-row request that ends at the
        # row's last visible key; rows with the same window shift share one call
        i = torch.arange(Sq, device=q.device)
        p = total[:, None] - Sq + i[None, :]                                            # [B, Sq]
        end = total[:, None].expand(B, Sq) if right < 0 else torch.minimum(total[:, None], p + right + 1)
        end = end.clamp(min=0)
        shift = (end - 1 - p).reshape(-1)             # keys seen after p; the window counts from end - 1
        rows_bt = bt.repeat_interleave(Sq, dim=0)
        ends = end.reshape(-1).to(torch.int32)
        for s in (torch.unique(shift).tolist() if left >= 0 else [None]):
            sel = torch.arange(B * Sq, device=q.device) if s is None else (shift == s).nonzero().flatten()
            n = sel.numel()
            qsl = torch.arange(n + 1, dtype=torch.int32, device=q.device)
            o, l = decode(q_rows[sel].contiguous(), k_cache, v_cache, rows_bt[sel].contiguous(),
                          ends[sel].contiguous(), qsl, window_left=None if s is None else left + int(s), **run)
            out[sel] = o
            lse[sel] = l
    return out, lse


def _check_common_prefix(common_prefix_len, shared_prefix_mode, block_table, Sq: int, right: int) -> int:
    """``common_prefix_len`` as an int, or refused naming the argument and the rule (before any work)."""
    from .shared_prefix import MODES

    if not isinstance(common_prefix_len, (int, np.integer)) or isinstance(common_prefix_len, (bool, np.bool_)):
        raise TypeError(f"common_prefix_len: must be an int (tokens every request shares), got "
                        f"{type(common_prefix_len).__name__}")
    if common_prefix_len < 0:
        raise ValueError(f"common_prefix_len: must be >= 0 (0: nothing shared), got {common_prefix_len}")
    if shared_prefix_mode not in MODES:
        raise ValueError(f"shared_prefix_mode: must be one of {MODES}, got {shared_prefix_mode!r}")
    if common_prefix_len and block_table is None:
        raise ValueError("common_prefix_len: needs block_table (the shared tokens are pages every request's "
                         "block-table row starts with); a contiguous cache shares none")
    if common_prefix_len and Sq > 1 and right != 0:
        raise ValueError(f"common_prefix_len: needs causal=True (or window_size[1] == 0) with {Sq} query rows per "
                         f"request: the shared route computes bottom-right causal rows")
    return int(common_prefix_len)


def make_flash_attn_with_kvcache(decode: Decode, where: str, shared_decode: "SharedDecode | None" = None) -> Callable:
    """FlashAttention's ``flash_attn_with_kvcache`` over ``decode`` (see the module docstring);
    ``shared_decode``: the backend's shared-prefix route for ``common_prefix_len`` (None: refused)."""

    def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, rotary_cos=None, rotary_sin=None,
                                cache_seqlens=None, cache_batch_idx=None, cache_leftpad=None, block_table=None,
                                softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                                rotary_interleaved=True, alibi_slopes=None, num_splits=0,
                                return_softmax_lse=False, *, common_prefix_len=0, shared_prefix_mode="auto"):
        _refuse(rotary_cos=rotary_cos, rotary_sin=rotary_sin, cache_leftpad=cache_leftpad, alibi_slopes=alibi_slopes)
        for name, x in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
            if not isinstance(x, torch.Tensor) or x.dim() != 4:
                raise ValueError(f"{name}: must be a 4-D tensor, got "
                                 f"{tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__}")
        for name, x in (("k_cache", k_cache), ("v_cache", v_cache), ("k", k), ("v", v), ("block_table", block_table),
                        ("cache_seqlens", cache_seqlens), ("cache_batch_idx", cache_batch_idx)):
            if isinstance(x, torch.Tensor) and x.device != q.device:
                raise ValueError(f"{name}: on {x.device}, must be on q's device {q.device}")
        if tuple(v_cache.shape) != tuple(k_cache.shape):
            raise ValueError(f"v_cache: must have k_cache's shape {tuple(k_cache.shape)}, got {tuple(v_cache.shape)}")
        B, Sq, Hq, D = q.shape
        if min(Hq, D) <= 0 or min(k_cache.shape[1:]) <= 0:
            raise ValueError(f"q, k_cache: heads, head dim and page size must be positive, got q {tuple(q.shape)}, "
                             f"k_cache {tuple(k_cache.shape)}")
        if k_cache.shape[3] != D:
            raise ValueError(f"k_cache: head dim {k_cache.shape[3]} must equal q's head dim {D}")
        check_gqa(Hq, k_cache.shape[2])
        left, right = _check_window(window_size)
        if causal:
            right = 0
        prefix = _check_common_prefix(common_prefix_len, shared_prefix_mode, block_table, Sq, right)
        if prefix and shared_decode is None:
            raise ValueError(f"common_prefix_len: {where} has no shared-prefix route; pass 0")
        if prefix:
            right = 0   # one row per request (or causal): the row's keys end at its position either way
        policy = _policy(num_splits)
        # FlashAttention spells "no cap" softcap=0.0; the shared rule is None (docs/conventions.md)
        soft_cap = None if softcap is None or (_is_number(softcap) and softcap == 0) else softcap
        try:
            check_scalars(softmax_scale, soft_cap, None)
        except ValueError as e:  # name FlashAttention's arguments
            msg = str(e)
            raise ValueError(msg.replace("scale:", "softmax_scale:", 1) if msg.startswith("scale:")
                             else msg.replace("soft_cap:", "softcap:", 1)) from None
        scale = float(D ** -0.5 if softmax_scale is None else softmax_scale)
        soft_cap = None if soft_cap is None else float(soft_cap)

        if block_table is not None and cache_seqlens is None:
            raise ValueError("cache_seqlens: required with block_table (a paged cache has no implied length)")
        k_cache, v_cache, bt, page, capacity = _paged_view(q, k_cache, v_cache, block_table, cache_batch_idx)
        lengths = _as_lengths(cache_seqlens, B, q.device, default=capacity)
        new = _new_tokens(k, v, B, k_cache)
        total = lengths + new
        host_total = total.cpu().numpy()
        if B and (host_total.min() - new < 0 or host_total.max() > capacity):
            bad = int(np.argmax((host_total - new < 0) | (host_total > capacity)))
            raise ValueError(f"cache_seqlens: request {bad} would attend {int(host_total[bad])} tokens"
                             f"{f' ({new} new)' if new else ''}; must lie in [0, {capacity}] (its cache capacity)")
        if B and bt.numel():
            # the data is on the host (lengths were read above): a page id a row would read or a new
            # token would be written to must lie in the cache, never index from its end
            src = bt if block_table is None else block_table  # before any int32 narrowing
            check_page_ids(src.cpu().numpy(), host_total.astype(np.int64), bt.shape[1], page, k_cache.shape[0])
        shared = None
        if prefix:
            # before the write: the prefix precedes every query row and starts every block-table row
            from .shared_prefix import SharedPrefix, check_shared_prefix

            shared = SharedPrefix.from_common_prefix_len(prefix, B)
            try:
                check_shared_prefix(shared, host_total, np.arange(0, (B + 1) * Sq, Sq), page, bt.cpu().numpy(),
                                    k_cache.shape[0])
            except ValueError as e:
                raise ValueError(f"common_prefix_len: {prefix} tokens (vLLM's convention: pages "
                                 f"block_table[0, :{prefix // page}] start every row): {e}") from None
        if new:
            # all or nothing: every check of the write and of the decode that follows it runs before
            # the first byte is written, and a decode that still fails puts the old slots back
            _check_new_tokens(k, v, k_cache, v_cache, bt, lengths, page,
                              "block_table" if block_table is not None else "cache_batch_idx")
            check_decode_args(q.reshape(B * Sq, Hq, D), k_cache, v_cache, bt, total,
                              torch.arange(0, (B + 1) * Sq, Sq, dtype=torch.int64), scale=scale, soft_cap=soft_cap,
                              window_left=None if left < 0 else left)
        saved = _append(k_cache, v_cache, k, v, bt, page, lengths)
        try:
            if shared is not None:
                out, lse = shared_decode(q.reshape(B * Sq, Hq, D), k_cache, v_cache, bt, total.to(torch.int32),
                                         torch.arange(0, (B + 1) * Sq, Sq, dtype=torch.int32, device=q.device),
                                         shared_prefix=shared, mode=shared_prefix_mode, scale=scale,
                                         soft_cap=soft_cap, window_left=None if left < 0 else left, policy=policy)
            else:
                out, lse = _attend(decode, q, k_cache, v_cache, bt, total, left, right, scale=scale,
                                   soft_cap=soft_cap, policy=policy)
        except BaseException:
            _restore(k_cache, v_cache, saved)
            raise
        out = out.reshape(B, Sq, Hq, D)
        if return_softmax_lse:
            return out, lse.reshape(B, Sq, Hq).permute(0, 2, 1).contiguous()
        return out

    flash_attn_with_kvcache.__doc__ = (f"FlashAttention's ``flash_attn_with_kvcache`` on {where} "
                                       f"(semantics: :mod:`splitkv_common.flash_compat`).")
    flash_attn_with_kvcache.__module__ = __name__
    return flash_attn_with_kvcache


flash_attn_with_kvcache = make_flash_attn_with_kvcache(torch_decode, "stock torch ops, on q's device",
                                                       torch_shared_decode)
