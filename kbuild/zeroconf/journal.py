"""The program journal: a warm zero-config start answered without keying.

A program served by `enable()` launches the same kernels with the same types every run,
and a warm store holds them all; keying each one from its sources (its key tree: bodies,
callees, values, toolchain) is what a warm start spends its time on. The journal keeps,
per program (its entry script or `-m` module, the interpreter, `sys.path` and the
settings of `enable()`: `slot`), what the last runs keyed: for each (kernel, signature,
arch) served from its static key, the key, and the *live digest* of everything that key
rests on that a process can change without changing a file.

The live digest (`LiveDigest`) is the cheap part of keying, taken again at every launch-
time compile: for the kernel and every device function it reaches, the exact code object
numba compiles (its marshalled bytes: bytecode, constants, names, line table, nested code),
its decorator options, and every value it reads (globals, closure cells, defaults,
builtins, attribute chains through modules), each turned into the very key leaf the Keyer
makes of it (`Keyer.value_leaf`: a number by value, an array by its bytes, a library
function by name, a project class by its module's bytes); device functions reached are
followed by identity of code and digested the same way; then the argument types, the arch,
the toolchain's versions and the codegen settings, as the key has them. Whatever the key
could read besides is not a value a program holds: a kernel that reaches an `@overload`ed
or plain jitable function, device functions in a container, recursion, or anything the
Keyer cannot key is not vouched for (no live digest: the compile keys in full).

So the journal never trusts a file's time stamp for a value: a global set at run time, an
environment variable read at import, a closure's cell, a device function edited in
another module, `specialize()`'s types: each changes the live digest, and the compile
keys in full, as without the journal. When the live digest is one the journal holds, the
key is the one it holds, and the entry is looked up and checked exactly as a full keying
checks it (`builder.fresh_entry`: the entry verified, the observation set of what its
compile read matched against the files and globals now). What the journal saves is the
key tree: reading sources' facts, fingerprinting bytecode, building and hashing nodes.

The journal file is the store's journal format (`store.journal`: a verified header, an
atomic write) in the store's journal folder, written at exit when a run keyed something
in full; a damaged or foreign one is ignored (the run keys in full and writes a new one).
`KBUILD_JOURNAL=0` (or `enable(journal=False)`) turns it off.
"""

from __future__ import annotations

import json
import marshal
import os
import sys

from dataclasses import dataclass

from ..errors import KeyingError
from ..keying.encode import digest, digest_of
from ..keying.interfaces import Role
from ..keying.observed import Kind
from ..keying.references import LibraryRef
from ..keying.tree import LabelKind, label_kind

VERSION = 2
# Live digests kept per (kernel, signature, arch): a program run in a few states (an
# environment variable set one way or another) finds each.
STATES_PER_TARGET = 4
MAX_TARGETS = 8192


class NotVouched(Exception):
    """The journal cannot say what this kernel's key rests on: it is keyed in full."""


@dataclass(frozen=True)
class Held:
    """What the journal holds for one state of a target: its key and, when the full
    look-up that served it could be written down, its entry's identity (as ccache's
    direct mode holds a result's): `entry`, the digest of the entry file's bytes that
    look-up checked, and `observed`, the observations of its record's newest set,
    ((kind, name, digest), ...), the set `builder.fresh_entry` matches first; `fields`,
    the entry's fields but the inputs of its key (kept for `kbuild explain`): what
    loading it reads, held so that a hit parses no entry."""

    key: str
    entry: str | None = None
    observed: tuple = ()
    fields: dict | None = None

    def as_json(self):
        if self.entry is None:
            return self.key
        return [self.key, self.entry, [[k.value, n, d] for k, n, d in self.observed],
                self.fields]

    @staticmethod
    def from_json(value) -> "Held | None":
        if isinstance(value, str):
            return Held(value)
        try:
            key, entry, observed, fields = value
            observed = tuple((Kind(k), n, d) for k, n, d in observed)
        except (TypeError, ValueError):
            return None
        if not (isinstance(key, str) and isinstance(entry, str)
                and all(isinstance(n, str) and isinstance(d, str) for _, n, d in observed)
                and isinstance(fields, dict) and isinstance(fields.get("artifacts"), dict)
                and isinstance(fields.get("entry"), str)):
            return None
        return Held(key, entry, observed, fields)


