"""State a compile filled in, read as the program made it (pure: no I/O, no numba).

Compile-time Python (an overload, a helper it calls) often keeps what it worked out: a
module global set from None (`global _TABLE; _TABLE = load()`), an entry added to a
module's or a class's dict, a class or object attribute filled on first use. A new
process has none of it until its own compile fills it again, from what that compile
reads. Keyed as the compile left it, such state differs in every new process (every
build rebuilt what it made), and a second compile answered from it reads nothing the
key holds (its binary went stale when the file behind the state changed).

So the backend tells this module which slots a compile filled (`register`: a slot that
held nothing or None before the compile, and what it holds after, with what the compile
observed), and every keying read of a holder goes through `view` or `attribute`: a slot
that still holds exactly what a compile put there (the same object, the same content) is
read as it was before (absent, or None), as a new process has it, and whoever reads it
is handed what the compiles that filled it observed (`touches`), as numba's kept typing
answers hand theirs on. A slot rebound again to another value, or one the program (not
a compile) filled, is read as it is.

Code that only reads what another compile filled (a registry one overload fills and
another reads) is keyed the same way: its binary is what a build compiling in the same
order makes (the filling compile first), and it is rebuilt when what filled the state
changes. Serving the filling target from the store runs none of its code: a compile
that filled a slot says so (`fills`), and the build service runs it again before a
later compile in a process where it was served
(`builder.service.BuildService.replay_writers`).

Holders are compared by identity and held here while registered (the registry lives
for the process and names no identity in a key).
"""

from __future__ import annotations

import contextlib
import threading
import types as pytypes
from collections.abc import Mapping

from ..errors import KeyingError

ABSENT = object()  # no value: the slot did not exist before the compile
_IDENTITY = "identity"  # the form of a value told by identity (a function, a class)


class _Slot:
    __slots__ = ("origin", "written", "form", "names", "labels")

    def __init__(self, origin, written, form, names: dict, label: str):
        self.origin, self.written, self.form, self.names = origin, written, form, names
        self.labels = [label]  # each name that reaches its holder (`register`)


_HOLDERS: list = []  # [(holder, {key: _Slot})], by identity
_GENERATION = [0]  # bumped whenever a slot is registered or forgotten
_IMPORTS = [0]  # bumped whenever the project's modules are imported again
_FILLED: list = []  # the label of each slot a compile filled (`register`, `grown`), in order
_LOCAL = threading.local()  # .collectors: the touch sets open now; .raw: reads as they are


def fills() -> int:
    """A mark that grows whenever a compile fills state (a slot registered, or a value a
    compile made filled further in place): a compile during which it grew left state a
    later compile may read, which the same target served leaves not (`filled_since`)."""
    return len(_FILLED)


def filled_since(mark: int) -> tuple:
    """The holders filled since `fills()` gave `mark`, by label (`register`), sorted."""
    return tuple(sorted(set(_FILLED[mark:])))


def filled_now() -> frozenset:
    """The holders (by label: see `register`) that hold state a compile filled now."""
    return frozenset(label for _, slots in _HOLDERS for slot in slots.values()
                     for label in slot.labels)


def stored_fills(manifest: dict) -> tuple | None:
    """The holders a stored compile filled (its manifest's `fills`: see `filled_since`),
    () for one stored before they were named (`"writes": true`), None for one that
    filled nothing."""
    found = manifest.get("fills")
    if isinstance(found, list) and found:
        return tuple(str(label) for label in found)
    return () if manifest.get("writes") is True else None


def generation() -> int:
    """A number that changes whenever what `view` reads as made changes: a memo of keying
    work made before it may hold a slot's value the registry now reads otherwise."""
    return _GENERATION[0]


def content_form(value):
    """What a value a compile wrote is told by later (that it holds the same content):
    its content digest (`define_form`'s), a function's, class's or compiler object's
    identity; None for a value that has neither (an object with state: it is read as it
    is)."""
    if _COMPILED and _COMPILED[0](value):
        return _IDENTITY
    if _FORM:
        with reading_raw():
            found = _FORM[0](value)
        if found is not None:
            return found
    return _IDENTITY if isinstance(value, (type, pytypes.FunctionType)) else None


_FORM: list = []  # the content digest of a value, or None (`keying.values` defines it)
_COMPILED: list = []  # whether a value is a compiler's object (the backend defines it)


