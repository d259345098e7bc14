"""Launching numba-cuda-mlir kernels from the store: kbuild's launcher with its ABI.

The same path as numba-cuda's kernels (`backend.launcher`: kinds read once per kind,
a packer made once, `cuda.core.launch` through `backend.driver`), with arguments
typed in numba-cuda-mlir's types (its vendored `typeof`) and packed as its kernels
take them (`packing`: memref descriptors, complex by value).

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
                        current_device, device_arch, kinds_of, load, misread)
from ..kinds import compatible as _compatible
from .packing import field_maker

__all__ = ["argument_types", "cacheable", "compatible", "kinds_of", "misread", "core_stream",
           "load",
           "StoredKernel", "NumbaKernel", "needs_numba_kernel", "device_arch", "current_device",
           "install", "cached_result"]


def argument_types(args, kinds) -> tuple:
    """numba-cuda-mlir's types of the arguments, as its dispatcher types them."""
    return tuple(_argument_type(a, k) for a, k in zip(args, kinds))


def _argument_type(value, kind):
    from numba_cuda_mlir.numba_cuda import types
    from numba_cuda_mlir.numba_cuda.np.numpy_support import from_dtype
    from numba_cuda_mlir.numba_cuda.typing.typeof import Purpose, typeof

    if isinstance(kind, tuple) and kind:
        category = kind[0]
        if category == "device":  # numba-cuda's DeviceNDArray
            _, _, dtype, ndim, layout = kind
            return types.Array(from_dtype(dtype), ndim, layout)
        if category in ("cai", "dlpack"):
            dtype, ndim, layout, readonly = kind[2:6]
            return types.Array(from_dtype(np.dtype(dtype)), ndim, layout, readonly=readonly)
        if isinstance(category, type) and issubclass(category, np.ndarray):
            _, dtype, ndim, layout, writeable, aligned = kind
            return types.Array(from_dtype(dtype), ndim, layout, readonly=not writeable,
                               aligned=aligned)
        inner = getattr(value, "value", None)
        if len(kind) == 2 and inner is not None and kind[1] is not None:  # cuda.In/Out/InOut
            return _argument_type(inner, kind[1])
    return typeof(value, Purpose.argument)


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
