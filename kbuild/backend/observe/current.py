"""The digest of an observed name as it is now: `Current`.

Observations are names; `Current` gives a name's digest in this process, the same
way when the compile records it and when a later build checks it, so a name either
still means the same content or the target is stale. Functions are digested by their
static key tree (`Keyer`, with every non-library package keyed by content), which
holds the values they read; a value Python read by its content (`_read_digest`);
typing and lowering registrations by what each holds (`registrations`).
"""

from __future__ import annotations

import builtins
import importlib
import importlib.util
import os
import sys
import types as pytypes
from pathlib import Path

from ...errors import CHANGED_AFTER_IMPORT, KeyingError
from ...keying.bytecode import code_fingerprint, nested_code, parameters_form, returned_functions
from ...keying import made
from ...keying.keyer import Keyer, property_form, qualified_name
from ...keying.tree import LabelKind, leaf
from ...keying.encode import Unencodable, digest_of
from ...keying.interfaces import python_function
from ...keying.observed import FILLED_DIGEST, MISSING, UNKEYABLE, Kind, Observation, \
    file_digest, value_digest
from ...keying.values import cache_unwrapped, canonical
from .. import oscalls, registrations
from ..backends import ALL_OBJECTS
from ..compiletime import reload_settings
from ..libraries import is_settings
from ..registrations import Held, held, is_library, qualified
from .observer import Observer, from_root


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
        key, now = (kind, name), made.generation()
        found = self._memo.get(key)
        if found is not None and found[1] == now:
            made.replay(found[2])
            return found[0]
        # Keyed again once a compile filled state in (`keying.made`): read as the program
        # made it, and what filled it handed on.
        with made.touches() as touched:
            try:
                digest = self._digest(kind, name)
            except KeyingError as exc:  # reading it ran the program's code, which raised
                digest = f"{UNKEYABLE}: {exc}"
        self._memo[key] = (digest, now, frozenset(touched))
        return digest

    def handed(self, kind: Kind, name: str) -> frozenset:
        """What the compiles that filled state `name`'s digest read observed."""
        self(kind, name)
        return self._memo[(kind, name)][2]

    def observations(self, observer: Observer) -> list[Observation]:
        """The digests of what `observer` saw (a name a kept answer read, with the digest
        it had when the answer was made); a global only statically keyed functions read
        and that has no content form here is left to the static key."""
        out, digests = [], {}
        todo = list(observer.names)
        while todo:
            kind, name = todo.pop(0)
            found = observer.pinned.get((kind, name)) or self(kind, name)
            digests[(kind, name)] = found
            for more in sorted(self.handed(kind, name) - observer.names.keys()):
                observer.add(*more)  # read to fill state this compile read as made
                todo.append(more)
            if found.startswith(UNKEYABLE) and (kind, name) in observer.static_only:
                continue
            out.append(Observation(kind, name, found))
        observer.answered(digests)
        return out

    def _digest(self, kind: Kind, name: str) -> str:
        if kind is Kind.FILLED:
            return FILLED_DIGEST
        if kind is Kind.ENV:
            value = os.environ.get(name)
            return MISSING if value is None else digest_of(("env", value))
        if kind in (Kind.FILE, Kind.LINK, Kind.HEADER):
            try:
                return file_digest(kind, name, (self._root / name).read_bytes())
            except OSError:
                return MISSING
        if kind in (Kind.STAT, Kind.LISTING):
            read = oscalls.stat_digest_form if kind is Kind.STAT else oscalls.listing_form
            found = read(self._root / name)
            return MISSING if found is None else digest_of(found)
        if kind is Kind.INCLUDE_PATH:
            return self._include_path_digest(name)
        if kind is Kind.CWD:
            return digest_of(("cwd", self._from_root(os.getcwd())))
        if kind is Kind.ENVIRON:
            return digest_of(("environ", tuple(sorted(os.environ.items()))))
        if kind is Kind.MODULE:
            return self._module_digest(name)
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
        if kind is Kind.PARAMETERS:
            return _parameters_digest(module_name, path)
        if kind is Kind.FUNCTION and ".<locals>." in path:
            return self._returned_digest(name, module_name, path)
        if kind in (Kind.READ, Kind.GLOBAL) and \
                is_settings(module_name, sys.modules.get(module_name)):
            # numba's settings as a compile starting now reads them: numba reloads them
            # from the environment and its config file first.
            reload_settings(sys.modules[module_name])
        found = _resolve(module_name, path)
        if found is _ABSENT:
            return MISSING
        if kind in (Kind.READ, Kind.GLOBAL) and isinstance(found, pytypes.ModuleType):
            with_hooks = self._module_with_hooks(found)
            if with_hooks is not None:
                return with_hooks
        if kind is Kind.READ:
            return self._read_digest(module_name, found)
        if kind is Kind.GLOBAL:
            return value_digest(found, ALL_OBJECTS)
        return self._function_digest(kind, name, found)

    def _module_with_hooks(self, module) -> str | None:
        """A module numba types or code reads, with the project's code that Python runs on
        it: its own `__getattr__` and `__dir__` (PEP 562: `getattr(mod, "_numba_type_",
        None)`, numba's first question of any global, runs the former, and what it raises
        or returns decides the compile), and its class where that is a project's (a
        module whose class was swapped for one with properties), each digested as a read
        of it is. None for a module with none: keyed by its name, as ever."""
        name = pytypes.ModuleType.__getattribute__(module, "__name__")
        if is_library(name):
            return None
        namespace = pytypes.ModuleType.__getattribute__(module, "__dict__")
        hooks = [(hook, self._read_digest(name, namespace[hook]))
                 for hook in ("__getattr__", "__dir__") if hook in namespace]
        own = next(c for c in type(module).__mro__ if not _is_kbuild(c.__module__))
        if own is not pytypes.ModuleType and not is_library(own.__module__):
            hooks.append(("class", self._read_digest(name, own)))
        if not hooks:
            return None
        bad = [d for _, d in hooks if d.startswith(UNKEYABLE)]
        return bad[0] if bad else digest_of(("module", name, tuple(hooks)))

    def _module_digest(self, name: str) -> str:
        """Where the import system finds module `name` now: the module loaded, else the
        finders' answer (its parent package imported, as importing it would)."""
        module = sys.modules.get(name)
        if module is not None:
            spec = getattr(module, "__spec__", None)
        else:
            try:
                spec = importlib.util.find_spec(name)
            except Exception:  # noqa: BLE001 - a parent that no longer imports: not found
                spec = None
        if module is None and spec is None:
            return MISSING
        origin = getattr(spec, "origin", None) or getattr(module, "__file__", None)
        if not isinstance(origin, str) or origin == "namespace":  # by its folders, if any
            folders = getattr(spec, "submodule_search_locations", None) or ()
            return digest_of(("module", "folders",
                              tuple(sorted(self._where(f) for f in folders))))
        if not os.path.isabs(origin):  # built-in, frozen
            return digest_of(("module", origin))
        return digest_of(("module", self._where(origin)))

    def _where(self, path: str) -> str:
        """`path` from the root, or the same word for anywhere outside it."""
        found = from_root(path, self._root)
        return "outside the project" if found is None else found

    def _include_path_digest(self, name: str) -> str:
        """NVRTC's extra include folders as the setting `module:attr` gives them now (after
        numba's reload), in order, each by where it is from the project root (a moved
        checkout keeps its digest; relative ones are from the working directory)."""
        module_name, _, attr = name.partition(":")
        module = sys.modules.get(module_name)
        if module is None:
            return MISSING
        if is_settings(module_name, module):
            reload_settings(module)
        value = getattr(module, attr, None)
        if not isinstance(value, str):
            return MISSING
        cwd = os.getcwd()
        return digest_of(("include path", tuple(
            self._from_root(os.path.join(cwd, entry)) for entry in value.split(":") if entry)))

    def _from_root(self, path: str) -> tuple:
        """A folder as where it is from the project root (a moved checkout keeps it), or
        by its path where it is outside."""
        name = from_root(path, self._root)
        return ("root", name) if name is not None else ("path", os.path.realpath(path))

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
        with no content form (a C library's object made at import), by its module's
        source instead: coarser, and every byte that made it unless code elsewhere set it.
        (An llvmlite type has a content form, its LLVM text: `objectmodel.llvm_ir_form`.)"""
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
        for klass in _reachable_classes(cls):
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
        for klass in _reachable_classes(cls):
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


_ABSENT = object()


def _is_kbuild(module_name) -> bool:
    # kbuild's stand-in class for a module it watches while a compile runs (reads.py).
    return isinstance(module_name, str) and (module_name == "kbuild"
                                             or module_name.startswith("kbuild."))


def _reachable_classes(cls) -> tuple:
    """The classes whose attributes `getattr(cls, name)` can return: its MRO, then its
    metaclasses that are not a library's (`class C(metaclass=M)`: `C.S` finds `M.S`, which
    no class of the MRO holds, and which a program can set at run time like any class
    attribute; a library's metaclass, `ABCMeta` or `EnumType`, is pinned with it)."""
    mro = tuple(cls.__mro__)
    if not isinstance(cls, type) or type(cls) is type:
        return mro
    return mro + tuple(k for k in type(cls).__mro__ if not is_library(k.__module__))


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


def _parameters_digest(module_name: str, path: str) -> str:
    """The parameters (`bytecode.parameters_form`) of the function `module:path` finds
    now: a function, the one a dispatcher compiles, or a factory's product, whose code
    the factory's holds (`outer.<locals>.inner`: every product's names are its)."""
    outer_name, local, inner = path.partition(".<locals>.")
    found = _resolve(module_name, outer_name)
    func = python_function(ALL_OBJECTS, found) if found is not _ABSENT else None
    if func is None:
        return MISSING
    code = nested_code(func.__code__, inner) if local else func.__code__
    return MISSING if code is None else digest_of(parameters_form(code))


def _resolve(module_name: str, path: str):
    """The object `module:attr.path` names now (importing the module if needed), or _ABSENT."""
    module = _module(module_name)
    if module is None:
        return _ABSENT
    value = module
    for part in path.split("."):
        found = made.attribute(value, part, _ABSENT)
        if (found is _ABSENT or found is made.ABSENT) and isinstance(value, pytypes.ModuleType):
            found = _submodule(value, part)
        if found is _ABSENT or found is made.ABSENT:
            return _ABSENT
        value = found
    return value


def _submodule(package, name: str):
    """A package's submodule `name` that no one imported yet, imported (a compile's
    `from . import x` reads it as the package's attribute once it imported it), or
    _ABSENT where the package has none."""
    if getattr(package, "__path__", None) is None:
        return _ABSENT
    full = f"{package.__name__}.{name}"
    try:
        if importlib.util.find_spec(full) is None:
            return _ABSENT
        return importlib.import_module(full)
    except Exception:  # noqa: BLE001 - one that no longer imports names nothing
        return _ABSENT


class _ObservationKeyer(Keyer):
    """The Keyer, with a project class that a typing-time function reads keyed by the values
    of its attributes (inherited ones and ones computed from other modules included), where
    the static key holds its module's source."""

    def _project_class(self, label, cls, where):
        items, coarse = [], False
        for name in sorted(n for n in dir(cls) if not (n.startswith("__") and n.endswith("__"))
                           and not n.startswith("_abc_")):  # ABCMeta's caches
            value = made.attribute(cls, name, None, unmade=made.ABSENT)
            if value is made.ABSENT:  # a compile made it: a new process has none
                continue
            form = self._attribute_form(value, where)
            coarse = coarse or form is None
            items.append((name, form or ("unkeyed",)))
        classes = _reachable_classes(cls)
        for meta in classes[len(cls.__mro__):]:
            # All a metaclass holds, its own methods too: its `__getattr__` answers `C.X`
            # for names no class holds, so `dir` could never list them.
            for name, value in sorted(vars(meta).items()):
                if name not in _CLASS_PLUMBING:
                    form = self._attribute_form(value, where)
                    coarse = coarse or form is None
                    items.append((f"{meta.__qualname__}.{name}", form or ("unkeyed",)))
        bases = tuple(f"{b.__module__}:{b.__qualname__}" for b in cls.__mro__)
        if len(classes) > len(cls.__mro__):  # a metaclass: keys stay as they were without
            bases += (("metaclass",) + tuple(f"{b.__module__}:{b.__qualname__}"
                                            for b in classes[len(cls.__mro__):]),)
        value = ("observed-class", cls.__module__, cls.__qualname__, bases, tuple(items))
        if coarse:  # an attribute with no content form: the classes as the keyer keys them
            # (zero-argument `super()` cannot be called inside a generator expression)
            by_source = super()._project_class
            value += tuple(by_source(label, b, where).digest
                           for b in classes if self._is_project_object(b))
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
        if isinstance(value, property):
            return property_form(value, lambda f: self._attribute_form(f, where))
        if isinstance(value, pytypes.FunctionType) and is_library(value.__module__):
            # A library's method (numba's `Type.unify`, inherited by an extension type):
            # by name, as the static key has it; the library's version is keyed.
            return ("extern", value.__module__, value.__qualname__)
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
