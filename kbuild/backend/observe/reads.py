"""Stand-ins that record what Python code reads while numba compiles a target.

Within `_module_reads`, the attribute reads of every module that is not a library's
(`mod.X`, `getattr(mod, name)`, `from m import X` in a function body) are observed, and
`globals()`, `vars(mod)`, `__import__` and `importlib.import_module` are stand-ins that
observe the names read through them; `inspect.getattr_static` (which reads past a
module's class) notes its reads, and `exec` / `eval` every name their code could look up
in a module's namespace; every module the project's code asks the import system for is
noted (`Kind.MODULE`: a finder first on `sys.meta_path` while a compile runs, and the
import stand-ins for one already loaded); within `_environ`, `os.environ` (and the mapping
class behind every alias of it) observes each variable read. Reads by kbuild, by numba
and by installed packages that do not build on numba (`_bystander`: cffi, a parser), and
a module body's at its import, are none of the project's and are left out; an installed
numba extension's code (its overloads, typing, lowering) reads as the project's does.

What reads a module's own dict past its class and every stand-in is not seen:
`object.__getattribute__(mod, name)`, dict's own methods called on a namespace handed
out (`dict.get(vars(mod), name)`), a function's `__globals__` or a frame's `f_globals`
reached while the compile runs (a function's `__globals__` that the typing function
names is refused by the keyer instead). `kbuild verify` rebuilds and compares.
"""

from __future__ import annotations

import builtins
import contextlib
import functools
import importlib
import importlib.abc
import importlib.util
import inspect
import os
import sys
import sysconfig
import threading
import types as pytypes

from ...environ import WatchedEnviron
from ...keying.observed import Kind
from .. import oscalls, registrations
from ..libraries import builds_on_numba, is_settings, namespace_module
from ..registrations import is_library


def _reader_is_kbuild(frame) -> bool:
    # kbuild's own reads (keying, these hooks) are no dependency of the compile.
    name = frame.f_globals.get("__name__", "") if frame is not None else ""
    return name == "kbuild" or name.startswith("kbuild.")


class _RecordingGlobals(dict):
    """A module's namespace, as `globals()` or `module.__dict__` hands it to code running
    during the compile: each name read from it is observed (`Kind.READ`; a scan reads
    every name). A dict (`exec(code, globals())` takes it) holding the namespace's items,
    whose writes also go to the namespace."""

    def __init__(self, namespace: dict, observer):
        super().__init__(namespace)
        self._namespace = namespace
        self._observer = observer
        self._module = namespace.get("__name__", "")

    def _read(self, name) -> None:
        if isinstance(name, str) and not _dunder(name):
            self._observer.read(self._module, name)

    def _read_all(self) -> None:
        for name in list(self._namespace):
            self._read(name)

    def __getitem__(self, name):
        self._read(name)
        return super().__getitem__(name)

    def get(self, name, default=None):
        self._read(name)
        return super().get(name, default)

    def __contains__(self, name):
        self._read(name)
        return super().__contains__(name)

    def __setitem__(self, name, value):
        self._namespace[name] = value
        super().__setitem__(name, value)

    def __delitem__(self, name):
        del self._namespace[name]
        super().__delitem__(name)

    def setdefault(self, name, default=None):
        self._read(name)
        self._namespace.setdefault(name, default)
        return super().setdefault(name, default)

    def update(self, *args, **kwargs):
        self._namespace.update(*args, **kwargs)
        super().update(*args, **kwargs)

    def pop(self, name, *default):
        self._read(name)
        self._namespace.pop(name, *default)
        return super().pop(name, *default)

    def __iter__(self):
        self._read_all()
        return super().__iter__()

    def keys(self):
        self._read_all()
        return super().keys()

    def items(self):
        self._read_all()
        return super().items()

    def values(self):
        self._read_all()
        return super().values()

    def copy(self):
        self._read_all()
        return dict(super().items())


def _dunder(name: str) -> bool:
    return name.startswith("__") and name.endswith("__")


