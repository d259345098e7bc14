"""The compiler adapter: numba-cuda + NVVM + nvJitLink, for an architecture we name.

numba-cuda asks the current device for its compute capability when it types a
call to a device function and when it compiles eagerly (`@cuda.jit("sig")`);
without a driver both fail. `targeting(cc)` answers those questions with the
architecture being built, never the machine's, so ordinary user code builds on
a CPU-only CI runner. The kernel is then compiled exactly as numba's own
dispatcher would (`_Kernel` with the decorator's options) and its PTX and
linked cubin are taken from the code library.
"""

from __future__ import annotations

import contextlib
import threading
import types

from .base import Artifacts  # noqa: F401 - where the build has always imported it from

_lock = threading.RLock()
_state = {"cc": None, "depth": 0, "saved": None}


class _TargetDevice:
    """Stands in for the current device: only its compute capability is asked."""

    def __init__(self, cc):
        self.compute_capability = cc[:2]


@contextlib.contextmanager
def targeting(cc: tuple):
    """Within this block numba-cuda compiles for `cc` instead of asking a driver."""
    if simulating():
        yield  # the simulator compiles nothing
        return
    with _lock:
        previous = _state["cc"]
        if _state["depth"] == 0:
            patches = _target_patches()
            _state["saved"] = [(holder, name, getattr(holder, name))
                               for holder, name, _ in patches]
            for holder, name, replacement in patches:
                setattr(holder, name, replacement)
        _state["cc"] = tuple(cc)
        _state["depth"] += 1
        try:
            yield
        finally:
            _state["depth"] -= 1
            _state["cc"] = previous
            if _state["depth"] == 0:
                for holder, name, original in _state["saved"]:
                    setattr(holder, name, original)


def _target_patches() -> list:
    """(holder, attribute, replacement) of each part of numba-cuda that `targeting`
    replaces: where it asks the device for its capability, and what a build needs
    instead of a device."""
    from numba.cuda import codegen, compiler, dispatcher

    return [(dispatcher, "get_current_device", _target_device),
            (compiler, "get_current_device", _target_device),
            (codegen.CUDACodeLibrary, "_ensure_cc", _ensure_target_cc),
            (dispatcher._Kernel, "bind", _bind_nothing),
            (codegen.CUDACodeLibrary, "__init__", _ordered_init(codegen.CUDACodeLibrary.__init__))]


def _target_device():
    """The "current device" typing asks for: the arch being built."""
    return _TargetDevice(_state["cc"])


def _ensure_target_cc(self, want):
    """A code library's arch: the one asked for, else the arch being built."""
    return want if want is not None else _state["cc"]


def _bind_nothing(self):
    """An eager @cuda.jit("sig") binds its kernel to a context right after compiling it
    at import; there is no context to bind to while building."""


@contextlib.contextmanager
def _arch_as_asked():
    """The arch a target is compiled for is the arch its code is made for. numba's NVVM
    arch option follows NUMBA_FORCE_CUDA_CC whatever it is asked; that variable chooses
    the arch of a device's targets instead (`launcher.compile_arch`), never another
    arch's code under this one's name."""
    from numba.cuda import config

    forced, config.FORCE_CUDA_CC = config.FORCE_CUDA_CC, None
    try:
        yield
    finally:
        config.FORCE_CUDA_CC = forced


class _OrderedSet(dict):
    """A set that iterates in insertion order (a dict's keys), never in hash order."""

    def add(self, item):
        self[item] = None

    def update(self, items):
        for item in items:
            self[item] = None


def _ordered_init(original):
    """numba-cuda links a kernel's libraries and files in `set` order, which follows
    memory addresses and PYTHONHASHSEED; link them in the order they were added."""

    def __init__(self, *args, **kwargs):
        original(self, *args, **kwargs)
        self._linking_libraries = _OrderedSet.fromkeys(self._linking_libraries)
        self._linking_files = _OrderedSet.fromkeys(self._linking_files)

    return __init__


