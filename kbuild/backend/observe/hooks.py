"""The hooks into a numba front end, installed for the duration of one compile.

`observing(observer, front_end)` wraps numba's methods (the interpreter, module
constants, the typing templates, the lowering selectors, the data model manager, a
device function's compile and call), the stand-ins for what Python reads (`reads`), the
system calls (`oscalls`) and NVRTC's compile of CUDA C, so that each tells the
`Observer` what was consulted, and puts everything back after. A front end is named by
its module roots (`FrontEnd`): numba-cuda's is numba's and numba-cuda's
(`NUMBA_CUDA_FRONT_END`); a backend that vendors numba's front end under other module
names (numba-cuda-mlir) passes its own, and the same hooks fire there.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import json
import os
import re
import sys
import tempfile
from dataclasses import dataclass

from ...keying.observed import Kind
from .. import oscalls
from ..registrations import is_library
from .caches import kept_answers
from .written import kept_writes
from .observer import Observer, repr_free
from .reads import _bystander, _environ, _installed, _installed_code, _module_reads


@dataclass(frozen=True)
class FrontEnd:
    """Where a numba front end's hooked classes live. numba-cuda's is spread over numba's
    core and numba-cuda's own copy; numba-cuda-mlir vendors one copy of both."""

    cores: tuple  # packages with an `interpreter` module
    typings: tuple  # packages with `context`, `enumdecl` and `templates` modules
    bases: tuple  # packages whose `base` module has the lowering `OverloadSelector`
    models: tuple  # modules with a `DataModelManager` (those loaded are hooked)
    nvrtc: str  # the module whose `compile` runs NVRTC on CUDA C (`ProgramOptions` in it)
    # (module, class, method) compiling a device function for argument types, keeping it
    device_compiles: tuple = ()
    # (module, class, method) typing a call to a device function (its call template)
    device_calls: tuple = ()
    # How its decorator compiles an eager device function (the method, and whether it is
    # given the declared return type): made once more, observed, the same way.
    eager_compile: tuple = ("compile_device", True)


NUMBA_CUDA_FRONT_END = FrontEnd(
    cores=("numba.core", "numba.cuda.core"),
    typings=("numba.core.typing", "numba.cuda.typing"),
    bases=("numba.cuda.core",),
    # numba-cuda's data model manager is numba's where numba is installed (a redirect).
    models=("numba.cuda.datamodel.cuda_manager", "numba.core.datamodel.manager"),
    nvrtc="numba.cuda.cudadrv.nvrtc",
    device_compiles=(("numba.cuda.dispatcher", "CUDADispatcher", "compile_device"),),
    device_calls=(("numba.cuda.dispatcher", "CUDADispatcher", "get_call_template"),))


@contextlib.contextmanager
def observing(observer: Observer, front_end: FrontEnd = NUMBA_CUDA_FRONT_END):
    """Within the block, what the front end consults is recorded in `observer`."""
    with contextlib.ExitStack() as stack:
        for cls, name, wrap in _hooks(observer, front_end):
            stack.enter_context(_wrapped(cls, name, wrap))
        stack.enter_context(_environ(observer))
        stack.enter_context(_module_reads(observer))
        stack.enter_context(oscalls.watching(observer, _bystander, _installed_frame))
        stack.enter_context(_nvrtc_headers(observer, front_end.nvrtc))
        stack.enter_context(kept_answers(observer))
        stack.enter_context(kept_writes(observer))
        yield observer


def load_hooked(front_end: FrontEnd = NUMBA_CUDA_FRONT_END) -> None:
    """Import every module whose classes `observing` hooks, hooking nothing (a process
    about to fork compile workers: they inherit the modules)."""
    for _ in _hooks(None, front_end):
        pass


