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
- `os.environ`, and what the system is asked (`oscalls`: files opened by any route,
  paths stat'ed, folders listed, subprocesses run) meanwhile;
- NVRTC's compiles of CUDA C (`link=` and `declare_device` files, `cuda.CUSource`):
  every header it opened, through whatever include path and form (`"..."`, `<...>`,
  transitively), as NVRTC's own time trace lists them (`_nvrtc_headers`);
- after the compile, the code library's link files.

Observations are names; `Current` gives a name's digest in this process, the
same way when the compile records it and when a later build checks it, so a
name either still means the same content or the target is stale. Functions
are digested by their static key tree (`Keyer`, with every non-library
package keyed by content), which holds the values they read.
"""

from __future__ import annotations

import builtins
import contextlib
import functools
import importlib
import io
import json
import os
import sys
import sysconfig
import tempfile
import threading
import types as pytypes
from dataclasses import dataclass
from pathlib import Path

from ..environ import WatchedEnviron
from ..errors import CHANGED_AFTER_IMPORT, KeyingError
from ..keying.bytecode import code_fingerprint, returned_functions
from ..keying.keyer import Keyer, qualified_name
from ..keying.tree import LabelKind, leaf
from ..keying.encode import Unencodable, digest, digest_of
from ..keying.observed import MISSING, UNKEYABLE, Kind, Observation, value_digest
from ..keying.values import cache_unwrapped, canonical
from . import oscalls, registrations
from .backends import ALL_OBJECTS
from .registrations import Held, held, is_library, is_overload_template, is_project, \
    key_name, qualified, typing_functions


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


class Observer:
    """The names one compile consulted, as (Kind, name) pairs in the order first seen."""

    def __init__(self, static_functions=(), root: Path | None = None, digest_now=None):
        # Functions the static key already holds by content: their bodies need no observation.
        self._static = set(static_functions)  # functions hash by identity
        self.root = root
        self.names: dict = {}
        # Globals read only by statically keyed functions: the static key holds them
        # (records, project classes, ...) however their value is keyed here.
        self.static_only: set = set()
        self._dynamic: set = set()
        # What a registry entry holds of the project's, decided once per entry in this
        # process (entries hash by identity: in this process only, never in a key).
        self._templates: dict = {}
        self._lowered: dict = {}
        self._models: dict = {}
        # id(OverloadSelector) -> ("function KEY" / ... / "", its key, the selector: kept, so
        # no id is reused while it names another): a look-up memo, never part of a key.
        self._selectors: dict = {}
        self._collecting: list = []  # what each answer being made now (`answering`) reads
        # Names a kept answer read when it was made, with the digests they had then.
        self.pinned: dict = {}
        self._answered: dict = {}  # questions answered (run) in this compile, in order
        # `Current` (memoized): a typing function is digested as it is about to run, not
        # as the compile leaves it (it may fill a memo dict of its module's as it runs).
        self._digest_now = digest_now

    def _is_static(self, func) -> bool:
        try:
            return func in self._static
        except TypeError:  # an unhashable callable is no function the static key holds
            return False

    def add(self, kind: Kind, name: str) -> None:
        key = (kind, name)
        self.names.setdefault(key, None)
        for collected in self._collecting:
            collected.setdefault(key, None)

    def read(self, module_name: str, attr: str) -> None:
        """Python code running during the compile read `module_name.attr` (a module
        attribute, or a module global through `globals()`): by its value."""
        self.add(Kind.READ, f"{module_name}:{attr}")

    def running(self, template, *asked):
        """A typing template runs Python (an overload, an intrinsic) for `asked` (its
        argument types, or the type and attribute); see `answering`."""
        return self.answering(_question(type(template), asked),
                              lambda: _forget_answer(template, asked))

    @contextlib.contextmanager
    def answering(self, question, forget):
        """numba answers `question` (a typing template's, for some argument types; a device
        function's compile for some) within the block, running Python, or from what it
        kept when it first ran it in this process. Whatever was observed while it ran is
        read by every compile the answer serves, with the digests it had *then*
        (`pinned`): a value changed since is not what numba's kept answer was made from.
        An answer made while nothing observed it (an eager kernel typed at its import)
        is dropped (`forget()`), so numba runs it again, observed."""
        earlier = _ANSWERS.get(question)
        if question not in self._answered:
            if earlier is None or None in earlier.values():
                if forget():
                    earlier = _ANSWERS[question] = {}
                    self._answered[question] = None
            else:
                for key, (found, static) in earlier.items():
                    self.names.setdefault(key, None)
                    self.pinned.setdefault(key, found)
                    if static and key not in self._dynamic:
                        self.static_only.add(key)
                    for outer in self._collecting:
                        outer.setdefault(key, None)
        collected: dict = {}
        self._collecting.append(collected)
        try:
            yield
        finally:
            self._collecting.remove(collected)
            if collected:  # it ran now: what it read is read now, digested with this compile
                entry = _ANSWERS.setdefault(question, {})
                entry.update(dict.fromkeys(collected))
                self._answered[question] = None
                for key in collected:
                    self.pinned.pop(key, None)
            for outer in self._collecting:
                outer.update(collected)

    def answered(self, digests: dict) -> None:
        """This compile's digests (`Current.observations`): the answers it made keep them."""
        for question in self._answered:
            entry = _ANSWERS.get(question)
            for key in list(entry or ()):
                if entry[key] is None and key in digests:
                    entry[key] = (digests[key], key in self.static_only)

    def function(self, func, kind: Kind = Kind.FUNCTION) -> None:
        module = getattr(func, "__module__", None)
        if is_library(module) or (kind is Kind.FUNCTION and self._is_static(func)):
            return
        # Typing-time functions are found again through numba's registries, closures and
        # all; a function numba interprets by its name.
        qualname = func.__qualname__ if kind is not Kind.FUNCTION else _interpreted_name(func)
        self.add(kind, f"{module}:{qualname}")

    def typing_function(self, template, kind: Kind) -> None:
        """An `@overload*` / `@intrinsic` template ran: the project functions it runs
        (a `register_jitable` function through numba's wrapper, too), by name; their
        registration's options are digested with them (`Current`)."""
        for func in typing_functions(type(template)):
            name = qualified(func)
            first = (kind, name) not in self.names
            self.add(kind, name)
            if first and self._digest_now is not None:
                self._first_sight(kind, name, func)

    def _first_sight(self, kind: Kind, name: str, func) -> None:
        """Digest a typing function, and the implementations it makes and returns (each
        observed as `mod:ol_f.<locals>.impl` when numba compiles it), before it runs."""
        code = getattr(func, "__code__", None)
        made = returned_functions(code) if code is not None else ()
        names = [(kind, name)] + [(Kind.FUNCTION, f"{name}.<locals>.{inner.co_name}")
                                  for inner in made]
        for key in names:
            try:
                self._digest_now(*key)
            except Exception:  # noqa: BLE001 - digested again after the compile, and said
                pass

    def typing_template(self, template, what: str) -> None:
        """Numba asked a typing template (`what`: "function" or "attributes") for an
        answer: when it holds anything of the project's, every template registered for
        the same key is observed (`typing function mod:Span`)."""
        cls = type(template)
        name = self._templates.get(cls)
        if name is None:
            key = key_name(getattr(cls, "key", None))
            project = not is_overload_template(cls) and key is not None and \
                is_project(registrations.template(cls))
            name = self._templates[cls] = f"{what} {key}" if project else ""
        if name:
            self.add(Kind.TYPING, name)

    def lowering(self, selector, impl) -> None:
        """Numba's target context found `impl` in `selector` (one key's table of lowering
        implementations): when it holds anything of the project's, every implementation
        registered for that key is observed (`lowering getattr 'lo'`)."""
        try:
            project = self._lowered.get(impl)
        except TypeError:  # an unhashable implementation holds nothing of a module's
            return
        if project is None:
            sigs = tuple(sig for sig, found in getattr(selector, "versions", ()) if found is impl)
            project = self._lowered[impl] = not registrations.made_by_templates(impl) and \
                is_project(held((impl, sigs)))
        if project:
            name = _selector_name(self._selectors, selector, impl)
            if name:
                self.add(Kind.LOWERING, name)

    def model(self, manager, fetype) -> None:
        """Numba looked up the data model of `fetype`: a project's type or model is
        observed by the type's class (`lowering model mod:SpanType`)."""
        cls = type(fetype)
        name = self._models.get(cls)
        if name is None:
            handlers = getattr(manager, "_handlers", {})
            found = held((cls, handlers.get(cls)))
            key = key_name(cls)
            name = self._models[cls] = f"model {key}" if key and is_project(found) else ""
        if name:
            self.add(Kind.LOWERING, name)

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

    def read_by_project(self, frame=None) -> bool:
        """Whether the code reading an env var (the nearest caller of `frame`, by default
        the caller's, outside the os module, collections.abc, kbuild's stand-ins and this
        module) is the project's, directly or through a library
        (`oscalls.asked_by_project`): numba's and the standard library's own reads are
        pinned by the toolchain."""
        frame = frame or sys._getframe(1)
        while frame is not None and frame.f_globals.get("__name__") in _PLUMBING:
            frame = frame.f_back
        return oscalls.asked_by_project(frame, _installed)

    def file(self, path, kind: Kind = Kind.FILE) -> None:
        name = _file_name(path, self.root)
        if name is not None:
            self.add(kind, name)


def _selector_name(names: dict, selector, impl) -> str:
    """What a lowering table is for, as an observed name: `function KEY` (`_defns`),
    `getattr 'ATTR'`, `setattr 'ATTR'` (`*`: generic), `cast`, `constant`; "" for a key
    with no name the same in every process, and for an `@intrinsic`'s code generator
    (registered under itself as it is typed: observed as its definition)."""
    if id(selector) not in names:
        names.clear()  # tables are added as a compile goes: look again
        from numba.cuda.descriptor import cuda_target

        context = cuda_target.target_context
        for table, kind in (("_defns", "function"), ("_getattrs", "getattr"),
                            ("_setattrs", "setattr")):
            for key, found in list(getattr(context, table, {}).items()):
                name = registrations.attr_name(key) if kind != "function" else key_name(key)
                names[id(found)] = (f"{kind} {name}" if name else "", key, found)
        for table, kind in (("_casts", "cast"), ("_get_constants", "constant")):
            found = getattr(context, table, None)
            if found is not None:
                names[id(found)] = (kind, None, found)
        names.setdefault(id(selector), ("", None, selector))  # another context's: not again
    name, key, _ = names[id(selector)]
    return "" if key is impl else name


def _interpreted_name(func) -> str:
    """A function numba interprets, as found again later: an implementation that a
    module-level function (an overload's selector) only made and returned by its own
    name (`ol_f.<locals>.impl`, see `Current._returned_digest`); any other nested one
    by its outermost function, which holds it."""
    outer, sep, inner = func.__qualname__.partition(".<locals>.")
    if sep and "." not in outer and "<" not in inner:
        found = getattr(sys.modules.get(func.__module__), outer, None)
        code = getattr(found, "__code__", None)
        if code is not None and any(c is func.__code__ for c in returned_functions(code)):
            return func.__qualname__
    return _outermost(func.__qualname__)


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


_PLUMBING = frozenset({"os", "_collections_abc", "collections.abc", __name__,
                       WatchedEnviron.__module__})

# What each answer numba keeps (a typing template's for some argument types, a device
# function's compile) read when it was made in this process: (kind, name) -> (its digest
# then, whether only statically keyed code read it), or None until the compile that made
# it is digested. Template classes and dispatchers live as long as the process; numba
# makes each answer once and keeps it. A look-up memo by identity, never in a key.
_ANSWERS: dict = {}


# -- hooks ------------------------------------------------------------------------

@contextlib.contextmanager
def observing(observer: Observer, front_end: FrontEnd = NUMBA_CUDA_FRONT_END):
    """Within the block, what the front end consults is recorded in `observer`."""
    with contextlib.ExitStack() as stack:
        for cls, name, wrap in _hooks(observer, front_end):
            stack.enter_context(_wrapped(cls, name, wrap))
        stack.enter_context(_environ(observer))
        stack.enter_context(_module_reads(observer))
        stack.enter_context(oscalls.watching(observer, _installed))
        stack.enter_context(_nvrtc_headers(observer, front_end.nvrtc))
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
        def hooked(self, *args, **kws):
            if not getattr(self, "_can_compile", True) and not _library_code(self):
                _compile_eager_again(self, *front_end.eager_compile)
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
    """Every module that is not a library's (the project's, a third-party extension's) has
    its attribute reads observed for the block, however made: `mod.X`, `getattr(mod,
    computed)`, `importlib.import_module(m).X`, `from m import X` in a function body; and
    `globals()` or `vars(mod)` hand code that is not a library's a namespace that observes
    each name read from it. A module's class is swapped for a subclass that observes (and
    put back after), so nothing is traced outside those modules and this block."""
    watched: dict = {}  # id(module) -> (module, the class it had: put back after)
    compiling = threading.get_ident()  # another thread's namespaces are left alone

    def read(module, attr, value, frame):
        if _reader_is_kbuild(frame):
            return value
        name = pytypes.ModuleType.__getattribute__(module, "__name__")
        if attr == "__dict__" and not _import_or_toolchain_read(frame) \
                and threading.get_ident() == compiling:
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
        for name, module in list(sys.modules.items()):
            if isinstance(module, pytypes.ModuleType) and id(module) not in watched \
                    and not is_library(name) and _module_name(module) == name:
                swap(module)

    original_import, original_import_module = builtins.__import__, importlib.import_module

    def watching_import(*args, **kwargs):
        try:
            return original_import(*args, **kwargs)
        finally:
            watch_new()

    def watching_import_module(*args, **kwargs):
        try:
            return original_import_module(*args, **kwargs)
        finally:
            watch_new()

    watch_new()
    original_globals = builtins.globals

    def recording_globals():
        frame = sys._getframe(1)
        if frame is None or _import_or_toolchain_read(frame) or \
                threading.get_ident() != compiling:
            return frame.f_globals if frame is not None else original_globals()
        return _RecordingGlobals(frame.f_globals, observer)

    # The stand-ins are named as what they stand in for: code keyed while they are in
    # place (a typing function digested as it is about to run) reads Python's own
    # `globals`, as it does after the compile.
    for stand_in, original in ((recording_globals, original_globals),
                               (watching_import, original_import),
                               (watching_import_module, original_import_module)):
        functools.update_wrapper(stand_in, original)
    builtins.globals = recording_globals
    builtins.__import__, importlib.import_module = watching_import, watching_import_module
    try:
        yield
    finally:
        builtins.globals = original_globals
        builtins.__import__, importlib.import_module = original_import, original_import_module
        for module, cls in watched.values():
            if type(module) is classes.get(cls):
                module.__class__ = cls


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


def _question(cls, asked) -> tuple:
    """(a template class, what it was asked) as a memo key: numba keeps a template's answer
    per argument types. Whatever cannot be hashed is asked apart by the class alone
    (coarser, and never fewer reads)."""
    try:
        key = (cls, repr_free(asked))
        hash(key)
        return key
    except TypeError:
        return (cls,)


def _forget_answer(template, asked) -> bool:
    """Drop what numba keeps of a project's typing template's answer for these argument
    types (`_impl_cache`, keyed by (context, args, kws, ...)), so its Python runs again.
    numba's own templates read nothing of the project's: theirs are kept."""
    cache = getattr(type(template), "_impl_cache", None)
    func = getattr(template, "_overload_func", None) or \
        getattr(template, "_definition_func", None)
    if not isinstance(cache, dict) or is_library(getattr(func, "__module__", None)):
        return True
    called = asked[0] if len(asked) == 2 else None  # generic(args, kws), as the hook saw it
    if not (isinstance(called, tuple) and len(called) == 2 and isinstance(called[1], dict)):
        return True  # an attribute template: it runs every time it is asked
    args, kws = tuple(called[0]), tuple(called[1].items())
    for key in [k for k in cache if isinstance(k, tuple) and k[1:3] == (args, kws)]:
        del cache[key]
    # numba-cuda-mlir also keeps what the overload function returned, per the options
    # it read (`_overload_result_cache`, keyed by (function, args, kws)): dropped too, or
    # the rebuilt implementation is made from the kept result without running it.
    results = getattr(type(template), "_overload_result_cache", None)
    if isinstance(results, dict):
        results.pop((func, args, kws), None)
    return True


def _library_code(dispatcher) -> bool:
    func = getattr(dispatcher, "py_func", None)
    code = getattr(func, "__code__", None)
    return is_library(getattr(func, "__module__", None)) or \
        (code is not None and _installed(code.co_filename))


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


def repr_free(value):
    """`value` made hashable: dicts as sorted item tuples, lists and tuples as tuples."""
    if isinstance(value, dict):
        return tuple(sorted((k, repr_free(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return tuple(repr_free(v) for v in value)
    return value


def _import_or_toolchain_read(frame) -> bool:
    """A read that is no dependency of the project's: a module body running at its import
    (a package importing its parts: what the project's code then reads of them is
    observed), numba's own code reading a module (typing a global the compiled code
    names, which the static key holds, or an installed package it supports, `cffi.FFI`),
    or an installed package's own code: what Python *runs* of the project's while numba
    compiles is what this observes."""
    return frame.f_code.co_name == "<module>" or \
        is_library(frame.f_globals.get("__name__")) or _installed(frame.f_code.co_filename)


def _installed(filename: str) -> bool:
    """Whether code runs from an installed package (site-packages): an installed package
    that numba imports mid-compile (cffi reading `_cffi_backend`) runs its own code, whose
    reads are the package's, pinned by its installed files, not the project's. What the
    project's code reads of such a package is observed."""
    return filename.startswith(_site_packages())


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


def linked_paths(observer: Observer, paths) -> None:
    """Record linked files (paths; other items are keyed by content). Their headers are
    what NVRTC opened while compiling them (`_nvrtc_headers`)."""
    for path in paths:
        if isinstance(path, (str, os.PathLike)):
            observer.file(path, Kind.LINK)


def link_files(observer: Observer, library) -> None:
    """Record the files linked into `library` (and its libraries). Their headers are what
    NVRTC opened while compiling them (`_nvrtc_headers`)."""
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


@contextlib.contextmanager
def _nvrtc_headers(observer: Observer, module_name: str = NUMBA_CUDA_FRONT_END.nvrtc):
    """NVRTC reads a CUDA C file's headers itself, in C, through its own include path
    (numba's and CUDA's folders, `NUMBA_CUDA_NVRTC_EXTRA_SEARCH_PATHS`, the current folder,
    `"..."` and `<...>` alike): no `open` sees them, and parsing `#include` lines again
    with other rules would miss some. NVRTC's time trace (`-fdevice-time-trace`, which
    changes nothing it compiles) lists every header it opened, resolved: each compile
    within the block writes one, and those headers are observed."""
    try:
        nvrtc = importlib.import_module(module_name)
    except ImportError:  # another numba-cuda: nothing compiles CUDA C this way
        yield
        return
    original_compile, original_options = nvrtc.compile, nvrtc.ProgramOptions

    def compile_traced(*args, **kwargs):
        with tempfile.TemporaryDirectory(prefix="kbuild-nvrtc-") as scratch:
            nvrtc.ProgramOptions = functools.partial(
                original_options, fdevice_time_trace=os.path.join(scratch, "trace"))
            try:
                return original_compile(*args, **kwargs)
            finally:
                nvrtc.ProgramOptions = original_options
                for header in traced_headers(scratch):
                    observer.file(header, Kind.HEADER)

    nvrtc.compile = compile_traced
    try:
        yield
    finally:
        nvrtc.compile = original_compile


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


# -- digests by name --------------------------------------------------------------

class Current:
    """The digest of an observed name in this process now (memoized for one build)."""

    def __init__(self, sources, root: Path):
        self._keyer = _ObservationKeyer(_EveryPackage(sources), ALL_OBJECTS)
        self._project = sources
        self._root = Path(root)
        self._memo: dict = {}
        self._code: dict = {}  # a project function's or class's digest, by identity
        self._index = None  # registrations.Index, on first use

    def __call__(self, kind: Kind, name: str) -> str:
        if (kind, name) not in self._memo:
            self._memo[(kind, name)] = self._digest(kind, name)
        return self._memo[(kind, name)]

    def observations(self, observer: Observer) -> list[Observation]:
        """The digests of what `observer` saw (a name a kept answer read, with the digest
        it had when the answer was made); a global only statically keyed functions read
        and that has no content form here is left to the static key."""
        out, digests = [], {}
        for kind, name in observer.names:
            found = observer.pinned.get((kind, name)) or self(kind, name)
            digests[(kind, name)] = found
            if found.startswith(UNKEYABLE) and (kind, name) in observer.static_only:
                continue
            out.append(Observation(kind, name, found))
        observer.answered(digests)
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
        if kind in (Kind.STAT, Kind.LISTING):
            read = oscalls.stat_digest_form if kind is Kind.STAT else oscalls.listing_form
            found = read(self._root / name)
            return MISSING if found is None else digest_of(found)
        if kind is Kind.ENVIRON:
            return digest_of(("environ", tuple(sorted(os.environ.items()))))
        if kind is Kind.UNSEEN:
            return f"{UNKEYABLE}: the compile {name}, whose result no key can hold"
        if kind is Kind.BUILTIN:
            value = getattr(builtins, name, _ABSENT)
            return MISSING if value is _ABSENT else value_digest(value, ALL_OBJECTS)
        if kind in (Kind.OVERLOAD, Kind.INTRINSIC):
            return self._typing_function_digest(kind, name)
        if kind in (Kind.TYPING, Kind.LOWERING):
            return self._registrations_digest(kind, name)
        module_name, _, path = name.partition(":")
        if kind is Kind.FUNCTION and ".<locals>." in path:
            return self._returned_digest(name, module_name, path)
        found = _resolve(module_name, path)
        if found is _ABSENT:
            return MISSING
        if kind is Kind.READ:
            return self._read_digest(module_name, found)
        if kind is Kind.GLOBAL:
            return value_digest(found, ALL_OBJECTS)
        return self._function_digest(kind, name, found)

    def _returned_digest(self, name: str, module_name: str, path: str) -> str:
        """An implementation `outer.<locals>.inner` that `outer` only makes and returns:
        `outer` without the bodies of such implementations (`Keyer.function_node`'s
        selector form), and the code of each it returns by that name. Another one's
        body, which numba did not compile, is no part of it."""
        outer_name, _, inner = path.partition(".<locals>.")
        outer = _resolve(module_name, outer_name)
        if outer is _ABSENT or not isinstance(outer, pytypes.FunctionType):
            return MISSING
        codes = [c for c in returned_functions(outer.__code__) if c.co_name == inner]
        if not codes:
            return MISSING  # no longer only made and returned: a change
        try:
            tree = self._keyer.function_node(outer, LabelKind.OBSERVED.label(name), name,
                                             selector=True).digest
            bodies = sorted(digest_of(code_fingerprint(c, name)) for c in codes)
        except (KeyingError, AttributeError, TypeError) as exc:
            return f"{UNKEYABLE}: {exc}"
        return digest_of(("returned", tree, tuple(bodies)))

    def _read_digest(self, module_name: str, value) -> str:
        """A value Python read during the compile: a module by its name, a project's
        function or class by content (a helper called through a computed name runs its
        code), a library's by name, a value by content; anything else by the source of
        the module that holds it (every byte that made it)."""
        if isinstance(value, pytypes.ModuleType):
            return digest_of(("module", value.__name__))
        value = cache_unwrapped(value)  # an lru_cache'd helper runs its function's code
        home = getattr(value, "__module__", None)
        if isinstance(value, type) and not is_library(home) \
                and not self._project.is_project_module(home):
            # An installed package's class, by its code: what it holds may be set after
            # import (cffi.FFI's first instance sets FFI.NULL, CData, CType), so by
            # content it would differ between the compile and every later check.
            found = self._class_sources(value, None)  # None: a module with no file
            return found if found is not None else self._code_digest(value)
        if isinstance(value, (pytypes.FunctionType, type)) and not is_library(home):
            return self._code_digest(value)
        found = value_digest(value, ALL_OBJECTS)
        if not found.startswith(UNKEYABLE):
            return found
        try:  # a configuration object (a dataclass, a namespace, a partial) by content
            by_content = self._keyer.object_digest(value, module_name)
        except (KeyingError, AttributeError, TypeError):
            by_content = None
        if by_content is not None:
            return digest_of(("object", by_content))
        path = getattr(sys.modules.get(module_name), "__file__", None)
        if not path:
            return found
        try:
            return digest_of(("read-by-module", module_name,
                              self._keyer.sources.file_digest(path)))
        except (OSError, KeyingError) as exc:
            return f"{UNKEYABLE}: {exc}"

    def _function_digest(self, kind: Kind, name: str, obj) -> str:
        try:
            # An overload's selector: the implementation numba compiled is observed apart.
            tree = self._keyer.function_node(obj, LabelKind.OBSERVED.label(name), name,
                                             selector=kind is Kind.OVERLOAD).digest
        except (KeyingError, AttributeError, TypeError) as exc:
            return f"{UNKEYABLE}: {exc}"
        # What the function reads of modules it imports in its body is observed as it
        # runs (`Kind.READ`), by value: never the modules' other bytes.
        return digest_of(("function", tree))

    def _compile_time_digest(self, kind: Kind, name: str, func) -> str:
        """A function numba runs while it compiles (a typing function, a lowering
        implementation, a data model's method) by its key tree; where that holds a value
        with no content form (an llvmlite type made at import, `F32 = ir.FloatType()`),
        by its module's source instead: coarser, and still every byte that made it."""
        found = self._function_digest(kind, name, func)
        if not found.startswith(UNKEYABLE) or CHANGED_AFTER_IMPORT in found:
            return found
        module = sys.modules.get(getattr(func, "__module__", None))
        path = getattr(module, "__file__", None)
        if not path:
            return found
        try:
            source = self._keyer.sources.file_digest(path)
        except (OSError, KeyingError) as exc:
            return f"{UNKEYABLE}: {exc}"
        return digest_of(("function-by-module", func.__module__, func.__qualname__, source))

    def _registrations(self) -> registrations.Index:
        if self._index is None:
            self._index = registrations.index()
        return self._index

    def _typing_function_digest(self, kind: Kind, name: str) -> str:
        """An @overload* or @intrinsic function: every registered one of that name, each
        with its template - every option it was registered with (`jit_options`, `inline`,
        `prefer_literal`, `strict`, the key; the decorator is not its body) - closure
        values included (a factory's product reads what it was given)."""
        found = self._registrations().typing_functions.get(name)
        if not found:
            module_name, _, qualname = name.partition(":")
            obj = _resolve(module_name, qualname)
            if obj is _ABSENT:
                return MISSING
            found = [(obj, ())]
        digests = []
        for func, options in found:
            digests.append(digest_of((self._compile_time_digest(kind, name, func), options)))
        bad = [d for d in digests if d.startswith(UNKEYABLE)]
        return bad[0] if bad else digest_of((kind.value, tuple(sorted(digests))))

    def _registrations_digest(self, kind: Kind, name: str) -> str:
        """Every registration of the project's for what a typing or lowering look-up
        asked (`function mod:Span`, `getattr 'lo'`, `model mod:SpanType`): their forms,
        and their functions and classes by content. A new registration for the same key,
        one removed, one registered for other types or with other options: all change it."""
        digests = []
        for found in self._registrations().registered(kind.value, name):
            digests.append(self._held_digest(found))
        bad = [d for d in digests if d.startswith(UNKEYABLE)]
        return bad[0] if bad else digest_of((kind.value, tuple(sorted(digests))))

    def _held_digest(self, found: Held) -> str:
        codes = tuple(self._code_digest(c) for c in found.code)
        bad = [d for d in codes if d.startswith(UNKEYABLE)]
        return bad[0] if bad else digest_of(("held", found.form, codes))

    def _code_digest(self, obj) -> str:
        """A project function by its key tree, a project class by what it holds (every
        attribute of each of its project classes, methods and `__init__` by content)."""
        slot = id(obj)  # memo within this build only, never part of a key
        if slot in self._code:
            return self._code[slot][1]
        self._code[slot] = (obj, digest_of(("cycle", qualified(obj))))  # a class naming itself
        if isinstance(obj, pytypes.FunctionType):
            name = qualified(obj) or obj.__name__
            found = self._compile_time_digest(Kind.FUNCTION, name, obj)
        else:
            found = self._class_digest(obj)
        self._code[slot] = (obj, found)
        return found

    def _class_digest(self, cls) -> str:
        parts = []
        for klass in cls.__mro__:
            if is_library(klass.__module__):
                continue
            for attr, value in sorted(vars(klass).items()):
                if attr in _CLASS_PLUMBING:
                    continue
                found = held(value, 1)
                parts.append((qualified(klass), attr, self._held_digest(found)))
        bad = [d for _, _, d in parts if d.startswith(UNKEYABLE)]
        if bad:  # a method kbuild cannot key: the classes' modules' sources instead
            return self._class_sources(cls, bad[0])
        return digest_of(("class", qualified(cls), tuple(parts)))

    def _class_sources(self, cls, why: str) -> str:
        files = []
        for klass in cls.__mro__:
            module = sys.modules.get(klass.__module__)
            path = getattr(module, "__file__", None)
            if is_library(klass.__module__):
                continue
            if not path:
                return why
            try:
                files.append((klass.__module__, self._keyer.sources.file_digest(path)))
            except (OSError, KeyingError) as exc:
                return f"{UNKEYABLE}: {exc}"
        return digest_of(("class-sources", qualified(cls), tuple(files)))


# A class's own bookkeeping: never what it holds.
_CLASS_PLUMBING = frozenset({"__dict__", "__weakref__", "__module__", "__qualname__",
                             "__doc__", "__firstlineno__", "__static_attributes__",
                             "__annotations__", "__slots__"})


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
            # (zero-argument `super()` cannot be called inside a generator expression)
            by_source = super()._project_class
            value += tuple(by_source(label, b, where).digest
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
