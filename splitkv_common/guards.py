"""Guards of the calls that change state (docs/conventions.md, "Calls that change state").

A call that writes (a cache append, a plan, a graph refresh) checks everything first and then
writes, or restores what it changed: a refused call leaves the state as it was. The checks here
are shared by every backend (NumPy only, no torch import):

* :func:`check_validate`: the ``validate`` argument's one spelling (``True``, ``False``, ``"auto"``);
* :class:`ThreadOwner`: a ``plan()`` / ``run()`` wrapper is single-threaded; use from a second
  thread is refused;
* :func:`check_no_self_overlap`, :func:`check_disjoint_views`: a cache written in place has one
  memory location per element, and ``k_cache`` / ``v_cache`` do not share one;
* :func:`check_append_slots`: new tokens written into a paged cache go to distinct slots, none in
  a page that another request of the batch (or the request itself at another logical page) sees
  below its length.

Each docstring says what the check costs.
"""

from __future__ import annotations

import sys
import threading

import numpy as np

VALIDATE_CHOICES = (True, False, "auto")


def check_validate(validate, *, allow_auto: bool = True):
    """``validate`` as given, if it is ``True``, ``False`` or (where ``allow_auto``) ``"auto"``; anything
    else (``"yes"``, ``1``, ``None``, a NumPy bool) raises ``ValueError`` naming ``validate``: a
    truthy value that silently skipped the value checks is not a spelling of ``True``. O(1)."""
    if validate is True or validate is False or (allow_auto and isinstance(validate, str) and validate == "auto"):
        return validate
    allowed = "True, False or 'auto'" if allow_auto else "True or False"
    raise ValueError(f"validate: must be {allowed}, got {validate!r}")


class ThreadOwner:
    """A wrapper whose ``plan()`` and ``run()`` share state (the plan in use, the output buffers) is
    single-threaded: the thread of its first ``plan()`` / ``set_plan()`` owns it, and ``plan()`` or
    ``run()`` from another thread raises ``RuntimeError`` (a second thread would run with the first
    one's plan, or overwrite the outputs the first one is reading). Give each thread its own wrapper,
    or hand a wrapper over explicitly with :meth:`release_thread` (from the owner, once it is done
    with it). Cost: one ``threading.get_ident()`` call and one comparison per call."""

    _owner_thread: int | None = None

    def _claim_thread(self, what: str) -> None:
        if _compiling():  # inside a torch.compile trace: the thread check is the eager caller's
            return
        me = threading.get_ident()
        owner = self._owner_thread
        if owner is None:
            self._owner_thread = me
        elif owner != me:
            raise RuntimeError(
                f"{what}: {type(self).__name__} is single-threaded; it is used by thread {owner} (its plan() and "
                f"outputs belong to that thread), called from thread {me}. Give each thread its own wrapper, or "
                f"call release_thread() in the owner first")

    def _check_thread(self, what: str) -> None:
        """Raise unless the calling thread owns the wrapper (or nobody does yet); claims nothing."""
        if _compiling():
            return
        owner = self._owner_thread
        if owner is not None and owner != threading.get_ident():
            self._claim_thread(what)

    def release_thread(self) -> None:
        """Give up the owning thread: the next ``plan()`` / ``set_plan()`` (from any thread) owns it."""
        self._owner_thread = None


def _compiling() -> bool:
    """True while torch.compile traces the caller (Dynamo cannot trace ``threading.get_ident``; a
    compiled graph runs the thread check of the eager code that traced it). Without torch imported,
    False. O(1)."""
    torch = sys.modules.get("torch")
    return torch is not None and torch.compiler.is_compiling()


def _extent_ok(sizes, strides) -> bool:
    """Sufficient condition for a strided view to have one memory location per element: with the
    dimensions of more than one element sorted by stride, each stride is at least the span of the
    ones below it. (Exact for dense, permuted and sliced views; an exotic overlapping-free layout
    that fails it is refused conservatively.)"""
    dims = sorted((abs(int(st)), int(n)) for n, st in zip(sizes, strides) if int(n) > 1)
    span = 0   # elements (minus one) the dimensions below reach
    for st, n in dims:
        if st <= span:
            return False
        span += (n - 1) * st
    return True


def check_no_self_overlap(x, name: str) -> None:
    """``x`` (a tensor about to be written in place) has one memory location per element: an
    expanded view (stride 0) or another aliasing layout would write one slot for several and
    overwrite history. Refused with ``ValueError`` naming ``name``. O(rank)."""
    if x.numel() and not _extent_ok(x.shape, x.stride()):
        raise ValueError(f"{name}: its elements overlap in memory (an expanded or aliased view, strides "
                         f"{tuple(x.stride())} for shape {tuple(x.shape)}); new tokens cannot be written into it "
                         f"(each cache slot must have its own memory)")


