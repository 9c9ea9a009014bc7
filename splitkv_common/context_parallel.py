"""Context-parallel split-KV decode over ``torch.distributed`` (needs torch; see docs/context-parallel.md).

When one request's history outgrows one device, each rank of a process group holds part of it
(:mod:`splitkv_common.cp_sharding`: contiguous page ranges or round-robin pages), computes the
``(o, lse)`` state of its part for every query row and head, and the ``W`` states are merged with
the exact rule of ``docs/conventions.md`` after one collective:

* ``all_gather`` (default): o and lse packed as ``[T, Hq, D + 1]`` float32, gathered into a
  preallocated ``[W, T, Hq, D + 1]`` buffer, merged on every rank (all ranks end with every head);
* ``all_to_all``: the packed states are exchanged by head groups; rank ``r`` ends with heads
  ``[r Hq/W, (r + 1) Hq/W)`` merged (``Hq % W == 0``), for a following tensor-parallel output
  projection.

Either way a rank sends ``Hq x (D + 1)`` floats per query row, whatever the context length
(:func:`comm_bytes`).

Per-rank backends are callables ``backend(batch: ShardBatch) -> (o [T, Hq, D] float32, lse [T, Hq]
float32)``; an optional ``prepare(batch)`` does the host-side planning once per batch.

* :func:`torch_shard_backend` (default): :func:`splitkv_common.torch_eager.decode_attention` on the
  rank's global view (its page runs as a plan in global positions): exact for both layouts and
  every mask (causal tail, window), GQA, soft cap, int8 KV; any torch device.
* :class:`cuda_ref.context_parallel.TritonShardBackend` (CUDA or the Triton interpreter): the local view with
  its own ``auto`` plan where that is exact (:meth:`~splitkv_common.cp_sharding.Shard.local_view_exact`:
  one query row per request and no window, any layout), else the global-view plan (exact; with
  round-robin pages that is one work item per page, slow for long histories).

Process-group backends: ``nccl`` (CUDA), ``hccl`` (Ascend, registered by torch_npu; not run in this
project yet), ``gloo`` (CPU; what the tests use).
"""

from __future__ import annotations

import datetime
import os
import pickle
import tempfile
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch
import torch.distributed as dist

import zlib

from .cp_sharding import (LAYOUTS, Shard, check_used_page_ids, localize, page_owners, shard, shard_all,  # noqa: F401
                          shard_plan)
from .plan_layout import Plan
from .torch_eager import decode_attention, merge_states
from .validation import as_int64_lengths, normalize_window

MODES = ("all_gather", "all_to_all")
PG_BACKENDS = {"cuda": "nccl", "npu": "hccl", "cpu": "gloo"}


def default_pg_backend(device) -> str:
    """The process-group backend for a device type: ``nccl`` (cuda), ``hccl`` (npu), ``gloo`` (cpu)."""
    t = torch.device(device).type
    if t not in PG_BACKENDS:
        raise ValueError(f"device: no process-group backend known for {t!r} (known: {sorted(PG_BACKENDS)})")
    return PG_BACKENDS[t]


def comm_bytes(num_rows: int, num_q_heads: int, head_dim: int, world_size: int, mode: str = "all_gather") -> dict:
    """Bytes one decode step moves per rank (float32 states; independent of the context length).

    ``all_gather``: each rank sends its ``T x Hq x (D + 1)`` floats and receives the ``W - 1`` others';
    ``all_to_all``: each rank sends ``(W - 1) / W`` of its states and receives as much.
    ``buffer`` is the receive buffer's size.
    """
    if mode not in MODES:
        raise ValueError(f"mode: unknown {mode!r}; expected one of {MODES}")
    state = int(num_rows) * int(num_q_heads) * (int(head_dim) + 1) * 4
    W = int(world_size)
    if mode == "all_gather":
        return {"mode": mode, "state_bytes": state, "send_per_rank": state if W > 1 else 0,
                "recv_per_rank": (W - 1) * state, "buffer": W * state}
    part = state // W
    return {"mode": mode, "state_bytes": state, "send_per_rank": (W - 1) * part, "recv_per_rank": (W - 1) * part,
            "buffer": state}


