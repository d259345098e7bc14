"""What numba's typing and lowering registries hold, found again by name in any process.

A compile consults registrations besides the functions it interprets: typing templates
(`@overload*`, `@intrinsic`, `register_jitable`, `@type_callable`, `AttributeTemplate`
and `AbstractTemplate` classes, `make_attribute_wrapper`), lowering implementations
(`@lower_builtin` / `@lower`, `@lower_getattr`, `@lower_setattr`, `@lower_cast`,
`@lower_constant`) and data models (`register_model`), wherever the project defined them.
`backend.observe` records which ones a compile consulted, by a name that says what was
looked up (`function sp.ext:Span`, `getattr 'lo'`, `model sp.ext:SpanType`); this module
finds every registration behind such a name again - in the compiling process or a later
one - so that `observe.Current` can digest what they hold: the project's functions and
classes by content, and every other value of a registration (its options, the types it
was registered for, what a library helper it goes through captured) by form.

Registrations are found in every registry the loaded modules hold (a registry is a
module global: numba's own, numba-cuda's, a project's), not only the ones a context
has installed, so a process that has compiled nothing finds the same as one that has.
What a compile registers itself (an `@intrinsic`'s code generator, an `@overload_method`
template's lowering) is left out: it is the product of a typing function that is
observed on its own, and it does not exist in a process that has not compiled.
"""

from __future__ import annotations

import sys
import types as pytypes
from dataclasses import dataclass

from ..keying.values import canonical
from .libraries import is_library, loaded_namespaces

_DEPTH = 6  # how far a registration's captured values are followed


def qualified(obj) -> str | None:
    """`module:qualname` of a function or class, or None."""
    module, qualname = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
    if isinstance(module, str) and isinstance(qualname, str):
        return f"{module}:{qualname}"
    return None


# -- what a registration holds ------------------------------------------------------

@dataclass(frozen=True)
class Held:
    """A registered value as data: `form` (tuples of strings and canonical values, the
    same in every process) and `code`, the project functions and classes in it, which
    the caller keys by content."""

    form: tuple
    code: tuple = ()


_HELD: dict = {}  # (id, depth) -> (the object, its Held)

# A template's caches, filled as it is used: never part of what it is.
# What a template class fills in as it is used (numba's, and numba-cuda-mlir's copy:
# `_overload_result_cache`), and ABC's bookkeeping: never part of what it holds.
_CACHES = frozenset({"_impl_cache", "_compiled_overloads", "_inline_overloads",
                     "_overload_cache", "_cache", "_overload_result_cache", "_abc_impl"})


def held(value, depth: int = 0) -> Held:
    """What a registration holds in `value`, followed through library wrappers: a library
    function by its name and the values it captured (`_decorate_getattr` wraps the
    project's function; `make_attribute_wrapper`'s captures the attribute names), a
    project function or class as code, a numba type by its name, anything else by value
    or, failing that, by its type's name."""
    value = getattr(value, "__func__", value) if isinstance(value, (staticmethod,
                                                                     classmethod)) else value
    if depth > _DEPTH:
        return Held(("deep",))
    if isinstance(value, (pytypes.FunctionType, type)):
        # Registered functions and classes live as long as the process: what they hold
        # is worked out once (by identity, in this process only; the object is kept).
        slot = (id(value), depth)
        if slot not in _HELD:
            made = _function(value, depth) if isinstance(value, pytypes.FunctionType) \
                else _class(value, depth)
            _HELD[slot] = (value, made)
        return _HELD[slot][1]
    if _is_numba_type(value):
        # A project's numba type: its class (what its typing and lowering read) is code.
        cls = type(value)
        return Held(("type", type_name(value)), () if is_library(cls.__module__) else (cls,))
    if isinstance(value, (tuple, list, set, frozenset)):
        parts = [held(v, depth + 1) for v in value]
        forms = tuple(p.form for p in parts)
        if isinstance(value, (set, frozenset)):
            forms = tuple(sorted(forms, key=repr_free))
        return Held((type(value).__name__, forms), tuple(c for p in parts for c in p.code))
    if isinstance(value, dict):
        parts = sorted(((held(k, depth + 1), held(v, depth + 1)) for k, v in value.items()),
                       key=lambda kv: repr_free((kv[0].form, kv[1].form)))
        return Held(("dict", tuple((k.form, v.form) for k, v in parts)),
                    tuple(c for k, v in parts for c in k.code + v.code))
    inline = getattr(value, "_inline", None) if type(value).__name__ == "InlineOptions" else None
    if inline is not None:  # `inline="always"` or a cost-model function
        return Held(("inline",) + held(inline, depth + 1).form, held(inline, depth + 1).code)
    try:
        return Held(("value", canonical(value)))
    except Exception:  # noqa: BLE001 - Unencodable, or a value that refuses to be read
        return Held(("object", qualified(type(value)) or type(value).__name__))