def simulating() -> bool:
    """Whether numba-cuda runs its simulator (NUMBA_ENABLE_CUDASIM=1) in this process."""
    from numba.cuda import config

    return bool(config.ENABLE_CUDASIM)


def prepare() -> None:
    """Do numba's one-time set-up of a process's first compile now (loading its typing and
    lowering registries and the modules that fill them: most of a second). A process about
    to fork compile workers calls it first, so each worker starts with it done instead of
    paying it again, and a compile's time limit measures the compile; `kbuild watch` calls
    it while it waits for a save. Again, it costs milliseconds."""
    if simulating():
        return
    try:
        from numba.cuda.descriptor import cuda_target

        cuda_target.typing_context.refresh()
        cuda_target.target_context.refresh()
    except Exception:  # noqa: BLE001 - only a head start: the first compile does it anyway
        pass


def compile_kernel(kernel, argtypes, cc: tuple, device_functions=(), stable_ids=None,
                   apart=None, observer=None, outputs=None, source_roots=()) -> Artifacts:
    """Compile `kernel` (a CUDADispatcher) for `argtypes` and `cc` into PTX and a cubin.

    `device_functions` are the lazily compiled dispatchers it reaches: numba
    caches their compiled form per argument types only, so a cache made for
    another architecture is dropped first. numba mangles a per-process function
    number into symbol names; `stable_ids` (py_func -> number, from identity)
    replaces it for keyed functions and the counter restarts for each kernel, so
    a kernel's PTX and cubin do not depend on what the process compiled before.

    With `apart` = (function trees by py_func, the target's key tree), the
    kernel and each device function become LTO-IR objects of their own, linked
    with link-time optimisation (see `lto`); a kernel that cannot be split is
    built as one program, as numba builds it, and the reason is recorded.

    An `observe.Observer` records what numba consulted meanwhile (see `observe`).

    `outputs` (the build's `cutoff.Outputs`, or None) offers what earlier builds made
    from the same bytes: stored objects' LTO-IR, links' and assemblies' outputs (early
    cutoff: see `lto.link`). What it gave is said in the artifacts' `cutoff`.
    `source_roots` (the project's import roots) are where a debug binary's source paths
    are written relative to (see `debugpaths`).
    """
    stable_ids = stable_ids or {}
    with _as_kbuild_compiles(cc, stable_ids, source_roots):
        if observer is None:
            return _compile(kernel, argtypes, cc, device_functions, apart, outputs)[0]
        from .observe import link_files, observing

        with observing(observer):
            artifacts, library = _compile(kernel, argtypes, cc, device_functions, apart,
                                          outputs)
        link_files(observer, library)
        return artifacts


@contextlib.contextmanager
def _as_kbuild_compiles(cc: tuple, stable_ids: dict, source_roots):
    """numba-cuda as a kbuild compile needs it, one named patch each: the arch asked for
    and no device (`targeting`, `_arch_as_asked`), names that do not depend on the process
    (`_numbering`, `_record_names`, `_dispatcher_names`, `_flag_names`), internal functions
    (`_internal_functions`), and debug paths relative to the source roots (`_debug_paths`)."""
    with targeting(cc), _arch_as_asked(), _numbering(stable_ids), _record_names(), \
            _dispatcher_names(stable_ids), _internal_functions(), _flag_names(), \
            _debug_paths(source_roots):
        yield


