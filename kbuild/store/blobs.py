"""The blob shelf: content-addressed bytes under `v1/blobs/ab/cd/<xxh3-128 of the bytes>`.

A blob is written once under its digest (a damaged copy under the right name is
replaced, never trusted by its name) and verified against its name on every read; a
corrupt one is removed and `CorruptBlob` raised. What a blob says (an artifact's
facts, an observation record's bytes) is read once per process while its file stays
the same one (`facts`). Writes and removals go through the store's `folder`.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..artifacts import artifact_facts
from ..keying.encode import digest
from . import blobformat, tree
from .folder import StoreFolder
from .layout import LAYOUT, MAX_BLOB, _regular, blob_relpath
from .manifest import HEX32

_FACTS: dict = {}  # (store, blob name, kind) -> Facts: the blobs this process verified
_RECORD_BYTES = "observation record bytes"  # a `_FACTS` kind: the record itself

__all__ = ["BlobShelf", "CorruptBlob"]


class CorruptBlob(Exception):
    """A blob is missing or its bytes do not match its name."""

    def __init__(self, name: str, state: str, detail: str = ""):
        self.name, self.state, self.detail = name, state, detail
        super().__init__(f"blob {name} is {state}" + (f" ({detail})" if detail else ""))

    def named_by_entry(self) -> str:
        """How an entry naming this blob is described: 'names corrupt blob X (...)'."""
        if self.state.startswith("of "):  # "of an unknown format"
            return f"names blob {self.name}, {self.state}" + \
                (f" ({self.detail})" if self.detail else "")
        return f"names {self.state} blob {self.name}" + (f" ({self.detail})" if self.detail else "")


class BlobShelf:
    """The blobs of the store in `folder` (a `StoreFolder`)."""

    def __init__(self, folder: StoreFolder):
        self.folder = folder
        self.root = folder.root
        self._lengths: dict[str, int] = {}  # blob -> its uncompressed length, as written

    def path(self, name: str) -> Path:
        """Where blob `name`'s file is."""
        return self.folder.base / blob_relpath(name)

    def put(self, data: bytes) -> str:
        """Store `data` under its digest (deduplicated) and return the digest."""
        name = digest(data)
        # A damaged copy under the right name is replaced, not trusted by its name.
        if not self._holds(name, len(data)):
            self.folder.write(f"{LAYOUT}/{blob_relpath(name)}", blobformat.encode(data))
        self._lengths[name] = len(data)
        if self.folder.ledger is not None:
            self.folder.ledger.blob(name, tree.lstat(self.root, f"{LAYOUT}/{blob_relpath(name)}"))
        return name

    def has(self, name: str) -> bool:
        """Whether a well-named regular file holds blob `name` (its bytes unread)."""
        info = HEX32.match(name) and tree.lstat(self.root, f"{LAYOUT}/{blob_relpath(name)}")
        return bool(info) and (info.st_mode & 0o170000) == 0o100000

    def read(self, name: str, size: int | None = None) -> bytes:
        """The blob's bytes, verified; a corrupt blob is removed, reported and `CorruptBlob`
        raised (a missing one only raised)."""
        try:
            return self._read_verified(name, size)
        except CorruptBlob as exc:
            if exc.state in ("corrupt", "unreadable"):
                self.folder.warnings.append(
                    str(exc) + ("" if self.folder.read_only else "; removed"))
            raise

    def _read_verified(self, name: str, size: int | None) -> bytes:
        self.folder.trust()
        if not isinstance(name, str) or not HEX32.match(name):
            raise CorruptBlob(str(name)[:40], "not a blob name", "32 hex digits")
        rel = f"{LAYOUT}/{blob_relpath(name)}"
        cap = MAX_BLOB if size is None else size
        try:
            # An envelope is never longer than the bytes it holds (see blobformat.encode).
            stored, info = tree.read_file(self.root, rel, cap + blobformat.HEADER_SIZE)
        except (FileNotFoundError, NotADirectoryError):
            raise CorruptBlob(name, "missing") from None
        except OSError as exc:
            self.folder.remove(rel)
            raise CorruptBlob(name, "unreadable", str(exc.strerror or exc)) from None
        data = self._unpacked(name, rel, stored, cap)
        if self.folder.ledger is not None:
            self.folder.ledger.blob(name, info)
        return data

    def _unpacked(self, name: str, rel: str, stored: bytes, cap: int) -> bytes:
        """A blob file's bytes (unpacked, see `blobformat`), verified against `name`."""
        try:
            data = blobformat.decode(stored, cap)
        except blobformat.UnknownFormat as exc:
            if len(stored) <= cap and digest(stored) == name:
                return stored  # plain bytes that happen to begin with the envelope's magic
            raise CorruptBlob(name, "of an unknown format", str(exc)) from None
        except blobformat.Malformed:
            data = None
        if data is not None and digest(data) == name:
            return data
        if blobformat.is_packed(stored) and len(stored) <= cap and digest(stored) == name:
            return stored  # as above
        self.folder.remove(rel)
        raise CorruptBlob(name, "corrupt", "its bytes do not match its hash")

    def names(self):
        """Every well-named regular blob file, found without following a link."""
        for name, _ in self.files():
            yield name

    def files(self):
        """(name, stat) of every well-named regular blob file, from the folders' listings."""
        for a, _ in self.folder.subdirs(f"{LAYOUT}/blobs"):
            for b, _ in self.folder.subdirs(f"{LAYOUT}/blobs/{a}"):
                for name, info in tree.listing(self.root, f"{LAYOUT}/blobs/{a}/{b}"):
                    if HEX32.match(name) and name.startswith(a + b) and _regular(info):
                        yield name, info

    def read_record(self, name: str, size: int | None = None) -> bytes:
        """An observation record blob's bytes, verified: read once per process while the
        file stays the same one (a lookup checks it, and freshness then reads it)."""
        return self.facts(name, _RECORD_BYTES, size)

    def facts(self, name: str, kind: str, size: int | None):
        """The facts of blob `name` read as `kind`: verified and parsed once per process
        while the file stays the same one (one lstat: its inode, size and mtime)."""
        try:
            info = os.lstat(self.path(name))
            ident = (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)
        except (OSError, ValueError):
            info = ident = None
        known = _FACTS.get((str(self.root), name, kind))
        if ident is None or known is None or known[0] != ident:
            data = self._read_verified(name, size)
            known = _FACTS[(str(self.root), name, kind)] = (
                ident, data if kind == _RECORD_BYTES else artifact_facts(kind, data))
        elif self.folder.ledger is not None:
            self.folder.ledger.blob(name, info)
        return known[1]

    def _holds(self, name: str, size: int) -> bool:
        """Whether the blob file exists, is regular and matches its name."""
        try:
            stored, _ = tree.read_file(self.root, f"{LAYOUT}/{blob_relpath(name)}",
                                       size + blobformat.HEADER_SIZE)
            return digest(blobformat.decode(stored, size)) == name or digest(stored) == name
        except (OSError, ValueError):
            return False

    def length(self, name: str, info) -> int:
        """The uncompressed length of blob `name` (whose file's stat is `info`)."""
        if name in self._lengths:
            return self._lengths[name]
        try:
            head, _ = tree.read_file(self.root, f"{LAYOUT}/{blob_relpath(name)}", info.st_size)
        except OSError:
            return info.st_size
        found = blobformat.length(head[:blobformat.HEADER_SIZE])
        return info.st_size if found is None else found

    def file_size(self, name: str) -> int:
        """The bytes blob `name`'s file takes (0: no such regular file)."""
        info = tree.lstat(self.root, f"{LAYOUT}/{blob_relpath(name)}")
        return info.st_size if _regular(info) else 0

    def remove(self, name: str) -> bool:
        """Remove blob `name`'s file; whether it was removed."""
        return self.folder.remove(f"{LAYOUT}/{blob_relpath(name)}")

    def total(self) -> tuple[int, int]:
        """(number of blobs, their total bytes): one walk, each size from its folder's
        listing (a stat per blob again would open its three folders once more)."""
        sizes = [info.st_size for _, info in self.files()]
        return len(sizes), sum(sizes)
