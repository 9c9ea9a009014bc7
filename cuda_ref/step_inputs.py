"""A decode step's lengths on the device: :class:`StepInputs` (``seq_lens [B]`` and
``query_start_loc [B + 1]`` int32 in one device buffer, refreshed by one copy a step), what a
serving loop writes before replaying a device-planned graph of :class:`~cuda_ref.wrapper.DecodeWrapper`.
"""

from __future__ import annotations

import torch

from splitkv_common import native
from splitkv_common.validation import step_lengths

from .driver_launch import event_query_address


class StepInputs:
    """A decode step's per-step device inputs, ``seq_lens`` int32 ``[B]`` and ``query_start_loc``
    int32 ``[B + 1]``, as two views of one device buffer, refreshed by one non-blocking copy from one
    pinned host buffer (what a serving loop copies before replaying a device-planned graph: one copy,
    not two; ``query_start_loc`` starts on a 16-byte boundary)::

        inputs = StepInputs(B, device)
        with torch.cuda.graph(g):
            w.run(q, k_cache, v_cache, block_table, inputs.seq_lens, inputs.query_start_loc)
        inputs.update(lens, qsl); g.replay()          # each step: lens [B], qsl [B + 1] (host)

    The host buffers are a ring of ``ring`` (a CUDA event each, made once): one is rewritten only
    after its last copy has finished, so the host may prepare the next step while the device still
    copies this one. Off CUDA the buffers are CPU tensors and the copy a memcpy. ``update`` takes
    host arrays (NumPy or lists) of exactly ``B`` and ``B + 1`` entries; a padded graph's batch is
    padded by the caller (``seq_len = 0`` requests). Every write checks the values first
    (``validation.step_lengths``: lengths in ``[0, MAX_SEQ_LEN]``, offsets from 0 and non-decreasing,
    integers; ``ValueError`` naming the argument, never a wrapped or cut value; O(B), also in C).

    The copy can also be part of the graph (``in_graph=True``: one pinned host buffer, whose address
    the captured copy keeps); a step is then one write into host memory and one replay::

        inputs = StepInputs(B, device, in_graph=True)
        with torch.cuda.graph(g):
            inputs.copy()                             # captured: reads the pinned buffer at replay
            w.run(q, k_cache, v_cache, block_table, inputs.seq_lens, inputs.query_start_loc)
        inputs.replay(g, lens, qsl)                   # each step: write lens and qsl, replay

    ``replay`` waits for the previous replay's copy before it rewrites the buffer: the captured copy
    records an event at each replay, so a step records nothing on the host. With the C planner's module
    built, ``write`` (and so ``replay``) is one C call for int32 / int64 NumPy arrays (the event queried
    from C: ``splitkv_common.native``'s ``LengthsWriter``); anything else is written from Python."""

    def __init__(self, batch_size: int, device, ring: int = 2, in_graph: bool = False):
        if int(batch_size) < 0:
            raise ValueError(f"batch_size: must be >= 0, got {batch_size}")
        B = self.batch_size = int(batch_size)
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        self.in_graph = bool(in_graph)
        if self.in_graph:
            ring = 1   # the captured copy reads one fixed host address
        self._qsl_at = (B + 3) & ~3            # query_start_loc's offset: a multiple of 4 entries (16 bytes)
        n = self._qsl_at + B + 1
        self._dev = torch.zeros(n, dtype=torch.int32, device=self.device)
        self.seq_lens = self._dev[:B]
        self.query_start_loc = self._dev[self._qsl_at:]
        self._host = []
        for _ in range(max(1, int(ring))):
            t = torch.zeros(n, dtype=torch.int32, pin_memory=self.cuda)
            a = t.numpy()
            self._host.append((t, a[:B], a[self._qsl_at:]))
        self._events: list = [None] * len(self._host)
        self._next = 0
        # in_graph: write() in one C call (splitkv_common.native's LengthsWriter), where it is built
        self._writer = None
        mod = native.load() if self.in_graph and B else None
        if mod is not None and hasattr(mod, "LengthsWriter"):
            _, seq_np, qsl_np = self._host[0]
            self._writer = mod.LengthsWriter(seq_np, qsl_np, self._wait)

    def update(self, seq_lens, query_start_loc) -> None:
        """Copy this step's host ``seq_lens [B]`` and ``query_start_loc [B + 1]`` into the device views
        (one non-blocking copy on the current stream). Raises ``ValueError`` naming an argument of
        another length."""
        k = self._write(seq_lens, query_start_loc)
        self._dev.copy_(self._host[k][0], non_blocking=self.cuda)
        self._record(k)

    def copy(self) -> None:
        """``in_graph``: the copy from the pinned host buffer into the device views, called inside the
        graph's capture (what each replay then copies is what :meth:`replay` wrote)."""
        if not self.in_graph:
            raise ValueError("in_graph: copy() is for a StepInputs(in_graph=True); use update()")
        self._dev.copy_(self._host[0][0], non_blocking=self.cuda)
        self._record(0)

    def replay(self, graph, seq_lens, query_start_loc) -> None:
        """``in_graph``: write this step's ``seq_lens [B]`` and ``query_start_loc [B + 1]`` into the
        pinned buffer (after the previous replay's copy, which read it, has finished: the event that
        copy records), then ``graph.replay()``."""
        self.write(seq_lens, query_start_loc)
        graph.replay()

    def write(self, seq_lens, query_start_loc) -> None:
        """``in_graph``: :meth:`replay` without the replay (the write a serving loop makes of its
        batch's lengths and offsets for any attention backend; the graph's copy reads it)."""
        if not self.in_graph:
            raise ValueError("in_graph: replay() and write() are for a StepInputs(in_graph=True); use update()")
        w = self._writer
        if w is None or not w.write(seq_lens, query_start_loc):   # C: int32 / int64 arrays of B and B + 1
            self._write(seq_lens, query_start_loc)

    def _write(self, seq_lens, query_start_loc) -> int:
        """Write the host arrays into the next ring slot once its last copy has finished; the slot."""
        # checked before anything is written (validation.step_lengths: integers, lengths in
        # [0, MAX_SEQ_LEN], offsets from 0 and non-decreasing; O(B)): no value is wrapped or cut
        sl, qsl = step_lengths(seq_lens, query_start_loc, self.batch_size)
        k = self._next
        self._next = (k + 1) % len(self._host)
        self._wait(k)
        _, seq_np, qsl_np = self._host[k]
        seq_np[:] = sl
        qsl_np[:] = qsl
        return k

    def _wait(self, k: int = 0) -> None:
        """Until the last copy that read ring slot ``k`` has finished (its event queried first)."""
        ev = self._events[k]
        if ev is not None and not ev.query():
            ev.synchronize()

    def _record(self, k: int) -> None:
        """An event after the copy that reads ring slot ``k`` (CUDA only; made once per slot,
        ``external`` so that a record inside a capture becomes a node of the graph: each replay
        records it, and the host records nothing per step)."""
        if self.cuda:
            ev = self._events[k]
            if ev is None:
                ev = self._events[k] = torch.cuda.Event(external=True)
            ev.record()
            if self._writer is not None and not self._writer.event:   # in_graph: one slot, one event
                self._writer.set_event(ev.cuda_event, event_query_address())