def _function(func, depth: int) -> Held:
    name = qualified(func) or func.__name__
    if not is_library(func.__module__):
        return Held(("code", name), (func,))
    cells = [held(c.cell_contents, depth + 1) for c in func.__closure__ or ()
             if _filled(c)]
    defaults = [held(d, depth + 1) for d in func.__defaults__ or ()]
    return Held(("library", name, tuple(p.form for p in cells), tuple(p.form for p in defaults)),
                tuple(c for p in cells + defaults for c in p.code))


def _class(cls, depth: int) -> Held:
    name = qualified(cls) or cls.__name__
    if not is_library(cls.__module__):
        return Held(("code", name), (cls,))
    if "<locals>" not in cls.__qualname__ and not _made_by_library(cls):
        return Held(("class", name))
    # A class a library function made (a `type_callable` template, `make_attribute_wrapper`'s
    # attribute template): what it holds is what the project gave that function.
    parts = [(k, held(v, depth + 1)) for k, v in sorted(vars(cls).items())
             if not (k.startswith("__") and k.endswith("__")) and k not in _CACHES
             and not k.endswith("_cache")]
    return Held(("library-class", name, tuple((k, p.form) for k, p in parts)),
                tuple(c for _, p in parts for c in p.code))


def _made_by_library(cls) -> bool:
    # `type(name, bases, dict)` inside a library function: the name is no attribute of
    # the module it claims (numba's `type_callable` and `make_overload_template` do this).
    module = sys.modules.get(cls.__module__)
    return getattr(module, cls.__qualname__, None) is not cls


def _filled(cell) -> bool:
    try:
        cell.cell_contents
    except ValueError:  # a cell not bound yet
        return False
    return True


def _is_numba_type(value) -> bool:
    """Whether `value` is a numba type instance (not a type class)."""
    if isinstance(value, type):
        return False
    cls = type(value)
    answer = _NUMBA_TYPE_CLASSES.get(cls)
    if answer is None:  # once per class: indexing asks it of ~40,000 values
        module = cls.__module__ or ""
        answer = _NUMBA_TYPE_CLASSES[cls] = module.startswith(_TYPE_MODULES) or \
            any(c.__name__ == "Type" and c.__module__.startswith(_TYPE_MODULES)
                for c in cls.__mro__)
    return answer


_NUMBA_TYPE_CLASSES: dict = {}  # class -> whether its instances are numba types


# Where numba's type classes live: numba's, numba-cuda's and numba-cuda-mlir's copy.
_TYPE_MODULES = ("numba.core.types", "numba.cuda.types", "numba_cuda_mlir.numba_cuda.types")


def type_name(value) -> str:
    """A numba type instance as a name: its class and numba's name for it (numba builds
    that from the type's content; a name holding a memory address is not kept)."""
    text = str(value)
    if " at 0x" in text:
        text = "<unnamed>"
    return f"{qualified(type(value))}({text})"


def repr_free(form) -> str:
    """A sort key for forms built only of tuples, strings and canonical values."""
    return str(form)


def key_name(key) -> str | None:
    """The name of what a registration is for (numba's `key`: a function, a class, a
    numba type, a string such as 'getitem', or a tuple of these), or None for a key that
    has no name the same in every process (a compiled overload, an object)."""
    if isinstance(key, str):
        return f"'{key}'"
    if isinstance(key, tuple):
        parts = [key_name(k) for k in key]
        return None if None in parts else "(" + ", ".join(parts) + ")"
    if _is_numba_type(key):
        name = type_name(key)
        return None if name.endswith("(<unnamed>)") else name
    if isinstance(key, (pytypes.FunctionType, pytypes.BuiltinFunctionType, type)):
        return qualified(key)
    return None


