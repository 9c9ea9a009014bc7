"""A checked Triton launch made by the CUDA driver itself: ``cuLaunchKernelEx`` through ``ctypes``,
with the kernel's parameter block built once.

The compiled kernel's own launcher (``CompiledKernel.run``, :mod:`cuda_ref.fast_launch`) takes every
parameter as a Python object on every call: a Python layer that allocates nothing here (scratch sizes
0) but runs each time, then a C function that parses the arguments and writes each one into a fresh
parameter block. A prepared launch changes only its tensors' addresses, the stream and, with a new
plan, the grid and a few integers, so :class:`DriverLaunch` keeps one parameter block per launch:
its scalars written when they change (:meth:`DriverLaunch.set_value`), the tensors' addresses
written as one slice on each call, then one foreign call.

The block follows the convention read from Triton 3.6 and 3.7's launcher (``driver.c``): every
parameter that is not a constexpr, in declaration order, as its C type (``*T`` a 64-bit address,
``iN`` / ``uN`` integers, ``fp32`` a float, ``fp64`` a double), then two scratch addresses (global and
profile scratch), null when the kernel's metadata asks for no scratch. The launch configuration is
the launcher's: ``32 * num_warps`` threads, the metadata's shared memory, and programmatic dependent
launch (``launch_pdl``) as a launch attribute. What :func:`make` cannot match exactly (another
parameter count or size than the driver reports for the function through ``cuFuncGetParamInfo``, a
parameter type it does not write, scratch memory, clusters, a cooperative launch, no CUDA driver
library; the sizes of the parameters the block holds are compared, the absence of more rests on the
checked launcher convention) gives no driver launch, with the reason; the caller keeps Triton's launcher then.

The driver library is opened with ``ctypes.PyDLL``: the GIL is held through the call, so no other
Python thread writes the block while the driver copies it (a launch copies its parameters before
it returns).
"""

from __future__ import annotations

import ctypes
import struct

# the struct format of each scalar parameter type Triton's launcher writes (driver.c's extractors)
SCALAR_FORMATS = {
    "i1": "b", "i8": "b", "i16": "h", "i32": "i", "i64": "q", "u1": "B", "u8": "B", "u16": "H", "u32": "I",
    "u64": "Q", "fp32": "f", "f32": "f", "fp64": "d",
}
SCRATCH_PARAMS = 2          # the launcher appends the global and the profile scratch addresses
PDL_ATTRIBUTE = 6           # CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
CUDA_SUCCESS = 0


class LaunchAttribute(ctypes.Structure):
    """``CUlaunchAttribute``: the id, 4 bytes of padding, a 64-byte value union."""
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", ctypes.c_uint64 * 8)]


class LaunchConfig(ctypes.Structure):
    """``CUlaunchConfig`` (cuda.h, CUDA 12 and 13)."""
    _fields_ = [("gridDimX", ctypes.c_uint), ("gridDimY", ctypes.c_uint), ("gridDimZ", ctypes.c_uint),
                ("blockDimX", ctypes.c_uint), ("blockDimY", ctypes.c_uint), ("blockDimZ", ctypes.c_uint),
                ("sharedMemBytes", ctypes.c_uint), ("hStream", ctypes.c_void_p),
                ("attrs", ctypes.POINTER(LaunchAttribute)), ("numAttrs", ctypes.c_uint)]


_LIB: list = []   # [None] or [(cuLaunchKernelEx, cuFuncGetParamInfo)] once looked up


def driver_functions():
    """``(cuLaunchKernelEx, cuFuncGetParamInfo)`` from the CUDA driver library, or None where it
    cannot be opened or lacks one of them (a driver before CUDA 12.4)."""
    if not _LIB:
        try:
            lib = ctypes.PyDLL("libcuda.so.1")
            fns = (lib.cuLaunchKernelEx, lib.cuFuncGetParamInfo)
            for f in fns:
                f.restype = ctypes.c_int
            _LIB.append(fns)
        except (OSError, AttributeError):
            _LIB.append(None)
    return _LIB[0]


