"""Observe what numba consults while it types and lowers a target, and digest it by name.

`observing(observer, front_end)` hooks a numba front end for the duration of one
compile (in the process that compiles, a forked worker usually). A front end is named
by its module roots (`FrontEnd`): numba-cuda's is numba's and numba-cuda's
(`NUMBA_CUDA_FRONT_END`); a backend that vendors numba's front end under other module
names (numba-cuda-mlir) passes its own, and the same hooks fire there:

- `Interpreter.interpret` / `get_global_value`: every Python function numba turns
  into IR and every global (or builtin) it freezes from it;
- `BaseContext.resolve_module_constants`: every module attribute it types (`mod.X`);
- the `@overload`/`@overload_method`/`@overload_attribute` and `@intrinsic`
  templates: the Python function each runs at typing time;
- `os.environ` and `open`: environment variables and files read meanwhile;
- after the compile, the code library's link files and the headers they
  `#include "..."`, transitively.

Observations are names; `Current` gives a name's digest in this process, the
same way when the compile records it and when a later build checks it, so a
name either still means the same content or the target is stale. Functions
are digested by their static key tree (`Keyer`, with every non-library
package keyed by content), which holds the values they read.
"""

from __future__ import annotations

import ast
import builtins
import contextlib
import importlib
import importlib.util
import io
import os
import sys
import sysconfig
import tempfile
import types as pytypes
from collections.abc import MutableMapping
from dataclasses import dataclass
from pathlib import Path

from ..errors import KeyingError
from ..keying.keyer import Keyer, qualified_name
from ..keying.references import function_def
from ..keying.tree import LabelKind, leaf
from ..keying.encode import Unencodable, digest, digest_of
from ..keying.observed import MISSING, UNKEYABLE, Kind, Observation, quoted_includes, \
    value_digest
from ..keying.values import canonical
from .backends import ALL_OBJECTS, loaded

# Packages whose versions are in the toolchain key: what they read is theirs, not the project's.
_LIBRARIES = frozenset({"numba", "numba_cuda", "llvmlite", "numpy", "cuda", "kbuild",
                        "numba_cuda_mlir"})


@dataclass(frozen=True)
class FrontEnd:
    """Where a numba front end's hooked classes live: for each copy of numba's core, the
    package holding `interpreter` and the one holding `typing.context`, `typing.enumdecl`
    and `typing.templates` (numba and numba-cuda each have one of each)."""

    cores: tuple  # packages with an `interpreter` module
    typings: tuple  # packages with `context`, `enumdecl` and `templates` modules


NUMBA_CUDA_FRONT_END = FrontEnd(cores=("numba.core", "numba.cuda.core"),
                                typings=("numba.core.typing", "numba.cuda.typing"))


def is_library(module_name) -> bool:
    """Whether a module's code and data are pinned by the toolchain (or the language)."""
    if not isinstance(module_name, str) or not module_name:
        return True
    top = module_name.partition(".")[0]
    return top in _LIBRARIES or top in sys.stdlib_module_names or top == "builtins"