@dataclass
class ShardBatch:
    """One rank's decode inputs, in both views (``docs/context-parallel.md``).

    Local view: ``block_table`` / ``seq_lens`` index the rank's own cache by local positions.
    Global view: ``global_block_table`` is indexed by global logical page, ``global_seq_lens`` are the
    requests' whole lengths, :meth:`plan` the rank's page runs in global positions.
    """

    shard: Shard
    q: torch.Tensor
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    block_table: torch.Tensor
    seq_lens: torch.Tensor
    query_start_loc: torch.Tensor
    global_block_table: torch.Tensor
    global_seq_lens: torch.Tensor
    scale: float
    soft_cap: float | None = None
    window_left: int | None = None
    k_scale: torch.Tensor | None = None
    v_scale: torch.Tensor | None = None
    k_offset: torch.Tensor | None = None
    v_offset: torch.Tensor | None = None
    host_qsl: np.ndarray = field(default=None, repr=False)
    _cache: dict = field(default_factory=dict, repr=False)

    def plan(self, split_tokens: int = 0) -> Plan:
        """The rank's work in global positions (:func:`~splitkv_common.cp_sharding.shard_plan`)."""
        key = ("plan", split_tokens)
        if key not in self._cache:
            self._cache[key] = shard_plan(self.shard, num_kv_heads=self.k_cache.shape[2],
                                          query_start_loc=self.host_qsl, window_left=self.window_left,
                                          split_tokens=split_tokens)
        return self._cache[key]

    def local_view_exact(self) -> bool:
        if "exact" not in self._cache:
            self._cache["exact"] = self.shard.local_view_exact(self.host_qsl, self.window_left)
        return self._cache["exact"]

    def quant(self) -> dict:
        return dict(k_scale=self.k_scale, v_scale=self.v_scale, k_offset=self.k_offset, v_offset=self.v_offset)


ShardBackend = Callable[[ShardBatch], "tuple[torch.Tensor, torch.Tensor]"]


