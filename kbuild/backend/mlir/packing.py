"""Packing: arguments laid out as numba-cuda-mlir's kernel ABI (a `packing.make_packer`
field maker).

What its kernels' `.entry` declares (read from their PTX; checked by the fake driver):

- an array is an MLIR memref descriptor of 3 + 2 x ndim 64-bit values: allocated
  pointer, aligned pointer, offset, the sizes, the strides, offset and strides counted
  in *elements* (its code addresses `aligned + itemsize * (offset + i * stride)`),
  whatever the layout (C-contiguous arrays too). Both pointers are the data pointer, the
  offset 0: the array's first element is where the pointer points;
- complex64 / complex128 is one 8 / 16-byte value (numba-cuda passes two floats);
- a record is a device pointer to a copy, a scalar a C value of its type, tuples
  flatten: as numba-cuda.

Host numpy arrays and records are copied in and back by numba-cuda's code (through
`driver.to_device`), as for numba-cuda's kernels.
"""

from __future__ import annotations

import ctypes

import numpy as np

from .. import driver
from ..packing import cai_fields, tuple_fields, view_fields


def field_maker(ty, kind):
    """(function, spread) laying out one argument of type `ty` (see `packing._field_maker`)."""
    from numba_cuda_mlir.numba_cuda import types

    if isinstance(ty, types.Array):
        return _memref_maker(kind, ty.dtype.bitwidth // 8), True
    if isinstance(ty, types.Record):
        return _record_fields(kind), True
    if isinstance(ty, types.BaseTuple):
        return tuple_fields([field_maker(t, k) for t, k in zip(ty, kind[1])]), True
    if isinstance(ty, types.EnumMember):
        convert, spread = field_maker(ty.dtype, None)
        return (lambda v, s, r: convert(v.value, s, r)) if spread \
            else (lambda v: convert(v.value)), spread
    return _scalar_maker(ty, types)


def _scalar_maker(ty, types):
    if isinstance(ty, types.Boolean):
        return ctypes.c_bool, False
    if isinstance(ty, types.Integer):
        return getattr(ctypes, f"c_{ty}"), False
    simple = {types.float32: ctypes.c_float, types.float64: ctypes.c_double,
              types.complex64: np.complex64, types.complex128: np.complex128}
    if ty in simple:
        return simple[ty], False
    if ty == types.float16:
        return (lambda v: ctypes.c_uint16(np.float16(v).view(np.uint16))), False
    if isinstance(ty, (types.NPDatetime, types.NPTimedelta)):
        return (lambda v: ctypes.c_int64(v.view(np.int64))), False
    if isinstance(ty, types.CPointer):
        return int, False
    raise NotImplementedError(f"kbuild cannot pass an argument of type {ty} to a "
                              "numba-cuda-mlir kernel")


def _memref_maker(kind, itemsize: int):
    category = kind[0] if isinstance(kind, tuple) else None
    if category == "device":  # a numba-cuda device array: its descriptor kept on it
        return lambda a, s, r: _device_memref(a, itemsize)
    if category == "cai":
        return lambda a, s, r: memref(cai_fields(a, itemsize, _cai_sync), itemsize)
    if category == "dlpack":
        return lambda a, s, r: memref(view_fields(driver.array_view(a, s), itemsize), itemsize)
    # host arrays, cuda.In/Out/InOut and anything else numba-cuda knows how to copy
    return lambda a, s, r: memref(view_fields(driver.to_device(a, s, r), itemsize), itemsize)


def memref(fields: tuple, itemsize: int) -> tuple:
    """The memref descriptor of an array given as numba-cuda's parameters (meminfo, parent,
    nitems, itemsize, data, shape..., strides... in bytes)."""
    data, ndim = fields[4], (len(fields) - 5) // 2
    shape, strides = fields[5:5 + ndim], fields[5 + ndim:]
    if any(s % itemsize for s in strides):
        raise ValueError(f"a numba-cuda-mlir kernel takes array strides in elements; strides "
                         f"{tuple(strides)} are not multiples of the item size {itemsize}")
    return (data, data, 0, *shape, *(s // itemsize for s in strides))


def _cai_sync() -> bool:
    from numba_cuda_mlir.numba_cuda.core import config

    return bool(config.CUDA_ARRAY_INTERFACE_SYNC)


def _device_memref(a, itemsize):
    fields = a.__dict__.get("_kbuild_memref")
    if fields is None:
        fields = a.__dict__["_kbuild_memref"] = memref(
            view_fields(a._strided_memory_view_shim, itemsize), itemsize)
    return fields


def _record_fields(kind):
    if isinstance(kind, tuple) and kind and kind[0] == "device":
        return lambda a, s, r: (a._strided_memory_view_shim.ptr,)
    return lambda a, s, r: (driver.to_device(a, s, r).ptr,)
