"""vLLM full-graph mode: graph-stable buffers, refreshed in place before each replay.

A captured graph replays the same kernel launches on the same addresses, so everything a step
changes (the plan, the lengths, the block table) must be rewritten in place, on the host, before
the replay is enqueued:

* :class:`~splitkv_vllm.graph_decoder.GraphDecoder` keeps the graph-stable wrappers of one captured graph size and a fixed
  block-table buffer; :meth:`GraphDecoder.refresh` plans the step's padded batch and rewrites the
  buffers, :meth:`GraphDecoder.run` only enqueues kernels.
* With ``device_plan`` (``SPLITKV_VLLM_DEVICE_PLAN=1``) there is no plan per step: the kernels derive
  the work of a fixed split size (``split_tokens``) from the lengths on the device, and
  :meth:`GraphDecoder.refresh` only copies this step's lengths, query offsets and block table into
  the fixed buffers. Routes: the Ascend operator with ``deviceSplitTokens``
  (:class:`ascend_ops.AscendDecodeWrapper` ``device_split_tokens``) or the Triton kernels
  (:class:`cuda_ref.wrapper.DecodeWrapper` ``device_plan``). Layers with a sliding window keep the
  host plan (logged once).
* :func:`refresh_graph_step` is the metadata builder's host step, :func:`prepare_graph` the eager
  warm-up that makes a layer's buffers, :func:`graph_unsupported` says why a capture stays on vLLM
  Ascend's path, and :func:`forward_graph` is the captured decode.

Eager (non-graph) decode is :mod:`splitkv_vllm.adapter` and :mod:`splitkv_vllm.dispatch`.
"""

from __future__ import annotations

import logging
import sys
import types

import numpy as np
import torch

from . import settings, stats
from .adapter import LayerSpec, batch_unsupported, host_lengths, plan_options
from .graph_decoder import ROUTES, GraphDecoder  # noqa: F401  (splitkv_vllm.graph.GraphDecoder)
from .log import once

GRAPH_MAX_SPLITS_DEFAULT = 8

# (group, num_tokens) -> GraphDecoder; group: the metadata builder (one per KV-cache group)
GRAPH_DECODERS: dict = {}


def graph_options() -> dict:
    """Capacity of the graph-stable plans: ``graph_max_splits`` (``SPLITKV_VLLM_GRAPH_MAX_SPLITS``, 8) partial
    slots per query row, ``graph_max_work_items`` (``SPLITKV_VLLM_GRAPH_MAX_WORK_ITEMS``, default the
    planner's, :func:`splitkv_common.plan.graph_capacity`); ``split_tokens`` of device planning (0: off;
    ``SPLITKV_VLLM_DEVICE_PLAN`` / ``SPLITKV_VLLM_SPLIT_TOKENS``). Malformed values are logged and
    replaced by the default."""
    s = settings.current()
    return dict(max_splits=s.graph_max_splits, max_work_items=s.graph_max_work_items,
                split_tokens=s.split_tokens if s.device_plan else 0)


def graph_route(device) -> str:
    """The wrappers of full graphs on ``device``: the ``impl`` setting (``ascend`` / ``triton``); ``auto``:
    ``triton`` for CUDA tensors, else ``ascend`` (the NPU operator, or its CPU kernel)."""
    impl = settings.current().impl
    if impl in ROUTES:
        return impl
    return "triton" if torch.device(device).type == "cuda" else "ascend"