def program_identity(settings) -> dict:
    """What names a program: its entry (script or `-m` module), the interpreter,
    `sys.path` and the settings of `enable()` that change keys or where they live."""
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    entry = ["module", spec.name] if spec is not None and getattr(spec, "name", None) else \
        ["script", os.path.realpath(sys.argv[0]) if sys.argv and sys.argv[0] else ""]
    return {"version": VERSION, "entry": entry,
            "python": [os.path.realpath(sys.executable), sys.version],
            "sys_path": [os.path.abspath(p) if p else os.getcwd() for p in sys.path],
            "cwd": os.getcwd(), "store": str(settings.store),
            "roots": [str(r) for r in settings.roots], "archs": list(settings.archs or ()),
            "on_miss": settings.on_miss, "config": str(settings.root / "kbuild.toml")}


def slot(identity: dict) -> str:
    return digest(json.dumps(["zeroconf journal", identity], sort_keys=True).encode())


def enabled_by_environment() -> bool:
    return os.environ.get("KBUILD_JOURNAL", "1").strip().lower() not in ("0", "false", "no",
                                                                         "off")


class ProgramJournal:
    """One process's use of its program's journal in `store`."""

    def __init__(self, store, settings):
        self.store = store
        self.slot = slot(program_identity(settings))
        self.rows: dict | None = None  # tid -> {live digest: Held}, as read
        self.added: dict = {}  # tid -> {live digest: Held} keyed in full by this process
        self.last: list | None = None  # the tids the last saved run served, as read
        self.served: dict = {}  # the tids this process served (from the journal or keyed)
        # answered (served under the journal's key), missed (no key for this state, or its
        # entry not fresh), not vouched (no live digest): for tests and reports
        self.counts = {"answered": 0, "missed": 0, "not vouched": 0}

    def held_for(self, tid: str, live: str) -> Held | None:
        """What the journal holds for `tid` in the state `live`, or None."""
        rows = self._rows()
        found = self.added.get(tid, {}).get(live) or rows.get(tid, {}).get(live)
        if found is None:
            self.counts["missed"] += 1
        return found

    def last_run(self) -> list:
        """The target ids the last run that saved the journal served, in the order it
        served them (what the program launches: `background` rebuilds them)."""
        self._rows()
        return list(self.last or ())

    def launched(self, tid: str) -> None:
        """This process served `tid` (from the journal, or keyed in full)."""
        self.served.setdefault(tid, None)

    def remember(self, tid: str, live: str, held: Held) -> None:
        self.added.setdefault(tid, {})[live] = held

    def _rows(self) -> dict:
        if self.rows is None:
            self.rows = self._read()
        return self.rows

    def _read(self) -> dict:
        from ..store import journal

        try:
            found = journal.read(self.store.root, self.slot)
        except (journal.JournalProblem, OSError):
            return {}
        body = found.body if found is not None else None
        if not isinstance(body, dict) or body.get("zeroconf") != VERSION \
                or not isinstance(body.get("rows"), dict):
            return {}
        last = body.get("last", [])
        if self.last is None:
            self.last = [t for t in last if isinstance(t, str)] if isinstance(last, list) \
                else []
        rows = {}
        for tid, states in body["rows"].items():
            if not isinstance(tid, str) or not isinstance(states, dict):
                continue
            held = {k: Held.from_json(v) for k, v in states.items() if isinstance(k, str)}
            if len(held) == len(states) and None not in held.values():
                rows[tid] = held
        return rows

    def save(self) -> bool:
        """Write what this process keyed in full into the journal (with what other runs
        left there); False when there was nothing new or the store cannot be written."""
        served = list(self.served)
        if not self.added and (not served or set(served) == set(self.last_run())):
            return False  # a warm run of the same kernels: nothing to write
        from ..store import journal

        if not self.store.base.is_dir():
            return False
        rows = dict(self._read())
        for tid, states in self.added.items():
            merged = {k: v for k, v in rows.get(tid, {}).items() if k not in states}
            merged.update(states)
            rows.pop(tid, None)
            rows[tid] = dict(list(merged.items())[-STATES_PER_TARGET:])
        if len(rows) > MAX_TARGETS:
            rows = dict(list(rows.items())[-MAX_TARGETS:])
        try:
            journal.write(self.store.root, self.slot, {
                "zeroconf": VERSION, "rows": {tid: {k: v.as_json() for k, v in states.items()}
                                              for tid, states in rows.items()},
                "last": (served or self.last_run())[-MAX_TARGETS:]})
        except OSError:
            return False  # a store that cannot be written is only slower next time
        self.rows, self.added, self.last = rows, {}, served or self.last_run()
        return True


