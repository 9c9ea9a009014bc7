"""The metadata checks of :class:`cuda_ref.wrapper.DecodeWrapper` calls (no host sync, so also
while a CUDA graph is captured): :class:`CallChecks`, the wrapper's ``check()`` and the state it keeps
(the last call that passed as one :func:`~cuda_ref.checks.call_guard`, the signatures that passed).

The wrapper provides ``host_plan``, ``device_plan``, ``spec``, ``dtype``, ``kv_dtype``, ``device``,
``_plan_sig`` (the plan's batch and rows) and ``_plan_pages`` (the pages of a request it reads)."""

from __future__ import annotations

import torch

from splitkv_common.validation import check_wrapper_tensors, normalize_window

from .checks import SignatureCache, any_batch_key, call_guard, check_launch, check_scalars, tensor_signature


class _Sizes:
    """The plan sizes :meth:`PlanSpec.check_shapes` reads, for a device-made plan (from the tensors)."""

    def __init__(self, batch_size: int, num_rows: int):
        self.batch_size, self.num_rows = batch_size, num_rows



class CallChecks:
    """``check()`` and its caches, for :class:`cuda_ref.wrapper.DecodeWrapper`."""

    def check(self, q, k_cache, v_cache, block_table, seq_lens, query_start_loc,
              k_scale=None, v_scale=None, k_offset=None, v_offset=None, *, scale=None, soft_cap=None,
              window_left=None):
        """Metadata checks (no host sync): ranks, shapes, strides, dtypes, devices, scalars, and the
        plan against the batch. Returns the call's signature (each tensor's shape, strides, dtype and
        device, the plan's batch and rows, the scalars with their types; None when it is not
        hashable).

        The last call that passed is remembered as one guard over its tensors' metadata and its
        scalars (:func:`~cuda_ref.checks.call_guard`: one C++ call where it builds): a call that
        matches it (the same shapes, strides, dtypes and devices, the same scalars; new tensor
        objects are fine, as for each layer of a model) passed every rule that call did, and costs
        that guard and one comparison of the block table's width with the pages the plan reads
        (which a new plan of the same batch may change). A plan of another batch or rows forgets the
        guard (:meth:`set_plan_sig`). Otherwise :meth:`_check_signature`: a signature that passed
        before costs one set lookup, one whose batch sizes alone are new a second lookup and a
        comparison of those sizes; anything else runs every check. ``run()`` calls the guard inline
        (the same rule) and this method only when it fails."""
        last = self._last_call   # None after a plan of another batch or rows (set_plan_sig)
        if last is not None and last[0](q, k_cache, v_cache, block_table, seq_lens, query_start_loc, k_scale, v_scale,
                                        k_offset, v_offset, scale, soft_cap, window_left):
            if self._plan_pages > last[1]:
                self._check_plan_pages(block_table)   # raises
            return last[2]
        key = self._check_signature(q, k_cache, v_cache, block_table, seq_lens, query_start_loc, k_scale, v_scale,
                                    k_offset, v_offset, scale, soft_cap, window_left)
        self._remember_call(key, q, k_cache, v_cache, block_table, seq_lens, query_start_loc, k_scale, v_scale,
                            k_offset, v_offset, scale, soft_cap, window_left)
        return key

    def _remember_call(self, key, q, k_cache, v_cache, block_table, seq_lens, query_start_loc, k_scale, v_scale,
                       k_offset, v_offset, scale, soft_cap, window_left) -> None:
        """A call that passed :meth:`_check_signature` becomes :meth:`check`'s guard (not one whose
        signature is not hashable: those always take the full checks)."""
        if key is None:
            self._last_call = None
            return
        try:
            same = call_guard(10, q, k_cache, v_cache, block_table, seq_lens, query_start_loc, k_scale, v_scale,
                              k_offset, v_offset, scale, soft_cap, window_left)
        except TypeError:   # not all torch tensors (a look-alike that matched a signature): no guard
            self._last_call = None
            return
        self._last_call = (same, block_table.shape[1], key)

    def set_plan_sig(self, sig: tuple) -> None:
        """The plan's (requests, rows), which every signature includes: a plan of others forgets
        :meth:`check`'s guard (the last call that passed)."""
        if sig != self._plan_sig:
            self._last_call = None
        self._plan_sig = sig

    def _check_signature(self, q, k_cache, v_cache, block_table, seq_lens, query_start_loc, k_scale, v_scale,
                         k_offset, v_offset, scale, soft_cap, window_left):
        """:meth:`check` past its guard: a signature (each tensor's shape, strides, dtype and device, the
        scalars, the plan's batch and rows) that passed once is remembered: repeating it costs one
        lookup, and the block table's width against the pages the plan reads one comparison. A batch
        of another size whose signature without the batch's sizes passed
        (:func:`~cuda_ref.checks.any_batch_key`) costs a second lookup and a comparison of those
        sizes with each other and with the plan. Otherwise every check runs."""
        s = tensor_signature
        try:
            key = (s(q), s(k_cache), s(v_cache), s(block_table), s(seq_lens), s(query_start_loc), s(k_scale),
                   s(v_scale), s(k_offset), s(v_offset), self._plan_sig, type(scale), scale, type(soft_cap), soft_cap,
                   type(window_left), window_left)
            if key in self._checked:
                self._check_plan_pages(block_table)
                return key
            wide = any_batch_key(key)
        except (AttributeError, TypeError, IndexError):  # not tensors (or 0-d), unhashable scalars: the full checks say what
            key = wide = None
        if wide is not None and wide in self._checked_any_batch and self._batch_fits(q, block_table, seq_lens,
                                                                                     query_start_loc):
            self._checked.add(key)
            self._check_plan_pages(block_table)
            return key
        plan = self.host_plan
        check_scalars(scale, soft_cap, window_left)
        if self.device_plan and normalize_window(window_left) is not None:
            raise ValueError("window_left: device_plan=True has no sliding window (plan on the host for one)")
        named = dict(q=q, k_cache=k_cache, v_cache=v_cache, block_table=block_table, seq_lens=seq_lens,
                     query_start_loc=query_start_loc, k_scale=k_scale, v_scale=v_scale, k_offset=k_offset,
                     v_offset=v_offset)
        check_wrapper_tensors(named, tensor_type=torch.Tensor, dtype=self.dtype, kv_dtype=self.kv_dtype,
                              int8_kv=self.kv_dtype == torch.int8, device=self.device,
                              on_device=lambda d: d == self.device or d.type == self.device.type == "cuda")
        self.spec.check_shapes(plan if not self.device_plan else _Sizes(block_table.shape[0], q.shape[0]), q, k_cache,
                               v_cache, block_table, seq_lens, query_start_loc)
        check_launch(q, k_cache, v_cache, block_table, seq_lens, query_start_loc, k_scale=k_scale, v_scale=v_scale,
                     k_offset=k_offset, v_offset=v_offset)
        self._check_plan_pages(block_table)
        if key is not None:
            self._checked.add(key)
            self._checked_any_batch.add(wide)
        return key

    def forget_checks(self) -> None:
        """Forget every signature that passed (the next call runs all the metadata checks again)."""
        self._checked = SignatureCache()
        self._checked_any_batch = SignatureCache()
        self._last_call = None   # check()'s guard: the last call that passed (_remember_call)

    def _batch_fits(self, q, block_table, seq_lens, query_start_loc) -> bool:
        """The batch's sizes agree with each other and with the plan (what :meth:`check`'s signature
        leaves out): ``seq_lens [B]`` and ``query_start_loc [B + 1]`` for the block table's ``B``
        requests, and a host plan's requests and rows. False: the full checks run (and say which
        rule broke)."""
        B = block_table.shape[0]
        if seq_lens.shape[0] != B or query_start_loc.shape[0] != B + 1:
            return False
        plan = self.host_plan
        return self.device_plan or (B == plan.batch_size and q.shape[0] == plan.num_rows)

    def _check_plan_pages(self, block_table) -> None:
        """The block table has the columns the plan reads (checked on every call: a new plan may read more)."""
        if block_table.shape[1] < self._plan_pages:
            raise ValueError(f"plan: reads {self._plan_pages} pages of a request; block_table has only "
                             f"{block_table.shape[1]} columns")