def is_project(found: Held) -> bool:
    """Whether a registration holds anything of the project's (its functions or classes,
    or a numba type of a project class): only those are the project's to key."""
    return bool(found.code)


# -- the registries -----------------------------------------------------------------

def _classes(*names: str) -> tuple:
    """The classes named `module:Class` whose modules are loaded."""
    found = []
    for name in names:
        module, _, attr = name.partition(":")
        cls = getattr(sys.modules.get(module), attr, None)
        if isinstance(cls, type):
            found.append(cls)
    return tuple(found)


# numba's, numba-cuda's and numba-cuda-mlir's vendored copy (each where it is loaded).
_MLIR = "numba_cuda_mlir.numba_cuda"
_TYPING = ("numba.cuda.typing.templates:Registry", "numba.core.typing.templates:Registry",
           f"{_MLIR}.typing.templates:Registry")
_LOWERING = ("numba.cuda.core.imputils:Registry", "numba.core.imputils:Registry",
             f"{_MLIR}.core.imputils:Registry")
_MODELS = ("numba.cuda.datamodel.cuda_manager:DataModelManager",
           "numba.core.datamodel.manager:DataModelManager",
           f"{_MLIR}.datamodel.manager:DataModelManager")
_LOADED: dict = {}


def _loaded() -> dict:
    """{"typing" / "lowering" / "models": every such registry a loaded module holds as a
    global}, looked for again when a module was imported since."""
    if _LOADED.get("modules") != len(sys.modules):
        kinds = {"typing": _classes(*_TYPING), "lowering": _classes(*_LOWERING),
                 "models": _classes(*_MODELS)}
        found = _instances(tuple(c for classes in kinds.values() for c in classes))
        _LOADED.update(modules=len(sys.modules), found={
            kind: [v for v in found if isinstance(v, classes)] if classes else []
            for kind, classes in kinds.items()})
    return _LOADED["found"]


def _typing_registries() -> list:
    return _loaded()["typing"]


def _lowering_registries() -> list:
    return _loaded()["lowering"]


def _model_managers() -> list:
    return _loaded()["models"]


def _instances(classes) -> list:
    """Every instance of `classes` that a loaded module holds as a global."""
    if not classes:
        return []
    found: dict = {}
    # Past each module's class: a lazy module is not loaded by looking (one being loaded
    # now would raise), a proxy posing as a module has no namespace.
    for _name, namespace in loaded_namespaces():
        for value in list(namespace.values()):
            if isinstance(value, classes):
                found.setdefault(id(value), value)  # identity: in this process only
    return list(found.values())


def _typing_templates() -> list:
    """(template class, "function" or "attributes") for every typing registration."""
    out = []
    for registry in _typing_registries():
        for cls in getattr(registry, "functions", ()):
            out.append((cls, "function"))
        for cls in getattr(registry, "attributes", ()):
            out.append((cls, "attributes"))
        for _value, fntype in getattr(registry, "globals", ()):
            for cls in getattr(fntype, "templates", ()) or ():
                out.append((cls, "function"))
    return [(cls, kind) for cls, kind in out if isinstance(cls, type)]


