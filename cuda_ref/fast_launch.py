"""Launch fast path of a prepared Triton launch: the compiled kernel's own launcher, called directly.

``kernel[grid](*args, **constexprs)`` binds the arguments, computes the specialization key, looks the
compiled kernel up and builds launch metadata on every call (~95 µs of host time a launch on a slow,
virtualised host). A launch whose grid, scalars and constexprs were fixed once (:class:`FastLaunch`)
binds its first call with Triton's own binder and finds the kernel by Triton's cache key (launching
normally first when the kernel is not compiled yet), checks that its own arguments equal Triton's,
and from then on calls ``CompiledKernel.run`` itself::

    run(grid_x, grid_y, grid_z, stream, function, packed_metadata, launch_metadata,
        enter_hook, exit_hook, *every_parameter_in_order)

This is the call ``JITFunction.run`` makes in Triton 3.6 and 3.7 (read from both releases): every
kernel parameter in declaration order, constexprs included (the generated launcher skips them);
pointer arguments may be tensors or their addresses (the launcher accepts a Python int); hooks and
launch metadata may be ``None`` (the launcher then calls nothing). ``launch_pdl`` and
``launch_cooperative_grid`` are compile options kept in the compiled kernel's metadata, which the
launcher itself applies, so they need nothing here.

A compiled kernel whose launch one first call checked is remembered by what decides Triton's
specialization (:func:`specialization_key`: the constexprs and launch options, each tensor's dtype and
16-byte alignment, each other argument's type class and, for an integer Triton specializes, whether it
is 1 or a multiple of 16): a later prepared launch with the same key (a new plan of other sizes, whose
grid and plan-size integers differ) takes the launcher from its first call, without Triton's binder or
cache key. The kernels mark their plan-size integers ``do_not_specialize`` (``cuda_ref.kernels``), so
such plans share one compiled kernel. Cheaper still, a prepared launch may :meth:`FastLaunch.adopt`
the launcher of a sibling made for tensors of the same dtypes and devices (the wrapper's previous
launch): a comparison of the two launches' arguments, no key and no binding.

Where the compiled kernel's launch can be reproduced exactly (:mod:`cuda_ref.driver_launch`), the fast
path skips that launcher too and hands the CUDA driver a parameter block of its own, packed once;
``SPLITKV_FAST_LAUNCH=triton`` keeps the launcher (``reason`` says which path a launch takes).

Each fast call takes the current stream's raw handle (so it records into a CUDA graph being
captured) and the tensors' addresses afresh; it falls back to the normal launch for that call when
a launch hook is installed (a profiler), the current device changed, or a tensor's 16-byte alignment
differs from the first call's (Triton specializes the kernel on it). Elsewhere the fast path is
off and every call is the normal launch, with the reason in :attr:`FastLaunch.reason`: other Triton
versions, the interpreter (``TRITON_INTERPRET=1``), ``SPLITKV_FAST_LAUNCH=0``, or any mismatch found
by the first call's check.
"""

from __future__ import annotations

import os
from functools import reduce
from operator import itemgetter, or_

import torch
import triton

from . import driver_launch

try:
    from triton import knobs as _knobs
except ImportError:  # a Triton without knobs: not a checked version, the fast path stays off
    _knobs = None

_data_ptr = torch.Tensor.data_ptr
ENV = "SPLITKV_FAST_LAUNCH"
TRITON = "triton"   # ENV's value for the compiled kernel's own launcher in place of the driver launch
# Triton releases whose JITFunction.run -> CompiledKernel.run convention was read (see the module doc)
CHECKED_VERSIONS = ("3.6.", "3.7.")


def interpreting() -> bool:
    """Triton's interpreter is selected (``TRITON_INTERPRET=1``): kernels run on the CPU."""
    return os.environ.get("TRITON_INTERPRET") == "1"


def _mode() -> str:
    return os.environ.get(ENV, "1").strip().lower()


def _current_device() -> int:
    return torch._C._cuda_getDevice()


