"""The content-addressed store: verified blobs and JSON entry files, nothing else.

Layout (the version is in the path; an unknown layout is never read)::

    STORE/CACHEDIR.TAG
    STORE/v1/blobs/ab/cd/<xxh3-128 of the bytes>
    STORE/v1/entries/ab/<target key>.json
    STORE/v1/locks/  STORE/v1/tmp/  STORE/v1/facts/  STORE/v1/failures/ (see `failures`)

(paths and the root check in `layout`, the ledger in `ledger`; both importable from here)

`Store` is the façade the rest of kbuild opens: it composes the store's folder
(`folder.StoreFolder`: trust, claim, layout, locks, every write and removal), its
blob shelf (`blobs.BlobShelf`) and its entries (`entries.EntryShelf`), and removes
the blobs no entry names (the one job that needs both shelves).

Blobs are written first, the entry file last (its rename is the commit). The
entry files are the only truth: there is no index beside them that could
disagree or name a file to delete. Everything below the root is read and
written through `tree` (no link followed, no FIFO or device opened, reads
capped), and nothing is pickled: manifests are JSON with a schema version.

An entry is accepted only when it is bound to what asked for it (see
`manifest`): it names its key and the target, signature and arch the caller
expects, and its PTX and cubin say the same arch and define its entry symbol.
What a blob says is read once per process (verified digest and facts cached
by the file's identity), so a no-op build pays it once.
"""

from __future__ import annotations

from .blobs import BlobShelf, CorruptBlob
from .entries import EntryShelf
from .folder import StoreFolder
from .layout import (LAYOUT, MAX_BLOB, atomic_write, blob_relpath, entry_relpath,
                     store_root_problem)
from .ledger import LEDGER_FIELDS, Ledger
from .manifest import MANIFEST_SCHEMA, is_object, is_output, is_target

__all__ = ["LAYOUT", "LEDGER_FIELDS", "MANIFEST_SCHEMA", "MAX_BLOB", "CorruptBlob", "Ledger",
           "Store", "atomic_write", "blob_relpath", "entry_relpath", "is_object", "is_output",
           "is_target", "store_root_problem"]


