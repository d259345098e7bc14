"""Which modules are the toolchain's (or the language's), not the project's.

Kept apart from `registrations` (which needs numba): discovering targets and direct mode
ask it without importing numba.
"""

from __future__ import annotations

import sys
import types as pytypes

# Packages whose versions are in the toolchain key: what they hold is theirs, not the project's.
LIBRARIES = frozenset({"numba", "numba_cuda", "llvmlite", "numpy", "cuda", "kbuild",
                       "numba_cuda_mlir"})


def is_library(module_name) -> bool:
    """Whether a module's code and data are pinned by the toolchain (or the language)."""
    if not isinstance(module_name, str) or not module_name:
        return True
    top = module_name.partition(".")[0]
    return top in LIBRARIES or top in sys.stdlib_module_names or top == "builtins"


def is_settings(module_name, module) -> bool:
    """Whether a library module holds settings rather than code: numba's `config` (under
    each name a backend has it: numba's, numba-cuda's, a vendored copy), whose values
    come from the environment and `.numba_config.yaml` when it loads and whenever numba
    reloads it. What the project's code reads of it is state, as a module of the
    project's is, never pinned by a version."""
    if not isinstance(module_name, str) or module_name.rpartition(".")[2] != "config" or \
            module_name.partition(".")[0] not in LIBRARIES:
        return False
    namespace = getattr(module, "__dict__", None)
    return isinstance(namespace, dict) and callable(namespace.get("reload_config")) \
        and "_env_reloader" in namespace


# numba's own packages: a module that holds one of their modules or objects builds on numba.
_NUMBA = frozenset({"numba", "numba_cuda", "numba_cuda_mlir"})
_BUILDS_ON_NUMBA: dict = {}  # top-level package -> (the answer, len(sys.modules) then)


def builds_on_numba(module_name) -> bool:
    """Whether the package `module_name` belongs to builds on numba: one of its loaded
    modules holds a module, function, class or object of numba's as a global (`from
    numba import cuda`, `from numba.extending import overload`). An installed package that
    does is a numba extension, whose code numba runs while it compiles (its overloads,
    typing, lowering and the helpers they call) as it runs the project's; one that does
    not (cffi, a YAML parser) is a helper numba or the project calls. A package's answer
    is looked for again only when modules were imported since it was no."""
    if not isinstance(module_name, str) or not module_name:
        return False
    top = module_name.partition(".")[0]
    answer, modules = _BUILDS_ON_NUMBA.get(top, (False, -1))
    if answer or modules == len(sys.modules):
        return answer
    modules = len(sys.modules)
    answer = any(_holds_numba(namespace) for name, namespace in loaded_namespaces()
                 if name == top or name.startswith(top + "."))
    _BUILDS_ON_NUMBA[top] = (answer, modules)
    return answer


def _holds_numba(namespace: dict) -> bool:
    for value in list(namespace.values()):
        try:
            name = _module_of(value)
        except Exception:  # noqa: BLE001 - an object posing as a module, class or function
            continue
        if isinstance(name, str) and name.partition(".")[0] in _NUMBA:
            return True
    return False


def own_namespace(module) -> dict | None:
    """A module's own dict, past its class (a lazy module would load, a watched one record
    the read); None for what only poses as a module (a proxy in sys.modules)."""
    if not isinstance(module, pytypes.ModuleType):
        return None
    try:
        namespace = pytypes.ModuleType.__getattribute__(module, "__dict__")
    except TypeError:
        return None
    return namespace if isinstance(namespace, dict) else None


def loaded_namespaces(skip_libraries: bool = False):
    """(name, own namespace) of each loaded module, past its class (`own_namespace`); the
    toolchain's and the language's left out when `skip_libraries`."""
    for name, module in sys.modules.copy().items():
        if skip_libraries and is_library(name):
            continue
        namespace = own_namespace(module)
        if namespace:
            yield name, namespace


def namespace_module(scope) -> str | None:
    """The name of the loaded module whose own namespace `scope` is, or None (a copy, a
    namespace of one's own, a module since replaced in `sys.modules`)."""
    name = dict.get(scope, "__name__") if isinstance(scope, dict) else None
    module = sys.modules.get(name) if isinstance(name, str) else None
    return name if module is not None and own_namespace(module) is scope else None


def _module_of(value):
    """The module a global's value is from: a module's own name, a function's or class's
    module, else its type's."""
    if isinstance(value, pytypes.ModuleType):
        namespace = own_namespace(value)
        return namespace.get("__name__") if namespace else None
    if isinstance(value, type):
        return type.__getattribute__(value, "__module__")
    if isinstance(value, (pytypes.FunctionType, pytypes.BuiltinFunctionType)):
        return value.__module__
    return type(value).__module__


__all__ = ["LIBRARIES", "builds_on_numba", "is_library", "is_settings", "namespace_module",
           "own_namespace", "loaded_namespaces"]