def switched_off() -> "str | None":
    """Why the fast path is off in this process (``None``: it may be used). Read at each launch's
    first call, so a process can compare both paths by setting ``SPLITKV_FAST_LAUNCH`` between
    wrappers."""
    if _mode() in ("0", "false", "no", "off"):
        return f"{ENV}=0"
    if interpreting():
        return "interpreter (TRITON_INTERPRET=1)"
    if not str(triton.__version__).startswith(CHECKED_VERSIONS):
        return f"Triton {triton.__version__}: launcher convention not checked (only {', '.join(CHECKED_VERSIONS)}x)"
    return None


def hooks_idle() -> bool:
    """True when no launch hook would run: Triton's hooks are ``None`` or empty hook chains."""
    if _knobs is None:
        return False
    rt = _knobs.runtime
    for hook in (rt.launch_enter_hook, rt.launch_exit_hook):
        if hook is not None and getattr(hook, "calls", True):
            return False
    return True


def bound_values(params, args: tuple, kwargs: dict) -> list:
    """The kernel's arguments as ``JITFunction.run`` passes them to the launcher: one value per
    parameter of ``params`` (a ``JITFunction``'s ``params``) in order: ``args`` positionally, then
    ``kwargs`` by name, then the parameter's default. Launch options in ``kwargs`` (``num_warps``,
    ``launch_pdl``, ...) are not parameters and are left out. Raises ``ValueError`` naming a
    parameter that has no value, or when there are more ``args`` than parameters."""
    if len(args) > len(params):
        raise ValueError(f"{len(args)} positional arguments for {len(params)} parameters")
    out = list(args)
    for p in params[len(args):]:
        if p.name in kwargs:
            out.append(kwargs[p.name])
        elif p.has_default:
            out.append(p.default)
        else:
            raise ValueError(f"parameter {p.name}: no value")
    return out


def same_arguments(ours: list, triton_values: list, tensor_slots) -> "str | None":
    """``None`` when ``ours`` (the fast path's values) equals what Triton bound (``triton_values``):
    the same objects at ``tensor_slots``, elsewhere equal values of the same type; else the first
    difference, in words."""
    if len(ours) != len(triton_values):
        return f"{len(ours)} arguments, Triton binds {len(triton_values)}"
    slots = set(tensor_slots)
    for i, (a, b) in enumerate(zip(ours, triton_values)):
        if i in slots:
            if a is not b:
                return f"argument {i}: not the tensor Triton binds"
        elif type(a) is not type(b) or a != b:
            return f"argument {i}: {a!r} against Triton's {b!r}"
    return None


_I32, _I64 = 2 ** 31, 2 ** 63


def _scalar_class(value, specialized: bool):
    """What of a non-tensor, non-constexpr argument can change Triton's specialization: an integer's
    width class (i32 / i64 / u64 by range) and, where ``specialized``, whether it equals 1 and whether
    16 divides it; a bool or float only its type (Triton specializes neither); anything else its type
    and value (finer than needed, never coarser)."""
    t = type(value)
    if t is int:
        width = 0 if -_I32 <= value < _I32 else (1 if -_I64 <= value < _I64 else 2)
        return (width, value == 1, value % 16 == 0) if specialized else (width,)
    if t is bool or t is float or value is None:
        return t
    return (t, value)


def specialization_key(fn, values: list, tensor_slots, kwargs: dict, aligned=None):
    """A key that is equal for two launches of ``fn`` only if Triton would pick the same compiled kernel
    for both (finer than Triton's own where that is cheaper): the device; the tensors' dtypes and
    16-byte alignments; the other arguments Triton may specialize by type and exact value (finer than
    Triton's class, and equal across plans: strides, scale, constexprs); the ``do_not_specialize``
    integers by :func:`_scalar_class` alone (their values change with the plan); the launch options
    and the debug / instrumentation knobs. ``values``: every parameter's value (:func:`bound_values`,
    the tensors at ``tensor_slots``); ``aligned``: the tensors' 16-byte alignments if known. ``None``
    when a value is not hashable (no reuse: the full check runs)."""
    exact, loose = _param_groups(fn, tuple(tensor_slots))
    vals = exact(values) if exact is not None else ()
    tensors = [values[i] for i in tensor_slots]
    if aligned is None:
        aligned = [not (p & 15) for p in map(_data_ptr, tensors)]
    rt = _knobs.runtime
    key = (torch.cuda.current_device(), tuple(map(type, vals)), vals,
           tuple(_scalar_class(values[i], False) for i in loose),
           tuple(t.dtype for t in tensors), tuple(aligned),
           tuple(sorted(kwargs.items())), bool(getattr(fn, "debug", False) or rt.debug),
           str(_knobs.compilation.instrumentation_mode))
    try:
        hash(key)
    except TypeError:
        return None
    return key


