"""Per-process counters of what the plugin routed, and how to collect them from vLLM's workers.

The model runs in vLLM's worker processes (EngineCore's executor), not in the process that made
the ``LLM``/server: the counters below live in each worker. Two ways to read them:

* ``llm.collective_rpc(splitkv_vllm.stats.worker_stats)``: vLLM runs :func:`worker_stats` in every
  worker and returns one dict per worker (a callable is sent by cloudpickle, by reference to this
  module; vLLM V1 wants ``VLLM_ALLOW_INSECURE_SERIALIZATION=1`` for that).
* ``stats_dir`` (``SPLITKV_VLLM_STATS_DIR``): each worker writes ``splitkv-stats-<pid>.json`` there
  at its first routed step, first capture, first refresh, every power-of-two count after that, and
  at exit; :func:`read_dir` reads them back. A worker killed before exit may leave counts that lag
  (never a zero where something was routed: the first event is written at once).

Counters: ``routed_steps`` (eager steps whose attention went through splitkv, counted once per step
and KV-cache group), ``routed_layer_calls``, ``graph_captures`` (layer captures of full graphs
recorded on our op), ``graph_refreshes`` (steps of a captured size whose graph buffers the builder
rewrote), ``uniform_graph_steps`` (those of them that are uniform-decode batches: the steps vLLM
replays), ``graph_replays`` (replays of our graphs, counted on the device at replay; read by
:func:`worker_stats` and at exit), ``fallbacks`` (reason -> count of steps or captures left on vLLM
Ascend's path).
"""

from __future__ import annotations

import atexit
import glob
import json
import os
import threading

COUNTERS = ("routed_steps", "routed_layer_calls", "graph_captures", "graph_refreshes")
_LOCK = threading.Lock()
_STATE: dict = {}


def reset() -> None:
    with _LOCK:
        _STATE.clear()
        _STATE.update({k: 0 for k in COUNTERS}, fallbacks={})


reset()


def _bump(name: str) -> None:
    with _LOCK:
        _STATE[name] += 1
        n = _STATE[name]
    if n & (n - 1) == 0:  # 1, 2, 4, 8, ...: the first event is on disk at once
        write()


def note_routed(meta) -> None:
    """A layer's eager decode went through splitkv (``meta``: the step's metadata, counted once)."""
    with _LOCK:
        _STATE["routed_layer_calls"] += 1
    if meta is not None and not getattr(meta, "_splitkv_counted", False):
        try:
            meta._splitkv_counted = True
        except AttributeError:
            pass
        _bump("routed_steps")


def note_capture() -> None:
    _bump("graph_captures")


def note_refresh() -> None:
    _bump("graph_refreshes")


def note_fallback(reason: str) -> None:
    with _LOCK:
        f = _STATE["fallbacks"]
        f[reason] = f.get(reason, 0) + 1


_REPLAY_COUNTS: list = []   # splitkv_vllm.graph.replay_counts, once graph mode is loaded (it registers it)


def count_replays_with(fn) -> None:
    """Where :func:`snapshot` reads the graphs' replay counts from (``splitkv_vllm.graph`` registers
    its ``replay_counts`` when it is imported; without graph mode there are no graphs)."""
    _REPLAY_COUNTS[:] = [fn]


def snapshot(read_device: bool = False) -> dict:
    """This process's counters, its pid and the plugin's state; with ``read_device`` also the replays
    of our graphs counted on the device (:func:`splitkv_vllm.graph.replay_counts`: a device read per
    graph, so only where no step or capture runs: the RPC, the exit)."""
    from . import plugin, settings

    with _LOCK:
        state = {k: _STATE[k] for k in COUNTERS}
        state["fallbacks"] = dict(_STATE["fallbacks"])
    try:
        state.update(_REPLAY_COUNTS[0](read_device) if _REPLAY_COUNTS else
                     {"uniform_graph_steps": 0, "graph_replays": 0 if read_device else None})
    except Exception as e:  # noqa: BLE001 - counting must never stop a step or a collection
        state.update(uniform_graph_steps=None, graph_replays=None, replay_count_error=f"{type(e).__name__}: {e}")
    return {"pid": os.getpid(), **state, "plugin": plugin.status(), "settings": settings.as_dict()}


def worker_stats(worker=None) -> dict:
    """For ``collective_rpc``: vLLM calls it with the worker object (between steps); returns
    :func:`snapshot` with the replays read from the device."""
    return snapshot(read_device=True)


def stats_path(directory: str, pid: int | None = None) -> str:
    return os.path.join(directory, f"splitkv-stats-{os.getpid() if pid is None else pid}.json")


def write(directory: str | None = None, read_device: bool = False) -> str | None:
    """Write :func:`snapshot` to ``stats_dir`` (atomically); ``None`` when no directory is set. Never raises."""
    try:
        if directory is None:
            from . import settings

            directory = settings.current().stats_dir
        if not directory:
            return None
        os.makedirs(directory, exist_ok=True)
        path = stats_path(directory)
        tmp = f"{path}.tmp"
        with open(tmp, "w") as f:
            json.dump(snapshot(read_device), f)
        os.replace(tmp, path)
        return path
    except Exception:  # noqa: BLE001 - counting must never stop a step
        return None


def read_dir(directory: str) -> list[dict]:
    """The stats files the workers wrote into ``directory``."""
    out = []
    for path in sorted(glob.glob(os.path.join(directory, "splitkv-stats-*.json"))):
        try:
            with open(path) as f:
                out.append(json.load(f))
        except (OSError, ValueError):
            continue
    return out


def total(per_worker: list[dict]) -> dict:
    """Counters summed over workers, and how many reported (``graph_replays``: ``None`` when a worker
    did not read it from the device)."""
    tot = {k: sum(int(w.get(k, 0) or 0) for w in per_worker) for k in COUNTERS + ("uniform_graph_steps",)}
    reps = [w.get("graph_replays") for w in per_worker]
    tot["graph_replays"] = sum(reps) if reps and all(isinstance(r, int) for r in reps) else None
    tot["workers"] = len(per_worker)
    return tot


atexit.register(write, None, True)
