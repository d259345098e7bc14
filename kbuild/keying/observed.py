"""What a compile actually consulted: observation records, full keys, explanations.

The static key (`keyer.Keyer.target_node`) is a fast first check built from the
source. While a target is typed and lowered, the backend (`backend/observe/`)
records every dependency numba resolved - globals and module attributes it froze,
Python functions it interpreted or ran at typing time (device functions,
`@overload*`, `register_jitable`, `@intrinsic`, with the options they were registered
with), the typing templates, lowering implementations and data models it looked up,
environment variables and files read, link files and the headers NVRTC opened for
them - each as (kind, name, digest).

Freshness is two-level, as ccache's manifest mode: under the static key K the
store keeps the last `MAX_SETS` observation sets seen for K; the launchable
entry's key is `full_key(K, [(kind, name, current digest), ...])`. A build is
fresh only if one recorded set, with every name's *current* digest, gives a key
that has an entry. So a changed observation rebuilds, and a constant nobody read
changes nothing.

Pure: no I/O, no numba. The record is data (JSON, versioned, sorted, bounded).
"""

from __future__ import annotations

import enum
import json
import types as pytypes
from dataclasses import dataclass

from . import ctext
from .encode import Unencodable, digest, digest_of
from .interfaces import ObjectModel
from .values import canonical, library_object_form, made_at_import

RECORD_VERSION = 1
MAX_SETS = 8  # observation-name sets remembered per static key
MAX_OBSERVATIONS = 20000  # one compile reading more than this is refused, not truncated
UNKEYABLE = "unkeyable"  # the digest of something read that cannot be keyed by content
MISSING = "missing"  # the digest of a name that no longer resolves (a deleted global, file)


class Kind(str, enum.Enum):
    """What an observation names."""

    # module:attr, a global or module attribute numba froze (a module: by its name and
    # the project code Python runs on it, its own `__getattr__` or a project class)
    GLOBAL = "global"
    BUILTIN = "builtin"  # a name numba resolved in `builtins`
    FUNCTION = "function"  # module:qualname, a Python function numba interpreted
    OVERLOAD = "overload impl"  # module:qualname, an @overload* function run at typing time
    INTRINSIC = "intrinsic"  # module:qualname, an @intrinsic definition run at typing time
    ENV = "env"  # an environment variable read during the compile
    FILE = "file"  # a file opened for reading during the compile
    LINK = "link file"  # a file linked into the target (link=, declare_device)
    HEADER = "header"  # a header NVRTC opened compiling a link file, transitively
    # module:setting, the folders NVRTC searches for headers after numba's and CUDA's, in
    # order (numba's CUDA_NVRTC_EXTRA_SEARCH_PATHS), each by where it is from the root
    INCLUDE_PATH = "include path"
    # ".", the compile's working directory from the root: a path read relative to it (a
    # file, a stat, a folder listed, a header NVRTC looked for there) is found from it
    CWD = "working directory"
    # What a typing or lowering look-up found registered, by what was looked up:
    # `function mod:Span`, `attributes mod:SpanType` (typing templates); `function
    # mod:Span`, `getattr 'lo'`, `setattr 'lo'`, `cast`, `constant`, `model mod:SpanType`
    # (lowering implementations and data models), wherever the project registered them.
    TYPING = "typing"
    LOWERING = "lowering"
    # module:name, a module attribute or module global that Python code running during
    # the compile read by any means (`getattr(mod, computed)`, `globals()[...]`,
    # `importlib.import_module(m).X`, an import inside a helper), by its value.
    READ = "read"
    # What compile-time Python asked the system (backend/oscalls.py): a path stat'ed
    # (`os.path.exists`, `getsize`: absent, a folder, or a file by its bytes), a folder
    # listed (its names), and what no key can hold (a subprocess's output, a C library
    # loaded): such a target cannot be keyed, and fails saying why.
    STAT = "stat"
    LISTING = "listing"
    UNSEEN = "unseen"
    ENVIRON = "environment"  # the whole environment scanned (`os.environ.items()`, a copy)
    # A module compile-time Python asked the import system for (`import m` in a function,
    # `importlib.import_module`, `importlib.util.find_spec`, an optional dependency tried
    # in `try: import m`), by where it is found now: a path from the root, outside it, or
    # nowhere (a module added or removed later changes what the compile took).
    MODULE = "module"
    # module:global, state reached through that global that a compile before this one in
    # the process filled (`keying.made`: a memo, a registry), read by this one. Its
    # digest never changes (what filled it is observed beside it): a build checks
    # instead that a target read filled exactly the holders the compiles ahead of it in
    # its order fill (`read_in_order`), or compiles it again, in order.
    FILLED = "filled"
    # module:qualname, a function whose parameters a call named (`dev(x=1)`): numba bound
    # the call's keywords against its names, which its key (by place) does not hold; by
    # its parameters' names and kinds, as the function that name finds has them now.
    PARAMETERS = "parameters"


