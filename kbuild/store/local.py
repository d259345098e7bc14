"""The content-addressed store: verified blobs, JSON manifests, a diskcache index.

Layout (the version is in the path; an unknown layout is never read)::

    STORE/CACHEDIR.TAG
    STORE/v1/blobs/ab/cd/<xxh3-128 of the bytes>
    STORE/v1/entries/ab/<target key>.json
    STORE/v1/index/                 diskcache: target key -> manifest JSON text
    STORE/v1/tmp/

Blobs are written first, the manifest file last (its rename is the commit),
then the index. The entry file is the truth: the index mirrors it, and a
lookup that finds them disagreeing trusts the file and heals the index. Every
blob read is checked against its name. Nothing here is pickled: manifests are
JSON with a schema version, the index holds only text, and its Disk refuses
to unpickle anything a tampered index might hold.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from pathlib import Path

import diskcache

from ..keying.encode import digest
from ..errors import StoreError

LAYOUT = "v1"
MANIFEST_SCHEMA = 1
_HEX32 = re.compile(r"^[0-9a-f]{32}$")
_CACHEDIR_TAG = (b"Signature: 8a477f597d28d172789f06886806bc55\n"
                 b"# This file is a cache directory tag created by kbuild.\n"
                 b"# For information about cache directory tags see https://bford.info/cachedir/\n")


OBJECT_KIND = "object"  # a separately compiled object's entry (see `objects`), not a target's


def is_object(manifest: dict) -> bool:
    return manifest.get("kind") == OBJECT_KIND


def blob_relpath(name: str) -> str:
    """Where a blob lives under the layout folder (here and in a remote tier)."""
    return f"blobs/{name[:2]}/{name[2:4]}/{name}"


def entry_relpath(key: str) -> str:
    """Where an entry's manifest lives under the layout folder (here and in a remote tier)."""
    return f"entries/{key[:2]}/{key}.json"


class CorruptBlob(Exception):
    """A blob is missing or its bytes do not match its name."""


class _TextOnlyDisk(diskcache.Disk):
    """A diskcache Disk that stores and returns only str/bytes; never unpickles."""

    def put(self, key):
        if not isinstance(key, str):
            raise TypeError("index keys are strings")
        return super().put(key)

    def get(self, key, raw):
        if not raw:
            raise ValueError("refusing a pickled index key")
        return super().get(key, raw)

    def store(self, value, read, key=diskcache.core.UNKNOWN):
        if not isinstance(value, (str, bytes)):
            raise TypeError("index values are JSON text")
        return super().store(value, read, key)

    def fetch(self, mode, filename, value, read):
        if mode == diskcache.core.MODE_PICKLE:
            raise ValueError("refusing a pickled index value")
        return super().fetch(mode, filename, value, read)