class Observer:
    """The names one compile consulted, as (Kind, name) pairs in the order first seen."""

    def __init__(self, static_functions=(), root: Path | None = None):
        # Functions the static key already holds by content: their bodies need no observation.
        self._static = set(static_functions)  # functions hash by identity
        self.root = root
        self.names: dict = {}
        # Globals read only by statically keyed functions: the static key holds them
        # (records, project classes, ...) however their value is keyed here.
        self.static_only: set = set()
        self._dynamic: set = set()

    def _is_static(self, func) -> bool:
        try:
            return func in self._static
        except TypeError:  # an unhashable callable is no function the static key holds
            return False

    def add(self, kind: Kind, name: str) -> None:
        self.names.setdefault((kind, name), None)

    def function(self, func, kind: Kind = Kind.FUNCTION) -> None:
        module = getattr(func, "__module__", None)
        if is_library(module) or (kind is Kind.FUNCTION and self._is_static(func)):
            return
        # Typing-time functions are found again through numba's registries, closures and
        # all; a function numba interprets by its name.
        qualname = func.__qualname__ if kind is not Kind.FUNCTION else _outermost(func.__qualname__)
        self.add(kind, f"{module}:{qualname}")

    def global_of(self, func, name: str) -> None:
        """A global `name` that numba froze while interpreting `func`."""
        scope = func.__globals__
        module = scope.get("__name__")
        if is_library(module):
            return
        if name in scope:
            if getattr(sys.modules.get(module), "__dict__", None) is scope:
                key = (Kind.GLOBAL, f"{module}:{name}")
                self.add(*key)
                if self._is_static(func) and key not in self._dynamic:
                    self.static_only.add(key)
                else:
                    self._dynamic.add(key)
                    self.static_only.discard(key)
        elif hasattr(builtins, name) and not _plain_builtin(getattr(builtins, name)):
            self.add(Kind.BUILTIN, name)

    def module_attribute(self, module, attr: str) -> None:
        """`module.attr` typed as a constant; numba also treats some classes (its stubs,
        `cuda.atomic`) as modules."""
        if isinstance(module, pytypes.ModuleType):
            name = module.__name__
        else:
            name = f"{getattr(module, '__module__', '')}:{getattr(module, '__qualname__', '')}"
            name, _, inner = name.partition(":")
            attr = f"{inner}.{attr}"
        if not is_library(name):
            self.add(Kind.GLOBAL, f"{name}:{attr}")

    def read_by_project(self) -> bool:
        """Whether the code reading an env var or a file (the nearest caller outside the
        os module, collections.abc and this module) is not a library's: numba's and the
        standard library's own reads are pinned by the toolchain."""
        frame = sys._getframe(1)
        while frame is not None and frame.f_globals.get("__name__") in _PLUMBING:
            frame = frame.f_back
        return frame is not None and not is_library(frame.f_globals.get("__name__"))

    def file(self, path, kind: Kind = Kind.FILE) -> None:
        name = _file_name(path, self.root)
        if name is not None:
            self.add(kind, name)


def _outermost(qualname: str) -> str:
    # A function made inside another (an overload's `impl`, a factory's product) is what
    # its enclosing function's code and the values it read make it: observe that one.
    return qualname.split(".<locals>.")[0]


def _plain_builtin(value) -> bool:
    return getattr(value, "__module__", None) == "builtins" and isinstance(
        value, (type, pytypes.BuiltinFunctionType))


def _toolchain_dirs() -> tuple:
    paths = {sys.prefix, sys.base_prefix, sys.exec_prefix, tempfile.gettempdir()}
    paths.update(p for p in sysconfig.get_paths().values() if p)
    return tuple(os.path.realpath(p) + os.sep for p in paths)


def _file_name(path, root) -> str | None:
    """How a file read during the compile is named: relative to the project root when
    under it, else absolute; None for the toolchain's own files and temporaries."""
    if not isinstance(path, (str, os.PathLike)):
        return None
    real = os.path.realpath(os.fspath(path))
    if root is not None:
        top = os.path.realpath(root)
        if real.startswith(top + os.sep):
            return Path(os.path.relpath(real, top)).as_posix()
    if real.startswith(_toolchain_dirs()) or real.startswith(("/proc/", "/dev/", "/sys/")):
        return None
    return real


_PLUMBING = frozenset({"os", "_collections_abc", __name__})


# -- hooks ------------------------------------------------------------------------

