"""Canonical forms of the values a kernel reads: constants, arrays, dtypes, numba types.

`canonical(value)` turns a value into plain tuples that `encode` accepts and
that depend only on content: arrays by dtype, shape and bytes; records by field
names, types, offsets, size and alignment; enums by class name, member and
value. `summary(value)` is a short readable form for `kbuild explain`; it is
never hashed. Anything else raises `Unencodable`.
"""

from __future__ import annotations

import enum
import functools
import gc
import logging
import re
import sys
import threading
import types as pytypes
import weakref
from typing import NoReturn

import numpy as np
from numba.core import types as nbtypes

from ..errors import KeyingError
from . import made
from .encode import Unencodable, digest_of, encode

_PRIMITIVES = (type(None), bool, int, float, complex, str, bytes)
_SHOWN_ITEMS = 8  # arrays up to this size are summarised with their values
_HEAP_TYPE = 1 << 9  # Py_TPFLAGS_HEAPTYPE: a class made by a `class` statement
_ADDRESS = re.compile(r"0x[0-9a-fA-F]{4,}| at 0x")


class _Vocabulary:
    """numba's type classes by name, from numba's `types` module and every copy of it a
    backend added: `_type_classes("Array")` is the tuple of every `Array` class."""

    def __init__(self, module):
        self._modules = [module]
        self._classes: dict = {}

    def add(self, module) -> None:
        if not any(m is module for m in self._modules):
            self._modules.append(module)
            self._classes.clear()

    def __call__(self, name: str) -> tuple:
        found = self._classes.get(name)
        if found is None:
            found = self._classes[name] = tuple(getattr(m, name) for m in self._modules)
        return found


_type_classes = _Vocabulary(nbtypes)


def add_type_vocabulary(types_module) -> None:
    """Key the types of `types_module`, a vendored copy of `numba.core.types` (its classes
    `Type`, `Array`, `Record`, ... as numba's), as numba's own types are keyed."""
    _type_classes.add(types_module)


def canonical(value):
    """A content-only, encodable form of `value`, or `Unencodable`."""
    if isinstance(value, enum.Enum):
        return ("enum", _qualified(type(value)), value.name, canonical(value.value)) \
            + _enum_typing(type(value))
    if isinstance(value, np.bytes_):
        # numba types numpy's bytes_ as a CharSeq but a bytes as a read-only array: keyed
        # apart. Its float64, complex128 and str_ type as the Python values they subclass.
        return ("npscalar", dtype_canonical(value.dtype), value.tobytes())
    if isinstance(value, _PRIMITIVES):
        return value
    if isinstance(value, tuple):
        items = tuple(canonical(v) for v in value)
        if hasattr(type(value), "_fields"):
            return ("namedtuple", _qualified(type(value)), tuple(value._fields), items)
        return ("tuple", items)
    if isinstance(value, list):
        return ("list", tuple(canonical(v) for v in made.sequence(value)))
    if isinstance(value, (set, frozenset)):
        # numba's documented `fastmath={'contract', 'arcp'}`: by content, in a fixed order.
        return (type(value).__name__, _sorted_encoded(canonical(v) for v in value))
    if isinstance(value, dict):
        return ("dict", _sorted_encoded((canonical(k), canonical(v))
                                        for k, v in made.view(value).items()))
    if isinstance(value, pytypes.MappingProxyType):  # a read-only view: by what it shows
        return ("mappingproxy", _sorted_encoded((canonical(k), canonical(v))
                                                for k, v in value.items()))
    if isinstance(value, np.ndarray):
        return _array(value)
    if isinstance(value, np.generic):
        return ("npscalar", dtype_canonical(value.dtype), value.tobytes())
    if isinstance(value, np.dtype):
        return dtype_canonical(value)
    if isinstance(value, _type_classes("Type")):
        return type_canonical(value)
    if isinstance(value, type) and issubclass(value, enum.Enum):
        return ("enumclass", _qualified(value),
                tuple((m.name, canonical(m.value)) for m in value.__members__.values())) \
            + _enum_typing(value)
    if isinstance(value, pytypes.ModuleType):
        return ("module", value.__name__)
    for form in _COMPILER_FORMS:
        found = form(value)
        if found is not None:
            return found
    raise Unencodable(value)


