"""Launching numba-cuda-mlir kernels from the store: kbuild's launcher with its ABI.

The same path as numba-cuda's kernels (`backend.launcher`: kinds read once per kind,
a packer made once, `cuda.core.launch` through `backend.driver`), with arguments
typed as numba-cuda-mlir's dispatcher types them (its vendored `typeof`, of a host
array's device copy: `argument_types`) and packed as its kernels take them (`packing`:
memref descriptors, complex by value).

`install()` hands a stored kernel to the user's own `MLIRDispatcher` as a compiled
overload (a `CompileResult` of a `CachedCompileResult`, what its own `cache=True`
gives back): its C++ launcher then loads that cubin and never compiles.

Not supported here: a `debug=True` kernel's device-side exception is not raised by
kbuild's launcher (numba-cuda-mlir's launcher reads its `__numba_cuda_mlir_error_code`;
an `install()`ed dispatcher does), and numba-cuda-mlir's own `cuda.In/Out/InOut`
wrappers (numba-cuda's, and plain host arrays, are copied as for numba-cuda).
"""

from __future__ import annotations

import functools

import numpy as np

from ..launcher import (NumbaKernel, StoredKernel, cacheable, core_stream,  # noqa: F401
                        current_device, device_arch, kinds_of, load)
from ..kinds import compatible as _compatible
from ..kinds import misread as _misread
from .packing import field_maker

__all__ = ["argument_types", "cacheable", "compatible", "kinds_of", "misread", "core_stream",
           "load",
           "StoredKernel", "NumbaKernel", "needs_numba_kernel", "device_arch", "current_device",
           "install", "cached_result"]


def argument_types(args, kinds) -> tuple:
    """numba-cuda-mlir's types of the arguments, as its dispatcher types them (once per
    kinds: equal kinds type equally, tests/test_argument_typing.py)."""
    return tuple(_argument_type(a, k) for a, k in zip(args, kinds))


def _argument_type(value, kind):
    """numba-cuda-mlir's type of one argument: what its dispatcher's marshaller
    (`descriptor._ArgMarshaller`) types it as, its vendored `typeof` of the value, or of the
    device copy it makes first of a host array, in a tuple and in cuda.In/Out/InOut too."""
    from numba.cuda.args import ArgHint
    from numba_cuda_mlir.numba_cuda import types
    from numba_cuda_mlir.numba_cuda.typing.typeof import Purpose, typeof

    category = kind[0] if type(kind) is tuple and kind else None
    if isinstance(category, type):
        if issubclass(category, np.ndarray):
            return _device_copy_type(value)
        if issubclass(category, tuple) and type(kind[1]) is tuple:
            return types.BaseTuple.from_types(
                [_argument_type(v, k) for v, k in zip(value, kind[1])], type(value))
        if issubclass(category, ArgHint):
            if len(kind) == 3:  # a foreign device array: the device array made over it
                return _wrapped_type(value.value)
            return _argument_type(value.value, kind[1])
    return _in_its_types(typeof(value, Purpose.argument))


def _device_copy_type(host):
    """The type of the copy numba-cuda-mlir's dispatcher makes of a host array
    (`cuda.to_device`): its `auto_device` refuses an array that is strided but for
    repeated dimensions (ValueError, as its launch does), then makes its own DeviceNDArray
    of the array's shape, strides and dtype: writable and aligned whatever the host array
    is, and 'A' when broadcast."""
    from numba_cuda_mlir.numba_cuda.cudadrv import devicearray

    devicearray.sentry_contiguous(host)
    return _device_array_type(host.shape, host.strides, host.dtype)


def _wrapped_type(foreign):
    """The type of the DeviceNDArray numba-cuda-mlir makes over a foreign device array it
    copies (`auto_device` -> `from_cuda_array_interface`: its strides read in bytes)."""
    from numba_cuda_mlir.numba_cuda.api_util import (prepare_shape_strides_dtype,
                                                     resolve_cuda_array_interface_dtype)

    desc = foreign.__cuda_array_interface__
    dtype = resolve_cuda_array_interface_dtype(desc["typestr"], getattr(foreign, "dtype", None))
    shape, strides, dtype = prepare_shape_strides_dtype(desc["shape"], desc.get("strides"),
                                                        dtype, order="C")
    return _device_array_type(shape, strides, dtype)


