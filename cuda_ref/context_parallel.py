"""The Triton kernels as a per-rank backend of context-parallel decode
(:mod:`splitkv_common.context_parallel`, docs/context-parallel.md)."""

from __future__ import annotations

import torch

from splitkv_common.context_parallel import ShardBatch

from .wrapper import DecodeWrapper


class TritonShardBackend:
    """The rank's states with the Triton kernels of :mod:`cuda_ref` (float32 states, q's dtype in).

    ``prepare(batch)`` plans on the host: the local view with a :class:`cuda_ref.wrapper.DecodeWrapper`
    plan (``policy``, ``profile``) when :meth:`ShardBatch.local_view_exact`, else the global-view plan
    of the shard (``global_split_tokens`` cuts long runs). ``__call__`` only launches (no host sync,
    no allocation once prepared). ``forced_view``: ``"local"`` or ``"global"`` to override (tests,
    benchmarks; ``"local"`` raises where it would not be exact)."""

    def __init__(self, policy: str = "auto", profile: str = "h200", global_split_tokens: int = 0,
                 forced_view: str | None = None, **wrapper_kw):
        self.policy, self.profile, self.global_split_tokens = policy, profile, int(global_split_tokens)
        self.forced_view, self.wrapper_kw = forced_view, wrapper_kw
        self.wrapper = None
        self.view = None
        self._key = None
        self._prepared_for = None

    def _make_wrapper(self, batch: ShardBatch):
        class _StateWrapper(DecodeWrapper):
            """A DecodeWrapper whose output buffer is float32: the rank's state is merged across
            ranks, so it is not rounded to q's dtype first."""

            def set_plan(self, plan, **kw):
                super().set_plan(plan, **kw)
                out = self._buffers["out"]
                if out.dtype != torch.float32:
                    keep = self._buffers.get("out32")
                    if keep is None or keep.shape != out.shape:
                        keep = torch.zeros(out.shape, dtype=torch.float32, device=self.device)
                        self._buffers["out32"] = keep
                    self._buffers["out"] = keep

        T, Hq, D = batch.q.shape
        _, page, Hkv, _ = batch.k_cache.shape
        return _StateWrapper(Hq, Hkv, D, page, dtype=batch.q.dtype, kv_dtype=batch.k_cache.dtype,
                             device=batch.q.device, profile=self.profile, policy=self.policy, **self.wrapper_kw)

    def prepare(self, batch: ShardBatch) -> None:
        key = (tuple(batch.q.shape[1:]), tuple(batch.k_cache.shape[1:]), batch.q.dtype, batch.k_cache.dtype,
               str(batch.q.device))
        if self.wrapper is None or key != self._key:
            self.wrapper, self._key = self._make_wrapper(batch), key
        exact = batch.local_view_exact()
        view = self.forced_view or ("local" if exact else "global")
        if view == "local" and not exact:
            raise ValueError("forced_view: the local view is not exact for this shard (multi-query rows or a window "
                             "with global masking); use the global view")
        if view == "local":
            self.wrapper.plan(batch.shard.seq_lens, query_start_loc=batch.host_qsl, window_left=batch.window_left)
        else:
            self.wrapper.set_plan(batch.plan(self.global_split_tokens))
        self.view = view
        self._prepared_for = batch

    def __call__(self, batch: ShardBatch) -> tuple[torch.Tensor, torch.Tensor]:
        if self._prepared_for is not batch:  # the wrapper holds the plan of the batch prepared last
            self.prepare(batch)
        if self.view == "local":
            bt, sl = batch.block_table, batch.seq_lens
        else:
            bt, sl = batch.global_block_table, batch.global_seq_lens
        return self.wrapper.run(batch.q, batch.k_cache, batch.v_cache, bt, sl, batch.query_start_loc,
                                scale=batch.scale, soft_cap=batch.soft_cap, window_left=batch.window_left,
                                **batch.quant())