# Content forms of a compiler's own values (an llvmlite IR type a lowering function reads),
# each a function from a value to its form or None: added by the backend that knows them
# (`add_value_form`), so keying names no compiler's internals.
_COMPILER_FORMS: list = []


def add_value_form(form) -> None:
    """Key the values `form(value)` gives a form (a tuple of encodable parts) for by it."""
    if form not in _COMPILER_FORMS:
        _COMPILER_FORMS.append(form)


def _content_digest(value) -> str | None:
    try:
        return digest_of(_content(value, 0))
    except (Unencodable, RecursionError):
        return None


def _content(value, depth: int):
    """A value by content: `canonical`'s form, or a plain object's (a dataclass, a
    namespace: `instance_state`) by its class's name and what it holds, nested to a
    bound."""
    try:
        return canonical(value)
    except Unencodable:
        state = instance_state(value) if depth < 8 else None
        if state is None:
            raise
    cls = type(value)
    return ("object", cls.__module__, cls.__qualname__,
            tuple((name, _content(state[name], depth + 1)) for name in sorted(state)))


made.define_form(_content_digest)  # what a slot a compile filled is told by (`made`)


def _sorted_encoded(items) -> tuple:
    """Canonical items in the order of their encodings (never hash or insertion order)."""
    return tuple(sorted(items, key=encode))


def _enum_typing(cls) -> tuple:
    """How numba types members of the enum class `cls`: an `IntEnum`'s as integers
    (`IntEnumMember`: `Mode.FAST == 1`, arithmetic), any other's as opaque members
    (`EnumMember`), so turning one into the other changes what compiles. `IntEnum`s add
    nothing, so their keys stay what they were."""
    return () if issubclass(cls, enum.IntEnum) else (("enum-kind", "Enum"),)


def _qualified(obj) -> str:
    return f"{obj.__module__}.{obj.__qualname__}"


def _array(arr: np.ndarray):
    if arr.dtype.hasobject:
        raise Unencodable(arr)
    data = np.ascontiguousarray(arr).tobytes()
    form = ("ndarray", dtype_canonical(arr.dtype), tuple(arr.shape), data)
    # numba types a frozen array by its memory layout as well as its values (`map_layout`:
    # C, F, else A) and embeds its bytes in that order: one table as a Fortran copy or a
    # strided view compiles to other code. C, by far the common case, adds nothing, so
    # the keys of C arrays stay what they were.
    layout = _numba_layout(arr)
    return form if layout == "C" else form + (("layout", layout),)


def _numba_layout(arr: np.ndarray) -> str:
    """The layout numba's typeof gives `arr` (numba's `numpy_support.map_layout`)."""
    flags = arr.flags
    return "C" if flags.c_contiguous else "F" if flags.f_contiguous else "A"


def dtype_canonical(dt: np.dtype):
    """A numpy dtype by layout: fields with offsets, itemsize and alignment flag."""
    if dt.fields is not None:
        fields = tuple(_field_canonical(name, *dt.fields[name]) for name in dt.names)
        return ("record-dtype", fields, dt.itemsize, dt.alignment, bool(dt.isalignedstruct))
    if dt.subdtype is not None:
        base, shape = dt.subdtype
        return ("subarray-dtype", dtype_canonical(base), tuple(shape))
    return ("dtype", dt.str)


def _field_canonical(name: str, dtype: np.dtype, offset: int, title=None) -> tuple:
    # A field's title is a second name numba types it by (`rec.title` reads that field):
    # keyed when there is one, so untitled fields keep the keys they had.
    form = (name, dtype_canonical(dtype), offset)
    return form if title is None else form + (("title", canonical(title)),)