# Which cudagraph modes put our op inside full graphs (vLLM Ascend at VLLM_ASCEND_REFERENCE).
# vLLM Ascend's patch of CudagraphDispatcher._create_padded_batch_descriptor keeps a batch's uniform
# flag only when the mode has FULL graphs and is not plain FULL: in FULL_DECODE_ONLY and
# FULL_AND_PIECEWISE a full graph is keyed (and so replayed) only by uniform-decode batches, which
# are decode-only by construction; in plain FULL every batch is keyed non-uniform, so the one graph
# of a size replays decode-only and mixed (prefill + decode) batches alike, and a decode-only kernel
# captured in it would be replayed on prefill rows. Attention of PIECEWISE graphs runs eagerly.
GRAPH_MODE_ROUTING = {
    "NONE": ("eager", "no graphs: every decode-only step is routed eagerly"),
    "PIECEWISE": ("eager", "attention runs eagerly between the captured pieces: every decode-only step is routed"),
    "FULL_DECODE_ONLY": ("full", "uniform-decode full graphs are captured on our op; other steps run eagerly "
                                 "and their decode-only ones are routed"),
    "FULL_AND_PIECEWISE": ("full", "uniform-decode full graphs are captured on our op; other steps run piecewise "
                                   "(attention eager) and their decode-only ones are routed"),
    "FULL": ("none", "vLLM Ascend keys every FULL graph non-uniform, so one graph per size replays mixed batches "
                     "too: captures stay on vLLM Ascend's path; only eager steps (over the largest capture size) "
                     "are routed, and no graph buffers are made"),
}


def mode_name(mode) -> str:
    """``CUDAGraphMode.FULL_DECODE_ONLY`` / ``"FULL_DECODE_ONLY"`` / ``None`` -> ``"FULL_DECODE_ONLY"`` / ``"NONE"``."""
    if mode is None:
        return "NONE"
    name = getattr(mode, "name", None) or str(mode).rsplit(".", 1)[-1]
    return str(name).upper()


def full_graphs_routed(mode) -> bool:
    """Whether full graphs captured in ``mode`` run our op (and so need graph buffers)."""
    return GRAPH_MODE_ROUTING.get(mode_name(mode), ("none", ""))[0] == "full"


def mode_routing(mode) -> str:
    """One line: what the plugin routes in cudagraph ``mode``."""
    name = mode_name(mode)
    return f"{name}: " + GRAPH_MODE_ROUTING.get(name, ("none", "unknown mode: captures stay on vLLM Ascend's path"))[1]


def replay_counts(read_device: bool = False) -> dict:
    """``uniform_graph_steps``: uniform-decode steps of captured sizes the builders refreshed (host
    count: the steps vLLM replays); ``graph_replays`` (``read_device``: one device-to-host read per
    graph, so never inside a step or a capture; else ``None``): replays of our captured graphs,
    counted on the device by the replays themselves. Both summed over the KV-cache groups."""
    uniform = sum(dec.uniform_steps for dec in GRAPH_DECODERS.values())
    replays = None
    if read_device:
        replays = 0
        for dec in GRAPH_DECODERS.values():
            if dec.replays is not None and dec.layers_captured:
                replays += int(dec.replays.item())
    return {"uniform_graph_steps": uniform, "graph_replays": replays}


stats.count_replays_with(replay_counts)


# -- memory: the graph buffers are made after vLLM sized the KV cache; hold their bytes during profiling --

_RESERVE: dict = {}   # device str -> {"tensor", "bytes", "keys"}


def decode_sizes(vllm_config) -> tuple[int, ...]:
    """The capture sizes that get a FULL uniform-decode graph: ``q <= x <= max_num_seqs * q`` with
    ``q = 1 + num_speculative_tokens`` (vLLM's ``capture_model``; vLLM Ascend's
    ``_compute_decode_cudagraph_batch_sizes``), ascending; all capture sizes when ``max_num_seqs`` is
    not in the config."""
    cc = getattr(vllm_config, "compilation_config", None)
    sizes = sorted({int(x) for x in (getattr(cc, "cudagraph_capture_sizes", None) or ())})
    q = speculative_rows(types.SimpleNamespace(vllm_config=vllm_config)) or 1
    seqs = getattr(getattr(vllm_config, "scheduler_config", None), "max_num_seqs", None)
    hi = int(seqs) * q if isinstance(seqs, int) and seqs > 0 else None
    return tuple(x for x in sizes if x >= q and (hi is None or x <= hi))


