"""Checks the Triton entry points make before a launch, and the plan check of ``set_plan``.

* :func:`check_scalars`: ``scale``, ``soft_cap``, ``window_left`` (the shared rules of
  ``docs/conventions.md``; the message names the argument and the rule).
* :func:`check_launch`: the metadata of a launch (ranks, shapes, dtypes, devices, strides): no
  device memory is read, so no host sync; safe inside a CUDA graph capture.
* :func:`call_guard`: one call's tensors' metadata (type, shape, strides, dtype, device) and
  scalars, to compare a later call's with in one C call (``call_guard.cpp``, built on first use;
  else :func:`tensor_guard`: torch's C ``TensorGuards`` where it passes a self-test, else Python):
  ``DecodeWrapper.check`` and the op keep the last call that passed this way.
* :class:`SignatureCache`: remembers the signatures (shapes, strides, dtypes, devices, scalars) that
  passed, so a repeated call past that guard costs one tuple and one set lookup.
* :func:`check_plan`: a plan's internal consistency through the shared ``Plan.validate`` (vectorised
  NumPy, host only): every work item's request, KV head, split and range, every row's partial slots
  inside the workspace.

The kernels do not rely on these for memory safety (they bound every address by the sizes of the
tensors they are given, ``cuda_ref.kernels``); these turn a wrong call into a clear error instead
of a silently wrong or partial result.
"""

from __future__ import annotations

import math
import numbers
import operator
import os
import sysconfig
from pathlib import Path

import numpy as np
import torch

# the kernels' error record and its message, one layout for every backend (re-exported here)
from splitkv_common.device_errors import ERROR_SLOTS, REQUEST_ERROR_NAMES, REQUEST_ERRORS, describe_errors  # noqa: F401

try:  # the shared rules, where splitkv_common has them public: one meaning for every backend
    from splitkv_common.validation import check_scalars as _shared_check_scalars
except ImportError:
    _shared_check_scalars = None

MIN_HEAD_DIM, MAX_HEAD_DIM = 16, 256


def _finite_positive(x) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool) and math.isfinite(x) and x > 0


def check_scalars(scale, soft_cap, window_left) -> None:
    """``scale`` None or a finite float > 0; ``soft_cap`` None or a finite float > 0; ``window_left``
    None, -1 (no window) or an int >= 0. Raises ``ValueError`` naming the argument. Calls the shared
    ``splitkv_common.validation.check_scalars`` where it exists (the same rules)."""
    if _shared_check_scalars is not None:
        _shared_check_scalars(scale, soft_cap, window_left)
    if scale is not None and not _finite_positive(scale):
        raise ValueError(f"scale: must be None or a finite float > 0, got {scale!r}")
    if soft_cap is not None and not _finite_positive(soft_cap):
        raise ValueError(f"soft_cap: must be None or a finite float > 0, got {soft_cap!r}")
    if window_left is not None and not (isinstance(window_left, numbers.Integral)
                                        and not isinstance(window_left, bool) and window_left >= -1):
        raise ValueError(f"window_left: must be None, -1 (no window) or an int >= 0, got {window_left!r}")


def tensor_signature(x):
    """What the checks of a tensor depend on: ``(shape, strides, dtype, device)`` (None for None)."""
    return None if x is None else (x.shape, x.stride(), x.dtype, x.device)


def _c_tensor_guards():
    """torch's C check of tensors' metadata (``torch._C._dynamo.guards.TensorGuards``, the one behind
    ``torch.compile``'s guards), or None where it is missing, refuses its arguments, or fails the
    self-test below (a private API: its behaviour is checked here, not assumed). It records, per
    tensor, the Python type, the dispatch key set (which carries the device type), dtype, device
    index, ``requires_grad``, sizes and strides; ``check(*tensors)`` is True only if every one is
    equal. ``SPLITKV_TENSOR_GUARDS=0`` leaves it unused (:func:`tensor_guard` falls back to Python)."""
    if os.environ.get("SPLITKV_TENSOR_GUARDS", "") == "0":
        return None
    try:
        from torch._C._dynamo.guards import TensorGuards
        a, b = torch.empty(2, 3), torch.empty(2, 3)

        def guard(*ts):   # both keywords always given (a call without them crashes some versions)
            return TensorGuards(*ts, dynamic_dims_sizes=None, dynamic_dims_strides=None).check

        same = guard(a, b)
        ok = same(a, b) and same(b[:], a.view(2, 3)) and not any(same(a, x) for x in (
            a.t(), torch.empty(2, 4)[:, :3], torch.empty(2, 3, 1), torch.empty(2, 3, dtype=torch.float64),
            torch.empty(2, 3, device="meta"), torch.empty(2, 3).requires_grad_()))
        return guard if ok and guard(a)(a) is True else None
    except Exception:  # noqa: BLE001 - any failure: the Python comparison instead
        return None