def _device_array_type(shape, strides, dtype):
    """numba-cuda-mlir's type of its DeviceNDArray of that layout, made without memory
    (its `__init__` would allocate it): the array types itself (`_numba_type_`)."""
    from numba_cuda_mlir.numba_cuda.cudadrv import devicearray, dummyarray
    from numba_cuda_mlir.numba_cuda.typing.typeof import Purpose, typeof

    array = object.__new__(devicearray.DeviceNDArray)
    array._dummy = dummy = dummyarray.Array.from_desc(0, shape, strides, dtype.itemsize)
    array.shape, array.strides, array.size = dummy.shape, dummy.strides, dummy.size
    array.ndim, array.dtype = len(dummy.shape), dtype
    return typeof(array, Purpose.argument)


def _in_its_types(ty):
    """`ty` in numba-cuda-mlir's types. It types a numba-cuda device array by its
    `_numba_type_`, numba-cuda's own type, which none of its kernels takes; kbuild passes
    that array as what it is, the same array type in numba-cuda-mlir's vocabulary."""
    from numba.core import types as numba_types
    from numba_cuda_mlir.numba_cuda import types

    if not isinstance(ty, numba_types.Array) or isinstance(ty, types.Type):
        return ty
    from numba.np.numpy_support import as_dtype
    from numba_cuda_mlir.numba_cuda.np.numpy_support import from_dtype

    return types.Array(from_dtype(as_dtype(ty.dtype)), ty.ndim, ty.layout,
                       readonly=not ty.mutable, aligned=ty.aligned)


def misread(kinds, declared) -> int | None:
    """`kinds.misread` for numba-cuda-mlir: it types a `cuda.In/Out/InOut` around a foreign
    array as the device array it builds over it (strides read in bytes), never misread."""
    return _misread(kinds, declared, in_hints=False)


def compatible(actual, declared) -> bool:
    from numba_cuda_mlir.numba_cuda import types

    return _compatible(actual, declared, types)


StoredKernel = functools.partial(StoredKernel, field_maker=field_maker)  # noqa: F811


def needs_numba_kernel(options: dict) -> bool:
    """numba-cuda-mlir kernels always launch through kbuild's own launcher."""
    return False


def install(dispatcher, found, argtypes, device_cc: tuple, options: dict) -> None:
    """Hand a stored kernel (`found`: launch.Found) to the user's MLIRDispatcher as its
    compiled overload for `argtypes`: its launcher then loads this cubin. PTX (built for
    an older arch) is linked into a cubin for the device first, by nvJitLink."""
    from numba_cuda_mlir.compiler import CompileResult

    from ..loader import link_ptx

    cooperative = bool(found.manifest.get("cooperative"))
    cubin = found.binary if found.kind == "cubin" else \
        link_ptx(found.binary, device_cc, found.links, cooperative)
    result = cached_result(dispatcher, argtypes, cubin, found.manifest["entry"], cooperative)
    dispatcher.overloads[tuple(argtypes)] = CompileResult(result)


def cached_result(dispatcher, argtypes, cubin: bytes, entry: str, cooperative: bool):
    """A stored cubin as numba-cuda-mlir's own cache gives a kernel back (a
    `CachedCompileResult`): what its dispatcher publishes as an overload and launches."""
    from numba_cuda_mlir.caching import CachedCompileResult
    from numba_cuda_mlir.numba_cuda import types, typing

    meta = {"cubin": cubin, "func_name": entry, "ptx": None,
            "targetoptions": dict(dispatcher.targetoptions), "gpu_target": None,
            "use_cooperative": cooperative}
    return CachedCompileResult(typing.signature(types.none, *argtypes), meta)