def held_entry(store, key: str, manifest: dict) -> Held:
    """What the journal holds for `key` served as `manifest` by a full look-up: with its
    identity when `manifest` is the entry file of `key` itself (not another observation
    set's entry) and its record names what its compile read."""
    from ..builder.entries import observed_record

    data = store.entry_bytes(key)
    record = observed_record(store, manifest)
    if data is None or record is None or record.static_key != key or not record.sets:
        return Held(key)
    try:
        if json.loads(data) != manifest:
            return Held(key)
    except ValueError:
        return Held(key)
    observed = tuple((o.kind, o.name, o.digest) for o in record.sets[0].observations)
    fields = {k: v for k, v in manifest.items() if k != "inputs"}
    return Held(key, digest(data), observed, fields)


def checked_entry(store, held: Held, current, expect: dict) -> dict | None:
    """The entry `held` names, when it is the one a full look-up checked and what its
    compile read is unchanged (`current(kind, name)`: a digest now), else None (look it
    up in full). Its file's bytes hash to the digest held: the same bytes `lookup`
    checked (its fields, the facts of its blobs, its record), which name the same blobs
    by their hashes. The binary loaded is verified against its hash when it is read
    (`Store.read_blob`; one that is gone or damaged sends the compile to the full
    look-up, which rebuilds the entry); the others are not read to serve it. The
    observations of its record's newest set still have their digests, as
    `builder.fresh_entry` requires. The entry's fields are the journal's copy of those
    bytes' (the inputs of its key left out), and must name what `expect` asks for (this
    target, signature and arch, this kernel's entry symbol), as a look-up requires."""
    from ..store.manifest import binding_problem

    if held.entry is None or binding_problem(held.fields, expect):
        return None
    data = store.entry_bytes(held.key)
    if data is None or digest(data) != held.entry:
        return None
    for kind, name, found in held.observed:
        if current(kind, name) != found:
            return None
    return dict(held.fields)


def target_id(name: str, text: str, arch: str) -> str:
    """The journal's id of (kernel name, signature text, arch)."""
    return f"{name}\n{text}\n{arch}"


def target_parts(tid: str) -> tuple | None:
    """(name, signature text, arch) of a `target_id`, or None for an id of another shape
    (a journal written by another version)."""
    parts = tuple(tid.split("\n")) if isinstance(tid, str) else ()
    return parts if len(parts) == 3 else None