class Index:
    """Every project registration in the loaded registries, by (kind, key); and the
    functions behind `@overload*` / `@intrinsic` templates, by their name."""

    def __init__(self):
        self.typing: dict = {}
        self.lowering: dict = {}
        self.typing_functions: dict = {}  # "mod:qualname" -> [(function, options form)]
        self._packages = None
        seen: set = set()
        for cls, kind in _typing_templates():
            if id(cls) not in seen:  # a template in two registries is one
                seen.add(id(cls))
                self._add_template(cls, kind)
        for registry in _lowering_registries():
            for table in ("functions", "getattrs", "setattrs", "casts", "constants"):
                for item in getattr(registry, table, ()):
                    self._add(self.lowering, *_lowering_entry(table, item))
        for manager in _model_managers():
            for typeclass, handler in list(getattr(manager, "_handlers", {}).items()):
                self._add(self.lowering, "model", key_name(typeclass),
                          held((typeclass, handler)))

    @staticmethod
    def _add(table: dict, kind: str, key, found: Held | None) -> None:
        if key is not None and found is not None and is_project(found) and _live(found):
            table.setdefault((kind, key), []).append(found)

    def _add_template(self, cls, kind: str) -> None:
        key, found, functions = _template_entry(cls)
        self._add(self.typing, kind, key, found)
        if _live(found):
            for name, func in functions:
                self.typing_functions.setdefault(name, []).append((func, found.form))

    def packages(self) -> frozenset:
        """The top-level packages whose code the registrations hold (an overload's
        function, a template, a lowering implementation, a data model), made once."""
        if self._packages is None:
            names = {name.partition(":")[0] for name in self.typing_functions}
            for table in (self.typing, self.lowering):
                for found in table.values():
                    names.update(getattr(code, "__module__", None) for held in found
                                 for code in held.code)
            self._packages = frozenset(n.partition(".")[0] for n in names
                                       if isinstance(n, str) and n)
        return self._packages

    def registered(self, kind: str, name: str) -> list:
        """The project registrations behind an observed typing or lowering name."""
        table = self.typing if kind == "typing" else self.lowering
        what, _, key = name.partition(" ")
        return table.get((what, key), [])


# Registry entries are made once and kept for the life of the process: what each holds
# is worked out once (by identity, in this process only; the entry is kept with it).
_ENTRIES: dict = {}


def _memo(item, compute):
    slot = id(item)
    if slot not in _ENTRIES:
        _ENTRIES[slot] = (item, compute())
    return _ENTRIES[slot][1]


def _template_entry(cls):
    def compute():
        return (key_name(getattr(cls, "key", None)), template(cls),
                [(qualified(f), f) for f in typing_functions(cls) if qualified(f)])
    return _memo(cls, compute)


def _lowering_entry(table: str, item):
    """(kind, key, Held or None) of one lowering registration (None: not the project's
    to key - an @intrinsic's code generator, a template's own lowering)."""
    def compute():
        if table == "functions":
            impl, func, argtys = item
            if impl is func or made_by_templates(impl):
                return "function", None, None
            return "function", key_name(func), held((impl, argtys))
        if table in ("getattrs", "setattrs"):
            impl, attr, sig = item
            if made_by_templates(impl):
                return table[:-1], None, None
            return table[:-1], attr_name(attr), held((impl, sig))
        impl, sig = item
        return table[:-1], "", held((impl, sig))
    return _memo(item, compute)


def _live(found: Held) -> bool:
    """Whether a registration's project code belongs to the modules imported now: a module
    imported again (`kbuild watch` forgets the project's between rounds) leaves its old
    registrations in numba's registries, which no fresh process has."""
    for obj in found.code:
        if sys.modules.get(getattr(obj, "__module__", None)) is None:
            return False
        functions = [obj] if isinstance(obj, pytypes.FunctionType) else [
            getattr(v, "__func__", v) for v in vars(obj).values()]  # a class: its methods
        for func in functions:
            if isinstance(func, pytypes.FunctionType):
                module = sys.modules.get(func.__module__)
                if module is None or func.__globals__ is not vars(module):
                    return False
    return True


def attr_name(attr) -> str:
    """An attribute lookup's key: the attribute's name, or `*` for a generic one."""
    return "*" if attr is None else f"'{attr}'"


def made_by_templates(impl, depth: int = 0) -> bool:
    """Whether a lowering implementation is one `_OverloadMethodTemplate` /
    `_OverloadAttributeTemplate` registered when first used (the project's part of them
    is their @overload_* function, observed on its own), also through the library wrapper
    it is registered in (`lower_getattr`'s `_decorate_getattr`): such an entry exists in a
    process that compiled and in no other, so it must never be part of a digest."""
    module = getattr(impl, "__module__", "") or ""
    if module.endswith("typing.templates"):
        return True
    if depth > 2 or not isinstance(impl, pytypes.FunctionType) or not is_library(module):
        return False
    return any(made_by_templates(c.cell_contents, depth + 1)
               for c in impl.__closure__ or () if _filled(c))


