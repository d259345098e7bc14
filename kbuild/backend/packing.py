"""Packing: arguments laid out as numba's kernel ABI, by a function made once per
(signature, argument kinds).

numba's ABI, as `_Kernel._prepare_args` writes it: an array is meminfo (0), parent
(0), nitems, itemsize, data pointer, shape..., strides... (all 64-bit); a record is a
device pointer to a copy; a scalar is a C value of the declared type (bool one byte,
complex two floats, float16 its bits); tuples flatten. A numpy scalar of the declared
type is handed to cuda.core as it is (its ParamHolder lays it out by its own type).
Host numpy arrays and records are copied in and back by numba's own code (through
`driver.to_device`), as numba does.
"""

from __future__ import annotations

import ctypes

import numpy as np

from . import driver
from .kinds import contiguous_strides


def make_packer(argtypes, kinds, field_maker=None):
    """A function (args, stream, retr) -> the flat kernel parameters, for one
    (signature, argument kinds); generated once so a launch runs no type checks.
    `field_maker(type, kind)` lays one argument out (default: numba-cuda's ABI; another
    backend passes its own, see `_field_maker` for what it returns)."""
    field_maker = field_maker or _field_maker
    try:
        return _PACKERS[(tuple(argtypes), kinds, field_maker)]
    except KeyError:
        pass
    except TypeError:  # kinds that cannot be a dictionary key: made for this launch only
        return _packer(argtypes, kinds, field_maker)
    found = _packer(argtypes, kinds, field_maker)
    if len(_PACKERS) < 4096:
        _PACKERS[(tuple(argtypes), kinds, field_maker)] = found
    return found


# (argument types, kinds, field maker) -> its packer: kernels of one signature (a program's
# many kernels over the same arrays) share one, made once per process.
_PACKERS: dict = {}


def _packer(argtypes, kinds, field_maker):
    names, exprs = {}, []
    for i, (ty, kind) in enumerate(zip(argtypes, kinds)):
        fn, spread = field_maker(ty, kind)
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
        return lambda a, s, r: cai_fields(a, itemsize)
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
        strides = contiguous_strides(shape, itemsize, "C" if layout.is_contiguous_c else "F")
    return (0, 0, view.size, itemsize, view.ptr, *shape, *strides)


def cai_fields(a, itemsize, sync_foreign_streams=None) -> tuple:
    """numba's array parameters of a `__cuda_array_interface__` object, after waiting on
    the stream it names when the compiler's config says to (`sync_foreign_streams()`:
    default numba-cuda's CUDA_ARRAY_INTERFACE_SYNC)."""
    desc = a.__cuda_array_interface__
    if desc.get("mask") is not None:
        raise NotImplementedError("masked __cuda_array_interface__ arrays are not supported")
    foreign = desc.get("stream")
    if foreign is not None and (sync_foreign_streams or _cai_sync)():
        driver.sync_stream(foreign)
    shape = tuple(desc["shape"])
    strides = desc.get("strides") or contiguous_strides(shape, itemsize, "C")
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


def tuple_fields(inner):
    """The parameters of a tuple: its items' (`inner`: their (function, spread)), flattened."""
    return _tuple_fields(inner)


def _tuple_fields(inner):
    def fields(values, stream, retr):
        out = []
        for (fn, spread), v in zip(inner, values):
            out.extend((v,) if fn is None else fn(v, stream, retr) if spread else (fn(v),))
        return tuple(out)

    return fields


def _device_array_fields(a, itemsize):
    fields = a.__dict__.get("_kbuild_fields")
    if fields is None:
        fields = a.__dict__["_kbuild_fields"] = view_fields(a._strided_memory_view_shim, itemsize)
    return fields
