"""The content-addressed store: verified blobs and JSON entry files, nothing else.

Layout (the version is in the path; an unknown layout is never read)::

    STORE/CACHEDIR.TAG
    STORE/v1/blobs/ab/cd/<xxh3-128 of the bytes>
    STORE/v1/entries/ab/<target key>.json
    STORE/v1/locks/  STORE/v1/tmp/  STORE/v1/facts/  STORE/v1/failures/ (see `failures`)

(paths and the root check in `layout`, the ledger in `ledger`; both importable from here)

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

import errno
import fcntl
import json
import os
import tempfile
from pathlib import Path

from ..artifacts import RECORD_KIND, BinaryError, artifact_facts
from ..errors import StoreError
from ..keying.encode import digest
from . import blobformat, tree
from .layout import (_CACHEDIR_TAG, LAYOUT, MAX_BLOB, _regular, _umask, atomic_write,
                     blob_relpath, entry_relpath, store_root_problem)
from .ledger import LEDGER_FIELDS, Ledger
from .locks import StoreLock
from .trust import check_owner
from .manifest import (HEX32, MANIFEST_SCHEMA, EntryProblem, artifact_problem, is_object,
                       manifest_text,
                       is_output, is_target, load_json, parse_manifest)

_LAYOUT_DIRS = ("blobs", "entries", "tmp")
_FACTS: dict = {}  # (store, blob name, kind) -> Facts: the blobs this process verified
_RECORD_BYTES = "observation record bytes"  # a `_FACTS` kind: the record itself

__all__ = ["LAYOUT", "LEDGER_FIELDS", "MANIFEST_SCHEMA", "MAX_BLOB", "CorruptBlob", "Ledger",
           "Store", "atomic_write", "blob_relpath", "entry_relpath", "is_object", "is_output",
           "is_target", "store_root_problem"]


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


class Store:
    """One store directory. `warnings` collects problems healed along the way.

    It knows nothing of remote caches: `storage.Storage` is this store with the remote
    tier behind it (what commands, zero-config and `Project.load` open). `ledger` (a
    `Ledger`, None until `keep_ledger` starts one) is told every entry and blob the store
    verified or wrote.
    """

    ledger: Ledger | None = None

    def __init__(self, root, *, read_only: bool = False):
        self.root = Path(root)
        self.base = self.root / LAYOUT
        self.read_only = read_only
        self.warnings: list[str] = []
        self.damage: dict[str, str] = {}  # key -> what was wrong with its entry, as found
        self.lock = StoreLock(self.root)
        self._cannot_write: str | None = None
        self._touched: set[str] = set()  # entries marked used by this process
        self._claimed = False  # the root was checked to be kbuild's to write
        self._trusted = False  # the root was checked to be the user's (see `trust`)
        self._lengths: dict[str, int] = {}  # blob -> its uncompressed length, as written

    # -- set-up -------------------------------------------------------------

    def check_root(self) -> None:
        """Fail at once, creating nothing, when the store path or a parent is not a directory."""
        for path in (self.root, *self.root.parents):
            if path.exists():
                if not path.is_dir():
                    raise StoreError(
                        f"store {self.root} is not writable ({path} is not a directory); "
                        "pass --store DIR or set KBUILD_STORE to a writable directory")
                return

    def trust(self) -> None:
        """Fail unless the store's folders are the user's or root's, or the user trusts
        them (`trust.check_owner`). Every read of an entry or a blob, and every write,
        passes here first; once per store object that finds them so."""
        if not self._trusted:
            check_owner(self.root, LAYOUT)
            self._trusted = self.root.exists()

    def claim(self) -> None:
        """Fail, creating nothing, unless the root is kbuild's to write: absent, empty, or
        marked as a store (see `store_root_problem`). Everything that creates or removes
        files in the store (a build, gc, clean, import, a remote's fill) passes here first."""
        self.trust()
        if self._claimed or self.read_only:
            return
        problem = store_root_problem(self.root)
        if problem:
            raise StoreError(f"store {self.root} is not kbuild's to write ({problem}); "
                             "use a fresh folder, or one that already has kbuild's "
                             "CACHEDIR.TAG, for --store, KBUILD_STORE or [project] store")
        self._claimed = True

    def exists(self) -> bool:
        """Whether the store has been made (its layout folder is there)."""
        return tree.plain_dir(self.root, LAYOUT)

    def ensure_writable(self) -> None:
        """Create the layout, or fail clearly before any compile work starts. A layout
        folder that is a link (or a file) is removed and made again: the tree is kbuild's."""
        self.claim()
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            for sub in _LAYOUT_DIRS:
                rel = f"{LAYOUT}/{sub}"
                if not tree.plain_dir(self.root, rel):
                    if tree.lstat(self.root, rel) is not None:
                        self.warnings.append(f"store {self.root}: {rel} was not a plain "
                                             "directory (a link?); replaced it")
                        tree.remove(self.root, rel)
                    with tree.opened_dir(self.root, rel.split("/"), create=True):
                        pass
            if tree.lstat(self.root, "CACHEDIR.TAG") is None:
                self._write("CACHEDIR.TAG", _CACHEDIR_TAG)
            probe = tempfile.NamedTemporaryFile(dir=self.base / "tmp", delete=True)
            probe.close()
        except OSError as exc:
            raise StoreError(
                f"store {self.root} is not writable ({exc.strerror or exc}); "
                "pass --store DIR or set KBUILD_STORE to a writable directory") from None

    def close(self) -> None:
        """Nothing stays open between calls; kept for callers that close what they open."""

    def keep_ledger(self) -> Ledger:
        """The ledger of what this store verifies or writes from now on (started once)."""
        if self.ledger is None:
            self.ledger = Ledger()
        return self.ledger

    def tier_counts(self) -> dict:
        """What tiers behind the store did since the last call (`remote_*` fields): none
        here (see `storage.Storage`)."""
        return {}

    def shared(self):
        """Held by a build: gc and clean wait until it ends. A store that cannot be
        written has no lock file and needs none (gc cannot delete from it either)."""
        self.claim()
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError:
            pass
        return self.lock.hold(fcntl.LOCK_SH, "the build", optional=True)

    def exclusive(self, what: str = "gc"):
        """Held by gc and clean: builds wait until it ends."""
        self.claim()
        return self.lock.hold(fcntl.LOCK_EX, what)

    # -- blobs --------------------------------------------------------------

    def blob_path(self, name: str) -> Path:
        return self.base / blob_relpath(name)

    def put_blob(self, data: bytes) -> str:
        """Store `data` under its digest (deduplicated) and return the digest."""
        name = digest(data)
        # A damaged copy under the right name is replaced, not trusted by its name.
        if not self._holds(name, len(data)):
            self._write(f"{LAYOUT}/{blob_relpath(name)}", blobformat.encode(data))
        self._lengths[name] = len(data)
        if self.ledger is not None:
            self.ledger.blob(name, tree.lstat(self.root, f"{LAYOUT}/{blob_relpath(name)}"))
        return name

    def has_blob(self, name: str) -> bool:
        info = HEX32.match(name) and tree.lstat(self.root, f"{LAYOUT}/{blob_relpath(name)}")
        return bool(info) and (info.st_mode & 0o170000) == 0o100000

    def read_blob(self, name: str, size: int | None = None) -> bytes:
        """The blob's bytes, verified; a corrupt blob is removed, reported and `CorruptBlob`
        raised (a missing one only raised)."""
        try:
            return self._read_verified(name, size)
        except CorruptBlob as exc:
            if exc.state in ("corrupt", "unreadable"):
                self.warnings.append(str(exc) + ("" if self.read_only else "; removed"))
            raise

    def _read_verified(self, name: str, size: int | None) -> bytes:
        self.trust()
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
            self._remove(rel)
            raise CorruptBlob(name, "unreadable", str(exc.strerror or exc)) from None
        data = self._unpacked(name, rel, stored, cap)
        if self.ledger is not None:
            self.ledger.blob(name, info)
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
        self._remove(rel)
        raise CorruptBlob(name, "corrupt", "its bytes do not match its hash")

    def blob_names(self):
        """Every well-named regular blob file, found without following a link."""
        for name, _ in self._blob_files():
            yield name

    def _blob_files(self):
        """(name, stat) of every well-named regular blob file, from the folders' listings."""
        for a, _ in self._subdirs(f"{LAYOUT}/blobs"):
            for b, _ in self._subdirs(f"{LAYOUT}/blobs/{a}"):
                for name, info in tree.listing(self.root, f"{LAYOUT}/blobs/{a}/{b}"):
                    if HEX32.match(name) and name.startswith(a + b) and _regular(info):
                        yield name, info

    def read_record(self, name: str, size: int | None = None) -> bytes:
        """An observation record blob's bytes, verified: read once per process while the
        file stays the same one (a lookup checks it, and freshness then reads it)."""
        return self._blob_facts(name, _RECORD_BYTES, size)

    def _blob_facts(self, name: str, kind: str, size: int | None):
        """The facts of blob `name` read as `kind`: verified and parsed once per process
        while the file stays the same one (one lstat: its inode, size and mtime)."""
        try:
            info = os.lstat(self.blob_path(name))
            ident = (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)
        except (OSError, ValueError):
            info = ident = None
        known = _FACTS.get((str(self.root), name, kind))
        if ident is None or known is None or known[0] != ident:
            data = self._read_verified(name, size)
            known = _FACTS[(str(self.root), name, kind)] = (
                ident, data if kind == _RECORD_BYTES else artifact_facts(kind, data))
        elif self.ledger is not None:
            self.ledger.blob(name, info)
        return known[1]

    def _holds(self, name: str, size: int) -> bool:
        """Whether the blob file exists, is regular and matches its name."""
        try:
            stored, _ = tree.read_file(self.root, f"{LAYOUT}/{blob_relpath(name)}",
                                       size + blobformat.HEADER_SIZE)
            return digest(blobformat.decode(stored, size)) == name or digest(stored) == name
        except (OSError, ValueError):
            return False

    # -- entries ------------------------------------------------------------

    def entry_path(self, key: str) -> Path:
        return self.base / entry_relpath(key)

    def has_entry(self, key: str) -> bool:
        return _regular(tree.lstat(self.root, f"{LAYOUT}/{entry_relpath(key)}"))

    def entry_bytes(self, key: str) -> bytes | None:
        """Entry `key`'s file as stored, unchecked, and marked used (`kbuild gc`); None
        when absent. For a reader that holds the digest of the bytes `lookup` checked
        (the program journal): the same bytes are the same checked entry."""
        found = self._read_entry(key)
        if found is None:
            return None
        self._touch(key)
        return found[0].encode("utf-8")

    def entry_field(self, key: str, name: str):
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

    def lookup(self, key: str, expect: dict | None = None, *, remote: bool = True) -> dict | None:
        """The valid manifest for `key` whose blobs all verify and agree with it, else None;
        `expect` holds fields it must have (target, signature, arch; kind for objects).
        `remote`: whether a tier behind the store may be asked on a miss (`Storage`); a
        local store has none."""
        return self._lookup_local(key, expect)

    def _lookup_local(self, key: str, expect: dict | None) -> dict | None:
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
            self.remove_entry(key)
            return None
        self._touch(key)
        if self.ledger is not None:
            # Its identity after the touch: the file is the one read, its time is ours.
            try:
                after = os.lstat(self.entry_path(key))
            except OSError:
                after = None
            if after is not None and after.st_ino == info.st_ino and after.st_size == info.st_size:
                self.ledger.entry(key, after, text, manifest)
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
                    facts = self._blob_facts(name, kind, sizes.get(kind))
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
                else self.read_record(name, size)
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
        if not self.read_only and self._cannot_write is None:
            try:
                tree.touch(self.root, f"{LAYOUT}/{entry_relpath(key)}")
            except OSError as exc:
                self._cannot_write = exc.strerror or str(exc)

    def commit(self, key: str, manifest: dict, *, push: bool = True) -> str:
        """Write the manifest (after its blobs) atomically; the text written. It records
        each blob's size, so a later read never reads more. `push`: whether a tier behind
        the store is sent it (`Storage`); a local store has none."""
        manifest = {k: v for k, v in manifest.items() if k != "hmac"}
        sizes = {}
        for kind, name in manifest["artifacts"].items():
            info = tree.lstat(self.root, f"{LAYOUT}/{blob_relpath(name)}") \
                if HEX32.match(name) else None
            if not _regular(info):
                raise StoreError(f"internal error: committing {key} before blob {name}")
            # The blob's own length, not its file's: what a read (here or from a remote,
            # which holds it unpacked) may return.
            sizes[kind] = self._blob_length(name, info)
        manifest = dict(manifest, schema=MANIFEST_SCHEMA, key=key, sizes=sizes)
        text = manifest_text(manifest)
        self._write(f"{LAYOUT}/{entry_relpath(key)}", text.encode())
        if self.ledger is not None:
            info = tree.lstat(self.root, f"{LAYOUT}/{entry_relpath(key)}")
            if info is not None:
                self.ledger.entry(key, info, text, manifest)
        return text

    def _blob_length(self, name: str, info) -> int:
        """The uncompressed length of blob `name` (whose file's stat is `info`)."""
        if name in self._lengths:
            return self._lengths[name]
        try:
            head, _ = tree.read_file(self.root, f"{LAYOUT}/{blob_relpath(name)}", info.st_size)
        except OSError:
            return info.st_size
        found = blobformat.length(head[:blobformat.HEADER_SIZE])
        return info.st_size if found is None else found

    def remove_entry(self, key: str) -> None:
        self._remove(f"{LAYOUT}/{entry_relpath(key)}")

    def entries(self, memo: dict | None = None):
        """(key, manifest) for every valid entry file, in key order.

        `memo`, a dict the caller keeps between calls, spares reading again the files
        read before: by the file's identity, as blob facts are (a commit replaces the
        file, and a touch changes its time, so either is read again)."""
        self.trust()
        for folder, _ in self._subdirs(f"{LAYOUT}/entries"):
            for name, info in tree.listing(self.root, f"{LAYOUT}/entries/{folder}"):
                key = name[:-5]
                if not (name.endswith(".json") and HEX32.match(key) and key.startswith(folder)):
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

    def referenced_blobs(self) -> set[str]:
        return {b for _, m in self.entries() for b in m["artifacts"].values()}

    def remove_orphan_blobs(self) -> tuple[int, int]:
        """Remove blobs no entry names; returns (count, bytes)."""
        keep = self.referenced_blobs()
        count = size = 0
        for name in list(self.blob_names()):
            if name not in keep:
                size += self.blob_size(name)
                if self._remove(f"{LAYOUT}/{blob_relpath(name)}"):
                    count += 1
        return count, size

    def blob_size(self, name: str) -> int:
        info = tree.lstat(self.root, f"{LAYOUT}/{blob_relpath(name)}")
        return info.st_size if _regular(info) else 0

    def remove_blob(self, name: str) -> bool:
        return self._remove(f"{LAYOUT}/{blob_relpath(name)}")

    def size(self) -> tuple[int, int]:
        """(number of blobs, their total bytes): one walk, each size from its folder's
        listing (a stat per blob again would open its three folders once more)."""
        sizes = [info.st_size for _, info in self._blob_files()]
        return len(sizes), sum(sizes)

    def last_used(self, key: str) -> float:
        info = tree.lstat(self.root, f"{LAYOUT}/{entry_relpath(key)}")
        return info.st_mtime if info else 0.0

    # -- internals ----------------------------------------------------------

    def _subdirs(self, rel: str):
        return [(n, i) for n, i in tree.listing(self.root, rel)
                if len(n) == 2 and (i.st_mode & 0o170000) == 0o040000]

    def _damaged(self, key: str, problem: str) -> None:
        if key not in self.damage:  # warned once per process, however often it is asked
            self.warnings.append(f"{problem}; rebuilding")
        self.damage[key] = problem

    def _read_entry_file(self, key: str) -> str | None:
        found = self._read_entry(key)
        return None if found is None else found[0]

    def _read_entry(self, key: str):
        """(text, stat) of entry `key`'s file, or None (absent; damaged ones are removed)."""
        self.trust()
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
            self.remove_entry(key)
            return None
        except (OSError, UnicodeDecodeError) as exc:
            reason = getattr(exc, "strerror", None) or exc
            self._damaged(key, f"entry {key} is unreadable ({reason})")
            self.remove_entry(key)
            return None

    def _validated(self, key: str, text: str, expect: dict | None) -> dict | None:
        try:
            return parse_manifest(key, text, expect)
        except EntryProblem as exc:
            self._damaged(key, f"entry {key} is corrupt ({exc})")
            self.remove_entry(key)
            return None

    def _remove(self, rel: str) -> bool:
        """Remove root/rel (never through a link); a store that cannot be written keeps it,
        and says so once."""
        if self.read_only or self._cannot_write is not None:
            return False
        try:
            return tree.remove(self.root, rel)
        except OSError as exc:
            self._cannot_write = exc.strerror or str(exc)
            self.warnings.append(f"store {self.root} cannot be changed ({self._cannot_write}); "
                                 "damaged files are left in place")
            return False

    def _write(self, rel: str, data: bytes) -> None:
        try:
            tree.write_atomic(self.root, rel, data, f"{LAYOUT}/tmp", 0o666 & ~_umask())
        except OSError as exc:
            hint = ("free some space or run `kbuild gc --max-size SIZE`"
                    if exc.errno in (errno.ENOSPC, errno.EDQUOT) else
                    "pass --store DIR or set KBUILD_STORE to a writable directory")
            raise StoreError(f"cannot write to store {self.root} ({exc.strerror or exc}); "
                             f"{hint}") from None


_BLOB_GONE = ("names missing blob", "names corrupt blob", "names unreadable blob")


def _named(manifest: dict) -> str:
    """What an entry is of, for a warning: its target, object's function, or record's kernel."""
    if is_output(manifest):
        return f"early-cutoff record of {manifest.get('entry')}"
    return str(manifest.get("target") or manifest.get("function"))