class Store:
    """One store directory. `warnings` collects problems healed along the way.

    `remote` (a `remote.RemoteTier`, set by whoever opens the store for a build) is asked
    on a local miss and sent every entry this store commits.
    """

    remote = None

    def __init__(self, root, *, read_only: bool = False):
        self.root = Path(root)
        self.base = self.root / LAYOUT
        self.read_only = read_only
        self.warnings: list[str] = []
        self.damage: dict[str, str] = {}  # key -> what was wrong with its entry, as found
        self._index = None

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

    def ensure_writable(self) -> None:
        """Create the layout, or fail clearly before any compile work starts."""
        try:
            for sub in ("blobs", "entries", "tmp"):
                (self.base / sub).mkdir(parents=True, exist_ok=True)
            tag = self.root / "CACHEDIR.TAG"
            if not tag.exists():
                atomic_write(tag, _CACHEDIR_TAG, self.base / "tmp")
            probe = tempfile.NamedTemporaryFile(dir=self.base / "tmp", delete=True)
            probe.close()
        except OSError as exc:
            raise StoreError(
                f"store {self.root} is not writable ({exc.strerror or exc}); "
                "pass --store DIR or set KBUILD_STORE to a writable directory") from None

    def _index_cache(self):
        if self._index is None:
            path = self.base / "index"
            if self.read_only and not path.is_dir():
                self._index = _NoIndex()  # status and explain never create a store
            else:
                self._index = _open_index(path, self.warnings, self.read_only)
        return self._index

    def close(self) -> None:
        if self._index is not None:
            self._index.close()
            self._index = None

    # -- blobs --------------------------------------------------------------

    def blob_path(self, name: str) -> Path:
        return self.base / blob_relpath(name)

    def put_blob(self, data: bytes) -> str:
        """Store `data` under its digest (deduplicated) and return the digest."""
        name = digest(data)
        path = self.blob_path(name)
        # A damaged copy under the right name is replaced, not trusted by its name.
        if not _holds(path, name):
            atomic_write(path, data, self.base / "tmp")
        return name

    def has_blob(self, name: str) -> bool:
        return bool(_HEX32.match(name)) and self.blob_path(name).is_file()

    def read_blob(self, name: str) -> bytes:
        """The blob's bytes, verified; a corrupt blob is removed and `CorruptBlob` raised."""
        if not _HEX32.match(name):
            raise CorruptBlob(f"'{name}' is not a blob name (32 hex digits)")
        path = self.blob_path(name)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise CorruptBlob(f"blob {name} is missing") from None
        if digest(data) != name:
            self.warnings.append(f"blob {name} is corrupt (its bytes do not match its hash)"
                                 + ("" if self.read_only else "; removed"))
            if not self.read_only:
                path.unlink(missing_ok=True)
            raise CorruptBlob(f"blob {name} is corrupt")
        return data

    def blob_names(self):
        blobs = self.base / "blobs"
        if blobs.is_dir():
            for path in sorted(blobs.glob("??/??/*")):
                if _HEX32.match(path.name):
                    yield path.name

    # -- entries ------------------------------------------------------------

    def entry_path(self, key: str) -> Path:
        return self.base / entry_relpath(key)

    def has_entry(self, key: str) -> bool:
        return self.entry_path(key).is_file()

    def lookup(self, key: str) -> dict | None:
        """The valid manifest for `key` whose blobs all verify, else None; a local miss is
        asked of the remote tier, whose verified hit is committed here first."""
        manifest = self._lookup_local(key)
        if manifest is None and self.remote is not None and not self.read_only:
            manifest = self.remote.fetch(self, key)
        return manifest

    def _lookup_local(self, key: str) -> dict | None:
        """The valid manifest for `key` whose blobs all verify, else None (healing what it finds).

        The entry file (the commit) is always read, so a damaged file is never hidden
        by a healthy index row. Blobs are hashed here and not only when a launcher reads
        them: a `cached` row is what CI trusts (`kbuild build --read-only` as a gate),
        and hashing a kernel's PTX and cubin with xxh3 costs microseconds.
        """
        text = self._read_entry_file(key)
        indexed = self._index_get(key)
        if text is None:
            if indexed is not None:
                self._index_delete(key)  # a row whose entry was never committed or is gone
            return None
        manifest = self._validated(key, text)
        if manifest is None:
            return None
        problem = self._blob_problem(manifest)
        if problem:
            self._damaged(key, f"entry {key} ({manifest.get('target')}) {problem}")
            self.remove_entry(key)
            return None
        if indexed != text:
            self._index_set(key, text)  # a deleted, damaged or stale index heals as it is read
        self._touch(key)
        return manifest

    def _blob_problem(self, manifest: dict) -> str | None:
        for name in sorted(set(manifest["artifacts"].values())):
            path = self.blob_path(name)
            try:
                data = path.read_bytes()
            except OSError:
                return f"names missing blob {name}"
            if digest(data) != name:
                if not self.read_only:
                    path.unlink(missing_ok=True)
                return f"names corrupt blob {name} (its bytes do not match its hash)"
        return None

    def _touch(self, key: str) -> None:
        # The entry file's mtime is its last use: `kbuild gc` evicts the oldest first.
        if not self.read_only:
            try:
                os.utime(self.entry_path(key))
            except OSError:
                pass

    def commit(self, key: str, manifest: dict, *, push: bool = True) -> None:
        """Write the manifest (after its blobs) atomically, index it, push it to the remote."""
        manifest = dict(manifest, schema=MANIFEST_SCHEMA, key=key)
        for name in manifest["artifacts"].values():
            if not self.has_blob(name):
                raise StoreError(f"internal error: committing {key} before blob {name}")
        text = json.dumps(manifest, sort_keys=True, indent=1)
        atomic_write(self.entry_path(key), text.encode(), self.base / "tmp")
        self._index_set(key, text)
        if push and self.remote is not None:
            self.remote.push(self, key, text)

    def remove_entry(self, key: str) -> None:
        if self.read_only:
            return
        self.entry_path(key).unlink(missing_ok=True)
        self._index_delete(key)

    def entries(self):
        """(key, manifest) for every valid entry file, in key order."""
        root = self.base / "entries"
        if not root.is_dir():
            return
        for path in sorted(root.glob("??/*.json")):
            key = path.stem
            text = self._read_entry_file(key)
            manifest = self._validated(key, text) if text is not None else None
            if manifest is not None:
                yield key, manifest

    def referenced_blobs(self) -> set[str]:
        return {b for _, m in self.entries() for b in m["artifacts"].values()}

    def remove_orphan_blobs(self) -> tuple[int, int]:
        """Remove blobs no entry names; returns (count, bytes)."""
        keep = self.referenced_blobs()
        count = size = 0
        for name in list(self.blob_names()):
            if name not in keep:
                path = self.blob_path(name)
                size += path.stat().st_size
                path.unlink(missing_ok=True)
                count += 1
        return count, size

    def size(self) -> tuple[int, int]:
        """(number of blobs, their total bytes)."""
        sizes = [self.blob_path(n).stat().st_size for n in self.blob_names()]
        return len(sizes), sum(sizes)

    # -- internals ----------------------------------------------------------

    def _damaged(self, key: str, problem: str) -> None:
        self.damage[key] = problem
        self.warnings.append(f"{problem}; rebuilding")

    def _read_entry_file(self, key: str) -> str | None:
        try:
            return self.entry_path(key).read_text(encoding="utf-8")
        except (FileNotFoundError, NotADirectoryError):
            return None
        except (OSError, UnicodeDecodeError) as exc:
            self._damaged(key, f"entry {key} is unreadable ({exc})")
            return None

    def _validated(self, key: str, text: str) -> dict | None:
        problem = _manifest_problem(key, text)
        if problem is None:
            return json.loads(text)
        self._damaged(key, f"entry {key} is corrupt ({problem})")
        self.remove_entry(key)
        return None

    def _index_get(self, key: str) -> str | None:
        try:
            value = self._index_cache().get(key)
        except Exception as exc:  # noqa: BLE001 - fall back to the entry files
            self._drop_index(exc)
            return None
        return value if isinstance(value, str) else None

    def _index_set(self, key: str, text: str) -> None:
        if self.read_only:
            return
        try:
            self._index_cache().set(key, text)
        except Exception as exc:  # noqa: BLE001
            self._drop_index(exc)

    def _index_delete(self, key: str) -> None:
        if self.read_only:
            return
        try:
            self._index_cache().delete(key)
        except Exception as exc:  # noqa: BLE001 - a damaged index is rebuilt later
            self._drop_index(exc)

    def _drop_index(self, exc) -> None:
        self.warnings.append(f"store index is damaged ({exc}); reading entry files instead")
        self.close()
        self._index = _NoIndex()