def define_compiled(is_compiled) -> None:
    """`is_compiled(value)`: whether `value` is a compiler's object compiled code names
    (a dispatcher a compile made and kept: `_DEV[n] = cuda.jit(device=True)(make(n))`),
    told by identity as a function is: what it compiles is keyed where it is called."""
    _COMPILED[:] = [is_compiled]


def define_form(digest) -> None:
    """`digest(value)`: a value's content digest, None where it has no content form."""
    _FORM[:] = [digest]


def register(holder, key, origin, written, names, label: str) -> None:
    """A compile that observed `names` ((kind, name) pairs) put `written` into `holder`'s
    slot `key` (a module's or an object's dict, a dict, a class), which held `origin`
    (ABSENT or None) before. `label` names the holder as observations name what reaches
    it (`module:global`); `names` holds what says it was read filled. A value with no
    `content_form` is read as it is (forgotten)."""
    form = content_form(written)
    slots = _slots(holder, create=form is not None)
    if slots is None:
        return
    if form is None:
        if slots.pop(key, None) is not None:
            _GENERATION[0] += 1
        return
    slot = slots.get(key)
    if slot is not None and slot.written is written and slot.form == form:
        # The same write, seen again: by an enclosing compile, or through another name
        # that reaches the holder (a cell two closures share, a dict two globals hold),
        # which its readers are handed too and which this compile fills.
        slot.names.update(names)
        if label not in slot.labels:
            slot.labels.append(label)
            _FILLED.append(label)
        return
    slots[key] = _Slot(origin if slot is None else slot.origin, written, form, dict(names),
                       label)
    _GENERATION[0] += 1
    _FILLED.append(label)


def grown(names) -> None:
    """A compile that observed `names` ran: a value a compile wrote that it (or the program)
    filled further in place since (`_CACHE.setdefault(g, {})[name] = load()`, a list in
    it appended to) is still state the compiles made, now from what this one read too;
    one that no longer has a content form is read as it is (forgotten), as `register`
    reads such a value."""
    for _, slots in _HOLDERS:
        for key, slot in list(slots.items()):
            form = content_form(slot.written)
            if form == slot.form:
                continue
            if form is None:
                del slots[key]
            else:
                slot.form = form
                slot.names.update(names)
                _FILLED.extend(slot.labels)
            _GENERATION[0] += 1


def forget(holder, key) -> None:
    """The slot was rebound by a compile from a value it held: it is read as it is."""
    slots = _slots(holder)
    if slots is not None and slots.pop(key, None) is not None:
        _GENERATION[0] += 1
        if not slots:  # nothing of it is read as made now
            _HOLDERS[:] = [(held, kept) for held, kept in _HOLDERS if kept is not slots]


def changed() -> None:
    """A compile changed state it did not fill from nothing (rebound a slot, wrote what has
    no content form): keying work made before reads it again, as it is now."""
    _GENERATION[0] += 1


def forget_all() -> None:
    """The project's modules were imported again (a watch round): their holders are gone."""
    _IMPORTS[0] += 1
    if _HOLDERS:
        _HOLDERS.clear()
        _GENERATION[0] += 1


def imports() -> int:
    """How many times the project's modules were imported again in this process: state
    compiles wrote belongs to one import of them."""
    return _IMPORTS[0]


def _slots(holder, create: bool = False) -> dict | None:
    for held, slots in _HOLDERS:
        if held is holder:
            return slots
    if not create:
        return None
    _HOLDERS.append((holder, {}))
    return _HOLDERS[-1][1]


def _reading_as_made() -> bool:
    """Whether reads go through the registry: some compile filled a slot, and the reader
    does not ask for slots as they are (`reading_raw`)."""
    return bool(_HOLDERS) and not getattr(_LOCAL, "raw", False)


def item(holder, key, value):
    """`value`, read from `holder`'s slot `key`, as the program made it: the slot's value
    before a compile filled it (ABSENT where it did not exist), when it holds what that
    compile put there; `value` otherwise."""
    if not _reading_as_made():
        return value
    slots = _slots(holder)
    slot = slots.get(key) if slots else None
    if slot is None or slot.written is not value or content_form(value) != slot.form:
        return value
    for collected in getattr(_LOCAL, "collectors", ()):
        collected.update(slot.names)
    return slot.origin


def view(holder, mapping=None) -> Mapping:
    """`holder`'s items (`mapping`: how it shows them, a class's `vars`) as the program
    made them; the mapping itself where no compile filled a slot of it."""
    mapping = holder if mapping is None else mapping
    if not _reading_as_made() or _slots(holder) is None:
        return mapping
    return _MadeView(holder, mapping)