def _param_groups(fn, tensor_slots: tuple):
    """``(getter of the values kept exactly, positions of the do_not_specialize parameters)`` of ``fn``
    for launches with tensors at ``tensor_slots`` (computed once per kernel and slots)."""
    groups = _verified_entry(fn)[2]
    g = groups.get(tensor_slots)
    if g is None:
        slots = set(tensor_slots)
        exact = [i for i, p in enumerate(fn.params) if i not in slots and not (p.do_not_specialize and not p.is_constexpr)]
        loose = tuple(i for i, p in enumerate(fn.params) if i not in slots and p.do_not_specialize and not p.is_constexpr)
        getter = None
        if exact:
            pick = itemgetter(*exact)
            getter = (lambda v: (pick(v),)) if len(exact) == 1 else pick
        g = groups[tensor_slots] = (getter, loose)
    return g


# compiled kernels whose launch a first call checked:
# id(fn) -> [fn, {specialization_key: _Verified}, {tensor_slots: _param_groups}]
_VERIFIED: dict = {}


class _Verified:
    """A checked compiled kernel's launcher, function handle, packed metadata, argument count, and what
    a driver launch needs (its metadata and parameter types; None: Triton's launcher only)."""

    __slots__ = ("run", "function", "packed", "arity", "metadata", "types")

    def __init__(self, run, function, packed, arity, metadata=None, types=None):
        self.run, self.function, self.packed, self.arity = run, function, packed, arity
        self.metadata, self.types = metadata, types


def _verified_entry(fn) -> list:
    entry = _VERIFIED.get(id(fn))
    if entry is None or entry[0] is not fn:
        entry = _VERIFIED[id(fn)] = [fn, {}, {}]
    return entry


def _verified(fn) -> dict:
    return _verified_entry(fn)[1]


def forget_verified() -> None:
    """Drop every remembered compiled kernel (tests; after Triton's caches were cleared)."""
    _VERIFIED.clear()


