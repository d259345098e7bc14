"""Keying facts kept in the store: what keying computed about functions, by source digest,
and the readable bodies `kbuild explain` diffs.

Layout, under ``v1/facts/<interpreter>-<version>/`` (a new kbuild's keying starts a new
folder, and so does another Python: `ast` parses the same source into other trees from one
Python version to the next, 3.12's `type_params` on every nested `def` or `class`, so one
interpreter's facts are not another's)::

    <source digest>.json       {"source", "table": slot -> facts, "digest"}
    body-<body digest>.json    {"body", "text", "digest"}

Facts only save parsing: a file that is missing, damaged, too large or for another
source reads as empty and is computed again; one that cannot be written is only slower.
A file's mtime is its last use; `prune` drops other kbuild versions' folders and files
unread for a month (another interpreter's too: a store shared by several Pythons keeps
each one's facts while it is used). Reads open regular files only (never a link, FIFO or device).
"""

from __future__ import annotations

import json
import os
import stat
import sys
import time
from functools import lru_cache
from pathlib import Path

from ..keying.encode import digest
from . import tree
from .local import LAYOUT, Store, atomic_write
from .manifest import HEX32

FACTS_MAX_BYTES = 16 << 20  # a facts file is a few KiB per source file; more is not ours
BODY_TEXT_MAX_BYTES = 1 << 20  # a function's source; anything longer is not shown
FACTS_MAX_AGE = 30 * 24 * 3600  # seconds a facts file may go unread before `kbuild gc` drops it


def interpreter() -> str:
    """This Python as facts folders name it: implementation and major.minor
    ("cpython-3.12")."""
    return f"{sys.implementation.name}-{sys.version_info[0]}.{sys.version_info[1]}"


def facts_folder(python: str) -> str:
    """The facts folder of this kbuild's keying under the interpreter `python`."""
    return f"{python}-{_keying_digest()}"


def facts_version() -> str:
    """The facts folder of this kbuild and this interpreter."""
    return facts_folder(interpreter())


@lru_cache(maxsize=1)
def _keying_digest() -> str:
    """Facts are what kbuild's keying code computes: a new kbuild starts a new directory.
    The folder is listed here, not through pathlib, so that the direct-mode recorder sees
    the store listing it (kbuild's own read, no input of the build: a ``__pycache__``
    made there by another process must not send the next no-op to full keying)."""
    keying = Path(__file__).resolve().parent.parent / "keying"
    with os.scandir(keying) as entries:
        names = sorted(e.name for e in entries if e.name.endswith(".py"))
    return digest(b"".join((keying / name).read_bytes() for name in names))[:16]


class KeptFacts:
    """The facts folder of this kbuild version under `root` (a store's ``v1/facts``)."""

    def __init__(self, root):
        self.dir = Path(root) / facts_version()

    def table(self, source: str) -> dict:
        """The facts table kept for `source`, or {} (recomputed) when the file is missing,
        unreadable, too large, nested too deep, not for this source or not matching its
        digest.

        The digest catches damage, not forgery. What the facts could hide is guarded
        apart: the names a function reads are checked against its bytecode
        (`references._load_chains`), and its body's key holds the bytecode fingerprint beside
        the syntax tree digest.
        """
        path = self.dir / f"{source}.json"
        record = _read_json(path, FACTS_MAX_BYTES)
        if not isinstance(record, dict) or record.get("source") != source:
            return {}
        table = record.get("table")
        if not isinstance(table, dict) or record.get("digest") != facts_digest(source, table):
            return {}
        try:
            os.utime(path)  # its last use, for `prune`; a read-only store keeps its times
        except OSError:
            pass
        return table

    def save_table(self, source: str, table: dict) -> None:
        """Write `source`'s table (OSError when the folder cannot be written)."""
        text = json.dumps(_facts_record(source, table), sort_keys=True)
        atomic_write(self.dir / f"{source}.json", text.encode(), self.dir, prefix=".facts.")

    def body_text(self, body_digest: str) -> str | None:
        """The readable source kept for the body keyed as `body_digest`, or None (never
        kept, pruned, unreadable or damaged)."""
        if not HEX32.match(body_digest):
            return None
        record = _read_json(self._body_path(body_digest), BODY_TEXT_MAX_BYTES)
        if not isinstance(record, dict) or record.get("body") != body_digest:
            return None
        text = record.get("text")
        if not isinstance(text, str) or record.get("digest") != facts_digest(body_digest, text):
            return None
        return text

    def save_body_texts(self, renders: dict) -> None:
        """Keep each body's `render()` (body digest -> render) not kept yet; a folder that
        cannot be written keeps none (explain then says the earlier source was not kept)."""
        now = time.time()
        for body, render in sorted(renders.items()):
            path = self._body_path(body)
            if _kept_in_use(path, now):
                continue
            text = render()
            if text is None or len(text) > BODY_TEXT_MAX_BYTES // 2:
                continue
            record = {"body": body, "text": text, "digest": facts_digest(body, text)}
            try:
                atomic_write(path, json.dumps(record).encode(), self.dir, prefix=".facts.")
            except OSError:
                break

    def _body_path(self, body_digest: str) -> Path:
        return self.dir / f"body-{body_digest}.json"