def _hooks(observer: Observer, front_end: FrontEnd):
    interpreters = [importlib.import_module(f"{core}.interpreter") for core in front_end.cores]

    def typing(name):
        return [importlib.import_module(f"{package}.{name}") for package in front_end.typings]

    def interpret(original):
        def hooked(self, bytecode):
            observer.function(self.func_id.func)
            return original(self, bytecode)
        return hooked

    def get_global_value(original):
        def hooked(self, name):
            observer.global_of(self.func_id.func, name)
            return original(self, name)
        return hooked

    def module_constants(original):
        def hooked(self, typ, attr):
            observer.module_attribute(typ.pymod, attr)
            return original(self, typ, attr)
        return hooked

    def runs(kind):
        def wrap(original):
            def hooked(self, *args, **kws):
                observer.typing_function(self, kind)
                with observer.running(self, args, kws):
                    return original(self, *args, **kws)
            return hooked
        return wrap

    def compiles_device(original):
        # A device function's code, kept per argument types: what its compile read
        # (its overloads, their reads) is read by every kernel it is linked into.
        def hooked(self, args, *rest, **kws):
            # Compiled into this target, kept or not: by content, unless its key holds it.
            observer.function(self.py_func)
            question = ("device", self, repr_free(_argument_types(args)))
            with observer.answering(question, lambda: _forget_device_compile(self, args)):
                return original(self, args, *rest, **kws)
        return hooked

    def calls_device(original):
        # An eager device function (`@cuda.jit("f4(f4)", device=True)`) was compiled at
        # its import, unobserved, and numba never compiles it again: its code is made
        # once more here, observed (the same code from the same values in this process),
        # so what its compile read is in every key it is linked into.
        # A call that names parameters (`dev(x=1)`, `get_call_template(args, kws)`) is
        # bound against the function's names here: they are observed.
        def hooked(self, *args, **kws):
            if not getattr(self, "_can_compile", True) and not _library_code(self):
                _compile_eager_again(self, *front_end.eager_compile)
            named = args[1] if len(args) > 1 else kws.get("kws")
            if named:
                observer.parameters(self.py_func)
            return original(self, *args, **kws)
        return hooked

    def asked(what):
        def wrap(original):
            def hooked(self, *args, **kws):
                observer.typing_template(self, what)
                return original(self, *args, **kws)
            return hooked
        return wrap

    def resolves(original):
        # Every attribute template of a type is asked about every attribute: only the
        # one that answers for `attr` is consulted.
        def hooked(self, typ, attr):
            if attr != getattr(self, "_attr", None):
                return original(self, typ, attr)
            observer.typing_function(self, Kind.OVERLOAD)
            with observer.running(self, typ, attr):
                return original(self, typ, attr)
        return hooked

    def relates(original):
        # Whether one type converts to or unifies with another is asked of the types
        # themselves (`can_convert_to`, `can_convert_from`, `unify`): a project's type
        # class answers with its own code, which decides what types, and what fails to.
        def hooked(self, first, second):
            for ty in (first, second):
                cls = type(ty)
                if not is_library(cls.__module__) and "<locals>" not in cls.__qualname__:
                    observer.read(cls.__module__, cls.__qualname__)
            return original(self, first, second)
        return hooked

    def enum_member(original):
        def hooked(self, ty, attr):
            cls = ty.instance_class
            if attr in cls.__members__:
                observer.module_attribute(cls, attr)
            return original(self, ty, attr)
        return hooked

    def found(original):
        def hooked(self, sig):
            impl = original(self, sig)
            observer.lowering(self, impl)
            return impl
        return hooked

    def model(original):
        def hooked(self, fetype):
            observer.model(self, fetype)
            return original(self, fetype)
        return hooked

    for interp in interpreters:
        yield interp.Interpreter, "interpret", interpret
        yield interp.Interpreter, "get_global_value", get_global_value
    for ctx in typing("context"):
        yield ctx.BaseContext, "resolve_module_constants", module_constants
        yield ctx.BaseContext, "can_convert", relates
        yield ctx.BaseContext, "unify_pairs", relates
    for enums in typing("enumdecl"):
        yield enums.EnumClassAttribute, "generic_resolve", enum_member
    for tmpl in typing("templates"):
        yield tmpl._OverloadFunctionTemplate, "generic", runs(Kind.OVERLOAD)
        yield tmpl._OverloadAttributeTemplate, "_resolve", resolves
        yield tmpl._OverloadMethodTemplate, "_resolve", resolves
        yield tmpl._IntrinsicTemplate, "generic", runs(Kind.INTRINSIC)
        for base in (tmpl.AbstractTemplate, tmpl.CallableTemplate, tmpl.ConcreteTemplate):
            yield base, "apply", asked("function")
        yield tmpl.AttributeTemplate, "resolve", asked("attributes")
    for base in front_end.bases:
        yield importlib.import_module(f"{base}.base").OverloadSelector, "find", found
    for module, cls, method in front_end.device_compiles:
        yield getattr(importlib.import_module(module), cls), method, compiles_device
    for module, cls, method in front_end.device_calls:
        yield getattr(importlib.import_module(module), cls), method, calls_device
    importlib.import_module(front_end.models[0])  # the front end's own: loaded here
    for manager in dict.fromkeys(_classes_of("DataModelManager", *front_end.models)):
        yield manager, "lookup", model