def _host_decoder(n: int, key: tuple, max_pages: int, opts: dict, query_rows: int = 1) -> "GraphDecoder":
    """The :class:`GraphDecoder` of ``n`` tokens for layer constants ``key``, made on the host (CPU
    tensors) with the capacity the real buffers get and planned once for a uniform-decode batch of
    ``query_rows`` rows per request (the capture's shape, which fixes the launch), so its sizes are the
    real ones (graph-stable: they do not depend on the lengths)."""
    dec = GraphDecoder(num_tokens=n, max_reqs=n + 1, max_splits=opts["max_splits"], max_work_items=opts["max_work_items"],
                       profile=plan_options()["device"], policy=plan_options()["policy"],
                       split_tokens=opts["split_tokens"])
    k_cache = torch.empty((1, key[3], key[1], key[2]), dtype=key[5])
    dec.add(key, k_cache=k_cache, max_pages=max_pages)
    qsl = np.unique(np.append(np.arange(0, n, int(query_rows)), n)).astype(np.int32)
    B = qsl.size - 1
    dec.refresh(np.ones(B, np.int32), qsl, torch.zeros((B, max_pages), dtype=torch.int32))
    return dec


def workspace_floats(key: tuple, num_tokens: int, max_pages: int, query_rows: int = 1) -> int:
    """Float32 words of the workspace of the graph of ``num_tokens`` tokens (the largest of a group's
    graphs: the size of the workspace they share)."""
    dec = _host_decoder(int(num_tokens), key, int(max_pages), graph_options(), query_rows)
    return int(dec.wrappers[key]._buffers["workspace"].numel())


def _nbytes(t) -> int:
    return 0 if t is None else t.numel() * t.element_size()


