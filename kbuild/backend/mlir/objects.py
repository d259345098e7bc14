"""numba-cuda-mlir's objects as keying sees them: `keying.interfaces.ObjectModel`.

Every attribute keying needs of numba-cuda-mlir's objects is read here: its
dispatcher (`MLIRDispatcher`: `py_func`, `targetoptions`, `_can_compile`,
`nopython_signatures`), its `@intrinsic` (`_defn`), `cuda.declare_device`'s
`ExternFunction` (`name`, `sig`, `link`), a `link=` item (a path, or a
`LinkableCode` holding `data`), and the typing registries that hold the
`@overload`s of its vendored (`numba_cuda_mlir.numba_cuda.extending`) and native
(`numba_cuda_mlir.extending`) extension APIs. Its types are the vendored copy of
numba's (`numba_cuda_mlir.numba_cuda.types`), keyed as numba's are
(`keying.values.add_type_vocabulary`).
"""

from __future__ import annotations

import types as pytypes

from numba_cuda_mlir.compiler import ExternFunction
from numba_cuda_mlir.descriptor import MLIRDispatcher
from numba_cuda_mlir.numba_cuda import types as mtypes

from ...keying.interfaces import DeclaredFunction, Function, LinkedCode, Role
from ..objectmodel import linked_item, record_in, stub_function
from ..registry import known_to_numba, overload_implementations

# Options that never change the compiled code: caching, dumps and traces, and the arch
# (kbuild compiles every target for its own arch; `chip` is what the decorator's `cc`
# becomes, and upstream pins it on a dispatcher's first compile).
_NOT_CODE = frozenset({
    "cache", "chip", "cc", "dump", "dump_ast", "dump_ast_after_all", "dump_cubin",
    "dump_llvmir", "dump_mlir", "dump_numba_ir", "dump_ptx", "print_after_all",
    "print_before_all", "profile_jit"})
# Forced for a device function by its first compile as a callee (`_compile_as_device_callee`
# sets lto=False), so not an option of its own.
_NOT_CODE_DEVICE = _NOT_CODE | {"lto"}


def options(disp) -> dict:
    """A dispatcher's options as keyed: those that change code; the default inlining
    policy (a function upstream fills in) by name; an eagerly compiled one's signatures."""
    device = bool(disp.targetoptions.get("device"))
    out = {}
    for name, value in disp.targetoptions.items():
        if name in (_NOT_CODE_DEVICE if device else _NOT_CODE):
            continue
        if name == "inline" and isinstance(value, pytypes.FunctionType):
            value = f"{value.__module__}:{value.__qualname__}"  # decorators._default_inline
        out[name] = value
    if not disp._can_compile:
        # Compiled at decoration, for signatures its decorator or its annotations declare
        # (`annotations_as_signatures`): what it is typed by, which its body does not say.
        out["signatures"] = tuple(sorted(str(sig) for sig in disp.nopython_signatures))
    return out


class MlirObjects:
    """`ObjectModel` for numba-cuda-mlir's dispatchers, intrinsics and externs."""

    def function_of(self, obj) -> Function | None:
        if isinstance(obj, MLIRDispatcher):
            opts = options(obj)
            return Function(obj.py_func, opts, Role.DEVICE if opts.get("device") else Role.KERNEL)
        return stub_function(obj)

    def options_of(self, obj) -> dict:
        return {}

    def declared_function(self, value) -> DeclaredFunction | None:
        if not isinstance(value, ExternFunction):
            return None
        sig = value.sig
        paths = tuple(p for p in (value.link or ()) if isinstance(p, str))
        return DeclaredFunction(value.name, tuple(sig.args), sig.return_type, str(sig), paths)

    def record_of(self, value):
        return record_in(value, mtypes)

    def linked_item(self, item) -> str | LinkedCode | None:
        return linked_item(item)

    def overloads_of(self, func) -> list:
        return overload_implementations(func, among=registries())

    def known_to_compiler(self, value) -> bool:
        return known_to_numba(value, among=registries())

    def named_form(self, value) -> tuple | None:
        if isinstance(value, MLIRDispatcher):
            eager = () if value._can_compile else tuple(
                sorted(str(sig) for sig in value.nopython_signatures))
            return ("function", value.py_func.__module__, value.py_func.__qualname__, eager)
        if isinstance(value, ExternFunction):
            return ("extern", str(value.name), str(value.sig))
        return None


def registries() -> list:
    """The typing registries user extensions register with: the vendored numba API's
    (`numba_cuda_mlir.numba_cuda.extending.overload`, `register_jitable`, `intrinsic`)
    and numba-cuda-mlir's own (`numba_cuda_mlir.extending.*(typing_registry=...)`)."""
    from numba_cuda_mlir import extending
    from numba_cuda_mlir.numba_cuda.typing import templates

    return [templates.builtin_registry, extending.typing_registry]


MLIR_OBJECTS = MlirObjects()
