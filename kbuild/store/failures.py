"""Failed compiles, remembered by target key, so an unchanged target fails at once.

Layout::

    STORE/v1/failures/ab/<target key>.json

A record is small JSON (never pickle): the target it failed for, the error
(its first `MAX_ERROR` characters), the time limit when the compile was
stopped for its time, and what the compile had read (observation rows, as
`keying.observed` writes them), which the build checks still hold before it
reuses the failure. A record is bound to its key and target like an entry;
one that is unreadable, malformed, too large or for another target is a miss
with a warning (the target compiles again), never a crash and never a reason
to launch anything. A record holds no blob, so it never keeps one alive.
"""

from __future__ import annotations

import json
import math
import stat
import time
from dataclasses import dataclass

from . import tree
from .local import LAYOUT, Store
from .manifest import HEX32, EntryProblem, load_json

# 2: a failure records the type classes typing asked whether a type converts or unifies
# (a record of 1 may lack them: it is dropped, and the target compiles again).
FAILURE_SCHEMA = 2
MAX_ERROR = 16 << 10  # characters of an error message kept
MAX_RECORD = 4 << 20  # bytes of a record read at most
MAX_OBSERVED = 20000  # observation rows (keying.observed.MAX_OBSERVATIONS)
_FOLDER = f"{LAYOUT}/failures"


@dataclass(frozen=True)
class Failure:
    """One target's failed compile."""

    target: str
    signature: str
    arch: str
    error: str
    observed: tuple  # ((kind, name, digest), ...): what the compile had read
    limit: float | None = None  # the time limit it was stopped at; None: it failed by itself
    seconds: float = 0.0
    project: str | None = None


def failure_relpath(key: str) -> str:
    return f"{_FOLDER}/{key[:2]}/{key}.json"


def remember(store: Store, key: str, failure: Failure) -> None:
    """Write `failure` as `key`'s record (atomically; it replaces an older one)."""
    if store.read_only or not HEX32.match(key) or len(failure.observed) > MAX_OBSERVED:
        return  # more observations than a record keeps: cutting them would be unsound
    record = {"schema": FAILURE_SCHEMA, "key": key, "target": failure.target,
              "signature": failure.signature, "arch": failure.arch,
              "error": failure.error[:MAX_ERROR], "limit": failure.limit,
              "seconds": round(failure.seconds, 4), "project": failure.project,
              "observed": [list(row) for row in failure.observed],
              "failed_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    store.folder.write(failure_relpath(key), json.dumps(record, sort_keys=True).encode())


def recorded(store: Store, key: str, expect: dict) -> Failure | None:
    """`key`'s failure record for the target `expect` names (target, signature, arch),
    or None: none, or one not accepted (removed, with a warning)."""
    if not HEX32.match(key) or tree.lstat(store.root, failure_relpath(key)) is None:
        return None
    try:
        data, _ = tree.read_file(store.root, failure_relpath(key), MAX_RECORD)
        failure = _parse(key, load_json(data.decode("utf-8"), "failure record", MAX_RECORD))
    except _Outdated:  # made by an earlier kbuild: compiled again, with no warning
        forget(store, key)
        return None
    except (OSError, UnicodeDecodeError, EntryProblem) as exc:
        problem = getattr(exc, "strerror", None) or str(exc)
        store.warnings.append(f"failure record {key} is corrupt ({problem}); compiling again")
        forget(store, key)
        return None
    bound = (failure.target, failure.signature, failure.arch) == \
        (expect.get("target"), expect.get("signature"), expect.get("arch"))
    return failure if bound else None


def forget(store: Store, key: str) -> None:
    """Remove `key`'s failure record, if there is one (a build of the key succeeded)."""
    if HEX32.match(key):
        store.folder.remove(failure_relpath(key))


def remove_records(store: Store, project: str | None = None) -> int:
    """Remove the failure records of `project` (None: every one); how many went.
    A record that cannot be read goes too: it could be anyone's."""
    removed = 0
    for rel, info in _files(store):
        failure_project = None if project is None else _project_of(store, rel)
        if project is None or failure_project in (project, False):
            removed += store.folder.remove(rel)
    return removed


def prune(store: Store, max_age: float) -> int:
    """Remove records older than `max_age` seconds, and anything in the folder that is
    not a record file (a link, a folder): a failure recorded long ago compiles again."""
    oldest, removed = time.time() - max_age, 0
    for rel, info in _files(store, everything=True):
        if not stat.S_ISREG(info.st_mode) or info.st_mtime < oldest:
            removed += store.folder.remove(rel)
    return removed


def _files(store: Store, everything: bool = False):
    """(relative path, lstat) of the record files (`everything`: all entries) in the folder."""
    for folder, info in tree.listing(store.root, _FOLDER):
        if not stat.S_ISDIR(info.st_mode):
            if everything:
                yield f"{_FOLDER}/{folder}", info
            continue
        for name, finfo in tree.listing(store.root, f"{_FOLDER}/{folder}"):
            if everything or (stat.S_ISREG(finfo.st_mode) and name.endswith(".json")):
                yield f"{_FOLDER}/{folder}/{name}", finfo


def _project_of(store: Store, rel: str):
    """A record's project name (None when it has none), or False when it cannot be read."""
    try:
        data, _ = tree.read_file(store.root, rel, MAX_RECORD)
        raw = load_json(data.decode("utf-8"), "failure record", MAX_RECORD)
        return raw.get("project") if isinstance(raw, dict) else False
    except (OSError, UnicodeDecodeError, EntryProblem):
        return False


class _Outdated(EntryProblem):
    """A record of an earlier schema."""


def _parse(key: str, raw) -> Failure:
    """The record `raw` for `key`, checked field by field; EntryProblem otherwise."""
    schema = raw.get("schema") if isinstance(raw, dict) else None
    if type(schema) is int and 1 <= schema < FAILURE_SCHEMA:
        raise _Outdated(f"a record of schema {schema}")
    if not isinstance(raw, dict) or raw.get("schema") != FAILURE_SCHEMA:
        raise EntryProblem("not a failure record of a known schema")
    if raw.get("key") != key:
        raise EntryProblem(f"it names key {str(raw.get('key'))[:40]!r}")
    strings = [raw.get(f) for f in ("target", "signature", "arch", "error")]
    if not all(isinstance(s, str) for s in strings):
        raise EntryProblem("target, signature, arch and error must be strings")
    limit, seconds = raw.get("limit"), raw.get("seconds", 0.0)
    if limit is not None and not _positive(limit) or not _number(seconds):
        raise EntryProblem("limit and seconds must be positive numbers")
    observed = raw.get("observed")
    if not isinstance(observed, list) or len(observed) > MAX_OBSERVED or not all(
            isinstance(row, list) and len(row) == 3 and all(isinstance(f, str) for f in row)
            for row in observed):
        raise EntryProblem("observed must be a list of [kind, name, digest] strings")
    project = raw.get("project")
    return Failure(*strings[:3], error=strings[3][:MAX_ERROR],
                   observed=tuple(tuple(row) for row in observed),
                   limit=float(limit) if limit is not None else None, seconds=float(seconds),
                   project=project if isinstance(project, str) else None)


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) \
        and math.isfinite(value) and value >= 0


def _positive(value) -> bool:
    return _number(value) and value > 0
