"""numba-cuda's objects as keying sees them: `keying.interfaces.ObjectModel` for numba-cuda.

Every attribute keying needs of numba's objects is read here, and nowhere in keying:
a dispatcher's `py_func` and `targetoptions`, the simulator's `FakeCUDAKernel`
(`fn`, `_device`: NUMBA_ENABLE_CUDASIM keeps no options, `simopts` reads them back),
a user `@intrinsic`'s `_defn`, `cuda.declare_device`'s `ExternFunction`, a `link=`
item's `path` or `data`, an eagerly compiled dispatcher's `nopython_signatures`, and
numba's typing registries (`registry`). Another backend
implements the same interface in a module of its own and hands it to the `Keyer`.
"""

from __future__ import annotations

import sys
import types as pytypes

from numba.core import types as nbtypes

from ..keying.interfaces import DeclaredFunction, Function, LinkedCode, Role
from ..keying.values import add_value_form
from .compiletime import frozen_defaults, with_compile_time


def llvm_ir_form(value) -> tuple | None:
    """An llvmlite IR type or constant (`F32 = ir.FloatType()`, read by a lowering
    function) by its LLVM text, which is all it is: an identified struct with its body.
    None for anything else (llvmlite not loaded: no value is one of its)."""
    ir = sys.modules.get("llvmlite.ir")
    if ir is None:
        return None
    if isinstance(value, ir.IdentifiedStructType):
        return ("llvm-type", "identified", value.get_declaration())
    if isinstance(value, ir.Type):
        return ("llvm-type", str(value))
    if isinstance(value, ir.Constant):
        return ("llvm-constant", str(value))
    return None


add_value_form(llvm_ir_form)


class NumbaCudaObjects:
    """`ObjectModel` for numba-cuda's dispatchers, its simulator, intrinsics and externs."""

    def function_of(self, obj) -> Function | None:
        py_func = getattr(obj, "py_func", None)
        if isinstance(py_func, pytypes.FunctionType) and hasattr(obj, "targetoptions"):
            # What numba froze when it made the dispatcher, and what its compile reads now.
            options = with_compile_time(dict(obj.targetoptions))
            return Function(py_func, options, Role.DEVICE if options.get("device") else Role.KERNEL,
                            frozen_defaults(obj))
        fn = getattr(obj, "fn", None)
        if isinstance(fn, pytypes.FunctionType) and hasattr(obj, "_device"):
            # numba's simulator (NUMBA_ENABLE_CUDASIM): FakeCUDAKernel. Its options are
            # read back from its decorator when it is keyed (`options_of`).
            return Function(fn, None, Role.DEVICE if obj._device else Role.KERNEL)
        return stub_function(obj)

    def options_of(self, obj) -> dict:
        from .simopts import options_for

        return with_compile_time(dict(options_for(obj)))

    def declared_function(self, value) -> DeclaredFunction | None:
        cls = type(value)
        if not (cls.__name__ == "ExternFunction" and cls.__module__.startswith("numba")
                and hasattr(value, "sig") and hasattr(value, "name")):
            return None
        from .registry import extern_link_files

        sig = value.sig
        return DeclaredFunction(value.name, tuple(sig.args), sig.return_type, str(sig),
                                tuple(extern_link_files(value)))

    def record_of(self, value):
        return record_in(value, nbtypes)

    def linked_item(self, item) -> str | LinkedCode | None:
        return linked_item(item)

    def overloads_of(self, func) -> list:
        from .registry import overload_implementations

        return overload_implementations(func)

    def known_to_compiler(self, value) -> bool:
        from .registry import known_to_numba

        return known_to_numba(value)

    def named_form(self, value) -> tuple | None:
        py_func = getattr(value, "py_func", None)
        if isinstance(py_func, pytypes.FunctionType):
            # A dispatcher compiled eagerly (`@cuda.jit("float32(float32)", device=True)`) is
            # typed by its declared signatures, which are not in its body.
            eager = () if getattr(value, "_can_compile", True) else tuple(
                sorted(str(sig) for sig in getattr(value, "nopython_signatures", ())))
            return ("function", py_func.__module__, py_func.__qualname__, eager)
        if type(value).__name__ == "ExternFunction" and hasattr(value, "sig"):
            # `cuda.declare_device`: its name and signature; its link files are observed too.
            return ("extern", str(value.name), str(value.sig))
        defn = getattr(value, "_defn", None)
        if isinstance(defn, pytypes.FunctionType):
            # A user @intrinsic read through a module (`mod.my_intrinsic(...)`): its
            # definition runs at typing time and is observed there, options and all.
            return ("intrinsic", defn.__module__, defn.__qualname__)
        return None


NUMBA_CUDA = NumbaCudaObjects()


# -- shared with numba-cuda-mlir's object model (its types are a vendored copy) ---------------

def stub_function(obj) -> Function | None:
    """A function compiled code calls by what is registered for it, not by its body (a
    user `@intrinsic`, a Python function with `@overload`s), either compiler's."""
    defn = getattr(obj, "_defn", None)
    if isinstance(defn, pytypes.FunctionType):
        return Function(defn, {}, Role.FUNCTION)  # a user @intrinsic
    if isinstance(obj, pytypes.FunctionType):
        return Function(obj, {}, Role.FUNCTION)
    return None


def record_in(value, types_module):
    """The record type `value` is or holds (an array of records: its dtype), in
    `types_module`'s vocabulary, or None."""
    if not isinstance(value, types_module.Type):
        return None
    record = value if isinstance(value, types_module.Record) else getattr(value, "dtype", None)
    return record if isinstance(record, types_module.Record) else None


def linked_item(item) -> str | LinkedCode | None:
    """A `link=` item: a file's path, or code given inline (numba-cuda's LinkableCode:
    PTXSource, Cubin, ...; numba-cuda-mlir's cuda.LTOIR, CUSource, ...) by its kind and bytes."""
    path = item if isinstance(item, str) else getattr(item, "path", None)
    if isinstance(path, str):
        return path
    data = getattr(item, "data", None)
    if isinstance(data, (bytes, str)):
        return LinkedCode(type(item).__name__, data)
    return None
