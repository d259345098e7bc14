"""kbuild's own launcher: a stored cubin or PTX, loaded and launched through cuda.core.

numba's dispatcher types every argument on every launch (then looks the types
up among its overloads). A kernel launched from the store has declared
signatures, so this launcher types arguments once per *argument kinds* (the
Python type plus what typing reads: dtype, ndim, layout, writability), builds
a packer for that (signature, kinds) and afterwards only packs: the per-launch
work is a dict lookup, a generated function that lays the values out in
numba's kernel ABI, and `cuda.core.launch`.

numba's ABI, as `_Kernel._prepare_args` writes it: an array is meminfo (0),
parent (0), nitems, itemsize, data pointer, shape..., strides... (all 64-bit);
a record is a device pointer to a copy; a scalar is a C value of the declared
type (bool one byte, complex two floats, float16 its bits); tuples flatten.
Host numpy arrays and records are copied in and back by numba's own code, as
numba does. Every driver call goes through `backend.driver`, the boundary a
test replaces with fakes.

Kernels built with `debug=True` (device-side exceptions) or with argument
`extensions` launch through numba's own `_Kernel` rebuilt by `loader`, with
the stream converted here.
"""

from __future__ import annotations

import ctypes
import enum
import numbers

import numpy as np

from . import driver

_CACHE_LIMIT = 1024  # distinct launch configurations / streams remembered per process


# -- launch configuration and streams ----------------------------------------------

def normalize_dims(griddim, blockdim) -> tuple:
    """(grid, block) as 3-tuples of ints; numba's rules and messages."""
    if griddim is None or blockdim is None:
        raise ValueError("must specify launch configuration")
    return _dim3(griddim, "griddim"), _dim3(blockdim, "blockdim")


def _dim3(dim, name) -> tuple:
    dims = list(dim) if isinstance(dim, (tuple, list)) else [dim]
    if len(dims) > 3:
        raise ValueError(f"{name} must be a sequence of 1, 2 or 3 integers, got {dims!r}")
    if not all(isinstance(v, numbers.Integral) for v in dims):
        raise TypeError(f"{name} must be a sequence of integers, got {dims!r}")
    return tuple(int(v) for v in dims) + (1,) * (3 - len(dims))


_streams: dict = {}  # CUstream handle -> cuda.core Stream borrowing it


def core_stream(stream):
    """The cuda.core Stream (or GraphBuilder) `cuda.core.launch` needs, from any
    stream form a user passes: 0 / None (the default stream, as numba), a numba
    Stream, a cuda.core Stream, or any object with `__cuda_stream__` (CuPy, PyTorch)."""
    if isinstance(stream, driver.Stream):
        return stream
    if stream is None or (type(stream) is int and stream == 0):
        return _borrowed(0)
    if isinstance(stream, driver.GraphBuilder):
        return stream
    protocol = getattr(stream, "__cuda_stream__", None)
    if protocol is None and isinstance(stream, numbers.Integral) and stream == 0:
        return _borrowed(0)  # False, numpy's 0: numba takes any false value
    if protocol is None:
        raise TypeError(f"stream must be 0, None, a numba or cuda.core Stream, or an object "
                        f"with __cuda_stream__; got {type(stream).__name__} {stream!r}")
    version, handle = protocol() if callable(protocol) else protocol
    if version != 0:
        raise TypeError(f"{type(stream).__name__}.__cuda_stream__ gave protocol version "
                        f"{version!r}; only version 0 is known")
    return _borrowed(int(handle))


def _borrowed(handle: int):
    stream = _streams.get(handle)
    if stream is None:
        if len(_streams) >= _CACHE_LIMIT:
            _streams.clear()
        stream = _streams[handle] = driver.stream_from_handle(handle)
    return stream