def torch_shard_backend(batch: ShardBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """The rank's states with stock torch ops on the global view: exact for every layout and mask."""
    o, lse = decode_attention(batch.q.float(), batch.k_cache, batch.v_cache, batch.global_block_table,
                              batch.global_seq_lens, batch.query_start_loc, plan=batch.plan(), scale=batch.scale,
                              soft_cap=batch.soft_cap, window_left=batch.window_left, validate=False,
                              **batch.quant())
    return o, lse


def make_batch(s: Shard, q, k_cache, v_cache, *, query_start_loc=None, scale=None, soft_cap=None, window_left=None,
               k_scale=None, v_scale=None, k_offset=None, v_offset=None) -> ShardBatch:
    """A :class:`ShardBatch` from a (localized) shard and the rank's tensors; int32 tables on q's device."""
    dev = q.device
    B = s.batch_size
    # a used -1 (or an id past the rank's cache) is refused here, so every shard backend agrees
    check_used_page_ids(s.block_table, s.seq_lens, s.page_size, int(k_cache.shape[0]), name="shard.block_table")
    qsl = np.arange(B + 1, dtype=np.int32) if query_start_loc is None else (
        query_start_loc.detach().cpu().numpy() if isinstance(query_start_loc, torch.Tensor)
        else np.asarray(query_start_loc))
    qsl = as_int64_lengths(qsl, "query_start_loc", "[B + 1]")
    if qsl.size and (int(qsl.min()) < 0 or int(qsl.max()) > q.shape[0] or (np.diff(qsl) < 0).any()):
        raise ValueError(f"query_start_loc: must be non-decreasing within [0, {q.shape[0]}] (q's rows), got "
                         f"{qsl.tolist()[:8]}")
    qsl = qsl.astype(np.int32)
    if qsl.shape != (B + 1,) or int(qsl[-1]) != q.shape[0] or (qsl.size and int(qsl[0]) != 0):
        raise ValueError(f"query_start_loc: must be [B + 1] = [{B + 1}] ending at q's {q.shape[0]} rows, "
                         f"got {qsl.tolist()[:8]}")

    def t(x):
        return torch.as_tensor(np.ascontiguousarray(x, dtype=np.int32), device=dev)

    D = q.shape[-1]
    return ShardBatch(shard=s, q=q, k_cache=k_cache, v_cache=v_cache, block_table=t(np.maximum(s.block_table, 0)),
                      seq_lens=t(s.seq_lens), query_start_loc=t(qsl), global_block_table=t(s.global_block_table()),
                      global_seq_lens=t(s.global_seq_lens), scale=float(D ** -0.5) if scale is None else float(scale),
                      soft_cap=soft_cap, window_left=normalize_window(window_left), k_scale=k_scale, v_scale=v_scale,
                      k_offset=k_offset, v_offset=v_offset, host_qsl=qsl)


_GATHER_INTO_TENSOR: dict = {}

#: What ranks must agree on before the collective (:func:`batch_fingerprint`), in this order.
FINGERPRINT_FIELDS = ("inputs refused", "mode", "world size", "query rows (T)", "query heads (Hq)", "head dim (D)",
                      "q dtype", "requests (B)", "query_start_loc", "global seq_lens")


def _crc(a: np.ndarray) -> int:
    return zlib.crc32(np.ascontiguousarray(a, dtype=np.int64).tobytes())


def batch_fingerprint(batch: "ShardBatch | None", mode: str, world_size: int) -> np.ndarray:
    """int64 ``[len(FINGERPRINT_FIELDS)]``: what every rank of a step must agree on (q's shape and
    dtype, the batch's requests, ``query_start_loc`` and global lengths as CRC-32s, the mode and the
    world size). ``batch=None``: this rank refused its inputs (the first field 1), so that the others
    fail with it instead of waiting in the collective. Cost: two CRCs over ``B`` entries (host)."""
    if batch is None:
        return np.array([1] + [0] * (len(FINGERPRINT_FIELDS) - 1), np.int64)
    T, Hq, D = batch.q.shape
    dt = zlib.crc32(str(batch.q.dtype).encode())
    return np.array([0, MODES.index(mode), world_size, T, Hq, D, dt, batch.shard.batch_size, _crc(batch.host_qsl),
                     _crc(batch.shard.global_seq_lens)], np.int64)


def agree(fingerprint: np.ndarray, device, group=None) -> None:
    """Every rank of ``group`` shares its :func:`batch_fingerprint` (one all-gather of a few int64s)
    and checks the others': ranks that disagree on the batch (query rows, shapes, lengths) or a rank
    that refused its inputs make every rank raise the same ``ValueError`` here, naming the field and
    the ranks, instead of one rank waiting in the step's collective until the group's timeout."""
    W = dist.get_world_size(group)
    if W == 1:
        if fingerprint[0]:
            raise ValueError("context parallel: this rank refused its inputs")
        return
    send = torch.as_tensor(fingerprint, dtype=torch.int64, device=device)
    recv = torch.zeros((W, send.shape[0]), dtype=torch.int64, device=device)
    _all_gather_packed(recv, send, group)
    rows = recv.cpu().numpy()
    refused = np.flatnonzero(rows[:, 0])
    if refused.size:
        raise ValueError(f"context parallel: rank(s) {refused.tolist()} refused their inputs (see that rank's error); "
                         f"no rank runs this step")
    for f in range(1, rows.shape[1]):
        if (rows[:, f] != rows[0, f]).any():
            vals = {r: int(rows[r, f]) for r in range(W)}
            raise ValueError(f"context parallel: the ranks disagree on {FINGERPRINT_FIELDS[f]} "
                             f"({'CRC-32 ' if f >= 8 else ''}by rank: {vals}); every rank must be given the same "
                             f"batch (q, query_start_loc, global lengths, mode)")


def _all_gather_packed(buf: torch.Tensor, send: torch.Tensor, group) -> None:
    """``buf [W, ...]`` <- every rank's ``send [...]``, one collective (``all_gather_single`` where torch
    has it, else ``all_gather_into_tensor``, which torch 2.13 deprecates; a list ``all_gather`` into
    views of ``buf`` where the process group lacks both)."""
    key = dist.get_backend(group)
    if _GATHER_INTO_TENSOR.get(key, True):
        try:
            # the concatenated form [W * T, ...]: gloo splits it into chunks of send's shape
            gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
            gather(buf.view(buf.shape[0] * send.shape[0], *send.shape[1:]), send, group=group)
            _GATHER_INTO_TENSOR[key] = True
            return
        except (RuntimeError, NotImplementedError, ValueError):
            if key in ("nccl", "hccl"):
                raise
            _GATHER_INTO_TENSOR[key] = False
    dist.all_gather(list(buf.unbind(0)), send, group=group)


class ContextParallelDecode:
    """One rank's context-parallel decode: ``prepare(batch)`` once per batch (host), ``run(batch)`` per
    step (device work: the rank's states, one collective, the merge).

    Args:
        group: the process group (default: the world). mode: ``all_gather`` or ``all_to_all``.
        backend: the per-rank :data:`ShardBackend` (default :func:`torch_shard_backend`).
    """

    def __init__(self, backend: ShardBackend | None = None, *, group=None, mode: str = "all_gather"):
        if mode not in MODES:
            raise ValueError(f"mode: unknown {mode!r}; expected one of {MODES}")
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError("torch.distributed: call init_process_group (nccl, hccl or gloo) first")
        self.backend = backend if backend is not None else torch_shard_backend
        self.group, self.mode = group, mode
        self.world_size = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        self._bufs: dict = {}
        self._agreed = None   # the batch the ranks last agreed on (agree())

    def buffers(self, T: int, Hq: int, D: int, device) -> tuple[torch.Tensor, torch.Tensor]:
        """``(send [T, Hq, D + 1], recv)`` float32, allocated once per shape: recv is ``[W, T, Hq, D + 1]``
        (all_gather) or ``[W, T, Hq / W, D + 1]`` (all_to_all)."""
        key = (T, Hq, D, str(device))
        if key not in self._bufs:
            W = self.world_size
            if self.mode == "all_to_all" and Hq % W:
                raise ValueError(f"mode: all_to_all splits the {Hq} query heads over {W} ranks; Hq % W must be 0")
            send = torch.zeros(T, Hq, D + 1, dtype=torch.float32, device=device)
            shape = (W, T, Hq, D + 1) if self.mode == "all_gather" else (W, T, Hq // W, D + 1)
            self._bufs = {key: (send, torch.zeros(shape, dtype=torch.float32, device=device))}
        return self._bufs[key]

    def agree(self, batch: "ShardBatch | None", device=None) -> None:
        """Check that every rank was given the same batch (:func:`agree`: one all-gather of a few
        int64s); ``batch=None`` tells the others this rank refused its inputs. Called by
        :meth:`prepare`, and by :meth:`run` for a batch not prepared; a later step of the same batch
        costs nothing."""
        dev = batch.q.device if batch is not None else device
        agree(batch_fingerprint(batch, self.mode, self.world_size), dev, self.group)
        self._agreed = batch

    def prepare(self, batch: ShardBatch) -> None:
        if self._agreed is not batch:
            self.agree(batch)
        T, Hq, D = batch.q.shape
        if self.mode == "all_to_all" and Hq % self.world_size:
            raise ValueError(f"mode: all_to_all splits the {Hq} query heads over {self.world_size} ranks; "
                             f"Hq % W must be 0")
        if batch.shard.world_size != self.world_size or batch.shard.rank != self.rank:
            raise ValueError(f"shard: made for rank {batch.shard.rank} of {batch.shard.world_size}, this process is "
                             f"rank {self.rank} of {self.world_size}")
        self.buffers(T, Hq, D, batch.q.device)
        prep = getattr(self.backend, "prepare", None)
        if prep is not None:
            prep(batch)

    def states(self, batch: ShardBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """This rank's float32 ``(o [T, Hq, D], lse [T, Hq])``: empty rows ``0, -inf``."""
        o, lse = self.backend(batch)
        return o, lse

    def pack(self, o: torch.Tensor, lse: torch.Tensor) -> torch.Tensor:
        """o and lse into the send buffer ``[T, Hq, D + 1]`` (lse in the last channel)."""
        T, Hq, D = o.shape
        send, _ = self.buffers(T, Hq, D, o.device)
        send[..., :D].copy_(o)
        send[..., D].copy_(lse)
        return send

    def communicate(self, send: torch.Tensor) -> torch.Tensor:
        """The one collective: the receive buffer ``[W, T, Hq (or Hq / W), D + 1]`` filled from every rank."""
        T, Hq, D1 = send.shape
        _, recv = self.buffers(T, Hq, D1 - 1, send.device)
        W = self.world_size
        if T == 0:  # q is the same on every rank: all skip the collective together
            return recv
        if self.mode == "all_gather":
            if W == 1:
                recv[0].copy_(send)
            else:
                _all_gather_packed(recv, send, self.group)
        else:
            # [T, W, Hq/W, D+1] -> [W, T, Hq/W, D+1]: chunk j goes to rank j
            chunks = send.view(T, W, Hq // W, D1).transpose(0, 1).contiguous()
            if W == 1:
                recv.copy_(chunks)
            else:
                dist.all_to_all_single(recv, chunks, group=self.group)
        return recv

    @staticmethod
    def merge(recv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The exact merge over the ranks' states (axis 0 of ``recv``): float32 ``(out, lse)``."""
        D = recv.shape[-1] - 1
        return merge_states(recv[..., :D], recv[..., D], dim=0)

    def exchange(self, o: torch.Tensor, lse: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Pack, one collective, merge. all_gather: ``(out [T, Hq, D], lse [T, Hq])`` float32;
        all_to_all: this rank's heads ``(out [T, Hq / W, D], lse [T, Hq / W])``."""
        return self.merge(self.communicate(self.pack(o, lse)))

    def run(self, batch: ShardBatch) -> tuple[torch.Tensor, torch.Tensor]:
        if self._agreed is not batch:  # ranks agree on a batch before its first collective
            self.agree(batch)
        o, lse = self.states(batch)
        return self.exchange(o, lse)

    def heads(self, num_q_heads: int) -> slice:
        """The query heads this rank ends with (all of them with all_gather)."""
        if self.mode == "all_gather":
            return slice(0, num_q_heads)
        n = num_q_heads // self.world_size
        return slice(self.rank * n, (self.rank + 1) * n)


def cp_decode(q, k_cache, v_cache, s: Shard, *, query_start_loc=None, scale=None, soft_cap=None, window_left=None,
              k_scale=None, v_scale=None, k_offset=None, v_offset=None, backend: ShardBackend | None = None,
              group=None, mode: str = "all_gather", out_dtype=None) -> tuple[torch.Tensor, torch.Tensor]:
    """One context-parallel decode step on this rank (every rank of ``group`` calls it).

    Args:
        q: ``[T, Hq, D]``, the same on every rank. k_cache, v_cache: this rank's cache
            ``[P, page, Hkv, D]``; ``s``: this rank's :class:`Shard` whose block table indexes it
            (:func:`~splitkv_common.cp_sharding.localize`). Other arguments as ``docs/conventions.md``.
        backend: per-rank states (default :func:`torch_shard_backend`); mode: ``all_gather`` or
            ``all_to_all``; out_dtype: default q's dtype.

    Returns:
        ``(out, lse)``: ``out`` in ``out_dtype``, ``lse`` float32 natural log; ``[T, Hq, ...]`` with
        all_gather, this rank's ``Hq / W`` heads (``ContextParallelDecode.heads``) with all_to_all.
    """
    cp = ContextParallelDecode(backend, group=group, mode=mode)
    try:
        batch = make_batch(s, q, k_cache, v_cache, query_start_loc=query_start_loc, scale=scale, soft_cap=soft_cap,
                           window_left=window_left, k_scale=k_scale, v_scale=v_scale, k_offset=k_offset,
                           v_offset=v_offset)
    except (ValueError, TypeError):
        try:
            cp.agree(None, q.device)   # the other ranks fail with this one instead of waiting for it
        except ValueError:
            pass
        raise
    cp.prepare(batch)
    out, lse = cp.run(batch)
    return out.to(out_dtype or q.dtype), lse


# -- launching a local process group (tests, benchmarks) --------------------------------------------

def _spawn_entry(rank, fn, world_size, backend, init_file, result_dir, args, timeout_s):
    if backend == "nccl":
        torch.cuda.set_device(rank)
    elif backend == "hccl":  # pragma: no cover - needs torch_npu on an Ascend node (not run in this project)
        import torch_npu  # noqa: F401  (registers torch.npu and the hccl backend)
        torch.npu.set_device(rank)
    dist.init_process_group(backend, init_method=f"file://{init_file}", rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=timeout_s))
    try:
        result = fn(rank, world_size, *args)
        with open(os.path.join(result_dir, f"rank{rank}.pkl"), "wb") as f:
            pickle.dump(result, f)
    finally:
        dist.destroy_process_group()


def launch_local(fn, world_size: int, *args, backend: str = "gloo", timeout_s: float = 120.0) -> list:
    """Run ``fn(rank, world_size, *args)`` in ``world_size`` spawned processes of one local process
    group (``backend``: gloo, nccl: one GPU per rank, hccl) and return each rank's return value.

    ``fn`` must be importable by the children (a module-level function); results are pickled."""
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory(prefix="splitkv-cp-") as tmp:
        init_file = os.path.join(tmp, "store")
        mp.spawn(_spawn_entry, args=(fn, world_size, backend, init_file, tmp, args, timeout_s), nprocs=world_size,
                 join=True)
        out = []
        for r in range(world_size):
            with open(os.path.join(tmp, f"rank{r}.pkl"), "rb") as f:
                out.append(pickle.load(f))
        return out