@contextlib.contextmanager
def _module_reads(observer):
    """Every module that is not a library's (the project's, a third-party extension's), and
    numba's settings (`libraries.is_settings`: what `NUMBA_*` and `.numba_config.yaml`
    set), has its attribute reads observed for the block, however made: `mod.X`, `getattr(mod,
    computed)`, `importlib.import_module(m).X`, `from m import X` in a function body; and
    `globals()` or `vars(mod)` hand code that is not a library's a namespace that observes
    each name read from it. A module's class is swapped for a subclass that observes (and
    put back after), so nothing is traced outside those modules and this block."""
    watched: dict = {}  # id(module) -> (module, the class it had: put back after)
    ours = observer.here  # another thread's reads are left alone: no input of the compile

    def read(module, attr, value, frame):
        if not ours() or _reader_is_kbuild(frame):
            return value
        name = pytypes.ModuleType.__getattribute__(module, "__name__")
        if attr == "__dict__" and not _import_or_toolchain_read(frame):
            return _RecordingGlobals(value, observer)
        if not _dunder(attr) and not _import_or_toolchain_read(frame):
            observer.read(name, attr)
        return value

    classes: dict = {}  # a module class -> its recording subclass

    def recording(cls):
        """A subclass of the module's own class (ModuleType, a lazy loader's, a module's
        own subclass with properties) that records each attribute read after it."""
        if cls not in classes:
            def __getattribute__(self, attr):
                if cls is _LAZY_OWN_CLASS:
                    # The loader loads only a module of exactly its class: hand it back
                    # for this read, then record the loaded module's reads.
                    self.__class__ = cls
                    value = getattr(self, attr)
                    swap(self)
                    return read(self, attr, value, sys._getframe(1))
                value = cls.__getattribute__(self, attr)
                if type(self) is not classes[cls]:  # a lazy module loaded: its class went
                    swap(self)
                return read(self, attr, value, sys._getframe(1))

            classes[cls] = type(f"Recording{cls.__name__}", (cls,),
                                {"__getattribute__": __getattribute__, "__slots__": ()})
        return classes[cls]

    def swap(module):
        cls = type(module)
        try:
            module.__class__ = recording(cls)
        except TypeError:  # a class whose layout forbids it
            return
        watched[id(module)] = (module, cls)

    seen = [0]

    def watch_new():
        # Modules imported within the block (a lazy import in an overload) are watched too.
        if len(sys.modules) == seen[0]:
            return
        seen[0] = len(sys.modules)
        for name, module in sys.modules.copy().items():
            if isinstance(module, pytypes.ModuleType) and id(module) not in watched \
                    and (not is_library(name) or is_settings(name, module)) \
                    and _module_name(module) == name:
                swap(module)

    original_import, original_import_module = builtins.__import__, importlib.import_module

    def watching_import(name, globals=None, locals=None, fromlist=(), level=0):
        # numba's own function-level imports (most of a compile's) pass at the first test
        if (level or not is_library(name)) and ours():
            asked_loaded(_absolute(name, globals, level), sys._getframe(1))
        try:
            return original_import(name, globals, locals, fromlist, level)
        finally:
            watch_new()

    def watching_import_module(name, package=None):
        if ours() and isinstance(name, str):
            level = len(name) - len(name.lstrip("."))
            asked_loaded(_absolute(name[level:], {"__package__": package}, level),
                         sys._getframe(1))
        try:
            return original_import_module(name, package)
        finally:
            watch_new()

    # Which modules the project's code asks the import system for (`Kind.MODULE`): one not
    # loaded is looked for by the finders on `sys.meta_path`, however it is asked for (an
    # import, `import_module`, `find_spec`, pkgutil), and a finder first in line notes it
    # (and finds nothing: the others answer); one loaded is answered from `sys.modules`,
    # where the import stand-ins note it.
    stand_ins = (watching_import.__code__, watching_import_module.__code__)
    finding = threading.local()

    def asked(name, frame) -> None:
        if not ours() or not _project_module(name) or \
                getattr(finding, "busy", False):
            return
        finding.busy = True  # an import the walk itself sets off is no ask of the project's
        try:
            while frame is not None and (frame.f_code in stand_ins or _importlib(frame)):
                frame = frame.f_back
            if frame is not None and not _reader_is_kbuild(frame) and \
                    oscalls.asked_by_project(frame, _importing_bystander):
                observer.add(Kind.MODULE, name)
        finally:
            finding.busy = False

    def asked_loaded(name, frame) -> None:
        if isinstance(name, str) and name in sys.modules:
            asked(name, frame)

    class AskedFor(importlib.abc.MetaPathFinder):
        def find_spec(self, fullname, path=None, target=None):
            asked(fullname, sys._getframe(1))
            return None

    asked_for = AskedFor()

    watch_new()
    original_globals = builtins.globals

    # `inspect.getattr_static(mod, name)` reads the module's own dict past its class
    # (`object.__getattribute__`), through one helper of inspect's that every spelling of
    # it calls (`from inspect import getattr_static` too): the helper notes the read.
    original_check = getattr(inspect, "_check_instance", None)
    recording_types = classes.values()

    def recording_check_instance(obj, attr):
        found = original_check(obj, attr)
        if type(obj) in recording_types and isinstance(attr, str) and not _dunder(attr) \
                and ours():
            frame = sys._getframe(2)  # getattr_static's caller
            if not _reader_is_kbuild(frame) and not _import_or_toolchain_read(frame):
                observer.read(_module_name(obj), attr)
        return found

    def recording_globals():
        frame = sys._getframe(1)
        if frame is None or not ours() or _import_or_toolchain_read(frame):
            return frame.f_globals if frame is not None else original_globals()
        return _RecordingGlobals(frame.f_globals, observer)

    # `exec` and `eval` look names up in the namespaces they are given (the caller's, by
    # default) past any stand-in (`LOAD_NAME` reads a dict's own items): every name the
    # code could load from a module's namespace is a read of it.
    original_exec, original_eval = builtins.exec, builtins.eval

    def module_of(scope):
        if isinstance(scope, _RecordingGlobals):
            return scope._module
        name = namespace_module(scope)
        return name if name is not None and id(sys.modules[name]) in watched else None

    def running(original, mode):
        def stand_in(source, *args, **kwargs):
            frame = sys._getframe(1)
            by_project = ours() and \
                not _reader_is_kbuild(frame) and not _import_or_toolchain_read(frame)
            scopes = [args[i] if len(args) > i else kwargs.get(key)
                      for i, key in enumerate(("globals", "locals"))]
            if scopes[0] is None:  # the caller's namespaces, as the original takes them
                scopes[0] = frame.f_globals
                if scopes[1] is None:
                    scopes[1] = _frame_locals(frame)
                args = (scopes[0], scopes[1]) + args[2:]
                kwargs = {k: v for k, v in kwargs.items() if k not in ("globals", "locals")}
            if by_project:
                names = _names_loaded(source, mode)
                for scope in scopes:
                    module = module_of(scope) if scope is not None else None
                    for name in names if module else ():
                        if not _dunder(name) and dict.__contains__(scope, name):
                            observer.read(module, name)
            return original(source, *args, **kwargs)

        return stand_in

    recording_exec, recording_eval = running(original_exec, "exec"), running(original_eval, "eval")

    # The stand-ins are named as what they stand in for: code keyed while they are in
    # place (a typing function digested as it is about to run) reads Python's own
    # `globals`, as it does after the compile.
    for stand_in, original in ((recording_globals, original_globals),
                               (recording_exec, original_exec), (recording_eval, original_eval),
                               (watching_import, original_import),
                               (watching_import_module, original_import_module)):
        functools.update_wrapper(stand_in, original)
    builtins.globals = recording_globals
    builtins.exec, builtins.eval = recording_exec, recording_eval
    builtins.__import__, importlib.import_module = watching_import, watching_import_module
    sys.meta_path.insert(0, asked_for)
    if original_check is not None:
        inspect._check_instance = recording_check_instance
    try:
        yield
    finally:
        if asked_for in sys.meta_path:
            sys.meta_path.remove(asked_for)
        if original_check is not None:
            inspect._check_instance = original_check
        builtins.globals = original_globals
        builtins.exec, builtins.eval = original_exec, original_eval
        builtins.__import__, importlib.import_module = original_import, original_import_module
        for module, cls in watched.values():
            if type(module) is classes.get(cls):
                module.__class__ = cls