_C_GUARD = _c_tensor_guards()


def _py_guard(*tensors):
    """:func:`tensor_guard` in Python: each tensor's type, shape, strides, dtype and device, compared
    as one flat tuple."""
    want = [(type(t), t.shape, t.stride(), t.dtype, t.device) for t in tensors]

    def same(*ts) -> bool:
        try:
            return [(type(t), t.shape, t.stride(), t.dtype, t.device) for t in ts] == want
        except (AttributeError, TypeError):
            return False
    return same


def tensor_guard_kind() -> str:
    """Which :func:`tensor_guard` is used by default: ``"torch"`` (the C one) or ``"python"``."""
    return "torch" if _C_GUARD is not None else "python"


def tensor_guard(*tensors, native: bool | None = None):
    """A function ``same(*others) -> bool``: True only if ``others`` are as many tensors as
    ``tensors``, each of the same Python type, shape, strides, dtype and device as its counterpart
    (so every :func:`tensor_signature` is equal). May also say False for others that pass that (the
    C check compares ``requires_grad`` and the dispatch keys too, which ``torch.inference_mode``
    changes): the caller then checks the slow way. The C check says False for one tensor object given
    twice, so ``tensors`` with a repeated object get the Python one by default. One C call where torch has a working
    ``TensorGuards`` (about 0.5 µs for six tensors; :func:`_c_tensor_guards`), else the Python
    comparison of each tensor's metadata. ``native``: True / False to ask for one (True where the C
    one is missing: ``ValueError``); None: the C one where available. Holds no reference to the
    tensors."""
    if native is None:   # the C one refuses a tensor given twice (k_cache is v_cache): Python then
        native = _C_GUARD is not None and len({id(t) for t in tensors}) == len(tensors)
    if native:
        if _C_GUARD is None:
            raise ValueError("native: torch's TensorGuards is not available (or SPLITKV_TENSOR_GUARDS=0)")
        return _C_GUARD(*tensors)
    return _py_guard(*tensors)


_GUARD_SOURCE = Path(__file__).with_name("call_guard.cpp")


def _guard_build_args() -> list:
    """The C++ compiler's arguments for ``call_guard.cpp``: torch's and Python's headers, torch's
    libraries (found from the imported torch), its C++ ABI."""
    root = Path(torch.__file__).parent
    return ["-O2", "-shared", "-fPIC", "-std=c++17", "-w",
            f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}",
            f"-I{root / 'include'}", f"-I{sysconfig.get_paths()['include']}", f"-L{root / 'lib'}",
            "-ltorch_python", "-ltorch_cpu", "-lc10", f"-Wl,-rpath,{root / 'lib'}"]


def _self_test(cls) -> bool:
    """The built ``CallGuard`` says what :func:`call_guard` promises on a few CPU tensors and scalars."""
    a, b = torch.empty(2, 3), torch.empty(4)
    same = cls(2, a, None, 0.5, None, 3)
    like = [(torch.empty(2, 3), None, 0.5, None, 3), (a.view(2, 3), None, float("0.5"), None, 3)]
    unlike = [(a.t(), None, 0.5, None, 3), (torch.empty(2, 4)[:, :3], None, 0.5, None, 3),
              (a.double(), None, 0.5, None, 3), (a.to("meta"), None, 0.5, None, 3),
              (torch.nn.Parameter(a), None, 0.5, None, 3), (a, b, 0.5, None, 3), (a, None, 0.25, None, 3),
              (a, None, 0.5, 1.0, 3), (a, None, 0.5, None, 3.0), (a, None, 0.5, None, True), (a, None, 0.5, None),
              (None, None, 0.5, None, 3), (3, None, 0.5, None, 3), (a, None, float("nan"), None, 3)]
    other = object()
    return all(same(*x) is True for x in like) and not any(same(*x) for x in unlike) and \
        not cls(1, a, other)(a, other) and not cls(1, a, float("nan"))(a, float("nan"))