_QUERY: list = []   # [cuEventQuery's address, or 0] once looked up


def event_query_address() -> int:
    """The address of the driver's ``cuEventQuery`` (0 where the library cannot be opened or lacks it),
    for C code that queries a CUDA event without Python (the captured plan's refresh, ``plan_fast.c``):
    a runtime ``cudaEvent_t`` is the driver's ``CUevent``."""
    if not _QUERY:
        try:
            _QUERY.append(ctypes.cast(ctypes.CDLL("libcuda.so.1").cuEventQuery, ctypes.c_void_p).value or 0)
        except (OSError, AttributeError):
            _QUERY.append(0)
    return _QUERY[0]


_SIZES: dict = {}   # (CUfunction handle, count) -> its parameters' sizes (a function's parameters never change)


def driver_param_sizes(function: int, count: int) -> "list[int] | None":
    """The byte sizes of the first ``count`` parameters of ``function`` (a ``CUfunction`` handle) as
    the driver reports them (asked once per function); None where the driver reports fewer, or has
    no ``cuFuncGetParamInfo``. Nothing past ``count`` is asked: the driver's answer there is an
    error, which compute-sanitizer counts as one (that the kernel has no further parameter rests on
    the launcher convention of the checked Triton versions, ``fast_launch.CHECKED_VERSIONS``)."""
    key = (function, count)
    sizes = _SIZES.get(key)
    if sizes is not None:
        return sizes
    fns = driver_functions()
    if fns is None:
        return None
    info = fns[1]
    offset, size, sizes = ctypes.c_size_t(), ctypes.c_size_t(), []
    for i in range(count):
        if info(ctypes.c_void_p(function), ctypes.c_size_t(i), ctypes.byref(offset), ctypes.byref(size)) != CUDA_SUCCESS:
            return None
        sizes.append(size.value)
    _SIZES[key] = sizes
    return sizes


def block_layout(types: list, tensor_slots: tuple) -> "tuple[list, str | None]":
    """What :class:`DriverLaunch` writes for a kernel whose parameters have Triton signature
    ``types`` (one per parameter, ``"constexpr"`` for those the launcher skips), with tensors at
    ``tensor_slots``: ``([(position, struct format), ...] for the launched parameters in order, None)``
    (``"Q"``: an address), or ``([], reason)`` when a type is one it does not write."""
    slots = set(tensor_slots)
    layout = []
    for i, t in enumerate(types):
        if t == "constexpr":
            if i in slots:
                return [], f"parameter {i}: a tensor slot is a constexpr"
            continue
        if not isinstance(t, str):
            return [], f"parameter {i}: type {t!r} (a tuple) is not written by the driver launch"
        if t.startswith("*"):
            layout.append((i, "Q"))
        elif i in slots:
            return [], f"parameter {i}: a tensor slot of type {t}"
        elif t in SCALAR_FORMATS:
            layout.append((i, SCALAR_FORMATS[t]))
        else:
            return [], f"parameter {i}: type {t} is not written by the driver launch"
    return layout, None