def type_canonical(t):
    """A numba type by content. Records by layout, arrays by dtype/ndim/layout/flags."""
    if isinstance(t, _type_classes("Record")):
        return ("record", _record_fields(t), t.size, bool(t.aligned))
    if isinstance(t, _type_classes("NestedArray")):
        return ("nested-array", type_canonical(t.dtype), tuple(t.shape))
    if isinstance(t, _type_classes("Array")):
        return ("array", type_canonical(t.dtype), t.ndim, t.layout, bool(t.mutable),
                bool(t.aligned), type(t).__name__)
    if isinstance(t, _type_classes("BaseTuple")) and not isinstance(t, _type_classes("BaseNamedTuple")):
        return ("tuple-type", tuple(type_canonical(x) for x in t.types))
    if isinstance(t, _type_classes("BaseNamedTuple")):
        return ("namedtuple-type", _qualified(t.instance_class),
                tuple(t.fields), tuple(type_canonical(x) for x in t.types))
    if isinstance(t, _type_classes("EnumMember")):
        return ("enum-type", _qualified(t.instance_class), type_canonical(t.dtype)) \
            + _enum_typing(t.instance_class)
    if isinstance(t, _type_classes("NumberClass")):
        return ("number-class", type_canonical(t.instance_type))
    if _ADDRESS.search(t.name):
        raise Unencodable(t)
    # Other numba types (scalars, none, ...) are named canonically by numba itself.
    return ("type", type(t).__name__, t.name)


def _record_fields(t):
    items = sorted(t.fields.items(), key=lambda kv: (kv[1].offset, kv[0]))
    return tuple((name, type_canonical(f.type), f.offset) for name, f in items)


def summary(value) -> str:
    """A short readable form of a value for explanations; never hashed."""
    if isinstance(value, enum.Enum):
        return f"{type(value).__name__}.{value.name}={value.value!r}"
    if isinstance(value, bool) or value is None:
        return repr(value)
    if isinstance(value, (int, float, complex)):
        # As the builtin it subclasses: numba's NUMBA_OPT level reads 3, not _OptLevel(3).
        return repr(next(t for t in (int, float, complex) if isinstance(value, t))(value))
    if isinstance(value, (str, bytes)):
        text = repr(value)
        return text if len(text) <= 40 else text[:37] + "..."
    if isinstance(value, np.ndarray):
        shape = "x".join(str(n) for n in value.shape) or "0-d"
        layout = "" if _numba_layout(value) == "C" else f" ({_numba_layout(value)} layout)"
        if value.size <= _SHOWN_ITEMS and value.dtype.fields is None:
            # Small tables are shown whole, so an edit reads as old -> new values.
            items = ", ".join(repr(v) for v in value.ravel().tolist())
            return f"array {value.dtype}[{shape}] [{items}]{layout}"
        return f"array {value.dtype}[{shape}] #{digest_of(canonical(value))[:8]}{layout}"
    if isinstance(value, np.generic):
        return f"{value.dtype} {value.item()!r}"
    if isinstance(value, np.dtype):
        return f"dtype {value}"
    if isinstance(value, _type_classes("Type")):
        return str(value)
    if isinstance(value, pytypes.ModuleType):
        return f"module {value.__name__}"
    if isinstance(value, (tuple, list)):
        inner = ", ".join(summary(v) for v in value[:4])
        return f"({inner}{', ...' if len(value) > 4 else ''})"
    if isinstance(value, (set, frozenset, dict)):
        items = sorted(f"{summary(k)}: {summary(v)}" for k, v in value.items()) \
            if isinstance(value, dict) else sorted(summary(v) for v in value)
        inner = ", ".join(items[:4]) + (", ..." if len(items) > 4 else "")
        return "{" + inner + "}"
    fn_name = getattr(value, "__qualname__", None)
    if callable(value) and isinstance(fn_name, str):
        return fn_name
    if isinstance(value, type):
        return f"class {value.__qualname__}"
    return type(value).__name__


def cannot_key(where: str, what: str) -> NoReturn:
    """Refuse a value that has no content form, naming where it was read and what it is."""
    raise KeyingError(f"{where}: {what} cannot be keyed by content")