class _NoIndex:
    """Stands in for a damaged index for the rest of the process."""

    def get(self, key):
        return None

    def set(self, key, value):
        pass

    def delete(self, key):
        pass

    def close(self):
        pass


def _open_index(path: Path, warnings: list, read_only: bool = False):
    try:
        return diskcache.Cache(str(path), disk=_TextOnlyDisk, eviction_policy="none")
    except Exception as exc:  # noqa: BLE001 - a damaged index is rebuilt from the entries
        if read_only:  # a read-only command reads the entry files and changes nothing
            warnings.append(f"store index at {path} is damaged ({exc}); reading entry files")
            return _NoIndex()
        warnings.append(f"store index at {path} is damaged ({exc}); rebuilding it")
        import shutil

        shutil.rmtree(path, ignore_errors=True)
        try:
            return diskcache.Cache(str(path), disk=_TextOnlyDisk, eviction_policy="none")
        except Exception:  # noqa: BLE001
            return _NoIndex()


def _manifest_problem(key: str, text: str) -> str | None:
    try:
        manifest = json.loads(text)
    except ValueError:
        return "not valid JSON"
    if not isinstance(manifest, dict):
        return "not a JSON object"
    if manifest.get("schema") != MANIFEST_SCHEMA:
        return f"unknown schema {manifest.get('schema')!r}"
    if manifest.get("key") != key:
        return "key does not match its file name"
    artifacts = manifest.get("artifacts")
    if not isinstance(artifacts, dict) or not artifacts or not all(
            isinstance(v, str) and _HEX32.match(v) for v in artifacts.values()):
        return "artifacts are not blob hashes"
    if is_object(manifest):
        return _object_problem(manifest)
    if not isinstance(manifest.get("entry"), str):
        return "no entry symbol"
    return None


