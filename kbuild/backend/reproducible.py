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
import types

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
    with _patched(classes, "mangling_args", lambda _original: property(mangling_args)):
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
    with _patched(classes, "mangling_args", replacement):
        yield


@contextlib.contextmanager
def _patched(classes, name: str, replacement):
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

    with _patched([base.BaseContext], "insert_const_bytes", replacement):
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

    with _patched([base.BaseContext], "compile_subroutine", replacement):
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

    with _patched([debuginfo.DIBuilder], "_di_file", replacement):
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

    with _patched(options, "encode", lambda _original: lambda self: spelled(set(self.flags))), \
            _patched(configs, "summary", lambda _original: summary):
        yield


@contextlib.contextmanager
def numbering(stable_ids: dict):
    """numba's FunctionIdentity numbers: from `stable_ids` where known, else from what the
    function is (`_content_number`: an `@overload`'s implementation, a helper compiled for
    a lowering), else 1, 2, ... per kernel. numba mangles the number into every symbol
    name (a function's, its environment's), and keeps what it compiled for later kernels:
    a number from the order of compiles would put a process's history into the bytes."""
    import itertools

    from numba.core import bytecode as core_bytecode
    from numba.cuda.core import bytecode as cuda_bytecode

    classes = [m.FunctionIdentity for m in (core_bytecode, cuda_bytecode)]
    issued = set()
    content: dict = {}  # id(function) -> (function, number or None), for this kernel

    def numbered(original):
        def from_function(cls, pyfunc):
            ident = original.__func__(cls, pyfunc)
            func = getattr(ident, "func", None)
            number = stable_ids.get(func)
            if number is not None and number in issued:
                number = None  # a keyed function's re-derived copy: numbered by content
            if number is not None:
                issued.add(number)
            else:
                # One number for every copy: copies compiled with other types or flags
                # differ in their mangled names, and equal ones are one function.
                number = _content_number(func, content)
            if number is not None:
                cls._unique_ids = itertools.count(ident.unique_id)  # hand the number back
                ident.unique_id = number
                ident.unique_name = f"{ident.func_qualname}${number}"
            return ident

        return classmethod(from_function)

    for cls in classes:
        cls._unique_ids = itertools.count(1)
    with _patched(classes, "from_function", numbered):
        yield


def _content_number(func, memo: dict) -> int | None:
    """A number for a function from what it is: its qualified name, its code and what its
    closure cells and defaults hold, by content (the way a stable id comes from a keyed
    function's identity). None - numba's count then - for one that holds something with
    no content form: two such functions must never share a name."""
    if not isinstance(func, types.FunctionType):
        return None
    slot = id(func)  # this kernel's compile only; the function is kept with its number
    if slot not in memo:
        memo[slot] = (func, _number_of(func))
    return memo[slot][1]


def _number_of(func) -> int | None:
    from ..errors import KeyingError
    from ..keying.bytecode import code_fingerprint
    from ..keying.encode import Unencodable, digest_of

    # The code as keys see it (no positions, local names or docstring): an edit that
    # keeps a function's key keeps its number, and its bytes.
    try:
        form = ("function-number", func.__module__, func.__qualname__,
                code_fingerprint(func.__code__, func.__qualname__),
                tuple(_held_form(c.cell_contents, 0) for c in func.__closure__ or ()),
                tuple(_held_form(d, 0) for d in func.__defaults__ or ()))
        return int(digest_of(form)[:12], 16) + (1 << 48)
    except (Unencodable, KeyingError, ValueError, TypeError, RecursionError):
        return None


def _held_form(value, depth: int):
    """A captured value by content: numbers, strings, tuples, numpy values (`canonical`);
    functions by their own form; classes and modules by name; numba types by their name.
    Raises Unencodable for anything else."""
    from ..keying.encode import Unencodable
    from ..keying.values import canonical

    if depth > 8:
        raise Unencodable(value)
    if isinstance(value, types.FunctionType):
        from ..keying.bytecode import code_fingerprint

        return ("function", value.__module__, value.__qualname__,
                code_fingerprint(value.__code__, value.__qualname__),
                tuple(_held_form(c.cell_contents, depth + 1) for c in value.__closure__ or ()))
    py_func = getattr(value, "py_func", None)
    if isinstance(py_func, types.FunctionType) and hasattr(value, "targetoptions"):
        return ("dispatcher", _held_form(py_func, depth + 1),
                _held_form(sorted(dict(value.targetoptions).items()), depth + 1))
    if isinstance(value, type):
        return ("class", value.__module__, value.__qualname__)
    if isinstance(value, types.ModuleType):
        return ("module", value.__name__)
    if isinstance(value, (tuple, list)):
        return (type(value).__name__, tuple(_held_form(v, depth + 1) for v in value))
    try:
        return ("value", canonical(value))
    except Unencodable:
        pass
    from numba.core.types import Type

    if isinstance(value, Type) and " at 0x" not in str(value):
        return ("type", type(value).__module__, type(value).__qualname__, str(value))
    raise Unencodable(value)
