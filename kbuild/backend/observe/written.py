"""The state a compile fills in: slots that held nothing or None before it and a value after.

An overload that keeps what it worked out (`global _TABLE; _TABLE = load()`, `_MEMO[k] =
...`, `cls._memo = ...`, `self.loaded = ...`) leaves state that a new process does not
have until its own compile fills it again. Before each compile this module notes the
slots of every holder a loaded module (not the toolchain's or the language's) keeps: its
globals, the classes it defines, the dicts, lists and plain objects (a namespace, an
instance of a class of its own) those hold, one level down, and the attributes and closure cells
of the functions among them (`get.memo = ...`, `nonlocal memo`). After it, each slot
that went from nothing or None to a value is registered with what the compile observed
(`keying.made.register`): keying reads it as the program made it and hands those
observations on to whoever reads it. A value so registered that a later compile fills
further in place (a group made by one compile, added to by the next) stays the compiles'
state, with what each observed (`keying.made.grown`). A slot rebound from a value is
forgotten: a counter, a setting changed, read as it is.
"""

from __future__ import annotations

import contextlib
import functools
import sys
import types as pytypes

from ...keying import made
from ...keying.observed import Kind
from ..backends import ALL_OBJECTS
from ..libraries import is_library, loaded_namespaces
from .reads import _installed_code

_LARGEST = 4096  # a dict with more entries is a table, not a memo: read as it is
_ABSENT = made.ABSENT
_HEAP_TYPE = 1 << 9  # Py_TPFLAGS_HEAPTYPE: a class made by a `class` statement


def _compiled(value) -> bool:
    try:
        return ALL_OBJECTS.named_form(value) is not None
    except Exception:  # noqa: BLE001 - an object posing oddly: no compiler's
        return False


made.define_compiled(_compiled)


@contextlib.contextmanager
def kept_writes(observer):
    """Within the block a compile runs: the slots it fills are registered as its own."""
    before = _holders()
    try:
        yield
    finally:
        try:
            _register(before, dict.fromkeys(observer.names))
        except Exception:  # noqa: BLE001 - a holder posing oddly: read as it is
            pass


def _register(before: list, names: dict) -> None:
    made.grown(names)  # deeper than the holders noted: in what a compile made before
    changed = False
    for holder, mapping, kept, where in before:
        for key, value in list(mapping.items()):
            prior = kept.get(key, _ABSENT)
            if prior is value or isinstance(value, pytypes.ModuleType):
                continue  # a module bound on its package by an import: modules go by name
            if prior is _ABSENT or prior is None:
                label = where if isinstance(where, str) else f"{where[0]}:{key}"
                # Whoever reads the slot filled is handed this with what filled it: a
                # build checks that it read filled what compiles ahead of it fill.
                made.register(holder, key, prior, value,
                              {**names, (Kind.FILLED, label): None}, label)
            else:
                made.forget(holder, key)
            changed = True
    if changed:  # what keying made before this compile read the state before it
        made.changed()


def _holders() -> list:
    """(holder, its live items, a copy of them, where) for every holder a loaded module
    keeps (`keying.made.register`): `where` is the `module:global` name that reaches it,
    or (module,) for the module's own namespace (its slots are its globals). An installed
    helper's (a parser's, which numba's own compiles use too) are its installation's."""
    out: list = []
    for name, namespace in loaded_namespaces(skip_libraries=True):
        if _installed_code(namespace.get("__file__"), name):
            continue
        out.append((namespace, namespace, dict(namespace), (name,)))
        for key, value in list(namespace.items()):
            _held(name, value, out, f"{name}:{key}", deeper=True)
    return out


class _Listed:
    """A list's items as slots by index (a memo appended to: `_LOADED.append(...)`)."""

    def __init__(self, items: list):
        self._items = items

    def items(self) -> list:
        return list(enumerate(self._items))

    def values(self) -> list:
        return list(self._items)


class _Cell:
    """A closure cell's contents as one slot, "contents" (a closure's memo: `nonlocal`)."""

    def __init__(self, cell):
        self._cell = cell

    def items(self) -> list:
        try:
            return [("contents", self._cell.cell_contents)]
        except ValueError:  # empty
            return []


