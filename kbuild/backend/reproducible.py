"""numba-cuda patched for one compile so that a kernel's bytes depend on the kernel alone.

numba mangles into every symbol name what the process did before (a per-process
function number, a record's creation number, a dispatcher's memory address), spells
its flags in PYTHONHASHSEED's order, keeps the helpers a lowering compiles once per
process whatever flags they inherited, and writes a debug binary's absolute source
paths. Each patch below undoes one of these for the length of a compile, so that the
same kernel gives the same PTX and cubin in any process and any checkout, the bytes
numba makes for it in a fresh process; `compiler._kbuild_patches` lists them.
"""

from __future__ import annotations

import contextlib

from .targeting import simulating


@contextlib.contextmanager
def record_names():
    """numba mangles a record type's per-process creation number into symbol names, so one
    kernel's bytes would depend on what else the process typed; mangle its layout instead."""
    from numba.core.types import npytypes as core_npytypes
    from numba.cuda.types import cuda_npytypes

    from ..keying.encode import digest_of
    from ..keying.values import type_canonical

    def mangling_args(self):
        return type(self).__name__, (int(digest_of(type_canonical(self))[:12], 16),)

    classes = dict.fromkeys([core_npytypes.Record, cuda_npytypes.Record])
    with patched(classes, "mangling_args", lambda _original: property(mangling_args)):
        yield


@contextlib.contextmanager
def dispatcher_names(stable_ids: dict):
    """numba mangles a function passed as an argument (`apply(twice, x)`) by its dispatcher's
    repr, which holds the function's memory address; mangle its name and stable number
    instead. A function without a stable number keeps numba's (unique, unstable) name."""
    from numba.core.types import functions as core_functions
    from numba.cuda.types import cuda_functions

    def replacement(original):
        def mangling_args(self):
            try:
                py_func = getattr(self.dispatcher, "py_func", None)
            except ReferenceError:  # a dispatcher gone: nothing compiles against it any more
                py_func = None
            number = stable_ids.get(py_func)
            if number is None:
                return original.fget(self)
            return "Dispatcher", (py_func.__qualname__, number)

        return property(mangling_args)

    classes = dict.fromkeys([core_functions.Dispatcher, cuda_functions.Dispatcher])
    with patched(classes, "mangling_args", replacement):
        yield


@contextlib.contextmanager
def patched(classes, name: str, replacement):
    """Within the block, each class's attribute `name` is `replacement(its original)`
    (the original may be inherited: the class's own attribute is removed afterwards)."""
    import inspect

    saved = [(cls, cls.__dict__.get(name, _INHERITED)) for cls in classes]
    for cls, _ in saved:
        setattr(cls, name, replacement(inspect.getattr_static(cls, name)))
    try:
        yield
    finally:
        for cls, original in saved:
            if original is _INHERITED:
                delattr(cls, name)
            else:
                setattr(cls, name, original)


_INHERITED = object()


@contextlib.contextmanager
def const_bytes_names():
    """numba names a byte-string constant (a string literal's data: `MODE in ("x", "y")`)
    `.bytes.<hash(bytes)>`, which PYTHONHASHSEED changes, and NVVM keeps the name in the
    PTX (`_$_bytes_$_<n>`); within the block, the name is a digest of the bytes."""
    from numba.cuda.core import base

    from ..keying.encode import digest_of

    def replacement(original):
        def insert_const_bytes(self, mod, bytes, name=None):
            if name is None:
                name = str(int(digest_of(("const bytes", bytes))[:15], 16))
            return original(self, mod, bytes, name=name)

        return insert_const_bytes

    with patched([base.BaseContext], "insert_const_bytes", replacement):
        yield


_SMEM = "_cudapy_smem_"


@contextlib.contextmanager
def shared_memory_names():
    """numba names each shared array `_cudapy_smem_<n>` from a per-process count (NVVM
    cannot make them internal, so every one in a link needs a name of its own), and the
    PTX keeps the name: a kernel's bytes depended on how many arrays the process lowered
    before it (an array added to another kernel renamed this one's). Within the block, an
    array is named by the function it is lowered in and its place among the arrays of
    that function's module: the same in every process, and unique in a link, as the
    functions' names are."""
    if simulating():
        yield
        return
    from numba.cuda import cudaimpl

    from ..keying.encode import digest_of

    def replacement(original):
        def _generic_array(context, builder, *args, **kwargs):
            name = kwargs.get("symbol_name")
            if isinstance(name, str) and name.startswith(_SMEM):
                place = sum(1 for g in builder.module.global_values
                            if g.name.startswith(_SMEM))
                number = digest_of(("shared array", builder.function.name, place))[:16]
                kwargs["symbol_name"] = f"{_SMEM}{number}"
            return original(context, builder, *args, **kwargs)

        return _generic_array

    with _patched_function(cudaimpl, "_generic_array", replacement):
        yield