def _native_call_guard():
    """``(CallGuard class, status)``: the class of ``call_guard.cpp`` (built with ``$CXX``, default
    ``c++``, into the native cache, once per source, torch and Python version) where it builds and
    passes :func:`_self_test`; else ``(None, why not)``. ``SPLITKV_NATIVE=0`` leaves it unbuilt."""
    if os.environ.get("SPLITKV_NATIVE", "1") == "0":
        return None, "off (SPLITKV_NATIVE=0)"
    try:
        from splitkv_common.native import load_extension
        mod, target = load_extension("_splitkv_guard", _GUARD_SOURCE, _guard_build_args(),
                                     os.environ.get("CXX") or "c++", torch.__version__.encode())
        if not _self_test(mod.CallGuard):
            return None, "built, but failed its self-test"
    except Exception as e:   # noqa: BLE001 - no compiler, no headers: torch's or the Python guard
        return None, f"unavailable: {e}"
    return mod.CallGuard, f"loaded from {target}"


_NATIVE: list = []   # [(CallGuard class or None, status)] once tried


def native_guard_status() -> str:
    """Whether :func:`call_guard` uses the C++ guard, and if not, why (builds it on first use)."""
    if not _NATIVE:
        _NATIVE.append(_native_call_guard())
    return _NATIVE[0][1]


def call_guard_kind() -> str:
    """Which guard :func:`call_guard` makes by default: ``"native"`` (``call_guard.cpp``),
    ``"torch"`` (``TensorGuards`` and Python for the scalars) or ``"python"``."""
    native_guard_status()
    return "native" if _NATIVE[0][0] is not None else tensor_guard_kind()


def call_guard(n: int, *args, kind: "str | None" = None):
    """A function ``same(*others) -> bool``: True only if ``others`` are as many arguments as
    ``args`` and each of the first ``n`` (tensor slots) is None where its counterpart was None, else a
    tensor of the same Python type, shape, strides, dtype and device; each of the rest (scalar slots)
    None where its counterpart was None, else an ``int`` / ``float`` of the same exact type and value
    as its counterpart (NaN never equal; a slot that held another type never matches: its value may
    change under the same identity).
    ``TypeError`` where a tensor slot of ``args`` holds something else than a tensor or None.

    ``kind``: ``"native"`` (one C++ call, about 0.05 µs for ten slots; ``call_guard.cpp``, built on
    first use), ``"torch"`` / ``"python"`` (:func:`tensor_guard` for the tensors, the scalars in
    Python); None: :func:`call_guard_kind`. The torch one may also say False for calls that pass the
    rule (it compares ``requires_grad`` and the dispatch keys too): the caller then checks the slow way."""
    kind = kind or call_guard_kind()
    if kind == "native":
        native_guard_status()
        if _NATIVE[0][0] is None:
            raise ValueError(f"kind: the native guard is not available ({_NATIVE[0][1]})")
        return _NATIVE[0][0](n, *args)
    if kind not in ("torch", "python"):
        raise ValueError(f"kind: must be native, torch or python, got {kind!r}")
    slots, scalars = args[:n], args[n:]
    if not all(isinstance(t, torch.Tensor) for t in slots if t is not None):
        raise TypeError("call_guard: a tensor slot holds something else than a tensor or None")
    size = len(args)
    tensors_at = _picker([i for i, t in enumerate(slots) if t is not None])
    nones_at = _picker([i for i, t in enumerate(slots) if t is None])
    scalars_at = _picker(range(n, size))
    want_nones = nones_at(args)
    want_types = tuple(map(type, scalars))
    # a NaN never matches (as in the C++ guard; tuples would compare one NaN object equal to itself)
    comparable = all(a is None or type(a) in (int, float) and a == a for a in scalars)
    same_tensors = tensor_guard(*tensors_at(args), native=None if kind == "torch" else False)

    def same(*others) -> bool:
        if len(others) != size or not comparable or nones_at(others) != want_nones:
            return False
        got = scalars_at(others)
        if got != scalars or tuple(map(type, got)) != want_types:
            return False
        return same_tensors(*tensors_at(others))
    return same


def _picker(indices):
    """A function giving the tuple of a sequence's items at ``indices`` (``operator.itemgetter``, which
    gives a bare item for one index)."""
    idx = tuple(indices)
    if len(idx) > 1:
        return operator.itemgetter(*idx)
    return (lambda xs: ()) if not idx else (lambda xs, i=idx[0]: (xs[i],))


def _any_batch(sig):
    """A :func:`tensor_signature` without its first extent but whether that is 0, 1 or more."""
    if sig is None:
        return None
    shape = sig[0]
    n = shape[0]
    return shape[1:], n if n < 2 else 2, sig[1], sig[2], sig[3]