def _function(function, out: list, where: str) -> None:
    """A function's attributes (`get.memo = ...`) and its closure's cells."""
    own = function.__dict__
    out.append((own, own, dict(own), where))
    for cell in function.__closure__ or ():
        items = _Cell(cell)
        out.append((cell, items, dict(items.items()), where))


def _held(module: str, value, out: list, where: str, deeper: bool) -> None:
    """The holders `value` is (a class defined in `module`, a dict, a plain object),
    reached through `where`, and, when `deeper`, those its slots hold."""
    cls = type(value)
    try:
        if cls in (staticmethod, classmethod):
            value, cls = value.__func__, type(value.__func__)
        if cls is pytypes.FunctionType:
            _function(value, out, where)
            return
        if cls is type:
            if value.__module__ != module:
                return
            holder, items = value, vars(value)
        elif cls is dict or cls is list:
            if len(value) > _LARGEST:
                return
            holder, items = value, value if cls is dict else _Listed(value)
        else:
            items = _plain_state(value, cls)
            if items is None:
                return
            holder = items
        out.append((holder, items, dict(items.items()), where))
        if deeper:  # what a class (its methods' closures too) or a dict holds
            for inner in list(items.values()):
                if type(inner) is not type:
                    _held(module, inner, out, where, deeper=False)
    except Exception:  # noqa: BLE001 - an object posing oddly: never break a compile
        return


def _plain_state(value, cls) -> dict | None:
    """The `__dict__` of a namespace or of an instance of a plain class (written in
    Python, no metaclass or attribute hook of its own) of a module not the toolchain's:
    what keying reads as its state. None for anything else."""
    if cls is not pytypes.SimpleNamespace and (
            not cls.__flags__ & _HEAP_TYPE or type(cls) is not type or
            cls.__getattribute__ is not object.__getattribute__ or
            is_library(cls.__module__)):
        return None
    try:
        own = object.__getattribute__(value, "__dict__")
    except AttributeError:  # slots only
        return None
    return own if type(own) is dict and len(own) <= _LARGEST else None


_PROBE = "kbuild: a probe of who reads this holder"  # a value with a content form


@contextlib.contextmanager
def probing(labels):
    """Within the block, each holder `labels` name (`module:global`, as `_register` names
    them) holds one more slot, as if a compile had filled it: whoever reads the holder is
    handed (`Kind.FILLED`, label), as it would be were the compile that fills it run here
    (a holder read empty leaves no trace otherwise). The program's state is as before
    after it. A closure's cell is not probed."""
    undo: list = []
    try:
        for label in sorted(labels):
            try:
                _probe(label, undo)
            except Exception:  # noqa: BLE001 - a holder posing oddly: not probed
                continue
        made.changed()
        yield
    finally:
        for step in reversed(undo):
            step()
        made.changed()


def _probe(label: str, undo: list) -> None:
    module, _, name = label.partition(":")
    namespace = getattr(sys.modules.get(module), "__dict__", None)
    if not isinstance(namespace, dict) or not name:
        return
    value = namespace.get(name, _ABSENT)
    if value is _ABSENT or value is None:  # a global a compile sets from nothing
        holder, key, origin = namespace, name, value
        namespace[name] = _PROBE
        restore = (namespace.pop if value is _ABSENT else
                   lambda key: namespace.__setitem__(key, None))
    elif type(value) is dict:
        holder, key, origin = value, _PROBE, _ABSENT
        value[key] = _PROBE
        restore = value.pop
    elif type(value) is list:
        holder, key, origin = value, len(value), _ABSENT
        value.append(_PROBE)
        restore = value.pop
    elif type(value) is type or type(value) is pytypes.FunctionType:
        holder = value if type(value) is type else value.__dict__
        key, origin = _PROBE, _ABSENT
        setattr(value, key, _PROBE)
        restore = functools.partial(delattr, value)
    else:
        own = _plain_state(value, type(value))
        if own is None:
            return
        holder, key, origin = own, _PROBE, _ABSENT
        own[key] = _PROBE
        restore = own.pop
    made.register(holder, key, origin, _PROBE, {(Kind.FILLED, label): None}, label)

    def undone():
        restore(key)
        made.forget(holder, key)
    undo.append(undone)