class _Configs:
    """LaunchConfig objects by (grid, block, shared memory): made once, reused."""

    def __init__(self, cooperative: bool):
        self.cooperative = cooperative
        self._made: dict = {}

    def get(self, griddim, blockdim, sharedmem):
        try:
            return self._made[(griddim, blockdim, sharedmem)]
        except (KeyError, TypeError):  # new, or a list (unhashable) given as a dimension
            grid, block = normalize_dims(griddim, blockdim)
            made = driver.launch_config(grid, block, int(sharedmem or 0), self.cooperative)
            if len(self._made) >= _CACHE_LIMIT:
                self._made.clear()
            try:
                self._made[(griddim, blockdim, sharedmem)] = made
            except TypeError:
                pass
            return made


def split_config(config: tuple):
    """(griddim, blockdim, stream, sharedmem) from `kernel[...]`'s 2, 3 or 4 items."""
    n = len(config)
    return (config[0], config[1], config[2] if n > 2 else 0, config[3] if n > 3 else 0)


# -- argument kinds ---------------------------------------------------------------------

_kind_of_type: dict = {}  # Python type -> function(value) -> kind, or None: the type is the kind


def kinds_of(args) -> tuple:
    """What decides an argument's numba type, per argument, cheaply: equal kinds type
    equally, so a launch with seen kinds needs no typing."""
    return tuple([_kind(a) for a in args])


def _kind(value):
    cls = type(value)
    try:
        how = _kind_of_type[cls]
    except KeyError:
        how = _kind_of_type[cls] = _classify(cls)
    return cls if how is None else how(value)


def _classify(cls):
    """How to read the kind of values of a type (decided once per type)."""
    from numba.cuda.args import ArgHint

    if issubclass(cls, np.ndarray):
        return _host_array_kind
    if issubclass(cls, (np.datetime64, np.timedelta64, np.void)):
        return lambda v: (cls, v.dtype)
    if issubclass(cls, (bool, int, float, complex, np.generic, enum.Enum)):
        return None
    if issubclass(cls, tuple):
        return lambda v: (cls, kinds_of(v))
    if issubclass(cls, ArgHint):
        return lambda v: (cls, _kind(v.value))
    if getattr(cls, "__cuda_memory__", False) and hasattr(cls, "_strided_memory_view_shim"):
        return _device_array_kind
    if hasattr(cls, "__cuda_array_interface__"):
        return _cai_kind
    if hasattr(cls, "__dlpack__"):
        return _dlpack_kind
    return lambda v: (cls, UNTYPED)  # numba may type two such values differently


UNTYPED = "typed by numba on every launch"


def cacheable(kinds) -> bool:
    """Whether a launch with these kinds may reuse the typing of an earlier one."""
    return not any(isinstance(k, tuple) and k and k[-1] is UNTYPED for k in kinds)


def _host_array_kind(a):
    flags = a.flags
    layout = "C" if flags.c_contiguous else "F" if flags.f_contiguous else "A"
    return (type(a), a.dtype, a.ndim, layout, flags.writeable, flags.aligned)


def _device_array_kind(a):
    # A numba device array's shape, strides and memory never change: its kind and
    # parameters are kept in its own __dict__ (as numba keeps its memory-view shim).
    kind = a.__dict__.get("_kbuild_kind")
    if kind is None:
        # numba's DeviceNDArray._numba_type_: broadcast arrays are 'A'.
        flags = a.flags
        broadcast = 0 in a.strides and a.size != 0
        layout = "A" if broadcast else "C" if flags["C_CONTIGUOUS"] else \
            "F" if flags["F_CONTIGUOUS"] else "A"
        kind = a.__dict__["_kbuild_kind"] = ("device", type(a), a.dtype, a.ndim, layout)
    return kind


def _device_array_fields(a, itemsize):
    fields = a.__dict__.get("_kbuild_fields")
    if fields is None:
        fields = a.__dict__["_kbuild_fields"] = view_fields(a._strided_memory_view_shim, itemsize)
    return fields


def _cai_kind(a):
    desc = a.__cuda_array_interface__
    shape, strides, typestr = desc["shape"], desc.get("strides"), desc["typestr"]
    return ("cai", type(a), typestr, len(shape), _cai_layout(shape, strides, typestr),
            bool(desc["data"][1]))