def template(cls) -> Held:
    """A typing template class as data: every class in its hierarchy up to numba's
    bases, with the project's code and each option it was registered with (`key`,
    `jit_options`, `inline`, `prefer_literal`, `strict`, `metadata`, ...)."""
    if not is_library(cls.__module__):
        return held(cls)
    parts = []
    for klass in cls.__mro__:
        if is_library(klass.__module__) and "<locals>" not in klass.__qualname__ \
                and not _made_by_library(klass):
            break  # numba's own bases: pinned by the toolchain
        parts.append(held(klass))
    return Held(("template",) + tuple(p.form for p in parts),
                tuple(c for p in parts for c in p.code))


def typing_functions(cls) -> list:
    """The project functions an `@overload*` / `@intrinsic` template runs at typing time:
    its overload or definition function, or - for a library one (`register_jitable`'s
    wrapper) - the project functions it captured."""
    out = []
    for attr in ("_overload_func", "_definition_func"):
        owner = next((k for k in cls.__mro__ if attr in vars(k)), None)
        func = vars(owner)[attr] if owner is not None else None
        func = getattr(func, "__func__", func)
        if isinstance(func, pytypes.FunctionType):
            found = held(func)
            out += [c for c in found.code if isinstance(c, pytypes.FunctionType)]
    return out


def is_overload_template(cls) -> bool:
    """Whether a template runs an `@overload*` or `@intrinsic` function (observed by that
    function's name, `typing_functions`)."""
    return any(hasattr(cls, a) for a in ("_overload_func", "_definition_func"))


# -- one per process, rebuilt when the registries grow ------------------------------

_INDEX: dict = {}


def index() -> Index:
    """The index of the registries as they are now (built again when a module was
    imported or a registry grew since)."""
    stamp = _stamp()
    if _INDEX.get("stamp") != stamp:
        _INDEX.update(stamp=stamp, index=Index())
    return _INDEX["index"]


def prepare() -> None:
    """Index the registries now when they hold the project's registrations: a process
    about to fork compile workers, so that every worker inherits the index and what each
    registration holds (`_ENTRIES`, `_HELD`) instead of working it all out again, and the
    process itself has it when it records the workers' observations. A registry that
    grows later is indexed again, working out only its new entries. Registries with
    nothing of the project's are left alone: no compile asks for their index."""
    if _mentions_project():
        index()


def _mentions_project() -> bool:
    """Whether a loaded registry names anything of the project's at a glance (its
    registration's class, function, key or what a library wrapper captured): a cheap,
    shallow stand-in for `held` over every registration. One it misses costs only time
    (a compile indexes the registries itself), never a different index."""
    entries = [cls for cls, _ in _typing_templates()]
    for registry in _lowering_registries():
        for table in ("functions", "getattrs", "setattrs", "casts", "constants"):
            entries += list(getattr(registry, table, ()))
    for manager in _model_managers():
        entries += list(getattr(manager, "_handlers", {}).items())
    return any(_project_at_a_glance(e) for e in entries)


def _project_at_a_glance(value, depth: int = 0) -> bool:
    if depth > 3:
        return False
    if isinstance(value, (staticmethod, classmethod)):
        value = value.__func__
    if isinstance(value, tuple):
        return any(_project_at_a_glance(v, depth + 1) for v in value)
    if isinstance(value, pytypes.FunctionType):
        return not is_library(value.__module__) or any(
            _project_at_a_glance(c.cell_contents, depth + 1)
            for c in value.__closure__ or () if _filled(c))
    if isinstance(value, type):
        if not is_library(value.__module__):
            return True
        if "<locals>" not in value.__qualname__ and not _made_by_library(value):
            return False  # numba's own class
        return any(_project_at_a_glance(v, depth + 1) for k, v in vars(value).items()
                   if not k.startswith("__") and k not in _CACHES)
    return _is_numba_type(value) and not is_library(type(value).__module__)


def _stamp() -> tuple:
    sizes = []
    for registry in _typing_registries() + _lowering_registries():
        sizes.append(sum(len(getattr(registry, t, ())) for t in (
            "functions", "attributes", "globals", "getattrs", "setattrs", "casts",
            "constants")))
    for manager in _model_managers():
        sizes.append(len(getattr(manager, "_handlers", {})))
    return (len(sys.modules), tuple(sorted(sizes)))