def sequence(holder: list) -> list:
    """A list's items as the program made them: those a compile appended left out."""
    if not _reading_as_made() or _slots(holder) is None:
        return holder
    found = [item(holder, index, value) for index, value in enumerate(list(holder))]
    return [value for value in found if value is not ABSENT]


class _MadeView(Mapping):
    """A read-only mapping of `holder`'s items as the program made them (`item`)."""

    def __init__(self, holder, mapping):
        self._holder, self._mapping = holder, mapping

    def __getitem__(self, key):
        value = item(self._holder, key, self._mapping[key])
        if value is ABSENT:
            raise KeyError(key)
        return value

    def __iter__(self):
        return (key for key, _ in self.items())

    def __len__(self):
        return sum(1 for _ in self.items())

    def __contains__(self, key):
        try:
            self[key]
        except (KeyError, TypeError):
            return False
        return True

    def items(self):
        out = []
        for key, value in list(self._mapping.items()):
            value = item(self._holder, key, value)
            if value is not ABSENT:
                out.append((key, value))
        return out

    def values(self):
        return [value for _, value in self.items()]


def attribute(obj, name: str, default=ABSENT, unmade=None):
    """`getattr(obj, name, default)` as the program made it: an attribute a compile
    filled into a module's, an object's or a class's dict is read as it was before
    (looked for further along, the class's, where it did not exist); `unmade` (default:
    `default`) where a compile made it and nothing further along holds it. Where the
    program's code that getattr runs (a module's `__getattr__`, a property, a metaclass's
    hook) raises anything but AttributeError, numba's compile would meet it too: a
    KeyingError saying so, for the target that reads it."""
    try:
        value = getattr(obj, name, default)
    except Exception as exc:  # noqa: BLE001 - the program's code, whatever it raises
        raise KeyingError(
            f"reading '{name}' of {_described(obj)} ran the program's code, which raised "
            f"{type(exc).__name__}: {exc}; fix what it runs (a module's __getattr__, a "
            "property), since numba's compile reads it too") from None
    if not _reading_as_made():
        return value
    unset = False  # a compile made it where it was found
    for holder, mapping in _homes(obj):
        if not isinstance(mapping, (dict, pytypes.MappingProxyType)) or name not in mapping:
            continue
        found = mapping[name]
        made = item(holder, name, found)
        if made is found:
            return value  # as it is: what getattr answers (a descriptor's result too)
        if made is not ABSENT:
            return made
        unset = True
    if not unset:  # in no dict (a module's `__getattr__`, a metaclass's): as getattr has it
        return value
    return default if unmade is None else unmade


def _described(obj) -> str:
    if isinstance(obj, pytypes.ModuleType):
        return f"module {pytypes.ModuleType.__getattribute__(obj, '__name__')}"
    if isinstance(obj, type):
        return f"class {obj.__qualname__}"
    return f"a {type(obj).__qualname__}"


def _homes(obj):
    """(holder, its items) where `getattr(obj, name)` looks, in order."""
    if isinstance(obj, pytypes.ModuleType):
        namespace = pytypes.ModuleType.__getattribute__(obj, "__dict__")
        return [(namespace, namespace)]
    classes = obj.__mro__ if isinstance(obj, type) else type(obj).__mro__
    homes = [] if isinstance(obj, type) else [
        (own, own) for own in [getattr(obj, "__dict__", None)] if isinstance(own, dict)]
    return homes + [(klass, vars(klass)) for klass in classes]


@contextlib.contextmanager
def touches():
    """Within the block: the set of names handed on by every slot read as made."""
    collected: set = set()
    collectors = _LOCAL.__dict__.setdefault("collectors", [])
    collectors.append(collected)
    try:
        yield collected
    finally:  # by identity: two sets collected alike are equal
        del collectors[next(i for i, c in enumerate(collectors) if c is collected)]


def replay(names) -> None:
    """Hand `names` (a memo's `touches`) to every block collecting now."""
    for collected in getattr(_LOCAL, "collectors", ()):
        collected.update(names)


@contextlib.contextmanager
def reading_raw():
    """Within the block, slots are read as they are (what a compile wrote, told apart)."""
    before = getattr(_LOCAL, "raw", False)
    _LOCAL.raw = True
    try:
        yield
    finally:
        _LOCAL.raw = before