def _classes_of(name: str, *modules) -> list:
    """The class `name` of each module (or module name, if loaded) that has one."""
    found = []
    for module in modules:
        module = sys.modules.get(module) if isinstance(module, str) else module
        cls = getattr(module, name, None)
        if isinstance(cls, type):
            found.append(cls)
    return found


@contextlib.contextmanager
def _wrapped(cls, name: str, wrap):
    """`cls.name` is `wrap(original)` within the block (its own attribute restored after)."""
    own = cls.__dict__.get(name, _ABSENT)
    setattr(cls, name, wrap(getattr(cls, name)))
    try:
        yield
    finally:
        if own is _ABSENT:
            delattr(cls, name)
        else:
            setattr(cls, name, own)


_ABSENT = object()


def _installed_frame(frame) -> bool:
    return _installed(frame.f_code.co_filename)


def _library_code(dispatcher) -> bool:
    func = getattr(dispatcher, "py_func", None)
    code = getattr(func, "__code__", None)
    module = getattr(func, "__module__", None)
    return is_library(module) or \
        (code is not None and _installed_code(code.co_filename, module))


def _compile_eager_again(dispatcher, method: str, with_return_type: bool) -> None:
    """Compile each signature of an eager device function through its (hooked) `method`,
    as the front end's decorator did (with the declared return type or without), allowed
    for the call: an answer made before any observed compile is dropped and made again
    there; one made observed in this process is replayed."""
    compile_device = getattr(dispatcher, method)
    for args, made in list(dispatcher.overloads.items()):
        restype = getattr(getattr(made, "signature", None), "return_type", None)
        dispatcher._can_compile = True
        try:
            compile_device(args, restype) if with_return_type else compile_device(args)
        finally:
            dispatcher._can_compile = False


def _argument_types(args) -> tuple:
    """A device compile's argument types: given as a tuple, or in a signature."""
    return tuple(getattr(args, "args", args))


def _forget_device_compile(dispatcher, args) -> bool:
    """Drop a device function's code for `args`, so numba compiles it again (an eager one
    cannot compile again: False)."""
    if not getattr(dispatcher, "_can_compile", False):
        return False
    dispatcher.overloads.pop(_argument_types(args), None)
    return True


@contextlib.contextmanager
def _nvrtc_headers(observer: Observer, module_name: str = NUMBA_CUDA_FRONT_END.nvrtc):
    """NVRTC reads a CUDA C file's headers itself, in C, through its own include path
    (numba's and CUDA's folders, `NUMBA_CUDA_NVRTC_EXTRA_SEARCH_PATHS`, the current folder,
    `"..."` and `<...>` alike): no `open` sees them, and parsing `#include` lines again
    with other rules would miss some. NVRTC's time trace (`-fdevice-time-trace`, which
    changes nothing it compiles) lists every header it opened, resolved: each compile
    within the block writes one, and those headers are observed. So is what would have
    been opened instead: the files that would shadow each (`shadowing_candidates`, by
    stat: absent now) and the setting that orders the include folders."""
    try:
        nvrtc = importlib.import_module(module_name)
    except ImportError:  # another numba-cuda: nothing compiles CUDA C this way
        yield
        return
    original_compile, original_options = nvrtc.compile, nvrtc.ProgramOptions
    config = getattr(nvrtc, "config", None)

    def compile_traced(*args, **kwargs):
        with tempfile.TemporaryDirectory(prefix="kbuild-nvrtc-") as scratch:
            include_path: list = []

            def options(*a, **kw):
                include_path.extend(kw.get("include_path") or ())
                return original_options(*a, fdevice_time_trace=os.path.join(scratch, "trace"),
                                        **kw)

            nvrtc.ProgramOptions = options
            try:
                # NVRTC writes its trace only when it compiles: the headers a failure read
                # (the one with the error among them) are unknown.
                with observer.unsaid_within("compiled CUDA C whose headers NVRTC did not list"):
                    return original_compile(*args, **kwargs)
            finally:
                nvrtc.ProgramOptions = original_options
                headers = traced_headers(scratch)
                for header in headers:
                    observer.file(header, Kind.HEADER)
                # Where NVRTC looked before it found a header of the project's (the
                # toolchain's are pinned with it): one made there since would be the one
                # it opens now. A `"..."` include is looked for in the working directory
                # first; the folders' order (NUMBA_CUDA_NVRTC_EXTRA_SEARCH_PATHS) decides
                # which of two same-named headers is opened.
                own = [h for h in headers if observer.names_file(h)]
                tested = [c for c in tested_candidates(_source(args, kwargs), own, include_path)
                          if observer.names_file(c)]
                for candidate in shadowing_candidates(own, include_path) + tested:
                    observer.file(candidate, Kind.STAT)
                if own or tested:
                    observer.add(Kind.CWD, ".")
                    if hasattr(config, _SEARCH_PATHS):
                        observer.add(Kind.INCLUDE_PATH, f"{config.__name__}:{_SEARCH_PATHS}")

    nvrtc.compile = compile_traced
    try:
        yield
    finally:
        nvrtc.compile = original_compile