class FastLaunch:
    """One launch of ``fn`` (a ``triton.jit`` function) with a fixed ``grid``, fixed positional
    arguments except the tensors, and ``kwargs`` (constexprs by name and launch options).
    ``positional``: the positional arguments, whatever stands at the ``tensor_slots`` (the
    positions of the tensors, ascending) being replaced by each call's tensors. Call it with the
    tensors in slot order. ``enabled=False``: always the normal launch (a launch made once).

    ``fast``: ``None`` before the first call, then ``True`` (later calls use the compiled kernel's
    launcher) or ``False`` (every call is ``fn[grid](...)``); ``reason`` says why.
    ``slow_calls`` counts the calls after the first that took the normal path anyway."""

    def __init__(self, fn, grid: tuple, positional: tuple, tensor_slots: tuple, kwargs: dict, enabled: bool = True):
        self.fn = fn
        self.enabled = enabled    # False: always the normal launch (a one-off launch gains nothing)
        self.grid = tuple(grid)
        self.positional = tuple(positional)
        self.tensor_slots = tuple(tensor_slots)
        self.kwargs = dict(kwargs)
        self.fast: "bool | None" = None
        self.reason = "not launched yet"
        self.slow_calls = 0
        self.reused = False       # True: the first call found a kernel another launch had checked
        self.adopted = False      # True: set up from a sibling launch (adopt), no first-call check
        self._key = None          # the first call's specialization_key (None: not computed, or unhashable)
        self._verified = None     # the checked compiled kernel (_Verified)
        self._driver = None       # its launch by the CUDA driver (driver_launch.DriverLaunch), where made
        self.set_grid(grid)
        # tensors first (the common case): a call is (*tensors, *rest), no template to fill
        self._leading = self.tensor_slots == tuple(range(len(self.tensor_slots)))
        self._run = None          # the compiled kernel's launcher (CompiledKernel.run)
        self._function = None
        self._packed = None
        self._values: list = []   # every parameter's value, tensors' slots included (replaced per call)
        self._tail: tuple = ()    # with leading tensors: the values after them
        self._aligned: list = []  # per tensor: 16-byte aligned at the first call
        self._all_aligned = False
        self._device = -1
        self._stream = None

    def set_grid(self, grid: tuple) -> None:
        """Launch the following calls over ``grid`` (the grid is no part of the kernel's
        specialization: a plan of other sizes keeps the compiled kernel and its checked launcher)."""
        self.grid = tuple(grid)
        g = self.grid + (1,) * (3 - len(self.grid))
        self._g0, self._g1, self._g2 = g[0], g[1], g[2]
        if self._driver is not None:
            self._driver.set_grid(self.grid)

    def set_values(self, changes: dict) -> None:
        """Change non-tensor arguments (position -> value) for the following calls. Where each is a
        ``do_not_specialize`` integer of the same width class (a plan or batch size), the compiled
        kernel and its checked launcher stay; any other change sends the next call through the
        first call's check again (Triton's binder decides its kernel)."""
        args = list(self.positional)
        for i, v in changes.items():
            args[i] = v
        old, self.positional = self.positional, tuple(args)
        if self._run is None:   # not set up yet (the first call binds the new values), or the normal launch
            return
        loose = _param_groups(self.fn, self.tensor_slots)[1]
        for i, v in changes.items():
            if i not in loose or _scalar_class(old[i], False) != _scalar_class(v, False):
                self.fast, self.reason, self._run, self.adopted, self.reused = None, "not launched yet", None, False, False
                self._driver = self._verified = None
                return
        for i, v in changes.items():
            self._values[i] = v
            if self._driver is not None:
                self._driver.set_value(i, v)
        self._tail = tuple(self._values[len(self.tensor_slots):])

    def arguments(self, tensors) -> list:
        """``positional`` with ``tensors`` (in slot order) at the tensor slots."""
        if self._leading:
            return [*tensors, *self.positional[len(tensors):]]
        args = list(self.positional)
        for i, t in zip(self.tensor_slots, tensors):
            args[i] = t
        return args

    def values(self, ptrs) -> list:
        """Every parameter's value for the launcher, the tensors given as ``ptrs`` (addresses)."""
        if self._leading:
            return [*ptrs, *self._tail]
        vals = self._values.copy()
        for i, p in zip(self.tensor_slots, ptrs):
            vals[i] = p
        return vals

    def __call__(self, *tensors) -> None:
        if self._run is None and self.fast is None and self._first(tensors):
            return  # launched normally
        run = self._run
        if run is not None:
            ptrs = list(map(_data_ptr, tensors))
            same_alignment = (not (reduce(or_, ptrs) & 15) if self._all_aligned
                              else [not (p & 15) for p in ptrs] == self._aligned)
            if same_alignment and hooks_idle() and _current_device() == self._device and not self.fn.pre_run_hooks:
                driver = self._driver
                if driver is None or driver(ptrs, self._stream(self._device)):
                    # Triton's launcher (also where the driver refused: it ensures a context, and
                    # raises what the driver says)
                    run(self._g0, self._g1, self._g2, self._stream(self._device), self._function, self._packed,
                        None, None, None, *self.values(ptrs))
                return
            self.slow_calls += 1
        self._normal(tensors)

    def adopt(self, other: "FastLaunch | None") -> bool:
        """Take ``other``'s checked launcher when this launch binds the same compiled kernel: the same
        kernel, tensor slots and keyword arguments (constexprs and launch options), equal values of
        the same type at every other parameter Triton may specialize on, and at the
        ``do_not_specialize`` integers (the plan sizes) the same width class. The caller vouches for
        the tensors' dtypes being the same (the wrapper adopts only between launches whose tensors
        had the same dtypes and devices); their 16-byte alignment is compared on every fast call as
        before. ``False``: nothing changed (the first call's check runs as usual). Only before this
        launch's first call."""
        if (other is None or other._run is None or not self.enabled or self.fast is not None
                or other.fn is not self.fn or other.tensor_slots != self.tensor_slots
                or len(other.positional) != len(self.positional) or other.kwargs != self.kwargs
                or switched_off() is not None):
            return False
        exact, loose = _param_groups(self.fn, self.tensor_slots)
        ours, theirs = bound_values(self.fn.params, self.positional, self.kwargs), other._values
        if exact is not None:
            mine, its = exact(ours), exact(theirs)
            if mine != its or tuple(map(type, mine)) != tuple(map(type, its)):
                return False
        for i in loose:
            if _scalar_class(ours[i], False) != _scalar_class(theirs[i], False):
                return False
        self._stream, self._function, self._packed, self._run = other._stream, other._function, other._packed, other._run
        self._values = ours
        self._tail = tuple(ours[len(self.tensor_slots):])
        self._aligned, self._all_aligned, self._device = other._aligned, other._all_aligned, other._device
        self.fast, self.adopted = True, True
        self._set_driver(other._verified)
        return True

    def _normal(self, tensors):
        return self.fn[self.grid](*self.arguments(tensors), **self.kwargs)

    def _off(self, reason: str) -> None:
        self.fast, self.reason, self._run, self._driver = False, reason, None, None

    def _first(self, tensors: tuple) -> bool:
        """The first call's check; ``True`` when it launched (normally). Where Triton's cache already
        holds the kernel this call binds to (another prepared launch of the same specialization
        compiled it), the fast path is set up from it at once and the caller launches; otherwise the
        call launches normally (compiling the kernel) and the check follows. Any surprise leaves the
        fast path off (``reason``); the launch is always made."""
        why = switched_off() if self.enabled else "a one-off launch"
        if why is not None:
            self._normal(tensors)
            self._off(why)
            return True
        try:
            if self._reuse(tensors) or self._check_and_keep(None, tensors):
                return False  # decided from the cache: the caller launches (fast, or normally if off)
        except Exception as e:  # any surprise in Triton's internals: the normal path, always correct
            self._off(f"check failed: {type(e).__name__}: {e}")
            return False
        compiled = self._normal(tensors)
        try:
            self._check_and_keep(compiled, tensors)
        except Exception as e:
            self._off(f"check failed: {type(e).__name__}: {e}")
        if self.fast is None:
            self._off("no compiled kernel after the first launch")
        return True

    def _reuse(self, tensors: tuple) -> bool:
        """Set the fast path up from a compiled kernel that another launch's first call checked for
        the same :func:`specialization_key`; ``False`` when there is none (the full check follows)."""
        if (_knobs is None or len(tensors) != len(self.tensor_slots)
                or getattr(_knobs.runtime, "add_stages_inspection_hook", None) is not None):
            return False
        ours = bound_values(self.fn.params, tuple(self.arguments(tensors)), self.kwargs)
        aligned = [not (p & 15) for p in map(_data_ptr, tensors)]
        key = specialization_key(self.fn, ours, self.tensor_slots, self.kwargs, aligned)
        hit = _verified(self.fn).get(key) if key is not None else None
        if hit is None or hit.arity != len(ours):
            self._key = key
            return False
        self._keep(hit, ours, tensors, key[0], aligned)
        self.reused = True
        return True

    def _keep(self, v: "_Verified", ours: list, tensors: tuple, device: int, aligned=None) -> None:
        """The fast path on, with the launcher ``v`` and this launch's values ``ours``."""
        self._stream = torch._C._cuda_getCurrentRawStream
        self._function, self._packed = v.function, v.packed
        self._values = list(ours)
        for i in self.tensor_slots:
            self._values[i] = None  # no tensor kept
        self._tail = tuple(ours[len(tensors):])
        self._aligned = aligned if aligned is not None else [not (p & 15) for p in map(_data_ptr, tensors)]
        self._all_aligned = all(self._aligned)
        self._device = device
        self.fast = True
        self._run = v.run
        self._set_driver(v)

    def _set_driver(self, v: "_Verified | None") -> None:
        """Launch through the CUDA driver with a parameter block of this launch's own
        (:mod:`cuda_ref.driver_launch`) where it reproduces the launcher of ``v``; else Triton's
        launcher (``SPLITKV_FAST_LAUNCH=triton`` asks for it). ``reason`` says which."""
        self._verified, self._driver = v, None
        why = f"{ENV}={TRITON}" if _mode() == TRITON else None
        if why is None and (v is None or v.metadata is None or v.types is None):
            why = "no metadata of the compiled kernel"
        if why is None:
            self._driver, why = driver_launch.make(v.function, v.metadata, v.types, self._values, self.tensor_slots,
                                                   self.grid)
        if self._driver is not None:
            self.reason = f"Triton {triton.__version__}: the compiled kernel launched by {why}"
        else:
            self.reason = f"Triton {triton.__version__}: the compiled kernel's launcher (driver launch: {why})"

    def _check_and_keep(self, compiled, tensors: tuple) -> bool:
        """Bind this call with Triton's own binder and find its kernel by Triton's cache key; with
        ``compiled`` (what the first launch returned) it must be that one. ``False``: the cache has no
        kernel for the call yet (``compiled`` None only). ``True``: decided: the fast path is set up,
        or off with a reason."""
        from triton import knobs
        from triton.runtime.jit import compute_cache_key

        if len(tensors) != len(self.tensor_slots):
            self._off(f"{len(tensors)} tensors, prepared for {len(self.tensor_slots)}")
            return True
        if getattr(knobs.runtime, "add_stages_inspection_hook", None) is not None:
            self._off("a stages inspection hook changes the cache key")
            return True
        args = self.arguments(tensors)
        ours = bound_values(self.fn.params, tuple(args), self.kwargs)
        # what JITFunction.run binds for this call, and the kernel its cache key finds
        device = torch.cuda.current_device()
        kernel_cache, key_cache, _, _, binder = self.fn.device_caches[device]
        kw = dict(self.kwargs)
        kw["debug"] = kw.get("debug", self.fn.debug) or knobs.runtime.debug
        kw["instrumentation_mode"] = knobs.compilation.instrumentation_mode
        bound, specialization, options = binder(*args, **kw)
        diff = same_arguments(ours, list(bound.values()), self.tensor_slots)
        if diff is not None:
            self._off(f"arguments differ from Triton's: {diff}")
            return True
        cached = kernel_cache.get(compute_cache_key(key_cache, specialization, options))
        if compiled is None:
            if cached is None or hasattr(cached, "result"):  # not compiled yet, or a compile future
                return False
            compiled = cached
        else:
            if hasattr(compiled, "result"):
                compiled = compiled.result()
            if cached is not compiled:
                self._off("the cache key does not find the launched kernel")
                return True
        for attr in ("run", "function", "packed_metadata", "src"):
            if not hasattr(compiled, attr):
                self._off(f"no compiled kernel (no {attr})")
                return True
        signature = getattr(compiled.src, "signature", None)
        if signature is None or len(signature) != len(ours):
            self._off(f"the launcher expects {None if signature is None else len(signature)} "
                      f"arguments, not {len(ours)}")
            return True
        run = compiled.run  # loads the module on first use
        function = compiled.function
        if not callable(run) or not function:
            self._off("the compiled kernel has no launcher or function handle")
            return True
        types = list(signature.values()) if isinstance(signature, dict) else None
        checked = _Verified(run, function, compiled.packed_metadata, len(ours), getattr(compiled, "metadata", None),
                            types)
        self._keep(checked, ours, tensors, device)
        key = self._key
        if key is not None and key[0] == device:
            _verified(self.fn)[key] = checked   # later launches of this specialization reuse it
        return True


def describe(launches) -> dict:
    """``{"fast": True / False / None, "reason": ...}`` over several :class:`FastLaunch` (``None``
    entries skipped): fast when all are, off when one is (its reason), None before any call."""
    launches = [x for x in launches if x is not None]
    off = [x for x in launches if x.fast is False]
    if off:
        return {"fast": False, "reason": off[0].reason, "slow_calls": sum(x.slow_calls for x in launches)}
    if launches and all(x.fast for x in launches):
        return {"fast": True, "reason": launches[0].reason, "slow_calls": sum(x.slow_calls for x in launches)}
    return {"fast": None, "reason": "not launched yet" if launches else "no launch", "slow_calls": 0}