@contextlib.contextmanager
def _patched_function(module, name: str, replacement):
    """Within the block, `module.name` is `replacement(its original)` (the lowering
    functions look it up in their module's globals at each call)."""
    original = getattr(module, name)
    setattr(module, name, replacement(original))
    try:
        yield
    finally:
        setattr(module, name, original)


@contextlib.contextmanager
def internal_functions():
    """numba compiles the helpers a lowering asks for (`compile_internal`: `x ** n`'s
    `int_power`, ...) with the flags of the function being lowered (`fastmath`, `lto`,
    nvvm options: they are inherited), but keeps them by code and types alone, once per
    process: a kernel without fastmath could link a helper compiled for a fastmath device
    function, and every kernel links the one the process happened to compile first, under
    that one's name. Within the block, helpers are kept per kernel and per the flags they
    inherit."""
    if simulating():
        yield
        return
    from numba.cuda.core import base
    from numba.cuda.core.targetconfig import ConfigStack

    tables: dict = {}  # the inherited flags' summary -> numba's table of helpers

    def replacement(original):
        def compile_subroutine(self, builder, impl, sig, locals=None, flags=None,
                               caching=True):
            top = ConfigStack.top_or_none()
            table = tables.setdefault(top.summary() if top is not None else "", {})
            saved, self.cached_internal_func = self.cached_internal_func, table
            try:
                return original(self, builder, impl, sig, locals=locals, flags=flags,
                                caching=caching)
            finally:
                self.cached_internal_func = saved

        return compile_subroutine

    with patched([base.BaseContext], "compile_subroutine", replacement):
        yield


@contextlib.contextmanager
def debug_paths(source_roots):
    """Within the block, a debug or lineinfo binary names its source files against
    placeholders, not this checkout's folders (`debugpaths`: put back at load)."""
    if simulating():
        yield
        return
    from numba.cuda import debuginfo

    from .debugpaths import path_map

    paths = path_map(source_roots)

    def replacement(original):
        def _di_file(self):
            real = self.filepath
            self.filepath = paths.written(real)
            try:
                return original(self)
            finally:
                self.filepath = real

        return _di_file

    with patched([debuginfo.DIBuilder], "_di_file", replacement):
        yield


@contextlib.contextmanager
def flag_names():
    """numba mangles a function's flags into its symbol names as their text, in which a set
    (`fastmath={"nsz", "arcp"}`, and the same set in `nvvm_options`) is in PYTHONHASHSEED's
    order and a dict in the order its keys were added (`nvvm_options` is built in two
    places two ways); spell sets and dicts sorted (`fastmath=True`'s one flag reads as
    before)."""
    import importlib

    def spelled(value) -> str:
        if isinstance(value, (set, frozenset)):
            inner = ", ".join(sorted(spelled(v) for v in value))
            return "{" + inner + "}" if inner else "set()"  # as Python spells them
        if isinstance(value, dict):
            items = sorted((spelled(k), spelled(v)) for k, v in value.items())
            return "{" + ", ".join(f"{k}: {v}" for k, v in items) + "}"
        return repr(value)

    options, configs = [], []
    for name, attr, into in (("numba.cuda.core.options", "FastMathOptions", options),
                             ("numba.core.options", "FastMathOptions", options),
                             ("numba.cuda.core.targetconfig", "TargetConfig", configs),
                             ("numba.core.targetconfig", "TargetConfig", configs)):
        try:
            cls = getattr(importlib.import_module(name), attr, None)
        except ImportError:
            continue
        if isinstance(cls, type) and cls not in into:
            into.append(cls)

    def summary(self) -> str:
        args = ", ".join(f"{k}={spelled(v)}" for k, v in self._summary_args())
        return f"{type(self).__name__}({args})"

    with patched(options, "encode", lambda _original: lambda self: spelled(set(self.flags))), \
            patched(configs, "summary", lambda _original: summary):
        yield
