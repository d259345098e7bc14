"""The entries: one JSON manifest per key under `v1/entries/ab/<key>.json`.

An entry file is written after its blobs (its rename is the commit) and is the only
truth: nothing beside it could disagree. An entry is served only when it is bound to
what asked for it (see `manifest`) and every blob it names verifies and agrees with it
(`artifacts_problem`); a damaged one is removed, said once (`damage`) and rebuilt. Its
file's mtime is its last use (`kbuild gc` evicts the oldest first). Blobs are read
through the store's `BlobShelf`, writes and removals go through its `folder`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from ..artifacts import RECORD_KIND, BinaryError, artifact_facts
from ..errors import StoreError
from . import tree
from .blobs import BlobShelf, CorruptBlob
from .folder import StoreFolder
from .layout import LAYOUT, _regular, blob_relpath, entry_relpath
from .manifest import (HEX32, MANIFEST_SCHEMA, EntryProblem, artifact_problem, is_output,
                       load_json, manifest_text, parse_manifest)

__all__ = ["EntryShelf"]


class EntryShelf:
    """The entries of the store in `folder`, whose blobs are `blobs`. `damage` holds, by
    key, what was wrong with an entry this process found damaged."""

    def __init__(self, folder: StoreFolder, blobs: BlobShelf):
        self.folder, self.blobs = folder, blobs
        self.root = folder.root
        self.damage: dict[str, str] = {}  # key -> what was wrong with its entry, as found
        self._touched: set[str] = set()  # entries marked used by this process

    def path(self, key: str) -> Path:
        """Where entry `key`'s file is."""
        return self.folder.base / entry_relpath(key)

    def has(self, key: str) -> bool:
        """Whether a regular file holds entry `key` (unread, unchecked)."""
        return _regular(tree.lstat(self.root, f"{LAYOUT}/{entry_relpath(key)}"))

    def raw(self, key: str) -> bytes | None:
        """Entry `key`'s file as stored, unchecked, and marked used (`kbuild gc`); None
        when absent. For a reader that holds the digest of the bytes `lookup` checked
        (the program journal): the same bytes are the same checked entry."""
        found = self._read_entry(key)
        if found is None:
            return None
        self._touch(key)
        return found[0].encode("utf-8")

    def field(self, key: str, name: str):
        """Field `name` of entry `key`'s manifest, read without checking the rest (a
        `lookup` that follows checks everything), or None: absent or unreadable."""
        try:
            data, _ = tree.read_file(self.root, f"{LAYOUT}/{entry_relpath(key)}", 4 << 20)
            found = json.loads(data)
        except (OSError, ValueError, RecursionError):
            return None
        return found.get(name) if isinstance(found, dict) else None

    def manifest(self, key: str, expect: dict | None = None) -> dict | None:
        """Entry `key`'s manifest, valid and naming what `expect` holds, or None; its blobs
        are not checked nor the entry marked used (for telling what changed since it)."""
        found = self._read_entry(key)
        return None if found is None else self._validated(key, found[0], expect)

    def lookup(self, key: str, expect: dict | None) -> dict | None:
        """The entry file is read and checked; its blobs are hashed and their facts read
        (once per process each): a `cached` row is what CI trusts."""
        found = self._read_entry(key)
        if found is None:
            return None
        text, info = found
        manifest = self._validated(key, text, expect)
        if manifest is None:
            return None
        problem = self.artifacts_problem(manifest)
        if problem:
            # An early-cutoff record names a target's blobs: their loss is the target's to
            # report (once); the record just goes. Another problem is said of it too.
            if not (is_output(manifest) and problem.startswith(_BLOB_GONE)):
                self._damaged(key, f"entry {key} ({_named(manifest)[:80]}) {problem}")
            self.remove(key)
            return None
        self._touch(key)
        if self.folder.ledger is not None:
            # Its identity after the touch: the file is the one read, its time is ours.
            try:
                after = os.lstat(self.path(key))
            except OSError:
                after = None
            if after is not None and after.st_ino == info.st_ino and after.st_size == info.st_size:
                self.folder.ledger.entry(key, after, text, manifest)
        return manifest

    def artifacts_problem(self, manifest: dict, blobs: dict | None = None) -> str | None:
        """Why the artifacts of `manifest` are not its own (missing, corrupt, another
        kernel's or arch's), else None. `blobs` (name -> bytes, verified) come from an
        archive or a remote; others are read from this store."""
        sizes = manifest.get("sizes", {})
        for kind, name in sorted(manifest["artifacts"].items()):
            if kind == RECORD_KIND:
                problem = self._record_problem(name, blobs, sizes.get(kind))
                if problem:
                    return problem
                continue
            try:
                if blobs is not None and name in blobs:
                    facts = artifact_facts(kind, blobs[name])
                else:
                    facts = self.blobs.facts(name, kind, sizes.get(kind))
            except CorruptBlob as exc:
                return exc.named_by_entry()
            except BinaryError as exc:
                return f"names a {kind} blob that is not one ({exc})"
            problem = artifact_problem(manifest, kind, facts)
            if problem:
                return f"is corrupt: not its own binary ({problem})"
        return None

    def _record_problem(self, name: str, blobs: dict | None, size: int | None) -> str | None:
        """Why the observation record blob `name` is unusable (missing, corrupt, not bounded
        JSON), else None; what it says is checked by whoever reads it (build.fresh_entry)."""
        try:
            data = blobs[name] if blobs is not None and name in blobs \
                else self.blobs.read_record(name, size)
            record = load_json(data.decode("utf-8"), "observation record")
        except CorruptBlob as exc:
            return exc.named_by_entry()
        except (EntryProblem, UnicodeDecodeError, ValueError) as exc:
            return f"names an observation record that is not one ({exc})"
        return None if isinstance(record, dict) else "names an observation record that is not one"

    def _touch(self, key: str) -> None:
        # The entry file's mtime is its last use: `kbuild gc` evicts the oldest first.
        if key in self._touched:
            return
        self._touched.add(key)
        self.folder.touch(f"{LAYOUT}/{entry_relpath(key)}")

    def commit(self, key: str, manifest: dict) -> str:
        """Write the manifest (after its blobs) atomically; the text written. It records
        each blob's size, so a later read never reads more."""
        manifest = {k: v for k, v in manifest.items() if k != "hmac"}
        sizes = {}
        for kind, name in manifest["artifacts"].items():
            info = tree.lstat(self.root, f"{LAYOUT}/{blob_relpath(name)}") \
                if HEX32.match(name) else None
            if not _regular(info):
                raise StoreError(f"internal error: committing {key} before blob {name}")
            # The blob's own length, not its file's: what a read (here or from a remote,
            # which holds it unpacked) may return.
            sizes[kind] = self.blobs.length(name, info)
        manifest = dict(manifest, schema=MANIFEST_SCHEMA, key=key, sizes=sizes)
        text = manifest_text(manifest)
        self.folder.write(f"{LAYOUT}/{entry_relpath(key)}", text.encode())
        if self.folder.ledger is not None:
            info = tree.lstat(self.root, f"{LAYOUT}/{entry_relpath(key)}")
            if info is not None:
                self.folder.ledger.entry(key, info, text, manifest)
        return text

    def remove(self, key: str) -> None:
        """Remove entry `key`'s file (its blobs stay, for gc)."""
        self.folder.remove(f"{LAYOUT}/{entry_relpath(key)}")

    def each(self, memo: dict | None = None):
        """(key, manifest) for every valid entry file, in key order.

        `memo`, a dict the caller keeps between calls, spares reading again the files
        read before: by the file's identity, as blob facts are (a commit replaces the
        file, and a touch changes its time, so either is read again)."""
        self.folder.trust()
        for fan, _ in self.folder.subdirs(f"{LAYOUT}/entries"):
            for name, info in tree.listing(self.root, f"{LAYOUT}/entries/{fan}"):
                key = name[:-5]
                if not (name.endswith(".json") and HEX32.match(key) and key.startswith(fan)):
                    continue
                ident = (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns)
                if memo is not None and memo.get(key, (None,))[0] == ident:
                    yield key, memo[key][1]
                    continue
                text = self._read_entry_file(key)
                manifest = self._validated(key, text, None) if text is not None else None
                if manifest is not None:
                    if memo is not None:
                        memo[key] = (ident, manifest)
                    yield key, manifest

    def last_used(self, key: str) -> float:
        """When entry `key` was last used (its file's mtime; 0.0: no such entry)."""
        info = tree.lstat(self.root, f"{LAYOUT}/{entry_relpath(key)}")
        return info.st_mtime if info else 0.0

    # -- reading one entry ----------------------------------------------------

    def _damaged(self, key: str, problem: str) -> None:
        if key not in self.damage:  # warned once per process, however often it is asked
            self.folder.warnings.append(f"{problem}; rebuilding")
        self.damage[key] = problem

    def _read_entry_file(self, key: str) -> str | None:
        found = self._read_entry(key)
        return None if found is None else found[0]

    def _read_entry(self, key: str):
        """(text, stat) of entry `key`'s file, or None (absent; damaged ones are removed)."""
        self.folder.trust()
        if not HEX32.match(key):
            return None
        try:
            data, info = tree.read_file(self.root, f"{LAYOUT}/{entry_relpath(key)}",
                                        4 << 20)
            return data.decode("utf-8"), info
        except (FileNotFoundError, NotADirectoryError):
            return None
        except tree.NotPlain as exc:
            self._damaged(key, f"entry {key} is corrupt ({exc.strerror})")
            self.remove(key)
            return None
        except (OSError, UnicodeDecodeError) as exc:
            reason = getattr(exc, "strerror", None) or exc
            self._damaged(key, f"entry {key} is unreadable ({reason})")
            self.remove(key)
            return None

    def _validated(self, key: str, text: str, expect: dict | None) -> dict | None:
        try:
            return parse_manifest(key, text, expect)
        except EntryProblem as exc:
            self._damaged(key, f"entry {key} is corrupt ({exc})")
            self.remove(key)
            return None


_BLOB_GONE = ("names missing blob", "names corrupt blob", "names unreadable blob")


def _named(manifest: dict) -> str:
    """What an entry is of, for a warning: its target, object's function, or record's kernel."""
    if is_output(manifest):
        return f"early-cutoff record of {manifest.get('entry')}"
    return str(manifest.get("target") or manifest.get("function"))