def _absolute(name, scope, level):
    """The module an import of `name` at `level` from a module with namespace `scope`
    asks for (`from . import x` in package `p`: `p`); None where it names none."""
    if not isinstance(name, str) or not isinstance(level, int) or level < 0:
        return None
    if not level:
        return name or None
    scope = scope if isinstance(scope, dict) else {}
    package, here = scope.get("__package__"), scope.get("__name__")
    if not isinstance(package, str) and isinstance(here, str):
        package = here if "__path__" in scope else here.rpartition(".")[0]
    try:
        return importlib.util.resolve_name("." * level + name, package)
    except (ImportError, ValueError, TypeError):
        return None


def _project_module(name) -> bool:
    """Whether where module `name` is found can change with the project: not the
    toolchain's, a pinned library's or the standard library's."""
    return isinstance(name, str) and not is_library(name)


def _importlib(frame) -> bool:
    """Whether `frame` runs the import system's code (`importlib` and its parts, the
    frozen core under either name): a go-between for whoever asked for a module."""
    name = frame.f_globals.get("__name__")
    return isinstance(name, str) and \
        name.partition(".")[0] in ("importlib", "_frozen_importlib", "_frozen_importlib_external")


def _names_loaded(source, mode: str) -> frozenset:
    """Every name code (a code object, or source as `exec`/`eval` compile it) and the
    code nested in it could look up by name; none for what does not compile (the call
    raises as it would)."""
    code = source
    if isinstance(source, (str, bytes, bytearray)):
        try:
            code = compile(source, "<string>", mode, dont_inherit=True)
        except (SyntaxError, ValueError, TypeError):
            return frozenset()
    names, todo = set(), [code]
    while todo:
        code = todo.pop()
        if isinstance(code, pytypes.CodeType):
            names.update(code.co_names)
            todo.extend(c for c in code.co_consts if isinstance(c, pytypes.CodeType))
    return frozenset(names)