FILLED_DIGEST = digest_of(("filled",))  # the digest of every `Kind.FILLED` observation


@dataclass(frozen=True)
class Observation:
    kind: Kind
    name: str
    digest: str

    def as_row(self) -> list:
        return [self.kind.value, self.name, self.digest]


@dataclass(frozen=True)
class ObservationSet:
    """The observations of one compile, and the full key they give with the static key."""

    key: str
    observations: tuple  # (Observation, ...) sorted by (kind, name)

    def names(self) -> tuple:
        return tuple((o.kind, o.name) for o in self.observations)


@dataclass(frozen=True)
class Record:
    """Every observation set recorded for one static key, newest first."""

    static_key: str
    sets: tuple  # (ObservationSet, ...)


def full_key(static_key: str, observations) -> str:
    """The key of the launchable entry: the static key and each observation's digest."""
    rows = tuple(sorted((o.kind.value, o.name, o.digest) for o in observations))
    return digest_of(("observed", RECORD_VERSION, static_key, rows))


def observation_set(static_key: str, observations) -> ObservationSet:
    """One compile's observations (deduplicated and sorted) with their full key."""
    unique = {(o.kind.value, o.name): o for o in observations}
    if len(unique) > MAX_OBSERVATIONS:
        raise ValueError(f"the compile read {len(unique)} dependencies (more than "
                         f"{MAX_OBSERVATIONS})")
    ordered = tuple(unique[k] for k in sorted(unique))
    return ObservationSet(full_key(static_key, ordered), ordered)


def merged(previous: Record | None, static_key: str, newest: ObservationSet) -> Record:
    """`newest` first, then the previous sets for the same static key, at most MAX_SETS."""
    older = () if previous is None or previous.static_key != static_key else previous.sets
    kept = [newest] + [s for s in older if s.key != newest.key]
    return Record(static_key, tuple(kept[:MAX_SETS]))


def unmarked(recorded, filled, own) -> set:
    """The holders of `filled` that a compile which observed `recorded` (Observations) did
    not read filled (no `Kind.FILLED` of theirs), leaving out `own` (what it fills)."""
    return set(filled) - {o.name for o in recorded if o.kind == Kind.FILLED} - set(own)


def read_in_order(recorded, filled, own, record: "Record | None", reads=frozenset()) -> bool:
    """Whether a compile that observed `recorded` (Observations) read filled exactly the
    holders (`Kind.FILLED`) of `filled` (what the compiles ahead of it in a build's order
    fill) that it reads, leaving out `own` (what it fills itself): as a build compiling
    every target in order, in one process, has them.

    A holder read empty leaves no trace, so what a target reads is also taken from
    `reads` (holders it is known to read: a probe) and from the other sets of its
    `record` that observed what `recorded` did alike (its code the same, compiled where
    the holder was filled)."""
    marked = {o.name for o in recorded if o.kind == Kind.FILLED} - set(own)
    if not marked <= filled:
        return False
    missing = unmarked(recorded, filled, own)
    if missing & reads:
        return False
    if not missing or record is None:
        return True
    digests = {(o.kind, o.name): o.digest for o in recorded}
    for other in record.sets:
        names = {o.name for o in other.observations if o.kind == Kind.FILLED}
        if names & missing and all(digests.get((o.kind, o.name), o.digest) == o.digest
                                   for o in other.observations):
            return False
    return True


def unkeyable(observations) -> list:
    """The observations that could not be keyed by content: they fail the target."""
    return [o for o in observations if o.digest.startswith(UNKEYABLE)]


def to_json(record: Record) -> bytes:
    """The record as sorted, compact JSON (the bytes of the `observed` blob)."""
    data = {"version": RECORD_VERSION, "static_key": record.static_key,
            "sets": [{"key": s.key, "observations": [o.as_row() for o in s.observations]}
                     for s in record.sets]}
    return json.dumps(data, sort_keys=True, separators=(",", ":")).encode()


def from_json(data: bytes) -> Record | None:
    """The record in `data`, or None for an unknown version or a malformed record."""
    try:
        raw = json.loads(data)
        if raw.get("version") != RECORD_VERSION or not isinstance(raw.get("static_key"), str):
            return None
        sets = tuple(ObservationSet(s["key"], tuple(_observation(r) for r in s["observations"]))
                     for s in raw["sets"][:MAX_SETS])
    except (ValueError, TypeError, KeyError, AttributeError):
        return None
    if not all(isinstance(s.key, str) for s in sets):
        return None
    return Record(raw["static_key"], sets)


def _observation(row) -> Observation:
    kind, name, digest = row
    if not isinstance(name, str) or not isinstance(digest, str):
        raise TypeError("observation fields are strings")
    return Observation(Kind(kind), name, digest)