class LiveDigest:
    """The live digest of one (kernel, types, arch): see the module's docstring. One per
    launch-time compile (values are read as they are now)."""

    def __init__(self, keyer, objects):
        self.keyer, self.objects = keyer, objects
        self._done: dict = {}  # id(dispatcher) -> (dispatcher, its digest) in this walk
        self._stack: list = []

    def of(self, dispatcher, argtypes, text: str, arch: str, backend) -> str:
        """NotVouched (or KeyingError) when the journal cannot vouch for it."""
        from ..keying.keyer import signature_node
        from ..keying.values import canonical

        fn = self.objects.function_of(dispatcher)
        if fn is None or fn.role is not Role.KERNEL:
            raise NotVouched("not a kernel")
        signature = _remembered(_SIGNATURES, text, tuple(argtypes), lambda: signature_node(
            argtypes, text, self.objects).digest)
        toolchain, config = backend.toolchain(), backend.codegen_config()
        slot = _settings_slot(toolchain, config)
        settings = _SETTINGS.get(slot) if slot is not None else None
        if settings is None:
            settings = digest_of(("toolchain", tuple((k, canonical(v)) for k, v in
                                                     toolchain.items()),
                                  tuple((k, canonical(v)) for k, v in config.items())))
            if slot is not None:
                _SETTINGS[slot] = settings
        return digest_of(("zeroconf live", VERSION, self.function(dispatcher, fn), signature,
                          arch, settings))

    def function(self, obj, fn=None) -> str:
        """The digest of a kernel or device function as a compile now would read it
        (`fn`: its `Function`, when the caller has just asked for it)."""
        done = self._done.get(id(obj))
        if done is not None and done[0] is obj:
            return done[1]
        fn = fn or self.objects.function_of(obj)
        if fn is None or fn.role is Role.FUNCTION:
            raise NotVouched("it reaches a jitable or @overload'ed function")
        if any(f is obj for f in self._stack):
            raise NotVouched("recursion")
        py_func = fn.py_func
        where = f"{py_func.__module__}:{py_func.__qualname__}"
        options = fn.options if fn.options is not None else dict(self.objects.options_of(obj))
        self._stack.append(obj)
        try:
            parts = ["code", code_digest(py_func.__code__), "name", py_func.__module__,
                     py_func.__qualname__, fn.role.value, "options",
                     options_digest(self.keyer, options, where)]
            parts += self._references(py_func, where, fn.defaults)
            if py_func.__dict__:  # attributes set on it (`helper.g = 2.0`), as its tree has them
                parts += self._attributes(py_func, where)
        finally:
            self._stack.pop()
        # Every part is a digest, a label or a dotted name: none holds a NUL.
        found = digest("\0".join(parts).encode("utf-8", "surrogateescape"))
        self._done[id(obj)] = (obj, found)
        return found

    def _references(self, py_func, where: str, defaults=None) -> list:
        from ..keying.references import load_chains, referenced_values

        keyer, parts = self.keyer, []
        # The names a code object reads are its own: found once per process (the values
        # they hold now are read below, every time).
        chains = _remembered(_CHAINS, None, (py_func.__code__,),
                             lambda: load_chains(py_func, keyer.sources))
        for kind, name, value in referenced_values(py_func, keyer.sources, self.objects,
                                                   chains, defaults):
            if type(value) in _IMMUTABLE:  # never a callee; its leaf is its value's
                slot = (kind, name, type(value), _exact(value))
                if slot not in _LEAVES:
                    _LEAVES[slot] = self._leaf(kind, name, value, where)
                parts += ["value", *_LEAVES[slot]]
                continue
            fn = keyer.callee(value)
            if fn is not None:
                parts += ["callee", kind.label(name), self.function(value, fn)]
                continue
            parts += ["value", *self._leaf(kind, name, value, where)]
        return parts

    def _attributes(self, py_func, where: str) -> list:
        parts = []
        for node in self.keyer.attribute_nodes(py_func, where):
            if label_kind(node.label) is not LabelKind.ATTRIBUTE:
                raise NotVouched("device functions held in a function's attribute")
            parts += ["attribute", node.label, node.digest]
        return parts

    def _leaf(self, kind, name: str, value, where: str) -> tuple:
        node = self.keyer.value_leaf(kind, name, value, where)
        if node is None:
            raise NotVouched("device functions held in a container")
        return node.label, node.digest


# Values whose leaf is a function of the value alone (its type told apart: 1, 1.0, True).
_IMMUTABLE = frozenset({int, float, complex, str, bytes, bool, type(None), LibraryRef})
_CHAINS: dict = {}  # code object -> the names it reads
_LEAVES: dict = {}  # (kind, name, type, exact value) -> (label, digest) of its leaf
_SIGNATURES: dict = {}  # (text, argument types) -> the signature's digest