def _frame_locals(frame):
    """The local namespace `exec`/`eval` take from a caller that names none: the frame's
    own (a module's, a class body's), or for a function's a snapshot of its variables
    (`locals()`: a dict that Python 3.13 makes anew, earlier ones keep on the frame)."""
    if sys.version_info >= (3, 13) and frame.f_code.co_flags & inspect.CO_OPTIMIZED:
        return dict(frame.f_locals)
    return frame.f_locals


def _module_name(module):
    # Read past the module's own class: a lazy module's would load it.
    try:
        return pytypes.ModuleType.__getattribute__(module, "__name__")
    except AttributeError:
        return None


def _lazy_own_class():
    """Python 3.13's lazy module loads itself only while its class is exactly its own
    (`__class__ is _LazyModule`): under a recording subclass each read would recurse, so
    the first read gives it its class back to load. Before 3.13 the loader takes a
    subclass."""
    if sys.version_info < (3, 13):
        return None
    import importlib.util

    return getattr(importlib.util, "_LazyModule", None)


_LAZY_OWN_CLASS = _lazy_own_class()


def _import_or_toolchain_read(frame) -> bool:
    """A read that is no dependency of the project's: a module body running at its import
    (a package importing its parts: what the project's code then reads of them is
    observed), numba's own code reading a module (typing a global the compiled code
    names, which the static key holds, or an installed package it supports, `cffi.FFI`),
    or a bystander's own code: what Python *runs* of the project's (and of the numba
    extensions it uses) while numba compiles is what this observes."""
    return oscalls.importing(frame) or \
        is_library(frame.f_globals.get("__name__")) or _bystander(frame)


def _bystander(frame) -> bool:
    """Whether `frame` runs an installed package's code (site-packages) that does not build
    on numba (`libraries.builds_on_numba`) and whose code numba's registries do not hold:
    cffi, which numba imports mid-compile and whose reads of `_cffi_backend` are its own,
    pinned by its installed files, or a parser the project's code calls (what the
    project's code asked it for is observed, found by walking on). An installed numba
    extension's code (a vendored kernel library, the project itself installed without -e)
    is no bystander: what its overloads read of the environment, of files and of modules
    decides what numba compiles, as the project's does."""
    return _installed_code(frame.f_code.co_filename, frame.f_globals.get("__name__"))