def any_batch_key(key: tuple) -> tuple:
    """``DecodeWrapper.check``'s signature (ten :func:`tensor_signature` of q, the caches,
    ``block_table``, ``seq_lens``, ``query_start_loc`` and the int8 scales, the plan's sizes, the
    scalars) without the batch's sizes: the first extents of q, ``block_table``, ``seq_lens`` and
    ``query_start_loc`` only as 0, 1 or more (the rules that depend on them ask only that: an empty
    tensor, a stride of an axis of one entry), the plan's sizes left out. Batches of every size from
    2 up share it; their sizes are compared with each other and the plan on every call."""
    a = _any_batch
    return (a(key[0]), key[1], key[2], a(key[3]), a(key[4]), a(key[5])) + key[6:10] + key[11:]


class SignatureCache:
    """A bounded set of call signatures that passed the checks. ``key(*tensors, extra=...)`` is the
    tuple of each tensor's (shape, strides, dtype, device) plus ``extra`` (hashable scalars, with
    their types, so ``True`` is not ``1``)."""

    def __init__(self, size: int = 64):
        self.size = size
        self._seen: set = set()

    @staticmethod
    def key(tensors, extra=()) -> tuple:
        return tuple(map(tensor_signature, tensors)) + tuple((type(e), e) for e in extra)

    def __contains__(self, key) -> bool:
        return key in self._seen

    def add(self, key) -> None:
        if len(self._seen) >= self.size:
            self._seen.clear()
        self._seen.add(key)


def _contiguous_axis(name, x, axis, what) -> None:
    if x.numel() > 0 and x.shape[axis] > 1 and x.stride(axis) != 1:
        raise ValueError(f"{name}: the {what} axis must have stride 1 (the kernels read it as one contiguous run), "
                         f"got strides {tuple(x.stride())} for shape {tuple(x.shape)}; pass .contiguous()")


def check_launch(q, k_cache, v_cache, block_table, seq_lens, query_start_loc, *, k_scale=None, v_scale=None,
                 k_offset=None, v_offset=None, scale=None, soft_cap=None, window_left=None) -> None:
    """Metadata of a launch of the split kernels (no device memory read). Ranks and shapes
    (``q [T, Hq, D]``, ``k_cache == v_cache [P, page, Hkv, D]``, ``block_table [B, max_pages]``,
    ``seq_lens [B]``, ``query_start_loc [B + 1]``, int8 scales ``[Hkv]`` / ``[Hkv, D]`` and offsets
    like them), dtypes (q float, the cache q's or int8 with scales, indices int32), one device,
    strides (the head-dim axis of q and the cache, the page axis of ``block_table``, ``seq_lens``,
    ``query_start_loc`` and a per-channel scale's channel axis contiguous; ``v_cache`` strided as
    ``k_cache``) and the scalars. Raises ``TypeError`` / ``ValueError`` naming the argument."""
    named = dict(q=q, k_cache=k_cache, v_cache=v_cache, block_table=block_table, seq_lens=seq_lens,
                 query_start_loc=query_start_loc, k_scale=k_scale, v_scale=v_scale, k_offset=k_offset,
                 v_offset=v_offset)
    for name, x in named.items():
        if x is None:
            if name in ("k_scale", "v_scale", "k_offset", "v_offset"):
                continue
            raise TypeError(f"{name}: required, got None")
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name}: expected a torch tensor, got {type(x).__name__}")
        if x.device != q.device:
            raise ValueError(f"{name}: on {x.device}, expected {q.device} (q's device)")
    if q.dim() != 3:
        raise ValueError(f"q: must be [T, Hq, D], got shape {tuple(q.shape)}")
    if k_cache.dim() != 4:
        raise ValueError(f"k_cache: must be [num_pages, page_size, Hkv, D], got shape {tuple(k_cache.shape)}")
    if v_cache.shape != k_cache.shape:
        raise ValueError(f"v_cache: shape {tuple(v_cache.shape)} must equal k_cache's {tuple(k_cache.shape)}")
    T, Hq, D = q.shape
    P, page, Hkv, Dk = k_cache.shape
    if Hq <= 0 or Hkv <= 0 or page <= 0:
        raise ValueError(f"q, k_cache: heads and page size must be positive (q {tuple(q.shape)}, "
                         f"k_cache {tuple(k_cache.shape)})")
    if Dk != D:
        raise ValueError(f"k_cache: head dim {Dk} must equal q's head dim {D}")
    if not MIN_HEAD_DIM <= D <= MAX_HEAD_DIM:
        raise ValueError(f"q: head dim {D} outside [{MIN_HEAD_DIM}, {MAX_HEAD_DIM}] (triton)")
    if Hq % Hkv:
        raise ValueError(f"q: Hq % Hkv must be 0 (GQA group size), got Hq={Hq}, Hkv={Hkv}")
    if q.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise TypeError(f"q: dtype must be float16, bfloat16 or float32, got {q.dtype}")
    if k_cache.dtype != v_cache.dtype:
        raise TypeError(f"v_cache: dtype {v_cache.dtype} must equal k_cache's {k_cache.dtype}")
    int8 = k_cache.dtype == torch.int8
    if not int8 and k_cache.dtype != q.dtype:
        raise TypeError(f"k_cache: dtype must equal q's ({q.dtype}) or be int8, got {k_cache.dtype}")
    _check_scales(int8, Hkv, D, k_scale, v_scale, k_offset, v_offset)
    if block_table.dim() != 2:
        raise ValueError(f"block_table: must be [B, max_pages], got shape {tuple(block_table.shape)}")
    B = block_table.shape[0]
    if tuple(seq_lens.shape) != (B,):
        raise ValueError(f"seq_lens: must be [B] = [{B}] (one per block_table row), got shape {tuple(seq_lens.shape)}")
    if tuple(query_start_loc.shape) != (B + 1,):
        raise ValueError(f"query_start_loc: must be [B + 1] = [{B + 1}], got shape {tuple(query_start_loc.shape)}")
    for name in ("block_table", "seq_lens", "query_start_loc"):
        if named[name].dtype != torch.int32:
            raise TypeError(f"{name}: dtype must be int32 for the triton backend, got {named[name].dtype}")
    for name in ("q", "k_cache", "v_cache"):
        _contiguous_axis(name, named[name], -1, "last (head-dim)")
    if v_cache.stride() != k_cache.stride():
        raise ValueError(f"v_cache: strides must equal k_cache's {k_cache.stride()}, got {v_cache.stride()}")
    _contiguous_axis("block_table", block_table, 1, "page")
    _contiguous_axis("seq_lens", seq_lens, 0, "request")
    _contiguous_axis("query_start_loc", query_start_loc, 0, "request")
    check_scalars(scale, soft_cap, window_left)