def _facts_record(source: str, table: dict) -> dict:
    """What a facts file holds: the table, the source it describes and a digest over both,
    so a damaged or hand-edited file is recognised and recomputed (see `KeptFacts.table`)."""
    return {"source": source, "table": table, "digest": facts_digest(source, table)}


def facts_digest(source: str, table) -> str:
    """The digest a facts file (or a kept body text: `table` its text) carries over what it
    holds: a damaged or truncated file is recognised."""
    return digest(json.dumps([source, table], sort_keys=True).encode("utf-8"))


def _read_json(path: Path, limit: int):
    """The JSON in `path`, or None when it is missing, not a regular file, larger than
    `limit`, or not JSON a parser can read."""
    try:
        data = _read_regular_file(path, limit)
        return json.loads(data) if data is not None else None
    except (OSError, ValueError, RecursionError):
        return None


def _read_regular_file(path: Path, limit: int) -> bytes | None:
    """The bytes of `path` if it is a regular file (not a link, FIFO or device: those are
    never opened to block or to be followed) of at most `limit` bytes, else None."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        with os.fdopen(fd, "rb", closefd=False) as fh:
            data = fh.read(limit + 1)
    finally:
        os.close(fd)
    return data if len(data) <= limit else None


def _kept_in_use(path: Path, now: float) -> bool:
    """Whether a body's text is kept; if so, marked as in use (for `prune`) once a day, so
    a function unchanged for months still has its text when it is first edited. A stat per
    function body and build; a write only once a day."""
    try:
        if now - path.stat().st_mtime > 24 * 3600:
            os.utime(path)
        return True
    except OSError:
        return False


def prune(store: Store, max_age: float = FACTS_MAX_AGE) -> int:
    """Remove the keying facts of other kbuild versions, and facts unread for `max_age`
    seconds (this kbuild's under any interpreter: another Python's are its own, and
    kept while it uses them), walking v1/facts without following a link (a link is
    removed as the link it is); return how many files went. Facts only save parsing: one
    removed too soon costs a parse."""
    removed, oldest = 0, time.time() - max_age
    for folder, info in tree.listing(store.root, f"{LAYOUT}/facts"):
        rel = f"{LAYOUT}/facts/{folder}"
        if not stat.S_ISDIR(info.st_mode):
            removed += store.folder.remove(rel)
            continue
        ours = _this_kbuilds(folder)
        for name, finfo in tree.listing(store.root, rel):
            if not ours or finfo.st_mtime < oldest or stat.S_ISLNK(finfo.st_mode):
                removed += store.folder.remove(f"{rel}/{name}")
        if folder != facts_version() and not store.read_only:
            try:
                with tree.opened_dir(store.root, [LAYOUT, "facts"]) as fd:
                    os.rmdir(folder, dir_fd=fd)
            except OSError:
                pass  # another interpreter's facts still in use
    return removed


def _this_kbuilds(folder: str) -> bool:
    """Whether `folder` holds this kbuild's facts (under any interpreter)."""
    python, _, version = folder.rpartition("-")
    return bool(python) and version == _keying_digest()