@contextlib.contextmanager
def observing(observer: Observer, front_end: FrontEnd = NUMBA_CUDA_FRONT_END):
    """Within the block, what the front end consults is recorded in `observer`."""
    with contextlib.ExitStack() as stack:
        for cls, name, wrap in _hooks(observer, front_end):
            stack.enter_context(_wrapped(cls, name, wrap))
        stack.enter_context(_environ(observer))
        stack.enter_context(_open(observer))
        yield observer


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

    def runs(attr, kind):
        def wrap(original):
            def hooked(self, *args, **kws):
                func = getattr(self, attr, None)
                if isinstance(func, pytypes.FunctionType):
                    observer.function(func, kind)
                return original(self, *args, **kws)
            return hooked
        return wrap

    for interp in interpreters:
        yield interp.Interpreter, "interpret", interpret
        yield interp.Interpreter, "get_global_value", get_global_value
    for ctx in typing("context"):
        yield ctx.BaseContext, "resolve_module_constants", module_constants
    def resolves(original):
        # Every attribute template of a type is asked about every attribute: only the
        # one that answers for `attr` is consulted.
        def hooked(self, typ, attr):
            if attr == getattr(self, "_attr", None):
                observer.function(self._overload_func, Kind.OVERLOAD)
            return original(self, typ, attr)
        return hooked

    def enum_member(original):
        def hooked(self, ty, attr):
            cls = ty.instance_class
            if attr in cls.__members__:
                observer.module_attribute(cls, attr)
            return original(self, ty, attr)
        return hooked

    for enums in typing("enumdecl"):
        yield enums.EnumClassAttribute, "generic_resolve", enum_member
    for tmpl in typing("templates"):
        yield tmpl._OverloadFunctionTemplate, "generic", runs("_overload_func", Kind.OVERLOAD)
        yield tmpl._OverloadAttributeTemplate, "_resolve", resolves
        yield tmpl._OverloadMethodTemplate, "_resolve", resolves
        yield tmpl._IntrinsicTemplate, "generic", runs("_definition_func", Kind.INTRINSIC)


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


class _RecordingEnviron(MutableMapping):
    """`os.environ` that records each variable read by name (iteration reads no one name)."""

    def __init__(self, environ, observer):
        self._environ, self._observer = environ, observer

    def _read(self, name) -> None:
        if self._observer.read_by_project():
            self._observer.add(Kind.ENV, str(name))

    def __getitem__(self, name):
        self._read(name)
        return self._environ[name]

    def __contains__(self, name):
        self._read(name)
        return name in self._environ

    def get(self, name, default=None):
        self._read(name)
        return self._environ.get(name, default)

    def __setitem__(self, name, value):
        self._environ[name] = value

    def __delitem__(self, name):
        del self._environ[name]

    def __iter__(self):
        return iter(self._environ)

    def __len__(self):
        return len(self._environ)

    def copy(self):
        return self._environ.copy()

    # Copying or scanning the environment (numba's config reload, subprocess) reads no
    # one variable by name: only named reads are dependencies.
    def keys(self):
        return self._environ.keys()

    def items(self):
        return self._environ.items()

    def values(self):
        return self._environ.values()


@contextlib.contextmanager
def _environ(observer):
    original = os.environ
    os.environ = _RecordingEnviron(original, observer)
    try:
        yield
    finally:
        os.environ = original


@contextlib.contextmanager
def _open(observer):
    original = builtins.open

    def recording_open(file, mode="r", *args, **kwargs):
        if not any(c in mode for c in "wax+") and observer.read_by_project():
            observer.file(file)
        return original(file, mode, *args, **kwargs)

    builtins.open = io.open = recording_open
    try:
        yield
    finally:
        builtins.open = io.open = original


def linked_paths(observer: Observer, paths) -> None:
    """Record linked files (paths; other items are keyed by content) and their headers."""
    for path in paths:
        if isinstance(path, (str, os.PathLike)):
            observer.file(path, Kind.LINK)
            _headers(observer, Path(path), set())


def link_files(observer: Observer, library) -> None:
    """Record the files linked into `library` (and its libraries) and their headers."""
    seen, todo = set(), [library]
    while todo:
        lib = todo.pop()
        if lib in seen:  # code libraries hash by identity (numba keeps them in sets too)
            continue
        seen.add(lib)
        todo += list(getattr(lib, "_linking_libraries", ()))
        for path in getattr(lib, "_linking_files", ()):
            if isinstance(path, (str, os.PathLike)):
                observer.file(path, Kind.LINK)
                _headers(observer, Path(path), set())


def _headers(observer: Observer, path: Path, seen: set) -> None:
    try:
        source = path.read_bytes()
    except OSError:
        return
    for include in quoted_includes(source):
        header = (path.parent / include).resolve()
        if header.is_file() and header not in seen:
            seen.add(header)
            observer.file(header, Kind.HEADER)
            _headers(observer, header, seen)


# -- digests by name --------------------------------------------------------------