_SETTINGS: dict = {}  # the toolchain and codegen settings (`_settings_slot`) -> their digest


def _settings_slot(*found):
    """Settings whose values are all strings, booleans, None or integers (each canonical
    as it is, and encoded by its type and value) as a dictionary key, told apart by
    type (`0`, `False`); None for anything else (digested every time)."""
    out = []
    for items in found:
        for name, value in items.items():
            if not isinstance(value, (str, int, type(None))):
                return None
            out.append((name, type(value), value))
        out.append(None)
    return tuple(out)


def _exact(value):
    """A plain value as a dictionary key that tells apart what `==` does not (0.0, -0.0)."""
    if type(value) is float:
        return value.hex()
    if type(value) is complex:
        return value.real.hex(), value.imag.hex()
    return value


def _remembered(memo: dict, key, objects: tuple, compute):
    """`compute()`, kept in `memo` for the process under `key` and the identities of
    `objects` (immutable: code objects, numba types), checked on the way out: an
    identity decides only when to compute again, never what goes into a digest."""
    slot = (key, *map(id, objects))
    found = memo.get(slot)
    if found is not None and all(a is b for a, b in zip(found[0], objects)):
        return found[1]
    value = compute()
    memo[slot] = (objects, value)
    return value


_PLAIN = (bool, int, float, str, type(None))
_OPTIONS: dict = {}  # options of plain values (by type and value) -> their digest


def options_digest(keyer, options: dict, where: str) -> str:
    """The digest of a function's decorator options, each as the Keyer keys it (`link`
    by its files' bytes); options of plain values are digested once per process."""
    items = sorted((k, v) for k, v in options.items() if k != "cache")
    memo = tuple(_plain(k, v) for k, v in items)
    if None in memo:
        memo = None
    else:
        found = _OPTIONS.get(memo)
        if found is not None:
            return found
    value = digest_of(tuple(keyer.option_leaf(k, v, where).digest for k, v in items))
    if memo is not None:
        _OPTIONS[memo] = value
    return value


def _plain(name: str, value):
    """An option as a dictionary key telling apart every value of another type (`1` and
    `True`), or None: an option read from files (`link`, `extensions`) unless empty, or
    a value of another kind."""
    if name in ("link", "extensions"):
        return (name, type(value).__name__) if type(value) in (list, tuple) and not value \
            else None
    if type(value) in _PLAIN:
        return (name, type(value).__name__, value)
    if type(value) in (list, tuple, set, frozenset) and all(type(v) in _PLAIN for v in value):
        inner = tuple((type(v).__name__, v) for v in value)
        return (name, type(value).__name__,
                frozenset(inner) if type(value) in (set, frozenset) else inner)
    return None


_CODES: dict = {}  # id(code) -> (code, digest): code objects never change


def code_digest(code) -> str:
    """The digest of a code object's marshalled bytes: everything numba compiles from it."""
    found = _CODES.get(id(code))
    if found is not None and found[0] is code:
        return found[1]
    try:
        value = digest(marshal.dumps(code))
    except ValueError:  # a code object marshal cannot write
        raise NotVouched("its code cannot be written down") from None
    _CODES[id(code)] = (code, value)
    return value


def live_digest(keyer, objects, request, text: str, arch: str, backend) -> str | None:
    """The live digest of a launch-time compile, or None when the journal cannot vouch
    for what its key rests on."""
    try:
        return LiveDigest(keyer, objects).of(request.dispatcher, request.argtypes, text,
                                             arch, backend)
    except (NotVouched, KeyingError):
        return None
    except Exception:  # noqa: BLE001 - full keying meets it and says what it is
        return None


__all__ = ["Held", "NotVouched", "ProgramJournal", "checked_entry", "code_digest",
           "enabled_by_environment", "held_entry", "live_digest", "program_identity",
           "target_id", "target_parts"]