class DriverLaunch:
    """One prepared launch of a loaded ``function`` (see the module doc). ``layout``: from
    :func:`block_layout`; ``values``: every parameter's value (``FastLaunch``'s; the tensors' slots
    are ignored). Call it with the tensors' addresses in slot order and the stream's raw handle.

    The block is one buffer: the tensors' addresses first (a ``uint64`` array written as one slice
    per call), then each other parameter at an offset aligned to its size, then the null scratch
    addresses; the driver's array of parameter addresses points into it. Build it with :func:`make`."""

    def __init__(self, function: int, layout: list, values: list, tensor_slots: tuple, num_warps: int,
                 shared: int, pdl: bool, grid: tuple):
        self._launch = driver_functions()[0]
        self._function = ctypes.c_void_p(function)
        slot_index = {s: j for j, s in enumerate(tensor_slots)}
        end = 8 * len(tensor_slots)
        offsets, self._at = [], {}      # per launched parameter its offset; position -> (format, offset)
        for i, fmt in layout:
            if i in slot_index:
                offsets.append(8 * slot_index[i])
                continue
            size = struct.calcsize(fmt)
            end = -(-end // size) * size
            offsets.append(end)
            self._at[i] = (fmt, end)
            end += size
        scratch = -(-end // 8) * 8
        self._block = ctypes.create_string_buffer(scratch + 8)   # zeroed: the null scratch address
        base = ctypes.addressof(self._block)
        self._ptrs = (ctypes.c_uint64 * len(tensor_slots)).from_buffer(self._block)
        self._params = (ctypes.c_void_p * (len(offsets) + SCRATCH_PARAMS))(
            *[base + o for o in offsets], *[base + scratch] * SCRATCH_PARAMS)
        for i in self._at:
            self.set_value(i, values[i])
        self._config = LaunchConfig(blockDimX=32 * num_warps, blockDimY=1, blockDimZ=1, sharedMemBytes=shared)
        if pdl:
            self._attrs = (LaunchAttribute * 1)()
            self._attrs[0].id = PDL_ATTRIBUTE
            self._attrs[0].value[0] = 1   # programmaticStreamSerializationAllowed
            self._config.attrs = self._attrs
            self._config.numAttrs = 1
        self._config_ref = ctypes.byref(self._config)
        self.set_grid(grid)

    def set_grid(self, grid: tuple) -> None:
        g = tuple(grid) + (1,) * (3 - len(grid))
        c = self._config
        c.gridDimX, c.gridDimY, c.gridDimZ = g[0], g[1], g[2]
        self._empty = g[0] * g[1] * g[2] == 0

    def set_value(self, i: int, value) -> None:
        """Write parameter ``i``'s new value (a scalar the kernel takes, or an address: None is 0)."""
        fmt, offset = self._at[i]
        struct.pack_into(fmt, self._block, offset, 0 if value is None else value)

    def __call__(self, ptrs: list, stream: int) -> int:
        """Launch with the tensors' addresses ``ptrs`` (slot order) on ``stream``; the driver's result
        (0: launched; nothing is launched over an empty grid, as Triton's launcher)."""
        if self._empty:
            return CUDA_SUCCESS
        self._ptrs[:] = ptrs
        self._config.hStream = stream
        return self._launch(self._config_ref, self._function, self._params, None)


def make(function: int, metadata, types: list, values: list, tensor_slots: tuple,
         grid: tuple) -> "tuple[DriverLaunch | None, str]":
    """A :class:`DriverLaunch` of ``function`` (``CompiledKernel.function``) whose compiled kernel has
    ``metadata`` (``CompiledKernel.metadata``) and parameter types ``types`` (its source's signature,
    in order), or ``(None, why not)``."""
    if driver_functions() is None:
        return None, "no CUDA driver library with cuLaunchKernelEx and cuFuncGetParamInfo"
    need = ("num_warps", "num_ctas", "shared", "global_scratch_size")
    missing = [a for a in need if not hasattr(metadata, a)]
    if missing:
        return None, f"the compiled kernel's metadata has no {', '.join(missing)}"
    if metadata.num_ctas != 1 or getattr(metadata, "launch_cooperative_grid", False):
        return None, "a cluster or cooperative launch"
    if metadata.global_scratch_size or getattr(metadata, "profile_scratch_size", 0):
        return None, "the kernel asks for scratch memory"
    layout, why = block_layout(types, tensor_slots)
    if why is not None:
        return None, why
    want = [struct.calcsize(fmt) for _, fmt in layout] + [8] * SCRATCH_PARAMS
    sizes = driver_param_sizes(function, len(want))
    if sizes is None:
        return None, f"the driver reports fewer than {len(want)} parameters for the function"
    if sizes != want:
        return None, f"the driver's parameter sizes {sizes} are not the block's {want}"
    return DriverLaunch(function, layout, values, tuple(tensor_slots), metadata.num_warps, metadata.shared,
                        bool(getattr(metadata, "launch_pdl", False)), grid), "the CUDA driver, parameters packed once"