_SEARCH_PATHS = "CUDA_NVRTC_EXTRA_SEARCH_PATHS"  # numba-cuda's setting: NVRTC's -I folders

# `__has_include("x.h")` / `__has_include(<x.h>)` (and `_next`): a header looked for, not
# opened when absent, so no trace lists it.
_HAS_INCLUDE = re.compile(rb'__has_include(?:_next)?\s*\(\s*(?:"([^"\n]+)"|<([^>\n]+)>)\s*\)')


def _source(args, kwargs):
    """The CUDA C source `nvrtc.compile(src, name, ...)` was given (text or bytes)."""
    return args[0] if args else kwargs.get("src")


def _search_folders(include_path) -> list[str]:
    """The folders NVRTC searches for an include after its includer's: the working
    directory, then `include_path` in order, each found from the working directory."""
    cwd = os.getcwd()
    return [cwd] + [os.path.normpath(os.path.join(cwd, p)) for p in include_path]


def tested_candidates(source, headers, include_path) -> list[str]:
    """Where the headers that the source and `headers` (the project's, opened) test for
    with `__has_include` would be found: each folder NVRTC searches (a `"..."` name in its
    includer's folder first, then the working directory and `include_path` in order). A
    test inside a comment or a branch not taken counts too: a stat more, never a read
    missed."""
    search = _search_folders(include_path)
    texts = [(search[0], source.encode() if isinstance(source, str) else source)]
    for header in headers:
        try:
            with io.FileIO(header) as fh:  # not `open`: this read is kbuild's own
                texts.append((os.path.dirname(header), fh.read()))
        except OSError:
            continue
    out: dict = {}
    for folder, text in texts:
        for quoted, angled in _HAS_INCLUDE.findall(text if isinstance(text, bytes) else b""):
            name = os.fsdecode(quoted or angled)
            for where in ([folder] if quoted else []) + search:
                out.setdefault(os.path.normpath(os.path.join(where, name)), None)
    return list(out)


def shadowing_candidates(headers, include_path) -> list[str]:
    """The files that would shadow `headers` (resolved paths NVRTC opened) if made: for
    each folder NVRTC searches that holds a header (the working directory for a `"..."`
    include, then `include_path` in order), the same relative name in the folders
    searched before it and in the headers' own folders, where a `"..."` include in a
    header is looked up first. A header found in its includer's folder was looked for
    nowhere before. Which folder found a header under several is not said: each reading
    counts."""
    search = _search_folders(include_path)
    includers = sorted({os.path.dirname(h) for h in headers})
    out: dict = {}
    for header in headers:
        for index, folder in enumerate(search):
            if not header.startswith(folder.rstrip(os.sep) + os.sep):
                continue
            rel = os.path.relpath(header, folder)
            for other in search[:index] + includers:
                candidate = os.path.normpath(os.path.join(other, rel))
                if candidate != header:
                    out.setdefault(candidate, None)
    return list(out)


_TRACE_LIMIT = 64 << 20  # a time trace is a few KiB; never read an unbounded file


def traced_headers(folder) -> list[str]:
    """The headers NVRTC time traces in `folder` say it opened (absolute paths of files;
    NVRTC's built-in header has no file and is left out), in the order NVRTC finished them."""
    found: dict = {}
    for name in sorted(os.listdir(folder)):
        path = os.path.join(folder, name)
        try:
            if os.path.getsize(path) > _TRACE_LIMIT:
                continue
            with io.FileIO(path) as fh:  # not `open`: this read is kbuild's own
                events = json.loads(fh.read()).get("traceEvents", ())
        except (OSError, ValueError, AttributeError):
            continue
        for event in events if isinstance(events, list) else ():
            if not isinstance(event, dict) or event.get("name") != "Processing Header File":
                continue
            detail = (event.get("args") or {}).get("detail")
            if not isinstance(detail, str) or not detail:
                continue
            # A header found in the working directory (NVRTC's `-I.`, or a `"..."` include
            # resolved against it) is traced by its relative path.
            path = detail if os.path.isabs(detail) else os.path.join(os.getcwd(), detail)
            if os.path.isfile(path):
                found.setdefault(os.path.normpath(path), None)
    return list(found)