class Current:
    """The digest of an observed name in this process now (memoized for one build)."""

    def __init__(self, sources, root: Path):
        self._keyer = _ObservationKeyer(_EveryPackage(sources), ALL_OBJECTS)
        self._root = Path(root)
        self._memo: dict = {}
        self._registry = None  # (module, qualname) -> [(function, options)], on first use

    def __call__(self, kind: Kind, name: str) -> str:
        if (kind, name) not in self._memo:
            self._memo[(kind, name)] = self._digest(kind, name)
        return self._memo[(kind, name)]

    def observations(self, observer: Observer) -> list[Observation]:
        """The digests of what `observer` saw; a global only statically keyed functions
        read and that has no content form here is left to the static key."""
        out = []
        for kind, name in observer.names:
            found = self(kind, name)
            if found.startswith(UNKEYABLE) and (kind, name) in observer.static_only:
                continue
            out.append(Observation(kind, name, found))
        return out

    def _digest(self, kind: Kind, name: str) -> str:
        if kind is Kind.ENV:
            value = os.environ.get(name)
            return MISSING if value is None else digest_of(("env", value))
        if kind in (Kind.FILE, Kind.LINK, Kind.HEADER):
            try:
                return digest((self._root / name).read_bytes())
            except OSError:
                return MISSING
        if kind is Kind.BUILTIN:
            value = getattr(builtins, name, _ABSENT)
            return MISSING if value is _ABSENT else value_digest(value, ALL_OBJECTS)
        if kind in (Kind.OVERLOAD, Kind.INTRINSIC):
            return self._typing_function_digest(kind, name)
        module_name, _, path = name.partition(":")
        found = _resolve(module_name, path)
        if found is _ABSENT:
            return MISSING
        if kind is Kind.GLOBAL:
            return value_digest(found, ALL_OBJECTS)
        return self._function_digest(kind, name, found)

    def _function_digest(self, kind: Kind, name: str, obj) -> str:
        try:
            tree = self._keyer.function_node(obj, LabelKind.OBSERVED.label(name), name).digest
            imports = _local_imports(self._keyer.sources, as_function_of(obj))
        except (KeyingError, AttributeError, TypeError) as exc:
            return f"{UNKEYABLE}: {exc}"
        return digest_of(("function", tree, imports))

    def _typing_function_digest(self, kind: Kind, name: str) -> str:
        """An @overload* or @intrinsic function: every registered one of that name, with
        the jit options and inline setting it was registered with (the decorator is not
        its body), closure values included (a factory's product reads what it was given)."""
        module_name, _, qualname = name.partition(":")
        if self._registry is None:
            self._registry = _registered()
        found = self._registry.get((module_name, qualname))
        if not found:
            obj = _resolve(module_name, qualname)
            if obj is _ABSENT:
                return MISSING
            found = [(obj, ())]
        digests = []
        for func, options in found:
            digests.append(digest_of((self._function_digest(kind, name, func), options)))
        bad = [d for d in digests if d.startswith(UNKEYABLE)]
        return bad[0] if bad else digest_of((kind.value, tuple(sorted(digests))))


def as_function_of(obj):
    """The Python function behind a function, dispatcher or intrinsic."""
    fn = ALL_OBJECTS.function_of(obj)
    return fn.py_func if fn is not None else obj


def _local_imports(sources, func) -> tuple:
    """(module, source digest) of each module `func` imports in its body: a lazily imported
    module's values are read at typing time where no global names them."""
    if not isinstance(func, pytypes.FunctionType):
        return ()
    remembered = getattr(sources, "remembered", None)
    compute = lambda: _imported_names(sources, func)  # noqa: E731
    names = compute() if remembered is None else remembered(func, "local-imports", compute)
    out = []
    for module_name in names:
        module = _module(module_name)
        path = getattr(module, "__file__", None)
        if path and not is_library(module_name):
            out.append((module_name, sources.file_digest(path)))
    return tuple(out)


def _imported_names(sources, func) -> list:
    """The modules `func`'s body imports (remembered by its source's digest: a no-op build
    parses nothing)."""
    found = function_def(sources, func)
    if found is None:
        return []
    names = set()
    for node in ast.walk(found[0]):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = importlib.util.resolve_name("." * node.level + (node.module or ""),
                                               func.__module__.rpartition(".")[0]) \
                if node.level else node.module
            subs = {f"{base}.{a.name}" for a in node.names}
            found_subs = {m for m in subs if _module(m) is not None}
            names.update(found_subs)
            if found_subs != subs:  # `from mod import value`: the module holds it
                names.add(base)
    return sorted(names)