def _check_scales(int8, Hkv, D, k_scale, v_scale, k_offset, v_offset) -> None:
    if int8 and (k_scale is None or v_scale is None):
        raise ValueError("k_scale, v_scale: required when the KV cache is int8")
    given = [(n, x) for n, x in (("k_scale", k_scale), ("v_scale", v_scale), ("k_offset", k_offset),
                                  ("v_offset", v_offset)) if x is not None]
    if not int8:
        if given:
            raise ValueError(f"{given[0][0]}: only valid with an int8 KV cache")
        return
    if (k_offset is None) != (v_offset is None):
        raise ValueError("k_offset, v_offset: give both or neither")
    for name, x in given:
        if x.dtype != torch.float32:
            raise TypeError(f"{name}: dtype must be float32, got {x.dtype}")
        if tuple(x.shape) not in ((Hkv,), (Hkv, D)) or x.shape != k_scale.shape:
            raise ValueError(f"{name}: must be [Hkv] = [{Hkv}] or [Hkv, D] = [{Hkv}, {D}] like k_scale "
                             f"{tuple(k_scale.shape)}, got {tuple(x.shape)}")
        if x.dim() == 2 and D > 1 and x.stride(1) != 1:
            raise ValueError(f"{name}: the channel axis must be contiguous, got strides {tuple(x.stride())}")
        if x.stride(0) != k_scale.stride(0):
            raise ValueError(f"{name}: strides must equal k_scale's {tuple(k_scale.stride())}, got {tuple(x.stride())}")


def check_plan(plan, num_kv_heads: int) -> int:
    """A plan from outside checked before the kernels trust it: the shared :meth:`Plan.validate`
    (items, ranges and slots in bounds; ``coverage=False``, since a context-parallel shard's plan
    covers only its part). Returns the block-table columns the plan reads (``max ceil(end / page)``)."""
    plan.validate(num_kv_heads=num_kv_heads, coverage=False)
    return plan_pages(plan)


def plan_pages(plan) -> int:
    """Block-table columns a (valid) plan reads: ``max ceil(item_kv_end / page_size)``."""
    end = plan.__dict__.get("_max_end")   # the C planner's: the longest request
    if end is None:
        end = int(np.asarray(plan.item_kv_end[:plan.num_valid_items]).max(initial=0))
    return -(-end // int(plan.page_size))