def check_disjoint_views(a, b, names: str) -> None:
    """Two tensors written in place (``k_cache``, ``v_cache``) share no memory location: separate
    storages, or views of one buffer that interleave without overlapping (``kv[:, 0]`` and
    ``kv[:, 1]``, or ``kv[0]`` and ``kv[1]``). Otherwise ``ValueError`` naming ``names``. O(rank)."""
    if not a.numel() or not b.numel():
        return
    sa, sb = a.untyped_storage(), b.untyped_storage()
    if sa.data_ptr() != sb.data_ptr():
        return
    ea, eb = a.element_size(), b.element_size()
    lo_a = a.data_ptr()
    hi_a = lo_a + (sum((n - 1) * abs(st) for n, st in zip(a.shape, a.stride())) + 1) * ea
    lo_b = b.data_ptr()
    hi_b = lo_b + (sum((n - 1) * abs(st) for n, st in zip(b.shape, b.stride())) + 1) * eb
    if hi_a <= lo_b or hi_b <= lo_a:
        return   # disjoint byte ranges
    delta = lo_b - lo_a
    if (ea == eb and a.shape == b.shape and a.stride() == b.stride() and delta % ea == 0 and delta
            and _extent_ok(tuple(a.shape) + (2,), tuple(a.stride()) + (delta // ea,))):
        return   # the same layout at an offset that no element of the other reaches: interleaved, disjoint
    raise ValueError(f"{names}: share memory (views of one buffer that overlap); a token written into one "
                     f"would overwrite the other")


def check_append_slots(block_table, lengths, num_new: int, page_size: int, *, name: str = "block_table") -> None:
    """The slots ``num_new`` new tokens of each request go to (positions ``lengths[b] + j`` of
    request ``b``, through its ``block_table`` row; host int arrays, page ids already checked) may be
    written by one call without losing a token:

    * no slot is written twice (two requests, or one through an aliased row, on the same page slot);
    * no written page is one that another request of the batch sees below its length (its history,
      ``positions < lengths[b']``: prefix sharing of full pages is legal, appending into a shared page
      is not), nor one the writing request maps at another logical page of its history.

    Raises ``ValueError`` naming ``name`` (``block_table``, or ``cache_batch_idx`` for a contiguous
    cache) with the requests and the page. Cost: O(B x Sk + the history's pages) vectorised NumPy
    on the host (flash_compat reads the lengths on the host anyway)."""
    if num_new <= 0:
        return
    bt = np.asarray(block_table, np.int64)
    L = np.asarray(lengths, np.int64).reshape(-1)
    B, M = bt.shape
    if not B:
        return
    pos = L[:, None] + np.arange(num_new, dtype=np.int64)[None, :]              # [B, Sk]
    lp = pos // page_size
    wp = bt[np.arange(B)[:, None], lp]                                          # physical page written
    key = (wp * page_size + pos % page_size).reshape(-1)
    order = np.argsort(key, kind="stable")
    same = np.flatnonzero(key[order][1:] == key[order][:-1])
    if same.size:
        i, j = (int(x) for x in order[same[0]:same[0] + 2])
        (b1, t1), (b2, t2) = divmod(i, num_new), divmod(j, num_new)
        p, s = divmod(int(key[i]), page_size)
        who = f"request {b1} (new token {t1}) and request {b2} (new token {t2})" if b1 != b2 else \
              f"request {b1} (new tokens {t1} and {t2})"
        raise ValueError(f"{name}: {who} would both write page {p}, slot {s}; one call writes each cache slot at "
                         f"most once (duplicate or aliased rows)")
    # the written pages, once per (page, request, logical page)
    wb = np.repeat(np.arange(B, dtype=np.int64), num_new)
    wl, wpf = lp.reshape(-1), wp.reshape(-1)
    o = np.lexsort((wl, wb, wpf))
    wpf, wb, wl = wpf[o], wb[o], wl[o]
    keep = np.ones(wpf.size, bool)
    keep[1:] = (wpf[1:] != wpf[:-1]) | (wb[1:] != wb[:-1]) | (wl[1:] != wl[:-1])
    wpf, wb, wl = wpf[keep], wb[keep], wl[keep]
    # the history's pages: request b' sees its first ceil(lengths[b'] / page) block-table entries;
    # those that are written pages (a sorted lookup: O(H log W), not isin's O(H x W) for few pages)
    seen = -(-L // page_size)
    used = np.flatnonzero(np.arange(M)[None, :] < seen[:, None])
    hp = bt.reshape(-1)[used]
    pages = wpf[np.concatenate(([True], wpf[1:] != wpf[:-1]))]   # wpf is sorted: its distinct pages
    at = np.minimum(np.searchsorted(pages, hp), pages.size - 1)
    on = pages[at] == hp
    if not on.any():
        return
    hb, hj = np.divmod(used[on], M)
    hp = hp[on]
    first = np.searchsorted(wpf, hp, "left")
    count = np.searchsorted(wpf, hp, "right") - first
    other = (count > 1) | (wb[first] != hb) | (wl[first] != hj)
    if other.any():
        k = int(np.flatnonzero(other)[0])
        f = int(first[k])
        c = [f + x for x in range(int(count[k])) if (wb[f + x], wl[f + x]) != (hb[k], hj[k])][0]
        w, v = int(wb[c]), int(hb[k])
        seer = f"request {v} sees it below its length (its logical page {int(hj[k])}, length {int(L[v])})" \
            if v != w else f"the same request also maps it at logical page {int(hj[k])} of its history"
        raise ValueError(f"{name}: request {w} would write new tokens into page {int(hp[k])} (its logical page "
                         f"{int(wl[c])}), but {seer}; appending into a page another row reads would overwrite its "
                         f"history (give the request a page of its own)")