def matching_set(record: Record, current, admits=None) -> ObservationSet | None:
    """The newest recorded set whose names all still have the digests they had; where
    another such set reads all of its names and more, that fuller one (and so on).

    `current(kind, name) -> digest` gives a name's digest now; a set's full key
    is recomputed from those, so a set matches only if nothing it read changed. Two
    sets that both match, one reading a part of the other's names, were compiled with
    something unseen between them: chiefly whether another compile had filled the state
    read (what that compile read is handed on with it: `keying.made`). The fuller one
    is the more specific match (a reader compiled while its filler failed, say, is not
    taken once the filler fills again). `admits(set)`, where given, must hold too.
    """
    def holds(recorded: ObservationSet) -> bool:
        now = [Observation(o.kind, o.name, current(o.kind, o.name)) for o in recorded.observations]
        return full_key(record.static_key, now) == recorded.key and \
            (admits is None or admits(recorded))

    def names(recorded: ObservationSet) -> set:
        return {(o.kind, o.name) for o in recorded.observations}

    found = next((recorded for recorded in record.sets if holds(recorded)), None)
    while found is not None:  # only a set reading more names is checked further
        read = names(found)
        fuller = next((recorded for recorded in record.sets
                       if read < names(recorded) and holds(recorded)), None)
        if fuller is None:
            return found
        found = fuller
    return None


def changes(recorded: ObservationSet, current) -> list[str]:
    """Why `recorded` no longer holds: `observed global consts.SCALE changed`, one per name."""
    out = []
    for o in recorded.observations:
        now = current(o.kind, o.name)
        if now != o.digest:
            what = "is gone" if now == MISSING else \
                "can no longer be keyed" if now.startswith(UNKEYABLE) else "changed"
            out.append(f"observed {o.kind.value} {display_name(o.kind, o.name)} {what}")
    return out


def file_digest(kind: Kind, name: str, data: bytes) -> str:
    """The digest of a file observed as `kind` (`FILE`, `LINK`, `HEADER`) holding `data`:
    CUDA C that NVRTC compiles (a header it opened, a `.cu` link file) by its source
    form, whose comments have no words (`ctext`); any other file by its bytes (Python
    reads a comment as it reads the rest)."""
    if by_source_form(kind, name):
        return ctext.source_digest(data)
    return digest(data)


def by_source_form(kind: Kind, name: str) -> bool:
    """Whether a file observed as `kind` is keyed by its CUDA C source form."""
    return kind is Kind.HEADER or (kind is Kind.LINK and ctext.compiled_as_cuda_c(name))


def display_name(kind: Kind, name: str) -> str:
    """Globals read as Python spells them (`lab.consts.SCALE`), functions as `mod:qualname`."""
    return name.replace(":", ".", 1) if kind in (Kind.GLOBAL, Kind.READ) else name


def value_form(value, objects: ObjectModel):
    """What a frozen global's value is keyed by: its content, or for a function, class or
    compiler object (a dispatcher, a declared extern: `ObjectModel.named_form`) its name
    (numba's use of its content is observed on its own). Raises `Unencodable` for
    anything else."""
    if isinstance(value, type) and issubclass(value, enum.Enum):
        # The members numba reads (`Mode.FAST`) are observed one by one; the class gives
        # their names and value types (numba's EnumClass type), not their values.
        members = value.__members__.items()
        return ("enum-class", value.__module__, value.__qualname__,
                tuple((name, type(m.value).__qualname__) for name, m in members))
    try:
        return ("value", canonical(value))
    except Unencodable:
        pass
    library = library_object_form(value)
    if library is not None:
        return library
    named = objects.named_form(value)
    if named is not None:
        return named
    made = made_at_import(value) if isinstance(value, type) else ()
    if made:
        # A namedtuple class: numba types it by its fields and their order, which the
        # call that made it took from wherever (another module, the environment).
        return ("namedtuple", value.__module__, value.__qualname__, made)
    if isinstance(value, (pytypes.FunctionType, pytypes.BuiltinFunctionType, type)):
        return ("named", str(getattr(value, "__module__", "")), value.__qualname__)
    raise Unencodable(value)


def value_digest(value, objects: ObjectModel) -> str:
    """A frozen value's digest; `unkeyable: TYPE` when it has no content-only form."""
    try:
        form = value_form(value, objects)
    except Unencodable:
        return f"{UNKEYABLE}: a {type(value).__module__}.{type(value).__qualname__}"
    if not _names_only(form):
        return digest_of(form)
    found = _NAMED.get(form)
    if found is None:
        if len(_NAMED) >= _NAMED_MAX:
            _NAMED.clear()
        found = _NAMED[form] = digest_of(form)
    return found


# A form of strings only (a dispatcher's, a module's, a function's name) -> its digest,
# for the process: equal such forms encode alike (a number's form is never kept: 0.0 and
# -0.0, 1 and True are equal keys with other encodings). The form itself is made anew
# each time, from the value as it is now.
_NAMED: dict = {}
_NAMED_MAX = 4096


def _names_only(form) -> bool:
    return all(type(part) is str or (type(part) is tuple and _names_only(part))
               for part in form) if type(form) is tuple else False