class Store:
    """One store directory. `warnings` collects problems healed along the way.

    It knows nothing of remote caches: `storage.Storage` is this store with the remote
    tier behind it (what commands, zero-config and `Project.load` open). `ledger` (a
    `Ledger`, None until `keep_ledger` starts one) is told every entry and blob the store
    verified or wrote. Its three parts: `folder`, `blob_shelf`, `entry_shelf`.
    """

    def __init__(self, root, *, read_only: bool = False):
        self.folder = StoreFolder(root, read_only=read_only)
        self.blob_shelf = BlobShelf(self.folder)
        self.entry_shelf = EntryShelf(self.folder, self.blob_shelf)
        self.root, self.base, self.read_only = self.folder.root, self.folder.base, read_only
        self.warnings = self.folder.warnings  # one list, the folder's, filled by all three
        self.damage = self.entry_shelf.damage  # key -> what was wrong with its entry, as found

    @property
    def ledger(self) -> Ledger | None:
        """What this store verified or wrote since `keep_ledger` (None before)."""
        return self.folder.ledger

    # -- the folder ---------------------------------------------------------

    def check_root(self) -> None:
        """Fail at once, creating nothing, when the store path or a parent is not a directory."""
        self.folder.check_root()

    def trust(self) -> None:
        """Fail unless the store's folders are the user's or trusted (`StoreFolder.trust`)."""
        self.folder.trust()

    def claim(self) -> None:
        """Fail, creating nothing, unless the root is kbuild's to write (`StoreFolder.claim`)."""
        self.folder.claim()

    def exists(self) -> bool:
        """Whether the store has been made (its layout folder is there)."""
        return self.folder.exists()

    def ensure_writable(self) -> None:
        """Create the layout, or fail clearly before any compile work starts."""
        self.folder.ensure_writable()

    def close(self) -> None:
        """Nothing stays open between calls; kept for callers that close what they open."""

    def keep_ledger(self) -> Ledger:
        """The ledger of what this store verifies or writes from now on (started once)."""
        return self.folder.keep_ledger()

    def tier_counts(self) -> dict:
        """What tiers behind the store did since the last call (`remote_*` fields): none
        here (see `storage.Storage`)."""
        return {}

    def shared(self):
        """Held by a build: gc and clean wait until it ends."""
        return self.folder.shared()

    def exclusive(self, what: str = "gc"):
        """Held by gc and clean: builds wait until it ends."""
        return self.folder.exclusive(what)

    # -- blobs --------------------------------------------------------------

    def blob_path(self, name: str):
        """Where blob `name`'s file is."""
        return self.blob_shelf.path(name)

    def put_blob(self, data: bytes) -> str:
        """Store `data` under its digest (deduplicated) and return the digest."""
        return self.blob_shelf.put(data)

    def has_blob(self, name: str) -> bool:
        """Whether a well-named regular file holds blob `name` (its bytes unread)."""
        return self.blob_shelf.has(name)

    def read_blob(self, name: str, size: int | None = None) -> bytes:
        """The blob's bytes, verified (`BlobShelf.read`: a corrupt one raises `CorruptBlob`)."""
        return self.blob_shelf.read(name, size)

    def read_record(self, name: str, size: int | None = None) -> bytes:
        """An observation record blob's bytes, verified, read once per process."""
        return self.blob_shelf.read_record(name, size)

    def blob_names(self):
        """Every well-named regular blob file, found without following a link."""
        return self.blob_shelf.names()

    def blob_size(self, name: str) -> int:
        """The bytes blob `name`'s file takes (0: no such regular file)."""
        return self.blob_shelf.file_size(name)

    def remove_blob(self, name: str) -> bool:
        """Remove blob `name`'s file; whether it was removed."""
        return self.blob_shelf.remove(name)

    def size(self) -> tuple[int, int]:
        """(number of blobs, their total bytes)."""
        return self.blob_shelf.total()

    # -- entries ------------------------------------------------------------

    def entry_path(self, key: str):
        """Where entry `key`'s file is."""
        return self.entry_shelf.path(key)

    def has_entry(self, key: str) -> bool:
        """Whether a regular file holds entry `key` (unread, unchecked)."""
        return self.entry_shelf.has(key)

    def entry_bytes(self, key: str) -> bytes | None:
        """Entry `key`'s file as stored, unchecked, and marked used; None when absent."""
        return self.entry_shelf.raw(key)

    def entry_field(self, key: str, name: str):
        """Field `name` of entry `key`'s manifest, read without checking the rest, or None."""
        return self.entry_shelf.field(key, name)

    def manifest(self, key: str, expect: dict | None = None) -> dict | None:
        """Entry `key`'s manifest, valid and naming what `expect` holds, or None; its blobs
        are not checked nor the entry marked used (for telling what changed since it)."""
        return self.entry_shelf.manifest(key, expect)

    def lookup(self, key: str, expect: dict | None = None, *, remote: bool = True) -> dict | None:
        """The valid manifest for `key` whose blobs all verify and agree with it, else None;
        `expect` holds fields it must have (target, signature, arch; kind for objects).
        `remote`: whether a tier behind the store may be asked on a miss (`Storage`); a
        local store has none."""
        return self.entry_shelf.lookup(key, expect)

    def artifacts_problem(self, manifest: dict, blobs: dict | None = None) -> str | None:
        """Why the artifacts of `manifest` are not its own, else None (`blobs`: name ->
        bytes from an archive or a remote; others are read from this store)."""
        return self.entry_shelf.artifacts_problem(manifest, blobs)

    def commit(self, key: str, manifest: dict, *, push: bool = True) -> str:
        """Write the manifest (after its blobs) atomically; the text written. `push`:
        whether a tier behind the store is sent it (`Storage`); a local store has none."""
        return self.entry_shelf.commit(key, manifest)

    def remove_entry(self, key: str) -> None:
        """Remove entry `key`'s file (its blobs stay, for gc)."""
        self.entry_shelf.remove(key)

    def entries(self, memo: dict | None = None):
        """(key, manifest) for every valid entry file, in key order (`memo`: see
        `EntryShelf.each`)."""
        return self.entry_shelf.each(memo)

    def last_used(self, key: str) -> float:
        """When entry `key` was last used (its file's mtime; 0.0: no such entry)."""
        return self.entry_shelf.last_used(key)

    # -- both ---------------------------------------------------------------

    def referenced_blobs(self) -> set[str]:
        """Every blob some valid entry names."""
        return {b for _, m in self.entries() for b in m["artifacts"].values()}

    def remove_orphan_blobs(self) -> tuple[int, int]:
        """Remove blobs no entry names; returns (count, bytes)."""
        keep = self.referenced_blobs()
        count = size = 0
        for name in list(self.blob_names()):
            if name not in keep:
                size += self.blob_size(name)
                if self.remove_blob(name):
                    count += 1
        return count, size