def _object_problem(manifest: dict) -> str | None:
    """A separately compiled object (see `objects`): its LTO-IR and its interface."""
    def rows(name, width):
        value = manifest.get(name)
        return isinstance(value, list) and all(
            isinstance(r, list) and len(r) == width and all(isinstance(x, str) for x in r)
            for r in value)

    if "ltoir" not in manifest["artifacts"]:
        return "object without LTO-IR"
    if not rows("exports", 2) or not rows("imports", 4):
        return "object interface is malformed"
    if not manifest["exports"] and not isinstance(manifest.get("entry"), str):
        return "no entry symbol"
    return None


def _holds(path: Path, name: str) -> bool:
    """Whether the blob file at `path` exists, is readable and matches its name."""
    try:
        return digest(path.read_bytes()) == name
    except OSError:
        return False


def _umask() -> int:
    mask = os.umask(0o077)
    os.umask(mask)
    return mask


def atomic_write(path: Path, data: bytes, tmp_dir: Path, prefix: str | None = None) -> None:
    """Write via a temp file in `tmp_dir` (same file system; named `prefix`..., default
    after `path`) and `os.replace`: readers never see half a file. A missing folder
    is made when the write finds it missing, not asked for before every file.

    No fsync: a process killed mid-write leaves only a temp file, and what a power loss
    could tear is caught on read (blobs are verified against their names, manifests
    validated) and rebuilt. An fsync per file cost a 64-kernel build about 0.6 s.
    """
    prefix = prefix or path.name[:16] + "."
    try:
        fd, tmp = tempfile.mkstemp(dir=tmp_dir, prefix=prefix)
    except FileNotFoundError:
        tmp_dir.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=tmp_dir, prefix=prefix)
    try:
        with os.fdopen(fd, "wb") as fh:
            # mkstemp makes the file 0600; a store shared by a team needs the umask's modes.
            os.fchmod(fh.fileno(), 0o666 & ~_umask())
            fh.write(data)
        try:
            os.replace(tmp, path)
        except FileNotFoundError:  # the first file of its folder
            path.parent.mkdir(parents=True, exist_ok=True)
            os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