def made_at_import(cls) -> tuple:
    """What numba sees of a class that its module's source does not say: a namedtuple's
    fields and their order (`namedtuple("P", other.FIELDS)`, or fields from the
    environment) and its defaults, for it and each namedtuple class it derives from."""
    out = []
    for klass in getattr(cls, "__mro__", ()):
        fields = klass.__dict__.get("_fields")
        if issubclass(klass, tuple) and isinstance(fields, tuple):
            defaults = klass.__dict__.get("_field_defaults", {})
            try:
                form = canonical((tuple(str(f) for f in fields),
                                  tuple(sorted((str(k), v) for k, v in defaults.items()))))
            except (Unencodable, TypeError):
                form = ("fields", tuple(str(f) for f in fields), "defaults-unkeyed",
                        tuple(sorted(str(k) for k in defaults)))
            out.append(("namedtuple", klass.__qualname__, form))
    return tuple(out)


def instance_state(obj) -> dict | None:
    """The attributes a plain object holds itself ({name: value}, its `__dict__` and
    slots), or None when `obj` is not a plain object: a class, module, function or
    builtin value; an object whose class has a metaclass or its own `__getattribute__`
    (what an attribute read returns is code, not state); or one with neither `__dict__`
    nor slots. What compile-time Python reads of a configuration object (a dataclass, a
    `SimpleNamespace`, a settings instance) is then its class's code and this state."""
    if isinstance(obj, pytypes.SimpleNamespace):
        return dict(made.view(vars(obj)).items())
    cls = type(obj)
    if type(cls) is not type or cls.__getattribute__ is not object.__getattribute__ \
            or isinstance(obj, (type, pytypes.ModuleType, pytypes.FunctionType,
                                pytypes.BuiltinFunctionType, pytypes.MethodType)) \
            or not cls.__flags__ & _HEAP_TYPE:  # a class written in C keeps its state in C
        return None
    own = getattr(obj, "__dict__", None)
    state = dict(made.view(own).items()) if isinstance(own, dict) else {}
    slotted = False
    for klass in cls.__mro__[:-1]:
        slots = klass.__dict__.get("__slots__", ())
        for slot in ((slots,) if isinstance(slots, str) else slots):
            slotted = True
            if slot not in ("__dict__", "__weakref__") and hasattr(obj, slot):
                state.setdefault(slot, getattr(obj, slot))
    if not hasattr(obj, "__dict__") and not slotted:
        return None
    # A `functools.cached_property`'s value is made from the rest on first read: kept or
    # not, it says nothing more (numpy's `finfo` fills in `tiny` when printed).
    return {name: value for name, value in state.items()
            if not isinstance(_class_attribute(cls, name), functools.cached_property)}


def _class_attribute(cls, name: str):
    for klass in cls.__mro__:
        if name in klass.__dict__:
            return klass.__dict__[name]
    return None



def library_object_form(value) -> tuple | None:
    """A standard-library object that compile-time Python uses for its side effects, by
    what can change what it does: a logger by its name and effective level (code may ask
    `isEnabledFor`), a lock by its kind (it orders threads; it holds no value). None for
    anything else."""
    if isinstance(value, logging.Logger):
        return ("logger", value.name, value.getEffectiveLevel(), bool(value.disabled))
    if isinstance(value, _LOCKS):
        return ("lock", type(value).__name__)
    return None


_LOCKS = (type(threading.Lock()), type(threading.RLock()))


# The kept answers of functools caches (`cache_held`). A call that an lru_cache wrapper
# answers from what it kept returns what was true when the answer was made. Made by a
# compile, what it read was observed then (and is handed to each compile answered from
# it: backend/observe/caches.py); made before (at import, by the program), what it read
# no compile saw, and the answer itself is what compile-time code gets: a wrapper found
# by its name (a module's, a class's) is keyed by its function and the answers it holds
# that no compile made.
_MADE_BY_COMPILES: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_WRAPPER = type(functools.lru_cache(maxsize=None)(lambda: None))  # the wrappers' type


def is_cache(value) -> bool:
    """Whether `value` is a `functools.lru_cache`/`cache` wrapper of a Python function
    (its type asked, not it: a lazy object would load)."""
    return isinstance(value, _WRAPPER) and callable(getattr(_WRAPPER, "cache_info", None)) \
        and isinstance(getattr(value, "__wrapped__", None), pytypes.FunctionType)