def _compile(kernel, argtypes, cc, device_functions, apart, outputs=None):
    """(Artifacts, the kernel's code library) of one compile."""
    from numba.cuda.dispatcher import _Kernel

    _forget_other_arch(device_functions, tuple(cc))
    with _ptx_deferred() if apart else contextlib.nullcontext():
        compiled = _Kernel(kernel.py_func, tuple(argtypes), **kernel.targetoptions)
    library = compiled._codelibrary
    try:
        made = _split(compiled, cc, device_functions, apart, outputs)
        if isinstance(made, tuple):
            return _linked(compiled, cc, made, kernel.targetoptions, outputs), library
    except Exception as exc:  # noqa: BLE001 - numba's own way still works
        made = f"separate compilation failed ({type(exc).__name__}: {exc})"
    reused, keys = _stored_cubin(library, tuple(cc), compiled.entry_name, outputs)
    ptx = library.get_asm_str(cc=tuple(cc))
    cubin = library.get_cubin(cc=tuple(cc))
    return Artifacts(
        ptx=ptx.encode(),
        cubin=bytes(getattr(cubin, "code", cubin)),
        entry=compiled.entry_name,
        cooperative=bool(compiled.cooperative),
        link={"mode": "whole", "reason": made or "separate compilation not asked for"},
        cutoff=reused, outputs=keys,
    ), library


def _stored_cubin(library, cc: tuple, entry: str, outputs):
    """(cutoff, cutoff keys) of a whole program's cubin: when `outputs` holds the cubin an
    earlier build made from the same bytes (the program's LTO-IR, which numba links with
    nvJitLink when it can, else its PTX), the library is given it and numba's
    `get_cubin` makes nothing. Only for a cubin made from the program alone: linked
    files and cudadevrt put other bytes into it."""
    if outputs is None or library._linking_files or library.needs_cudadevrt:
        return None, ()
    from ..keying.cutoff import step_options

    lto = bool(getattr(library, "_lto", False))
    # What get_cubin will hand to the linker; made (and cached by numba) here instead.
    inputs = [bytes(library.get_ltoir(cc=cc))] if lto else \
        [p.encode() for p in library.get_asm_strs(cc=cc)]
    options = step_options(cc, getattr(library, "_max_registers", None)) + (("lto", lto),)
    key, cubin = outputs.cubin(inputs, options, entry)
    if cubin is None:
        return None, (key,)
    library._cubin_cache[cc] = cubin
    return "cubin", (key,)


def _split(compiled, cc, device_functions, apart, outputs=None):
    if not apart:
        return None
    from .lto import split

    return split(compiled, cc, device_functions, *apart, outputs=outputs)


def _linked(compiled, cc, made, options, outputs=None) -> Artifacts:
    from .lto import link

    linked = link([o.ltoir for o in made], cc, max_registers=options.get("max_registers"),
                  outputs=outputs, entry=compiled.entry_name,
                  flags=made[0].manifest["link_flags"])
    return Artifacts(ptx=linked.ptx, cubin=linked.cubin, entry=compiled.entry_name,
                     cooperative=bool(compiled.cooperative),
                     link={"mode": "lto", "objects": [o.key for o in made]}, objects=made,
                     cutoff=linked.cutoff, outputs=linked.keys)


@contextlib.contextmanager
def _ptx_deferred():
    """numba's `_Kernel` makes the whole program's PTX only to search it for the names of
    two helper libraries (reshape functions, NRT); a separately compiled kernel never uses
    that PTX. Let the search read the LLVM IR, where the same names appear, instead.
    NRT's search needs PTX syntax, so with NRT enabled nothing is deferred."""
    from numba.cuda import codegen
    from numba.cuda.core import config

    if getattr(config, "CUDA_ENABLE_NRT", False):
        yield
        return
    original = codegen.CUDACodeLibrary.get_asm_str
    codegen.CUDACodeLibrary.get_asm_str = lambda self, cc=None: self.get_llvm_str()
    try:
        yield
    finally:
        codegen.CUDACodeLibrary.get_asm_str = original


def _forget_other_arch(device_functions, cc) -> None:
    for disp in device_functions:
        if getattr(disp, "_can_compile", False) and getattr(disp, "_kbuild_cc", cc) != cc:
            disp.overloads.clear()  # eager ones keep their only overloads
        disp._kbuild_cc = cc


@contextlib.contextmanager
def _record_names():
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
def _dispatcher_names(stable_ids: dict):
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
def _internal_functions():
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
def _debug_paths(source_roots):
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
def _flag_names():
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
def _numbering(stable_ids: dict):
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