def _importing_bystander(frame) -> bool:
    """`_bystander` without asking numba's registries: asked in the middle of an import,
    when the registries' index is out of date at every call (sys.modules grew), rebuilding
    it cost 1.1 s of a 7 s build of the examples. An installed package that imports numba only inside
    the function registering its overloads asks for modules as a bystander does."""
    return _installed_code(frame.f_code.co_filename, frame.f_globals.get("__name__"),
                           registries=False)


def _installed_code(filename, module_name, registries: bool = True) -> bool:
    return _installed(filename) and not builds_on_numba(module_name) and \
        not (registries and _registers(module_name))


def _registers(module_name) -> bool:
    """Whether numba's registries hold code of `module_name`'s package: one that imports
    numba only inside the function that registers its overloads is an extension too."""
    if not isinstance(module_name, str):
        return False
    try:
        return module_name.partition(".")[0] in registrations.index().packages()
    except Exception:  # noqa: BLE001 - asked mid-import by any code: never break its read
        return False


def _installed(filename: str) -> bool:
    """Whether code runs from an installed package (site-packages)."""
    return isinstance(filename, str) and filename.startswith(_site_packages())


@functools.cache
def _site_packages() -> tuple:
    import site

    found = {sysconfig.get_paths()[k] for k in ("purelib", "platlib")}
    found.update(getattr(site, "getsitepackages", lambda: [])())
    return tuple(sorted({os.path.join(p, "") for p in found if p} |
                        {os.path.join(os.path.realpath(p), "") for p in found if p}))


class _RecordingEnviron(WatchedEnviron):
    """`os.environ` that records each variable read by name, and a scan or copy of the
    whole environment by the project's code as a read of all of it (numba's config reload
    and subprocess scan it too: theirs are no dependencies)."""

    def __init__(self, environ, observer):
        super().__init__(environ)
        self._observer = observer

    def read(self, name) -> None:
        if self._observer.read_by_project():
            self._observer.add(Kind.ENV, str(name))

    def scanned(self) -> None:
        # The project's code took every variable (a scan, a copy): all of them are read.
        if self._observer.read_by_project():
            self._observer.add(Kind.ENVIRON, "*")


@contextlib.contextmanager
def _environ(observer):
    original = os.environ
    os.environ = _RecordingEnviron(original, observer)
    try:
        with _environ_aliases(observer, getattr(os, "_Environ", type(original))):
            yield
    finally:
        os.environ = original


# Reads of the environment that one stand-in for `os.environ` cannot see: a name bound to
# the real mapping before the compile (`from os import environ`, `ENV = os.environ`; under
# direct mode's recorder, its stand-in) and `os.environb` (bytes names) read it directly.
# The mapping class (`os._Environ`) itself records them, by name; an iteration or copy
# records a read of every variable, and an iteration's own look-ups are left out.
_SCANNING = threading.local()
_ABC = frozenset({"_collections_abc", "collections.abc"})  # its module's name, either way


@contextlib.contextmanager
def _environ_aliases(observer, cls):
    getitem, iterate, copy = cls.__getitem__, cls.__iter__, cls.copy

    def by_project(frame) -> bool:
        if getattr(_SCANNING, "depth", 0) > 0 or \
                (frame.f_globals.get("__name__") in _ABC and frame.f_code.co_name == "__iter__"):
            return False  # a copy's or an iteration's own look-ups: the scan is recorded
        return observer.read_by_project(frame)

    def read(self, key):
        if by_project(sys._getframe(1)):
            observer.add(Kind.ENV, os.fsdecode(key) if isinstance(key, bytes) else str(key))
        return getitem(self, key)

    def scan(self):
        if by_project(sys._getframe(1)):
            observer.add(Kind.ENVIRON, "*")
        return iterate(self)

    def copied(self):
        if by_project(sys._getframe(1)):
            observer.add(Kind.ENVIRON, "*")
        _SCANNING.depth = getattr(_SCANNING, "depth", 0) + 1
        try:
            return copy(self)
        finally:
            _SCANNING.depth -= 1

    cls.__getitem__, cls.__iter__, cls.copy = read, scan, copied
    try:
        yield
    finally:
        cls.__getitem__, cls.__iter__, cls.copy = getitem, iterate, copy