def made_by_compile(cache, keys) -> None:
    """A compile made the answers `cache` keeps for `keys`."""
    _MADE_BY_COMPILES.setdefault(cache, set()).update(keys)


def kept_keys(cache) -> frozenset:
    """The keys of the calls `cache` keeps answers for (none when they cannot be read)."""
    try:
        return frozenset(key for key, _ in _kept(cache)[0])
    except Unencodable:
        return frozenset()


def cache_held(value) -> tuple | None:
    """What a `functools.lru_cache`/`cache` wrapper holds that no compile made: ((arguments,
    answer), ...) in the order it keeps them, () when none or when it is found nowhere by
    its name (`_reachable`: a closure's, keyed by its function alone); None for anything
    else. One holding answers in a layout other than `_kept` reads (a Python kbuild does
    not know) raises Unencodable: what it holds cannot be read, and no key may leave it
    out."""
    if not is_cache(value):
        return None
    if not value.cache_info().currsize or not _reachable(value):
        return ()
    by_compiles = _MADE_BY_COMPILES.get(value, ())
    kept, mark = _kept(value)
    pairs = [(key, answer) for key, answer in kept if key not in by_compiles]
    if not pairs:
        return ()

    def arguments(key):
        parts = key if isinstance(key, tuple) else (key,)
        return tuple("**" if part is mark else _argument_form(part) for part in parts)

    return tuple((arguments(key), answer) for key, answer in pairs)


def _reachable(cache) -> bool:
    """Whether a wrapper is found where its name says: a module's global, or a class's
    attribute (a method, a static or class method) of a class found so, the same way at
    every check. Another one (a closure's) is keyed by its function alone."""
    module = sys.modules.get(getattr(cache, "__module__", None))
    if not isinstance(module, pytypes.ModuleType):
        return False
    found = pytypes.ModuleType.__getattribute__(module, "__dict__")  # a lazy one stays
    for part in str(getattr(cache, "__qualname__", "")).split("."):
        value = found.get(part) if isinstance(found, (dict, pytypes.MappingProxyType)) \
            else None
        found = vars(value) if isinstance(value, type) else value
    if isinstance(found, (staticmethod, classmethod)):
        found = found.__func__
    return found is cache


def _argument_form(argument):
    """A kept call's argument: by content, else by its type (`self`, an object its
    answer was made for: its state is read where the answer reads it)."""
    try:
        return canonical(argument)
    except Unencodable:
        return ("object", type(argument).__module__, type(argument).__qualname__)


def _kept(cache) -> tuple[list, object]:
    """(key, answer) of each call a wrapper kept, oldest first, and the keyword marker
    its keys hold. The wrapper shows no contents; the garbage collector sees its type,
    each kept (key, answer, link type) of a bounded cache from the oldest, the cache (key
    -> answer for an unbounded one, key -> link for a bounded one), its function, the
    keyword marker, then types and its own dict."""
    refs = gc.get_referents(cache)
    at = next((i for i, r in enumerate(refs) if r is cache.__wrapped__), None)
    if at is None or at < 2 or at + 1 >= len(refs) or type(refs[at - 1]) is not dict:
        raise Unencodable(cache)
    links, mark = refs[1:at - 1], refs[at + 1]
    if not links:
        return list(refs[at - 1].items()), mark
    if len(links) % 3 or not all(isinstance(t, type) for t in links[2::3]):
        raise Unencodable(cache)
    return list(zip(links[0::3], links[1::3])), mark


def cache_unwrapped(value):
    """The function a `functools.lru_cache`/`cache` wrapper calls when it holds no answer
    that no compile made (what it returns is that function's), else `value`: such a
    wrapper is keyed by those answers too (`cache_held`, a configuration object's state
    in `Keyer`)."""
    while callable(getattr(value, "cache_info", None)) and \
            isinstance(getattr(value, "__wrapped__", None), pytypes.FunctionType):
        try:
            if cache_held(value):  # None (another library's wrapper) or () unwrap
                break
        except Unencodable:
            break
        value = value.__wrapped__
    return value
