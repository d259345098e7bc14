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


def _function(module: str, function, out: list, where: str) -> None:
    """A function's attributes (`get.memo = ...`), its closure's cells (`nonlocal memo`)
    and what a cell holds that is filled in place (a dict, a list, a plain object: a
    closure's `cache[key] = ...`)."""
    own = function.__dict__
    out.append((own, own, dict(own), where))
    for cell in function.__closure__ or ():
        items = _Cell(cell)
        found = dict(items.items())
        out.append((cell, items, found, where))
        inner = found.get("contents")
        if type(inner) is not pytypes.FunctionType and type(inner) is not type:
            _held(module, inner, out, where, deeper=False)


def _held(module: str, value, out: list, where: str, deeper: bool) -> None:
    """The holders `value` is (a class defined in `module`, a dict, a plain object),
    reached through `where`, and, when `deeper`, those its slots hold."""
    cls = type(value)
    try:
        if cls in (staticmethod, classmethod):
            value, cls = value.__func__, type(value.__func__)
        if cls is pytypes.FunctionType:
            _function(module, value, out, where)
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
    after it. A function's closure cells are probed too: one set from None, and what
    one holds."""
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
        for holder, key, restore in reversed(undo):
            restore(key)
            made.forget(holder, key)
        made.changed()


def _probe(label: str, undo: list) -> None:
    module, _, name = label.partition(":")
    namespace = getattr(sys.modules.get(module), "__dict__", None)
    if not isinstance(namespace, dict) or not name:
        return
    value = namespace.get(name, _ABSENT)
    if value is _ABSENT or value is None:  # a global a compile sets from nothing
        restore = (namespace.pop if value is _ABSENT else
                   lambda key: namespace.__setitem__(key, None))
        _slot(label, namespace, name, value, namespace.__setitem__, restore, undo)
        return
    _probe_in(label, value, undo)
    if type(value) is pytypes.FunctionType:  # its closure's cells and what they hold
        for cell in value.__closure__ or ():
            try:
                inner = cell.cell_contents
            except ValueError:  # empty
                continue
            if inner is None:  # a cell a compile sets from nothing (`nonlocal memo`)
                _slot(label, cell, "contents", None, functools.partial(_set_cell, cell),
                      functools.partial(_set_cell, cell, value=None), undo)
            elif type(inner) is not pytypes.FunctionType:
                _probe_in(label, inner, undo)


def _set_cell(cell, key, value) -> None:
    cell.cell_contents = value


def _probe_in(label: str, value, undo: list) -> None:
    """One more slot in `value` (a dict, a list, a class, a function's or a plain
    object's attributes), registered as filled under `label`."""
    if type(value) is dict:
        _slot(label, value, _PROBE, _ABSENT, value.__setitem__, value.pop, undo)
    elif type(value) is list:
        _slot(label, value, len(value), _ABSENT, lambda key, probe: value.append(probe),
              value.pop, undo)
    elif type(value) is type or type(value) is pytypes.FunctionType:
        _slot(label, value if type(value) is type else value.__dict__, _PROBE, _ABSENT,
              functools.partial(setattr, value), functools.partial(delattr, value), undo)
    else:
        own = _plain_state(value, type(value))
        if own is not None:
            _slot(label, own, _PROBE, _ABSENT, own.__setitem__, own.pop, undo)


def _slot(label: str, holder, key, origin, put, restore, undo: list) -> None:
    """`put(key, probe)` into `holder`, registered as a compile's fill under `label`;
    `restore(key)` puts it back after (`undo`: (holder, key, restore)). A holder reached
    twice (a cell's dict that is also a global) is probed once."""
    if any(probed is holder and slot == key for probed, slot, _ in undo):
        return
    put(key, _PROBE)
    undo.append((holder, key, restore))
    made.register(holder, key, origin, _PROBE, {(Kind.FILLED, label): None}, label)