def _module(module_name: str):
    module = sys.modules.get(module_name)
    if module is None:
        try:
            module = importlib.import_module(module_name)
        except Exception:  # noqa: BLE001 - a module that no longer imports names nothing
            return None
    return module


def _resolve(module_name: str, path: str):
    """The object `module:attr.path` names now (importing the module if needed), or _ABSENT."""
    module = _module(module_name)
    if module is None:
        return _ABSENT
    value = module
    for part in path.split("."):
        value = getattr(value, part, _ABSENT)
        if value is _ABSENT:
            return _ABSENT
    return value


class _ObservationKeyer(Keyer):
    """The Keyer, with a project class that a typing-time function reads keyed by the values
    of its attributes (inherited ones and ones computed from other modules included), where
    the static key holds its module's source."""

    def _project_class(self, label, cls, where):
        items, coarse = [], False
        for name in sorted(n for n in dir(cls) if not (n.startswith("__") and n.endswith("__"))):
            form = self._attribute_form(getattr(cls, name, None), where)
            coarse = coarse or form is None
            items.append((name, form or ("unkeyed",)))
        bases = tuple(f"{b.__module__}:{b.__qualname__}" for b in cls.__mro__)
        value = ("observed-class", cls.__module__, cls.__qualname__, bases, tuple(items))
        if coarse:  # an attribute with no content form: the sources of the classes decide
            value += tuple(super()._project_class(label, b, where).digest
                           for b in cls.__mro__ if self._is_project_object(b))
        return leaf(label, value, f"class {cls.__qualname__} (by its attributes)")

    def _attribute_form(self, value, where):
        value = getattr(value, "__func__", value)  # classmethods, bound methods
        try:
            return ("value", canonical(value))
        except Unencodable:
            pass
        fn = self.objects.function_of(value)
        if fn is not None:
            label = LabelKind.CALLEE.label(qualified_name(fn.py_func))
            return ("function", self.function_node(value, label, where).digest)
        if isinstance(value, type):
            return ("class", value.__module__, value.__qualname__)
        return None


class _EveryPackage:
    """The project's sources, with every package that is not a library keyed by content:
    an overload or jitable in another installed package is keyed by what it says."""

    def __init__(self, sources):
        self._sources = sources

    def __getattr__(self, name):
        return getattr(self._sources, name)

    def is_project_module(self, module_name: str) -> bool:
        return self._sources.is_project_module(module_name) or not is_library(module_name)


def _registered() -> dict:
    """(module, qualname) -> [(function, options)] for every @overload* / @intrinsic
    template in the typing registries of every backend this process loaded (numba's
    generic and CUDA ones; numba-cuda-mlir's)."""
    found: dict = {}
    registries = [r for backend in loaded() for r in backend.typing_registries()]
    for registry in [r for r in registries if r is not None]:
        templates = [t for _, fnty in registry.globals for t in getattr(fnty, "templates", ())]
        templates += list(registry.attributes)
        for template in templates:
            func = getattr(template, "_overload_func", None) or \
                getattr(template, "_definition_func", None)
            name = (getattr(func, "__module__", None), getattr(func, "__qualname__", None))
            if not isinstance(func, pytypes.FunctionType) or is_library(name[0]):
                continue
            inline = getattr(template, "_inline", None)
            options = (_option_form(getattr(template, "_jit_options", None)),
                       _option_form(getattr(inline, "_inline", inline)))
            by_func = found.setdefault(name, {})
            by_func.setdefault(func, set()).add(options)  # functions hash by identity
    return {name: [(func, tuple(sorted(opts, key=digest_of))) for func, opts in funcs.items()]
            for name, funcs in found.items()}


def _option_form(value):
    """A jit option's content: dicts by sorted items, sets sorted (numba's documented forms)."""
    if isinstance(value, dict):
        return ("dict", tuple(sorted((str(k), _option_form(v)) for k, v in value.items())))
    if isinstance(value, (set, frozenset)):
        return ("set", tuple(sorted((_option_form(v) for v in value), key=digest_of)))
    try:
        return canonical(value)
    except Unencodable:
        return (UNKEYABLE, type(value).__qualname__)