def _cai_layout(shape, strides, typestr) -> str:
    if strides is None or not shape:
        return "C"
    itemsize = _itemsize(typestr)
    if 0 in strides and 0 not in shape:
        return "A"
    if tuple(strides) == _contiguous_strides(shape, itemsize, "C"):
        return "C"
    return "F" if tuple(strides) == _contiguous_strides(shape, itemsize, "F") else "A"


def _contiguous_strides(shape, itemsize, order) -> tuple:
    dims = shape if order == "F" else tuple(reversed(shape))
    strides, step = [], itemsize
    for n in dims:
        strides.append(step)
        step *= n
    return tuple(strides) if order == "F" else tuple(reversed(strides))


_itemsizes: dict = {}


def _itemsize(typestr) -> int:
    size = _itemsizes.get(typestr)
    if size is None:
        size = _itemsizes[typestr] = np.dtype(typestr).itemsize
    return size


def _dlpack_kind(a):
    from cuda.core.utils import StridedMemoryView

    view = StridedMemoryView.from_dlpack(a, stream_ptr=-1)  # no synchronisation: typing only
    layout = view._layout
    order = "C" if layout.is_contiguous_c else "F" if layout.is_contiguous_f else "A"
    return ("dlpack", type(a), view.dtype, len(view.shape), order, bool(view.readonly))


def argument_types(args, kinds) -> tuple:
    """numba's types of the arguments, as numba's dispatcher would type them (once per kinds)."""
    return tuple(_argument_type(a, k) for a, k in zip(args, kinds))


def _argument_type(value, kind):
    from numba.core import types
    from numba.cuda.typing.typeof import Purpose, typeof

    if isinstance(kind, tuple) and kind and kind[0] == "cai":  # numba would go through DLPack
        from numba import from_dtype

        _, _, typestr, ndim, layout, readonly = kind
        return types.Array(from_dtype(np.dtype(typestr)), ndim, layout, readonly=readonly)
    return typeof(value, Purpose.argument)


def compatible(actual, declared) -> bool:
    """Whether numba would pass `actual` where `declared` is expected, without a recompile."""
    from numba.core import types

    if actual == declared:
        return True
    if isinstance(actual, types.Number) and isinstance(declared, types.Number):
        return True
    if isinstance(actual, types.Boolean) and isinstance(declared, (types.Boolean, types.Integer)):
        return True
    if isinstance(actual, types.Array) and isinstance(declared, types.Array):
        return (actual.dtype == declared.dtype and actual.ndim == declared.ndim
                and declared.layout in ("A", actual.layout)
                and (actual.mutable or not declared.mutable))
    return False


# -- packing ----------------------------------------------------------------------------

def make_packer(argtypes, kinds):
    """A function (args, stream, retr) -> the flat kernel parameters, for one
    (signature, argument kinds); generated once so a launch runs no type checks."""
    names, exprs = {}, []
    for i, (ty, kind) in enumerate(zip(argtypes, kinds)):
        fn, spread = _field_maker(ty, kind)
        names[f"f{i}"] = fn
        if fn is None:  # a numpy scalar of the declared type: cuda.core packs it as it is
            exprs.append(f"a{i}")
        elif spread == "device":  # a numba device array's parameters, kept on the array
            exprs.append(f'*(a{i}.__dict__.get("_kbuild_fields") or f{i}(a{i}, stream, retr))')
        else:
            exprs.append(f"*f{i}(a{i}, stream, retr)" if spread else f"f{i}(a{i})")
    unpack = f"    ({''.join(f'a{i}, ' for i in range(len(exprs)))}) = args\n" if exprs else ""
    source = f"def pack(args, stream, retr):\n{unpack}    return ({''.join(e + ', ' for e in exprs)})\n"
    exec(compile(source, "<kbuild packer>", "exec"), names)  # noqa: S102 - our own text
    return names["pack"]