def estimate_graph_bytes(*, num_q_heads: int, num_kv_heads: int, head_dim: int, page_size: int, dtype, kv_dtype,
                         max_model_len: int, capture_sizes, window_left=None, soft_cap=None, scale=1.0,
                         query_rows: int = 1) -> int:
    """Bytes of the graph buffers one set of layer constants takes over the decode graph sizes
    ``capture_sizes`` (:func:`decode_sizes`): each size's block table, lengths, plan words and outputs,
    and one workspace, the largest size's, which they share. Planned on the host (CPU tensors) with the
    capacity the real buffers get, so the sizes are the real ones."""
    opts = graph_options()
    max_pages = -(-int(max_model_len) // int(page_size))
    key = GraphDecoder.key(num_q_heads=num_q_heads, num_kv_heads=num_kv_heads, head_dim=head_dim, page_size=page_size,
                           dtype=dtype, kv_dtype=kv_dtype, scale=scale, soft_cap=soft_cap, window_left=window_left)
    total = workspace = 0
    for n in sorted({int(x) for x in capture_sizes}):
        dec = _host_decoder(n, key, max_pages, opts, query_rows)
        bufs = dec.wrappers[key]._buffers
        total += _nbytes(dec.block_table) + _nbytes(dec.seq_lens) + _nbytes(dec.query_start_loc)
        total += sum(_nbytes(b) for name, b in bufs.items() if name not in ("workspace", "tiling", "plan"))
        workspace = max(workspace, _nbytes(bufs["workspace"]))
    return total + workspace


def made_graph_bytes(group=None) -> int:
    """Bytes the graph buffers made so far hold (of ``group``, default every group): each distinct
    store once (a shared workspace counts once)."""
    seen: dict = {}
    for (g, _), dec in GRAPH_DECODERS.items():
        if group is not None and g is not group:
            continue
        for t in (dec.block_table, dec.seq_lens, dec.query_start_loc):
            if t is not None:
                seen[t.untyped_storage().data_ptr()] = _nbytes(t)
        for w in dec.wrappers.values():
            for t in getattr(w, "_stores", {}).values():
                seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    return sum(seen.values())


def reserve_graph_memory(key: tuple, nbytes: int, device) -> None:
    """Hold ``nbytes`` more on ``device`` (once per set of layer constants) until :func:`release_graph_memory`.

    Called while vLLM loads the model, before its profile run: the profile then counts these bytes as
    used, and the KV cache is sized without them. The graph warm-up releases the block just before it
    makes the real buffers, so the caching allocator hands the same memory back."""
    dev = str(device)
    r = _RESERVE.setdefault(dev, {"tensor": None, "bytes": 0, "keys": set()})
    if key in r["keys"] or nbytes <= 0:
        return
    r["keys"].add(key)
    r["bytes"] += int(nbytes)
    r["tensor"] = None  # one block of the new total (freeing the old one first)
    r["tensor"] = torch.empty(r["bytes"], dtype=torch.uint8, device=device)


def release_graph_memory(device=None) -> int:
    """Free the reserved block(s); returns the bytes released."""
    freed = 0
    for dev in list(_RESERVE):
        if device is None or dev == str(device):
            freed += _RESERVE[dev]["bytes"] if _RESERVE[dev]["tensor"] is not None else 0
            _RESERVE[dev]["tensor"] = None
    return freed


def reserved_bytes(device=None) -> int:
    return sum(r["bytes"] for d, r in _RESERVE.items() if r["tensor"] is not None and (device is None or d == str(device)))


def graph_lengths(meta) -> tuple[np.ndarray, np.ndarray]:
    """Host ``(query_start_loc, seq_lens)`` of a padded step, padding requests given ``seq_len 0``.

    A request is padding when its query rows start at or after ``num_actual_tokens`` (the runner's
    uniform-decode padding and the dummy request vLLM Ascend appends for FIA); its rows come back
    ``out = 0``, ``lse = -inf`` and read no KV.
    """
    qsl, sl = host_lengths(meta)
    real = int(getattr(meta, "num_actual_tokens", 0) or 0) or int(qsl[-1])
    sl = np.where(qsl[:-1] < real, sl, 0).astype(np.int32)
    return qsl, sl


def speculative_rows(group) -> int:
    """Query rows per request of a uniform-decode step, ``1 + num_speculative_tokens``, from the builder's
    vLLM config (0 when it has none: the warm-up step decides, :meth:`GraphDecoder.layout`)."""
    spec = getattr(getattr(group, "vllm_config", None), "speculative_config", None)
    k = getattr(spec, "num_speculative_tokens", None)
    return 1 + int(k) if isinstance(k, int) and k > 0 else 0


def graph_decoder(group, meta, *, device=None):
    """The :class:`GraphDecoder` of this group and the step's padded size (made for ``device`` if new
    and ``device`` is given, else ``None`` when there is none)."""
    n = int(meta.actual_seq_lengths_q[-1])
    dec = GRAPH_DECODERS.get((group, n))
    if dec is None and device is not None:
        opts = graph_options()
        dec = GraphDecoder(num_tokens=n, max_reqs=n + 1, max_splits=opts["max_splits"],
                           max_work_items=opts["max_work_items"], profile=plan_options()["device"],
                           policy=plan_options()["policy"], route=graph_route(device),
                           split_tokens=opts["split_tokens"], max_q_len=speculative_rows(group))
        GRAPH_DECODERS[(group, n)] = dec
    return dec


def drop_graph_mark(meta) -> None:
    """This step does not use graph buffers: its layers run eagerly (a capture of it stays on vLLM
    Ascend's path)."""
    for name in ("_splitkv_graph_group", "_splitkv_graph_decoder"):
        try:
            setattr(meta, name, None)
        except AttributeError:
            pass


def uniform_decode(meta, group) -> bool:
    """Whether the step is a uniform-decode batch, which vLLM replays in a FULL graph of its padded size:
    every real request (query rows before ``num_actual_tokens``) has ``1 + num_speculative_tokens``
    query rows (:func:`speculative_rows`, 1 without speculation)."""
    qsl, _ = host_lengths(meta)
    real = int(getattr(meta, "num_actual_tokens", 0) or 0) or int(qsl[-1])
    q_lens = np.diff(qsl)[qsl[:-1] < real]
    return bool(q_lens.size) and bool((q_lens == (speculative_rows(group) or 1)).all())


def refresh_graph_step(meta, group) -> None:
    """The metadata builder's step in full-graph mode (host, before the model runs, so before any replay).

    Marks ``meta`` as built for graph mode by ``group``; if a graph of this padded size has buffers
    (made by an eager warm-up step before its capture), plans the padded batch and rewrites them in
    place, ordered on the current stream before the replay that reads them.

    A batch the buffers cannot take (over their work-item or request capacity, lengths they cannot
    hold) raises only when a captured graph of this size will replay it (a uniform-decode step):
    the replay would read the previous step's buffers. Any other step loses its graph mark and runs
    eagerly (logged once).
    """
    try:
        meta._splitkv_graph_group = group
    except AttributeError:
        return
    if batch_unsupported(meta):
        return
    dec = graph_decoder(group, meta)
    if dec is None:
        return
    qsl, sl = graph_lengths(meta)
    bt = meta.block_tables[:sl.shape[0]]
    try:
        dec.refresh(sl, qsl, bt if bt.dtype == torch.int32 else bt.to(torch.int32))
    except ValueError as e:
        if dec.captured and uniform_decode(meta, group):
            raise
        once(logging.WARNING, "splitkv: a step of graph size %d runs eagerly: its batch does not fit the graph "
             "buffers (%s)", dec.num_tokens, e)
        drop_graph_mark(meta)
        return
    meta._splitkv_graph_decoder = dec
    if dec.block_table is not None:   # the kernels' error counts, every N steps
        from . import errors

        errors.tick(dec.block_table.device)
    if dec.captured:
        stats.note_refresh()
        if uniform_decode(meta, group):
            dec.uniform_steps += 1


def _graph_key(layer: LayerSpec, query, key_cache):
    return GraphDecoder.key(num_q_heads=layer.num_heads, num_kv_heads=layer.num_kv_heads, head_dim=layer.head_size,
                            page_size=int(key_cache.shape[1]), dtype=query.dtype, kv_dtype=key_cache.dtype,
                            scale=layer.scale, soft_cap=layer.soft_cap, window_left=layer.window_left)


# (group, layer-constants key) -> the float32 workspace the group's graphs of those constants share
GRAPH_WORKSPACES: dict = {}


def capture_window_open() -> bool:
    """Whether vLLM is still before the end of its graph capture (``vllm.compilation.monitor``'s
    ``cudagraph_capturing_enabled``, which ``capture_model`` clears when it is done); True when that
    module is not loaded."""
    mod = sys.modules.get("vllm.compilation.monitor")
    return True if mod is None else bool(getattr(mod, "cudagraph_capturing_enabled", True))


def shared_workspace(group, key: tuple, device, max_pages: int):
    """The workspace the Ascend graphs of ``group`` with layer constants ``key`` share: sized for the
    largest decode graph (:func:`decode_sizes`), made at the first warm-up; ``None`` on the Triton route."""
    if graph_route(device) != "ascend":
        return None
    ws = GRAPH_WORKSPACES.get((group, key))
    if ws is None:
        sizes = decode_sizes(getattr(group, "vllm_config", None))
        if not sizes:
            return None
        try:
            floats = workspace_floats(key, max(sizes), max_pages, speculative_rows(group) or 1)
        except ValueError as e:   # the largest graph would not fit its buffers: each keeps its own workspace
            once(logging.WARNING, "splitkv: no shared graph workspace (%s)", e)
            return None
        ws = GRAPH_WORKSPACES[(group, key)] = torch.zeros(floats, dtype=torch.float32, device=device)
    return ws


def prepare_graph(layer: LayerSpec, query, key_cache, meta) -> None:
    """Eager step of a graph-mode batch: during vLLM's capture warm-up (:func:`capture_window_open`),
    make this layer's buffers for the step's padded size if they do not exist yet (host work and
    copies: never inside a capture). While serving (after the capture) nothing is made: a step whose
    graph was not captured simply runs eagerly."""
    group = getattr(meta, "_splitkv_graph_group", None)
    if group is None or batch_unsupported(meta) or not capture_window_open():
        return
    if int(query.shape[0]) != int(meta.actual_seq_lengths_q[-1]):
        return
    dec = graph_decoder(group, meta, device=key_cache.device)
    key = _graph_key(layer, query, key_cache)
    if dec.has(key):
        return
    release_graph_memory(key_cache.device)  # the reserve held during profiling: hand it to the real buffers
    qsl, sl = graph_lengths(meta)
    bt = meta.block_tables[:sl.shape[0]]
    ws = shared_workspace(group, key, key_cache.device, int(bt.shape[1]))
    dec.add(key, k_cache=key_cache, max_pages=int(bt.shape[1]), workspace=ws)  # planned at once if refreshed
    if getattr(meta, "_splitkv_graph_decoder", None) is not dec:
        dec.refresh(sl, qsl, bt if bt.dtype == torch.int32 else bt.to(torch.int32))
        meta._splitkv_graph_decoder = dec


# padded size -> {layer id: why} of the layers that stayed on vLLM Ascend's path in a warm-up of that size
WARM_UP_FALLBACKS: dict = {}


def note_warm_up(meta, layer_id: int, why: str | None) -> None:
    """An eager step built for graph mode (a warm-up before a capture, or a serving step of a graph size):
    remember a layer that stayed on vLLM Ascend's path (``why``), per padded size. A graph is routed all
    or nothing (:func:`capture_mixed`)."""
    if why is None or getattr(meta, "_splitkv_graph_group", None) is None:
        return
    ends = getattr(meta, "actual_seq_lengths_q", None)
    if ends:
        WARM_UP_FALLBACKS.setdefault(int(ends[-1]), {})[layer_id] = why


def capture_mixed(meta) -> str | None:
    """Why a capture of this padded size stays wholly on vLLM Ascend's path: a layer fell back in its
    warm-up, so the graph would mix our op with vLLM Ascend's FIA, whose captured parameters vLLM Ascend
    pairs with layers by position (``update_graph_params``); ``None`` when every layer was routed."""
    ends = getattr(meta, "actual_seq_lengths_q", None)
    seen = WARM_UP_FALLBACKS.get(int(ends[-1])) if ends else None
    if not seen:
        return None
    return (f"{len(seen)} layer(s) stay on vLLM Ascend's path in this graph ({next(iter(seen.values()))}); "
            "a graph is routed all or nothing")


def graph_unsupported(layer: LayerSpec, query, key_cache, meta) -> str | None:
    """``None`` when a full-graph capture of this step can run through splitkv, else why not."""
    dec = getattr(meta, "_splitkv_graph_decoder", None)
    if getattr(meta, "_splitkv_graph_group", None) is None:
        return "metadata not built by the splitkv metadata builder"
    if dec is None:
        return "no eager warm-up step of this graph size before the capture (no buffers)"
    if int(query.shape[0]) != dec.num_tokens:
        return f"query has {query.shape[0]} rows, the graph's plan {dec.num_tokens}"
    if not dec.has(_graph_key(layer, query, key_cache)):
        return "no eager warm-up step of this layer before the capture (no buffers)"
    return None


def forward_graph(layer: LayerSpec, query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor, meta,
                  output: torch.Tensor, *, full: bool = True) -> torch.Tensor:
    """Decode of a full-graph step into ``output`` (all ``num_tokens`` rows; padding rows ``0``).

    Only enqueues the kernels on the graph's fixed buffers (see :func:`refresh_graph_step`): no
    host read, no allocation, so a capture of it replays with each step's refreshed plan. ``full``:
    the capture records it (a FULL graph: the decoder is marked captured and its first layer records
    the replay count); else it runs eagerly on the refreshed buffers (attention of a PIECEWISE capture).
    """
    dec = meta._splitkv_graph_decoder
    if full:
        dec.captured = True
        dec.layers_captured += 1
    n = dec.num_tokens
    q = query.view(n, layer.num_heads, layer.head_size)
    dec.run(_graph_key(layer, query, key_cache), q, key_cache, value_cache,
            out=output.view(n, layer.num_heads, layer.head_size), count=full and dec.layers_captured == 1)
    return output
