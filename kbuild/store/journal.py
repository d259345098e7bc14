"""The journal on disk: what a project's last full keying read, kept in the store.

`direct` decides with it (is anything it names changed?); this module only reads and
writes the file, and says why one cannot be used.

Layout, one file per project (named by the project's name and its file's name, not its
path: a checkout restored elsewhere, with the store, finds its journal)::

    STORE/v1/journal/<slot>.json

The file is a header line and a body. The header is JSON: the format, its version, the
xxh3-128 digest of the body's bytes and when it was written. The body is JSON too, and
is checked against the digest before it is parsed: a damaged, truncated, oversized or
foreign file (or one of another version) is a miss with a warning, never a crash; the
next full keying writes a new one. Writes are atomic (a temp file and a rename), like
every write in the store. The file's own mtime is the reference for the racy rule
(`direct`): it is the file system's clock, the same one that stamps the files the
journal names.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass

from ..keying.encode import digest
from . import tree
from .layout import LAYOUT

FORMAT = "kbuild journal"
JOURNAL_VERSION = 1
MAX_BYTES = 64 << 20  # a journal of 1,024 targets is about 1 MB
_FOLDER = f"{LAYOUT}/journal"


class JournalProblem(Exception):
    """Why a journal file cannot be used (its text says so); the build keys in full."""


@dataclass(frozen=True)
class Journal:
    """A journal read back: its body (verified against the header's digest) and the
    identity (`tree.identity`) of the file it came from, whose mtime the racy rule uses."""

    body: dict
    file: list  # [dev, inode, size, mtime_ns, ctime_ns] of the journal file
    written_ns: int

    @property
    def mtime_ns(self) -> int:
        return self.file[3]


def slot(project_name: str, config_name: str) -> str:
    """The journal's name for a project: its name and its file's name (kbuild.toml or
    pyproject.toml), never its path."""
    return digest(json.dumps(["journal", project_name, config_name]).encode())


def journal_relpath(name: str) -> str:
    return f"{_FOLDER}/{name}.json"


def read(root, name: str) -> Journal | None:
    """The journal `name` under store `root`; None when there is none; JournalProblem
    when there is one that cannot be used."""
    try:
        data, info = tree.read_file(root, journal_relpath(name), MAX_BYTES)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        raise JournalProblem(f"cannot be read ({getattr(exc, 'strerror', None) or exc})") \
            from None
    head, newline, body = data.partition(b"\n")
    try:
        header = json.loads(head)
    except ValueError:
        raise JournalProblem("its header is not JSON") from None
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise JournalProblem("it is not a kbuild journal")
    if header.get("version") != JOURNAL_VERSION:
        raise JournalProblem(f"it has version {str(header.get('version'))[:20]}, "
                             f"not {JOURNAL_VERSION}")
    if not newline or header.get("digest") != digest(body):
        raise JournalProblem("it is damaged (its body does not match its digest)")
    try:
        parsed = json.loads(body)
    except (ValueError, RecursionError):
        raise JournalProblem("its body is not JSON") from None
    written = header.get("written_ns")
    if not isinstance(parsed, dict) or not isinstance(written, int):
        raise JournalProblem("its body is not a journal")
    return Journal(parsed, tree.identity(info), written)


def write(root, name: str, body: dict) -> None:
    """Write journal `name` (atomically); OSError when the store cannot be written."""
    text = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    header = json.dumps({"format": FORMAT, "version": JOURNAL_VERSION, "digest": digest(text),
                         "written_ns": time.time_ns()}, sort_keys=True).encode()
    tree.write_atomic(root, journal_relpath(name), header + b"\n" + text, f"{LAYOUT}/tmp",
                      0o666 & ~_umask(), prefix=".journal.")


def remove(root, name: str) -> bool:
    try:
        return tree.remove(root, journal_relpath(name))
    except OSError:
        return False


def prune(root, max_age: float, now: float | None = None) -> int:
    """Remove journals unread and unwritten for `max_age` seconds (projects gone)."""
    oldest = (time.time() if now is None else now) - max_age
    removed = 0
    for name, info in tree.listing(root, _FOLDER):
        if info.st_mtime < oldest or not name.endswith(".json"):
            try:
                removed += tree.remove(root, f"{_FOLDER}/{name}")
            except OSError:
                break
    return removed


def _umask() -> int:
    mask = os.umask(0o077)
    os.umask(mask)
    return mask