def _field_maker(ty, kind):
    """(function, spread): a scalar's ctypes constructor (None: pass the value as it is),
    or a function of (value, stream, retr) returning a tuple of parameters."""
    from numba.core import types

    if isinstance(ty, types.Array):
        spread = "device" if isinstance(kind, tuple) and kind[0] == "device" else True
        return _array_fields(kind, ty.dtype.bitwidth // 8), spread
    if isinstance(ty, types.Record):
        return _record_fields(kind), True
    if isinstance(ty, types.BaseTuple):
        inner = [_field_maker(t, k) for t, k in zip(ty, kind[1])]
        return _tuple_fields(inner), True
    if isinstance(ty, types.EnumMember):
        convert, spread = _field_maker(ty.dtype, None)
        return (lambda v, s, r: convert(v.value, s, r)) if spread \
            else (lambda v: convert(v.value)), spread
    if _same_numpy_scalar(ty, kind):
        return None, False
    return _scalar_maker(ty)


# What cuda.core's ParamHolder lays out by its own type exactly as numba's ABI wants it
# (not complex: numba passes its two parts as two parameters).
_PASSED_AS_IS = (np.bool_, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16,
                 np.uint32, np.uint64, np.float16, np.float32, np.float64)


def _same_numpy_scalar(ty, kind) -> bool:
    from numba import from_dtype

    return kind in _PASSED_AS_IS and from_dtype(np.dtype(kind)) == ty


def _scalar_maker(ty):
    from numba.core import types

    if isinstance(ty, types.Boolean):
        return ctypes.c_bool, False
    if isinstance(ty, types.Integer):
        return getattr(ctypes, f"c_{ty}"), False
    simple = {types.float32: ctypes.c_float, types.float64: ctypes.c_double}
    if ty in simple:
        return simple[ty], False
    if ty == types.float16:
        return (lambda v: ctypes.c_uint16(np.float16(v).view(np.uint16))), False
    if ty in (types.complex64, types.complex128):
        part = ctypes.c_float if ty == types.complex64 else ctypes.c_double
        return (lambda v, s, r: (part(v.real), part(v.imag))), True
    if isinstance(ty, (types.NPDatetime, types.NPTimedelta)):
        return (lambda v: ctypes.c_int64(v.view(np.int64))), False
    if isinstance(ty, types.CPointer):
        return int, False
    raise NotImplementedError(f"kbuild cannot pass an argument of type {ty} to a kernel")


def _array_fields(kind, itemsize):
    category = kind[0] if isinstance(kind, tuple) else None
    if category == "device":
        return lambda a, s, r: _device_array_fields(a, itemsize)
    if category == "cai":
        return lambda a, s, r: _cai_fields(a, itemsize)
    if category == "dlpack":
        return lambda a, s, r: view_fields(driver.array_view(a, s), itemsize)
    # host arrays, cuda.In/Out/InOut and anything else numba knows how to copy
    return lambda a, s, r: view_fields(driver.to_device(a, s, r), itemsize)


def view_fields(view, itemsize) -> tuple:
    """numba's array parameters of a strided view (a StridedMemoryView or numba's shim)."""
    shape = view.shape
    layout = view._layout
    strides = layout.strides_in_bytes
    if strides is None:
        strides = _contiguous_strides(shape, itemsize, "C" if layout.is_contiguous_c else "F")
    return (0, 0, view.size, itemsize, view.ptr, *shape, *strides)


def _cai_fields(a, itemsize) -> tuple:
    desc = a.__cuda_array_interface__
    if desc.get("mask") is not None:
        raise NotImplementedError("masked __cuda_array_interface__ arrays are not supported")
    foreign = desc.get("stream")
    if foreign is not None and _cai_sync():
        driver.sync_stream(foreign)
    shape = tuple(desc["shape"])
    strides = desc.get("strides") or _contiguous_strides(shape, itemsize, "C")
    size = 1
    for n in shape:
        size *= n
    return (0, 0, size, itemsize, desc["data"][0], *shape, *strides)


def _cai_sync() -> bool:
    from numba.cuda import config

    return bool(config.CUDA_ARRAY_INTERFACE_SYNC)


def _record_fields(kind):
    if isinstance(kind, tuple) and kind and kind[0] == "device":
        return lambda a, s, r: (a._strided_memory_view_shim.ptr,)
    return lambda a, s, r: (driver.to_device(a, s, r).ptr,)


def _tuple_fields(inner):
    def fields(values, stream, retr):
        out = []
        for (fn, spread), v in zip(inner, values):
            out.extend((v,) if fn is None else fn(v, stream, retr) if spread else (fn(v),))
        return tuple(out)

    return fields


# -- loading and launching --------------------------------------------------------------

_loaded: dict = {}  # (blob id, binary kind, entry, device cc) -> cuda.core Kernel


def load(blob_id: str, binary: bytes, kind: str, entry: str, cooperative: bool, cc: tuple):
    """The kernel in a stored binary, loaded once per process. A cooperative kernel's
    PTX is linked with cudadevrt for the device first (its grid sync lives there),
    as numba links it; plain PTX is JIT-compiled by the driver."""
    key = (blob_id, kind, entry, tuple(cc))
    kernel = _loaded.get(key)
    if kernel is None:
        if kind == "ptx" and cooperative:
            from .loader import link_cudadevrt

            binary, kind = link_cudadevrt(binary, cc), "cubin"
        kernel = _loaded[key] = driver.load_kernel(binary, kind, entry)
    return kernel


class StoredKernel:
    """One stored (kernel, signature) loaded for one device: `bind(kinds)` gives the launch."""

    def __init__(self, kernel, argtypes, cooperative: bool):
        self.kernel = kernel
        self.argtypes = tuple(argtypes)
        self.cooperative = cooperative
        self.configs = _Configs(cooperative)

    def bind(self, kinds):
        return _Bound(self, make_packer(self.argtypes, kinds))


class _Bound:
    """The launch of one stored kernel for one kind of arguments: the hot path."""

    __slots__ = ("configs", "kernel", "pack")

    def __init__(self, stored, pack):
        self.configs, self.kernel, self.pack = stored.configs, stored.kernel, pack

    def __call__(self, args, config):
        griddim, blockdim, stream, sharedmem = split_config(config)
        launch_config = self.configs.get(griddim, blockdim, sharedmem)
        stream = core_stream(stream)
        retr = []
        driver.launch(stream, launch_config, self.kernel, *self.pack(args, stream, retr))
        for writeback in retr:
            writeback()


class NumbaKernel:
    """A stored kernel rebuilt as numba's `_Kernel` (debug kernels, argument extensions):
    numba packs and reports device-side exceptions; the stream is converted here."""

    def __init__(self, kernel):
        self.kernel = kernel

    def bind(self, kinds):
        return self.launch

    def launch(self, args, config):
        griddim, blockdim, stream, sharedmem = split_config(config)
        grid, block = normalize_dims(griddim, blockdim)
        self.kernel.launch(args, grid, block, core_stream(stream), sharedmem)


def needs_numba_kernel(options: dict) -> bool:
    """Whether a kernel with these decorator options must launch through numba's `_Kernel`."""
    return bool(options.get("debug") or options.get("extensions"))


_archs: dict = {}  # device id -> "sm_XY"


def device_arch(device_id: int) -> str:
    """The arch name of a device (asked once per device per process)."""
    arch = _archs.get(device_id)
    if arch is None:
        major, minor = driver.device_cc(device_id)[:2]
        arch = _archs[device_id] = f"sm_{major}{minor}"
    return arch


def current_device() -> int:
    """The current device's id (numba's primary context is made current if none is)."""
    return driver.current_device()


def forget_loaded() -> None:
    """Drop what this process loaded and learned of its devices (tests switch fake devices)."""
    _loaded.clear()
    _archs.clear()
